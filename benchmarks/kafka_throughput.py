"""The Kafka path of ``benchmarks.throughput``: the CRM feed via Kafka -> Faust workers -> Neo4j.

``run_kafka_path`` starts ``workers`` worker processes (``tidegraph worker``) on fresh topics,
waits until every worker owns its partitions, then runs two phases on the same workers:

1. **maximum**: the whole feed produced at once; events/s from the first produce to the last
   episode written (the latency is then mostly queueing);
2. **paced**: a second copy of the feed (fresh groups), ``latency_seconds`` worth of it, at a
   fixed offered load (default: half the measured maximum); p50/p99 produce->queryable
   latency, exactly per episode (its record's Kafka timestamp to its Episodic node's
   ``created_at``), and the same quantiles from the workers' histograms.

After each phase the graph is checked against the feed's truth and the groups are deleted;
the topics are deleted at the end. Each worker's peak RSS is its ``VmHWM``.

Run it through ``python -m benchmarks.throughput --paths kafka-1w,kafka-2w``. The helpers
(worker processes, metrics scraping) are also the topology tests' harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from tests.support.crm_feed import CRM_MAPPING, CrmFeed, check_graph
from tests.support.metrics import (
    free_port,
    histogram_quantile,
    metric_samples,
    metric_value,
    scrape,
)
from tests.support.processes import terminate_with_parent
from tidegraph.records.ids import stable_uuid

__all__ = ["run_kafka_path"]

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class KafkaPath:
    workers: int
    bootstrap: str
    neo4j_uri: str
    embedder: str
    partitions: int
    batch_size: int
    rate: float | None  # offered load of the paced phase; None: half the measured maximum
    latency_seconds: float  # length of the paced phase
    work: Path  # worker logs, mapping file, worker data folders
    communities: bool = True  # the community processor in the workers (as deployed)
    changes: bool = True  # the change stream (outbox and relay), as deployed
    # TIDEGRAPH_* worker settings beyond the path's own (throughput.py --worker-setting)
    worker_settings: dict[str, str] = field(default_factory=dict)


def worker_env(base: dict[str, str], **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGRAPH_")}
    env.update(base)
    env.update(overrides)
    return env


def start_worker(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child process
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("tidegraph")), "worker"],
        cwd=REPO,
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=terminate_with_parent,  # never outlives this process
    )


def stop_worker(process: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return int(process.returncode)


def peak_rss_mb(pid: int | str = "self") -> float | None:
    """A process's peak resident set size (``VmHWM``), in MiB; None when unreadable."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def merged_buckets(texts: list[str], name: str) -> dict[float, float]:
    buckets: dict[float, float] = {}
    for text in texts:
        for labels, value in metric_samples(text, name + "_bucket"):
            le = float(labels["le"].replace("+Inf", "inf"))
            buckets[le] = buckets.get(le, 0.0) + value
    return buckets


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def wait_assigned(ports: list[int], topic: str, partitions: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            owned = [
                metric_value(scrape(p), "tidegraph_assigned_partitions", topic=topic) for p in ports
            ]
        except OSError:
            owned = []
        if len(owned) == len(ports) and sum(owned) == partitions and all(owned):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers did not get all partitions within {timeout}s: {owned}")
        await asyncio.sleep(0.5)


def settle(timeout: float = 60.0) -> float | None:
    """Wait until the local Neo4j server is idle (under a tenth of a core over two half-second
    windows, read from /proc) and give the seconds waited: what the previous path wrote and
    deleted is flushed before the next path (or phase) starts, not during it (measured:
    in-process right after the raw path ran at 0.43-0.51 of raw, right after a Kafka run at
    0.59). None when the server is not one ``make services-up`` started from this checkout."""
    pid = local_service_pids().get("neo4j")
    if pid is None:
        return None

    began = time.perf_counter()
    quiet, last = 0, cpu_seconds(pid) or 0.0
    while quiet < 2 and time.perf_counter() - began < timeout:
        time.sleep(0.5)  # a measuring window, not a synchronisation
        now = cpu_seconds(pid) or 0.0
        quiet = quiet + 1 if now - last < 0.05 else 0
        last = now
    return round(time.perf_counter() - began, 1)


def local_service_pids() -> dict[str, int]:
    """The pids of the local services ``make services-up`` started from this checkout."""
    from tests.support.local_services import LocalServices

    return {s.name: s.pid for s in LocalServices().status() if s.running and s.pid is not None}


def cpu_seconds(pid: int) -> float | None:
    """A process's CPU time so far (user + system, all its threads), from /proc; None once it
    is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_seconds() -> float:
    """The machine's idle CPU time so far, all cores (idle + iowait, /proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


class CpuWindow:
    """Where the machine's CPU went during a phase: each process's CPU time from ``start`` to
    ``stop``, per record, and the share of the cores left idle. The processes are the
    workers, the local Neo4j and Kafka, and this harness itself (the producer, the change
    stream's subscriber and the progress polls), which shares the machine with what it
    measures."""

    def __init__(self, workers: list[int]) -> None:
        services = local_service_pids()
        self.pids: dict[str, list[int]] = {
            "neo4j": [services["neo4j"]] if "neo4j" in services else [],
            "workers": list(workers),
            "kafka": [services["kafka"]] if "kafka" in services else [],
            "harness": [os.getpid()],
        }
        self._began: tuple[float, float, dict[str, float]] | None = None

    def _used(self) -> dict[str, float]:
        return {
            name: sum(cpu_seconds(pid) or 0.0 for pid in pids) for name, pids in self.pids.items()
        }

    def start(self) -> None:
        self._began = (time.monotonic(), idle_seconds(), self._used())

    def stop(self, records: int) -> dict[str, Any]:
        assert self._began is not None, "start the window first"
        began, idle, used = self._began
        wall = time.monotonic() - began
        now = self._used()
        per_record = {
            name: round(1000 * (now[name] - used[name]) / max(records, 1), 2)
            for name, pids in self.pids.items()
            if pids
        }
        cores = os.cpu_count() or 1
        return {
            "cpu_ms_per_record": per_record,
            "idle_share": round((idle_seconds() - idle) / (cores * wall), 3) if wall else None,
            "cores": cores,
        }


# ----------------------------------------------------------------------------- the path
LATENCY = "tidegraph_end_to_end_latency_seconds"
MAPPED = "tidegraph_extraction_hop_mapped_total"
FeedMaker = Callable[[int, str], CrmFeed]  # (records, group prefix) -> the feed


class _Run:
    """One Kafka path: its topics (prefix ``run_id``), workers and settings."""

    def __init__(self, path: KafkaPath) -> None:
        from tidegraph.settings import Settings

        self.path = path
        self.run_id = f"bench{uuid.uuid4().hex[:8]}"
        path.work.mkdir(parents=True, exist_ok=True)
        mapping = path.work / f"{self.run_id}-mapping.yaml"
        mapping.write_text(CRM_MAPPING)
        self.data = path.work / f"{self.run_id}-data"
        self.env = {
            "TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS": path.bootstrap,
            "TIDEGRAPH_TOPIC_PREFIX": self.run_id,
            "TIDEGRAPH_PARTITIONS": str(path.partitions),
            "TIDEGRAPH_STORE": "neo4j",
            "TIDEGRAPH_NEO4J_URI": path.neo4j_uri,
            "TIDEGRAPH_EMBEDDER": path.embedder,
            "TIDEGRAPH_MAPPINGS": str(mapping),
            "TIDEGRAPH_DATA_DIR": str(self.data),
            "TIDEGRAPH_BATCH_SIZE": str(path.batch_size),
            "TIDEGRAPH_LOG_LEVEL": "WARNING",
            "TIDEGRAPH_COMMUNITIES_ENABLED": str(path.communities).lower(),
            "TIDEGRAPH_CHANGES_ENABLED": str(path.changes).lower(),
            **path.worker_settings,
        }
        self.settings = Settings(
            kafka_bootstrap_servers=path.bootstrap,
            topic_prefix=self.run_id,
            partitions=path.partitions,
            store="neo4j",
            neo4j_uri=path.neo4j_uri,
            embedder=path.embedder,
            data_dir=self.data,
        )
        self.ports = [free_port() for _ in range(path.workers)]
        self.workers: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        for i, port in enumerate(self.ports):
            env = worker_env(self.env, TIDEGRAPH_METRICS_PORT=str(port))
            log = self.path.work / f"{self.run_id}-worker{i}.log"
            self.workers.append(start_worker(env, log))

    def metrics(self) -> list[str]:
        return [scrape(p) for p in self.ports]

    async def phase(self, feed: CrmFeed, rate: float | None) -> dict[str, Any]:
        """Produce the feed (at ``rate``/s, or all at once), wait until it is in Neo4j,
        check it against the truth, delete its groups."""
        from tidegraph.topics.client import produce_lines, wait_until_reflected

        lines = [orjson.dumps(e) for e in feed.episodes]
        before = self.metrics()
        # A subscriber follows the change stream in the paced phase only: on a small machine
        # its CPU would come out of the maximum's figure.
        watched = self.path.changes and rate is not None
        watch = ChangeWatch(self.settings, feed.groups) if watched else None
        if watch is not None:
            await watch.start()
        cpu = CpuWindow([w.pid for w in self.workers])
        try:
            cpu.start()
            report = await produce_lines(self.settings, lines, rate=rate)
            # A poll reads every group's pending markers; every 0.2 s that took about half
            # of Neo4j's CPU time from the workers under measurement. The figures do not
            # depend on it (first produce to last created_at, read from the graph afterwards).
            waited = await wait_until_reflected(
                self.settings, report, poll_seconds=1.0, stall_seconds=300
            )
            used = cpu.stop(len(lines))
            after = self.metrics()
            changes = None if watch is None else await watch.figures(report, feed)
        finally:
            if watch is not None:
                await watch.stop()
        written, graph = await self._read_graph(feed)
        result = _phase_figures(report, written, before, after)
        return result | {
            "changes": changes,
            "cpu": used,
            "records": len(feed.episodes),
            "offered_rate": rate,
            "processed": waited.processed,
            "dead_lettered": len(waited.dead),
            **graph,
        }

    async def _read_graph(self, feed: CrmFeed) -> tuple[dict[str, datetime], dict[str, Any]]:
        """Each episode's created_at, the truth check and the counts; then the groups go."""
        from tidegraph.stores import open_store

        store = open_store(self.settings)
        written: dict[str, datetime] = {}
        counts = {"episodes": 0, "entities": 0, "facts": 0}
        try:
            checked = await check_graph(store, feed)
            far = datetime.now(UTC) + timedelta(days=36500)
            for group in feed.groups:
                for episode in await store.recent_episodes(group, far, 10 * len(feed.episodes)):
                    if episode.created_at is not None:
                        written[episode.uuid] = episode.created_at
                got = await store.browse.counts(group)
                for key in counts:
                    counts[key] += got[key]
        finally:
            for group in feed.groups:
                await store.forget.delete_group(group)
            await store.close()
        return written, {"check": checked, "graph": counts}

    async def close(self) -> dict[str, Any]:
        from tidegraph.topics.admin import delete_topics
        from tidegraph.topics.names import TopicNames

        rss = [peak_rss_mb(w.pid) for w in self.workers]
        codes = [stop_worker(w) for w in self.workers]
        await delete_topics(self.path.bootstrap, TopicNames(self.run_id).all())
        return {"workers_peak_rss_mb": rss, "worker_exit_codes": codes}


class ChangeWatch:
    """Follows ``{prefix}.changes`` during a phase, as a subscriber would: when each change
    first arrived, and how many arrived again (the relay's at-least-once)."""

    def __init__(self, settings: Any, groups: list[str]) -> None:
        self.settings = settings
        self.groups = list(groups)
        self.arrived: dict[str, tuple[float, Any]] = {}  # change_id -> (arrival, change)
        self.duplicates = 0
        self.last_seq: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._follow())
        await self._ready.wait()

    async def _follow(self) -> None:
        from tidegraph.topics.client import stream_changes

        changes = stream_changes(self.settings, self.groups, follow=True, poll_seconds=0.2)
        async with contextlib.aclosing(changes):
            self._ready.set()  # the consumer starts at the topic's beginning: nothing missed
            async for change in changes:
                if change.change_id in self.arrived:
                    self.duplicates += 1
                    continue
                self.arrived[change.change_id] = (time.time(), change)
                self.last_seq[change.group_id] = max(
                    change.seq, self.last_seq.get(change.group_id, 0)
                )

    async def figures(self, report: Any, feed: CrmFeed, timeout: float = 300) -> dict[str, Any]:
        """Once every committed change of the phase's groups arrived: the lag quantiles."""
        from tidegraph.stores import open_store

        store = open_store(self.settings)
        try:
            deadline = time.monotonic() + timeout
            while True:
                logs = await store.outbox.change_logs(self.groups)
                if all(self.last_seq.get(log.group_id, 0) >= log.seq for log in logs):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the change stream did not catch up with the outbox")
                await asyncio.sleep(0.2)
            committed = sum(log.seq for log in logs)
        finally:
            await store.close()
        produced = {p.episode_uuid: p.timestamp_ms / 1000 for p in report.sent if p.timestamp_ms}
        from_commit: list[float] = []
        from_produce: list[float] = []
        for arrival, change in self.arrived.values():
            if change.committed_at is not None:
                from_commit.append(arrival - change.committed_at.timestamp())
            sent = produced.get(stable_uuid("episode", change.group_id, change.episode_id or ""))
            if sent is not None:
                from_produce.append(arrival - sent)

        def quantiles(values: list[float]) -> dict[str, float] | None:
            if not values:
                return None
            return {q: round(percentile(values, v), 3) for q, v in (("p50", 0.5), ("p99", 0.99))}

        return {
            "committed": committed,
            "received": len(self.arrived),
            "duplicates": self.duplicates,
            "commit_to_consumer_s": quantiles(from_commit),
            "produce_to_consumer_s": quantiles(from_produce),
        }

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _phase_figures(
    report: Any, written: dict[str, datetime], before: list[str], after: list[str]
) -> dict[str, Any]:
    """Events/s (first produce to last write) and produce->queryable latency quantiles."""
    sent = [p for p in report.sent if p.timestamp_ms is not None]
    latencies = [
        written[p.episode_uuid].timestamp() - p.timestamp_ms / 1000
        for p in sent
        if p.episode_uuid in written
    ]
    if not latencies:
        return {"seconds": None, "events_per_s": None, "latency_s": None}
    first = min(p.timestamp_ms for p in sent) / 1000
    elapsed = max(written[p.episode_uuid].timestamp() for p in sent if p.episode_uuid in written)
    elapsed -= first
    # This phase's share of the workers' histograms: after minus before.
    now, then = merged_buckets(after, LATENCY), merged_buckets(before, LATENCY)
    buckets = {le: count - then.get(le, 0.0) for le, count in now.items()}
    return {
        "seconds": round(elapsed, 3),
        "events_per_s": round(len(latencies) / elapsed, 1),
        # mapped records the extraction hop wrote itself, or handed on (docs/streaming.md
        # "Why two hops")
        "mapped_written_in_extraction_hop": {
            path: sum(metric_value(t, MAPPED, path=path) for t in after)
            - sum(metric_value(t, MAPPED, path=path) for t in before)
            for path in ("written", "handed_on")
        },
        "produce_seconds": round(report.seconds, 3),
        # the first produce, so that the slowest episodes' times can be lined up with the
        # services' and the worker's logs
        "started_at": datetime.fromtimestamp(first, UTC).isoformat(timespec="milliseconds"),
        "latency_s": {
            "p50": round(percentile(latencies, 0.50), 3),
            "p99": round(percentile(latencies, 0.99), 3),
            "max": round(max(latencies), 3),
            "episodes": len(latencies),
            "histogram_p50": round(histogram_quantile(0.50, buckets), 3),
            "histogram_p99": round(histogram_quantile(0.99, buckets), 3),
            "slowest": _slowest(sent, written, first),
            "by_fifth": _by_fifth(sent, written, first),
        },
    }


