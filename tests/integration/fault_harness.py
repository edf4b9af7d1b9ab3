"""Store faults under running workers: a Neo4j of the run's own (started by the project's
script on a fixed port, so that it can be frozen, killed and restarted), the uninterrupted
in-process reference, and the checks of "nothing lost, nothing reordered" (docs/streaming.md
"When the store is down"). Used by tests/integration/test_store_outage.py (small) and
benchmarks/fault_probe.py (full size)."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neo4j import AsyncGraphDatabase

from tests.integration.graph_compare import comparable
from tests.integration.topology_harness import Topology, eventually
from tests.support.crm_feed import CRM_MAPPING, crm_feed
from tests.support.local_services import LocalServices, LocalSettings, _free_port
from tidegraph.pipelines.ingest import ingest
from tidegraph.pipelines.runtime import open_runtime
from tidegraph.records.episode import Episode
from tidegraph.settings import Settings
from tidegraph.topics.client import read_changes

# Short retries, so that an outage outlasts every one of them.
WORKER_ENV = {
    "TIDEGRAPH_STAGE_MAX_ATTEMPTS": "2",
    "TIDEGRAPH_RETRY_BACKOFF_SECONDS": "0.1",
    "TIDEGRAPH_RETRY_BACKOFF_MAX_SECONDS": "0.2",
    "TIDEGRAPH_HEALTH_PROBE_SECONDS": "2",
    "TIDEGRAPH_COMMUNITIES_ENABLED": "false",
    # A worker whose records wait for the store finishes them before it lets its partitions
    # go; past this the group goes on without it (docs/streaming.md "When the store is down").
    "TIDEGRAPH_REBALANCE_TIMEOUT_SECONDS": "20",
}


def group(run: str, i: int) -> str:
    return f"{run}-tenant-{i:02d}"


class OwnNeo4j:
    """A Neo4j of the run's own, on a fixed port, that can be frozen, killed and restarted."""

    def __init__(self, root: Path) -> None:
        settings = LocalSettings(services_dir=root, local_neo4j_bolt_port=_free_port())
        self.services = LocalServices(settings)
        self.uri = f"bolt://127.0.0.1:{settings.local_neo4j_bolt_port}"

    async def up(self) -> None:
        await asyncio.to_thread(self.services.up, ("neo4j",))

    def signal(self, sig: signal.Signals) -> None:
        pid = self.services._read_pid("neo4j")
        assert pid is not None, "the run's Neo4j is not running"
        os.killpg(pid, sig)

    async def kill(self) -> None:
        self.signal(signal.SIGKILL)
        await eventually(
            lambda: asyncio.to_thread(self.services._read_pid, "neo4j"),
            lambda pid: pid is None,
            timeout=30,
            what="the killed Neo4j to be gone",
        )

    async def down(self) -> None:
        try:
            self.signal(signal.SIGCONT)
        except (AssertionError, ProcessLookupError):
            pass
        await asyncio.to_thread(self.services.down, ("neo4j",))


async def reference_graph(
    uri: str, tmp: Path, run: str, episodes: int, groups: int, seed: int = 7
) -> dict[int, Any]:
    """The uninterrupted in-process run of the same feed (groups of ``run``)."""
    mapping = tmp / "reference-mapping.yaml"
    mapping.write_text(CRM_MAPPING)
    settings = Settings(store="neo4j", neo4j_uri=uri, embedder="hashing", data_dir=tmp / "ref")
    runtime = await open_runtime(settings, mapping_path=mapping, use_llm=False)
    try:
        feed = crm_feed(episodes, groups, run=run, seed=seed)
        report = await ingest(
            runtime.runner(), [Episode.model_validate(e) for e in feed], concurrency=4
        )
        assert not report.failures, report.failures
        return {i: await comparable(runtime.store, group(run, i)) for i in range(groups)}
    finally:
        await runtime.close()


async def written_order_problems(uri: str, groups: list[str]) -> list[str]:
    """Per group, an episode written (created_at) before an earlier one of its input: at no
    instant may the written episodes be other than a prefix of the group's input."""
    driver = AsyncGraphDatabase.driver(uri)
    problems = []
    try:
        for group_id in groups:
            records, _, _ = await driver.execute_query(
                "MATCH (ep:Episodic) WHERE ep.group_id = $g "
                "RETURN ep.producer_id AS id, ep.created_at AS at",
                g=group_id,
            )
            written = sorted((int(r["id"].rsplit(":", 1)[1]), r["at"]) for r in records)
            for (i, at), (j, later_at) in zip(written, written[1:], strict=False):
                if later_at < at:
                    problems.append(f"{group_id}: episode {j} written before episode {i}")
    finally:
        await driver.close()
    return problems


def differing_facts(got: dict[str, Any], want: dict[str, Any]) -> int:
    """Facts in one snapshot (``comparable``) and not the other, both ways."""
    mine, theirs = set(got["facts"]), set(want["facts"])
    return len(mine ^ theirs)


@dataclass
class FaultReport:
    """What a fault run found (every figure should be 0, ``processed`` the feed's size)."""

    processed: int = 0
    dead_letters: int = 0
    differing_groups: list[int] = field(default_factory=list)
    differing_facts: int = 0
    order_problems: list[str] = field(default_factory=list)
    changes_committed: int = 0
    changes_missing: int = 0
    tracebacks: int = 0
    outage_lines: int = 0


async def check_run(
    topology: Topology,
    neo4j: OwnNeo4j,
    reference: dict[int, Any],
    groups: int,
    *,
    report_timeout: float,
    episodes_report: Any,
) -> FaultReport:
    """Wait for the feed to be reflected, then every check of the module docstring."""
    names = [group(topology.run, i) for i in range(groups)]
    found = FaultReport()
    result = await topology.wait_reflected(episodes_report, timeout=report_timeout)
    found.processed = result.processed
    found.dead_letters = len(result.dead) + len(await topology.dead_letters())
    store = topology.store()
    try:
        for i in range(groups):
            got = await comparable(store, group(topology.run, i))
            if got != reference[i]:
                found.differing_groups.append(i)
                found.differing_facts += differing_facts(got, reference[i])
        changes = {g: await store.outbox.changes(g, 0, 1_000_000) for g in names}
    finally:
        await store.close()
    found.order_problems = await written_order_problems(neo4j.uri, names)
    committed = {(g, c.seq) for g, cs in changes.items() for c in cs}
    found.changes_committed = len(committed)

    async def published() -> set[tuple[str, int]]:
        return {(c.group_id, c.seq) for c in await read_changes(topology.settings(), names)}

    try:
        seen = await eventually(
            published, lambda got: committed <= got, timeout=60, what="every change published"
        )
    except AssertionError:
        seen = await published()
    found.changes_missing = len(committed - seen)
    logs = "\n".join(w.log.read_text(errors="replace") for w in topology.workers)
    found.tracebacks = logs.count("Traceback (most recent call last)")  # not Faust's stacks
    found.outage_lines = logs.count("does not answer")
    return found
