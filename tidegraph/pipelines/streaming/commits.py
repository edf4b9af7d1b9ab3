"""Commit offsets only past finished records: a guard on faust-streaming 0.15's consumer.

Faust commits, per partition, one past the first run of consecutive acked offsets. It means to
wait while an older record is still in flight, but compares the oldest acked offset with the
committed *position* (the next offset to read) off by one, and skips the comparison when the
partition has no commit yet. So with records 40 (in flight) and 41 (acked) after a commit at
40, it commits 42; a worker killed before 40 finishes loses record 40 for good (seen in
``test_workers_stopped_and_killed_mid_run_give_the_uninterrupted_graph``: one or two of 200
records lost in about a third of the runs).

Records of one partition finish out of order by design here (the groups of a partition run
concurrently, ``tidegraph.pipelines.streaming.lanes``), so the guard matters: no offset is committed
for a partition while a record older than its oldest acked one is still in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from faust.types.tuples import ack_lock


def oldest_in_flight(unacked: Iterable[Any], tp: Any) -> int | None:
    """The lowest offset of ``tp`` among records taken and not acked yet."""
    return min((m.offset for m in unacked if m.tp == tp and not m.acked), default=None)


def may_commit(acked: list[int], in_flight: int | None) -> bool:
    """Whether Faust's run of acked offsets can be committed: no record older than the oldest
    acked one is still in flight."""
    return not acked or in_flight is None or in_flight > min(acked)


def guard_commits(consumer: Any) -> None:
    """Wrap ``consumer._new_offset`` (the offset Faust would commit for a partition) so that it
    never passes a record still in flight."""
    compute: Callable[[Any], int | None] = consumer._new_offset

    def new_offset(tp: Any) -> int | None:
        with ack_lock:
            in_flight = oldest_in_flight(list(consumer._unacked_messages), tp)
            if not may_commit(consumer._acked[tp], in_flight):
                return None
        return compute(tp)

    consumer._new_offset = new_offset
