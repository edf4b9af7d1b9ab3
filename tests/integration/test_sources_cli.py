"""A user's way in to declared sources: ``tidegraph sources check`` shows what a sample of
each source would become without writing anything, and a sources file that cannot work stops
the check and the worker with one line (a missing topic, a bad template, an unreachable
registry)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from tests.integration.topology_harness import Topology
from tests.support.crm_tables import MAPPING
from tidegraph.connections import KafkaConnection
from tidegraph.topics.admin import delete_topics, ensure_topics

ACME = {"id": 1, "tenant": "north", "name": "Acme", "plan": "Pro", "owner": "Alice"}


def change(op: str, before: object, after: object, lsn: int) -> bytes:
    source = {"table": "accounts", "lsn": lsn, "txId": lsn, "ts_ms": 1_700_000_000_000 + lsn}
    return orjson.dumps({"op": op, "before": before, "after": after, "source": source})


@pytest.fixture
async def topo(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> AsyncIterator[Topology]:
    """Kafka only: neither the check nor a refused start reaches the graph store."""
    topology = Topology(kafka_bootstrap, "bolt://127.0.0.1:9", topic_prefix, tmp_path)
    topology.mapping.write_text(MAPPING)
    yield topology
    for worker in topology.workers:
        if worker.alive():
            worker.kill()
    await delete_topics(
        KafkaConnection.from_settings(topology.settings()),
        [*topology.names.all(), f"{topic_prefix}.crm.accounts"],
    )


async def test_check_shows_episodes_entities_facts_and_dead_letters(
    topo: Topology, kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = f"{topo.prefix}.crm.accounts"
    await ensure_topics(kafka_bootstrap, [topic], partitions=1, replication_factor=1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for value in (
            change("r", None, ACME, 1),
            change("u", ACME, {**ACME, "plan": "Enterprise"}, 2),
            b"not json",
            None,  # a tombstone
            change("d", {**ACME, "plan": "Enterprise"}, None, 3),
            change("t", None, None, 4),
        ):
            await producer.send_and_wait(topic, value, key=b'{"id": 1}')
    finally:
        await producer.stop()
    sources = tmp_path / "sources.yaml"
    sources.write_text(
        f"sources:\n  - {{name: crm, topics: [{topic}], envelope: debezium, "
        "group: 'north', truncate: close}\n"
    )
    out = topo.cli("sources", "check", str(sources), "--sample", "10").stdout
    assert "episode" in out and "group 'north'" in out
    assert "states: Account 1 HAS_PLAN Pro" in out
    assert "states: Account 1 HAS_PLAN Enterprise" in out and "OWNED_BY Alice" in out
    assert "dead letter source_undecodable" in out
    assert "skipped (tombstone)" in out
    assert "closes: Account 1 HAS_PLAN Enterprise" in out
    assert "closes: every open HAS_PLAN of the entities keyed crm:account:..." in out
    # Nothing was written: the worker's input topic was never even created.
    admin_topics = await _topics(kafka_bootstrap)
    assert topo.names.episodes not in admin_topics


async def _topics(bootstrap: str) -> set[str]:
    from tidegraph.topics.admin import admin_client

    admin = admin_client(bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("{name: crm, topics: [no.such.topic], group: g}", "topic 'no.such.topic' does not exist"),
        ("{name: crm, topics: [t], group: '{row.tenant'}", "unpaired brace"),
        (
            "{name: crm, topics: [t], envelope: debezium, group: '{row.t}', truncate: close}",
            "truncate: close needs a group",
        ),
        (
            "{name: crm, topics: [t], group: g, format: avro, registry: {url: 'http://127.0.0.1:9'}}",
            "registry at http://127.0.0.1:9 does not answer",
        ),
    ],
)
async def test_a_file_that_cannot_work_stops_check_and_worker_in_one_line(
    topo: Topology, tmp_path: Path, source: str, says: str
) -> None:
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"sources:\n  - {source}\n")
    checked = topo.cli("sources", "check", str(sources), check=False)
    assert checked.returncode == 1
    assert says in checked.stderr and len(checked.stderr.strip().splitlines()) == 1
    assert "Traceback" not in checked.stderr + checked.stdout
    worker = topo.start_worker(TIDEGRAPH_SOURCES=str(sources))
    assert worker.process.wait(120) == 1
    log = worker.log.read_text()
    assert says in log and "TIDEGRAPH_SOURCES" in log and "Traceback" not in log
