"""The fact and the episode fulltext indexes hold each record's validity, and a search's
query of either requires what its scope sees (docs/retrieval.md "Validity in the fulltext
index"), on Neo4j: on a long history (an incident log, most facts closed), the index answers
a question as of a past time, as known at a past time, or now, with exactly the records that
the search's own filter lets through among the matches of its words (none lost, none of the
closed history), each with the score its words give it; records stored before the validity
words get them at setup."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest

from tests.support.incident_log import incident_log, incident_mappings
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.ingest import ingest
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.records.asof import AsOf
from tidegraph.records.times import time_words
from tidegraph.stores.episode_search import episode_query, lucene_episode_query
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j import search_queries as sq
from tidegraph.stores.neo4j.search import scope_params
from tidegraph.stores.neo4j.store import Neo4jStore

pytestmark = pytest.mark.integration

DIM = 384
# The group's matches of a fulltext query, with whether the search's filter lets each through.
MATCHES = f"""
CALL db.index.fulltext.queryRelationships('{q.FACT_FULLTEXT_INDEX}', $query)
YIELD relationship AS r, score
WITH r, score WHERE r.group_id = $group_id
RETURN r.uuid AS uuid, score, {sq.seen_by_scope("fact", "r")} AS seen,
       [t IN [r.created_at, coalesce(r.end_learned_at, r.expired_at), r.valid_at, r.invalid_at]
        | t.epochSeconds] AS seconds
"""
WORDS = f"""
MATCH ()-[r:RELATES_TO]->() WHERE r.group_id = $group_id
RETURN r.uuid AS uuid, [field IN {list(q.FACT_TIME_FIELDS)!r} | r[field]] AS words,
       [r.created_at, r.valid_at, r.invalid_at, coalesce(r.end_learned_at, r.expired_at)]
       AS times
