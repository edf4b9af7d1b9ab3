"""Declared sources through a worker: Debezium-shaped change events in Avro (and in Protobuf)
and notes in JSON Schema, all in the schema registry's wire format through this checkout's
schema registry (Apicurio Registry, Confluent's API), beside a plain JSON topic; bad records are
dead letters with their reasons, and everything else goes on; a registry outage (injected by
a relay in front of the registry, tests/support/registry_relay.py) is retried."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from tests.integration.topology_harness import Topology, eventually
from tests.support.avro_events import UNKNOWN_SCHEMA_ID, AvroEvents, account_event, account_schema
from tests.support.crm_tables import MAPPING
from tests.support.protobuf_events import (
    ENVELOPE_MESSAGES,
    envelope_classes,
    register_envelope,
    wire,
)
from tests.support.registry_relay import RegistryRelay
from tidegraph.topics.admin import ensure_topics

NOTE_RULE = """\
  - name: note
    match: {type: note}
    entities:
      author: {name: "{author}", label: User}
      topic: {name: "{about}", label: Topic}
    facts:
      - {relation: WROTE_ABOUT, subject: author, object: topic}
"""
NOTE_SCHEMA = """{"type": "object", "required": ["type", "author", "about", "at"],
  "properties": {"type": {"const": "note"}, "author": {"type": "string"},
                 "about": {"type": "string"}, "at": {"type": "string"}}}"""
ACME = {"id": 1, "tenant": "north", "name": "Acme", "plan": "Pro", "owner": "Alice"}
T0 = 1_700_000_000_000


async def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


def json_schema_serializer(
    registry_url: str, topic: str, schema: str
) -> Callable[[dict[str, Any]], bytes]:
    """confluent-kafka's JSON Schema serializer, its schema registered under ``<topic>-value``."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = JSONSerializer(schema, SchemaRegistryClient({"url": registry_url}))
    context = SerializationContext(topic, MessageField.VALUE)

    def encode(value: dict[str, Any]) -> bytes:
        data = serializer(value, context)
        assert data is not None
        return data

    return encode


