"""Communities on real stores: incremental assignment, refreshes, summaries only when changed.

Runs on Neo4j and on the embedded SQLite store (same scenario, same answers)."""

from __future__ import annotations

import asyncio
import uuid as uuidlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from neo4j import AsyncGraphDatabase

from tests.support.fake_llm import FakeRequest, ScriptedLLMServer
from tests.support.stores import upsert_entities
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.llm.client import LLMClient
from tidegraph.pipelines.community_service import CommunityService
from tidegraph.processors.communities import groups, label_propagation
from tidegraph.records.graph import EntityRecord, EpisodeRecord, FactRecord
from tidegraph.records.ids import stable_uuid
from tidegraph.stores import EpisodeWrite, FactClosure, GraphStore

pytestmark = pytest.mark.integration

DIM = 384  # shared with the rest of the suite's Neo4j vector indexes
T0 = datetime(2024, 1, 1, tzinfo=UTC)
SCHEMA = "CommunitySummaryOutput"


def ent(group: str, name: str) -> EntityRecord:
    return EntityRecord(
        uuid=stable_uuid("entity", group, name),
        group_id=group,
        name=name,
        summary=f"{name} is a test entity",
        created_at=T0,
    )


def rel(group: str, a: EntityRecord, b: EntityRecord, tag: str) -> FactRecord:
    return FactRecord(
        uuid=stable_uuid("fact", group, a.uuid, b.uuid, tag),
        group_id=group,
        source_uuid=a.uuid,
        target_uuid=b.uuid,
        name="KNOWS",
        fact=f"{a.name} knows {b.name} ({tag})",
        valid_at=T0,
        created_at=T0,
        cardinality="many",
    )


class Graph:
    """A group's test graph: entities by name, facts written as numbered episodes."""

    def __init__(self, store: GraphStore, group: str) -> None:
        self.store, self.group = store, group
        self.entities: dict[str, EntityRecord] = {}
        self._episodes = 0

    def uuid(self, name: str) -> str:
        return self.entities[name].uuid

    async def link(
        self, pairs: list[tuple[str, str]], times: int = 1, tag: str = ""
    ) -> list[FactRecord]:
        names = sorted({n for pair in pairs for n in pair} - set(self.entities))
        new = [ent(self.group, n) for n in names]
        self.entities.update({e.name: e for e in new})
        await upsert_entities(self.store, self.group, new)
        facts = [
            rel(self.group, self.entities[a], self.entities[b], f"{a}-{b}-{i}{tag}")
            for a, b in pairs
            for i in range(times)
        ]
        await self._write(facts=facts)
        return facts

    async def close(self, facts: list[FactRecord]) -> None:
        end = T0 + timedelta(days=10)
        await self._write(closures=[FactClosure(f.uuid, end, end) for f in facts])

    async def _write(
        self, facts: list[FactRecord] | None = None, closures: list[FactClosure] | None = None
    ) -> None:
        self._episodes += 1
        episode = EpisodeRecord(
            uuid=stable_uuid("episode", self.group, str(self._episodes)),
            group_id=self.group,
            name="e",
            source="message",
            source_description="test",
            content="test",
            valid_at=T0,
            created_at=T0,
            producer_id=str(self._episodes),
        )
        await self.store.write_episode(
            self.group, EpisodeWrite(episode, facts=facts or [], closures=closures or [])
        )

    async def members(self) -> dict[str, list[str]]:
        """{community uuid: sorted member names}."""
        names = {e.uuid: e.name for e in self.entities.values()}
        return {
            c.uuid: sorted(names[m] for m in c.members)
            for c in await self.store.communities.list_communities(self.group)
        }


def clique(names: list[str]) -> list[tuple[str, str]]:
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture
async def graph(store: GraphStore, _neo4j_uri_if_needed: str | None) -> AsyncIterator[Graph]:
    group = f"comm-{uuidlib.uuid4().hex[:12]}"
    yield Graph(store, group)
    if _neo4j_uri_if_needed is not None:
        driver = AsyncGraphDatabase.driver(_neo4j_uri_if_needed, auth=None)
        try:
            await driver.execute_query("MATCH (n {group_id: $g}) DETACH DELETE n", {"g": group})
        finally:
            await driver.close()


def _answer(request: FakeRequest) -> dict[str, str]:
    # the first listed member is the community's best connected one (then by name)
    top = request.user.splitlines()[1].removeprefix("- ").split(":")[0]
    return {"name": f"Around {top}", "summary": f"A community around {top}."}


@pytest.fixture
def llm_server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as server:
        server.on(SCHEMA, _answer)
        yield server


@pytest.fixture
async def llm(llm_server: ScriptedLLMServer) -> AsyncIterator[LLMClient]:
    client = LLMClient(base_url=llm_server.base_url, api_key="test", model="fake")
    try:
        yield client
    finally:
        await client.close()