def _by_fifth(sent: list[Any], written: dict[str, datetime], first: float) -> list[list[float]]:
    """p50 and p99 of the episodes produced in each fifth of the phase, in order: flat when
    the workers keep up with the offered rate, rising when a backlog grows through it."""
    timed = sorted(
        (p.timestamp_ms / 1000 - first, written[p.episode_uuid].timestamp() - p.timestamp_ms / 1000)
        for p in sent
        if p.episode_uuid in written
    )
    span = (timed[-1][0] or 1.0) if timed else 1.0
    fifths: list[list[float]] = [[] for _ in range(5)]
    for at, lag in timed:
        fifths[min(4, int(5 * at / span))].append(lag)
    return [[round(percentile(f, 0.50), 3), round(percentile(f, 0.99), 3)] for f in fifths if f]


def _slowest(
    sent: list[Any], written: dict[str, datetime], first: float, share: float = 0.01
) -> list[dict[str, Any]]:
    """The slowest ``share`` of the episodes (the tail the p99 reads), in produce order: when
    each was produced (seconds into the phase), its group and latency. Tails that bunch in one
    moment come from a stall of the whole worker; tails spread over the phase, from the path
    of a record."""
    timed = [
        (
            p.timestamp_ms / 1000,
            p.group_id,
            written[p.episode_uuid].timestamp() - p.timestamp_ms / 1000,
        )
        for p in sent
        if p.episode_uuid in written
    ]
    tail = sorted(timed, key=lambda t: t[2])[-max(1, math.ceil(share * len(timed))) :]
    return [
        {"produced_s": round(at - first, 2), "group": group, "latency_s": round(lag, 3)}
        for at, group, lag in sorted(tail)
    ]


