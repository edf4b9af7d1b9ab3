"""Avro values through a schema registry (tidegraph/pipelines/streaming/sources.py
``RegistryDecoder``): the wire format, schemas fetched once per id, a new version mid-stream,
unknown ids, bytes that are not the format, an outage. The encoder is confluent-kafka's
serializer; the registry speaks Confluent's API on loopback (tests/support/schema_registry.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.avro_events import AvroEvents, account_event, account_schema
from tests.support.schema_registry import LoopbackSchemaRegistry
from tidegraph.pipelines.streaming.sources import RegistryDecoder, RegistryUnavailable
from tidegraph.processors.sources import RegistrySpec
from tidegraph.records.errors import RecordError

TOPIC = "crm.public.accounts"
ACME = {"id": 1, "tenant": "north", "name": "Acme", "plan": "Pro", "owner": "Alice"}


@pytest.fixture
def registry() -> Iterator[LoopbackSchemaRegistry]:
    with LoopbackSchemaRegistry() as server:
        yield server


def decoder(registry: LoopbackSchemaRegistry) -> RegistryDecoder:
    return RegistryDecoder(RegistrySpec(url=registry.url))


async def test_values_decode_and_each_schema_is_fetched_once(
    registry: LoopbackSchemaRegistry,
) -> None:
    events = AvroEvents(registry.url, TOPIC, account_schema())
    avro = decoder(registry)
    for lsn in range(1, 6):
        event = account_event("c", None, {**ACME, "id": lsn}, lsn=lsn, ts_ms=1_700_000_000_000)
        assert await avro.decode(TOPIC, events.encode(event)) == event
    assert registry.fetches == {1: 1}


async def test_a_new_schema_version_mid_stream(registry: LoopbackSchemaRegistry) -> None:
    old = AvroEvents(registry.url, TOPIC, account_schema())
    new = AvroEvents(registry.url, TOPIC, account_schema(extra_column=True))
    avro = decoder(registry)
    first = account_event("c", None, ACME, lsn=1, ts_ms=1)
    later = account_event("u", ACME, {**ACME, "region": "EU"}, lsn=2, ts_ms=2)
    assert await avro.decode(TOPIC, old.encode(first)) == first
    decoded = await avro.decode(TOPIC, new.encode(later))
    assert decoded["after"]["region"] == "EU" and decoded["before"]["region"] is None
    assert sorted(registry.fetches) == [1, 2]


async def test_an_unknown_schema_id_is_a_dead_letter_reason(
    registry: LoopbackSchemaRegistry,
) -> None:
    with pytest.raises(RecordError) as failed:
        await decoder(registry).decode(TOPIC, b"\x00\x00\x00\x00\x63" + b"\x02")
    assert failed.value.reason == "unknown_schema" and "99" in str(failed.value)


@pytest.mark.parametrize(
    "data",
    [b'{"op": "c"}', b"\x00\x00", b"\x01\x00\x00\x00\x01abc", b"\x00\x00\x00\x00\x01\xff\xff"],
)
async def test_bytes_that_are_not_the_format_say_so(
    registry: LoopbackSchemaRegistry, data: bytes
) -> None:
    AvroEvents(registry.url, TOPIC, account_schema()).encode(
        account_event("c", None, ACME, lsn=1, ts_ms=1)
    )  # schema 1 exists
    with pytest.raises(RecordError) as failed:
        await decoder(registry).decode(TOPIC, data)
    assert failed.value.reason == "source_undecodable"


async def test_an_outage_is_transient_and_the_record_decodes_once_it_answers(
    registry: LoopbackSchemaRegistry,
) -> None:
    events = AvroEvents(registry.url, TOPIC, account_schema())
    data = events.encode(account_event("c", None, ACME, lsn=1, ts_ms=1))
    avro = decoder(registry)
    registry.outage(times=1)
    with pytest.raises(RegistryUnavailable):
        await avro.decode(TOPIC, data)
    assert (await avro.decode(TOPIC, data))["after"] == ACME


async def test_an_unreachable_registry_is_transient() -> None:
    with LoopbackSchemaRegistry() as gone:
        url = gone.url
    with pytest.raises(RegistryUnavailable):
        await RegistryDecoder(RegistrySpec(url=url)).decode(TOPIC, b"\x00\x00\x00\x00\x01\x02")


async def test_json_schema_values_decode_through_the_registry(
    registry: LoopbackSchemaRegistry,
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    schema = (
        '{"type": "object", "properties": {"op": {"type": "string"}, '
        '"after": {"type": "object"}}, "required": ["op"]}'
    )
    serializer = JSONSerializer(schema, SchemaRegistryClient({"url": registry.url}))
    event = {"op": "c", "after": ACME}
    data = serializer(event, SerializationContext(TOPIC, MessageField.VALUE))
    assert data is not None and data[0] == 0
    json_decoder = RegistryDecoder(RegistrySpec(url=registry.url), "jsonschema")
    assert await json_decoder.decode(TOPIC, data) == event
    with pytest.raises(RecordError) as failed:  # valid JSON that breaks its schema
        await json_decoder.decode(TOPIC, data[:5] + b'{"after": {}}')
    assert failed.value.reason == "source_undecodable"
