"""The contract of ``GraphStore`` (tidegraph/stores/base.py) on ``MemoryStore``: the rules the
steps rely on, so that unit tests built on the in-memory store can be trusted (docs/streaming.md
"At-least-once with idempotent effects", "Two timelines")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.stores import assign_member, neighbour_weights, upsert_entities, vector_facts
from tidegraph.records.asof import AsOf, end_known_at
from tidegraph.records.graph import (
    CommunityRecord,
    EntityRecord,
    EpisodeRecord,
    EpisodeWrite,
    FactClosure,
    FactRecord,
)
from tidegraph.records.times import iso
from tidegraph.stores import EpisodeConflictError, StoreIntegrityError, StoreSchemaError
from tidegraph.stores.memory.store import MemoryStore

DIM = 4
G, OTHER = "g", "other"
T0 = datetime(2024, 1, 1, tzinfo=UTC)
K0 = datetime(2030, 1, 1, tzinfo=UTC)  # ingestion times (T'), after every event time


def day(n: int) -> datetime:
    return T0 + timedelta(days=n)


def learned(hours: int) -> datetime:
    return K0 + timedelta(hours=hours)


def entity(uuid: str, name: str | None = None, group: str = G, **fields: Any) -> EntityRecord:
    return EntityRecord(uuid=uuid, group_id=group, name=name or uuid.title(), **fields)


def fact(uuid: str, source: str, target: str, group: str = G, **fields: Any) -> FactRecord:
    values: dict[str, Any] = {
        "name": "WORKS_AT",
        "fact": f"{source} works at {target}",
        "valid_at": day(0),
        "episodes": ["ep1"],
        **fields,
    }
    return FactRecord(uuid=uuid, group_id=group, source_uuid=source, target_uuid=target, **values)


def episode(uuid: str, group: str = G, content_hash: str = "hash-1") -> EpisodeRecord:
    return EpisodeRecord(
        uuid=uuid,
        group_id=group,
        name=uuid,
        source="text",
        source_description="",
        content=f"content of {uuid}",
        valid_at=day(0),
        producer_id=f"producer-{uuid}",
        content_hash=content_hash,
    )


@pytest.fixture
async def store() -> MemoryStore:
    store = MemoryStore()
    await store.setup(DIM)
    return store


async def write_alice_at_acme(store: MemoryStore) -> EpisodeWrite:
    write = EpisodeWrite(
        episode=episode("ep1"),
        entities=[entity("alice"), entity("acme", name_embedding=[1.0, 0.0, 0.0, 0.0])],
        mentions=["alice", "acme"],
        facts=[fact("f1", "alice", "acme", fact_embedding=[0.0, 1.0, 0.0, 0.0])],
    )
    assert await store.write_episode(G, write)
    return write


# ----------------------------------------------------------------------------- idempotency
async def test_an_episode_written_again_changes_nothing(store: MemoryStore) -> None:
    write = await write_alice_at_acme(store)
    stored = await store.facts_touching(G, ["alice"])
    assert await store.browse.counts(G) == {"episodes": 1, "entities": 2, "facts": 1, "mentions": 2}

    assert not await store.write_episode(G, write)  # the marker is checked by the write itself
    assert await store.facts_touching(G, ["alice"]) == stored
    assert await store.browse.counts(G) == {"episodes": 1, "entities": 2, "facts": 1, "mentions": 2}

    stored[0].invalid_at = day(9)  # reads are copies: plan_facts may change them freely
    assert (await store.facts_touching(G, ["alice"]))[0].invalid_at is None


async def test_a_fact_merged_by_uuid_keeps_created_at_its_first_end_and_embedding(
    store: MemoryStore,
) -> None:
    await write_alice_at_acme(store)
    [first] = await store.facts_touching(G, ["alice"])
    again = fact(
        "f1",
        "alice",
        "acme",
        episodes=["ep1", "ep2"],
        invalid_at=day(5),
        created_at=learned(1),
        expired_at=learned(1),
    )  # no fact_embedding
    assert await store.write_episode(G, EpisodeWrite(episode=episode("ep2"), facts=[again]))
    [merged] = await store.facts_touching(G, ["alice"])
    assert merged.created_at == first.created_at
    assert merged.fact_embedding == [0.0, 1.0, 0.0, 0.0]
    assert (merged.episodes, merged.invalid_at, merged.expired_at) == (
        ["ep1", "ep2"],
        day(5),
        learned(1),
    )

    closure = FactClosure("f1", invalid_at=day(3), expired_at=learned(2))
    assert await store.write_episode(G, EpisodeWrite(episode=episode("ep3"), closures=[closure]))
    [closed] = await store.facts_touching(G, ["alice"])
    assert (closed.invalid_at, closed.expired_at) == (day(3), learned(1))  # expired_at once


async def test_entity_upserts_follow_the_merge_rules(store: MemoryStore) -> None:
    first = entity(
        "acme",
        "Acme Corp",
        labels=["Organization"],
        summary="makes anvils",
        aliases=["acme corp"],
        name_embedding=[1.0, 0.0, 0.0, 0.0],
        created_at=learned(0),
    )
    later = entity(
        "acme",
        "ACME Incorporated",
        labels=["Customer", "Entity"],  # Entity is reserved: never a type label
        summary="",
        key="crm:1",
        aliases=["acme inc"],
        name_embedding=[0.0, 1.0, 0.0, 0.0],
        created_at=learned(5),
    )
    await upsert_entities(store, G, [first])
    await upsert_entities(store, G, [later])
    await upsert_entities(store, G, [entity("acme", key="crm:2", summary="sells anvils")])
    [acme] = await store.entities_by_uuids(G, ["acme"])
    assert (acme.name, acme.created_at, acme.name_embedding) == (
        "Acme Corp",
        learned(0),
        [1.0, 0.0, 0.0, 0.0],
    )
    assert acme.labels == ["Organization", "Customer"]
    assert acme.aliases == ["acme corp", "acme inc"]
    assert (acme.summary, acme.key) == ("sells anvils", "crm:1")
    assert [e.uuid for e in await store.entities_by_names(G, ["acme inc"])] == ["acme"]
    assert [e.uuid for e in await store.entities_by_keys(G, ["crm:1"])] == ["acme"]
    assert await store.entities_by_keys(G, ["crm:2"]) == []


# ----------------------------------------------------------------------------- the marker
async def test_the_processed_marker_and_its_content_hash(store: MemoryStore) -> None:
    assert not await store.episode_processed(G, "ep1")
    await write_alice_at_acme(store)
    assert await store.episode_processed(G, "ep1")
    assert await store.episode_processed(G, "ep1", "hash-1")
    assert not await store.episode_processed(OTHER, "ep1", "hash-2")  # another group's

    with pytest.raises(EpisodeConflictError):
        await store.episode_processed(G, "ep1", "hash-2")
    with pytest.raises(EpisodeConflictError):
        await store.lookup_entities(G, [], ["alice"], "ep1", None, "hash-2")
    with pytest.raises(EpisodeConflictError):
        await store.write_episode(G, EpisodeWrite(episode=episode("ep1", content_hash="hash-2")))

    lookup = await store.lookup_entities(G, [], ["alice"], "ep1", ["WORKS_AT"], "hash-1")
    assert lookup.processed and lookup.by_name == [] and lookup.facts is None


async def test_the_lookup_reads_entities_and_their_facts_of_the_relations_asked(
    store: MemoryStore,
) -> None:
    await write_alice_at_acme(store)
    lookup = await store.lookup_entities(G, [], ["alice"], "ep9", ["WORKS_AT"], "hash-9")
    assert not lookup.processed
    assert [e.uuid for e in lookup.by_name] == ["alice"]
    assert lookup.by_name[0].name_embedding is None  # resolution does not use it
    assert [f.uuid for f in lookup.facts or []] == ["f1"]
    assert (await store.lookup_entities(G, [], ["alice"], "ep9", ["LIVES_IN"])).facts == []
    assert (await store.lookup_entities(G, [], ["acme"], "ep9", ["WORKS_AT"])).facts == []


# ----------------------------------------------------------------------------- groups
async def test_writes_crossing_groups_or_dangling_are_refused_whole(store: MemoryStore) -> None:
    await write_alice_at_acme(store)
    before = await store.browse.counts(OTHER)
    refused = [
        EpisodeWrite(episode=episode("x1", OTHER), entities=[entity("alice", group=OTHER)]),
        EpisodeWrite(episode=episode("x2", OTHER), mentions=["alice"]),
        EpisodeWrite(
            episode=episode("x3", OTHER),
            entities=[entity("bob", group=OTHER), entity("initech", group=OTHER)],
            facts=[fact("f1", "bob", "initech", OTHER)],  # G's fact uuid
        ),
        EpisodeWrite(
            episode=episode("x4", OTHER),
            entities=[entity("bob", group=OTHER)],
            mentions=["bob"],
            closures=[FactClosure("f1", invalid_at=day(1), expired_at=learned(1))],
        ),
        EpisodeWrite(episode=episode("ep1", OTHER)),  # G's episode uuid
    ]
    for write in refused:
        with pytest.raises(StoreIntegrityError):
            await store.write_episode(OTHER, write)
    with pytest.raises(StoreIntegrityError):
        await upsert_entities(store, OTHER, [entity("alice", group=OTHER)])
    assert await store.browse.counts(OTHER) == before  # nothing of a refused write is kept
    assert await store.entities_by_uuids(OTHER, ["bob", "alice"]) == []
    assert await store.browse.counts(G) == {"episodes": 1, "entities": 2, "facts": 1, "mentions": 2}


async def test_reads_never_see_another_group(store: MemoryStore) -> None:
    await write_alice_at_acme(store)
    assert await store.entities_by_uuids(OTHER, ["alice"]) == []
    assert await store.entities_by_names(OTHER, ["alice"]) == []
    assert await store.browse.list_entities(OTHER) == []
    assert await store.facts_touching(OTHER, ["alice", "acme"]) == []
    assert await store.browse.query_facts(OTHER, include_invalid=True) == []
    assert await store.vector_entities(OTHER, [1.0, 0.0, 0.0, 0.0], 5) == []
    assert await vector_facts(store, OTHER, [0.0, 1.0, 0.0, 0.0], 5) == []
    assert await store.fulltext_entities(OTHER, "Acme", 5) == []
    assert await store.recent_episodes(OTHER, day(1), 5) == []
    assert await store.communities.entity_graph(OTHER) == ([], [])

    await store.forget.delete_group(OTHER)
    assert await store.browse.counts(G) == {"episodes": 1, "entities": 2, "facts": 1, "mentions": 2}
    await store.forget.delete_group(G)
    assert await store.browse.counts(G) == {"episodes": 0, "entities": 0, "facts": 0, "mentions": 0}


# ----------------------------------------------------------------------------- as of
async def test_query_facts_answers_what_asof_believes(store: MemoryStore) -> None:
    """Basic from day 0, closed at day 60 (learned at 1 h), then moved to day 30 by a late
    Team fact (learned at 2 h); Pro from day 60; a fact whose start moved earlier at 2 h."""
    basic = fact(
        "basic", "acme", "basic_plan", name="HAS_PLAN", valid_at=day(0), invalid_at=day(30),
        created_at=learned(0), expired_at=learned(1), prior_ends=[day(60)],
        prior_ends_learned_at=[learned(1)], end_learned_at=learned(2), episodes=["ep1"],
    )  # fmt: skip
    pro = fact(
        "pro", "acme", "pro_plan", name="HAS_PLAN", valid_at=day(60), created_at=learned(1),
        episodes=["ep2"],
    )  # fmt: skip
    team = fact(
        "team", "acme", "team_plan", name="HAS_PLAN", valid_at=day(30), invalid_at=day(60),
        created_at=learned(2), expired_at=learned(2), episodes=["ep3", "unknown-episode"],
    )  # fmt: skip
    moved = fact(
        "moved", "bob", "acme", valid_at=day(10), prior_starts=[day(20)],
        prior_starts_learned_at=[learned(0)], start_learned_at=learned(2), created_at=learned(0),
        episodes=["ep1"],
    )  # fmt: skip
    names = ["acme", "basic_plan", "pro_plan", "team_plan", "bob"]
    await store.write_episode(
        G,
        EpisodeWrite(
            episode=episode("ep1"),
            entities=[entity(n) for n in names],
            facts=[basic, pro, team, moved],
        ),
    )
    for uuid in ("ep2", "ep3"):
        await store.write_episode(G, EpisodeWrite(episode=episode(uuid)))
    facts = [basic, pro, team, moved]
    known_ats = [learned(-1), learned(0), learned(1), learned(1) + timedelta(minutes=30)]
    for known_at in [*known_ats, learned(2), learned(3)]:
        for valid_at in [day(-1), day(5), day(15), day(25), day(45), day(70)]:
            asof = AsOf(valid_at, known_at, include_invalid=False, entity_uuid=None)
            views = await store.browse.query_facts(G, valid_at=valid_at, known_at=known_at)
            assert sorted(v.uuid for v in views) == sorted(
                f.uuid for f in facts if asof.believed(f)
            ), (valid_at, known_at)
            for view in views:
                stored = next(f for f in facts if f.uuid == view.uuid)
                assert view.invalid_at == iso(end_known_at(stored, known_at))

    for known_at, end in ((learned(1), day(60)), (learned(2), day(30))):
        [view] = await store.browse.query_facts(
            G, known_at=known_at, include_invalid=True, entity_uuid="basic_plan"
        )
        assert (view.uuid, view.invalid_at) == ("basic", iso(end))  # the end believed then
    history = await store.browse.query_facts(
        G, known_at=learned(3), include_invalid=True, entity_uuid="acme"
    )
    assert [(v.subject, v.object) for v in history] == [
        ("Acme", "Basic_Plan"), ("Acme", "Team_Plan"), ("Acme", "Pro_Plan"), ("Bob", "Acme"),
    ]  # fmt: skip
    team_view = next(v for v in history if v.uuid == "team")
    assert team_view.episodes == ["producer-ep3", "unknown-episode"]  # producer ids


# ----------------------------------------------------------------------------- search
async def test_vector_scores_are_one_plus_cosine_over_two(store: MemoryStore) -> None:
    await upsert_entities(
        store,
        G,
        [
            entity("same", name_embedding=[1.0, 0.0, 0.0, 0.0]),
            entity("orthogonal", name_embedding=[0.0, 1.0, 0.0, 0.0]),
            entity("opposite", name_embedding=[-2.0, 0.0, 0.0, 0.0]),
            entity("unembedded"),
        ],
    )
    hits = await store.vector_entities(G, [3.0, 0.0, 0.0, 0.0], 10)
    assert [(e.uuid, score) for e, score in hits] == [
        ("same", 1.0),
        ("orthogonal", 0.5),
        ("opposite", 0.0),
    ]
    assert [e.uuid for e, _ in await store.vector_entities(G, [1.0, 0.0, 0.0, 0.0], 1)] == ["same"]
    with pytest.raises(ValueError):
        await store.vector_entities(G, [1.0, 0.0], 1)  # another dimension


async def test_fulltext_finds_shared_words_of_name_and_summary(store: MemoryStore) -> None:
    await upsert_entities(
        store,
        G,
        [
            entity("acme", "Acme Corp", summary="Makes anvils and rockets"),
            entity("rockets", "Rocket Labs", summary="Sells rockets"),
            entity("globex", "Globex"),
        ],
    )
    found = await store.fulltext_entities(G, "the Acme rockets!", 10)
    assert [(e.uuid, score) for e, score in found] == [("acme", 2.0), ("rockets", 1.0)]
    assert await store.fulltext_entities(G, "the and of", 10) == []  # stop words only


# ----------------------------------------------------------------------------- schema
async def test_setup_keeps_one_dimension() -> None:
    store = MemoryStore()
    with pytest.raises(StoreSchemaError):
        await upsert_entities(store, G, [entity("alice")])  # no schema yet
    await store.setup(DIM)
    await store.setup(DIM)
    with pytest.raises(StoreSchemaError):
        await store.setup(DIM * 2)


# ----------------------------------------------------------------------------- communities
async def test_communities_move_members_and_stay_in_their_group(store: MemoryStore) -> None:
    await write_alice_at_acme(store)
    await upsert_entities(store, G, [entity("bob")])
    await upsert_entities(store, OTHER, [entity("carol", group=OTHER)])
    await store.communities.write_communities(
        G,
        [
            CommunityRecord("c1", "Acme people", "", ["alice", "acme"]),
            CommunityRecord("c2", "Bob", "", ["bob", "carol"]),  # carol: another group's
        ],
        [],
    )
    await store.communities.write_communities(
        G, [CommunityRecord("c2", "Bob and Alice", "", ["bob", "alice"])], []
    )
    communities = await store.communities.list_communities(G)
    assert [(c.uuid, c.name, c.members) for c in communities] == [
        ("c1", "Acme people", ["acme"]),
        ("c2", "Bob and Alice", ["alice", "bob"]),
    ]
    await assign_member(store, G, "c1", "alice")
    await assign_member(store, G, "c1", "carol")  # not in the group: nothing
    [alice] = await store.entities_by_uuids(G, ["alice"])
    assert alice.community_uuid == "c1"
    with pytest.raises(StoreIntegrityError):
        await store.communities.write_communities(
            OTHER, [CommunityRecord("c1", "taken", "", [])], []
        )
    await store.communities.write_communities(G, [], ["c2"])
    assert [(c.uuid, c.members) for c in await store.communities.list_communities(G)] == [
        ("c1", ["acme", "alice"])
    ]

    nodes, edges = await store.communities.entity_graph(G)
    assert nodes == ["acme", "alice", "bob"]
    assert [(e.source, e.target, e.weight) for e in edges] == [("acme", "alice", 1)]
    assert await neighbour_weights(store, G, "alice") == {"acme": 1}
    assert await store.communities.entity_graph(G, at=day(-1)) == (nodes, [])  # before the fact