def paced_records(rate: float, seconds: float, records: int, groups: int) -> int:
    """Records of the paced phase: ``seconds`` worth at ``rate``, within [groups, records]."""
    return min(records, max(groups, int(rate * seconds)))


async def run_kafka_path(
    path: KafkaPath, make_feed: FeedMaker, records: int, groups: int
) -> dict[str, Any]:
    """Both phases on ``path.workers`` workers; the figures of each, the workers' peak RSS."""
    run = _Run(path)
    started = time.perf_counter()
    run.start()
    closed: dict[str, Any] = {}
    try:
        await wait_assigned(run.ports, "episodes", path.partitions, timeout=240)
        startup = time.perf_counter() - started
        maximum = await run.phase(make_feed(records, f"{run.run_id}-max"), None)
        # The paced phase starts once Neo4j has flushed the first phase's writes and deletes
        # (and the workers' community refreshes after it): its latencies are its own.
        maximum["settled_seconds"] = await asyncio.to_thread(settle)
        rate = path.rate or max(1.0, round(0.5 * (maximum["events_per_s"] or 2.0), 1))
        n = paced_records(rate, path.latency_seconds, records, groups)
        paced = await run.phase(make_feed(n, f"{run.run_id}-paced"), rate)
    finally:
        closed = await run.close()
    return {
        "workers": path.workers,
        "partitions": path.partitions,
        "batch_size": path.batch_size,
        "topic_prefix": run.run_id,
        "startup_seconds": round(startup, 1),
        "maximum": maximum,
        "paced": paced,
        "wall_seconds": round(time.perf_counter() - started, 1),
        **closed,
    }
