"""The search methods of ``GraphStore`` (docs/retrieval.md "Memory retrieval") on Neo4j, the
embedded SQLite
store and the in-memory store of the unit tests (fixture ``any_store``): each kind is found by
fulltext and by vector, ranked as the query says, never across tenants, and facts exactly as
``query_facts`` answers the same scope."""

from __future__ import annotations

import dataclasses
import uuid as uuidlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from neo4j import AsyncGraphDatabase

from tests.support.stores import upsert_entities
from tidegraph.records.asof import AsOf
from tidegraph.records.graph import (
    CommunityRecord,
    EntityRecord,
    EpisodeRecord,
    EpisodeWrite,
    FactRecord,
    FactView,
)
from tidegraph.records.ids import stable_uuid
from tidegraph.records.search import KINDS, Hit, SearchScope
from tidegraph.records.times import iso
from tidegraph.stores.base import GraphStore

pytestmark = pytest.mark.integration

DIM = 384
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def day(n: float) -> datetime:
    return T0 + timedelta(days=n)


def vec(*head: float) -> list[float]:
    return [float(v) for v in head] + [0.0] * (DIM - len(head))


def scope(
    *groups: str,
    valid_at: datetime | None = None,
    known_at: datetime | None = None,
    include_invalid: bool = False,
) -> SearchScope:
    return SearchScope(groups, AsOf.resolve(valid_at, known_at, include_invalid, None))


@pytest.fixture
async def new_group(
    any_store: GraphStore, _neo4j_uri_if_needed: str | None
) -> AsyncIterator[Callable[[], str]]:
    made: list[str] = []

    def make() -> str:
        made.append(f"search-{uuidlib.uuid4().hex[:12]}")
        return made[-1]

    yield make
    if _neo4j_uri_if_needed is not None and made:
        driver = AsyncGraphDatabase.driver(_neo4j_uri_if_needed, auth=None)
        try:
            await driver.execute_query(
                "MATCH (n) WHERE n.group_id IN $groups DETACH DELETE n", {"groups": made}
            )
        finally:
            await driver.close()


# ----------------------------------------------------------------------------- the corpus
@dataclass
class Corpus:
    group: str
    entities: dict[str, EntityRecord]
    facts: dict[str, FactRecord]
    episodes: dict[str, EpisodeRecord]
    community: CommunityRecord


async def corpus(store: GraphStore, group: str) -> Corpus:
    """Alice works at Acme (a printer maker) which buys paper from Globex; two episodes say
    so; one community holds Acme and Globex. Every embedding points its own way."""

    def entity(name: str, summary: str, axis: int) -> EntityRecord:
        return EntityRecord(
            uuid=stable_uuid("entity", group, name),
            group_id=group,
            name=name,
            summary=summary,
            name_embedding=vec(*([0.0] * axis), 1.0),
            created_at=day(0),
        )

    entities = {
        "acme": entity("Acme Corp", "maker of laser printers", 0),
        "globex": entity("Globex", "paper supplier", 1),
        "alice": entity("Alice", "engineer", 2),
    }
    e = entities

    def episode(name: str, content: str, axis: int, at: float) -> EpisodeRecord:
        return EpisodeRecord(
            uuid=stable_uuid("episode", group, name),
            group_id=group,
            name=name,
            source="message",
            source_description="chat",
            content=content,
            valid_at=day(at),
            created_at=day(at) + timedelta(hours=1),
            producer_id=f"msg-{name}",
            content_embedding=vec(*([0.0] * axis), 1.0),
        )

    episodes = {
        "hired": episode("hired", "Alice joined Acme Corp to fix laser printers", 3, 1),
        "order": episode("order", "Acme Corp ordered copier paper from Globex", 4, 2),
    }

    def fact(
        key: str, source: str, target: str, relation: str, text: str, axis: int, at: float, ep: str
    ) -> FactRecord:
        return FactRecord(
            uuid=stable_uuid("fact", group, key),
            group_id=group,
            source_uuid=e[source].uuid,
            target_uuid=e[target].uuid,
            name=relation,
            fact=text,
            fact_embedding=vec(*([0.0] * axis), 1.0),
            episodes=[episodes[ep].uuid],
            valid_at=day(at),
            created_at=day(at) + timedelta(hours=1),
        )

    facts = {
        "works": fact(
            "works", "alice", "acme", "WORKS_AT", "Alice works at Acme Corp", 5, 1, "hired"
        ),
        "buys": fact(
            "buys",
            "acme",
            "globex",
            "BUYS_FROM",
            "Acme Corp buys copier paper from Globex",
            6,
            2,
            "order",
        ),
    }
    await store.write_episode(
        group,
        EpisodeWrite(
            episode=episodes["hired"],
            mentions=[e["alice"].uuid, e["acme"].uuid],
            facts=[facts["works"]],
            entities=[e["alice"], e["acme"]],
        ),
    )
    await store.write_episode(
        group,
        EpisodeWrite(
            episode=episodes["order"],
            mentions=[e["acme"].uuid, e["globex"].uuid],
            facts=[facts["buys"]],
            entities=[e["globex"]],
        ),
    )
    community = CommunityRecord(
        uuid=stable_uuid("community", group, "printing"),
        name="Printing supply",
        summary="printers and the paper they use",
        members=sorted([e["acme"].uuid, e["globex"].uuid]),
        name_embedding=vec(*([0.0] * 7), 1.0),
    )
    await store.communities.write_communities(group, [community], [])
    return Corpus(group, entities, facts, episodes, community)