A = ["a1", "a2", "a3", "a4"]
B = ["b1", "b2", "b3", "b4"]


async def _two_communities(graph: Graph, service: CommunityService) -> tuple[str, str]:
    await graph.link(clique(A), times=2)
    await graph.link(clique(B), times=2)
    await graph.link([("a1", "b1")])  # a weak bridge
    result = await service.refresh(graph.group)
    assert (result.created, result.changed, result.deleted) == (2, 0, 0)
    by_members = {tuple(m): u for u, m in (await graph.members()).items()}
    return by_members[tuple(A)], by_members[tuple(B)]


# ----------------------------------------------------------------------------- tests
async def test_new_entity_joins_its_neighbours_majority(graph: Graph) -> None:
    service = CommunityService(graph.store)
    community_a, community_b = await _two_communities(graph, service)
    await graph.link([("x", "a2"), ("x", "a3"), ("x", "b2")])
    assert await service.assign(graph.group, graph.uuid("x")) == community_a
    assert await service.assign(graph.group, graph.uuid("x")) == community_a  # idempotent
    assert (await graph.members())[community_a] == sorted([*A, "x"])
    # weights count facts: three facts to b3 outweigh two neighbours in A
    await graph.link([("y", "a2"), ("y", "a3")])
    await graph.link([("y", "b3")], times=3)
    assert await service.assign(graph.group, graph.uuid("y")) == community_b
    # no neighbour in a community: no membership, picked up by the next refresh
    await graph.link([("z", "w")])
    assert await service.assign(graph.group, graph.uuid("z")) is None
    assert "z" not in {n for m in (await graph.members()).values() for n in m}
    # an entity of a closed fact only is no neighbour
    closed = await graph.link([("v", "a4")])
    await graph.close(closed)
    assert await service.assign(graph.group, graph.uuid("v")) is None


async def test_new_entities_placed_together_get_the_places_of_one_at_a_time(
    graph: Graph,
) -> None:
    """A micro-batch's new entities are placed as one unit (one read, one write), each
    seeing where the ones before it went."""
    service = CommunityService(graph.store)
    community_a, community_b = await _two_communities(graph, service)
    await graph.link([("p", "a2")])
    await graph.link([("q", "p")], times=2)  # q's heaviest neighbour is p, placed just before
    await graph.link([("q", "b2")])
    await graph.link([("r", "s")])  # no neighbour in a community
    new = [graph.uuid(n) for n in ("p", "q", "r")]
    assert await service.assign_many(graph.group, new) == [community_a, community_a, None]
    members = await graph.members()
    assert members[community_a] == sorted([*A, "p", "q"])
    assert members[community_b] == B
    # the same again changes nothing (a redelivered micro-batch)
    assert await service.assign_many(graph.group, new) == [community_a, community_a, None]
    assert await graph.members() == members


async def test_ties_break_the_same_way_every_run(graph: Graph) -> None:
    service = CommunityService(graph.store)
    community_a, community_b = await _two_communities(graph, service)
    await graph.link([("t", "a2"), ("t", "b2")])
    answers = {await CommunityService(graph.store).assign(graph.group, graph.uuid("t"))}
    answers.add(await service.assign(graph.group, graph.uuid("t")))
    assert answers == {min(community_a, community_b)}


