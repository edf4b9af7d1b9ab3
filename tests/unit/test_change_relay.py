"""The change relay publishes a group's committed changes in commit order, moves its cursor
only after Kafka acknowledged them, and relays only the groups of the partitions it owns.

The store is the product's in-memory store fed through the group runner; Kafka's producer is
a stand-in that records what it was given (the relay against a real broker is in
tests/integration/test_lifecycle_topology.py).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest

from tests.support import crm_feed as crm
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.metrics import CHANGES_BEHIND
from tidegraph.pipelines.pending import partition_of
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.pipelines.streaming.relay import relay_changes
from tidegraph.processors.steps import Components
from tidegraph.records.changes import (
    Change,
    entity_changes,
    fact_changes,
    published_form,
    stored_form,
)
from tidegraph.records.episode import Episode
from tidegraph.records.graph import EntityRecord, FactRecord
from tidegraph.stores.memory.store import MemoryStore
from tidegraph.stores.rows import by_record, joined_body, outbox_row

T0 = datetime(2026, 3, 1, tzinfo=UTC)
PARTITIONS = 4


class Producer:
    """Records each send; the acknowledgements of ``failing`` groups' records after their
    first ``fail_after`` fail, as when a partition's leader is gone."""

    def __init__(self, failing: set[bytes] = frozenset(), fail_after: int = 0) -> None:
        self.sent: list[tuple[bytes, dict]] = []
        self.failing = failing
        self.fail_after = fail_after

    async def send(self, key: bytes, value: bytes) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if key in self.failing and sum(k == key for k, _ in self.sent) >= self.fail_after:
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
    [log] = await store.outbox.change_logs(["t1"])
    rounds = []  # two per group and round: the rest waits for the next rounds
    while published := await relay_changes(
        store.outbox, producer.send, owned_by(["t1"]), PARTITIONS, batch=2
    ):
        rounds.append(published)
    seqs = [value["seq"] for _, value in producer.sent]
    assert sum(rounds) == len(seqs) == log.seq and set(rounds) == {2} | {log.seq % 2 or 2}
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {key for key, _ in producer.sent} == {b"t1"}
    kinds = {value["kind"] for _, value in producer.sent}
    assert "fact.invalidated" in kinds or "fact.expired" in kinds  # plan changes close facts
    assert CHANGES_BEHIND._value.get() == 0  # nothing left behind


@pytest.mark.asyncio
async def test_a_failed_acknowledgement_stops_its_group_there_and_the_others_move() -> None:
    store = await fed(["t1", "t2"], plans=3)
    logs = {log.group_id: log for log in await store.outbox.change_logs(["t1", "t2"])}
    failing = Producer(failing={b"t1"}, fail_after=2)
    with pytest.raises(ConnectionError):
        await relay_changes(store.outbox, failing.send, owned_by(["t1", "t2"]), PARTITIONS)
    after = {log.group_id: log for log in await store.outbox.change_logs(["t1", "t2"])}
    # t1's cursor stops at its last acknowledged change; t2 was published entirely.
    acked_t1 = [v["seq"] for k, v in failing.sent if k == b"t1"]
    assert acked_t1 == [1, 2] and after["t1"].published == 2
    assert after["t2"].published == logs["t2"].seq
    assert CHANGES_BEHIND._value.get() == logs["t1"].seq - 2  # the backlog the round left
    # The next round publishes the rest of t1, starting right after its cursor.
    retry = Producer()
    await relay_changes(store.outbox, retry.send, owned_by(["t1", "t2"]), PARTITIONS)
    assert [v["seq"] for _, v in retry.sent] == list(range(3, logs["t1"].seq + 1))
    assert {k for k, _ in retry.sent} == {b"t1"}


@pytest.mark.asyncio
async def test_relays_only_the_groups_of_owned_partitions() -> None:
    groups = [f"tenant-{n}" for n in range(12)]
    store = await fed(groups, plans=1)
    mine = {partition_of(groups[0], PARTITIONS)}
    producer = Producer()
    await relay_changes(store.outbox, producer.send, mine, PARTITIONS)
    keys = {key.decode() for key, _ in producer.sent}
    assert keys == {g for g in groups if partition_of(g, PARTITIONS) in mine}
    assert keys != set(groups)