def uuids(hits: list[Hit]) -> list[str]:
    return [h.uuid for h in hits]


# ----------------------------------------------------------------------------- each kind
async def test_each_kind_is_found_by_fulltext_and_by_vector(
    any_store: GraphStore, new_group: Callable[[], str]
) -> None:
    c = await corpus(any_store, new_group())
    now = scope(c.group)
    expected = {
        "fact": (c.facts["buys"].uuid, "copier paper", vec(0, 0, 0, 0, 0, 0, 1)),
        "entity": (c.entities["globex"].uuid, "paper supplier", vec(0, 1)),
        "episode": (c.episodes["order"].uuid, "copier paper", vec(0, 0, 0, 0, 1)),
        "community": (c.community.uuid, "printing supply", vec(0, 0, 0, 0, 0, 0, 0, 1)),
    }
    for kind in KINDS:
        uuid, text, embedding = expected[kind]
        by_text = await any_store.search.fulltext_search(now, kind, text, 5)
        assert by_text and by_text[0].uuid == uuid, kind
        by_vector = await any_store.search.vector_search(now, kind, embedding, 5)
        assert by_vector[0].uuid == uuid and by_vector[0].score == pytest.approx(1.0), kind
        assert [h.score for h in by_vector] == sorted((h.score for h in by_vector), reverse=True)
        for hit in [*by_text, *by_vector]:
            assert (hit.kind, hit.group_id) == (kind, c.group)
            assert hit.embedding is not None  # for MMR
    assert await any_store.search.fulltext_search(now, "fact", "the of and", 5) == []


async def test_hits_carry_their_sources(
    any_store: GraphStore, new_group: Callable[[], str]
) -> None:
    c = await corpus(any_store, new_group())
    now = scope(c.group)
    [fact] = await any_store.search.fulltext_search(now, "fact", "works", 5)
    assert (fact.subject, fact.object, fact.episodes, fact.mentions) == (
        "Alice",
        "Acme Corp",
        ["msg-hired"],
        1,
    )
    assert fact.as_json(1)["relation"] == "WORKS_AT"
    [acme] = await any_store.search.vector_search(now, "entity", vec(1), 1)
    assert (acme.record.name, acme.episodes, acme.mentions) == (
        "Acme Corp",
        ["msg-order", "msg-hired"],  # what was said of it most recently first
        2,
    )
    [episode] = await any_store.search.fulltext_search(now, "episode", "joined", 5)
    assert episode.record.producer_id == "msg-hired" and episode.episodes == ["msg-hired"]
    [community] = await any_store.search.fulltext_search(now, "community", "printing", 5)
    assert community.record.members == c.community.members
    # entities and episodes known only later, or happened later, are not seen earlier
    before = scope(c.group, valid_at=day(1.5), known_at=day(1.5))
    assert uuids(await any_store.search.fulltext_search(before, "episode", "Acme", 5)) == [
        c.episodes["hired"].uuid
    ]
    assert await any_store.search.fulltext_search(before, "fact", "copier paper", 5) == []
    [early] = await any_store.search.fulltext_search(before, "entity", "acme", 5)
    assert (early.episodes, early.mentions) == (["msg-hired"], 1)


