"""The change relay publishes a group's committed changes in commit order, moves its cursor
only after Kafka acknowledged them, and relays only the groups of the partitions it owns.

The store is the product's in-memory store fed through the group runner; Kafka's producer is
a stand-in that records what it was given (the relay against a real broker is in
tests/integration/test_lifecycle_topology.py).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from tests.support import crm_feed as crm
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.metrics import CHANGES_BEHIND
from tidegraph.pipelines.pending import partition_of
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.pipelines.streaming.relay import relay_changes
from tidegraph.processors.steps import Components
from tidegraph.records.episode import Episode
from tidegraph.stores.memory.store import MemoryStore

T0 = datetime(2026, 3, 1, tzinfo=UTC)
PARTITIONS = 4


class Producer:
    """Records each send; ``fail_after`` sends succeed, then acknowledgements fail."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.sent: list[tuple[bytes, dict]] = []
        self.fail_after = fail_after

    async def send(self, key: bytes, value: bytes) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fail_after is not None and len(self.sent) >= self.fail_after:
            done.set_exception(ConnectionError("broker unavailable"))
        else:
            self.sent.append((key, orjson.loads(value)))
            done.set_result(None)
        return done


async def fed(groups: list[str], plans: int) -> MemoryStore:
    store = MemoryStore()
    await store.setup(16)
    components = Components.of(
        store=store, embedder=HashingEmbedder(dim=16), llm=None, mappings=crm.crm_mappings()
    )
    runner = GroupRunner(components)
    for group in groups:
        episodes = [
            Episode(
                id=f"{group}-{n}",
                group_id=group,
                source="json",
                content=crm.plan_record((1, "Acme"), f"plan-{n}", T0 + timedelta(days=n)),
                reference_time=T0 + timedelta(days=n),
            )
            for n in range(plans)
        ]
        outcomes = await runner.run(episodes)
        assert all(o.failure is None for o in outcomes), [o.failure for o in outcomes]
    return store


def owned_by(groups: list[str]) -> set[int]:
    return {partition_of(group, PARTITIONS) for group in groups}


@pytest.mark.asyncio
async def test_relays_every_change_once_in_commit_order() -> None:
    store = await fed(["t1"], plans=3)
    producer = Producer()
    published = await relay_changes(store, producer.send, owned_by(["t1"]), PARTITIONS, batch=2)
    seqs = [value["seq"] for _, value in producer.sent]
    assert published == len(seqs) > 0
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {key for key, _ in producer.sent} == {b"t1"}
    kinds = {value["kind"] for _, value in producer.sent}
    assert "fact.invalidated" in kinds or "fact.expired" in kinds  # plan changes close facts
    # Nothing left: the next round publishes nothing and the backlog gauge is zero.
    assert await relay_changes(store, producer.send, owned_by(["t1"]), PARTITIONS) == 0
    assert CHANGES_BEHIND._value.get() == 0


@pytest.mark.asyncio
async def test_failed_acknowledgement_keeps_the_cursor_and_shows_the_backlog() -> None:
    store = await fed(["t1"], plans=3)
    [log] = await store.change_logs(["t1"])
    failing = Producer(fail_after=2)
    with pytest.raises(ConnectionError):
        await relay_changes(store, failing.send, owned_by(["t1"]), PARTITIONS, batch=2)
    # The first batch was acknowledged and its cursor moved; the failed one was not.
    [after] = await store.change_logs(["t1"])
    assert after.published == failing.sent[1][1]["seq"]
    assert CHANGES_BEHIND._value.get() == log.seq  # the round's backlog, set before publishing
    # The next round publishes the rest, starting right after the cursor.
    retry = Producer()
    await relay_changes(store, retry.send, owned_by(["t1"]), PARTITIONS)
    assert [v["seq"] for _, v in retry.sent][0] == after.published + 1
    assert [v["seq"] for _, v in retry.sent][-1] == log.seq


@pytest.mark.asyncio
async def test_relays_only_the_groups_of_owned_partitions() -> None:
    groups = [f"tenant-{n}" for n in range(12)]
    store = await fed(groups, plans=1)
    mine = {partition_of(groups[0], PARTITIONS)}
    producer = Producer()
    await relay_changes(store, producer.send, mine, PARTITIONS)
    keys = {key.decode() for key, _ in producer.sent}
    assert keys == {g for g in groups if partition_of(g, PARTITIONS) in mine}
    assert keys != set(groups)
