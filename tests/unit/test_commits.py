"""Offsets are committed only past finished records (``tidegraph.pipelines.streaming.commits``),
checked on a real
faust-streaming consumer's own bookkeeping: records are tracked and acked with its methods,
and the offsets it would commit come from its own ``_filter_committable_offsets``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import faust
import pytest
from faust.types import TP
from faust.types.tuples import Message

from tidegraph.pipelines.streaming.commits import guard_commits, may_commit

TOPIC = "tidegraph-commits-test.stamped"
PARTITION = TP(TOPIC, 0)


@pytest.fixture
def consumer() -> Iterator[Any]:
    loop = asyncio.new_event_loop()
    try:
        app = faust.App("tidegraph-commits-test", broker="kafka://127.0.0.1:9", loop=loop)
        app.topics.add(app.topic(TOPIC))  # an agent's subscription: its acks are tracked
        loop.run_until_complete(app.topics._update_indices())
        yield app.consumer  # created, never started: no broker needed
    finally:
        loop.close()


def message(offset: int) -> Message:
    return Message(TOPIC, 0, offset, 0.0, 0, None, b"group", b"{}", None, tp=PARTITION)


def taken(consumer: Any, *offsets: int) -> dict[int, Message]:
    messages = {o: message(o) for o in offsets}
    for m in messages.values():
        consumer.track_message(m)
    return messages


def committable(consumer: Any) -> int | None:
    return consumer._filter_committable_offsets([PARTITION]).get(PARTITION)


@pytest.mark.parametrize("committed", [None, 40])
def test_no_commit_past_a_record_still_in_flight(consumer: Any, committed: int | None) -> None:
    guard_commits(consumer)
    consumer._committed_offset[PARTITION] = committed
    records = taken(consumer, 40, 41, 42)
    consumer.ack(records[41])  # another group's record of the partition finished first
    consumer.ack(records[42])
    assert committable(consumer) is None  # 40 is still in flight
    consumer.ack(records[40])
    assert committable(consumer) == 43


def test_commits_the_finished_prefix_and_waits_for_the_rest(consumer: Any) -> None:
    guard_commits(consumer)
    consumer._committed_offset[PARTITION] = 40
    records = taken(consumer, 40, 41, 42, 43)
    for offset in (40, 41, 43):
        consumer.ack(records[offset])
    assert committable(consumer) == 42  # 40 and 41 are done; 42 is not
    consumer._committed_offset[PARTITION] = 42
    assert committable(consumer) is None  # 43 is done, 42 still in flight
    consumer.ack(records[42])
    assert committable(consumer) == 44


def test_faust_alone_would_commit_past_the_record_in_flight(consumer: Any) -> None:
    """Why the guard exists (faust-streaming 0.15): without it, record 40 is committed as
    done while it is still being processed, and lost if the worker dies now."""
    consumer._committed_offset[PARTITION] = 40
    records = taken(consumer, 40, 41)
    consumer.ack(records[41])
    assert committable(consumer) == 42


@pytest.mark.parametrize(
    ("acked", "in_flight", "expected"),
    [([], 3, True), ([5, 6], None, True), ([5, 6], 7, True), ([5, 6], 4, False)],
)
def test_may_commit(acked: list[int], in_flight: int | None, expected: bool) -> None:
    assert may_commit(acked, in_flight) is expected


class CountedReads(set[Message]):
    """The consumer's records in flight, counting how often they are read."""

    reads = 0

    def __iter__(self) -> Iterator[Message]:
        self.reads += 1
        return super().__iter__()


def test_a_commit_round_reads_the_records_in_flight_once_for_every_partition(
    consumer: Any,
) -> None:
    """Each second's commit round checks every assigned partition: the records in flight
    (the worker's whole backlog of taken records) are read once for all of them, and a record
    in flight on one partition holds back only that partition's commit."""
    guard_commits(consumer)
    consumer._unacked_messages = CountedReads()
    partitions = [TP(TOPIC, p) for p in range(8)]
    records = {}
    for tp in partitions:
        consumer._committed_offset[tp] = 40
        for offset in (40, 41):
            records[tp, offset] = Message(
                TOPIC, tp.partition, offset, 0.0, 0, None, b"g", b"{}", None, tp=tp
            )
            consumer.track_message(records[tp, offset])
    for tp in partitions:
        consumer.ack(records[tp, 41])
        if tp != partitions[0]:
            consumer.ack(records[tp, 40])
    offsets = consumer._filter_committable_offsets(partitions)
    assert consumer._unacked_messages.reads == 1
    assert offsets == {tp: 42 for tp in partitions[1:]}  # partition 0 waits for its 40
