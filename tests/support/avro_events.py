"""Debezium-shaped change events of the CRM's accounts table in Avro, in the schema registry's
wire format (confluent-kafka's serializer, registering its schema in a real registry), as
Connect's Avro converter writes them."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

# A schema id no registry of the tests hands out (ids count up from 1): unknown to it.
UNKNOWN_SCHEMA_ID = 2**31 - 1


def schema_id_of(data: bytes) -> int:
    """The schema id of a value in the wire format (bytes 1-4, big endian)."""
    return int.from_bytes(data[1:5], "big")


def account_schema(extra_column: bool = False) -> str:
    """The envelope's schema; ``extra_column``: the table gained a column (a new version)."""
    columns: list[dict[str, Any]] = [
        {"name": "id", "type": "int"},
        {"name": "tenant", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "plan", "type": "string"},
        {"name": "owner", "type": "string"},
    ]
    if extra_column:
        columns.append({"name": "region", "type": ["null", "string"], "default": None})
    value = {"type": "record", "name": "Value", "namespace": "crm.public.accounts",
             "fields": columns}  # fmt: skip
    source = {
        "type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
        "fields": [{"name": "table", "type": "string"}, {"name": "lsn", "type": ["null", "long"]},
                   {"name": "txId", "type": ["null", "long"]}, {"name": "ts_ms", "type": "long"}],
    }  # fmt: skip
    envelope = {
        "type": "record", "name": "Envelope", "namespace": "crm.public.accounts",
        "fields": [{"name": "before", "type": ["null", value], "default": None},
                   {"name": "after", "type": ["null", "Value"], "default": None},
                   {"name": "source", "type": source}, {"name": "op", "type": "string"},
                   {"name": "ts_ms", "type": ["null", "long"], "default": None}],
    }  # fmt: skip
    return json.dumps(envelope)


class AvroEvents:
    """Serializes events with a schema registered under ``<topic>-value``."""

    def __init__(self, registry_url: str, topic: str, schema: str) -> None:
        self.client = SchemaRegistryClient({"url": registry_url})
        self.serializer = AvroSerializer(self.client, schema)
        self.context = SerializationContext(topic, MessageField.VALUE)

    def encode(self, event: dict[str, Any]) -> bytes:
        data = self.serializer(event, self.context)
        assert data is not None
        return data


def account_event(op: str, before: Any, after: Any, *, lsn: int, ts_ms: int) -> dict[str, Any]:
    return {"before": before, "after": after, "op": op, "ts_ms": ts_ms,
            "source": {"table": "accounts", "lsn": lsn, "txId": lsn, "ts_ms": ts_ms}}  # fmt: skip