async def test_refresh_rewrites_only_what_changed(
    graph: Graph, llm: LLMClient, llm_server: ScriptedLLMServer
) -> None:
    service = CommunityService(graph.store, llm, HashingEmbedder(dim=DIM))
    community_a, community_b = await _two_communities(graph, service)
    assert llm_server.count(SCHEMA) == 2
    before = {c.uuid: c for c in await graph.store.communities.list_communities(graph.group)}
    assert before[community_a].name == "Around a1"  # a1 has the bridge: the highest degree

    # nothing changed: nothing rewritten, no LLM call
    again = await service.refresh(graph.group)
    assert (again.unchanged, again.changed, again.created, again.deleted) == (2, 0, 0, 0)
    assert again.llm_calls == 0 and llm_server.count(SCHEMA) == 2

    # a third cluster, two triangles tied by every pair between them: one new community
    cs, ds = ["c1", "c2", "c3"], ["d1", "d2", "d3"]
    await graph.link(clique(cs))
    await graph.link(clique(ds))
    bridge = await graph.link([(c, d) for c in cs for d in ds])
    merged = await service.refresh(graph.group)
    assert (merged.unchanged, merged.changed, merged.created, merged.deleted) == (2, 0, 1, 0)
    assert llm_server.count(SCHEMA) == 3
    members = await graph.members()
    assert sorted(members.values()) == [A, B, ["c1", "c2", "c3", "d1", "d2", "d3"]]
    [cd] = set(members) - {community_a, community_b}

    # the bridges end: the cluster splits, one half keeps its uuid, A and B are untouched
    await graph.close(bridge)
    split = await service.refresh(graph.group)
    assert (split.unchanged, split.changed, split.created, split.deleted) == (2, 1, 1, 0)
    assert split.llm_calls == 2 and llm_server.count(SCHEMA) == 5
    asked = [r.user for name, r, _ in llm_server.requests if name == SCHEMA][3:]
    assert not any("- a1" in text or "- b1" in text for text in asked)
    members = await graph.members()
    # a tie in overlap: the half whose smallest member uuid is smaller keeps the uuid
    keeper = min((cs, ds), key=lambda half: min(graph.uuid(n) for n in half))
    assert members[cd] == keeper
    assert sorted(members.values()) == [A, B, ["c1", "c2", "c3"], ["d1", "d2", "d3"]]
    after = {c.uuid: c for c in await graph.store.communities.list_communities(graph.group)}
    for kept in (community_a, community_b):
        assert (after[kept].name, after[kept].summary) == (before[kept].name, before[kept].summary)

    # the halves join again: the smaller uuid of the two (equal overlaps) stays
    halves = set(members) - {community_a, community_b}
    await graph.link([(c, d) for c in cs for d in ds], tag="again")
    joined = await service.refresh(graph.group)
    assert (joined.unchanged, joined.changed, joined.created, joined.deleted) == (2, 1, 0, 1)
    assert (await graph.members())[min(halves)] == sorted(cs + ds)

    # what label propagation dictates, on the stored graph
    nodes, edges = await graph.store.communities.entity_graph(graph.group)
    expected = [g for g in groups(label_propagation(nodes, edges).labels) if len(g) > 1]
    stored = sorted(c.members for c in await graph.store.communities.list_communities(graph.group))
    assert stored == expected


async def test_refresh_without_llm_names_by_top_members(graph: Graph) -> None:
    service = CommunityService(graph.store)
    await graph.link(clique(A))
    await graph.link([("a2", "hub"), ("a3", "hub")])
    assert service.refresh_trigger(graph.group, 0.5, timedelta(hours=1)) == "initial"
    await service.refresh(graph.group)
    [community] = await graph.store.communities.list_communities(graph.group)
    # degree a2 = a3 = 4, then a1 = a4 = 3 (ties by name)
    assert community.name == "a2, a3, a1 +2"
    assert community.summary == "5 entities, most connected: a2, a3, a1, a4, hub"
    assert service.should_refresh(graph.group, 0.5, timedelta(hours=1)) is False
    await graph.link([("n1", "a2")])
    await service.assign(graph.group, graph.uuid("n1"))
    assert service.drift(graph.group) == pytest.approx(1 / 5)
    assert service.should_refresh(graph.group, 0.1, timedelta(hours=1)) is True
    assert service.refresh_trigger(graph.group, 0.1, timedelta(hours=1)) == "drift"
    assert service.refresh_trigger(graph.group, 0.5, timedelta(hours=1)) is None
    later = datetime.now(UTC) + timedelta(hours=2)
    assert service.refresh_trigger(graph.group, 0.5, timedelta(hours=1), now=later) == "age"


class GatedStore:
    """The store, with its ``communities.write_communities`` held until ``release`` is set."""

    def __init__(self, store: GraphStore) -> None:
        self._store = store
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()
        self.communities = _GatedCommunities(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class _GatedCommunities:
    def __init__(self, gate: GatedStore) -> None:
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gate._store.communities, name)

    async def write_communities(self, *args: Any) -> None:
        self._gate.reached.set()
        await self._gate.release.wait()
        await self._gate._store.communities.write_communities(*args)


async def test_an_entity_assigned_during_a_refresh_keeps_its_place(graph: Graph) -> None:
    gated = GatedStore(graph.store)
    service = CommunityService(cast(GraphStore, gated))
    community_a, _ = await _two_communities(graph, service)
    await graph.link([("a5", a) for a in A], times=2)  # A grows: the refresh rewrites it
    gated.reached.clear()
    gated.release.clear()
    refresh = asyncio.create_task(service.refresh(graph.group))
    await asyncio.wait_for(gated.reached.wait(), 30)
    # x arrives after the refresh's projection and joins A as stored now
    await graph.link([("x", "a2"), ("x", "a3")])
    assert service.is_refreshing(graph.group)
    assert await service.assign(graph.group, graph.uuid("x")) == community_a
    gated.release.set()
    result = await asyncio.wait_for(refresh, 30)
    # the rewrite of A replaced its memberships; x was placed again afterwards
    assert (result.changed, result.created, result.deleted) == (1, 0, 0)
    assert (await graph.members())[community_a] == sorted([*A, "a5", "x"])
    assert service.drift(graph.group) == pytest.approx(1 / 9)  # x, over the 9 projected
