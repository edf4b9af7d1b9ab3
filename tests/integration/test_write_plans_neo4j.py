"""An episode write on Neo4j does not pay Cypher planning: its statements keep their plan,
the store plans them when it starts, and nothing in their parameters makes Neo4j plan them
again (it keys a cached plan by the size of each list or string parameter)."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

import pytest

from tests.unit.test_forget_incremental import DIM, fed, generated
from tidegraph.stores.executor import Params, Row
from tidegraph.stores.neo4j import executor
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j.forget import PLANS_AHEAD_GROUP
from tidegraph.stores.neo4j.store import Neo4jStore

pytestmark = pytest.mark.integration


async def test_the_store_plans_an_episode_writes_statements_when_it_starts(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[str, Params]] = []
    tx_rows = executor._Transaction.rows

    async def in_tx(
        self: executor._Transaction, query: str, params: Params | None = None
    ) -> list[Row]:
        ran.append((query, params or {}))
        return await tx_rows(self, query, params)

    monkeypatch.setattr(executor._Transaction, "rows", in_tx)
    store = Neo4jStore(neo4j_uri)
    group = f"plans-{uuidlib.uuid4().hex[:10]}"
    try:
        await store.setup(DIM)
        planned = {query for query, _ in ran if query.startswith(q.KEEP_PLAN)}
        assert {q.WRITE_STATES, q.WRITE_EPISODES} <= planned
        left = await store.ex.rows(
            "MATCH (n) WHERE n.group_id = $group RETURN count(n) AS n", {"group": PLANS_AHEAD_GROUP}
        )
        assert left == [{"n": 0}]

        ran.clear()
        await fed(store, group, generated(12, 5))  # units of 3, then episodes alone
        writes = [(query, params) for query, params in ran if query in planned]
        assert {query for query, _ in writes} == {q.WRITE_STATES, q.WRITE_EPISODES}
        # Every run of a statement gives Neo4j the same cache key: no list as a parameter of
        # its own, and each string the same (their sizes are in the key).
        for query in (q.WRITE_STATES, q.WRITE_EPISODES):
            runs = [params for text, params in writes if text == query]
            assert len(runs) > 1
            assert not any(isinstance(v, list) for params in runs for v in params.values())
            assert len({_strings(params) for params in runs}) == 1
    finally:
        await store.forget.delete_group(group)
        await store.close()


def _strings(params: Params) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in params.items() if isinstance(v, str)))
