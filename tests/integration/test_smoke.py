"""Smoke tests: the real Kafka broker, a real Faust worker and the real Neo4j server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


async def _create_topics(bootstrap: str, names: list[str], partitions: int = 2) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, partitions, 1) for n in names])
    finally:
        await admin.close()


async def _consume(bootstrap: str, topic: str, count: int, timeout: float = 60.0) -> list:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    got = []
    try:
        async with asyncio.timeout(timeout):
            async for msg in consumer:
                got.append(msg)
                if len(got) >= count:
                    break
    finally:
        await consumer.stop()
    return got


async def test_kafka_produce_consume_round_trip(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic = f"{topic_prefix}-roundtrip"
    await _create_topics(kafka_bootstrap, [topic])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(10):
            await producer.send_and_wait(topic, f"value-{i}".encode(), key=f"g{i % 3}".encode())
    finally:
        await producer.stop()
    got = await _consume(kafka_bootstrap, topic, 10)
    assert sorted(m.value.decode() for m in got) == sorted(f"value-{i}" for i in range(10))
    # Keyed records of one key land on one partition, in order.
    for key in (b"g0", b"g1", b"g2"):
        mine = [m for m in got if m.key == key]
        assert len({m.partition for m in mine}) == 1
        assert [m.offset for m in mine] == sorted(m.offset for m in mine)


async def test_faust_agent_consumes_a_real_topic(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    await _create_topics(kafka_bootstrap, [f"{topic_prefix}-in", f"{topic_prefix}-seen"])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(f"{topic_prefix}-in", f"e{i}".encode(), key=b"acme")
    finally:
        await producer.stop()
    env = dict(
        os.environ,
        SMOKE_PREFIX=topic_prefix,
        SMOKE_BROKER=kafka_bootstrap,
        SMOKE_DATADIR=str(tmp_path / "faust"),
    )
    worker = subprocess.Popen(  # noqa: ASYNC220 - a worker process outlives this call
        [sys.executable, "-m", "faust", "-A", "tests.integration.apps.faust_echo", "worker",
         "-l", "warn", "--without-web"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        got = await _consume(kafka_bootstrap, f"{topic_prefix}-seen", 5, timeout=90)
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
    assert [m.value.decode() for m in got] == [f"seen:e{i}" for i in range(5)]
    assert {m.key for m in got} == {b"acme"}


async def test_neo4j_write_read(neo4j_driver, group_id: str) -> None:  # type: ignore[no-untyped-def]
    await neo4j_driver.execute_query(
        "CREATE (:SmokeNode {group_id: $g, name: $name})",
        g=group_id,
        name="x'}) DETACH DELETE n //",
    )
    records, _, _ = await neo4j_driver.execute_query(
        "MATCH (n:SmokeNode {group_id: $g}) RETURN n.name AS name", g=group_id
    )
    assert [r["name"] for r in records] == ["x'}) DETACH DELETE n //"]


async def test_neo4j_vector_and_fulltext_indexes(neo4j_driver, group_id: str) -> None:  # type: ignore[no-untyped-def]
    await neo4j_driver.execute_query(
        "CREATE VECTOR INDEX smoke_vec IF NOT EXISTS FOR (n:SmokeDoc) ON n.emb "
        "OPTIONS {indexConfig: {`vector.dimensions`: 3, `vector.similarity_function`: 'cosine'}}"
    )
    await neo4j_driver.execute_query(
        "CREATE FULLTEXT INDEX smoke_text IF NOT EXISTS FOR (n:SmokeDoc) ON EACH [n.body]"
    )
    docs = [
        ("printer jams on tray two", [1.0, 0.0, 0.0]),
        ("invoice overdue for march", [0.0, 1.0, 0.0]),
        ("printer toner is low", [0.9, 0.1, 0.0]),
    ]
    await neo4j_driver.execute_query(
        "UNWIND $docs AS d CREATE (:SmokeDoc {group_id: $g, body: d[0], emb: d[1]})",
        docs=[[b, e] for b, e in docs], g=group_id,
    )  # fmt: skip
    await neo4j_driver.execute_query("CALL db.awaitIndexes(60)")
    records, _, _ = await neo4j_driver.execute_query(
        "CALL db.index.vector.queryNodes('smoke_vec', 10, $q) YIELD node, score "
        "WHERE node.group_id = $g RETURN node.body AS body ORDER BY score DESC",
        q=[1.0, 0.05, 0.0], g=group_id,
    )  # fmt: skip
    assert [r["body"] for r in records][:2] == ["printer jams on tray two", "printer toner is low"]
    records, _, _ = await neo4j_driver.execute_query(
        "CALL db.index.fulltext.queryNodes('smoke_text', 'invoice') YIELD node, score "
        "WHERE node.group_id = $g RETURN node.body AS body",
        g=group_id,
    )
    assert [r["body"] for r in records] == ["invoice overdue for march"]
