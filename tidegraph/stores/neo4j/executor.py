"""How the Neo4j store runs its queries, on the official async driver: reads as auto-commit
queries of a read session (one round trip; a transient failure is tried once more), writes
as managed transactions (``execute_write`` retries transient errors), schema statements
alone, failures counted in STORE_ERRORS."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from neo4j import READ_ACCESS, AsyncDriver, AsyncManagedTransaction, AsyncTransaction
from neo4j.exceptions import ClientError, ServiceUnavailable, SessionExpired, TransientError

from tidegraph.stores.executor import Params, Row, Tx, count_errors, observe_write
from tidegraph.stores.neo4j.plans import bound_params

T = TypeVar("T")

_TRANSIENT = (TransientError, ServiceUnavailable, SessionExpired)
# Another process may create the same schema rule between our check and our create.
_ALREADY_EXISTS = frozenset(
    {
        "Neo.ClientError.Schema.EquivalentSchemaRuleAlreadyExists",
        "Neo.ClientError.Schema.IndexAlreadyExists",
        "Neo.ClientError.Schema.ConstraintAlreadyExists",
    }
)


class _QuietList(list[Any]):
    """A list parameter whose repr is its length (see ``driver_params``)."""

    def __repr__(self) -> str:
        return f"<list of {len(self)}>"


class _QuietMap(dict[str, Any]):
    """A map parameter whose repr is its keys (see ``driver_params``)."""

    def __repr__(self) -> str:
        return f"<map of {', '.join(self)}>"


def driver_params(statement: str, params: Params) -> Params:
    """The parameters handed to the driver for ``statement``: ``bound_params``, each list or
    map among them in a subclass whose repr is short. The driver formats every RUN message
    for its debug log before the logger checks its level (``AsyncBolt5x5.run`` in
    neo4j/_async/io/_bolt/_bolt5.py, driver 6.4), so each query repr'd all its values:
    0.15 ms an embedding of 384 numbers; a statement of 50 rows with one each took 13 ms of
    the client's CPU, 2 ms without (docs/performance.md, "The driver's debug line"). Each
    is copied one level deep (its references); the driver packs subclasses of list and dict
    as lists and maps. The top-level dict cannot be the subclass: the driver copies it into
    a plain one."""
    bound = bound_params(statement, params)
    return {name: _quiet(value) for name, value in bound.items()}


def _quiet(value: Any) -> Any:
    if isinstance(value, dict):
        return _QuietMap(value)
    if isinstance(value, list | tuple):
        return _QuietList(value)
    return value


class _Transaction:
    """``Tx`` over one transaction."""

    def __init__(self, tx: AsyncManagedTransaction | AsyncTransaction) -> None:
        self._tx = tx

    async def rows(self, query: str, params: Params | None = None) -> list[Row]:
        result = await self._tx.run(query, driver_params(query, params or {}))
        return [dict(record) async for record in result]


# Queries in flight at once per store. Beyond the driver's connection pool (100) its waiters
# queue on a lock whose cost grows with their number: a server answering 100 searches at once
# (a dozen queries each) spent a quarter of its CPU there. Waiting here is cheap.
MAX_CONCURRENT_QUERIES = 32


class Neo4jExecutor:
    """``Executor`` on one driver and database (the driver is closed with it)."""

    def __init__(self, driver: AsyncDriver, database: str) -> None:
        self._driver = driver
        self._database = database
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_QUERIES)

    async def reachable(self) -> None:
        """Raises at once (ServiceUnavailable) when the server does not answer: a query would
        retry for the driver's retry time first (30 s)."""
        await self._driver.verify_connectivity()

    async def rows(self, query: str, params: Params | None = None) -> list[Row]:
        """A read's rows. An auto-commit query: ``execute_query`` wrapped each read in a
        transaction, a round trip more (BEGIN, then COMMIT) and about 40 % more of the
        client's CPU a query; a search makes a dozen."""
        with count_errors(_TRANSIENT):
            async with self._slots:
                try:
                    return await self._read(query, params or {})
                except _TRANSIENT:  # a restart or a leader moving: once more
                    return await self._read(query, params or {})

    async def _read(self, query: str, params: Params) -> list[Row]:
        async with self._driver.session(
            database=self._database, default_access_mode=READ_ACCESS
        ) as session:
            result = await session.run(query, driver_params(query, params))
            return [dict(record) async for record in result]

    async def write(self, operation: str, size: int, work: Callable[[Tx], Awaitable[T]]) -> T:
        with observe_write(operation, size):
            return await self.transaction(work)

    async def transaction(self, work: Callable[[Tx], Awaitable[T]]) -> T:
        """``work`` in one managed write transaction (retried on transient errors), unlabelled
        (the group commit labels its own)."""

        async def run(tx: AsyncManagedTransaction) -> T:
            return await work(_Transaction(tx))

        with count_errors(_TRANSIENT):
            async with self._slots, self._driver.session(database=self._database) as session:
                return await session.execute_write(run)

    async def rehearse(self, work: Callable[[Tx], Awaitable[None]]) -> None:
        """``work`` in one write transaction that is then rolled back: the server plans and
        caches its statements, and nothing it wrote stays."""
        with count_errors(_TRANSIENT):
            async with self._slots, self._driver.session(database=self._database) as session:
                tx = await session.begin_transaction()
                try:
                    await work(_Transaction(tx))
                finally:
                    await tx.rollback()

    async def batched(self, statement: str, params: Params) -> list[Row]:
        """A write statement that commits its own batches (``CALL ... IN TRANSACTIONS``): it
        must run as an auto-commit query in a write session. Not retried: such a statement
        is written to be run again after an interruption."""
        with count_errors(_TRANSIENT):
            async with self._slots, self._driver.session(database=self._database) as session:
                result = await session.run(statement, driver_params(statement, params))
                return [dict(record) async for record in result]

    async def execute(self, statement: str, params: Params, *, schema: bool = False) -> None:
        """One statement in its own auto-commit transaction; ``schema``: a rule that already
        exists is not an error."""
        with count_errors(_TRANSIENT):
            try:
                await self._driver.execute_query(
                    statement, driver_params(statement, params), database_=self._database
                )
            except ClientError as exc:
                if not schema or exc.code not in _ALREADY_EXISTS:
                    raise

    async def close(self) -> None:
        await self._driver.close()
