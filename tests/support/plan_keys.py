"""The keys Neo4j looks its cached plans up by, recorded from what the Neo4j store sends: the
tests of statements that keep their plan (``tidegraph.stores.neo4j.plans``) check that what a
write or a forget runs was planned when the store started."""

from __future__ import annotations

import math
import weakref
from typing import Any

import pytest

from tidegraph.stores.executor import Params, Row
from tidegraph.stores.neo4j import executor
from tidegraph.stores.neo4j.plans import KEEP_PLAN, bound_params
from tidegraph.stores.neo4j.store import Neo4jStore

# What Neo4j keys a cached plan by, as measured on 5.26: the statement, each parameter's type
# with the size class of a list or a string (empty, 1, 2-10, 11-100, ...), and whether the
# transaction has written before it.
PlanKey = tuple[str, tuple[tuple[str, str], ...], bool]


def _size_class(value: object) -> str:
    if isinstance(value, list | str):
        return f"{type(value).__name__}:{math.ceil(math.log10(len(value))) if value else -1}"
    return type(value).__name__


def plan_key(query: str, params: Params | None, written: bool) -> PlanKey:
    """The key of ``query`` run with ``params`` as a caller passes them (the executor's
    ``bound_params`` puts a kept statement's in its one map)."""
    bound = bound_params(query, params or {})
    shape = tuple(sorted((k, _size_class(v)) for k, v in bound.items()))
    return query, shape, written


class PlanKeys:
    """The plan key of every statement the Neo4j store runs while it is recorded, in order."""

    def __init__(self) -> None:
        self.ran: list[PlanKey] = []

    def kept(self) -> set[PlanKey]:
        """The keys of the statements that keep their plan, recorded so far."""
        return {key for key in self.ran if key[0].startswith(KEEP_PLAN)}

    def record(self, monkeypatch: pytest.MonkeyPatch) -> PlanKeys:
        """Records what the store's executor runs, in transactions and as reads."""
        # the transactions that have written (not by id: a later transaction may reuse it)
        written: weakref.WeakSet[Any] = weakref.WeakSet()

        async def in_tx(
            tx: executor._Transaction, query: str, params: Params | None = None
        ) -> list[Row]:
            self.ran.append(plan_key(query, params, tx._tx in written))
            result = await tx._tx.run(query, bound_params(query, params or {}))
            rows = [dict(record) async for record in result]
            if (await result.consume()).counters.contains_updates:
                written.add(tx._tx)
            return rows

        read_rows = executor.Neo4jExecutor.rows

        async def read(
            ex: executor.Neo4jExecutor, query: str, params: Params | None = None
        ) -> list[Row]:
            self.ran.append(plan_key(query, params, False))
            return await read_rows(ex, query, params)

        monkeypatch.setattr(executor._Transaction, "rows", in_tx)
        monkeypatch.setattr(executor.Neo4jExecutor, "rows", read)
        return self


async def started_store(
    uri: str, monkeypatch: pytest.MonkeyPatch, dim: int
) -> tuple[PlanKeys, Neo4jStore, set[PlanKey]]:
    """A Neo4j store set up while what it runs is recorded: the recorder, the store (closed
    here if its setup fails) and the keys of the statements it planned when it started."""
    keys = PlanKeys().record(monkeypatch)
    store = Neo4jStore(uri)
    try:
        await store.setup(dim)
    except BaseException:
        await store.close()
        raise
    return keys, store, keys.kept()


def plan_leaves(plan: dict[str, Any]) -> list[str]:
    """The operators an ``EXPLAIN``'s plan starts from (its leaves, left to right), without
    their runtime suffix: where a statement finds its first rows (an index seek, a scan)."""
    children = plan.get("children") or []
    if not children:
        return [plan["operatorType"].split("@")[0]]
    return [leaf for child in children for leaf in plan_leaves(child)]
