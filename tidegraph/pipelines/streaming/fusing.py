"""Mapped records written in the extraction hop, when nothing of their group is on its way to
the write hop (docs/streaming.md "Why two hops").

A record a declared mapping extracts needs no LLM, so the hop to ``{prefix}.extracted`` only
costs it a produce, a consume, a commit and the write hop's micro-batch wait. The extraction
hop writes such records itself, through the write hop's lane of their group (so one group is
never written by two jobs at once), but only when the write hop has already taken every record
of the group this worker sent to ``{prefix}.extracted``, and every record that was on the
partition when it was assigned: then nothing of the group that came earlier can be written
after them. Otherwise they take the hop, as every other record does, and the topic keeps the
order. Every doubt (the partition's end not read yet, a send not delivered yet, the lanes
closed for a rebalance) means the hop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from tidegraph.pipelines.streaming.lanes import KeyedLanes

log = logging.getLogger(__name__)

T = TypeVar("T")

# Where the write hop's consumer stands on a partition of {prefix}.extracted: its committed
# offset (every record before it written), or None when it has none yet.
Committed = Callable[[int], int | None]
# The end offset of a partition of {prefix}.extracted (the offset its next record gets).
EndOffset = Callable[[int], Awaitable[int]]


class WriteHere:
    """What this worker sent to ``{prefix}.extracted`` and what its write hop has taken, per
    partition and group, and the write hop's lanes to write in (``write``)."""

    def __init__(self, committed: Committed, end_offset: EndOffset) -> None:
        self._committed = committed
        self._end_offset = end_offset
        self.lanes: KeyedLanes | None = None  # the write hop's, once its agent runs
        self._reset()

    def _reset(self) -> None:
        self._end_at_start: dict[int, int] = {}  # the partition's end, read after assignment
        self._caught_up: set[int] = set()  # partitions whose records before that are taken
        self._next_taken: dict[int, int] = {}  # the offset after the last one taken
        self._sending: Counter[bytes] = Counter()  # sends not delivered yet, by group key
        self._last_sent: dict[bytes, tuple[int, int]] = {}  # group key -> partition, offset

    def reassigned(self) -> None:
        """Partitions were revoked or assigned: nothing known of them holds any more."""
        self._reset()

    # ------------------------------------------------------------------ what moves
    def sending(self, key: bytes | None) -> Callable[[Any], None]:
        """A record of group ``key`` is being sent to ``{prefix}.extracted``: returns the
        callback for its delivery (Kafka's record metadata: partition, offset)."""
        self._sending[key or b""] += 1

        def delivered(metadata: Any) -> None:
            group = key or b""
            self._sending[group] -= 1
            if self._sending[group] <= 0:
                del self._sending[group]
            if metadata is not None:
                self._last_sent[group] = (metadata.partition, metadata.offset)

        return delivered

    def taken(self, records: Iterable[tuple[int, int]]) -> None:
        """The write hop has these records (partition, offset) in jobs of its lanes, and all
        of their partitions' records before them (a partition's records reach it in offset
        order)."""
        next_taken = self._next_taken
        for partition, offset in records:
            if offset >= next_taken.get(partition, 0):
                next_taken[partition] = offset + 1

    # ------------------------------------------------------------------ the decision
    async def _partition_caught_up(self, partition: int) -> bool:
        """Whether every record that was on ``partition`` when it was assigned is written or
        taken by the write hop."""
        if partition in self._caught_up:
            return True
        ends = self._end_at_start  # a reassignment meanwhile replaces it: this read is then lost
        end = ends.get(partition)
        if end is None:
            end = ends.setdefault(partition, await self._end_offset(partition))
        done = max(self._committed(partition) or 0, self._next_taken.get(partition, 0))
        if done >= end:
            self._caught_up.add(partition)
            return True
        return False

    def _group_taken(self, key: bytes) -> bool:
        """Whether the write hop has taken every record this worker sent for group ``key``."""
        if self._sending.get(key):
            return False
        sent = self._last_sent.get(key)
        return sent is None or sent[1] < self._next_taken.get(sent[0], 0)

    async def write(self, key: bytes, partition: int, work: Callable[[], Awaitable[T]]) -> T | None:
        """``work()`` (the group's writes) run in the write hop's lane of ``key``; None when
        it must take the hop instead (see the module docstring)."""
        lanes = self.lanes
        if lanes is None or lanes.closed:
            return None
        try:
            if not await self._partition_caught_up(partition):
                return None
        except Exception as exc:  # the end offset not read: the hop, which is always right
            log.debug("end offset of partition %d not read (%s): the hop", partition, exc)
            return None
        if not self._group_taken(key):
            return None
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        async def job() -> None:
            try:
                result = await work()
            except BaseException as exc:
                if not done.done():
                    if isinstance(exc, asyncio.CancelledError):
                        done.cancel()
                    else:
                        done.set_exception(exc)
                raise
            if not done.done():
                done.set_result(result)

        if not await lanes.submit(key, job):
            return None
        return await done
