"""Per-key FIFO lanes: jobs of one key run strictly in submission order, different keys run
concurrently; at most ``capacity`` jobs are admitted at once and at most ``per_key`` for one
key (``submit`` waits: backpressure on the Kafka intake).

A micro-batch's records are submitted to the lane of their group_id. There is no barrier
between batches: a group whose record is slow (an LLM retry in backoff) holds up only the
later records of that group, never the other groups, and the next batch starts as soon as
there is room. ``per_key`` bounds how long finishing everything admitted can take (the
rebalance and shutdown path): one busy group cannot queue a whole backlog.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

Job = Callable[[], Awaitable[None]]
T = TypeVar("T")


class KeyedLanes:
    def __init__(
        self,
        capacity: int,
        on_error: Callable[[BaseException], None],
        *,
        per_key: int | None = None,
    ) -> None:
        if capacity < 1 or (per_key is not None and per_key < 1):
            raise ValueError("capacity and per_key must be at least 1")
        self._slots = asyncio.Semaphore(capacity)
        self._per_key = per_key
        self._depth: Counter[Hashable] = Counter()
        self._room = asyncio.Condition()
        self._tails: dict[Hashable, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_error = on_error
        self._closed = False
        self._on_cancel: list[Callable[[], None]] = []

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        """Whether submissions are dropped (until :meth:`reopen`)."""
        return self._closed

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once :meth:`cancel` has cancelled the jobs."""
        self._on_cancel.append(callback)

    async def submit(self, key: Hashable, job: Job) -> bool:
        """Admit ``job`` after the jobs already submitted for ``key``; False when it was
        dropped (not run) because the lanes are closed."""
        per_key = self._per_key
        if per_key is not None:
            async with self._room:
                await self._room.wait_for(lambda: self._depth[key] < per_key)
        await self._slots.acquire()
        if self._closed:
            self._slots.release()
            return False
        previous = self._tails.get(key)
        task = asyncio.create_task(self._run(previous, job))
        self._tails[key] = task
        self._tasks.add(task)
        self._depth[key] += 1
        task.add_done_callback(lambda done: self._finished(key, done))
        return True

    @staticmethod
    async def _run(previous: asyncio.Task[None] | None, job: Job) -> None:
        if previous is not None:
            await asyncio.wait([previous])  # order only; its failure is reported by itself
        await job()

    def _finished(self, key: Hashable, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()
        self._depth[key] -= 1
        if self._depth[key] <= 0:
            del self._depth[key]
        if self._tails.get(key) is task:
            del self._tails[key]
        if self._per_key is not None:
            asyncio.ensure_future(self._notify_room())
        if not task.cancelled() and task.exception() is not None:
            self._on_error(task.exception())  # type: ignore[arg-type]

    async def _notify_room(self) -> None:
        async with self._room:
            self._room.notify_all()

    async def drain(self) -> None:
        """Wait until every admitted job has finished."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def quiesce(self) -> None:
        """Finish every admitted job; drop later submissions until :meth:`reopen`."""
        self._closed = True
        await self.drain()

    def reopen(self) -> None:
        self._closed = False

    async def cancel(self) -> None:
        """Cancel every admitted job (their records stay unacked and are redelivered)."""
        self._closed = True
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for callback in self._on_cancel:
            callback()


class KeyedBacklog(Generic[T]):
    """Items of each key waiting for a job of their key's lane. A job takes whatever of its
    key is waiting when it starts (at most ``most``). A stage that keeps up runs each
    micro-batch's items as they came; one that falls behind runs larger jobs, one store read
    and one write for many records instead of many small ones, without waiting for anything
    that has not arrived.

    A key gets a new job only when the jobs admitted for it and not yet started could not take
    everything waiting (``needs_job``): items that arrive while a job of their key waits for
    its turn join that job. A job per micro-batch would hold a place in the lanes (their
    ``capacity``) only to find nothing left, and a stage whose places are all held takes
    nothing more from Kafka until one frees."""

    def __init__(self, most: int) -> None:
        if most < 1:
            raise ValueError("most must be at least 1")
        self.most = most
        self._waiting: dict[Hashable, list[T]] = {}
        self._pending: Counter[Hashable] = Counter()  # jobs admitted, not started

    def add(self, key: Hashable, items: list[T]) -> None:
        if len(items) > self.most:
            raise ValueError(f"at most {self.most} items of a key at once, not {len(items)}")
        self._waiting.setdefault(key, []).extend(items)

    def needs_job(self, key: Hashable) -> bool:
        """Whether the jobs admitted for ``key`` and not started leave items of it waiting."""
        return self.waiting(key) > self._pending[key] * self.most

    def admitted(self, key: Hashable) -> None:
        """A job of ``key`` was admitted to its lane (it takes when it starts)."""
        self._pending[key] += 1

    def take(self, key: Hashable, keep: Callable[[T], bool] = lambda _: True) -> list[T]:
        """A job of ``key`` starts: the first ``most`` items of ``key`` that ``keep``
        accepts, in the order they were added; the items it refuses are dropped."""
        if self._pending[key] > 0:
            self._pending[key] -= 1
        if self._pending[key] <= 0:
            del self._pending[key]
        waiting = [item for item in self._waiting.pop(key, []) if keep(item)]
        taken, rest = waiting[: self.most], waiting[self.most :]
        if rest:
            self._waiting[key] = rest
        return taken

    def clear(self) -> None:
        """Drop every waiting item (their jobs were let go)."""
        self._waiting.clear()
        self._pending.clear()

    def waiting(self, key: Hashable) -> int:
        return len(self._waiting.get(key, ()))
