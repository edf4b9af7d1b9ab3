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


def oldest_in_flight(unacked: Iterable[Any]) -> dict[Any, int]:
    """The lowest offset of each partition among records taken and not acked yet, in one
    pass over them (a partition with none is absent)."""
    oldest: dict[Any, int] = {}
    for m in unacked:
        if not m.acked and m.offset < oldest.get(m.tp, m.offset + 1):
            oldest[m.tp] = m.offset
    return oldest


def may_commit(acked: list[int], in_flight: int | None) -> bool:
    """Whether Faust's run of acked offsets can be committed: no record older than the oldest
    acked one is still in flight."""
    return not acked or in_flight is None or in_flight > min(acked)


def guard_commits(consumer: Any) -> None:
    """Wrap the consumer's choice of offsets to commit so that it never passes a record still
    in flight: each commit round (``_filter_committable_offsets``, Faust's only caller of
    ``_new_offset``) reads the records in flight once, for every partition, and the offset
    Faust would commit for a partition (``_new_offset``) is checked against that. The records
    in flight were read per partition before: every second, the whole backlog of taken records
    once per assigned partition of every topic."""
    compute: Callable[[Any], int | None] = consumer._new_offset
    choose: Callable[[Iterable[Any]], dict[Any, int]] = consumer._filter_committable_offsets
    this_round: list[dict[Any, int]] = []  # the round's oldest record in flight per partition

    def committable_offsets(tps: Iterable[Any]) -> dict[Any, int]:
        with ack_lock:
            this_round.append(oldest_in_flight(list(consumer._unacked_messages)))
        try:
            return choose(tps)
        finally:
            this_round.clear()

    def new_offset(tp: Any) -> int | None:
        with ack_lock:
            # outside a round (no such caller in Faust 0.15), the records in flight now
            oldest = this_round[0] if this_round else oldest_in_flight(consumer._unacked_messages)
            if not may_commit(consumer._acked[tp], oldest.get(tp)):
                return None
        return compute(tp)

    consumer._new_offset = new_offset
    consumer._filter_committable_offsets = committable_offsets