async def test_hits_read_without_details_are_completed_to_what_a_read_with_them_gives(
    any_store: GraphStore, new_group: Callable[[], str]
) -> None:
    """A search reads its candidates without their details and completes the ones it keeps
    (``SearchScope.details``, ``GraphStore.complete_hits``)."""
    c = await corpus(any_store, new_group())
    await corpus(any_store, other := new_group())
    scopes = (scope(c.group, other), scope(c.group, valid_at=day(1.5), known_at=day(1.5)))
    # without embeddings too: a store may then read the candidates' records in part
    for full in (*scopes, *(dataclasses.replace(s, embeddings=False) for s in scopes)):
        bare = dataclasses.replace(full, details=False)
        for kind in KINDS:
            for text in ("works", "Acme copier paper", "Alice Globex printing"):
                detailed = await any_store.search.fulltext_search(full, kind, text, 5)
                light = await any_store.search.fulltext_search(bare, kind, text, 5)
                assert uuids(light) == uuids(detailed), (kind, text)
                assert await any_store.search.complete_hits(bare, light) == detailed, (kind, text)
        start = [c.entities["alice"].uuid]
        walked = await any_store.search.expand_facts(bare, start, 2, 10)
        detailed = await any_store.search.expand_facts(full, start, 2, 10)
        assert walked and await any_store.search.complete_hits(bare, walked) == detailed
    assert await any_store.search.complete_hits(scope(c.group), []) == []


async def test_a_search_never_crosses_tenants(
    any_store: GraphStore, new_group: Callable[[], str]
) -> None:
    mine, theirs = await corpus(any_store, new_group()), await corpus(any_store, new_group())
    for kind in KINDS:
        alone = await any_store.search.fulltext_search(
            scope(mine.group), kind, "acme paper printers", 20
        )
        assert alone and {h.group_id for h in alone} == {mine.group}
        both = await any_store.search.fulltext_search(
            scope(mine.group, theirs.group), kind, "acme paper printers", 20
        )
        assert {h.group_id for h in both} == {mine.group, theirs.group}
        assert len(both) == 2 * len(alone)
        vectors = await any_store.search.vector_search(
            scope(theirs.group), kind, vec(1, 1, 1, 1), 20
        )
        assert vectors and {h.group_id for h in vectors} == {theirs.group}
    # everything a hit carries is of its own group
    owned = {
        c.group: {e.name for e in c.entities.values()}
        | {f"msg-{k}" for k in c.episodes}
        | {u for u in (*c.facts, *c.entities, *c.episodes)}
        for c in (mine, theirs)
    }
    both_groups = scope(mine.group, theirs.group)
    for kind in KINDS:
        for hit in await any_store.search.vector_search(
            both_groups, kind, vec(1, 1, 1, 1, 1, 1, 1), 20
        ):
            assert hit.record.uuid == hit.uuid
            corpus_of = mine if hit.group_id == mine.group else theirs
            if kind == "fact":
                assert {hit.subject, hit.object} <= owned[hit.group_id]
                assert hit.uuid in {f.uuid for f in corpus_of.facts.values()}
            if kind == "entity":
                assert hit.uuid in {e.uuid for e in corpus_of.entities.values()}
            assert set(hit.episodes) <= owned[hit.group_id] | {hit.uuid}
            if kind == "community":
                assert hit.uuid == corpus_of.community.uuid


# ----------------------------------------------------------------------------- facts as of
async def _history(store: GraphStore, group: str) -> None:
    """Acme's plans: Basic from day 0, its end learned on day 64 (day 60), then moved to day
    30 on day 70; Pro from day 30; a start moved earlier later (Team: day 50 learned on day 51,
    day 40 learned on day 80)."""
    names = ["Acme", "Basic plan", "Pro plan", "Team plan"]
    acme, basic, pro, team = (
        EntityRecord(
            uuid=stable_uuid("entity", group, n), group_id=group, name=n, created_at=day(0)
        )
        for n in names
    )
    ep = EpisodeRecord(
        uuid=stable_uuid("episode", group, "crm"),
        group_id=group,
        name="crm",
        source="json",
        source_description="crm",
        content="plans",
        valid_at=day(0),
        created_at=day(0),
        producer_id="crm:1",
    )

    def plan(target: EntityRecord, text: str, **fields: object) -> FactRecord:
        return FactRecord(
            uuid=stable_uuid("fact", group, target.uuid),
            group_id=group,
            source_uuid=acme.uuid,
            target_uuid=target.uuid,
            name="ON_PLAN",
            fact=text,
            fact_embedding=vec(1, len(text)),
            episodes=[ep.uuid],
            **fields,  # type: ignore[arg-type]
        )

    facts = [
        plan(
            basic,
            "Acme is on the Basic plan",
            valid_at=day(0),
            created_at=day(1),
            invalid_at=day(30),
            expired_at=day(64),
            prior_ends=[day(60)],
            prior_ends_learned_at=[day(64)],
            end_learned_at=day(70),
        ),
        plan(pro, "Acme is on the Pro plan", valid_at=day(30), created_at=day(70)),
        plan(
            team,
            "Acme is on the Team plan",
            valid_at=day(40),
            created_at=day(51),
            prior_starts=[day(50)],
            prior_starts_learned_at=[day(51)],
            start_learned_at=day(80),
        ),
    ]
    await store.write_episode(
        group,
        EpisodeWrite(episode=ep, facts=facts, entities=[acme, basic, pro, team]),
    )


