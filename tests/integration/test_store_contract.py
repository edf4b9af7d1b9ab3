"""The GraphStore contract, run against Neo4j, the embedded SQLite store and the in-memory
store alike.

Every test runs once per store (fixture ``store``); ``test_stores_agree`` also runs one
scenario on the stores and compares the answers. Any difference between the stores is a bug.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid as uuidlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from neo4j import AsyncGraphDatabase

from tests.support.plan_keys import plan_leaves
from tests.support.stores import assign_member, neighbour_weights, upsert_entities, vector_facts
from tidegraph.records.asof import AsOf
from tidegraph.records.graph import (
    CommunityRecord,
    EntityRecord,
    EpisodeRecord,
    FactRecord,
    FactView,
    WeightedEdge,
)
from tidegraph.records.ids import normalize_name, stable_uuid
from tidegraph.records.search import KINDS, SearchScope
from tidegraph.records.times import iso
from tidegraph.settings import Settings
from tidegraph.stores import (
    EpisodeConflictError,
    EpisodeWrite,
    FactClosure,
    GraphStore,
    StoreIntegrityError,
    StoreSchemaError,
    open_store,
)
from tidegraph.stores.base import BatchWriteError
from tidegraph.stores.memory.store import MemoryStore
from tidegraph.stores.neo4j import queries as neo4j_queries
from tidegraph.stores.neo4j import search_queries as sq
from tidegraph.stores.neo4j.asof import ENTITY_GRAPH_RETURN, as_of_params, as_of_query
from tidegraph.stores.neo4j.search import Neo4jSearch
from tidegraph.stores.neo4j.store import Neo4jStore
from tidegraph.stores.rows import vector_candidates
from tidegraph.stores.sqlite import db as sqlite_db
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.store import SqliteStore

pytestmark = pytest.mark.integration

# The dimension every tidegraph embedder uses by default; the Neo4j test server is shared by
# the whole suite, whose vector indexes must all agree on it.
DIM = 384
T0 = datetime(2024, 1, 1, tzinfo=UTC)
FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
HOSTILE = [
    "x'}) DETACH DELETE n //",
    "`Entity`) MATCH (n) DETACH DELETE n //`",
    "quote \" double ' single \\ backslash",
    "$group_id {uuid: $uuid} ${x}",
    "ünïcødé 東京 🚀 Ωμέγα\nnew line\ttab",
    'a:b "c',
]


# ----------------------------------------------------------------------------- builders
def ranks_fulltext(store: GraphStore) -> bool:
    """Whether ``store`` ranks fulltext hits by relevance (Lucene in Neo4j, BM25 in SQLite);
    the in-memory store counts the words of the text found, unstemmed and unweighted (its
    module docstring), so only the hits themselves are compared there."""
    return not isinstance(store, MemoryStore)


def vec(*head: float) -> list[float]:
    return [float(v) for v in head] + [0.0] * (DIM - len(head))


def apart(*values: float, at: int = DIM - 8) -> list[float]:
    """A vector whose only non-zero values are at ``at`` and after, where ``vec`` puts none."""
    return [0.0] * at + [float(v) for v in values] + [0.0] * (DIM - at - len(values))


def day(n: float) -> datetime:
    return T0 + timedelta(days=n)


def entity(
    group: str,
    name: str,
    *,
    labels: list[str] | None = None,
    summary: str = "",
    key: str | None = None,
    aliases: list[str] | None = None,
    embedding: list[float] | None = None,
    created_at: datetime | None = None,
) -> EntityRecord:
    return EntityRecord(
        uuid=stable_uuid("entity", group, name),
        group_id=group,
        name=name,
        labels=labels or [],
        summary=summary,
        key=key,
        aliases=aliases or [],
        name_embedding=embedding,
        created_at=created_at or day(0),
    )


def fact(
    group: str,
    source: EntityRecord,
    target: EntityRecord,
    relation: str,
    text: str,
    *,
    valid_at: datetime | None = None,
    invalid_at: datetime | None = None,
    created_at: datetime | None = None,
    expired_at: datetime | None = None,
    embedding: list[float] | None = None,
    episodes: list[str] | None = None,
    tag: str = "",
) -> FactRecord:
    return FactRecord(
        uuid=stable_uuid("fact", group, source.uuid, relation, target.uuid, tag),
        group_id=group,
        source_uuid=source.uuid,
        target_uuid=target.uuid,
        name=relation,
        fact=text,
        fact_embedding=embedding,
        episodes=episodes or [],
        valid_at=valid_at,
        invalid_at=invalid_at,
        created_at=created_at or day(0),
        expired_at=expired_at,
        cardinality="one",
    )


def episode(
    group: str, producer_id: str, valid_at: datetime, content: str = "hello"
) -> EpisodeRecord:
    return EpisodeRecord(
        uuid=stable_uuid("episode", group, producer_id),
        group_id=group,
        name=f"episode {producer_id}",
        source="message",
        source_description="chat",
        content=content,
        valid_at=valid_at,
        created_at=valid_at + timedelta(minutes=1),
        producer_id=producer_id,
    )


async def snapshot(store: GraphStore, group: str) -> dict[str, Any]:
    """Everything the store says about a group, for before/after comparisons."""
    entities = await store.browse.list_entities(group)
    facts = await store.facts_touching(group, [e.uuid for e in entities])
    return {
        "counts": await store.browse.counts(group),
        "entities": [e.model_dump() for e in entities],
        "facts": [f.model_dump() for f in facts],
        "episodes": [e.model_dump() for e in await store.recent_episodes(group, FAR_FUTURE, 1000)],
        "history": [
            v.model_dump() for v in await store.browse.query_facts(group, include_invalid=True)
        ],
    }


def uuids(hits: list[tuple[Any, float]]) -> list[str]:
    return [record.uuid for record, _ in hits]


# ----------------------------------------------------------------------------- fixtures
async def _drop_neo4j_groups(uri: str, groups: list[str]) -> None:
    driver = AsyncGraphDatabase.driver(uri, auth=None)
    try:
        await driver.execute_query(
            "MATCH (n) WHERE n.group_id IN $groups DETACH DELETE n", {"groups": groups}
        )
    finally:
        await driver.close()


@pytest.fixture
def store(any_store: GraphStore) -> GraphStore:
    """Every store in turn: Neo4j, the embedded SQLite store and the in-memory one
    (``any_store``): the contract is the same for all three."""
    return any_store


@pytest.fixture
async def new_group(
    store: GraphStore, _neo4j_uri_if_needed: str | None
) -> AsyncIterator[Callable[..., str]]:
    """Makes group ids of this test's own; on Neo4j their nodes are removed afterwards
    (independently of ``delete_group``, which is under test)."""
    made: list[str] = []

    def make(prefix: str = "g") -> str:
        gid = f"{prefix}-{uuidlib.uuid4().hex[:12]}"
        made.append(gid)
        return gid

    yield make
    if _neo4j_uri_if_needed is not None and made:
        await _drop_neo4j_groups(_neo4j_uri_if_needed, made)


# ----------------------------------------------------------------------------- lifecycle
async def test_setup_is_idempotent_and_refuses_another_dimension(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group = new_group()
    await store.setup(DIM)
    await store.setup(DIM)
    with pytest.raises(StoreSchemaError, match=r"384.*385|DROP INDEX|data folder"):
        await store.setup(DIM + 1)
    # still usable after the refusal, indexes answering right away
    acme = entity(group, "Acme Corp", summary="printers", embedding=vec(1))
    await upsert_entities(store, group, [acme])
    assert uuids(await store.fulltext_entities(group, "acme", 5)) == [acme.uuid]
    assert uuids(await store.vector_entities(group, vec(1), 5)) == [acme.uuid]


async def test_open_store_follows_settings(tmp_path: Path) -> None:
    embedded = open_store(Settings(store="embedded", data_dir=tmp_path))
    neo4j = open_store(Settings(store="neo4j"))
    try:
        assert isinstance(embedded, SqliteStore)
        assert isinstance(neo4j, Neo4jStore)
        await embedded.setup(DIM)
        assert (tmp_path / "graph").is_dir()
    finally:
        await embedded.close()
        await neo4j.close()


async def test_embedded_store_reopens_with_its_data(tmp_path: Path) -> None:
    group = "reopen"
    first = SqliteStore(tmp_path / "graph")
    await first.setup(DIM)
    acme = entity(group, "Acme Corp", summary="printers", embedding=vec(1))
    await upsert_entities(first, group, [acme])
    await first.close()
    second = SqliteStore(tmp_path / "graph")
    try:
        with pytest.raises(StoreSchemaError, match="data folder"):
            await second.setup(DIM * 2)
        await second.setup(DIM)
        globex = entity(group, "Globex", summary="printers too", embedding=vec(0.9, 0.1))
        await upsert_entities(second, group, [globex])  # indexes follow after a reopen
        assert uuids(await second.vector_entities(group, vec(1), 5)) == [acme.uuid, globex.uuid]
        assert set(uuids(await second.fulltext_entities(group, "printers", 5))) == {
            acme.uuid,
            globex.uuid,
        }
    finally:
        await second.close()


# ----------------------------------------------------------------------------- episodes
async def test_write_episode_marks_it_processed(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group, other = new_group(), new_group()
    ep = episode(group, "zendesk:ticket-88:comment-3", day(3), content="Printer is broken")
    assert not await store.episode_processed(group, ep.uuid)
    await store.write_episode(group, EpisodeWrite(episode=ep))
    assert await store.episode_processed(group, ep.uuid)
    assert not await store.episode_processed(other, ep.uuid)
    [stored] = await store.recent_episodes(group, FAR_FUTURE, 10)
    assert stored == ep
    assert stored.valid_at.tzinfo is not None and stored.valid_at.utcoffset() == timedelta(0)
    assert await store.browse.counts(group) == {
        "episodes": 1,
        "entities": 0,
        "facts": 0,
        "mentions": 0,
    }


async def test_an_episode_id_reused_for_other_content_is_refused(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    """Re-sending an episode is skipped; reusing its id for other content is an error at every
    processed check (the early ones and the write's own), and nothing changes."""
    group = new_group()
    acme = entity(group, "Acme Corp")
    first = episode(group, "ticket-1", day(1)).model_copy(update={"content_hash": "hash-a"})
    assert await store.write_episode(group, EpisodeWrite(episode=first, entities=[acme]))
    before = await snapshot(store, group)
    assert not await store.write_episode(group, EpisodeWrite(episode=first))  # re-sent: skipped
    other = first.model_copy(update={"content_hash": "hash-b", "content": "something else"})
    with pytest.raises(EpisodeConflictError, match="other content"):
        await store.write_episode(group, EpisodeWrite(episode=other, mentions=[acme.uuid]))
    assert await snapshot(store, group) == before
    assert await store.episode_processed(group, first.uuid)
    assert await store.episode_processed(group, first.uuid, "hash-a")
    with pytest.raises(EpisodeConflictError):
        await store.episode_processed(group, first.uuid, "hash-b")
    lookup = await store.lookup_entities(group, [], ["acme corp"], first.uuid, None, "hash-a")
    assert lookup.processed
    with pytest.raises(EpisodeConflictError):
        await store.lookup_entities(group, [], ["acme corp"], first.uuid, None, "hash-b")
    # an episode stored before hashes existed has none: any content passes
    legacy = episode(group, "ticket-0", day(0))
    await store.write_episode(group, EpisodeWrite(episode=legacy))
    assert await store.episode_processed(group, legacy.uuid, "whatever")


async def test_a_processed_episode_answers_with_the_entities_it_created(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    """The marker keeps the uuids of the entities the episode created, so a redelivery found
    processed at the lookup can send their new-entity events again (docs/streaming.md "At-least-once
    with idempotent effects")."""
    group, other = new_group(), new_group()
    acme, globex = entity(group, "Acme Corp"), entity(group, "Globex")
    first = episode(group, "ticket-1", day(1))
    written = EpisodeWrite(
        episode=first, mentions=[acme.uuid, globex.uuid], entities=[acme, globex]
    )
    written.created = [globex.uuid, acme.uuid]
    assert await store.write_episode(group, written)
    assert (await store.episode_markers(group, [(first.uuid, None)])).get(first.uuid) == [
        globex.uuid,
        acme.uuid,
    ]
    lookup = await store.lookup_entities(group, ["k"], ["acme corp"], first.uuid, ["X"])
    assert (lookup.processed, lookup.created_entities) == (True, [globex.uuid, acme.uuid])
    assert (lookup.by_key, lookup.by_name, lookup.facts) == ([], [], None)
    # a later episode that created nothing, and other groups, answer with none
    second = episode(group, "ticket-2", day(2))
    await store.write_episode(group, EpisodeWrite(episode=second, mentions=[acme.uuid]))
    assert (await store.episode_markers(group, [(second.uuid, None)])).get(second.uuid) == []
    assert (await store.lookup_entities(group, [], [], second.uuid)).created_entities == []
    assert (await store.episode_markers(other, [(first.uuid, None)])).get(first.uuid) is None
    assert not (await store.lookup_entities(other, [], [], first.uuid)).processed


async def test_recent_episodes_order_limit_and_before(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group, other = new_group(), new_group()
    episodes = [episode(group, f"msg-{i}", day(i)) for i in range(1, 6)]
    for ep in reversed(episodes):
        await store.write_episode(group, EpisodeWrite(episode=ep))
    await store.write_episode(other, EpisodeWrite(episode=episode(other, "msg-x", day(2))))

    def producers(eps: list[EpisodeRecord]) -> list[str]:
        return [e.producer_id for e in eps]

    assert producers(await store.recent_episodes(group, day(4), 2)) == ["msg-2", "msg-3"]
    assert producers(await store.recent_episodes(group, day(4), 10)) == [
        "msg-1",
        "msg-2",
        "msg-3",
    ]
    assert producers(await store.recent_episodes(group, day(1), 10)) == []
    assert producers(await store.recent_episodes(group, FAR_FUTURE, 1)) == ["msg-5"]
    assert await store.recent_episodes(group, FAR_FUTURE, 0) == []
    # an aware time in another zone is the same instant
    before = day(4).astimezone(timezone(timedelta(hours=-5)))
    assert producers(await store.recent_episodes(group, before, 1)) == ["msg-3"]
    # several times at once: each as asked alone, in the order asked
    befores = [day(4), day(1), FAR_FUTURE, before, day(3)]
    together = await store.recent_episodes_before(group, befores, 2)
    assert together == [await store.recent_episodes(group, b, 2) for b in befores]
    assert [producers(eps) for eps in together][2] == ["msg-4", "msg-5"]
    assert await store.recent_episodes_before(group, befores, 0) == [[]] * len(befores)
    assert await store.recent_episodes_before(group, [], 2) == []


# ----------------------------------------------------------------------------- entities
async def test_entity_upsert_semantics(store: GraphStore, new_group: Callable[..., str]) -> None:
    group = new_group()
    first = entity(
        group,
        "Acme Corp",
        labels=["Organization"],
        summary="Makes printers.",
        aliases=["acme"],
        embedding=vec(1, 0),
        created_at=day(1),
    )
    await upsert_entities(store, group, [first])
    second = first.model_copy(
        update={
            "name": "ACME Corporation",
            "labels": ["Customer", "Organization"],
            "summary": "",
            "key": "crm-1",
            "aliases": ["acme corporation", "acme"],
            "name_embedding": vec(0, 1),
            "created_at": day(9),
        }
    )
    await upsert_entities(store, group, [second])
    [stored] = await store.entities_by_uuids(group, [first.uuid])
    assert stored.name == "Acme Corp"
    assert stored.labels == ["Organization", "Customer"]
    assert stored.aliases == ["acme", "acme corporation"]
    assert stored.summary == "Makes printers."  # an empty summary does not replace
    assert stored.key == "crm-1"  # set while null
    assert stored.name_embedding == vec(1, 0)
    assert stored.created_at == day(1)

    third = second.model_copy(update={"summary": "Makes printers and toner.", "key": "crm-2"})
    await upsert_entities(store, group, [third])
    [stored] = await store.entities_by_uuids(group, [first.uuid])
    assert stored.summary == "Makes printers and toner."
    assert stored.key == "crm-1"  # never replaced once set
    # the name lookup still works by the first name
    assert [e.uuid for e in await store.entities_by_names(group, ["acme corp"])] == [first.uuid]
    assert await store.browse.counts(group) == {
        "episodes": 0,
        "entities": 1,
        "facts": 0,
        "mentions": 0,
    }


async def test_repeated_uuid_in_one_batch_applies_in_order(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group = new_group()
    a = entity(group, "Acme", labels=["A"], summary="one", aliases=["x"], embedding=vec(1))
    b = a.model_copy(update={"labels": ["B"], "summary": "", "aliases": ["y"], "key": "k"})
    c = a.model_copy(update={"labels": ["A", "C"], "summary": "three", "key": "other"})
    await upsert_entities(store, group, [a, b, c])
    [stored] = await store.browse.list_entities(group)
    assert (stored.labels, stored.aliases, stored.summary, stored.key) == (
        ["A", "B", "C"],
        ["x", "y"],
        "three",
        "k",
    )


async def test_entity_lookups(store: GraphStore, new_group: Callable[..., str]) -> None:
    group, other = new_group(), new_group()
    for g in (group, other):
        await upsert_entities(
            store,
            g,
            [
                entity(g, "Acme Corp.", key="crm-1", aliases=["acme inc", "the acme company"]),
                entity(g, "Globex", key="crm-2"),
                entity(g, "Initech"),
            ],
        )
    acme, globex = (stable_uuid("entity", group, n) for n in ("Acme Corp.", "Globex"))

    def ids(records: list[EntityRecord]) -> list[str]:
        assert all(r.group_id == group for r in records)
        return [r.uuid for r in records]

    assert ids(await store.entities_by_names(group, [normalize_name("ACME corp")])) == [acme]
    assert ids(await store.entities_by_names(group, ["acme inc"])) == [acme]
    assert ids(await store.entities_by_names(group, ["acme inc", "acme corp", "globex"])) == [
        acme,
        globex,
    ]
    assert ids(await store.entities_by_names(group, ["nobody"])) == []
    assert ids(await store.entities_by_names(group, [])) == []
    assert ids(await store.entities_by_keys(group, ["crm-2", "crm-1", "crm-9"])) == [acme, globex]
    assert ids(await store.entities_by_keys(group, [])) == []
    # A table's rows by their keys' fixed beginning (a truncate); % and _ are no wildcards.
    assert ids(await store.entities_by_key_prefix(group, "crm-")) == [acme, globex]
    assert ids(await store.entities_by_key_prefix(group, "crm-2")) == [globex]
    assert ids(await store.entities_by_key_prefix(group, "crm_")) == []
    assert ids(await store.entities_by_key_prefix(group, "%")) == []
    assert ids(await store.entities_by_uuids(group, [globex, acme, "missing"])) == [acme, globex]
    other_acme = stable_uuid("entity", other, "Acme Corp.")
    assert ids(await store.entities_by_uuids(group, [other_acme])) == []
    assert [e.name for e in await store.browse.list_entities(group)] == [
        "Acme Corp.",
        "Globex",
        "Initech",
    ]


async def test_batch_reads_of_several_groups_answer_each_group_alone(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    """``read_batch`` answers as ``lookup_entities`` and ``episode_markers`` do, for each group
    alone, also when groups' reads share a statement (Neo4j: reads submitted together); a
    conflicting episode fails its own read only."""
    groups = [new_group() for _ in range(4)]
    for n, g in enumerate(groups):
        a = entity(g, "Acme Corp", key="crm:a", aliases=["acme inc"])
        b = entity(g, f"Plan {n}")
        f = fact(g, a, b, "PLAN", f"Acme is on plan {n}", valid_at=day(n))
        ep = episode(g, "m-1", day(1)).model_copy(update={"content_hash": "hash-1"})
        await store.write_episode(
            g, EpisodeWrite(ep, mentions=[a.uuid], facts=[f], entities=[a, b])
        )
    asked = [(g, episode(g, "m-1", day(1)).uuid) for g in groups]
    reads = await asyncio.gather(
        *(
            store.read_batch(
                g,
                ["crm:a", "crm:z"],
                ["acme inc", "plan 2"],
                ["PLAN"],
                [
                    (uuid, "hash-1"),
                    (episode(g, "m-2", day(2)).uuid, None),
                ],
            )
            for g, uuid in asked
        )
    )
    for (g, uuid), read in zip(asked, reads, strict=True):
        lookup = await store.lookup_entities(
            g, ["crm:a", "crm:z"], ["acme inc", "plan 2"], None, ["PLAN"]
        )
        assert read.lookup == lookup
        assert {e.group_id for e in [*lookup.by_key, *lookup.by_name]} == {g}
        assert [f.group_id for f in lookup.facts or []] == [g]
        assert read.markers == {uuid: []}
    names = [[e.name for e in read.lookup.by_name] for read in reads]
    assert names == [["Acme Corp"], ["Acme Corp"], ["Acme Corp", "Plan 2"], ["Acme Corp"]]
    g0, g1 = groups[:2]
    conflict, fine = await asyncio.gather(
        store.read_batch(g0, [], [], [], [(asked[0][1], "hash-other")]),
        store.read_batch(g1, [], [], [], [(asked[1][1], "hash-1")]),
        return_exceptions=True,
    )
    assert isinstance(conflict, EpisodeConflictError)
    assert not isinstance(fine, BaseException) and fine.markers == {asked[1][1]: []}


async def test_a_batch_read_leaves_out_the_facts_that_ended_before_its_start(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    """``read_batch(..., facts_from)`` returns the open facts and those ending at or after
    ``facts_from`` (a recorded end at that moment included), never the facts that ended
    before it: they cannot change a plan (``FactRecord.ended_before``). Without it, all."""
    g = new_group()
    a = entity(g, "Acme Corp", key="crm:a")
    plans = [entity(g, f"Plan {n}") for n in range(4)]
    history = [
        fact(g, a, plans[0], "PLAN", "on plan 0", valid_at=day(0), invalid_at=day(2), tag="0"),
        fact(g, a, plans[1], "PLAN", "on plan 1", valid_at=day(2), invalid_at=day(5), tag="1"),
        fact(g, a, plans[2], "PLAN", "ends at 5", valid_at=day(5), invalid_at=day(5), tag="2"),
        fact(g, a, plans[3], "PLAN", "on plan 3", valid_at=day(6), tag="3"),
    ]
    closed = [f.model_copy(update={"expired_at": day(9)}) if f.invalid_at else f for f in history]
    ep = episode(g, "m-1", day(1))
    await store.write_episode(
        g, EpisodeWrite(ep, mentions=[a.uuid], facts=closed, entities=[a, *plans])
    )

    async def texts(facts_from: datetime | None) -> list[str]:
        read = await store.read_batch(g, ["crm:a"], [], ["PLAN"], [], facts_from)
        return sorted(f.fact for f in read.lookup.facts or [])

    everything = sorted(f.fact for f in history)
    assert await texts(None) == everything
    assert await texts(day(0)) == everything
    assert await texts(day(3)) == ["ends at 5", "on plan 1", "on plan 3"]
    assert await texts(day(5)) == ["ends at 5", "on plan 1", "on plan 3"]
    assert await texts(day(5.5)) == ["on plan 3"]


async def test_list_entities_orders_by_name_then_uuid(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group = new_group()
    records = [
        EntityRecord(uuid=f"{group}-{suffix}", group_id=group, name=name)
        for name, suffix in [("Beta", "2"), ("Alpha", "9"), ("Beta", "1"), ("Zed", "0")]
    ]
    await upsert_entities(store, group, records)
    listed = await store.browse.list_entities(group)
    assert [(e.name, e.uuid[-1]) for e in listed] == [
        ("Alpha", "9"),
        ("Beta", "1"),
        ("Beta", "2"),
        ("Zed", "0"),
    ]
    assert all(e.summary == "" and e.labels == [] and e.created_at for e in listed)


async def test_invalid_labels_are_dropped(store: GraphStore, new_group: Callable[..., str]) -> None:
    group = new_group()
    labels = ["Person", "bad label", "1abc", "x'}) DETACH", "Community", "Ok_2", "Person", ""]
    await upsert_entities(store, group, [entity(group, "Ada", labels=labels)])
    [stored] = await store.browse.list_entities(group)
    assert stored.labels == ["Person", "Ok_2"]


async def test_neo4j_type_labels_are_real_labels(neo4j_uri: str, neo4j_driver: Any) -> None:
    group = f"labels-{uuidlib.uuid4().hex[:12]}"
    store = Neo4jStore(neo4j_uri)
    try:
        await store.setup(DIM)
        ada = entity(group, "Ada", labels=["Person", "bad label", "Episodic", "Ok_2"])
        await upsert_entities(store, group, [ada])
        await upsert_entities(store, group, [ada.model_copy(update={"labels": ["Engineer"]})])
        result = await neo4j_driver.execute_query(
            "MATCH (e:Entity {uuid: $uuid}) RETURN labels(e) AS labels", {"uuid": ada.uuid}
        )
        assert sorted(result.records[0]["labels"]) == ["Engineer", "Entity", "Ok_2", "Person"]
    finally:
        await _drop_neo4j_groups(neo4j_uri, [group])
        await store.close()


async def test_group_conflicts_are_refused(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    mine, theirs = new_group(), new_group()
    theirs_acme = entity(theirs, "Acme", summary="theirs")
    await upsert_entities(store, theirs, [theirs_acme])
    intruder = theirs_acme.model_copy(update={"group_id": mine, "summary": "mine"})
    with pytest.raises(StoreIntegrityError):
        await upsert_entities(store, mine, [intruder])
    with pytest.raises(ValueError):  # a record of another group
        await upsert_entities(store, mine, [theirs_acme])
    [stored] = await store.browse.list_entities(theirs)
    assert stored.summary == "theirs"
    assert await store.browse.list_entities(mine) == []

    ep = episode(theirs, "m-1", day(1))
    await store.write_episode(theirs, EpisodeWrite(episode=ep))
    with pytest.raises(StoreIntegrityError):
        await store.write_episode(
            mine, EpisodeWrite(episode=ep.model_copy(update={"group_id": mine}))
        )
    assert not await store.episode_processed(mine, ep.uuid)


async def test_write_referencing_missing_entities_writes_nothing(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group = new_group()
    a = entity(group, "A")
    ghost = entity(group, "Ghost")
    await upsert_entities(store, group, [a])
    ep = episode(group, "m-1", day(1))
    bad_fact = fact(group, a, ghost, "KNOWS", "A knows a ghost", valid_at=day(1))
    for write in (
        EpisodeWrite(episode=ep, mentions=[a.uuid], facts=[bad_fact]),
        EpisodeWrite(episode=ep, mentions=[a.uuid, ghost.uuid]),
        EpisodeWrite(
            episode=ep,
            closures=[FactClosure(uuid="no-such-fact", invalid_at=day(2), expired_at=day(2))],
        ),
    ):
        with pytest.raises(StoreIntegrityError):
            await store.write_episode(group, write)
    assert not await store.episode_processed(group, ep.uuid)
    assert await store.browse.counts(group) == {
        "episodes": 0,
        "entities": 1,
        "facts": 0,
        "mentions": 0,
    }


async def test_embeddings_are_checked(store: GraphStore, new_group: Callable[..., str]) -> None:
    group = new_group()
    with pytest.raises(ValueError, match="dimensions"):
        await upsert_entities(store, group, [entity(group, "A", embedding=[1.0, 0.0])])
    with pytest.raises(ValueError, match="non-zero"):
        await upsert_entities(store, group, [entity(group, "A", embedding=vec())])
    with pytest.raises(ValueError, match="dimensions"):
        await store.vector_entities(group, [1.0], 5)
    with pytest.raises(ValueError, match="dimensions"):
        await vector_facts(store, group, [1.0], 5)
    assert await store.browse.counts(group) == {
        "episodes": 0,
        "entities": 0,
        "facts": 0,
        "mentions": 0,
    }


async def test_datetimes_are_aware_utc(store: GraphStore, new_group: Callable[..., str]) -> None:
    group = new_group()
    plus_two = timezone(timedelta(hours=2))
    created = datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=plus_two)
    await upsert_entities(store, group, [entity(group, "A", created_at=created)])
    [stored] = await store.browse.list_entities(group)
    assert stored.created_at == created
    assert stored.created_at is not None and stored.created_at.utcoffset() == timedelta(0)
    assert stored.created_at.hour == 10


async def test_times_before_1970_keep_their_microseconds(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    """Every time a write carries comes back to the microsecond, before the epoch too (the
    Neo4j store sends times as epoch pairs, floored)."""
    group = new_group()
    a, b = entity(group, "A"), entity(group, "B")
    await upsert_entities(store, group, [a, b])
    starts = datetime(1955, 3, 4, 5, 6, 7, 123456, tzinfo=timezone(timedelta(hours=2)))
    just_before_epoch = datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    earlier = datetime(1954, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
    f = fact(group, a, b, "FOUNDED", "A founded B", valid_at=earlier, invalid_at=just_before_epoch)
    f.prior_starts, f.prior_starts_learned_at, f.start_learned_at = [starts], [day(0)], day(1)
    ep = episode(group, "old", datetime(1901, 7, 8, 9, 10, 11, 999, tzinfo=UTC))
    await store.write_episode(group, EpisodeWrite(episode=ep, facts=[f]))
    [stored] = await store.facts_touching(group, [a.uuid])
    assert (stored.valid_at, stored.invalid_at) == (earlier, just_before_epoch)
    assert (stored.prior_starts, stored.prior_starts_learned_at) == ([starts], [day(0)])
    assert stored.start_learned_at == day(1)
    [stored_episode] = await store.recent_episodes(group, FAR_FUTURE, 1)
    assert stored_episode.valid_at == ep.valid_at


async def _add_community(store: GraphStore, group: str, name: str, members: list[str]) -> str:
    community = stable_uuid("community", group, name)
    await store.communities.write_communities(
        group, [CommunityRecord(community, name, "", members)], []
    )
    return community


async def test_entities_carry_their_community(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group = new_group()
    a = entity(group, "Acme", summary="printers", embedding=vec(1))
    b = entity(group, "Bolt", summary="printers", embedding=vec(1, 1))
    await upsert_entities(store, group, [a, b])
    community = await _add_community(store, group, "Printing", [a.uuid])
    expected = {a.uuid: community, b.uuid: None}
    for records in (
        await store.browse.list_entities(group),
        await store.entities_by_uuids(group, [a.uuid, b.uuid]),
        [e for e, _ in await store.fulltext_entities(group, "printers", 5)],
        [e for e, _ in await store.vector_entities(group, vec(1), 5)],
    ):
        assert {e.uuid: e.community_uuid for e in records} == expected
    assert (
        await store.communities.communities_of(group, [b.uuid, a.uuid, a.uuid, "missing"])
        == expected
    )
    assert await store.communities.communities_of(new_group(), [a.uuid, b.uuid]) == {}
    # an upsert leaves the membership alone
    await upsert_entities(store, group, [a.model_copy(update={"summary": "changed"})])
    assert [e.community_uuid for e in await store.entities_by_uuids(group, [a.uuid])] == [community]


# ----------------------------------------------------------------------------- search
async def _search_corpus(store: GraphStore, group: str) -> dict[str, EntityRecord]:
    records = {
        "acme": entity(
            group,
            "Acme Printers",
            summary="Acme sells laser printers and printer toner.",
            embedding=vec(1, 0),
        ),
        "globex": entity(group, "Globex", summary="Globex makes widgets.", embedding=vec(0.8, 0.6)),
        "initech": entity(
            group,
            "Initech",
            summary="A software company whose office printer is broken.",
            embedding=vec(0, 1),
        ),
        "umbrella": entity(group, "Umbrella", summary="Pharmaceuticals.", embedding=vec(-1, 0)),
        "plain": entity(group, "Hooli", summary="Search engine."),  # no embedding
    }
    await upsert_entities(store, group, list(records.values()))
    return records


async def test_fulltext_ranking_and_isolation(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group, other = new_group(), new_group()
    mine = await _search_corpus(store, group)
    await _search_corpus(store, other)

    hits = await store.fulltext_entities(group, "printer", 10)
    assert all(e.group_id == group for e, _ in hits)
    if ranks_fulltext(store):
        assert uuids(hits) == [mine["acme"].uuid, mine["initech"].uuid]
        assert hits[0][1] > hits[1][1] > 0
        assert uuids(await store.fulltext_entities(group, "printer", 1)) == [mine["acme"].uuid]
    else:
        assert set(uuids(hits)) == {mine["acme"].uuid, mine["initech"].uuid}
        assert len(await store.fulltext_entities(group, "printer", 1)) == 1
    assert uuids(await store.fulltext_entities(group, "WIDGETS", 10)) == [mine["globex"].uuid]
    assert uuids(await store.fulltext_entities(group, "globex", 10)) == [mine["globex"].uuid]
    for text in ["", "   ", "*", "AND", "the", "nothing-matches-this"]:
        assert await store.fulltext_entities(group, text, 10) == []
    for text in HOSTILE:
        await store.fulltext_entities(group, text, 10)  # plain text: no syntax error
    assert (await store.browse.counts(group))["entities"] == 5

    # the index follows updates (several in one batch): a replaced summary is searched, the
    # old one is not
    changed = [
        mine["globex"].model_copy(update={"summary": "Globex now sells printers."}),
        mine["umbrella"].model_copy(update={"summary": "Vaccines."}),
    ]
    await upsert_entities(store, group, changed)
    assert mine["globex"].uuid in uuids(await store.fulltext_entities(group, "printers", 10))
    assert await store.fulltext_entities(group, "widgets", 10) == []
    assert uuids(await store.fulltext_entities(group, "vaccines", 10)) == [mine["umbrella"].uuid]
    assert await store.fulltext_entities(group, "pharmaceuticals", 10) == []
    # new entities written in one batch are each found by their own words
    batch = [entity(group, f"Batch {word}", summary=f"about {word}") for word in ("kiwi", "mango")]
    await upsert_entities(store, group, batch)
    for record, word in zip(batch, ("kiwi", "mango"), strict=True):
        assert uuids(await store.fulltext_entities(group, word, 10)) == [record.uuid]
    assert uuids(await store.fulltext_entities(other, "widgets", 10)) == [
        stable_uuid("entity", other, "Globex")
    ]


async def test_vector_entities_ranking_and_isolation(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group, other = new_group(), new_group()
    mine = await _search_corpus(store, group)
    await _search_corpus(store, other)

    hits = await store.vector_entities(group, vec(1, 0), 10)
    assert uuids(hits) == [mine[k].uuid for k in ("acme", "globex", "initech", "umbrella")]
    assert [round(score, 1) for _, score in hits] == [1.0, 0.9, 0.5, 0.0]
    assert all(0.0 <= score <= 1.0 for _, score in hits)
    assert all(e.group_id == group for e, _ in hits)
    assert uuids(await store.vector_entities(group, vec(0, 1), 2)) == [
        mine["initech"].uuid,
        mine["globex"].uuid,
    ]
    assert await store.vector_entities(group, vec(1), 0) == []


async def test_vector_search_finds_a_small_group_beside_a_big_one(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    big, small = new_group("big"), new_group("small")
    crowd = [entity(big, f"Crowd {i}", embedding=vec(1, i / 1000)) for i in range(130)]
    await upsert_entities(store, big, crowd)
    far = entity(small, "Far", embedding=vec(-1, 0.1))
    side = entity(small, "Side", embedding=vec(0, 1))
    await upsert_entities(store, small, [far, side])
    assert uuids(await store.vector_entities(small, vec(1, 0), 5)) == [side.uuid, far.uuid]
    nearest = uuids(await store.vector_entities(big, vec(1, 0.05), 5))
    assert nearest[0] == crowd[50].uuid and set(nearest) == {c.uuid for c in crowd[48:53]}
    if isinstance(store.search, Neo4jSearch):  # the same answers from the global index as the scan
        store.search.scan_below = 1  # every group is "large": the index, then the scan of a share
        try:
            assert uuids(await store.vector_entities(small, vec(1, 0), 5)) == [
                side.uuid,
                far.uuid,
            ]
            assert uuids(await store.vector_entities(big, vec(1, 0.05), 5)) == nearest
        finally:
            del store.search.scan_below

    hub = entity(big, "Hub")
    await upsert_entities(store, big, [hub])
    big_facts = [
        fact(big, hub, crowd[i], "NEAR", f"near {i}", embedding=vec(1, i / 1000), tag=str(i))
        for i in range(130)
    ]
    await store.write_episode(big, EpisodeWrite(episode=episode(big, "e", day(1)), facts=big_facts))
    lone = fact(small, far, side, "FAR", "far from everything", embedding=vec(-1, 0))
    await store.write_episode(
        small, EpisodeWrite(episode=episode(small, "e", day(1)), facts=[lone])
    )
    [(found, score)] = await vector_facts(store, small, vec(1, 0), 5)
    assert found.uuid == lone.uuid and score == pytest.approx(0.0, abs=0.02)


def recorded(store: Neo4jStore, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Each statement the store reads with from now on, with its parameters, in order."""
    ran: list[tuple[str, Any]] = []
    rows = store.ex.rows

    async def recording(statement: str, params: dict[str, Any]) -> Any:
        ran.append((statement, params))
        return await rows(statement, params)

    monkeypatch.setattr(store.ex, "rows", recording)
    return ran


def statements(ran: list[tuple[str, Any]]) -> list[str]:
    return [statement for statement, _ in ran]


async def test_a_group_found_large_is_not_counted_again_for_a_while(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neo4j: whether a group is small enough for an exact scan is read once (the check reads
    up to ``scan_below`` vectors); a group found large goes straight to the index for
    ``LARGE_FOR_SECONDS``, with the same answers, and is checked again after that."""
    from tidegraph.stores.neo4j import search as search_core

    group = f"large-{uuidlib.uuid4().hex[:12]}"
    store = Neo4jStore(neo4j_uri)
    try:
        await store.setup(DIM)
        crowd = [entity(group, f"C{i}", embedding=vec(1, i / 10)) for i in range(6)]
        await upsert_entities(store, group, crowd)
        ran = recorded(store, monkeypatch)
        monkeypatch.setattr(store.search, "scan_below", 3)  # six entities: large
        scope = SearchScope((group,), AsOf.resolve(None, None, False, None))
        checks = lambda: statements(ran).count(sq.SMALL_SCAN_HITS["entity"])  # noqa: E731
        first = await store.search.vector_search(scope, "entity", vec(1, 0.2), 3)
        assert checks() == 1
        assert await store.search.vector_search(scope, "entity", vec(1, 0.2), 3) == first
        assert checks() == 1  # not counted again
        clock = search_core.time.monotonic() + search_core.LARGE_FOR_SECONDS + 1
        monkeypatch.setattr(search_core.time, "monotonic", lambda: clock)
        assert await store.search.vector_search(scope, "entity", vec(1, 0.2), 3) == first
        assert checks() == 2  # a while later, checked again
        assert [h.uuid for h in first] == [crowd[2].uuid, crowd[3].uuid, crowd[1].uuid]
    finally:
        await store.forget.delete_group(group)
        await store.close()


async def test_a_group_of_many_records_few_embedded_is_not_scanned_for_them(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neo4j: whether a group is small enough for an exact scan is judged by how many records
    of the kind it holds, not how many have an embedding: a group of many records with few
    embeddings (a mapped feed's episodes) is found large after reading ``scan_below`` of them
    (counting the embedded ones read them all, every search), and answered the same."""
    group = f"few-embedded-{uuidlib.uuid4().hex[:12]}"
    store = Neo4jStore(neo4j_uri)
    try:
        await store.setup(DIM)
        embedded = [entity(group, f"E{i}", embedding=apart(1, 1 + i / 10)) for i in range(2)]
        plain = [entity(group, f"P{i}") for i in range(4)]
        await upsert_entities(store, group, embedded + plain)
        scope = SearchScope((group,), AsOf.resolve(None, None, False, None))
        scanned = await store.search.vector_search(scope, "entity", apart(0, 1), 3)
        assert [h.uuid for h in scanned] == [embedded[1].uuid, embedded[0].uuid]
        ran = recorded(store, monkeypatch)
        monkeypatch.setattr(store.search, "scan_below", 3)  # six entities, two embedded: large
        found = await store.search.vector_search(scope, "entity", apart(0, 1), 3)
        [check] = [params for statement, params in ran if statement == sq.SMALL_SCAN_HITS["entity"]]
        assert check["scan_below"] == 3
        assert store.search._still_large(((group,), sq.SMALL_SCAN_HITS["entity"])) == 6
        assert found == scanned
    finally:
        await store.forget.delete_group(group)
        await store.close()


async def _tickets_with_one_status(
    store: Neo4jStore, group: str
) -> tuple[EntityRecord, EntityRecord, list[EntityRecord]]:
    """A status ("Closed") that thirteen tickets have, one of them ("Ticket 7", the seed)
    related to three others: a hub a walk must not read whole."""
    await store.setup(DIM)
    hub, seed = entity(group, "Closed"), entity(group, "Ticket 7")
    tickets = [entity(group, f"Ticket {i}") for i in range(12)]
    await upsert_entities(store, group, [hub, seed, *tickets])
    facts = [
        fact(group, t, hub, "HAS_STATUS", f"{t.name} status is Closed", valid_at=day(1))
        for t in [seed, *tickets]
    ] + [fact(group, seed, t, "RELATES", f"Ticket 7 relates to {t.name}") for t in tickets[:3]]
    ep = episode(group, "hub-1", day(1))
    await store.write_episode(group, EpisodeWrite(episode=ep, facts=facts))
    return hub, seed, tickets


async def test_a_walk_reads_of_an_entity_only_the_facts_it_can_keep(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neo4j: a walk that keeps ``limit`` facts reads of each entity at most that many (an
    entity thousands of facts point to, like a status every ticket took, answers what the walk
    can keep, not its history); its answer is that of the walk reading every fact."""
    from tidegraph.stores.hits import expanded

    group = f"hub-{uuidlib.uuid4().hex[:12]}"
    store = Neo4jStore(neo4j_uri)
    try:
        hub, seed, tickets = await _tickets_with_one_status(store, group)
        asof = AsOf.resolve(day(5), None, False, None)
        scope = SearchScope((group,), asof)
        ran = recorded(store, monkeypatch)
        walked = await store.search.expand_facts(scope, [seed.uuid, hub.uuid], 2, 5)
        assert [params["per_entity"] for statement, params in ran if "per_entity" in params] == [5]
        whole = await expanded(
            store.search._believed_touching(group, asof), [seed.uuid, hub.uuid], 2, 5
        )
        assert {h.uuid for h in walked} == {f.uuid for f, _ in whole}  # the same five
        assert len(walked) == 5
    finally:
        await store.forget.delete_group(group)
        await store.close()


async def test_a_walk_reads_the_hits_it_keeps_itself(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neo4j: a walk that stops at its first read keeps facts that read gave whole (its first
    ``limit`` in the walk's order), so its hits need no read of their own; a walk that goes on
    reads whole the facts it keeps that its reads gave light. Either way the hits are those
    of the facts the walk keeps, read by their uuids, nearest first."""
    from tidegraph.stores.hits import expanded

    group = f"walk-hits-{uuidlib.uuid4().hex[:12]}"
    store = Neo4jStore(neo4j_uri)
    try:
        hub, seed, tickets = await _tickets_with_one_status(store, group)

        # a second hop whose read gives whole others than the walk keeps: from S, X and Y are
        # as near (ties: by uuid, X first); the read gives X's facts first, and the walk
        # keeps the facts of lower uuids, Y's
        def named(name: str, uuid: str) -> EntityRecord:
            return entity(group, name).model_copy(update={"uuid": uuid})

        def linked(source: EntityRecord, target: EntityRecord, uuid: str) -> FactRecord:
            text = f"{source.name} links {target.name}"
            made = fact(group, source, target, "LINKS", text, valid_at=day(1))
            return made.model_copy(update={"uuid": uuid})

        start, x, y = (
            named(n, f"{d * 8}-0000-4000-8000-000000000000")
            for n, d in (("S", "0"), ("X", "1"), ("Y", "2"))
        )
        ends = [named(f"A{i}", f"3{i}000000-0000-4000-8000-000000000000") for i in range(6)]
        ties = [linked(start, x, "f1000000-0000-4000-8000-000000000000")]
        ties += [linked(start, y, "f2000000-0000-4000-8000-000000000000")]
        ties += [
            linked(x, e, f"c{i}000000-0000-4000-8000-000000000000") for i, e in enumerate(ends[:4])
        ]
        ties += [
            linked(y, e, f"a{i}000000-0000-4000-8000-000000000000") for i, e in enumerate(ends[4:])
        ]
        await upsert_entities(store, group, [start, x, y, *ends])
        tied = episode(group, "ties-1", day(1))
        await store.write_episode(group, EpisodeWrite(episode=tied, facts=ties))
        scope = SearchScope((group,), AsOf.resolve(day(5), None, False, None))
        ran = recorded(store, monkeypatch)
        for seeds, limit, reads in (
            ([seed.uuid, hub.uuid], 5, 1),  # the walk's read, nothing else
            ([tickets[11].uuid], 6, 2),  # two hops, what they keep read whole
            ([start.uuid], 4, 3),  # two hops, and the hits of those read light
        ):
            ran.clear()
            walked = await store.search.expand_facts(scope, seeds, 2, limit)
            assert len(ran) == reads
            assert statements(ran)[0] == sq.WALK_HITS_INDEXED
            kept = await expanded(
                store.search._believed_touching(group, scope.asof, limit), seeds, 2, limit
            )
            hops = {f.uuid: hop for f, hop in kept}
            apart = await store.search._hits(
                group, "fact", scope, {uuid: 1 / hop for uuid, hop in hops.items()}, hops
            )
            assert len(walked) == limit
            assert walked == sorted(apart, key=lambda h: (-h.score, h.uuid))
    finally:
        await store.forget.delete_group(group)
        await store.close()


async def test_a_search_list_and_the_recent_episodes_entities_are_one_read_each(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neo4j: a fulltext or vector list of facts, entities or episodes is read with its hits
    in one round trip (fulltext episodes: one more for the speakers' words), and the latest
    episodes with the entities they mention in one; the hits are those of separate reads."""
    group = f"reads-{uuidlib.uuid4().hex[:12]}"
    store = Neo4jStore(neo4j_uri)
    try:
        await store.setup(DIM)
        acme = entity(group, "Acme Corp", embedding=vec(1))
        bob = entity(group, "Bob Stone", embedding=vec(0, 1))
        said = episode(group, "msg-1", day(1), "Bob Stone: Acme Corp renewed the gold plan")
        said = said.model_copy(update={"content_embedding": vec(1)})
        text = "Acme Corp is run by Bob Stone"
        plan = fact(group, acme, bob, "OWNS", text, episodes=[said.uuid], embedding=vec(1))
        await store.write_episode(
            group,
            EpisodeWrite(episode=said, entities=[acme, bob], facts=[plan], mentions=[acme.uuid]),
        )
        ran = recorded(store, monkeypatch)
        scope = SearchScope((group,), AsOf.resolve(None, None, False, None))
        for kind, reads in (("fact", 1), ("entity", 1), ("episode", 2)):
            ran.clear()
            by_text = await store.search.fulltext_search(scope, kind, "Acme Corp", 5)
            assert (len(ran), statements(ran)[-1]) == (reads, sq.FULLTEXT_HITS[kind])
            ran.clear()
            by_vector = await store.search.vector_search(scope, kind, vec(1), 1)
            assert statements(ran) == [sq.SMALL_SCAN_HITS[kind]]  # scanned, with its hits
            assert [h.uuid for h in by_text] == [h.uuid for h in by_vector]
            separately = await store.search._hits(group, kind, scope, {by_text[0].uuid: 1.0})
            assert [dataclasses.replace(h, score=1.0) for h in by_text] == separately
        assert by_text[0].uuid == said.uuid
        [found] = await store.search.fulltext_search(scope, "fact", "Acme Corp", 5)
        assert (found.uuid, found.episodes) == (plan.uuid, ["msg-1"])  # details came too
        # a search's entity candidates come without their producers (every episode that
        # mentions them); the ones it keeps are completed with them in one read
        bare = dataclasses.replace(scope, details=False)
        [light] = await store.search.fulltext_search(bare, "entity", "Acme Corp", 1)
        assert (light.uuid, light.episodes, light.mentions) == (acme.uuid, [], 0)
        ran.clear()
        [whole] = await store.search.complete_hits(bare, [light])
        assert (whole.episodes, whole.mentions, len(ran)) == (["msg-1"], 1, 1)
        ran.clear()
        assert await store.search.recent_episode_entities(scope, 3) == [acme.uuid]
        assert len(ran) == 1
    finally:
        await store.forget.delete_group(group)
        await store.close()


@pytest.mark.parametrize("widen_above", [4, 10])
async def test_a_large_group_near_other_tenants_is_found_through_the_index_or_scanned(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch, widen_above: int
) -> None:
    """Neo4j: a query whose nearest records are all another tenant's finds none of a large
    group's among its first candidates. Groups holding more than ``widen_above`` records of
    the kind are asked for ``MAX_VECTOR_K`` neighbours and answered from them (a scan of them
    costs too much), smaller ones are scanned at once; the answer is the same."""
    from tidegraph.stores.neo4j import search as search_core

    group, other = (f"{name}-{uuidlib.uuid4().hex[:12]}" for name in ("mine", "theirs"))
    store = Neo4jStore(neo4j_uri)
    try:
        await store.setup(DIM)
        # In dimensions no other test writes (the Neo4j is shared): the crowd nearest the
        # query, mine next, nothing else near.
        mine = [entity(group, f"M{i}", embedding=apart(1, 1 + i / 10)) for i in range(6)]
        await upsert_entities(store, group, mine)
        crowd = [entity(other, f"T{i}", embedding=apart(i / 1000, 1)) for i in range(120)]
        await upsert_entities(store, other, crowd)
        ran = recorded(store, monkeypatch)
        monkeypatch.setattr(store.search, "scan_below", 3)  # six entities: large
        monkeypatch.setattr(store.search, "widen_above", widen_above)
        monkeypatch.setattr(search_core, "MAX_VECTOR_K", 200)
        scope = SearchScope((group,), AsOf.resolve(None, None, False, None))
        found = await store.search.vector_search(scope, "entity", apart(0, 1), 3)
        first = vector_candidates(3)  # fewer than the crowd: none of mine among them
        candidates, scan, _ = sq.SEARCH_VECTOR["entity"]
        asked = [params["k"] for statement, params in ran if statement == candidates]
        scanned = sum(statement == scan for statement, _ in ran)
        if widen_above == 4:  # six is more: the index is asked for the most, never scanned
            assert (asked, scanned) == ([first, 200], 0)
        else:  # six is fewer: scanned at once
            assert (asked, scanned) == ([first], 1)
        assert [h.uuid for h in found] == [mine[5].uuid, mine[4].uuid, mine[3].uuid]
    finally:
        for name in (group, other):
            await store.forget.delete_group(name)
        await store.close()


async def test_a_large_group_whose_scope_sees_few_of_its_neighbours_widens_only_so_far(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neo4j: when the index gives enough of a large group's records but the search's scope
    sees fewer (as of a past time, most of a long history is not seen), the index is asked
    for at most ``MAX_SCOPED_K`` neighbours, not ``MAX_VECTOR_K``: the list is what the scope
    sees among them, best first; the next search of the group asks for that many at once."""
    from tidegraph.stores.neo4j import search as search_core

    group, other = (f"{name}-{uuidlib.uuid4().hex[:12]}" for name in ("scoped", "crowd"))
    store = Neo4jStore(neo4j_uri)
    try:
        await store.setup(DIM)
        # in dimensions no other test writes: two entities stored on day 1, ten on day 5
        early = [
            entity(group, f"E{i}", embedding=apart(1, i / 10), created_at=day(1)) for i in range(2)
        ]
        late = [
            entity(group, f"L{i}", embedding=apart(1, 0.05 + i / 100), created_at=day(5))
            for i in range(10)
        ]
        await upsert_entities(store, group, early + late)
        # far from the query, but the index holds more than it is asked for
        crowd = [entity(other, f"C{i}", embedding=apart(0, 0, 1, i / 1000)) for i in range(200)]
        await upsert_entities(store, other, crowd)
        ran = recorded(store, monkeypatch)
        monkeypatch.setattr(store.search, "scan_below", 3)  # twelve entities: large
        monkeypatch.setattr(store.search, "widen_above", 4)  # too large to scan
        monkeypatch.setattr(search_core, "MAX_VECTOR_K", 200)
        monkeypatch.setattr(search_core, "MAX_SCOPED_K", 120)
        scope = SearchScope((group,), AsOf.resolve(None, day(2), False, None))
        found = await store.search.vector_search(scope, "entity", apart(1, 0), 3)
        candidates, scan, _ = sq.SEARCH_VECTOR["entity"]
        asked = [params["k"] for statement, params in ran if statement == candidates]
        assert asked == [vector_candidates(3), 120]
        assert not any(statement == scan for statement, _ in ran)
        assert [h.uuid for h in found] == [early[0].uuid, early[1].uuid]
        # the next search of the group asks for the widest at once, with the same answer
        ran.clear()
        again = await store.search.vector_search(scope, "entity", apart(1, 0), 3)
        assert [params["k"] for statement, params in ran if statement == candidates] == [120]
        assert [h.uuid for h in again] == [h.uuid for h in found]
    finally:
        for name in (group, other):
            await store.forget.delete_group(name)
        await store.close()


async def test_entity_candidates_are_each_drafts_vector_and_fulltext_hits(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    """``entity_candidates`` answers each search as ``vector_entities`` and
    ``fulltext_entities`` do, for a group scanned exactly and for one asked through the index
    (``scan_below`` moved), with the other groups' entities around."""
    group, other = new_group(), new_group()
    names = ["Acme Printers", "Acme Toner", "Globex Widgets", "Initech", *HOSTILE]
    mine = [entity(group, n, embedding=vec(1, i / 10)) for i, n in enumerate(names)]
    await upsert_entities(store, group, mine)
    await upsert_entities(store, other, [entity(other, "Acme Printers", embedding=vec(1, 0))])
    searches = [
        ("acme", vec(1, 0.05)),
        ("widgets initech", vec(1, 0.35)),
        ("!!! ???", vec(0, 1)),  # nothing searchable in the text
        (HOSTILE[0], vec(-1, 0)),
    ]

    async def one_by_one() -> list[Any]:
        return [
            (await store.vector_entities(group, e, 3), await store.fulltext_entities(group, n, 3))
            for n, e in searches
        ]

    # a store with a global vector index (Neo4jSearch) also through it
    for scan_below in (
        (Neo4jSearch.scan_below, 1) if isinstance(store.search, Neo4jSearch) else (None,)
    ):
        if scan_below is not None:
            store.search.scan_below = scan_below  # type: ignore[attr-defined]
        try:
            expected = await one_by_one()
            assert await store.entity_candidates(group, searches, 3) == expected
        finally:
            if scan_below is not None:
                del store.search.scan_below  # type: ignore[attr-defined]
    assert expected[0][1] and expected[2][1] == [] and all(len(v) == 3 for v, _ in expected)
    assert {e.group_id for v, t in expected for e, _ in [*v, *t]} == {group}
    assert await store.entity_candidates(group, [], 3) == []


async def test_vector_facts_ranking_and_isolation(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group, other = new_group(), new_group()
    for g in (group, other):
        a, b, c = (entity(g, n) for n in ("A", "B", "C"))
        await upsert_entities(store, g, [a, b, c])
        facts = [
            fact(g, a, b, "LIKES", "A likes B", embedding=vec(1, 0)),
            fact(g, b, c, "LIKES", "B likes C", embedding=vec(0.6, 0.8)),
            fact(g, a, c, "HATES", "A hates C", embedding=vec(-1, 0)),
            fact(g, c, a, "KNOWS", "C knows A"),  # no embedding
        ]
        await store.write_episode(g, EpisodeWrite(episode=episode(g, "e1", day(1)), facts=facts))
    hits = await vector_facts(store, group, vec(1, 0), 10)
    assert [f.fact for f, _ in hits] == ["A likes B", "B likes C", "A hates C"]
    assert [round(s, 1) for _, s in hits] == [1.0, 0.8, 0.0]
    assert all(f.group_id == group for f, _ in hits)
    assert hits[0][0].fact_embedding == vec(1, 0)
    assert [f.fact for f, _ in await vector_facts(store, group, vec(-1, 0), 1)] == ["A hates C"]


# ----------------------------------------------------------------------------- facts
async def test_facts_touching(store: GraphStore, new_group: Callable[..., str]) -> None:
    group, other = new_group(), new_group()
    for g in (group, other):
        a, b, c, d = (entity(g, n) for n in "ABCD")
        await upsert_entities(store, g, [a, b, c, d])
        facts = [
            fact(g, a, b, "KNOWS", "A knows B", valid_at=day(1)),
            fact(g, b, c, "KNOWS", "B knows C", valid_at=day(2)),
            fact(
                g,
                c,
                d,
                "KNOWS",
                "C knew D",
                valid_at=day(3),
                invalid_at=day(4),
                expired_at=day(5),
            ),
        ]
        await store.write_episode(g, EpisodeWrite(episode=episode(g, "e1", day(1)), facts=facts))
    a, b, c, d = (stable_uuid("entity", group, n) for n in "ABCD")

    async def texts(entity_uuids: list[str]) -> list[str]:
        found = await store.facts_touching(group, entity_uuids)
        assert all(f.group_id == group for f in found)
        return sorted(f.fact for f in found)

    assert await texts([a]) == ["A knows B"]
    assert await texts([b]) == ["A knows B", "B knows C"]
    assert await texts([d]) == ["C knew D"]  # closed facts too
    assert await texts([a, d]) == ["A knows B", "C knew D"]
    assert await texts([stable_uuid("entity", other, "A")]) == []
    assert await texts([]) == []
    [closed] = await store.facts_touching(group, [d])
    assert (closed.source_uuid, closed.target_uuid) == (c, d)
    assert (closed.valid_at, closed.invalid_at, closed.expired_at) == (day(3), day(4), day(5))
    assert closed.created_at == day(0) and closed.cardinality == "one"


async def test_write_episode_twice_is_identical(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group = new_group()
    a, b, c = (entity(group, n, embedding=vec(1, i)) for i, n in enumerate("ABC"))
    await upsert_entities(store, group, [a, b, c])
    ep1 = episode(group, "m-1", day(1))
    f1 = fact(group, a, b, "WORKS_AT", "A works at B", valid_at=day(1), episodes=[ep1.uuid])
    f2 = fact(
        group,
        b,
        c,
        "OWNS",
        "B owns C",
        valid_at=day(1),
        embedding=vec(0, 1),
        episodes=[ep1.uuid],
    )
    write1 = EpisodeWrite(episode=ep1, mentions=[a.uuid, b.uuid, b.uuid], facts=[f1, f2])
    await store.write_episode(group, write1)
    once = await snapshot(store, group)
    await store.write_episode(group, write1)
    assert await snapshot(store, group) == once
    assert once["counts"] == {"episodes": 1, "entities": 3, "facts": 2, "mentions": 2}

    ep2 = episode(group, "m-2", day(5))
    f3 = fact(group, a, c, "WORKS_AT", "A works at C", valid_at=day(5), episodes=[ep2.uuid])
    write2 = EpisodeWrite(
        episode=ep2,
        mentions=[a.uuid, c.uuid],
        facts=[f3],
        closures=[FactClosure(uuid=f1.uuid, invalid_at=day(5), expired_at=day(6))],
    )
    await store.write_episode(group, write2)
    twice = await snapshot(store, group)
    await store.write_episode(group, write2)
    assert await snapshot(store, group) == twice
    assert twice["counts"] == {"episodes": 2, "entities": 3, "facts": 3, "mentions": 4}
    [closed] = [f for f in twice["facts"] if f["uuid"] == f1.uuid]
    assert (closed["invalid_at"], closed["expired_at"]) == (day(5), day(6))
    history = {v["fact"]: v["episodes"] for v in twice["history"]}
    assert history == {"A works at B": ["m-1"], "B owns C": ["m-1"], "A works at C": ["m-2"]}


async def test_a_processed_episode_is_never_written_again(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    """A late writer of an episode (e.g. a worker that lost the group's partition) changes
    nothing: the marker is checked in the write's own transaction."""
    group = new_group()
    a, b, c = (entity(group, n) for n in "ABC")
    await upsert_entities(store, group, [a, b, c])
    ep1, ep2 = episode(group, "m-1", day(1)), episode(group, "m-2", day(2))
    f1 = fact(group, a, b, "PLAN", "A is on plan B", valid_at=day(1), episodes=[ep1.uuid])
    f2 = fact(group, a, c, "PLAN", "A is on plan C", valid_at=day(2), episodes=[ep2.uuid])
    assert await store.write_episode(group, EpisodeWrite(episode=ep1, facts=[f1]))
    closure = FactClosure(f1.uuid, invalid_at=day(2), expired_at=day(3))
    assert await store.write_episode(group, EpisodeWrite(ep2, facts=[f2], closures=[closure]))
    before = await snapshot(store, group)
    stale = EpisodeWrite(episode=ep1, facts=[f1], entities=[entity(group, "D")])
    assert not await store.write_episode(group, stale)  # f1 stays closed, no D
    assert await snapshot(store, group) == before


async def test_write_episode_upserts_its_entities_in_the_same_write(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group, other = new_group(), new_group()
    a = entity(group, "A", embedding=vec(1), key="crm:a", aliases=["a"])
    b = entity(group, "B", labels=["Plan"], aliases=["b"])
    ep = episode(group, "m-1", day(1))
    f = fact(group, a, b, "PLAN", "A is on plan B", valid_at=day(1), episodes=[ep.uuid])
    write = EpisodeWrite(episode=ep, mentions=[a.uuid, b.uuid], facts=[f], entities=[a, b])
    assert await store.write_episode(group, write)
    assert [e.name for e in await store.browse.list_entities(group)] == ["A", "B"]
    assert await store.browse.counts(group) == {
        "episodes": 1,
        "entities": 2,
        "facts": 1,
        "mentions": 2,
    }
    lookup = await store.lookup_entities(group, ["crm:a"], ["b"], "nope", ["PLAN"])
    assert not lookup.processed
    assert [e.name for e in lookup.by_key] == ["A"] and [e.name for e in lookup.by_name] == ["B"]
    assert lookup.by_key[0].name_embedding is None and lookup.facts is not None
    assert [x.uuid for x in lookup.facts] == [f.uuid] and lookup.facts[0].valid_at == day(1)
    assert (await store.lookup_entities(group, [], [], ep.uuid)).processed
    assert await store.fact_candidates(group, [(a.uuid, "PLAN")], []) == [
        x for x in await store.facts_touching(group, [a.uuid]) if x.uuid == f.uuid
    ]
    # a write that fails its checks writes nothing, not even its entities
    ghost = fact(other, entity(other, "X"), entity(other, "Y"), "R", "x r y")
    bad = EpisodeWrite(episode(other, "m-1", day(1)), facts=[ghost], entities=[entity(other, "X")])
    with pytest.raises(StoreIntegrityError):
        await store.write_episode(other, bad)
    assert await store.browse.counts(other) == {
        "episodes": 0,
        "entities": 0,
        "facts": 0,
        "mentions": 0,
    }


async def test_a_moved_end_is_answered_as_believed_at_each_time(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    """A fact closed at day 20 (learned at day 21), whose end a late fact moved to day 10
    (learned at day 22): "valid at day 15" is answered as it was believed at each time, by
    closures and by full-state upserts alike, and the history survives a rewrite."""
    group = new_group()
    a, b = entity(group, "A"), entity(group, "B")
    await upsert_entities(store, group, [a, b])
    f = fact(group, a, b, "PLAN", "A is on plan B", valid_at=day(0), created_at=day(1))

    async def write(**change: Any) -> FactRecord:
        ep = episode(group, f"m-{uuidlib.uuid4().hex[:6]}", day(1))
        await store.write_episode(group, EpisodeWrite(episode=ep, **change))
        return {x.uuid: x for x in await store.facts_touching(group, [a.uuid])}[f.uuid]

    async def believed(valid: int, known: float) -> list[str]:
        views = await store.browse.query_facts(group, valid_at=day(valid), known_at=day(known))
        return [v.fact for v in views]

    async def ends(known: float) -> list[tuple[str | None, str | None]]:
        views = await store.browse.query_facts(group, known_at=day(known), include_invalid=True)
        return [(v.invalid_at, v.expired_at) for v in views]

    await write(facts=[f])
    await write(closures=[FactClosure(f.uuid, invalid_at=day(20), expired_at=day(21))])
    closed = f.model_copy(update={"invalid_at": day(20), "expired_at": day(21)})
    closed.move_end(day(10), day(22))
    stored = await write(closures=[FactClosure.of(closed)])
    assert (stored.invalid_at, stored.expired_at) == (day(10), day(21))
    assert (stored.prior_ends, stored.prior_ends_learned_at) == ([day(20)], [day(21)])
    assert stored.end_learned_at == day(22)

    plan_b = ["A is on plan B"]
    beliefs = [await believed(15, k) for k in (1, 21, 21.5, 22, 30)]
    assert beliefs == [plan_b, plan_b, plan_b, [], []]  # fmt: skip
    assert [await believed(25, k) for k in (1, 21, 22)] == [plan_b, [], []]
    assert await believed(5, 30) == plan_b
    iso20, iso10, iso21 = (iso(day(n)) for n in (20, 10, 21))
    known_ends = [await ends(k) for k in (1, 21, 22)]
    assert known_ends == [[(None, None)], [(iso20, iso21)], [(iso10, iso21)]]

    # A full-state upsert of the closed fact (it gained an episode) keeps the history; one
    # that carries none leaves the stored history as it is.
    stored = await write(facts=[closed.model_copy(update={"fact": "A is on plan B (again)"})])
    assert (stored.prior_ends, stored.end_learned_at) == ([day(20)], day(22))
    plain = closed.model_copy(
        update={"prior_ends": [], "prior_ends_learned_at": [], "end_learned_at": None}
    )
    stored = await write(facts=[plain])
    assert (stored.prior_ends, stored.end_learned_at) == ([day(20)], day(22))
    assert await believed(15, 21.5) == plan_b  # the text as last written, the end as then


async def test_a_moved_start_is_answered_as_believed_at_each_time(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    """A fact stored from day 20 (learned at day 21), whose start a late restatement moved to
    day 10 (learned at day 22): "valid at day 15" is answered as it was believed at each
    time; a closure and a full-state upsert that carries no start history keep it."""
    group = new_group()
    a, b = entity(group, "A"), entity(group, "B")
    await upsert_entities(store, group, [a, b])
    f = fact(group, a, b, "ADVISES", "A advises B", valid_at=day(20), created_at=day(21))

    async def write(**change: Any) -> FactRecord:
        ep = episode(group, f"m-{uuidlib.uuid4().hex[:6]}", day(1))
        await store.write_episode(group, EpisodeWrite(episode=ep, **change))
        return {x.uuid: x for x in await store.facts_touching(group, [a.uuid])}[f.uuid]

    async def believed(valid: int, known: float) -> list[str]:
        views = await store.browse.query_facts(group, valid_at=day(valid), known_at=day(known))
        return [v.fact for v in views]

    async def starts(known: float) -> list[str | None]:
        views = await store.browse.query_facts(group, known_at=day(known), include_invalid=True)
        return [v.valid_at for v in views]

    assert (await write(facts=[f])).prior_starts == []
    moved = f.model_copy(update={"fact": "A has advised B since day 10"})
    moved.move_start(day(10), day(22))
    stored = await write(facts=[moved])
    assert (stored.valid_at, stored.fact, stored.created_at) == (day(10), moved.fact, day(21))
    assert (stored.prior_starts, stored.prior_starts_learned_at) == ([day(20)], [day(21)])
    assert stored.start_learned_at == day(22)

    text = [moved.fact]
    assert [await believed(15, k) for k in (20, 21, 21.5, 22, 30)] == [[], [], [], text, text]
    assert [await believed(25, k) for k in (21, 22)] == [text, text]
    assert [await starts(k) for k in (20, 21, 22)] == [[], [iso(day(20))], [iso(day(10))]]

    stored = await write(closures=[FactClosure(f.uuid, invalid_at=day(30), expired_at=day(31))])
    assert (stored.invalid_at, stored.prior_starts, stored.start_learned_at) == (
        day(30),
        [day(20)],
        day(22),
    )
    plain = moved.model_copy(
        update={"prior_starts": [], "prior_starts_learned_at": [], "start_learned_at": None}
    )
    stored = await write(facts=[plain])
    assert (stored.prior_starts, stored.prior_starts_learned_at) == ([day(20)], [day(21)])
    assert await believed(15, 21.5) == [] and await believed(15, 22) == text


async def test_expired_at_is_set_only_once(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group = new_group()
    a, b = entity(group, "A"), entity(group, "B")
    await upsert_entities(store, group, [a, b])
    f = fact(group, a, b, "PLAN", "A is on plan B", valid_at=day(1), created_at=day(1))

    async def write(
        *, facts: list[FactRecord] | None = None, closures: list[FactClosure] | None = None
    ) -> FactRecord:
        ep = episode(group, f"m-{uuidlib.uuid4().hex[:6]}", day(1))
        await store.write_episode(
            group, EpisodeWrite(episode=ep, facts=facts or [], closures=closures or [])
        )
        return {x.uuid: x for x in await store.facts_touching(group, [a.uuid])}[f.uuid]

    stored = await write(facts=[f])
    assert (stored.invalid_at, stored.expired_at, stored.created_at) == (None, None, day(1))
    stored = await write(closures=[FactClosure(f.uuid, invalid_at=day(3), expired_at=day(4))])
    assert (stored.invalid_at, stored.expired_at) == (day(3), day(4))
    stored = await write(closures=[FactClosure(f.uuid, invalid_at=day(2), expired_at=day(9))])
    assert (stored.invalid_at, stored.expired_at) == (day(2), day(4))
    # a full-state upsert sets the given state, but never expired_at again nor created_at
    restated = f.model_copy(
        update={
            "fact": "A is on plan B (restated)",
            "invalid_at": day(7),
            "expired_at": day(8),
            "created_at": day(30),
        }
    )
    stored = await write(facts=[restated])
    assert stored.fact == "A is on plan B (restated)"
    assert (stored.invalid_at, stored.expired_at, stored.created_at) == (day(7), day(4), day(1))
    born_closed = fact(
        group, b, a, "PLAN", "born closed", valid_at=day(1), invalid_at=day(2), expired_at=day(3)
    )
    await write(facts=[born_closed])
    [stored_closed] = [x for x in await store.facts_touching(group, [b.uuid]) if x.uuid != f.uuid]
    assert (stored_closed.invalid_at, stored_closed.expired_at) == (day(2), day(3))


# ----------------------------------------------------------------------------- as-of
async def _timeline(store: GraphStore, group: str) -> dict[str, FactRecord]:
    """Acme's plan changes, a fact learned late, a job that ended, an unrelated fact."""
    acme, globex, bob = entity(group, "Acme"), entity(group, "Globex"), entity(group, "Bob")
    basic, pro = entity(group, "Basic plan"), entity(group, "Pro plan")
    berlin, widgets = entity(group, "Berlin"), entity(group, "Widgets")
    await upsert_entities(store, group, [acme, globex, bob, basic, pro, berlin, widgets])
    e1, e2 = episode(group, "crm:1", day(1)), episode(group, "crm:2", day(60))
    facts = {
        "basic": fact(
            group,
            acme,
            basic,
            "ON_PLAN",
            "Acme is on the Basic plan",
            valid_at=day(0),
            created_at=day(1),
            invalid_at=day(60),
            expired_at=day(64),
            episodes=[e1.uuid, e2.uuid],
        ),
        "pro": fact(
            group,
            acme,
            pro,
            "ON_PLAN",
            "Acme is on the Pro plan",
            valid_at=day(60),
            created_at=day(64),
            episodes=[e2.uuid],
        ),
        "late": fact(
            group,
            acme,
            berlin,
            "LOCATED_IN",
            "Acme was located in Berlin",
            valid_at=day(-200),
            invalid_at=day(-30),
            created_at=day(31),
            expired_at=day(31),
            episodes=[e1.uuid],
        ),
        "job": fact(
            group,
            bob,
            acme,
            "WORKS_AT",
            "Bob works at Acme",
            valid_at=day(31),
            created_at=day(40),
            invalid_at=day(91),
            expired_at=day(92),
        ),
        "globex": fact(
            group,
            globex,
            widgets,
            "MAKES",
            "Globex makes widgets",
            valid_at=day(14),
            created_at=day(14),
            episodes=["not-an-episode-uuid"],
        ),
    }
    await store.write_episode(group, EpisodeWrite(episode=e1))
    await store.write_episode(group, EpisodeWrite(episode=e2, facts=list(facts.values())))
    return facts


async def test_query_facts_as_of(store: GraphStore, new_group: Callable[..., str]) -> None:
    group, other = new_group(), new_group()
    facts = await _timeline(store, group)
    await _timeline(store, other)

    async def ask(**kwargs: Any) -> list[str]:
        return [v.fact for v in await store.browse.query_facts(group, **kwargs)]

    # now: everything is known; the plan is Pro, Bob has left
    assert await ask() == ["Acme is on the Pro plan", "Globex makes widgets"]
    # valid mid-February, as known now
    assert await ask(valid_at=day(45)) == [
        "Acme is on the Basic plan",
        "Bob works at Acme",
        "Globex makes widgets",
    ]
    # valid on 10 March as believed on 2 March: the plan change was not yet known, nor was
    # Bob's leaving; the Berlin fact was already known closed
    assert await ask(valid_at=day(69), known_at=day(61)) == [
        "Acme is on the Basic plan",
        "Bob works at Acme",
        "Globex makes widgets",
    ]
    assert await ask(valid_at=day(-100)) == ["Acme was located in Berlin"]
    # before it was learned, the Berlin fact was not believed at all
    assert await ask(valid_at=day(-100), known_at=day(30)) == []
    assert await ask(known_at=day(-1)) == []
    assert await ask(valid_at=day(0), known_at=day(1)) == ["Acme is on the Basic plan"]
    # boundaries: valid_at is inclusive, invalid_at exclusive
    assert await ask(valid_at=day(60)) == [
        "Acme is on the Pro plan",
        "Bob works at Acme",
        "Globex makes widgets",
    ]
    assert await ask(valid_at=day(60) - timedelta(microseconds=1)) == [
        "Acme is on the Basic plan",
        "Bob works at Acme",
        "Globex makes widgets",
    ]
    # whole history, ordered by subject, relation, valid_at
    history = await store.browse.query_facts(group, include_invalid=True)
    assert [v.uuid for v in history] == [
        facts[k].uuid for k in ("late", "basic", "pro", "job", "globex")
    ]
    assert await ask(include_invalid=True, known_at=day(20)) == [
        "Acme is on the Basic plan",
        "Globex makes widgets",
    ]
    bob = stable_uuid("entity", group, "Bob")
    assert await ask(entity_uuid=bob) == []
    assert await ask(entity_uuid=bob, include_invalid=True) == ["Bob works at Acme"]
    assert await ask(entity_uuid=bob, valid_at=day(50)) == ["Bob works at Acme"]
    acme = stable_uuid("entity", group, "Acme")
    assert len(await ask(entity_uuid=acme, include_invalid=True)) == 4
    assert await ask(entity_uuid=stable_uuid("entity", other, "Bob"), include_invalid=True) == []


async def test_query_facts_views(store: GraphStore, new_group: Callable[..., str]) -> None:
    group = new_group()
    facts = await _timeline(store, group)
    basic = facts["basic"]
    [now_view] = [
        v for v in await store.browse.query_facts(group, valid_at=day(45)) if v.uuid == basic.uuid
    ]
    assert now_view == FactView(
        uuid=basic.uuid,
        subject="Acme",
        relation="ON_PLAN",
        object="Basic plan",
        fact="Acme is on the Basic plan",
        valid_at="2024-01-01T00:00:00Z",
        invalid_at="2024-03-01T00:00:00Z",
        created_at="2024-01-02T00:00:00Z",
        expired_at="2024-03-05T00:00:00Z",
        episodes=["crm:1", "crm:2"],
    )
    # as believed before the closure was learned, the fact has no known end yet
    [then_view] = [
        v
        for v in await store.browse.query_facts(group, valid_at=day(45), known_at=day(61))
        if v.uuid == basic.uuid
    ]
    assert (then_view.invalid_at, then_view.expired_at) == (None, None)
    [globex] = [v for v in await store.browse.query_facts(group) if v.relation == "MAKES"]
    assert globex.episodes == ["not-an-episode-uuid"]  # unknown episode: its uuid is shown


# ----------------------------------------------------------------------------- hostile input
async def test_hostile_strings_are_stored_verbatim(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    canary = new_group("canary")
    await upsert_entities(store, canary, [entity(canary, "Canary", summary="sings")])
    canary_before = await snapshot(store, canary)

    for i, text in enumerate(HOSTILE):
        group = new_group(text)
        a = entity(
            group,
            text,
            summary=text,
            key=text,
            aliases=[text],
            labels=[text, "Safe"],
            embedding=vec(1, i),
        )
        b = entity(group, f"{text} (other)", summary=text)
        await upsert_entities(store, group, [a, b])
        ep = EpisodeRecord(
            uuid=stable_uuid("episode", group, text),
            group_id=group,
            name=text,
            source="text",
            source_description=text,
            content=text,
            valid_at=day(1),
            producer_id=text,
        )
        f = fact(group, a, b, text, text, valid_at=day(1), episodes=[ep.uuid], embedding=vec(1))
        await store.write_episode(group, EpisodeWrite(episode=ep, mentions=[a.uuid], facts=[f]))

        [stored_a] = await store.entities_by_uuids(group, [a.uuid])
        assert (stored_a.name, stored_a.summary, stored_a.key, stored_a.aliases) == (
            text,
            text,
            text,
            [text],
        )
        assert stored_a.labels == ["Safe"]
        assert [e.uuid for e in await store.entities_by_keys(group, [text])] == [a.uuid]
        assert [e.uuid for e in await store.entities_by_names(group, [text])] == [a.uuid]
        [stored_ep] = await store.recent_episodes(group, FAR_FUTURE, 5)
        assert (stored_ep.name, stored_ep.content, stored_ep.producer_id) == (text, text, text)
        assert await store.episode_processed(group, ep.uuid)
        [view] = await store.browse.query_facts(group)
        assert (view.subject, view.relation, view.fact, view.episodes) == (
            text,
            text,
            text,
            [text],
        )
        assert uuids(await store.vector_entities(group, vec(1, i), 1)) == [a.uuid]
        await store.fulltext_entities(group, text, 5)
        assert await store.browse.counts(group) == {
            "episodes": 1,
            "entities": 2,
            "facts": 1,
            "mentions": 1,
        }
    assert await snapshot(store, canary) == canary_before


# ----------------------------------------------------------------------------- concurrency
async def test_concurrent_calls(store: GraphStore, new_group: Callable[..., str]) -> None:
    groups = [new_group() for _ in range(4)]

    async def work(group: str) -> dict[str, int]:
        people = [entity(group, f"Person {i}", embedding=vec(1, i)) for i in range(10)]
        await upsert_entities(store, group, people)
        writes = [
            EpisodeWrite(
                episode=episode(group, f"m-{i}", day(i)),
                mentions=[people[i].uuid],
                facts=[fact(group, people[i], people[i + 1], "KNOWS", f"{i} knows {i + 1}")],
            )
            for i in range(5)
        ]
        await asyncio.gather(*(store.write_episode(group, w) for w in writes))
        await asyncio.gather(
            store.vector_entities(group, vec(1), 3),
            store.fulltext_entities(group, "person", 3),
            store.browse.query_facts(group),
        )
        return await store.browse.counts(group)

    results = await asyncio.gather(*(work(g) for g in groups))
    assert results == [{"episodes": 5, "entities": 10, "facts": 5, "mentions": 5}] * 4


async def test_writes_committed_together_act_as_one_at_a_time(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    """Writes submitted at once share a transaction on Neo4j (group commit); each must still
    see the ones before it: a fact on an entity the previous write created, a closure of a
    fact the previous write made, a repeat of an episode already written in the batch. A
    refused write fails alone."""
    group, other = new_group(), new_group()
    ann = entity(group, "Ann", embedding=vec(1))
    acme = entity(group, "Acme", embedding=vec(0, 1))
    stranger = entity(other, "Stranger", embedding=vec(0, 0, 1))
    await upsert_entities(store, other, [stranger])
    works = fact(group, ann, acme, "WORKS_AT", "Ann works at Acme", valid_at=day(1))
    first = EpisodeWrite(
        episode=episode(group, "b-1", day(1)),
        entities=[ann, acme],
        mentions=[ann.uuid, acme.uuid],
        facts=[works],
    )
    closing = EpisodeWrite(
        episode=episode(group, "b-2", day(2)),
        mentions=[ann.uuid],
        closures=[FactClosure(uuid=works.uuid, invalid_at=day(2), expired_at=day(3))],
    )
    together = await asyncio.gather(
        store.write_episode(group, first),
        store.write_episode(group, closing),
        store.write_episode(group, first),
    )
    assert together == [True, True, False]
    [view] = await store.browse.query_facts(group, include_invalid=True)
    assert (view.uuid, view.invalid_at) == (works.uuid, iso(day(2)))

    crossing = EpisodeWrite(episode=episode(group, "b-3", day(3)), mentions=[stranger.uuid])
    fine = EpisodeWrite(episode=episode(group, "b-4", day(4)), mentions=[acme.uuid])
    outcomes = await asyncio.gather(
        store.write_episode(group, crossing),
        store.write_episode(group, fine),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], StoreIntegrityError)
    assert outcomes[1] is True
    assert await store.browse.counts(group) == {
        "episodes": 3,
        "entities": 2,
        "facts": 1,
        "mentions": 4,
    }


# ----------------------------------------------------------------------------- maintenance
async def test_delete_group_removes_only_that_group(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    doomed, kept = new_group(), new_group()
    for g in (doomed, kept):
        await _timeline(store, g)
        await _search_corpus(store, g)
    kept_before = await snapshot(store, kept)
    # "Globex" is in both corpora: one entity
    assert kept_before["counts"] == {"episodes": 2, "entities": 11, "facts": 5, "mentions": 0}

    await store.forget.delete_group(doomed)
    assert await store.browse.counts(doomed) == {
        "episodes": 0,
        "entities": 0,
        "facts": 0,
        "mentions": 0,
    }
    assert await store.browse.list_entities(doomed) == []
    assert await store.fulltext_entities(doomed, "printer", 10) == []
    assert await store.vector_entities(doomed, vec(1), 10) == []
    assert await vector_facts(store, doomed, vec(1), 10) == []
    assert await store.browse.query_facts(doomed, include_invalid=True) == []
    assert await store.recent_episodes(doomed, FAR_FUTURE, 10) == []
    assert await snapshot(store, kept) == kept_before
    found = uuids(await store.fulltext_entities(kept, "printer", 10))
    expected = [stable_uuid("entity", kept, name) for name in ("Acme Printers", "Initech")]
    assert found == expected if ranks_fulltext(store) else sorted(found) == sorted(expected)
    # Globex was created by the timeline without an embedding, which never changes afterwards
    assert len(await store.vector_entities(kept, vec(1), 10)) == 3
    await store.forget.delete_group(doomed)  # deleting nothing is fine


async def test_counts(store: GraphStore, new_group: Callable[..., str]) -> None:
    group = new_group()
    assert await store.browse.counts(group) == {
        "episodes": 0,
        "entities": 0,
        "facts": 0,
        "mentions": 0,
    }
    a, b, c = (entity(group, n) for n in "ABC")
    await upsert_entities(store, group, [a, b, c])
    await store.write_episode(
        group,
        EpisodeWrite(
            episode=episode(group, "m-1", day(1)),
            mentions=[a.uuid, b.uuid, c.uuid],
            facts=[fact(group, a, b, "R", "a r b"), fact(group, b, c, "R", "b r c")],
        ),
    )
    await store.write_episode(
        group, EpisodeWrite(episode=episode(group, "m-2", day(2)), mentions=[a.uuid])
    )
    assert await store.browse.counts(group) == {
        "episodes": 2,
        "entities": 3,
        "facts": 2,
        "mentions": 4,
    }


async def test_the_embedded_store_finds_the_same_words_with_or_without_the_group_token(
    tmp_path: Path,
) -> None:
    """A group holding most of a kind's rows is searched without its token in the FTS5
    query (reading its whole posting list was most of a query's cost); a small group beside
    a big one with it. Either way a search finds exactly the group's own matches, in the
    same order, and a write that changes the shares is seen by the next search."""
    from tidegraph.stores.sqlite import group_cache
    from tidegraph.stores.sqlite import search as sqlite_search

    store = SqliteStore(tmp_path / "graph")
    try:
        await store.setup(DIM)
        big = [entity("big", f"Acme {n} widget", summary="widget maker") for n in range(6)]
        await upsert_entities(store, "big", big)
        small = [entity("small", "Acme widget shop", summary="widget seller")]
        await upsert_entities(store, "small", small)
        scope = {
            g: SearchScope((g,), AsOf.resolve(None, None, False, None)) for g in ("big", "small")
        }

        def shares(conn: sqlite3.Connection) -> tuple[bool, bool]:
            held = group_cache.group_shares(conn)
            return held.holds_most(conn, "big", "entity"), held.holds_most(conn, "small", "entity")

        assert await store.db.read(shares) == (True, False)
        found = {
            g: await store.search.fulltext_search(scope[g], "entity", "acme widget", 10)
            for g in scope
        }
        assert {h.uuid for h in found["big"]} == {e.uuid for e in big}
        assert [h.uuid for h in found["small"]] == [small[0].uuid]

        def forced(conn: sqlite3.Connection, group: str, by_group: bool) -> list[str]:
            query = sqlite_search.fulltext_query(group, "acme widget", by_group)
            assert query is not None
            return [u for u, _ in sqlite_search.fulltext_scored(conn, group, "entity", query, 10)]

        for group in scope:  # the token changes the cost, never the answer
            with_token = await store.db.read(forced, group, True)
            assert with_token == await store.db.read(forced, group, False)
            assert with_token == [h.uuid for h in found[group]]

        more = [entity("small", f"Acme {n} widget depot") for n in range(10)]
        await upsert_entities(store, "small", more)  # now the small group holds most
        assert await store.db.read(shares) == (False, True)
        again = await store.search.fulltext_search(scope["small"], "entity", "acme widget", 20)
        assert {h.uuid for h in again} == {e.uuid for e in [*small, *more]}
    finally:
        await store.close()


async def test_the_embedded_stores_searches_read_beside_each_other_and_never_write(
    tmp_path: Path,
) -> None:
    """Searches run on read-only connections of their own threads: two run at once (each
    waits here for the other to have started), and neither can change the file."""
    import threading

    store = SqliteStore(tmp_path / "graph")
    try:
        await store.setup(DIM)
        both = threading.Barrier(sqlite_db.READERS, timeout=30)

        def meet(conn: sqlite3.Connection) -> int:
            both.wait()  # raises BrokenBarrierError if the reads ran one after the other
            return int(conn.execute("SELECT count(*) FROM entity").fetchone()[0])

        assert (
            await asyncio.gather(*(store.db.read(meet) for _ in range(sqlite_db.READERS)))
            == [0] * sqlite_db.READERS
        )

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM entity")

        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await store.db.read(write)
    finally:
        await store.close()


async def test_the_embedded_stores_vector_search_sees_every_write(tmp_path: Path) -> None:
    """The embedded store keeps a group's vectors as one matrix between searches: a write
    through the same store, or through another one on the same file (another process), is
    seen by the very next search."""
    one, two = SqliteStore(tmp_path / "graph"), SqliteStore(tmp_path / "graph")
    try:
        await one.setup(DIM)
        await two.setup(DIM)
        a, b, c = (entity("g", n, embedding=vec(1, i)) for i, n in enumerate("ABC"))
        await upsert_entities(one, "g", [a])
        assert uuids(await one.vector_entities("g", vec(0, 1), 5)) == [a.uuid]
        await upsert_entities(one, "g", [b])
        assert uuids(await one.vector_entities("g", vec(0, 1), 5)) == [b.uuid, a.uuid]
        await upsert_entities(two, "g", [c])
        assert uuids(await one.vector_entities("g", vec(0, 1), 5)) == [c.uuid, b.uuid, a.uuid]
        scope = SearchScope(("g",), AsOf.resolve(None, None, False, None))
        assert [h.uuid for h in await one.search.vector_search(scope, "entity", vec(0, 1), 1)] == [
            c.uuid
        ]
    finally:
        await one.close()
        await two.close()


async def test_the_embedded_store_runs_only_constant_sql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every statement the embedded store runs is its own constant text: names, labels,
    aliases, summaries, relation types, fact and episode text, search text and group ids
    (each here hostile and marked) travel only as parameters, through every kind of call."""
    statements: list[str] = []

    class Recording(sqlite_db.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            statements.append(sql)
            return super().execute(sql, *args)

        def executemany(self, sql: str, *args: Any) -> sqlite3.Cursor:
            statements.append(sql)
            return super().executemany(sql, *args)

    connect = sqlite3.connect
    monkeypatch.setattr(
        sqlite_db.sqlite3, "connect", lambda *a, **kw: connect(*a, **{**kw, "factory": Recording})
    )
    mark = "zqxmark"
    texts = [f"{h} {mark}" for h in HOSTILE]
    group = f'g") OR 1=1 -- {mark}'
    store = SqliteStore(tmp_path / "graph")
    try:
        await store.setup(DIM)
        people = [
            entity(group, t, summary=t, labels=["Person"], key=t, aliases=[t], embedding=vec(1, i))
            for i, t in enumerate(texts)
        ]
        await upsert_entities(store, group, people)
        facts = [
            fact(group, people[0], p, t, t, valid_at=day(1), embedding=vec(1))
            for p, t in zip(people[1:], texts, strict=False)
        ]
        ep = episode(group, texts[0], day(1), content=" ".join(texts))
        await store.write_episode(
            group, EpisodeWrite(episode=ep, facts=facts, mentions=[p.uuid for p in people])
        )
        closed = facts[0].model_copy(update={"invalid_at": day(2), "expired_at": day(2)})
        later = episode(group, texts[1], day(2), content=texts[1])
        await store.write_episode(
            group, EpisodeWrite(episode=later, closures=[FactClosure.of(closed)])
        )
        community = CommunityRecord(stable_uuid("c", group), texts[2], texts[3], [people[1].uuid])
        await store.communities.write_communities(group, [community], [])
        await store.lookup_entities(group, texts, texts, ep.uuid, texts, "hash")
        await store.read_batch(group, texts, texts, texts, [(ep.uuid, None)])
        await store.browse.query_facts(group, include_invalid=True)
        await store.entity_candidates(group, [(t, vec(1)) for t in texts], 3)
        scope = SearchScope((group,), AsOf.resolve(day(5), None, False, None))
        for kind in KINDS:
            for t in texts:
                await store.search.fulltext_search(scope, kind, t, 5)
            await store.search.vector_search(scope, kind, vec(1), 5)
        await store.search.expand_facts(scope, [people[0].uuid], 2, 10)
        await store.communities.entity_graph(group)
        await store.forget.delete_group(group)
    finally:
        await store.close()
    assert statements
    assert [s for s in statements if mark in s] == []


async def test_questions_about_one_entity_start_from_its_node(neo4j_driver: Any) -> None:
    """Neo4j plans every as-of question about one entity (an agent's "what about Acme?",
    the community processor's neighbour weights) as a uuid lookup and an expansion from that
    node, never as a scan of the group's facts (which grows with the group)."""
    asof = AsOf.resolve(None, None, False, "some-entity")
    questions = {
        "query_facts": as_of_query(
            asof, neo4j_queries.FACT_VIEW_RETURN, neo4j_queries.ANCHOR_HINTS
        ),
        "neighbour_weights": as_of_query(asof, ENTITY_GRAPH_RETURN, neo4j_queries.ANCHOR_HINTS),
    }
    for name, text in questions.items():
        async with neo4j_driver.session() as session:
            result = await session.run("EXPLAIN " + text, as_of_params("g", asof))
            plan = (await result.consume()).plan

        assert plan_leaves(plan) == ["NodeUniqueIndexSeek", "NodeUniqueIndexSeek"], name


# ----------------------------------------------------------------------------- both at once
async def _scenario(store: GraphStore, group: str) -> dict[str, Any]:
    await _timeline(store, group)
    await _search_corpus(store, group)
    acme = entity(group, "Acme Printers", summary="Now also sells printer paper.", aliases=["ap"])
    await upsert_entities(store, group, [acme])

    def ranked(hits: list[tuple[Any, float]]) -> list[tuple[str, float]]:
        return [(record.uuid, round(score, 1)) for record, score in hits]

    views = {}
    for valid_at in (None, day(-100), day(45), day(69)):
        for known_at in (None, day(1), day(61)):
            for include_invalid in (False, True):
                key = f"{valid_at}|{known_at}|{include_invalid}"
                views[key] = await store.browse.query_facts(
                    group, valid_at=valid_at, known_at=known_at, include_invalid=include_invalid
                )
    return {
        "snapshot": await snapshot(store, group),
        "views": views,
        # the engines' BM25 scores differ in detail: the same matches, not the same order
        "fulltext": [
            sorted(e.uuid for e, _ in await store.fulltext_entities(group, text, 10))
            for text in ("printers", "acme", "widgets software", "pharmaceuticals", "Ltd.")
        ],
        "vector": ranked(await store.vector_entities(group, vec(1, 0.5), 10)),
        "names": await store.entities_by_names(group, ["ap", "globex", "acme"]),
    }


async def test_stores_agree(neo4j_uri: str, tmp_path: Path) -> None:
    group = f"agree-{uuidlib.uuid4().hex[:12]}"
    neo4j, embedded = Neo4jStore(neo4j_uri), SqliteStore(tmp_path / "graph")
    try:
        answers = []
        for store in (neo4j, embedded, MemoryStore()):
            await store.setup(DIM)
            answers.append(await _scenario(store, group))
        assert answers[0] == answers[1]
        # the in-memory store's fulltext search neither stems nor weighs (``ranks_fulltext``):
        # every other answer is the same
        assert {k: v for k, v in answers[2].items() if k != "fulltext"} == {
            k: v for k, v in answers[0].items() if k != "fulltext"
        }
    finally:
        await _drop_neo4j_groups(neo4j_uri, [group])
        await neo4j.close()
        await embedded.close()


# ----------------------------------------------------------------------------- communities
async def _community_corpus(store: GraphStore, group: str) -> dict[str, EntityRecord]:
    people = {n: entity(group, n) for n in ("A", "B", "C", "D", "E")}
    await upsert_entities(store, group, list(people.values()))
    a, b, c, d, e = people.values()
    facts = [
        fact(group, a, b, "KNOWS", "A knows B", valid_at=day(1)),
        fact(group, b, a, "LIKES", "B likes A", valid_at=day(1)),
        fact(group, b, c, "KNOWS", "B knows C", valid_at=day(1)),
        fact(group, c, c, "KNOWS", "C knows C", valid_at=day(1)),  # self-loop: no edge
        fact(
            group, c, d, "KNOWS", "C knew D", valid_at=day(1), invalid_at=day(3), expired_at=day(0)
        ),
        fact(group, d, e, "KNOWS", "D will know E", valid_at=day(5)),
    ]
    await store.write_episode(group, EpisodeWrite(episode(group, "e1", day(1)), facts=facts))
    return people


async def test_entity_graph_counts_valid_facts(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group = new_group()
    p = await _community_corpus(store, group)
    other = new_group()
    await _community_corpus(store, other)
    nodes, edges = await store.communities.entity_graph(group, at=day(2))
    assert nodes == sorted(e.uuid for e in p.values())

    def pair(x: str, y: str, w: int) -> WeightedEdge:
        a, b = sorted((p[x].uuid, p[y].uuid))
        return WeightedEdge(a, b, w)

    assert edges == sorted(
        [pair("A", "B", 2), pair("B", "C", 1), pair("C", "D", 1)],
        key=lambda e: (e.source, e.target),
    )
    _, later = await store.communities.entity_graph(group, at=day(6))
    assert {(e.source, e.target) for e in later} == {
        (x.source, x.target) for x in (pair("A", "B", 2), pair("B", "C", 1), pair("D", "E", 1))
    }
    assert await neighbour_weights(store, group, p["B"].uuid, at=day(2)) == dict(
        sorted({p["A"].uuid: 2, p["C"].uuid: 1}.items())
    )
    assert await neighbour_weights(store, group, p["E"].uuid, at=day(2)) == {}
    # several entities in one read: each as asked alone, in order, repeats included
    asked = [p[n].uuid for n in ("B", "E", "A", "B", "D")] + ["not-an-entity"]
    for at in (day(2), day(6)):
        alone = [await neighbour_weights(store, group, uuid, at=at) for uuid in asked]
        assert await store.communities.neighbour_weights_many(group, asked, at=at) == alone
    assert await store.communities.neighbour_weights_many(new_group(), asked, at=day(2)) == [
        {}
    ] * len(asked)


async def test_write_communities_is_idempotent_and_scoped(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group = new_group()
    p = await _community_corpus(store, group)
    u = {n: e.uuid for n, e in p.items()}
    one = CommunityRecord("c1-" + group, "One", "first", [u["A"], u["B"]], vec(1))
    two = CommunityRecord("c2-" + group, "Two", "second", [u["C"], u["D"]])
    for _ in range(2):
        await store.communities.write_communities(group, [one, two], [])
    got = await store.communities.list_communities(group)
    assert [(c.uuid, c.name, c.summary, c.members) for c in got] == [
        (one.uuid, "One", "first", sorted(one.members)),
        (two.uuid, "Two", "second", sorted(two.members)),
    ]
    by_entity = {e.uuid: e.community_uuid for e in await store.browse.list_entities(group)}
    assert by_entity[u["A"]] == one.uuid and by_entity[u["E"]] is None
    # rewriting `two` with B moves B out of `one`; `one` keeps its name and summary
    moved = CommunityRecord(two.uuid, "Two'", "second'", [u["B"], u["C"]])
    three = CommunityRecord("c3-" + group, "Three", "", [u["D"], u["E"]])
    await store.communities.write_communities(group, [moved, three], [])
    got = await store.communities.list_communities(group)
    assert [(c.uuid, c.name, c.members) for c in got] == sorted(
        [
            (one.uuid, "One", [u["A"]]),
            (two.uuid, "Two'", sorted([u["B"], u["C"]])),
            (three.uuid, "Three", sorted([u["D"], u["E"]])),
        ]
    )
    await store.communities.write_communities(group, [], [one.uuid, three.uuid])
    assert [c.uuid for c in await store.communities.list_communities(group)] == [two.uuid]
    with pytest.raises(StoreIntegrityError):
        await store.communities.write_communities(new_group(), [moved], [])
    assert [c.name for c in await store.communities.list_communities(group)] == ["Two'"]


async def _two_communities(
    store: GraphStore, group: str
) -> tuple[dict[str, str], CommunityRecord, CommunityRecord]:
    """The community corpus's uuids by name, and two stored communities: A's and B's."""
    p = await _community_corpus(store, group)
    u = {n: e.uuid for n, e in p.items()}
    one = CommunityRecord("c1-" + group, "One", "", [u["A"]])
    two = CommunityRecord("c2-" + group, "Two", "", [u["B"]])
    await store.communities.write_communities(group, [one, two], [])
    return u, one, two


async def test_assign_member_moves_and_is_idempotent(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group = new_group()
    u, one, two = await _two_communities(store, group)
    for _ in range(2):
        await assign_member(store, group, one.uuid, u["E"])
    await assign_member(store, group, two.uuid, u["A"])
    await assign_member(store, group, "missing", u["B"])  # no such community: nothing changes
    await assign_member(store, new_group(), one.uuid, u["C"])  # another group: nothing changes
    got = {c.uuid: c.members for c in await store.communities.list_communities(group)}
    assert got == {one.uuid: [u["E"]], two.uuid: sorted([u["A"], u["B"]])}


async def test_assign_members_applies_each_in_order_in_one_call(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    group = new_group()
    u, one, two = await _two_communities(store, group)
    await store.communities.assign_members(
        group,
        [
            (one.uuid, u["E"]),
            (two.uuid, u["E"]),  # the later assignment of an entity wins
            ("missing", u["C"]),  # no such community: skipped, the others still written
            (one.uuid, u["B"]),
        ],
    )
    got = {c.uuid: c.members for c in await store.communities.list_communities(group)}
    assert got == {one.uuid: sorted([u["A"], u["B"]]), two.uuid: [u["E"]]}
    await store.communities.assign_members(group, [])  # nothing to do: nothing changes
    assert {c.uuid: c.members for c in await store.communities.list_communities(group)} == got


async def test_assignments_of_several_groups_at_once_stay_in_their_groups(
    store: GraphStore, new_group: Callable[..., str]
) -> None:
    """Calls made at once (on Neo4j they share a transaction) give each group what its calls
    alone give, in the order a group made them; another group's community or entity changes
    nothing."""
    first, second = new_group(), new_group()
    (u1, one1, two1), (u2, one2, two2) = [await _two_communities(store, g) for g in (first, second)]
    await asyncio.gather(
        store.communities.assign_members(first, [(one1.uuid, u1["E"]), (two1.uuid, u1["C"])]),
        store.communities.assign_members(second, [(two2.uuid, u2["E"]), (one1.uuid, u2["C"])]),
        store.communities.assign_members(first, [(one1.uuid, u1["C"]), (one1.uuid, u2["D"])]),
        store.communities.assign_members(second, [(one2.uuid, u2["E"])]),
    )
    got = {
        g: {c.uuid: c.members for c in await store.communities.list_communities(g)}
        for g in (first, second)
    }
    assert got[first] == {one1.uuid: sorted([u1["A"], u1["C"], u1["E"]]), two1.uuid: [u1["B"]]}
    assert got[second] == {one2.uuid: sorted([u2["A"], u2["E"]]), two2.uuid: [u2["B"]]}


async def test_a_partial_hit_whose_record_was_deleted_since_is_left_out(tmp_path: Path) -> None:
    """Embedded store: a search's candidates are read with partial records and completed in
    a later read; a fact or entity deleted in between (a forget) is left out of the answer,
    never answered partially nor failing the search."""
    store = SqliteStore(tmp_path / "graph")
    try:
        await store.setup(DIM)
        acme, bob = entity("g", "Acme Corp", embedding=vec(1)), entity("g", "Bob", embedding=vec(1))
        owns = fact("g", acme, bob, "OWNS", "Acme Corp is run by Bob", embedding=vec(1))
        said = episode("g", "msg-1", day(1), "Acme Corp and Bob")
        await store.write_episode(
            "g", EpisodeWrite(episode=said, entities=[acme, bob], facts=[owns])
        )
        full = SearchScope(("g",), AsOf.resolve(None, None, False, None), embeddings=False)
        bare = dataclasses.replace(full, details=False)
        found = [
            *await store.search.fulltext_search(bare, "fact", "Acme", 5),
            *await store.search.fulltext_search(bare, "entity", "Acme", 5),
            *await store.search.fulltext_search(bare, "episode", "Acme", 5),
        ]
        assert {h.kind for h in found} == {"fact", "entity", "episode"}
        assert [h.record.fact for h in found if isinstance(h.record, FactRecord)] == [""]  # partial
        completed = await store.search.complete_hits(bare, found)
        assert [h.record for h in completed if h.kind == "fact"] == [
            h.record for h in await store.search.fulltext_search(full, "fact", "Acme", 5)
        ]

        def forget(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM fact WHERE group_id = 'g'")
            conn.execute("DELETE FROM entity WHERE uuid = ?", (acme.uuid,))

        await store.db.run(forget)
        left = await store.search.complete_hits(bare, found)
        assert [h.kind for h in left] == ["episode"]
    finally:
        await store.close()


def _fact_episodes(group: str, n: int) -> tuple[list[EntityRecord], list[EpisodeWrite]]:
    """``n`` message episodes of one thread, each with a fact of its own between two
    entities (the first write creates them)."""
    acme, bob = entity(group, "Acme Corp"), entity(group, "Bob Stone")
    writes = [
        EpisodeWrite(
            episode=episode(group, f"msg-{i}", day(i), f"Bob: ticket {i} about the printer"),
            entities=[acme, bob] if i == 0 else [],
            mentions=[acme.uuid, bob.uuid],
            facts=[fact(group, bob, acme, "REPORTED", f"Bob reported ticket {i}", tag=str(i))],
        )
        for i in range(n)
    ]
    return [acme, bob], writes


async def test_a_failing_write_of_a_batch_leaves_the_ones_before_it_committed(
    tmp_path: Path,
) -> None:
    """Embedded store: a batch whose third write fails commits the two before it, indexed
    for search, and nothing of the failing one or those after it (BatchWriteError says how
    many were written)."""
    store = SqliteStore(tmp_path / "graph")
    try:
        await store.setup(DIM)
        group = "g"
        _, writes = _fact_episodes(group, 5)
        ghost = entity(group, "Ghost")
        writes[2] = dataclasses.replace(writes[2], mentions=[ghost.uuid])  # no such entity
        with pytest.raises(BatchWriteError) as failed:
            await store.write_episodes(group, writes)
        assert failed.value.written == [True, True]
        assert isinstance(failed.value.__cause__, StoreIntegrityError)
        processed = [await store.episode_processed(group, w.episode.uuid) for w in writes]
        assert processed == [True, True, False, False, False]
        assert (await store.browse.counts(group))["facts"] == 2
        scope = SearchScope((group,), AsOf.resolve(None, None, False, None), embeddings=False)
        hits = await store.search.fulltext_search(scope, "fact", "ticket", 10)
        assert sorted(h.record.fact for h in hits if isinstance(h.record, FactRecord)) == [
            "Bob reported ticket 0",
            "Bob reported ticket 1",
        ]
        episodes = await store.search.fulltext_search(scope, "episode", "printer", 10)
        assert len(episodes) == 2
    finally:
        await store.close()


async def test_a_batch_adds_one_segment_to_each_fulltext_index(tmp_path: Path) -> None:
    """Embedded store: a batch of episodes is indexed for search at its commit, one FTS5
    segment per fulltext table, not one per record it wrote (each segment is merged again
    later: most of what the indexes cost a write)."""
    store = SqliteStore(tmp_path / "graph")
    try:
        await store.setup(DIM)
        _, writes = _fact_episodes("g", 40)
        assert await store.write_episodes("g", writes) == [True] * 40

        def segments(conn: sqlite3.Connection) -> dict[str, int]:
            # a table's _data rows: its averages, its structure and the segments' pages
            return {
                table: conn.execute(f"SELECT count(*) - 2 FROM {table}_data").fetchone()[0]
                for table in ("fact_text", "episode_search", "entity_text")
            }

        assert await store.db.run(segments) == {
            "fact_text": 1,
            "episode_search": 1,
            "entity_text": 1,
        }
        scope = SearchScope(("g",), AsOf.resolve(None, None, False, None), embeddings=False)
        assert len(await store.search.fulltext_search(scope, "fact", "ticket", 50)) == 40
    finally:
        await store.close()


async def test_a_batch_reads_no_id_back_for_the_rows_it_inserts(tmp_path: Path) -> None:
    """Embedded store: the facts and episodes a batch inserts take their ids from the insert
    (no SELECT by uuid after each), and each one's fulltext entry is the row's own; a fact
    written again with a new sentence is found by its id and indexed anew."""
    store = SqliteStore(tmp_path / "graph")
    try:
        await store.setup(DIM)
        _, writes = _fact_episodes("g", 20)
        ran: list[str] = []

        def trace(conn: sqlite3.Connection, on: bool) -> None:
            conn.set_trace_callback(ran.append if on else None)

        await store.db.run(trace, True)
        assert await store.write_episodes("g", writes) == [True] * 20
        await store.db.run(trace, False)
        read_back = [q for q in ran if q.startswith("SELECT id FROM")]
        assert read_back == []

        def entries(conn: sqlite3.Connection) -> dict[str, int]:
            return {
                table: conn.execute(
                    f"SELECT count(*) FROM {table} t JOIN {row} r ON r.id = t.rowid "  # noqa: S608
                    f"AND {check}"
                ).fetchone()[0]
                for table, row, check in (
                    ("fact_text", "fact", "t.text LIKE r.fact || '%'"),
                    ("episode_search", "episode", "r.content LIKE '%' || t.body"),
                )
            }

        assert await store.db.run(entries) == {"fact_text": 20, "episode_search": 20}
        first = writes[0].facts[0]
        again = EpisodeWrite(
            episode=episode("g", "msg-again", day(30), "Bob: ticket 0 was a scanner"),
            mentions=[first.source_uuid, first.target_uuid],
            facts=[first.model_copy(update={"fact": "Bob reported the scanner"})],
        )
        assert await store.write_episodes("g", [again]) == [True]
        scope = SearchScope(("g",), AsOf.resolve(None, None, False, None), embeddings=False)
        found = await store.search.fulltext_search(scope, "fact", "scanner", 50)
        assert [hit.uuid for hit in found] == [first.uuid]
        assert await store.db.run(entries) == {"fact_text": 20, "episode_search": 21}
    finally:
        await store.close()
