"""Avro values in the schema registry's wire format (docs/sources.md "Schema registry").

Confluent's framing: a zero byte, the schema id (4 bytes, big endian), then Avro binary. The
writer's schema is fetched once per id with confluent-kafka's registry client (with the
schemas it references, each a subject and version), parsed once by fastavro, and every value
of that id is read by fastavro's ``schemaless_reader`` with the parsed schema. confluent-kafka's
``AvroDeserializer`` reads the same bytes the same way, but walks the schema again for every
record (its data-contract rules, inline tags, the schema's expansion, the subject's name):
four times fastavro's own read of a Debezium change event.
"""

from __future__ import annotations

import io
from typing import Any

import orjson
from fastavro import parse_schema, schemaless_reader

# The framing before the Avro binary: the zero byte and the 4-byte schema id (checked by the
# caller, ``RegistryDecoder``).
FRAMING_BYTES = 5


class AvroValues:
    """``decode(data, context) -> value``: a wire-format Avro value, its writer's schema
    fetched through ``client`` (confluent-kafka's ``SchemaRegistryClient``) once per id. The
    registry's errors pass through (``SchemaRegistryError``: the caller tells an unknown id
    from an outage); bytes that do not decode raise fastavro's errors."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._parsed: dict[int, Any] = {}

    def __call__(self, data: bytes, context: Any = None) -> Any:
        schema_id = int.from_bytes(data[1:FRAMING_BYTES], "big")
        parsed = self._parsed.get(schema_id)
        if parsed is None:
            parsed = self._parsed[schema_id] = self._parse(self.client.get_schema(schema_id))
        return schemaless_reader(io.BytesIO(data[FRAMING_BYTES:]), parsed, None)

    def _parse(self, schema: Any) -> Any:
        """The schema parsed by fastavro, the named types of its references first."""
        named: dict[str, Any] = {}
        self._add_references(schema, named, set())
        return parse_schema(orjson.loads(schema.schema_str), named_schemas=named)

    def _add_references(self, schema: Any, named: dict[str, Any], seen: set[Any]) -> None:
        for ref in schema.references or ():
            if (ref.subject, ref.version) in seen:
                continue
            seen.add((ref.subject, ref.version))
            referenced = self.client.get_version(ref.subject, ref.version).schema
            self._add_references(referenced, named, seen)
            parse_schema(orjson.loads(referenced.schema_str), named_schemas=named)
