"""Per-key FIFO lanes: jobs of one key run strictly in submission order, different keys run
concurrently, and at most ``capacity`` jobs are admitted at once (``submit`` waits for a
free slot: backpressure on the Kafka intake).

A micro-batch's records are submitted to the lane of their group_id. There is no barrier
between batches: a group whose record is slow (an LLM retry in backoff) holds up only the
later records of that group, never the other groups, and the next batch starts as soon as
there is room.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable

Job = Callable[[], Awaitable[None]]


class KeyedLanes:
    def __init__(self, capacity: int, on_error: Callable[[BaseException], None]) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._slots = asyncio.Semaphore(capacity)
        self._tails: dict[Hashable, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_error = on_error

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def submit(self, key: Hashable, job: Job) -> None:
        """Admit ``job`` after the jobs already submitted for ``key``."""
        await self._slots.acquire()
        previous = self._tails.get(key)
        task = asyncio.create_task(self._run(previous, job))
        self._tails[key] = task
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._finished(key, done))

    @staticmethod
    async def _run(previous: asyncio.Task[None] | None, job: Job) -> None:
        if previous is not None:
            await asyncio.wait([previous])  # order only; its failure is reported by itself
        await job()

    def _finished(self, key: Hashable, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()
        if self._tails.get(key) is task:
            del self._tails[key]
        if not task.cancelled() and task.exception() is not None:
            self._on_error(task.exception())  # type: ignore[arg-type]

    async def drain(self) -> None:
        """Wait until every admitted job has finished."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def cancel(self) -> None:
        """Cancel every admitted job (their records stay unacked and are redelivered)."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