@pytest.mark.parametrize(
    "group_id",
    [
        "t1",
        'quoted ","kind":"fact.created" group',
        "ünïcödé \\ 日本 \U0001f600",
        "ctl \x00\x1f\x7f /",
    ],
)
@pytest.mark.parametrize(
    "at",
    [T0, T0 + timedelta(microseconds=120000), T0.astimezone(timezone(timedelta(hours=-5)))],
)
def test_a_stored_change_is_published_byte_for_byte_as_the_change_serializes(
    group_id: str, at: datetime
) -> None:
    """The relay splices the seq into the stored JSON instead of decoding it: what consumers
    get is exactly ``Change.model_dump_json()``, whatever the group id or the text holds."""
    fact = FactRecord(
        uuid="f1", group_id=group_id, source_uuid="a", target_uuid="b", name="HAS_PLAN",
        fact='Acme, "kind": on \u2028 the <Pro> plan', episodes=["e1", "e2"], valid_at=T0,
    )  # fmt: skip
    closed = fact.model_copy(update={"invalid_at": T0 + timedelta(days=1), "expired_at": T0})
    changes = fact_changes(group_id, "cause", "crm:1", fact, closed, at)
    assert len(changes) == 2  # invalidated, expired
    entity = EntityRecord(
        uuid="n1", group_id=group_id, name=f"Acme {group_id}", labels=["Account"], key="crm:7"
    )
    merged = entity.model_copy(update={"aliases": ["ACME \u0000 Inc"], "summary": "a <b> \t"})
    changes += entity_changes(group_id, "cause", None, entity, merged, at)
    changes += entity_changes(group_id, "cause", "crm:2", None, entity, at)
    assert len(changes) == 5  # and merged, summary changed, created
    for seq, change in enumerate(changes, 41):
        numbered = change.model_copy(update={"seq": seq})
        value = published_form(stored_form(change), seq)
        assert value == numbered.model_dump_json().encode()
        assert Change.model_validate_json(value) == numbered


@pytest.mark.asyncio
async def test_the_relay_publishes_what_a_reader_of_the_outbox_reads() -> None:
    store = await fed(["t1"], plans=2)
    published = await store.outbox.unpublished_changes(["t1"], 1000)
    read = await store.outbox.changes("t1", 0, 1000)
    assert [p.value for p in published] == [c.model_dump_json().encode() for c in read]
    assert [(p.group_id, p.seq) for p in published] == [(c.group_id, c.seq) for c in read]


def test_a_neo4j_rows_bodies_kept_by_record_join_back_into_the_row() -> None:
    """The Neo4j store keeps an outbox row's changes' JSON by record (``rows.by_record``):
    joined back in the row's order (``rows.joined_body``) it is the row's body byte for byte,
    a record with several changes in the row included; with a record's part gone (a forget)
    its lines are empty and the others unchanged."""
    at = datetime(2026, 3, 1, tzinfo=UTC)
    changes = [
        _change_of(kind, uuid, at, note)
        for kind, uuid, note in (
            ("fact.created", "f1", "Zürich 😀"),
            ("entity.created", "e1", "Acme"),
            ("fact.invalidated", "f1", "Zürich 😀"),
            ("fact.created", "f2", "Globex"),
        )
    ]
    row = outbox_row("g", changes)
    parts = [[p["uuid"], p["body"]] for p in by_record(row)["parts"]]
    assert [u for u, _ in parts] == ["f1", "e1", "f2"]
    assert "body" not in by_record(row)
    assert joined_body(row["uuid"], parts) == row["body"]
    without = [p for p in parts if p[0] != "f1"]
    lines = joined_body(row["uuid"], without).split("\n")
    assert lines == ["", stored_form(changes[1]), "", stored_form(changes[3])]


def _change_of(kind: str, uuid: str, at: datetime, note: str) -> Change:
    return Change(
        change_id=f"{kind}-{uuid}", group_id="g", kind=kind, uuid=uuid, committed_at=at,
        after={"note": note},
    )  # fmt: skip
