"""Group commit: concurrent writers share one transaction.

Each transaction costs the store a fixed price at commit (the transaction log, the fulltext
and vector index updates) that dwarfs one small episode's rows. ``GroupCommit`` queues the
items submitted while transactions are running and commits them together in the next one, in
the order they were submitted (per key: see ``GroupCommit``); a lone writer is committed at
once, so nothing waits for a timer. When a shared transaction fails, its items are retried
one transaction each, so that an item's failure is its own and never another's.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

# The Neo4j store's episode writes (and community assignments) that arrive while a
# transaction runs share the next one, up to this many calls (an episode or a micro-batch
# each).
MAX_WRITES_PER_TRANSACTION = 32
# Episode-write transactions at once (never two with writes of one group). One: two were no
# faster on two cores (in-process 5,000 records 314-322 against 303-347 events/s; Kafka
# 10,000 records 77.8 against 86.9-93.2) and met deadlocks (NODE_RELATIONSHIP_GROUP_DELETE)
# that the driver retries after about a second.
TRANSACTIONS_IN_FLIGHT = 1


@dataclass
class _Pending(Generic[Item, Result]):
    item: Item
    done: asyncio.Future[Result] = field(repr=False)


class GroupCommit(Generic[Item, Result]):
    """``await submit(item)`` -> its result, from ``commit(items)`` (one transaction for all
    of them, returning one result per item in order).

    Up to ``max_in_flight`` transactions run at once (the store's commit work overlaps the
    next transaction's preparation), but never two holding items of the same ``key``: the
    items of one key are committed in the order they were submitted, each transaction after
    the one before it."""

    def __init__(
        self,
        commit: Callable[[list[Item]], Awaitable[list[Result]]],
        max_items: int,
        *,
        key: Callable[[Item], Hashable] = lambda item: None,
        max_in_flight: int = 1,
    ) -> None:
        if max_items < 1 or max_in_flight < 1:
            raise ValueError("max_items and max_in_flight must be at least 1")
        self._commit = commit
        self._max_items = max_items
        self._key = key
        self._max_in_flight = max_in_flight
        self._queue: list[_Pending[Item, Result]] = []
        self._busy: Counter[Hashable] = Counter()  # keys with items in a running transaction
        self._drainers: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def submit(self, item: Item) -> Result:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # A store reused on another event loop: what the old loop queued is gone with it.
            self._queue, self._busy, self._drainers, self._loop = [], Counter(), set(), loop
        pending: _Pending[Item, Result] = _Pending(item, loop.create_future())
        self._queue.append(pending)
        self._start()
        return await pending.done

    def _start(self) -> None:
        """Start drainers while there is room for a transaction and items wait. A drainer
        takes its items when it runs, so the items submitted meanwhile share its
        transaction."""
        while self._queue and len(self._drainers) < self._max_in_flight:
            assert self._loop is not None
            task = self._loop.create_task(self._drain())
            self._drainers.add(task)

    def _take(self) -> list[_Pending[Item, Result]]:
        """The next items to commit, in submission order: up to ``max_items`` whose key has
        nothing in a running transaction nor an earlier item left in the queue."""
        batch: list[_Pending[Item, Result]] = []
        blocked: set[Hashable] = set()
        rest: list[_Pending[Item, Result]] = []
        for pending in self._queue:
            if pending.done.done():
                continue  # a cancelled caller: dropped
            key = self._key(pending.item)
            if len(batch) >= self._max_items or key in blocked or self._busy[key]:
                blocked.add(key)
                rest.append(pending)
                continue
            batch.append(pending)
        self._queue = rest
        for pending in batch:
            self._busy[self._key(pending.item)] += 1
        return batch

    async def _drain(self) -> None:
        """Transactions of queued items until none can be taken (the rest wait for a key
        another drainer holds; that drainer takes them when its transaction ends)."""
        try:
            while batch := self._take():
                await self._commit_one(batch)
        finally:
            # At once, not in a done callback: a submit right after must see the room.
            self._drainers.discard(asyncio.current_task())

    async def _commit_one(self, batch: list[_Pending[Item, Result]]) -> None:
        """One transaction of ``batch``; its keys are free again afterwards."""
        try:
            await self._commit_batch(batch)
        except BaseException:
            # The drainer itself was cancelled (shutdown): no caller may wait forever.
            for pending in [*batch, *self._queue]:
                pending.done.cancel()
            self._queue = []
            raise
        finally:
            for pending in batch:
                key = self._key(pending.item)
                self._busy[key] -= 1
                if self._busy[key] <= 0:
                    del self._busy[key]

    async def _commit_batch(self, batch: list[_Pending[Item, Result]]) -> None:
        try:
            results = await self._commit([p.item for p in batch])
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0], exception=exc)
                return
            for pending in batch:  # each alone: only the failing item fails
                await self._commit_batch([pending])
            return
        for pending, result in zip(batch, results, strict=True):
            _settle(pending, result=result)


def _settle(
    pending: _Pending[Item, Result],
    *,
    result: Result | None = None,
    exception: BaseException | None = None,
) -> None:
    if pending.done.done():  # the caller was cancelled meanwhile
        return
    if exception is not None:
        pending.done.set_exception(exception)
    else:
        pending.done.set_result(result)  # type: ignore[arg-type]
