"""An episode write on Neo4j does not pay Cypher planning: its statements keep their plan,
the store plans them when it starts, and nothing in their parameters makes Neo4j plan them
again (it keys a cached plan by the size class of each list or string parameter)."""

from __future__ import annotations

import uuid as uuidlib

import pytest

from tests.support.plan_keys import PlanKeys
from tests.unit.test_forget_incremental import DIM, fed, generated
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j.plans import PLANS_AHEAD_GROUP
from tidegraph.stores.neo4j.store import Neo4jStore

pytestmark = pytest.mark.integration


async def test_the_store_plans_an_episode_writes_statements_when_it_starts(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = PlanKeys().record(monkeypatch)
    store = Neo4jStore(neo4j_uri)
    group = f"plans-{uuidlib.uuid4().hex[:10]}"
    try:
        await store.setup(DIM)
        planned = keys.kept()
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
