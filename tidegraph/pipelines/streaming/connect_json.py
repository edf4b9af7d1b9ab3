"""JSON values of a source, read without parsing Connect's schema again for every record
(docs/sources.md "Value formats").

Kafka Connect's JSON converter with schemas on (Debezium's default) writes every value as
``{"schema":{...},"payload":{...}}``: the schema first, the same bytes for every record of a
table until its schema changes, and about six times the payload's size (a CRM row's change
event: 1.2 kB, of which the payload is 0.2 kB). Parsing it whole for every record costs eight
times parsing the payload alone. So the schema's bytes are learned from a record parsed whole,
once per topic and schema; a later record that starts with exactly those bytes has only its
payload parsed, and the schema parsed then is reused. Anything else (no schema, another
schema, other spacing, a value that is not JSON) is parsed whole, as before: what decodes and
what fails, with which error, is the same either way.
"""

from __future__ import annotations

from typing import Any

from tidegraph.records import jsontext

# What Connect's converter writes before a value's schema, and between the schema and the
# payload (compact JSON, the schema first).
SCHEMA_START = b'{"schema":'
PAYLOAD_START = b',"payload":'
# How many places of PAYLOAD_START a record's bytes are tried at when its schema is learned
# (the text can occur inside a schema: a parameter named "payload").
MAX_SPLIT_TRIES = 8


class JsonValues:
    """``decode(topic, data) -> value``: ``jsontext.loads`` of a JSON value (integers exact),
    the schema of a Connect ``{schema, payload}`` value parsed once per topic and schema.
    Raises ``ValueError`` (orjson's ``JSONDecodeError``) for bytes that are not JSON."""

    def __init__(self) -> None:
        # Per topic, the latest schema learned: the bytes a value starts with up to its
        # payload, and the schema they parse to.
        self._schemas: dict[str, tuple[bytes, Any]] = {}

    def decode(self, topic: str, data: bytes) -> Any:
        known = self._schemas.get(topic)
        if known is not None:
            prefix, schema = known
            if data.startswith(prefix) and data.endswith(b"}"):
                try:
                    payload = jsontext.loads(memoryview(data)[len(prefix) : -1])
                except ValueError:
                    pass  # not this shape after all: the whole value says what is wrong
                else:
                    return {"schema": schema, "payload": payload}
        value = jsontext.loads(data)
        if isinstance(value, dict) and value.keys() == {"schema", "payload"}:
            self._learn(topic, data, value["schema"])
        return value

    def _learn(self, topic: str, data: bytes, schema: Any) -> None:
        """Remember the bytes before ``data``'s payload when they are exactly its schema:
        a JSON object ends where it ends, so the bytes that parse whole to the schema object
        are the schema's, whatever the payload holds."""
        if not data.startswith(SCHEMA_START) or not isinstance(schema, dict):
            return
        at = len(SCHEMA_START)
        for _ in range(MAX_SPLIT_TRIES):
            at = data.find(PAYLOAD_START, at)
            if at < 0:
                return
            try:
                parsed = jsontext.loads(data[len(SCHEMA_START) : at])
            except ValueError:
                at += 1
                continue
            if parsed == schema:
                self._schemas[topic] = (data[: at + len(PAYLOAD_START)], schema)
            return