async def test_avro_and_json_sources_with_bad_records_and_an_outage(
    topology: Topology, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    topology.mapping.write_text(MAPPING + NOTE_RULE)
    accounts, notes = f"{topology.prefix}.crm.accounts", f"{topology.prefix}.notes"
    checked_notes = f"{topology.prefix}.checked-notes"
    await ensure_topics(
        kafka_bootstrap, [accounts, notes, checked_notes], partitions=2, replication_factor=1
    )
    group = f"{topology.run}-"
    unknown = b"\x00" + UNKNOWN_SCHEMA_ID.to_bytes(4, "big") + b"\x02"
    with RegistryRelay(schema_registry_url) as relay:
        sources = tmp_path / "sources.yaml"
        sources.write_text(
            "sources:\n"
            f"  - {{name: crm, topics: [{accounts}], format: avro, envelope: debezium,\n"
            f"     registry: {{url: '{relay.url}'}}, group: '{group}{{row.tenant}}'}}\n"
            f"  - {{name: notes, topics: [{notes}], group: '{group}notes',\n"
            "     reference_time: at}\n"
            f"  - {{name: checked-notes, topics: [{checked_notes}], format: jsonschema,\n"
            f"     registry: {{url: '{relay.url}'}}, group: '{group}notes', reference_time: at}}\n"
        )
        events = AvroEvents(schema_registry_url, accounts, account_schema())
        checked_note = json_schema_serializer(schema_registry_url, checked_notes, NOTE_SCHEMA)
        key = b'{"id": 1}'
        moved = {**ACME, "plan": "Enterprise"}
        await produce(kafka_bootstrap, accounts, [
            (key, events.encode(account_event("r", None, ACME, lsn=10, ts_ms=T0))),
            (b'{"id": 7}', unknown),                               # no such schema id
            (b'{"id": 8}', b'{"op": "c"}'),                        # JSON, not Avro
            (key, events.encode(account_event("u", ACME, moved, lsn=20, ts_ms=T0 + 60_000))),
        ])  # fmt: skip
        await produce(kafka_bootstrap, notes, [
            (b"n1", b"not json"),
            (b"n2", b'{"type": "note", "author": "Dana", "about": "renewal",'
                    b' "at": "2025-03-01T10:00:00Z"}'),
        ])  # fmt: skip
        await produce(kafka_bootstrap, checked_notes, [
            (b"n3", checked_note({"type": "note", "author": "Erik", "about": "onboarding",
                                  "at": "2025-03-02T10:00:00Z"})),
        ])  # fmt: skip
        # The registry answers the worker's check at start, then fails its first two fetches
        # of the schema: retried.
        relay.outage(times=2, paths="/schemas/ids/")
        worker = topology.start_worker(
            TIDEGRAPH_SOURCES=str(sources), TIDEGRAPH_COMMUNITIES_ENABLED="false"
        )
        store = topology.store()
        try:

            async def state() -> Any:
                plans = await store.browse.query_facts(group + "north", include_invalid=True)
                notes_now = await store.browse.query_facts(group + "notes")
                letters = await topology.dead_letters()
                return plans, notes_now, letters

            plans, notes_now, letters = await eventually(
                state,
                lambda s: len(s[0]) == 3 and len(s[1]) == 2 and len(s[2]) == 3,
                timeout=120,
                what="the accounts' facts, the two notes and three dead letters",
            )
            history = sorted((f.relation, f.object, f.invalid_at is None) for f in plans)
            assert history == [("HAS_PLAN", "Enterprise", True), ("HAS_PLAN", "Pro", False),
                               ("OWNED_BY", "Alice", True)]  # fmt: skip
            assert sorted((f.subject, f.object) for f in notes_now) == [
                ("Dana", "renewal"), ("Erik", "onboarding")
            ]  # fmt: skip
            reasons = sorted((letter.stage, letter.reason) for letter in letters)
            assert reasons == [("source", "source_undecodable"), ("source", "source_undecodable"),
                               ("source", "unknown_schema")]  # fmt: skip
            assert worker.value("tidegraph_retries_total", stage="source",
                                reason="registry_unavailable") == 2  # fmt: skip
            assert worker.value("tidegraph_source_dead_letters_total", source="crm",
                                reason="unknown_schema") == 1  # fmt: skip
            for name in ("notes", "checked-notes"):
                assert worker.value("tidegraph_source_records_total", source=name,
                                    outcome="episode") == 1  # fmt: skip

            # A new version of the schema mid-stream while the registry is down past every
            # retry: a dead letter, replayed to its source topic once the registry is back.
            newer = AvroEvents(schema_registry_url, accounts, account_schema(extra_column=True))
            region = {**moved, "owner": "Erin", "region": "EU"}
            data = newer.encode(account_event("u", moved, region, lsn=30, ts_ms=T0 + 120_000))
            relay.outage(times=1000, paths="/schemas/ids/")
            await produce(kafka_bootstrap, accounts, [(key, data)])

            async def letters_now() -> list[Any]:
                return await topology.dead_letters()

            letters = await eventually(letters_now, lambda got: len(got) == 4, timeout=120,
                                       what="the registry_unavailable dead letter")  # fmt: skip
            assert "registry_unavailable" in {letter.reason for letter in letters}
            relay.outage(times=0)
            topology.cli("dlq", "replay", "--stage", "source")

            async def owners() -> list[Any]:
                return await store.browse.query_facts(group + "north")

            now = await eventually(
                owners,
                lambda facts: ("OWNED_BY", "Erin") in {(f.relation, f.object) for f in facts},
                timeout=120,
                what="the replayed change",
            )
            assert sorted((f.relation, f.object) for f in now) == [
                ("HAS_PLAN", "Enterprise"), ("OWNED_BY", "Erin")
            ]  # fmt: skip
        finally:
            await store.close()


async def test_a_protobuf_source_through_the_worker(
    topology: Topology, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    """Debezium-shaped change events in Protobuf (a .proto text schema with an import,
    Confluent's framing), read by a worker; bytes that do not parse are a dead letter."""
    topology.mapping.write_text(MAPPING)
    accounts = f"{topology.prefix}.proto.accounts"
    await ensure_topics(kafka_bootstrap, [accounts], partitions=2, replication_factor=1)
    group = f"{topology.run}-"
    schema_id = register_envelope(schema_registry_url, accounts)
    classes = envelope_classes()
    envelope, row, source = (classes[n] for n in ENVELOPE_MESSAGES)
    moved = {**ACME, "plan": "Enterprise"}
    read = envelope(op="r", after=row(**ACME), source=source(table="accounts", ts_ms=T0))
    update = envelope(op="u", before=row(**ACME), after=row(**moved),
                      source=source(table="accounts", ts_ms=T0 + 60_000))  # fmt: skip
    key = b'{"id": 1}'
    await produce(kafka_bootstrap, accounts, [
        (key, wire(schema_id, [0], read)),
        (b'{"id": 2}', wire(schema_id, [0], read)[:-4] + b"\xff\xff\xff\xff"),  # cut short
        (key, wire(schema_id, [0], update)),
    ])  # fmt: skip
    sources = tmp_path / "sources.yaml"
    sources.write_text(
        "sources:\n"
        f"  - {{name: crm, topics: [{accounts}], format: protobuf, envelope: debezium,\n"
        f"     registry: {{url: '{schema_registry_url}'}}, group: '{group}{{row.tenant}}'}}\n"
    )
    worker = topology.start_worker(
        TIDEGRAPH_SOURCES=str(sources), TIDEGRAPH_COMMUNITIES_ENABLED="false"
    )
    store = topology.store()
    try:

        async def state() -> Any:
            facts = await store.browse.query_facts(group + "north", include_invalid=True)
            return facts, await topology.dead_letters()

        facts, letters = await eventually(
            state, lambda s: len(s[0]) == 3 and len(s[1]) == 1, timeout=120,
            what="the account's facts and one dead letter",
        )  # fmt: skip
        history = sorted((f.relation, f.object, f.invalid_at is None) for f in facts)
        assert history == [("HAS_PLAN", "Enterprise", True), ("HAS_PLAN", "Pro", False),
                           ("OWNED_BY", "Alice", True)]  # fmt: skip
        assert [(x.stage, x.reason) for x in letters] == [("source", "source_undecodable")]
        assert worker.value("tidegraph_source_records_total", source="crm",
                            outcome="episode") == 2  # fmt: skip
    finally:
        await store.close()
