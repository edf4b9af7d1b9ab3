"""``tidegraph dlq list`` and ``dlq replay`` through the installed command against a real
broker, on the embedded default store in a fresh folder (issue 48): a record of the
dead-letter topic that is no readable dead letter (an offset past 64 bits, text that is no
JSON) is shown as such and the others are listed; replay works with no store written yet.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from tests.integration.test_cli_newcomer import run
from tidegraph.records import jsontext
from tidegraph.settings import Settings
from tidegraph.topics.client import ensure_all_topics
from tidegraph.topics.names import TopicNames

pytestmark = pytest.mark.integration


def _letter(n: int, **fields: object) -> dict[str, object]:
    episode = {
        "id": f"ep-{n}",
        "group_id": "dlq-g",
        "content": f"Dana: note {n}",
        "reference_time": "2025-01-01T00:00:00Z",
    }
    return {
        "v": 1,
        "stage": "extraction",
        "reason": "llm_server",
        "error_class": "LLMError",
        "message": "the LLM kept failing",
        "attempts": 3,
        "failed_at": datetime.now(UTC).isoformat(),
        "group_id": "dlq-g",
        "episode_id": f"ep-{n}",
        "origin": {"topic": "x.episodes", "partition": 0, "offset": n},
        "record": episode,
        **fields,
    }


async def _send(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, key=b"dlq-g")
    finally:
        await producer.stop()


async def _read_all(bootstrap: str, topic: str) -> list[bytes]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        batch = await consumer.getmany(timeout_ms=5000)
        return [m.value for messages in batch.values() for m in messages]
    finally:
        await consumer.stop()


def test_dlq_list_shows_odd_letters_and_replay_works_on_a_fresh_embedded_folder(
    tmp_path: Path, kafka_bootstrap: str, topic_prefix: str
):
    settings = Settings(kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=topic_prefix)
    names = TopicNames(topic_prefix)
    asyncio.run(ensure_all_topics(settings))
    big_offset = _letter(2, origin={"topic": "x.episodes", "partition": 0, "offset": 10**30})
    content = {"n": 10**30}  # a record may hold a long integer: listed exactly
    record = {"id": "ep-3", "group_id": "dlq-g", "source": "json", "content": content,
              "reference_time": "2025-01-01T00:00:00Z"}  # fmt: skip
    big_content = _letter(3, record=record)
    asyncio.run(
        _send(
            kafka_bootstrap,
            names.dlq,
            [
                orjson.dumps(_letter(1)),
                jsontext.dumps(big_offset),
                b"\xff not json",
                jsontext.dumps(big_content),
            ],
        )
    )
    env = {
        "TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "TIDEGRAPH_TOPIC_PREFIX": topic_prefix,
        "TIDEGRAPH_DATA_DIR": str(tmp_path / "fresh"),  # nothing written there
    }

    listed = run(tmp_path, "dlq", "list", "--json", **env)
    assert listed.returncode == 0, listed.stderr
    assert "Traceback" not in listed.stderr + listed.stdout
    rows = [jsontext.loads(line) for line in listed.stdout.splitlines()]
    readable = [r for r in rows if "unreadable" not in r]
    assert [r["episode_id"] for r in readable] == ["ep-1", "ep-3"], rows
    assert readable[1]["record"]["content"] == content  # exact, not a float
    odd = [r for r in rows if "unreadable" in r]
    assert [r["dlq_offset"] for r in odd] == [1, 2], rows
    assert "origin.offset" in odd[0]["unreadable"], odd

    table = run(tmp_path, "dlq", "list", **env)
    assert table.returncode == 0, table.stderr
    assert "2 dead letters and 2 unreadable records" in table.stdout, table.stdout

    dry = run(tmp_path, "dlq", "replay", "--dry-run", **env)
    assert dry.returncode == 0, dry.stderr
    assert "Traceback" not in dry.stderr + dry.stdout
    assert "would replay 2 records" in dry.stdout, dry.stdout
    for row in odd:  # said not replayed, by their place
        assert f"dlq {row['dlq_partition']}:{row['dlq_offset']}: no dead letter" in dry.stderr
    assert not (tmp_path / "fresh").exists() or not any((tmp_path / "fresh").rglob("*.sqlite"))

    replayed = run(tmp_path, "dlq", "replay", **env)
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 2 records" in replayed.stdout, replayed.stdout
    sent = [jsontext.loads(v) for v in asyncio.run(_read_all(kafka_bootstrap, names.episodes))]
    assert sorted(r["id"] for r in sent) == ["ep-1", "ep-3"]
