"""The local components behind declared sources, as the project's scripts start them:
PostgreSQL (logical replication) -> Debezium's connector in Kafka Connect -> Kafka."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

from tests.support.debezium import CapturedDatabase


async def read_topic(bootstrap: str, topic: str, count: int, timeout: float = 60.0) -> list[Any]:
    """The first ``count`` records of ``topic`` (fails after ``timeout`` seconds)."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    records: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(records) < count and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for part in batch.values():
                records.extend(part)
    finally:
        await consumer.stop()
    assert len(records) >= count, f"{topic}: {len(records)} of {count} records in {timeout}s"
    return records[:count]


async def test_debezium_captures_inserts_updates_and_deletes(
    postgres_dsn: str, connect_url: str, kafka_bootstrap: str, unique_id: str
) -> None:
    name = f"svc{unique_id}"
    async with CapturedDatabase(postgres_dsn, connect_url, name) as db:
        db.execute(
            "CREATE TABLE accounts (id int PRIMARY KEY, name text, plan text);"
            "ALTER TABLE accounts REPLICA IDENTITY FULL;"
            "INSERT INTO accounts VALUES (1, 'Acme', 'Pro');"
        )
        await db.capture(["public.accounts"])
        db.execute("UPDATE accounts SET plan = 'Enterprise' WHERE id = 1")
        db.execute("DELETE FROM accounts WHERE id = 1")
        records = await read_topic(kafka_bootstrap, db.topic("accounts"), 4)
    keys = [orjson.loads(r.key)["payload"] for r in records]
    assert keys == [{"id": 1}] * 4
    assert records[3].value is None  # the tombstone after the delete
    payloads = [orjson.loads(r.value)["payload"] for r in records[:3]]
    assert [p["op"] for p in payloads] == ["r", "u", "d"]
    assert payloads[0]["after"] == {"id": 1, "name": "Acme", "plan": "Pro"}
    assert payloads[1]["before"]["plan"] == "Pro" and payloads[1]["after"]["plan"] == "Enterprise"
    assert payloads[2]["before"]["plan"] == "Enterprise" and payloads[2]["after"] is None
    # The database's own position and time of each change (what a source derives ids from).
    assert all(p["source"]["table"] == "accounts" and p["source"]["lsn"] for p in payloads)
    assert payloads[1]["source"]["ts_ms"] <= payloads[2]["source"]["ts_ms"]


async def test_services_are_reused_within_a_run(postgres_dsn: str, connect_url: str) -> None:
    # A second ask for the running services starts nothing new.
    from tests.support.local_services import LocalServices

    local = LocalServices(free_ports=True)
    started = await asyncio.to_thread(local.up, ("postgres", "connect"))
    assert started == {"postgres": False, "connect": False}
