"""JSON values of a source with Connect's schema parsed once per topic and schema
(tidegraph/pipelines/streaming/connect_json.py): every value decodes to exactly what parsing
it whole gives, and every value that is not JSON fails the same way (docs/sources.md
"Value formats")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tidegraph.pipelines.streaming.connect_json import JsonValues
from tidegraph.records import jsontext

TOPIC = "crm.public.accounts"
SCHEMA = {
    "type": "struct",
    "name": "crm.public.accounts.Envelope",
    "fields": [{"type": "string", "optional": False, "field": "op"}],
}


def connect(payload: Any, schema: Any = SCHEMA) -> bytes:
    return jsontext.dumps({"schema": schema, "payload": payload})


def change(n: int, **extra: Any) -> dict[str, Any]:
    return {"op": "u", "after": {"id": n, "plan": f"plan {n}", **extra}}


def test_a_topics_later_values_reuse_the_schema_parsed_first() -> None:
    values = JsonValues()
    first = values.decode(TOPIC, connect(change(1)))
    second = values.decode(TOPIC, connect(change(2)))
    assert second == {"schema": SCHEMA, "payload": change(2)}
    assert second["schema"] is first["schema"]  # not parsed again


def test_every_value_decodes_as_parsing_it_whole_does() -> None:
    other = {**SCHEMA, "name": "crm.public.accounts.Envelope2"}
    tricky = {**SCHEMA, "parameters": {"a": "1", "payload": "2"}}  # ,"payload": in the schema
    datas = [
        connect(change(1)),
        connect(change(2, note='x,"payload":{}')),  # the same text inside the payload
        connect(change(3, payload={"payload": 1})),
        connect(change(2**70)),  # an integer over 64 bits stays exact
        connect(None),
        connect(change(4), other),  # the schema changed mid-stream
        connect(change(5), other),
        connect(change(6)),  # and back
        connect(change(7), tricky),
        connect(change(8), tricky),
        orjson.dumps(change(9)),  # schemas off
        orjson.dumps({"payload": change(10), "schema": SCHEMA}),  # another order
        b'{"schema": {"type": "struct"}, "payload": {"op": "c"}}',  # other spacing
        b"[1, 2]",
        b"null",
    ]
    values = JsonValues()
    for data in datas + datas:
        assert values.decode(TOPIC, data) == jsontext.loads(data), data
    assert values.decode(TOPIC, datas[3])["payload"]["after"]["id"] == 2**70


@pytest.mark.parametrize(
    "tail",
    [
        b'{"op": "u"',  # cut short
        b'{"op": "u"}, "payload": 1}',  # a key twice
        b'{"op": "u"},"extra":1}',  # a third key: parsed whole, as ever
        b"}",  # no payload
        b'{"op": "u"}}  ',  # text after the value
        b'{"op": "\xff"}}',  # not UTF-8
    ],
)
def test_a_value_after_a_known_schema_decodes_or_fails_as_parsing_it_whole_does(
    tail: bytes,
) -> None:
    values = JsonValues()
    known = connect(change(1))
    values.decode(TOPIC, known)
    data = known[: known.index(b',"payload":') + len(b',"payload":')] + tail
    try:
        expected: Any = jsontext.loads(data)
    except ValueError as exc:
        with pytest.raises(ValueError) as raised:
            values.decode(TOPIC, data)
        assert str(raised.value) == str(exc)
    else:
        assert values.decode(TOPIC, data) == expected


def test_topics_keep_their_own_schemas() -> None:
    values = JsonValues()
    other = {**SCHEMA, "name": "crm.public.contacts.Envelope"}
    values.decode(TOPIC, connect(change(1)))
    values.decode("crm.public.contacts", connect(change(2), other))
    assert values.decode(TOPIC, connect(change(3))) == {"schema": SCHEMA, "payload": change(3)}
    decoded = values.decode("crm.public.contacts", connect(change(4), other))
    assert decoded == {"schema": other, "payload": change(4)}
