"""Values through this checkout's schema registry (Apicurio Registry, Confluent's API;
tidegraph/pipelines/streaming/sources.py ``RegistryDecoder``): Avro and JSON Schema encoded
by confluent-kafka's serializers, schemas fetched once per id, a new version mid-stream,
unknown ids, bytes that do not decode, an outage. The decoder reaches the registry through a
relay (tests/support/registry_relay.py) that counts its fetches and cuts it off on cue."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import pytest

from tests.support.avro_events import (
    UNKNOWN_SCHEMA_ID,
    AvroEvents,
    account_event,
    account_schema,
    schema_id_of,
)
from tests.support.protobuf_events import (
    COMMON_PROTO,
    envelope_classes,
    proto_classes,
    register_envelope,
    wire,
)
from tests.support.registry_relay import RegistryRelay
from tidegraph.pipelines.streaming.sources import RegistryDecoder, RegistryUnavailable
from tidegraph.processors.sources import RegistrySpec
from tidegraph.records.errors import RecordError

ACME = {"id": 1, "tenant": "north", "name": "Acme", "plan": "Pro", "owner": "Alice"}


@pytest.fixture
def topic() -> str:
    """A topic of its own: the registry keeps every subject for the session."""
    return f"crm{uuid.uuid4().hex[:8]}.public.accounts"


@pytest.fixture
def relay(schema_registry_url: str) -> Iterator[RegistryRelay]:
    with RegistryRelay(schema_registry_url) as server:
        yield server


def decoder(relay: RegistryRelay, format: str = "avro") -> RegistryDecoder:
    return RegistryDecoder(RegistrySpec(url=relay.url), format)


async def test_values_decode_and_each_schema_is_fetched_once(
    schema_registry_url: str, relay: RegistryRelay, topic: str
) -> None:
    events = AvroEvents(schema_registry_url, topic, account_schema())
    avro = decoder(relay)
    schema_ids = set()
    for lsn in range(1, 6):
        event = account_event("c", None, {**ACME, "id": lsn}, lsn=lsn, ts_ms=1_700_000_000_000)
        data = events.encode(event)
        schema_ids.add(schema_id_of(data))
        assert await avro.decode(topic, data) == event
    assert relay.fetches == {schema_ids.pop(): 1}


async def test_values_of_a_schema_that_references_another_subject_decode(
    schema_registry_url: str, relay: RegistryRelay, topic: str
) -> None:
    """A named type of another subject (a schema reference) is fetched and parsed with it."""
    from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": schema_registry_url})
    row_fields = [{"name": "id", "type": "int"}, {"name": "plan", "type": "string"}]
    row = {"type": "record", "name": "Row", "namespace": "crm", "fields": row_fields}
    row_subject = f"{topic}-row"
    client.register_schema(row_subject, Schema(json.dumps(row), "AVRO"))
    version = client.get_latest_version(row_subject).version
    change_fields = [
        {"name": "op", "type": "string"},
        {"name": "after", "type": ["null", "crm.Row"]},  # the other subject's type
    ]
    change = {"type": "record", "name": "Change", "namespace": "crm", "fields": change_fields}
    schema = Schema(json.dumps(change), "AVRO", [SchemaReference("crm.Row", row_subject, version)])
    serializer = AvroSerializer(client, schema)
    event = {"op": "c", "after": {"id": 7, "plan": "Pro"}}
    data = serializer(event, SerializationContext(topic, MessageField.VALUE))
    assert data is not None
    avro = decoder(relay)
    assert await avro.decode(topic, data) == event
    assert await avro.decode(topic, data) == event
    assert relay.fetches == {schema_id_of(data): 1}


async def test_a_new_schema_version_mid_stream(
    schema_registry_url: str, relay: RegistryRelay, topic: str
) -> None:
    old = AvroEvents(schema_registry_url, topic, account_schema())
    new = AvroEvents(schema_registry_url, topic, account_schema(extra_column=True))
    avro = decoder(relay)
    first = account_event("c", None, ACME, lsn=1, ts_ms=1)
    later = account_event("u", ACME, {**ACME, "region": "EU"}, lsn=2, ts_ms=2)
    first_data, later_data = old.encode(first), new.encode(later)
    assert schema_id_of(first_data) != schema_id_of(later_data)
    assert await avro.decode(topic, first_data) == first
    decoded = await avro.decode(topic, later_data)
    assert decoded["after"]["region"] == "EU" and decoded["before"]["region"] is None
    assert relay.fetches == {schema_id_of(first_data): 1, schema_id_of(later_data): 1}


async def test_an_unknown_schema_id_is_a_dead_letter_reason(
    relay: RegistryRelay, topic: str
) -> None:
    data = b"\x00" + UNKNOWN_SCHEMA_ID.to_bytes(4, "big") + b"\x02"
    with pytest.raises(RecordError) as failed:
        await decoder(relay).decode(topic, data)
    assert failed.value.reason == "unknown_schema" and str(UNKNOWN_SCHEMA_ID) in str(failed.value)


async def test_bytes_that_do_not_decode_with_their_schema_say_so(
    schema_registry_url: str, relay: RegistryRelay, topic: str
) -> None:
    data = AvroEvents(schema_registry_url, topic, account_schema()).encode(
        account_event("c", None, ACME, lsn=1, ts_ms=1)
    )
    with pytest.raises(RecordError) as failed:
        await decoder(relay).decode(topic, data[:5] + b"\xff\xff")
    assert failed.value.reason == "source_undecodable"
    assert f"schema {schema_id_of(data)}" in str(failed.value)


async def test_an_outage_is_transient_and_the_record_decodes_once_it_answers(
    schema_registry_url: str, relay: RegistryRelay, topic: str
) -> None:
    events = AvroEvents(schema_registry_url, topic, account_schema())
    data = events.encode(account_event("c", None, ACME, lsn=1, ts_ms=1))
    avro = decoder(relay)
    relay.outage(times=1)
    with pytest.raises(RegistryUnavailable):
        await avro.decode(topic, data)
    assert (await avro.decode(topic, data))["after"] == ACME


async def test_json_schema_values_decode_through_the_registry(
    schema_registry_url: str, relay: RegistryRelay, topic: str
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    schema = (
        '{"type": "object", "properties": {"op": {"type": "string"}, '
        '"after": {"type": "object"}}, "required": ["op"]}'
    )
    serializer = JSONSerializer(schema, SchemaRegistryClient({"url": schema_registry_url}))
    event = {"op": "c", "after": ACME}
    data = serializer(event, SerializationContext(topic, MessageField.VALUE))
    assert data is not None and data[0] == 0
    json_decoder = decoder(relay, "jsonschema")
    assert await json_decoder.decode(topic, data) == event
    with pytest.raises(RecordError) as failed:  # valid JSON that breaks its schema
        await json_decoder.decode(topic, data[:5] + b'{"after": {}}')
    assert failed.value.reason == "source_undecodable"
    assert relay.fetches == {schema_id_of(data): 1}


# ----------------------------------------------------------------------------- protobuf
async def test_protobuf_values_of_a_proto_text_schema_with_imports_decode(
    schema_registry_url: str, relay: RegistryRelay, topic: str
) -> None:
    """The schema registered as .proto text referencing another subject (as Java's
    serializers and Apicurio register it); the bytes framed with the message indexes."""
    schema_id = register_envelope(schema_registry_url, topic)
    classes = envelope_classes()
    event = classes["crm.Envelope"](
        op="c",
        after=classes["crm.Envelope.Row"](**ACME),
        source=classes["crm.Source"](table="accounts", ts_ms=1_700_000_000_000),
    )
    event.seen.FromSeconds(1_700_000_000)
    protobuf = decoder(relay, "protobuf")
    decoded = await protobuf.decode(topic, wire(schema_id, [0], event))
    assert decoded["op"] == "c" and decoded["source"] == {"table": "accounts",
                                                          "ts_ms": 1_700_000_000_000}  # fmt: skip
    assert decoded["after"] == ACME
    assert decoded["seen"] == "2023-11-14T22:13:20Z"
    # A nested message by its indexes; a default value is there (proto3 sends none).
    row = await protobuf.decode(topic, wire(schema_id, [0, 0], classes["crm.Envelope.Row"](id=0)))
    assert row == {"id": 0, "tenant": "", "name": "", "plan": "", "owner": ""}
    # A 64-bit integer past 2**53 keeps its exact digits (as text: a float would round it).
    big = classes["crm.Envelope.Row"](id=2**62 + 1)
    assert (await protobuf.decode(topic, wire(schema_id, [0, 0], big)))["id"] == str(2**62 + 1)
    assert relay.fetches == {schema_id: 1}  # once per id, whatever the message
    for bad, says in [
        (wire(schema_id, [3], event), "message index [3]"),
        (wire(schema_id, [0], event)[:-3] + b"\xff\xff\xff", "does not parse"),
    ]:
        with pytest.raises(RecordError, match=re.escape(says)) as failed:
            await protobuf.decode(topic, bad)
        assert failed.value.reason == "source_undecodable"
    with pytest.raises(RecordError) as unknown:
        await protobuf.decode(topic, b"\x00" + UNKNOWN_SCHEMA_ID.to_bytes(4, "big") + b"\x00")
    assert unknown.value.reason == "unknown_schema"


async def test_protobuf_values_of_confluent_kafkas_serializer_decode(
    schema_registry_url: str, relay: RegistryRelay, topic: str
) -> None:
    """confluent-kafka's Python serializer registers the schema as a base64 descriptor."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    text = COMMON_PROTO.replace("package crm;", "package crmone;")
    source = proto_classes({"one.proto": text}, "one.proto", ("crmone.Source",))["crmone.Source"]
    client = SchemaRegistryClient({"url": schema_registry_url})
    serializer = ProtobufSerializer(source, client, {"use.deprecated.format": False})
    context = SerializationContext(topic, MessageField.VALUE)
    data = serializer(source(table="tickets", ts_ms=5), context)
    assert data is not None
    decoded = await decoder(relay, "protobuf").decode(topic, data)
    assert decoded == {"table": "tickets", "ts_ms": 5}
