"""Run the streaming topology for a test: worker subprocesses (``tidegraph worker``) on the
test's own topics, producing, waiting on conditions with deadlines, metrics, cleanup."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from tests.support.crm_feed import CRM_MAPPING
from tests.support.metrics import free_port, metric_value, scrape
from tests.support.processes import terminate_with_parent
from tidegraph.connections import KafkaConnection
from tidegraph.settings import Settings
from tidegraph.stores import open_store
from tidegraph.stores.base import GraphStore
from tidegraph.topics.admin import delete_topics
from tidegraph.topics.client import (
    ProduceReport,
    StalledError,
    WaitReport,
    produce_lines,
    read_dead_letters,
    wait_until_reflected,
)
from tidegraph.topics.names import TopicNames

REPO = Path(__file__).resolve().parents[2]
TIDEGRAPH = str(Path(sys.executable).with_name("tidegraph"))
PARTITIONS = 4

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
) -> T:
    """Poll ``probe`` until ``done(result)``; fail with the last result after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if done(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}: {result!r}")
        await asyncio.sleep(interval)


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def metrics(self) -> str:
        return scrape(self.port)

    def value(self, name: str, **labels: str) -> float:
        return metric_value(self.metrics(), name, **labels)

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (graceful: in-flight records finish, offsets commit) and wait."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
                raise AssertionError(
                    f"worker {self.name} ignored SIGTERM for {timeout}s:\n{self.log_tail()}"
                ) from None
        return int(self.process.returncode)

    def kill(self) -> None:
        """SIGKILL: no shutdown at all."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


@dataclass
class Topology:
    """One test's topics (prefix), workers and groups (all named after ``run``)."""

    kafka: str
    neo4j: str
    prefix: str
    tmp: Path
    mapping_text: str = CRM_MAPPING
    workers: list[Worker] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    # Settings fields for this process's clients (e.g. TLS/SASL), beside extra_env's for
    # the workers and CLI subprocesses.
    extra_settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.mapping = self.tmp / "mapping.yaml"
        self.mapping.write_text(self.mapping_text)

    @property
    def run(self) -> str:
        """Group ids of this test start with this."""
        return self.prefix

    @property
    def names(self) -> TopicNames:
        return TopicNames(self.prefix)

    def settings(self) -> Settings:
        return Settings(
            kafka_bootstrap_servers=self.kafka,
            topic_prefix=self.prefix,
            partitions=PARTITIONS,
            store="neo4j",
            neo4j_uri=self.neo4j,
            embedder="hashing",
            data_dir=self.tmp / "client",
            mappings=self.mapping,
            **self.extra_settings,
        )

    def env(self, port: int, data_dir: Path, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGRAPH_")}
        env.update(
            TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS=self.kafka,
            TIDEGRAPH_TOPIC_PREFIX=self.prefix,
            TIDEGRAPH_PARTITIONS=str(PARTITIONS),
            TIDEGRAPH_STORE="neo4j",
            TIDEGRAPH_NEO4J_URI=self.neo4j,
            TIDEGRAPH_EMBEDDER="hashing",
            TIDEGRAPH_MAPPINGS=str(self.mapping),
            TIDEGRAPH_METRICS_PORT=str(port),
            TIDEGRAPH_DATA_DIR=str(data_dir),
            TIDEGRAPH_BATCH_WITHIN_SECONDS="0.1",
            TIDEGRAPH_COMMIT_EVERY="20",
            TIDEGRAPH_COMMIT_INTERVAL_SECONDS="0.5",
            TIDEGRAPH_SESSION_TIMEOUT_SECONDS="6",
            TIDEGRAPH_HEARTBEAT_INTERVAL_SECONDS="1",
            TIDEGRAPH_RETRY_BACKOFF_SECONDS="0.2",
            TIDEGRAPH_LOG_LEVEL="INFO",
        )
        env.update(self.extra_env)
        env.update(overrides)
        return env

    def cli_env(self) -> dict[str, str]:
        return self.env(free_port(), self.tmp / "client")

    def start_worker(self, *args: str, **env: str) -> Worker:
        name = f"w{len(self.workers) + 1}"
        port = free_port()
        log = self.tmp / f"{name}.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [TIDEGRAPH, "worker", *args],
                cwd=REPO,
                env=self.env(port, self.tmp / f"data-{name}", **env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=terminate_with_parent,  # never outlives this process
            )
        worker = Worker(name, process, port, log)
        self.workers.append(worker)
        return worker

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [TIDEGRAPH, *args],
            cwd=REPO,
            env=self.cli_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"tidegraph {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    # ---- producing and waiting ------------------------------------------------------------
    async def produce(
        self, episodes: list[dict[str, Any]] | list[bytes], rate: float | None = None
    ) -> ProduceReport:
        """Produce and wait for Kafka's acknowledgements; ``rate``: episodes per second."""
        lines = [e if isinstance(e, bytes) else orjson.dumps(e) for e in episodes]
        return await produce_lines(self.settings(), lines, rate=rate)

    async def wait_reflected(self, report: ProduceReport, timeout: float = 150.0) -> WaitReport:
        self.check_workers()
        async with asyncio.timeout(timeout):
            try:
                return await wait_until_reflected(
                    self.settings(), report, poll_seconds=0.2, stall_seconds=60
                )
            except StalledError as exc:
                missing = [(p.partition, p.offset, p.group_id) for p in exc.pending[:10]]
                raise AssertionError(f"{exc}; not reflected: {missing}") from exc

    async def wait_assigned(self, workers: list[Worker], timeout: float = 90.0) -> None:
        async def owned() -> list[float]:
            self.check_workers()
            try:
                return [w.value("tidegraph_assigned_partitions", topic="episodes") for w in workers]
            except OSError:  # metrics endpoint not up yet
                return []

        await eventually(
            owned,
            lambda got: len(got) == len(workers) and sum(got) == PARTITIONS and all(got),
            timeout=timeout,
            what="every worker to own partitions of the input topic",
        )

    async def wait_metric(
        self, worker: Worker, name: str, target: float, timeout: float = 90.0, **labels: str
    ) -> float:
        async def read() -> float:
            self.check_workers()
            try:
                return worker.value(name, **labels)
            except OSError:
                return -1.0

        return await eventually(
            read, lambda v: v >= target, timeout=timeout, what=f"{name}{labels} >= {target}"
        )

    async def dead_letters(self) -> list[Any]:
        return [s.letter for s in await read_dead_letters(self.settings())]

    def check_workers(self) -> None:
        for worker in self.workers:
            code = worker.process.poll()
            if code is not None and code not in (0, -signal.SIGKILL):
                raise AssertionError(f"worker {worker.name} exited {code}:\n{worker.log_tail()}")

    # ---- graph --------------------------------------------------------------------------
    def store(self) -> GraphStore:
        return open_store(self.settings())

    async def episodes_written(self, groups: list[str]) -> int:
        store = self.store()
        try:
            return sum([(await store.browse.counts(g))["episodes"] for g in groups])
        finally:
            await store.close()

    async def written_at_least(self, groups: list[str], n: int, timeout: float = 120) -> int:
        """Wait until ``groups`` hold at least ``n`` episodes; how many they hold."""
        return await eventually(
            lambda: self.episodes_written(groups),
            lambda got: got >= n,
            timeout=timeout,
            what=f"{n} episodes to be written",
        )

    # ---- cleanup ------------------------------------------------------------------------
    async def close(self, driver: Any) -> None:
        for worker in self.workers:
            if worker.alive():
                worker.process.kill()
                worker.process.wait(10)
        for label in (
            "Episodic",
            "Community",
            "Entity",
            "Change",
            "ChangeLog",
            "ChangeCursor",
            "SpeakerWord",
        ):
            await driver.execute_query(
                f"MATCH (n:{label}) WHERE n.group_id STARTS WITH $run DETACH DELETE n",
                run=self.run,
            )
        await delete_topics(KafkaConnection.from_settings(self.settings()), self.names.all())
