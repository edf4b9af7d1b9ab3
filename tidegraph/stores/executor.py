"""What the shared store core (``tidegraph.stores.neo4j.core``) needs of an engine: run a query and
get its rows, run a write transaction, count failures and time writes. One executor per
engine: ``neo4j.executor.Neo4jExecutor`` (the embedded store runs its SQL on its own
thread: ``sqlite_db``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from tidegraph.metrics import STORE_BATCH_SIZE, STORE_ERRORS, STORE_WRITE_LATENCY

T = TypeVar("T")
# One row of a query's answer: column name -> value (as the engine's driver returns it).
Row = dict[str, Any]
Params = dict[str, Any]


class Tx(Protocol):
    """One open write transaction."""

    async def rows(self, query: str, params: Params | None = None) -> list[Row]: ...


class Executor(Protocol):
    async def rows(self, query: str, params: Params | None = None) -> list[Row]:
        """A read, alone."""
        ...

    async def write(self, operation: str, size: int, work: Callable[[Tx], Awaitable[T]]) -> T:
        """``work`` in one write transaction (committed when it returns, rolled back when it
        raises); ``operation`` and ``size`` (rows written) label the write's metrics."""
        ...

    async def close(self) -> None: ...


@contextmanager
def observe_write(operation: str, rows: int) -> Iterator[None]:
    """Record one write transaction's size and latency."""
    STORE_BATCH_SIZE.labels(operation).observe(rows)
    with STORE_WRITE_LATENCY.labels(operation).time():
        yield


@contextmanager
def count_errors(transient: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Count engine failures in STORE_ERRORS, ``transient`` ones apart (caller mistakes,
    ValueError, are not counted)."""
    try:
        yield
    except ValueError:
        raise
    except transient:
        STORE_ERRORS.labels("transient").inc()
        raise
    except Exception:
        STORE_ERRORS.labels("other").inc()
        raise
