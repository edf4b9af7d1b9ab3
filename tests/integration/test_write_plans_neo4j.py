"""An episode write on Neo4j does not pay Cypher planning: its statements keep their plan,
the store plans them when it starts, and nothing in their parameters makes Neo4j plan them
again (it keys a cached plan by the size class of each list or string parameter)."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

import pytest

from benchmarks.graphiti_answers import FairAnswers
from benchmarks.text_feed import FeedIndex, text_feed
from tests.support.fake_llm import ScriptedLLMServer
from tests.support.plan_keys import PlanKeys, plan_leaves, started_store
from tests.unit.test_forget_incremental import DIM, fed, generated
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.llm import LLMClient
from tidegraph.pipelines.community_service import CommunityService
from tidegraph.pipelines.ingest import ingest
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.records.asof import AsOf
from tidegraph.records.episode import Episode
from tidegraph.stores.neo4j import common_queries as cq
from tidegraph.stores.neo4j import lifecycle_queries as lq
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j.asof import as_of_params
from tidegraph.stores.neo4j.communities import group_graph_query
from tidegraph.stores.neo4j.plans import PLANS_AHEAD_GROUP, bound_params
from tidegraph.stores.neo4j.store import Neo4jStore

pytestmark = pytest.mark.integration


async def test_the_store_plans_an_episode_writes_statements_when_it_starts(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, store, planned = await started_store(neo4j_uri, monkeypatch, DIM)
    group = f"plans-{uuidlib.uuid4().hex[:10]}"
    try:
        chain = {
            q.EPISODES_PROCESSED,  # the text write path's reads
            q.RECENT_EPISODES_BEFORE,
            q.READ_BATCHES,
            q.ENTITY_CANDIDATES,
            q.WRITE_STATES,  # and the episode write
            q.WRITE_EPISODES,
        }
        assert chain <= {key[0] for key in planned}
        left = await store.ex.rows(
            "MATCH (n) WHERE n.group_id = $group RETURN count(n) AS n", {"group": PLANS_AHEAD_GROUP}
        )
        assert left == [{"n": 0}]

        keys.ran.clear()
        await fed(store, group, generated(12, 5))  # units of 3, then episodes alone
        kept = keys.kept()
        writes = [key for key in keys.ran if key[0] in {q.WRITE_STATES, q.WRITE_EPISODES}]
        assert {key[0] for key in writes} == {q.WRITE_STATES, q.WRITE_EPISODES}
        assert len(writes) > 2  # lists of several sizes
        # every statement that keeps its plan ran under a key planned at start
        assert kept <= planned, sorted((k[0][:80], k[1], k[2]) for k in kept - planned)
    finally:
        await store.forget.delete_group(group)
        await store.close()


async def test_the_text_write_paths_statements_run_as_planned_at_start(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text messages of several groups through the pipeline (the scripted LLM answering from
    the feed's ground truth): each read and write of their chain keeps its plan and runs under
    a key the store planned when it started."""
    keys = PlanKeys().record(monkeypatch)
    feed = text_feed(24, 3, seed=5)
    run = uuidlib.uuid4().hex[:8]
    episodes = [Episode.model_validate(e.envelope(f"plans-{run}-{e.group}")) for e in feed]
    store = Neo4jStore(neo4j_uri)
    answers = FairAnswers(FeedIndex(feed))
    with ScriptedLLMServer(embedding_dim=DIM) as server:
        answers.install(server)
        llm = LLMClient(base_url=server.base_url, api_key="test", model="fake", cache=None)
        try:
            await store.setup(DIM)
            planned = keys.kept()
            keys.ran.clear()
            pipeline = GroupRunner.of(
                store=store, embedder=HashingEmbedder(dim=DIM), llm=llm, mappings=None
            )
            report = await ingest(pipeline, episodes, concurrency=3)
            assert report.episodes == len(episodes) and not report.failures
            kept = keys.kept()
            chain = {
                q.EPISODES_PROCESSED,
                q.RECENT_EPISODES_BEFORE,
                q.READ_BATCHES,
                q.ENTITY_CANDIDATES,
                q.WRITE_STATES,
                q.WRITE_EPISODES,
            }
            assert chain <= {key[0] for key in kept}
            assert kept <= planned, sorted((k[0][:80], k[1], k[2]) for k in kept - planned)
        finally:
            await llm.close()
            for group in {e.group_id for e in episodes}:
                await store.forget.delete_group(group)
            await store.close()