"""
REMOVE_WORDS = """
MATCH ()-[r:RELATES_TO]->() WHERE r.group_id = $group_id
REMOVE r.index_created_at, r.index_valid_at, r.index_invalid_at, r.index_ended_at
"""


@pytest.fixture
async def store(neo4j_uri: str, group_id: str) -> AsyncIterator[Neo4jStore]:
    """A long history in its own group: 30 tickets, 12 updates each of three attributes
    (1,080 facts, 990 of them closed)."""
    opened = Neo4jStore(neo4j_uri)
    await opened.setup(DIM)
    runner = GroupRunner.of(
        store=opened, embedder=HashingEmbedder(dim=DIM), llm=None, mappings=incident_mappings()
    )
    try:
        report = await ingest(runner, incident_log(group_id, subjects=30, changes=12).episodes)
        assert report.failures == []
        yield opened
    finally:
        await opened.close()


async def _matches(store: Neo4jStore, group_id: str, query: str, asof: AsOf) -> list[Any]:
    params = {"group_id": group_id, "query": query, **scope_params(asof)}
    return await store.ex.rows(MATCHES, params)


async def _middle_of_ingestion(store: Neo4jStore, group_id: str) -> datetime:
    """A time at which about half the group's facts were stored."""
    [row] = await store.ex.rows(
        "MATCH ()-[r:RELATES_TO]->() WHERE r.group_id = $group_id "
        "WITH r.created_at AS at ORDER BY at RETURN collect(at) AS times",
        {"group_id": group_id},
    )
    times = row["times"]
    return times[len(times) // 2].to_native()


@pytest.mark.parametrize("scope", ["as of", "as known then", "now", "every validity"])
async def test_the_index_answers_only_the_facts_the_scope_may_see(
    store: Neo4jStore, group_id: str, scope: str
) -> None:
    log = incident_log(group_id, subjects=30, changes=12)
    middle = await _middle_of_ingestion(store, group_id)
    for question in [x for x in log.questions(12, seed=5) if x.valid_at is not None]:
        valid_at = None if scope == "now" else question.valid_at
        known_at = middle if scope in ("as known then", "every validity") else None
        asof = AsOf.resolve(valid_at, known_at, scope == "every validity", None)
        words = sq.fulltext_query(question.query)
        assert words is not None
        every = await _matches(store, group_id, words, asof)
        required = await _matches(store, group_id, sq.fact_fulltext_query(words, asof), asof)
        seen = {r["uuid"]: r["score"] for r in every if r["seen"]}
        # the long history matches the words; the scope sees a part of it
        assert len(seen) < len(every)
        found = {r["uuid"]: r["score"] for r in required}
        assert seen.keys() <= found.keys()
        # more only where whole seconds cannot tell: a time in the same second as a bound
        bounds = {int(asof.known_at.timestamp()), int(asof.valid_at.timestamp())}
        for extra in (r for r in required if r["uuid"] not in seen):
            assert bounds & set(extra["seconds"]), extra
        # The scores are the words' alone (a validity clause that scored would add 1 to each):
        # BM25's statistics are the whole index's, so other groups' writes between the two
        # reads may move them a little.
        assert {u: found[u] for u in seen} == pytest.approx(seen, rel=0.1)


async def test_facts_stored_before_the_validity_words_get_them_at_setup(
    store: Neo4jStore, group_id: str
) -> None:
    rows = await store.ex.rows(WORDS, {"group_id": group_id})
    written = {r["uuid"]: r["words"] for r in rows}
    # the words written in Cypher are the stored times' words as a search's query reads them
    for row in rows:
        assert row["words"] == [
            None if t is None else time_words(t.to_native()) for t in row["times"]
        ]
    assert any(ended for *_, ended in written.values())  # most of the history is closed
    await store.ex.execute(REMOVE_WORDS, {"group_id": group_id})

    await store.setup(DIM)

    migrated = {r["uuid"]: r["words"] for r in await store.ex.rows(WORDS, {"group_id": group_id})}
    assert migrated == written
    # facts whose start has its words and whose end has none get the end's
    await store.ex.execute(
        "MATCH ()-[r:RELATES_TO]->() WHERE r.group_id = $group_id "
        "REMOVE r.index_invalid_at, r.index_ended_at",
        {"group_id": group_id},
    )

    await store.setup(DIM)

    migrated = {r["uuid"]: r["words"] for r in await store.ex.rows(WORDS, {"group_id": group_id})}
    assert migrated == written


# The same of episodes: the group's matches of an episode query, with the search's filter.
EPISODE_MATCHES = f"""
CALL db.index.fulltext.queryNodes('{q.EPISODE_FULLTEXT_INDEX}', $query)
YIELD node AS x, score
WITH x, score WHERE x.group_id = $group_id
RETURN x.uuid AS uuid, score, {sq.seen_by_scope("episode")} AS seen,
       [t IN [x.created_at, x.valid_at] | t.epochSeconds] AS seconds
"""
EPISODE_WORDS = f"""
MATCH (ep:Episodic) WHERE ep.group_id = $group_id
RETURN ep.uuid AS uuid, [field IN {list(q.EPISODE_TIME_FIELDS)!r} | ep[field]] AS words,
       [ep.created_at, ep.valid_at] AS times
"""
REMOVE_EPISODE_WORDS = """
MATCH (ep:Episodic) WHERE ep.group_id = $group_id
REMOVE ep.index_created_at, ep.index_said_at
"""


@pytest.mark.parametrize("scope", ["as of", "as known then"])
async def test_the_episode_index_answers_only_the_episodes_the_scope_may_see(
    store: Neo4jStore, group_id: str, scope: str
) -> None:
    log = incident_log(group_id, subjects=30, changes=12)
    middle = await _middle_of_ingestion(store, group_id)
    for question in [x for x in log.questions(12, seed=5) if x.valid_at is not None]:
        known_at = middle if scope == "as known then" else None
        asof = AsOf.resolve(question.valid_at if scope == "as of" else None, known_at, False, None)
        parts = episode_query(question.query, [])
        assert parts is not None
        words = lucene_episode_query(parts, q.EPISODE_INDEX_FIELDS)
        params = {"group_id": group_id, **scope_params(asof)}
        every = await store.ex.rows(EPISODE_MATCHES, {**params, "query": words})
        query = sq.episode_fulltext_query(words, asof)
        required = await store.ex.rows(EPISODE_MATCHES, {**params, "query": query})
        seen = {r["uuid"]: r["score"] for r in every if r["seen"]}
        assert len(seen) < len(every)  # the history matches the words; the scope sees a part
        found = {r["uuid"]: r["score"] for r in required}
        assert seen.keys() <= found.keys()
        bounds = {int(asof.known_at.timestamp()), int(asof.valid_at.timestamp())}
        for extra in (r for r in required if r["uuid"] not in seen):
            assert bounds & set(extra["seconds"]), extra
        assert {u: found[u] for u in seen} == pytest.approx(seen, rel=0.1)


async def test_episodes_stored_before_the_validity_words_get_them_at_setup(
    store: Neo4jStore, group_id: str
) -> None:
    rows = await store.ex.rows(EPISODE_WORDS, {"group_id": group_id})
    written = {r["uuid"]: r["words"] for r in rows}
    for row in rows:
        assert row["words"] == [time_words(t.to_native()) for t in row["times"]]
    await store.ex.execute(REMOVE_EPISODE_WORDS, {"group_id": group_id})

    await store.setup(DIM)

    migrated = {
        r["uuid"]: r["words"] for r in await store.ex.rows(EPISODE_WORDS, {"group_id": group_id})
    }
    assert migrated == written


@pytest.mark.parametrize("scope", ["as of", "as known then", "now", "every validity"])
async def test_the_walk_reads_from_the_index_what_it_read_from_the_entities(
    store: Neo4jStore, group_id: str, scope: str
) -> None:
    """The walk's read of a seed's facts from the fact index (its end and validity words)
    gives the rows of the read from the entity's node: the same facts, cut the same way."""
    log = incident_log(group_id, subjects=30, changes=12)
    middle = await _middle_of_ingestion(store, group_id)
    [row] = await store.ex.rows(
        "MATCH (e:Entity) WHERE e.group_id = $group_id "
        "WITH e ORDER BY COUNT { (e)--() } DESC, e.uuid RETURN collect(e.uuid) AS uuids",
        {"group_id": group_id},
    )
    # the most linked entities (a status every ticket took), a ticket, and one with both
    seeds = [row["uuids"][:1], row["uuids"][-1:], row["uuids"][:3] + row["uuids"][-2:]]
    read = 0
    for question in [x for x in log.questions(12, seed=5) if x.valid_at is not None][:4]:
        valid_at = None if scope == "now" else question.valid_at
        known_at = middle if scope in ("as known then", "every validity") else None
        asof = AsOf.resolve(valid_at, known_at, scope == "every validity", None)
        for uuids in seeds:
            for cut in (3, 2**62):
                params = {
                    "group_id": group_id,
                    "uuids": uuids,
                    "per_entity": cut,
                    **scope_params(asof),
                }
                [near] = sq.FACTS_NEAR
                from_nodes = await store.ex.rows(near, params)
                query = sq.walk_fulltext_query(uuids, asof)
                assert query is not None
                indexed = await store.ex.rows(sq.FACTS_NEAR_INDEXED, {**params, "query": query})
                key = lambda r: (r["r"]["uuid"], r["source_uuid"], r["target_uuid"])  # noqa: E731
                assert sorted(map(key, indexed)) == sorted(map(key, from_nodes))
                read += len(from_nodes)
    assert read  # the rows compared are not all empty


async def test_facts_stored_before_the_end_words_get_them_at_setup(
    store: Neo4jStore, group_id: str
) -> None:
    ends = """
    MATCH (s)-[r:RELATES_TO]->(t) WHERE r.group_id = $group_id
    RETURN r.index_ends AS words, s.uuid AS source, t.uuid AS target
    """
    for row in await store.ex.rows(ends, {"group_id": group_id}):
        assert row["words"] == f"{sq.end_word(row['source'])} {sq.end_word(row['target'])}"
    await store.ex.execute(
        "MATCH ()-[r:RELATES_TO]->() WHERE r.group_id = $group_id REMOVE r.index_ends",
        {"group_id": group_id},
    )

    await store.setup(DIM)

    for row in await store.ex.rows(ends, {"group_id": group_id}):
        assert row["words"] == f"{sq.end_word(row['source'])} {sq.end_word(row['target'])}"
