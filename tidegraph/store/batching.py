"""Group commit: concurrent writers share one transaction.

Each transaction costs the store a fixed price at commit (the transaction log, the fulltext
and vector index updates) that dwarfs one small episode's rows. ``GroupCommit`` queues the
items submitted while a transaction is running and commits them together in the next one, in
the order they were submitted; a lone writer is committed at once, so nothing waits for a
timer. When a shared transaction fails, its items are retried one transaction each, so that
an item's failure is its own and never another's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _Pending(Generic[Item, Result]):
    item: Item
    done: asyncio.Future[Result] = field(repr=False)


class GroupCommit(Generic[Item, Result]):
    """``await submit(item)`` -> its result, from ``commit(items)`` (one transaction for all
    of them, returning one result per item in order)."""

    def __init__(
        self, commit: Callable[[list[Item]], Awaitable[list[Result]]], max_items: int
    ) -> None:
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self._commit = commit
        self._max_items = max_items
        self._queue: list[_Pending[Item, Result]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Result:
        loop = asyncio.get_running_loop()
        if self._drainer is not None and self._drainer.get_loop() is not loop:
            # A store reused on another event loop: what the old loop queued is gone with it.
            self._queue, self._drainer = [], None
        pending: _Pending[Item, Result] = _Pending(item, loop.create_future())
        self._queue.append(pending)
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        return await pending.done

    async def _drain(self) -> None:
        batch: list[_Pending[Item, Result]] = []
        try:
            while self._queue:
                batch = self._queue[: self._max_items]
                del self._queue[: self._max_items]
                live = [p for p in batch if not p.done.done()]  # a cancelled caller: dropped
                if live:
                    await self._commit_batch(live)
        except BaseException:
            # The drainer itself was cancelled (shutdown): no caller may wait forever.
            for pending in [*batch, *self._queue]:
                pending.done.cancel()
            self._queue = []
            raise

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