def view(hit: Hit) -> FactView:
    fact = hit.record
    assert isinstance(fact, FactRecord)
    return FactView(
        uuid=hit.uuid,
        subject=hit.subject,
        relation=fact.name,
        object=hit.object,
        fact=fact.fact,
        valid_at=iso(fact.valid_at),
        invalid_at=iso(fact.invalid_at),
        created_at=iso(fact.created_at),
        expired_at=iso(fact.expired_at),
        episodes=hit.episodes,
    )


@pytest.mark.parametrize("include_invalid", [False, True])
async def test_facts_are_found_exactly_as_query_facts_answers(
    any_store: GraphStore, new_group: Callable[[], str], include_invalid: bool
) -> None:
    group = new_group()
    await _history(any_store, group)
    instants = [day(n) for n in (-1, 10, 35, 45, 55, 65, 75, 100)]
    asked = 0
    for valid_at in instants:
        for known_at in [*instants, None]:
            expected = await any_store.browse.query_facts(
                group, valid_at=valid_at, known_at=known_at, include_invalid=include_invalid
            )
            where = scope(
                group, valid_at=valid_at, known_at=known_at, include_invalid=include_invalid
            )
            by_text = await any_store.search.fulltext_search(where, "fact", "acme plan", 10)
            by_vector = await any_store.search.vector_search(where, "fact", vec(1), 10)
            # as a search reads them (no details, no embeddings), then completed
            bare = dataclasses.replace(where, details=False, embeddings=False)
            light = await any_store.search.fulltext_search(bare, "fact", "acme plan", 10)
            walked = await any_store.search.expand_facts(
                bare, [stable_uuid("entity", group, "Acme")], 1, 10
            )
            completed = [
                await any_store.search.complete_hits(bare, hits) for hits in (light, walked)
            ]
            for hits in (by_text, by_vector, *completed):
                got = sorted((view(h) for h in hits), key=lambda v: v.uuid)
                assert got == sorted(expected, key=lambda v: v.uuid), (valid_at, known_at)
            asked += bool(expected)
    assert asked > 20
    if include_invalid:  # ended facts too: Basic is found although it ended
        ended = await any_store.search.fulltext_search(
            scope(group, include_invalid=True), "fact", "basic", 5
        )
        assert [h.record.invalid_at for h in ended] == [day(30)]


# ----------------------------------------------------------------------------- the graph
def _episode(group: str, n: int, at: datetime, stored: datetime, **fields: str) -> EpisodeRecord:
    """Episode ``n`` of the group, said ``at``, stored ``stored``."""
    return EpisodeRecord(
        uuid=stable_uuid("episode", group, str(n)),
        group_id=group,
        name=str(n),
        source="text",
        source_description="",
        content=f"episode {n}",
        valid_at=at,
        created_at=stored,
        **fields,  # type: ignore[arg-type]
    )


async def _chain(store: GraphStore, group: str) -> list[EntityRecord]:
    """a - b - c - d in a line (facts valid from day 1), e alone; and an a - d fact that
    ended on day 2."""
    people = [
        EntityRecord(
            uuid=stable_uuid("entity", group, n), group_id=group, name=n, created_at=day(0)
        )
        for n in "abcde"
    ]

    def knows(i: int, j: int, **fields: object) -> FactRecord:
        return FactRecord(
            uuid=stable_uuid("fact", group, str(i), str(j)),
            group_id=group,
            source_uuid=people[i].uuid,
            target_uuid=people[j].uuid,
            name="KNOWS",
            fact=f"{people[i].name} knows {people[j].name}",
            valid_at=day(1),
            created_at=day(1),
            **fields,  # type: ignore[arg-type]
        )

    episodes = []
    for n, (i, j) in enumerate([(0, 1), (1, 2), (2, 3)]):
        ep = _episode(group, n, day(1 + n), day(1 + n), producer_id=f"p{n}")
        episodes.append(ep)
        await store.write_episode(
            group,
            EpisodeWrite(
                episode=ep,
                mentions=[people[i].uuid, people[j].uuid],
                facts=[knows(i, j)],
                entities=people if n == 0 else [],
            ),
        )
    ended = knows(0, 3, invalid_at=day(2), expired_at=day(2))
    last = episodes[-1].model_copy(
        update={"uuid": stable_uuid("episode", group, "x"), "producer_id": "px", "valid_at": day(9)}
    )
    await store.write_episode(group, EpisodeWrite(episode=last, facts=[ended]))
    return people


