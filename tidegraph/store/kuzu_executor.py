"""How the embedded store runs its queries on kuzu 0.11.3, which is synchronous and not
thread-safe: every statement runs on the executor's one thread, one call at a time (an asyncio
lock), so the event loop is never blocked and a transaction's statements never interleave with
another call's. Also here: the prepared-statement cache, naive-UTC parameters, and the
checkpoints and reopening that keep a long ingest inside kuzu's memory (see the constants)."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import kuzu

from tidegraph.metrics import STORE_MAINTENANCE_LATENCY
from tidegraph.records.times import utc
from tidegraph.store.executor import Params, Row, Tx, count_errors, observe_write

T = TypeVar("T")
P = ParamSpec("P")

DB_FILE = "graph.kuzu"
# Checkpoint once the WAL holds this much: kuzu keeps every uncheckpointed change (with its
# vector and fulltext index updates) in the buffer pool, and a long ingest into one database
# otherwise exhausts the pool and crashes the process (kuzu's default threshold is 16 MiB).
CHECKPOINT_THRESHOLD_BYTES = 4 * 1024 * 1024
# Every checkpoint in kuzu 0.11.3 leaks the buffer manager's handle on the shadow file, with
# the frame groups it took (about 9 MiB of the database's address space for a one-row
# checkpoint, more for larger ones); a database that runs out fails every write ("No more
# frame groups can be added to the allocator") and then segfaults. Closing the database returns
# all of it, so the store checkpoints by itself (auto-checkpoint off) and reopens the database
# after this many checkpoints. (Not what crashed the 512 MiB buffer pool at about 47,000
# records of the throughput benchmark's feed: that is a checkpoint running out of pool, see
# README Performance; 2 GiB finishes 50,000.)
REOPEN_AFTER_CHECKPOINTS = 16
# Prepared statements kept (the queries are constants: a few dozen texts).
MAX_PREPARED_STATEMENTS = 256


def _naive(value: Any) -> Any:
    """Parameters for kuzu: aware datetimes become naive UTC (kuzu drops offsets)."""
    if isinstance(value, datetime):
        return utc(value).replace(tzinfo=None)
    if isinstance(value, dict):
        return {k: _naive(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_naive(v) for v in value]
    return value


class KuzuDatabase:
    """The database folder, opened on first use. Synchronous: only the executor's thread
    calls it (``KuzuExecutor.run`` hands it to the functions it runs)."""

    def __init__(self, folder: Path, buffer_pool_bytes: int, max_db_bytes: int | None) -> None:
        self.folder = folder
        self._buffer_pool = buffer_pool_bytes
        self._max_db_size = max_db_bytes  # None: kuzu's own default (8 TiB of address space)
        self._db: kuzu.Database | None = None
        self._conn: kuzu.Connection | None = None
        self._closed = False
        self._checkpoints_since_open = 0
        self._statements: dict[str, kuzu.PreparedStatement] = {}

    def _connection(self) -> kuzu.Connection:
        if self._conn is None:
            if self._closed:
                raise RuntimeError("the kuzu store is closed")
            self.folder.mkdir(parents=True, exist_ok=True)
            limits: dict[str, Any] = (
                {} if self._max_db_size is None else {"max_db_size": self._max_db_size}
            )
            self._db = kuzu.Database(
                str(self.folder / DB_FILE),
                buffer_pool_size=self._buffer_pool,
                auto_checkpoint=False,  # checkpoint_if_due
                **limits,
            )
            self._conn = kuzu.Connection(self._db)
            self._checkpoints_since_open = 0
        return self._conn

    def rows(self, query: str, params: Params | None = None) -> list[Row]:
        """One statement's rows (column name -> value)."""
        connection = self._connection()
        if params:
            result = connection.execute(self._prepared(connection, query), _naive(params))
        else:
            result = connection.execute(query)
        if not isinstance(result, kuzu.QueryResult):  # several statements: never sent
            raise TypeError("one statement per query")
        try:
            columns = result.get_column_names()
            return [dict(zip(columns, row, strict=True)) for row in result.get_all()]
        finally:
            result.close()

    def _prepared(self, connection: kuzu.Connection, query: str) -> kuzu.PreparedStatement:
        """The query prepared once and reused: kuzu 0.11.3 never frees the statement it
        prepares for each call with parameters (~11 KB a call: gigabytes over a long ingest),
        and preparing is a good part of a small query's time."""
        statement = self._statements.get(query)
        if statement is None:
            if len(self._statements) >= MAX_PREPARED_STATEMENTS:
                self._statements.clear()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # prepare() is deprecated
                statement = self._statements[query] = connection.prepare(query)
        return statement

    def forget_statements(self) -> None:
        """Drop the prepared statements (after a schema change)."""
        self._statements.clear()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.rows("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            self.rollback()
            raise
        self.rows("COMMIT")

    def rollback(self) -> None:
        with suppress(RuntimeError):  # a failed statement has already rolled it back
            self.rows("ROLLBACK")

    def checkpoint_if_due(self) -> None:
        """Checkpoint once the WAL passes the threshold (what kuzu's auto-checkpoint does at
        commit) and reopen the database every ``REOPEN_AFTER_CHECKPOINTS`` checkpoints."""
        try:
            wal_bytes = (self.folder / f"{DB_FILE}.wal").stat().st_size
        except FileNotFoundError:
            return
        if wal_bytes < CHECKPOINT_THRESHOLD_BYTES:
            return
        with STORE_MAINTENANCE_LATENCY.labels("kuzu", "checkpoint").time():
            self.rows("CHECKPOINT")
        self._checkpoints_since_open += 1
        if self._checkpoints_since_open >= REOPEN_AFTER_CHECKPOINTS:
            with STORE_MAINTENANCE_LATENCY.labels("kuzu", "reopen").time():
                self._release()
                self._connection()

    def close(self) -> None:
        self._closed = True
        self._release()

    def _release(self) -> None:
        """Close the connection and the database (kuzu checkpoints on close)."""
        self._statements.clear()
        if self._conn is not None:
            self._conn.close()
        if self._db is not None:
            self._db.close()
        self._conn = self._db = None


class _Transaction:
    """``Tx`` inside ``KuzuExecutor.write``: each statement on the executor's thread."""

    def __init__(self, executor: KuzuExecutor) -> None:
        self._executor = executor

    async def rows(self, query: str, params: Params | None = None) -> list[Row]:
        return await self._executor._on_thread(self._executor.db.rows, query, params)


class KuzuExecutor:
    """``Executor`` on a ``KuzuDatabase``: one thread, one call at a time."""

    def __init__(self, folder: Path, buffer_pool_mb: int, max_db_size_mb: int | None) -> None:
        max_db = None if max_db_size_mb is None else max_db_size_mb * 1024 * 1024
        self.db = KuzuDatabase(Path(folder), buffer_pool_mb * 1024 * 1024, max_db)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kuzu")
        self._lock = asyncio.Lock()

    async def _on_thread(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.wrap_future(self._thread.submit(fn, *args, **kwargs))

    async def rows(self, query: str, params: Params | None = None) -> list[Row]:
        return await self.run(lambda db: db.rows(query, params))

    async def run(
        self, fn: Callable[Concatenate[KuzuDatabase, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn(db, ...)`` on the thread, alone: a read, or statements it groups itself."""
        async with self._lock:
            with count_errors():
                return await self._on_thread(fn, self.db, *args, **kwargs)

    async def run_write(
        self,
        operation: str,
        size: int,
        fn: Callable[Concatenate[KuzuDatabase, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """A write as one function on the thread (it opens its transactions), then a
        checkpoint if the WAL has grown past the threshold."""

        def write(db: KuzuDatabase) -> T:
            result = fn(db, *args, **kwargs)
            db.checkpoint_if_due()
            return result

        with observe_write(operation, size):
            return await self.run(write)

    async def write(self, operation: str, size: int, work: Callable[[Tx], Awaitable[T]]) -> T:
        """``work`` in one transaction under the lock, each of its statements on the thread
        (the shared core's writes, a few statements each)."""
        with observe_write(operation, size):
            async with self._lock:
                with count_errors():
                    await self._on_thread(self.db.rows, "BEGIN TRANSACTION")
                    try:
                        result = await work(_Transaction(self))
                    except BaseException:
                        # Queued on the one thread: it runs before any later statement, even
                        # when this task is cancelled while it waits.
                        await self._on_thread(self.db.rollback)
                        raise
                    await self._on_thread(self.db.rows, "COMMIT")
                    await self._on_thread(self.db.checkpoint_if_due)
                    return result

    async def close(self) -> None:
        async with self._lock:
            await self._on_thread(self.db.close)
        self._thread.shutdown(wait=False)
