"""The episode write keeps its Cypher plan on Neo4j: planned again whenever the writes had
moved the statistics, it took seconds on a loaded machine, and every transaction of the group
commit waited for it (the tail of produce→queryable, docs/performance.md). A kept plan must
stay right as the store grows: every lookup it makes is an index seek."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from neo4j import AsyncGraphDatabase

from tests.integration.test_delivery_order_stores import DIM
from tests.unit.test_forget_incremental import fed, generated
from tidegraph.stores.executor import Params, Row
from tidegraph.stores.neo4j import executor
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j.queries import KEEP_PLAN
from tidegraph.stores.neo4j.store import Neo4jStore

pytestmark = pytest.mark.integration

# Operators that read every node or relationship of a label or type: a plan made on an empty
# store with one of them would slow down with the store's size.
SCANS = ("AllNodesScan", "NodeByLabelScan", "RelationshipTypeScan", "DirectedAllRelationshipsScan")


@pytest.fixture
async def neo4j_store(neo4j_uri: str) -> AsyncIterator[Neo4jStore]:
    store = Neo4jStore(neo4j_uri)
    await store.setup(DIM)
    yield store
    await store.close()


def operators(plan: dict[str, Any]) -> list[str]:
    return [plan["operatorType"], *(op for c in plan.get("children", []) for op in operators(c))]


async def test_every_statement_of_the_episode_write_keeps_its_plan(
    neo4j_store: Neo4jStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    tx_rows = executor._Transaction.rows

    async def in_tx(
        self: executor._Transaction, query: str, params: Params | None = None
    ) -> list[Row]:
        ran.append(query)
        return await tx_rows(self, query, params)

    monkeypatch.setattr(executor._Transaction, "rows", in_tx)
    group = f"plans-{uuidlib.uuid4().hex[:10]}"
    try:
        await fed(neo4j_store, group, generated(6, 1))
        writes = [query for query in ran if query in (q.WRITE_STATES, q.WRITE_EPISODES)]
        assert q.WRITE_STATES in writes and q.WRITE_EPISODES in writes
        assert all(query.startswith(KEEP_PLAN) for query in writes)
    finally:
        await neo4j_store.forget.delete_group(group)


@pytest.mark.parametrize("name", ["WRITE_STATES", "WRITE_EPISODES"])
async def test_the_kept_plans_of_the_episode_write_seek_by_index(
    neo4j_store: Neo4jStore, neo4j_uri: str, name: str
) -> None:
    # The store is set up (its indexes exist); EXPLAIN plans without the parameters (the
    # server's note that they are missing is not wanted here).
    driver = AsyncGraphDatabase.driver(neo4j_uri, notifications_min_severity="OFF")
    try:
        async with driver.session() as session:
            result = await session.run("EXPLAIN " + getattr(q, name))
            summary = await result.consume()
    finally:
        await driver.close()
    assert summary.plan is not None
    ops = [op.split("@")[0] for op in operators(summary.plan)]
    assert not [op for op in ops if op in SCANS], ops
    assert any("Seek" in op for op in ops)