async def test_expand_facts_walks_breadth_first_over_valid_facts(
    any_store: GraphStore, new_group: Callable[[], str]
) -> None:
    group, other = new_group(), new_group()
    a, b, c, d, e = await _chain(any_store, group)
    await _chain(any_store, other)
    now = scope(group, other)
    hits = await any_store.search.expand_facts(now, [a.uuid], 2, 10)
    assert [(h.subject, h.object, h.distance, h.score) for h in hits] == [
        ("a", "b", 1, 1.0),
        ("b", "c", 2, 0.5),
    ]
    assert {h.group_id for h in hits} == {group}
    three = await any_store.search.expand_facts(now, [a.uuid], 3, 10)
    assert [h.distance for h in three] == [1, 2, 3]
    assert len(await any_store.search.expand_facts(now, [a.uuid], 3, 2)) == 2
    # as of day 1.5 the a - d fact still held
    then = scope(group, valid_at=day(1.5))
    assert sorted(
        (h.object, h.distance) for h in await any_store.search.expand_facts(then, [a.uuid], 1, 10)
    ) == [
        ("b", 1),
        ("d", 1),
    ]
    assert await any_store.search.expand_facts(now, [e.uuid], 3, 10) == []


async def test_entity_distances_and_recent_episode_entities(
    any_store: GraphStore, new_group: Callable[[], str]
) -> None:
    group = new_group()
    a, b, c, d, e = await _chain(any_store, group)
    now = scope(group)
    everyone = [p.uuid for p in (a, b, c, d, e)]
    assert await any_store.search.entity_distances(now, a.uuid, everyone, 2) == {
        a.uuid: 0,
        b.uuid: 1,
        c.uuid: 2,
    }
    assert (await any_store.search.entity_distances(now, a.uuid, everyone, 5))[d.uuid] == 3
    then = scope(group, valid_at=day(1.5))
    assert (await any_store.search.entity_distances(then, a.uuid, [d.uuid], 5)) == {d.uuid: 1}
    # the latest episodes first (the last one mentions nobody)
    recent = await any_store.search.recent_episode_entities(now, 2)
    assert recent == sorted([c.uuid, d.uuid])
    assert await any_store.search.recent_episode_entities(
        scope(group, valid_at=day(1.5)), 5
    ) == sorted([a.uuid, b.uuid])
    assert await any_store.search.recent_episode_entities(scope(new_group()), 5) == []


async def test_the_latest_episodes_are_ordered_by_time_then_uuid(
    any_store: GraphStore, new_group: Callable[[], str]
) -> None:
    """``recent_episode_entities``: of episodes said at the same time the larger uuid counts
    as the later; one stored after the known-at time is not seen."""
    group = new_group()
    people = [
        EntityRecord(uuid=stable_uuid("entity", group, n), group_id=group, name=n) for n in "pqrst"
    ]
    await upsert_entities(any_store, group, people)
    said = [
        (day(3), day(3)),
        (day(3), day(3)),
        (day(3), day(3)),
        (day(2), day(2)),
        (day(4), day(9)),
    ]
    episodes = []
    for n, (at, stored) in enumerate(said):
        ep = _episode(group, n, at, stored)
        episodes.append(ep)
        await any_store.write_episode(group, EpisodeWrite(episode=ep, mentions=[people[n].uuid]))
    tied = sorted(range(3), key=lambda n: episodes[n].uuid, reverse=True)
    then = scope(group, known_at=day(5))
    assert await any_store.search.recent_episode_entities(then, 2) == [
        people[n].uuid for n in tied[:2]
    ]
    # the latest, said on day 4, was stored on day 9: not seen on day 5
    assert await any_store.search.recent_episode_entities(then, 4) == [
        *(people[n].uuid for n in tied),
        people[3].uuid,
    ]
