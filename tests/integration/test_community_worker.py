"""The community processor inside a real worker (issue 6): the entities.new agent assigns new
entities, the timer refreshes, the CLI lists the result. Real Kafka and Neo4j, the worker as
a subprocess (``topology_harness``), mapped episodes (no LLM); every wait polls a condition
with a deadline.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.topology_harness import Topology, Worker, eventually
from tidegraph.topics.client import producer_for

pytestmark = pytest.mark.integration

TEAM = ("m1", "m2", "m3", "m4")
A = ["Ada", "Alan", "Alonzo", "Anita"]
B = ["Barbara", "Beatrix", "Bjarne", "Brian"]
NEWCOMER = "Xavier"


def _team_rule(kind: str, relation: str) -> str:
    """Four people, a fact between every two of them (a clique in one episode)."""
    entities = "\n".join(f'      {m}: {{name: "{{{m}}}", label: Person}}' for m in TEAM)
    facts = "\n".join(
        f"      - {{relation: {relation}, subject: {a}, object: {b}, cardinality: many, "
        f'fact: "{{{a}}} and {{{b}}}: {kind}"}}'
        for i, a in enumerate(TEAM)
        for b in TEAM[i + 1 :]
    )
    return f"""\
  - name: {kind}
    match: {{type: {kind}}}
    entities:
{entities}
    facts:
{facts}
"""


MAPPING = (
    "mappings:\n"
    + _team_rule("team.met", "MET")
    + _team_rule("team.worked", "WORKED_WITH")
    + """\
  - name: link
    match: {type: link}
    entities:
      a: {name: "{a}", label: Person}
      b: {name: "{b}", label: Person}
    facts:
      - {relation: MET, subject: a, object: b, cardinality: many, fact: "{a} met {b}"}
  - name: newcomer
    match: {type: newcomer}
    entities:
      x: {name: "{x}", label: Person}
      f1: {name: "{f1}", label: Person}
      f2: {name: "{f2}", label: Person}
      r: {name: "{r}", label: Person}
    facts:
      - {relation: MET, subject: x, object: f1, cardinality: many, fact: "{x} met {f1}"}
      - {relation: MET, subject: x, object: f2, cardinality: many, fact: "{x} met {f2}"}
      - {relation: MET, subject: x, object: r, cardinality: many, fact: "{x} met {r}"}
"""
)


class Feed:
    """Episodes of one group, reference times increasing."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.count = 0
        self.clock = datetime(2025, 3, 3, 9, 0, tzinfo=UTC)

    def episode(self, content: dict[str, Any]) -> dict[str, Any]:
        self.count += 1
        self.clock += timedelta(hours=1)
        when = self.clock.isoformat().replace("+00:00", "Z")
        return {
            "id": f"{self.group}:{self.count:03d}",
            "group_id": self.group,
            "source": "json",
            "name": content["type"],
            "source_description": "community test",
            "content": content,
            "reference_time": when,
        }

    def team(self, kind: str, names: list[str]) -> dict[str, Any]:
        return self.episode({"type": kind, **dict(zip(TEAM, names, strict=True))})


@pytest.fixture
async def topology(
    kafka_bootstrap: str, neo4j_uri: str, neo4j_driver: Any, topic_prefix: str, tmp_path: Path
) -> Any:
    topo = Topology(kafka_bootstrap, neo4j_uri, topic_prefix, tmp_path, mapping_text=MAPPING)
    yield topo
    await topo.close(neo4j_driver)


async def partition(topo: Topology, group: str) -> dict[str, list[str]]:
    """{community uuid: sorted member names} as stored."""
    store = topo.store()
    try:
        names = {e.uuid: e.name for e in await store.browse.list_entities(group)}
        return {
            c.uuid: sorted(names.get(m, m) for m in c.members)
            for c in await store.communities.list_communities(group)
        }
    finally:
        await store.close()


def assignments(worker: Worker, outcome: str | None = None) -> float:
    labels = {} if outcome is None else {"outcome": outcome}
    return worker.value("tidegraph_community_assignments_total", **labels)


async def test_worker_assigns_new_entities_and_refreshes_on_its_timer(
    topology: Topology,
) -> None:
    group = f"{topology.run}-people"
    # threshold 0: any assignment schedules a refresh at the next check, so the stored
    # partition converges to label propagation over the whole feed
    worker = topology.start_worker(
        TIDEGRAPH_COMMUNITY_CHECK_SECONDS="0.3", TIDEGRAPH_COMMUNITY_DRIFT_THRESHOLD="0"
    )
    await topology.wait_assigned([worker])
    feed = Feed(group)

    # two cliques, each pair tied by two facts, and one single-fact bridge
    first = [
        feed.team("team.met", A),
        feed.team("team.met", B),
        feed.team("team.worked", A),
        feed.team("team.worked", B),
        feed.episode({"type": "link", "a": "Ada", "b": "Barbara"}),
    ]
    report = await topology.produce(first)
    await topology.wait_reflected(report, timeout=45)
    await topology.wait_metric(worker, "tidegraph_community_assignments_total", 8, timeout=30)

    async def settled() -> tuple[dict[str, list[str]], float]:
        topology.check_workers()
        return await partition(topology, group), worker.value(
            "tidegraph_community_drift_ratio", group_id=group
        )

    stored, _ = await eventually(
        settled,
        lambda got: sorted(got[0].values()) == [A, B] and got[1] == 0,
        timeout=30,
        what="the timer's refreshes to leave the two cliques as communities",
    )
    assert worker.value("tidegraph_community_refreshes_total", trigger="initial") == 1
    assert assignments(worker) == 8  # every created entity heard of exactly once
    community_a = next(uuid for uuid, members in stored.items() if members == A)
    joined_before = assignments(worker, "joined")

    # a newcomer met two of A and one of B: the agent puts it into A
    newcomer = {"type": "newcomer", "x": NEWCOMER, "f1": "Alan", "f2": "Anita", "r": "Brian"}
    report = await topology.produce([feed.episode(newcomer)])
    await topology.wait_reflected(report, timeout=30)
    await topology.wait_metric(
        worker, "tidegraph_community_assignments_total", joined_before + 1, outcome="joined"
    )
    stored = await eventually(
        lambda: partition(topology, group),
        lambda got: got.get(community_a) == sorted([*A, NEWCOMER]),
        timeout=20,
        what=f"{NEWCOMER} to be a member of community A",
    )
    assert sorted(stored.values()) == [sorted([*A, NEWCOMER]), B]
    assert assignments(worker, "none") + assignments(worker, "joined") == 9

    # the query command shows it
    lines = topology.cli("communities", "--group", group, "--json").stdout.splitlines()
    rows = [orjson.loads(line) for line in lines]
    assert [set(row) for row in rows] == [{"uuid", "name", "summary", "members", "size"}] * 2
    largest = rows[0]
    assert largest["uuid"] == community_a
    assert largest["members"] == sorted([*A, NEWCOMER]) and largest["size"] == 5
    assert largest["name"] and largest["summary"]

    # an unreadable record on the topic is dead-lettered with the reason, and the agent goes on
    producer = producer_for(topology.settings())
    await producer.start()
    try:
        await producer.send_and_wait(
            topology.names.entities_new, b"not a record", key=group.encode()
        )
    finally:
        await producer.stop()

    async def community_letters() -> list[Any]:
        topology.check_workers()
        return [d for d in await topology.dead_letters() if d.stage == "communities"]

    [letter] = await eventually(community_letters, bool, timeout=30, what="the dead letter")
    assert letter.reason == "bad_hop_record" and letter.record == "not a record"
    assert worker.alive()
    assert worker.stop() == 0