async def test_the_communities_and_the_relay_run_as_planned_at_start(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a worker runs besides the chain, on a group that has facts and unpublished
    changes: a community refresh (its read of the group's facts and its MERGE of the
    communities too), the community assignment of new entities (for every batch) and the
    change relay's round (the logs, the rows, the cursors moved) keep their plans and run
    under a key the store planned when it started: nothing the worker runs is planned again
    as the communities come and go (docs/performance.md, "The stall of the whole worker")."""
    keys, store, planned = await started_store(neo4j_uri, monkeypatch, DIM)
    group = f"plans-{uuidlib.uuid4().hex[:10]}"
    try:
        await fed(store, group, generated(12, 5))
        service = CommunityService(store)

        keys.ran.clear()
        await service.refresh(group, trigger="initial")
        entities, _ = await store.communities.entity_graph(group)
        choices = await service.assign_many(group, entities)
        assert any(choices)  # an assignment written, not only read
        [log] = await store.outbox.change_logs([group], unpublished=True, own=True)
        published = await store.outbox.unpublished_changes([group], log.seq)
        assert published
        await store.outbox.mark_published(published)
        assert [c.published for c in await store.outbox.change_logs([group])] == [log.seq]

        kept = keys.kept()
        statements = {
            cq.GROUP_ENTITY_UUIDS,  # a refresh
            cq.GROUP_COMMUNITIES,
            cq.GROUP_COMMUNITY_MEMBERS,
            cq.COMMUNITY_GROUPS,
            cq.DROP_MEMBERSHIPS,
            cq.ADD_MEMBERSHIPS,
            q.UPSERT_COMMUNITIES,
            q.COMMUNITIES_OF,  # the assignment
            q.ASSIGN_MEMBERS,
            lq.CHANGE_LOGS,  # the relay
            lq.UNPUBLISHED_CHANGES,
            lq.MARK_PUBLISHED,
        }
        ran = {key[0] for key in keys.ran}
        assert statements <= {key[0] for key in kept}, statements - ran
        assert {key[0] for key in keys.ran} - {key[0] for key in kept} == set()
        assert kept <= planned, sorted((k[0][:80], k[1], k[2]) for k in kept - planned)
    finally:
        await store.forget.delete_group(group)
        await store.close()


async def test_a_refreshs_kept_plans_find_by_index(
    neo4j_uri: str, neo4j_driver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plans a refresh keeps are made when the store starts, maybe on an empty store: its
    read of the group's facts starts from the facts' group index and its MERGE finds each
    community by its unique uuid, so that the plans stay right on a full store."""
    _, store, _ = await started_store(neo4j_uri, monkeypatch, DIM)
    await store.close()
    asof = AsOf.resolve(None, None, False, None)
    expected = {
        group_graph_query(asof): (as_of_params("g", asof), "DirectedRelationshipIndexSeek"),
        q.UPSERT_COMMUNITIES: ({"group_id": "g", "rows": []}, "NodeUniqueIndexSeek(Locking)"),
    }
    for statement, (params, seek) in expected.items():
        async with neo4j_driver.session() as session:
            result = await session.run("EXPLAIN " + statement, bound_params(statement, params))
            plan = (await result.consume()).plan

        assert seek in plan_leaves(plan), (statement[:60], plan_leaves(plan))
