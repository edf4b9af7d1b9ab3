"""Bad input, one entry per kind, each with the dead letter tidegraph must give it (issue 16).

A :class:`BadCase` is one record exactly as a producer sends it (bytes; ``None`` is a Kafka
tombstone) and the ``(stage, reason)`` that its dead letter (worker) and its ``tidegraph ingest``
failure must carry, one of ``tidegraph/processors/failures.py: REASONS`` (docs/streaming.md
"Retries and dead letters"). The expectations follow the documented rules: the envelope's
(``tidegraph/records/episode.py: Episode, parse_episode``), the mapping's
(``tidegraph/processors/mapping.py``) and the strict times of mapped records
(``tidegraph/processors/temporal.py``).

:func:`bad_corpus` builds it for a run's group ids over the CRM mapping
(``tests.support.crm_feed.CRM_MAPPING``): the cases are spread over the groups, and each
one gets an id of its own (``bad-<kind>``), so a failure that names its episode names its case.
``tests/integration/test_bad_input.py`` sends it through a worker and through ``ingest``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from tests.support.crm_feed import contact_record, plan_record, ticket_record
from tidegraph.processors.mapping import MAX_FACT_CHARS, MAX_KEY_CHARS, MAX_SUMMARY_CHARS
from tidegraph.processors.temporal import MAX_TIME_TEXT
from tidegraph.records import jsontext
from tidegraph.records.episode import (
    MAX_CONTENT_CHARS,
    MAX_GROUP_ID_CHARS,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
)

# The Kafka key `tidegraph produce` gives a line: its group_id, when it has a string one.
GROUP_KEY: Literal["group"] = "group"
WHEN = "2025-03-01T12:00:00Z"  # reference_time of the cases
AT = datetime(2025, 2, 1, 9, 30, tzinfo=UTC)  # event time of the mapped cases
# Input records larger than this are refused by the worker before parsing
# (tidegraph/pipelines/streaming/config.py: WorkerSettings.max_record_bytes,
# TIDEGRAPH_MAX_RECORD_BYTES).
MAX_RECORD_BYTES = 1_000_000

Topic = Literal["episodes", "extracted"]


@dataclass(frozen=True)
class BadCase:
    """One kind of bad input and the failure it must end as."""

    kind: str
    raw: bytes | None  # the record value; None: a tombstone
    stage: str
    reason: str
    key: bytes | None | Literal["group"] = GROUP_KEY  # the Kafka key; GROUP_KEY: as produced
    topic: Topic = "episodes"  # {prefix}.episodes, or the extraction -> resolution hop
    # Set when the envelope is valid: the failure names them (ingest's `episode_id`).
    group_id: str | None = None
    episode_id: str | None = None

    @property
    def is_line(self) -> bool:
        """A line of a JSONL file that `tidegraph produce` and `tidegraph ingest` take as it
        is (both skip blank lines and strip the others' ends)."""
        return (
            self.topic == "episodes"
            and self.key == GROUP_KEY
            and self.raw is not None
            and self.raw.strip() == self.raw != b""
            and b"\n" not in self.raw
            and b"\r" not in self.raw
        )

    @property
    def worker_only(self) -> bool:
        """Only a Kafka producer can send it: a tombstone, a blank value, a key other than
        the group_id, a hop topic's record."""
        return not self.is_line


@dataclass(frozen=True)
class Corpus:
    cases: list[BadCase]
    # Good episodes whose ids cases re-send: written before the cases are sent.
    originals: list[dict[str, Any]] = field(default_factory=list)
    # Originals re-sent with the same content (other bytes): skipped, never dead-lettered.
    resent: list[bytes] = field(default_factory=list)


_DROP = object()


def _slug(kind: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")


def _nested(depth: int) -> bytes:
    """JSON text of objects nested ``depth`` levels (orjson encodes at most 254)."""
    return b'{"a":' * depth + b"1" + b"}" * depth


def _with_field(obj: bytes, name: str, value: bytes) -> bytes:
    """The JSON object ``obj`` with field ``name`` set to the JSON text ``value``."""
    assert obj.endswith(b"}")
    return obj[:-1] + b',"' + name.encode() + b'":' + value + b"}"


class _Builder:
    def __init__(self, groups: list[str]) -> None:
        self.groups = groups
        self.cases: list[BadCase] = []

    @property
    def group(self) -> str:
        """The group of the next case (round robin)."""
        return self.groups[len(self.cases) % len(self.groups)]

    def envelope(self, kind: str, **fields: Any) -> dict[str, Any]:
        """A valid text episode for the next case, with ``fields`` changed (_DROP: removed)."""
        base: dict[str, Any] = {
            "id": f"bad-{_slug(kind)}",
            "group_id": self.group,
            "source": "text",
            "content": "hello",
            "reference_time": WHEN,
        }
        base.update(fields)
        return {k: v for k, v in base.items() if v is not _DROP}

    def mapped(self, kind: str, content: dict[str, Any], **fields: Any) -> dict[str, Any]:
        """A json episode carrying a CRM record (``crm_feed``'s record builders)."""
        name = str(content.get("type", "record"))
        return self.envelope(kind, source="json", name=name, content=content, **fields)

    def add(
        self,
        kind: str,
        raw: bytes | dict[str, Any] | None,
        stage: str,
        reason: str,
        *,
        key: bytes | None | Literal["group"] = GROUP_KEY,
        topic: Topic = "episodes",
    ) -> None:
        assert kind not in {c.kind for c in self.cases}, f"kind {kind!r} twice"
        data = orjson.dumps(raw) if isinstance(raw, dict) else raw
        group_id = episode_id = None
        if stage != "validation" and topic == "episodes":  # a valid envelope
            envelope = orjson.loads(data or b"")
            group_id, episode_id = envelope["group_id"], envelope["id"]
        self.cases.append(BadCase(kind, data, stage, reason, key, topic, group_id, episode_id))

    def invalid(self, kind: str, raw: bytes | dict[str, Any], reason: str) -> None:
        self.add(kind, raw, "validation", reason)


def bad_corpus(groups: list[str]) -> Corpus:
    """Every kind of bad input for the groups ``groups`` (the cases' group ids and keys)."""
    b = _Builder(groups)
    _empty_values(b)
    _malformed_json(b)
    _invalid_utf8(b)
    _too_deep(b)
    _not_objects(b)
    _fields(b)
    _ids(b)
    _sources_and_times(b)
    _contents(b)
    _kafka_keys(b)
    _extraction(b)
    _mapping(b)
    _mapped_times(b)
    originals, resent = _duplicates(b)
    _hop_records(b)
    return Corpus(b.cases, originals, resent)


# ----------------------------------------------------------------------------- the envelope
def _empty_values(b: _Builder) -> None:
    key = b.group.encode()
    b.add("empty value", b"", "validation", "empty_record", key=key)
    b.add("whitespace value", b" \t \r\n ", "validation", "empty_record", key=key)
    b.add("tombstone", None, "validation", "empty_record", key=key)


def _malformed_json(b: _Builder) -> None:
    good = orjson.dumps(b.envelope("malformed"))
    cut = good[:-1]  # the envelope without its closing brace
    shapes = {
        "truncated JSON": good[: len(good) // 2],
        "trailing garbage": good + b" and more",
        "two objects on one line": good + good,
        "single quotes": good.replace(b'"', b"'"),
        "NaN value": cut + b',"score":NaN}',
        "Infinity value": cut + b',"score":Infinity}',
        "number beyond a double": cut + b',"score":1e400}',
        "comment": b"/* from the CRM */ " + good,
        "unquoted keys": re.sub(rb'"(\w+)":', rb"\1:", good),
        "trailing comma": cut + b",}",
        "byte order mark": b"\xef\xbb\xbf" + good,
        "lone high surrogate escape": good.replace(b'"hello"', b'"\\ud800"'),
        "lone low surrogate escape": good.replace(b'"hello"', b'"\\udc00x"'),
        "unescaped control character in a string": good.replace(b'"hello"', b'"a\tb"'),
        "invalid escape": good.replace(b'"hello"', b'"\\x41"'),
        "unterminated string": good.replace(b'"hello"', b'"hello'),
        "plain text": b"hello, this is not JSON",
        "NUL byte": b"\x00",
    }
    for kind, raw in shapes.items():
        assert raw != good
        b.invalid(kind, raw, "invalid_json")


def _invalid_utf8(b: _Builder) -> None:
    good = orjson.dumps(b.envelope("utf8"))
    for kind, text in {
        "invalid UTF-8 byte 0xff": b"\xff",
        "overlong UTF-8 encoding": b"\xc0\xaf",
        "UTF-8 encoded surrogate": b"\xed\xa0\x80",
        "Latin-1 text": "caf\xe9".encode("latin-1"),
        "truncated multi-byte character": b"\xe2\x82",
    }.items():
        b.invalid(kind, good.replace(b"hello", text), "invalid_utf8")


def _too_deep(b: _Builder) -> None:
    b.invalid("array nested beyond orjson's 1024 levels", b"[" * 2000 + b"]" * 2000, "too_deep")
    text = orjson.dumps(b.envelope("deep", content=_DROP))
    json_text = orjson.dumps(b.envelope("deep", source="json", content=_DROP))
    b.invalid(
        "text content nested beyond 1024", _with_field(text, "content", _nested(1100)), "too_deep"
    )
    # The records: a json episode's content nested ~300 and ~1,000 levels.
    b.invalid(
        "json content nested 300 levels",
        _with_field(json_text, "content", _nested(300)),
        "too_deep",
    )
    b.invalid(
        "json content nested 1000 levels",
        _with_field(json_text, "content", _nested(1000)),
        "too_deep",
    )
    b.invalid(
        "json content nested 65 levels", _with_field(json_text, "content", _nested(65)), "too_deep"
    )
    b.invalid(
        "unknown field nested 100 levels",
        _with_field(orjson.dumps(b.envelope("deep")), "extra", _nested(100)),
        "too_deep",
    )
    # The record: one that matches a mapping rule, with one extra field 300 deep.
    record = orjson.dumps(plan_record((7, "Deep Corp"), "Pro", AT))
    b.invalid(
        "mapped record with an extra field nested 300 levels",
        _with_field(json_text, "content", _with_field(record, "extra", _nested(300))),
        "too_deep",
    )


def _not_objects(b: _Builder) -> None:
    for kind, raw in {
        "JSON array": b'[{"id": "a"}]',
        "JSON string": b'"an episode"',
        "JSON number": b"42",
        "JSON null": b"null",
        "JSON true": b"true",
        "JSON false": b"false",
    }.items():
        b.invalid(kind, raw, "not_an_object")


def _fields(b: _Builder) -> None:
    # source is optional (json for an object, message for text: docs/streaming.md "Topics")
    for name in ("id", "group_id", "content", "reference_time"):
        b.invalid(
            f"missing {name}", b.envelope(f"missing {name}", **{name: _DROP}), "missing_field"
        )
    b.invalid(
        "id and episode_id both",
        b.envelope("id twice", episode_id="another-name"),
        "invalid_id",
    )
    b.invalid("empty object", b"{}", "missing_field")
    b.invalid("unknown field", b.envelope("unknown field", priority="high"), "unknown_field")
    b.invalid(
        "misspelt optional field",
        b.envelope("misspelt optional", sourcedescription="CRM"),
        "unknown_field",
    )
    b.invalid("capitalised field name", b.envelope("capitalised", Name="Acme"), "unknown_field")
    # A misspelt required field is missing before it is unknown (the first problem decides;
    # the message names both).
    b.invalid(
        "misspelt required field",
        b.envelope("misspelt required", reference_time=_DROP, referencetime=WHEN),
        "missing_field",
    )
    wrong_types: dict[str, tuple[str, Any]] = {
        "id a number": ("id", 17),
        "id a boolean": ("id", True),
        "group_id a number": ("group_id", 3),
        "group_id null": ("group_id", None),
        "text content a number": ("content", 5),
        "text content a list": ("content", ["hello"]),
        "text content null": ("content", None),
        "reference_time a boolean": ("reference_time", True),
        "reference_time an object": ("reference_time", {"iso": WHEN}),
        "reference_time null": ("reference_time", None),
        "name a number": ("name", 5),
        "source_description a list": ("source_description", ["CRM"]),
    }
    for kind, (name, value) in wrong_types.items():
        b.invalid(kind, b.envelope(kind, **{name: value}), "wrong_type")
    b.invalid(
        "name too long", b.envelope("long name", name="n" * (MAX_NAME_CHARS + 1)), "field_too_long"
    )
    b.invalid(
        "source_description too long",
        b.envelope("long description", source_description="d" * 1025),
        "field_too_long",
    )


def _ids(b: _Builder) -> None:
    bad_ids = {
        "empty": "",
        "only spaces": "   ",
        "padded with a space": " x",
        "NUL": "a\x00b",
        "unit separator": "a\x1fb",
        "DEL": "a\x7fb",
        "C1 control NEL": "a\x85b",
        "newline": "a\nb",
        "tab": "a\tb",
    }
    for what, value in {**bad_ids, "too long": "i" * (MAX_ID_CHARS + 1)}.items():
        b.invalid(f"id {what}", b.envelope(f"id {what}", id=value), "invalid_id")
    for what, value in {
        **bad_ids,
        "padded with a trailing space": f"{b.group} ",
        "too long": "g" * (MAX_GROUP_ID_CHARS + 1),
    }.items():
        b.invalid(
            f"group_id {what}", b.envelope(f"group_id {what}", group_id=value), "invalid_group_id"
        )


def _sources_and_times(b: _Builder) -> None:
    for kind, source in {
        "unknown source": "fax",
        "source in capitals": "TEXT",
        "source a number": 1,
        "source null": None,
    }.items():
        b.invalid(kind, b.envelope(kind, source=source), "unknown_source")
    # The records, exactly.
    for when in ("9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00"):
        b.invalid(
            f"reference_time {when} out of range in UTC",
            {
                "id": "x",
                "group_id": b.group,
                "source": "text",
                "content": "hello",
                "reference_time": when,
            },
            "bad_timestamp",
        )
    for kind, when in {
        "reference_time unparseable": "the day after tomorrowish",
        "reference_time impossible date": "2025-02-30T00:00:00Z",
        "reference_time impossible month": "2025-13-01",
        "reference_time impossible hour": "2025-01-01T25:00:00Z",
        "reference_time empty": "",
        "reference_time huge epoch seconds": 1e20,
        "reference_time negative epoch seconds": -(10**15),
        "reference_time epoch seconds past 9999": "253402300800",
        "reference_time 1e300 as text": "1e300",
        "reference_time 1e300 as a number": 1e300,
    }.items():
        b.invalid(kind, b.envelope(kind, reference_time=when), "bad_timestamp")


def _contents(b: _Builder) -> None:
    for kind, source, content in [
        ("text content empty", "text", ""),
        ("text content whitespace", "text", " \n\t "),
        ("json content a string", "json", '{"type": "account.plan"}'),
        ("json content a list", "json", [{"type": "account.plan"}]),
        ("json content a number", "json", 7),
        ("json content null", "json", None),
        ("json content an empty object", "json", {}),
    ]:
        b.invalid(kind, b.envelope(kind, source=source, content=content), "invalid_content")
    big = MAX_CONTENT_CHARS + 1
    b.invalid(
        "text content over 200,000 characters",
        b.envelope("big text", content="x" * big),
        "oversized",
    )
    b.invalid(
        "json content over 200,000 characters",
        b.envelope("big json", source="json", content={"type": "blob", "data": "x" * big}),
        "oversized",
    )
    b.invalid(
        "record over TIDEGRAPH_MAX_RECORD_BYTES",
        b.envelope("huge record", content="x" * MAX_RECORD_BYTES),
        "oversized",
    )


def _kafka_keys(b: _Builder) -> None:
    mismatch = b.envelope("key is another group")
    b.add("key is another group", mismatch, "validation", "key_mismatch", key=b"another-tenant")
    b.add("no key", b.envelope("no key"), "validation", "key_mismatch", key=None)


# ----------------------------------------------------------------------------- extraction
def _extraction(b: _Builder) -> None:
    # A text or message episode without an LLM is no bad record: it is stored unextracted
    # (docs/architecture.md "Episodes without an LLM"; tests/integration/test_pending.py).
    b.add(
        "json record of an unmapped type",
        b.mapped("unmapped type", {"type": "invoice.paid", "amount": 10}),
        "extraction",
        "no_extractor",
    )
    b.add(
        "json record without a type",
        b.mapped("no type", {"account": {"id": 1}}),
        "extraction",
        "no_extractor",
    )


def _mapping(b: _Builder) -> None:
    plan = plan_record((11, "Mapped Corp"), "Pro", AT)
    ticket = ticket_record("m-1", "open", (11, "Mapped Corp"), AT)
    account = plan["account"]
    missing = {
        "plan record without its plan": {k: v for k, v in plan.items() if k != "plan"},
        "plan record without the account's name": plan | {"account": {"id": 11}},
        "plan record without the account's id (its key)": plan | {"account": {"name": "M"}},
        "plan record whose account is a string": plan | {"account": "Mapped Corp"},
        "ticket record without its subject (the summary)": ticket | {"ticket": {"id": "m-1"}},
    }
    for kind, content in missing.items():
        b.add(kind, b.mapped(kind, content), "extraction", "mapping_missing_field")
    bad_values = {
        "plan null": plan | {"plan": None},
        "plan an object": plan | {"plan": {"name": "Pro"}},
        "plan a list": plan | {"plan": ["Pro"]},
        "plan empty": plan | {"plan": ""},
        "plan only spaces": plan | {"plan": "   "},
        "account id empty (an empty key)": plan | {"account": account | {"id": ""}},
        "account id null": plan | {"account": account | {"id": None}},
        "account id padded (a key is taken exactly)": plan | {"account": account | {"id": "11 "}},
    }
    for kind, content in bad_values.items():
        b.add(kind, b.mapped(kind, content), "extraction", "mapping_bad_value")
    too_long = {
        "entity name over 512": plan | {"plan": "P" * (MAX_NAME_CHARS + 1)},
        "entity key over 512": plan | {"account": account | {"id": "k" * MAX_KEY_CHARS}},
        "summary over 4,000": ticket
        | {"ticket": {"id": "m-1", "subject": "s" * (MAX_SUMMARY_CHARS + 1)}},
        # each part within its limit, the fact text "Ticket m-1 is open: <subject>" over its own
        "fact text over 2,000": ticket
        | {"ticket": {"id": "m-1", "subject": "s" * (MAX_FACT_CHARS - 10)}},
    }
    for kind, content in too_long.items():
        b.add(kind, b.mapped(kind, content), "extraction", "value_too_long")


def _mapped_times(b: _Builder) -> None:
    plan = plan_record((12, "Timed Corp"), "Pro", AT)
    # Read when the facts are stamped: the temporal stage.
    unreadable = {
        "mapped time unreadable": "banana",
        "mapped time an impossible date": "2025-02-30T00:00:00Z",
        "mapped time out of range in UTC (9999)": "9999-12-31T23:59:59-01:00",
        "mapped time out of range in UTC (0001)": "0001-01-01T00:00:00+01:00",
        "mapped time over 100 characters": "2025-02-01 " + "x" * MAX_TIME_TEXT,
        "mapped time of 187 KB": "since 2024 " * 17000,
        "mapped time 17 digits": "99999999999999999",
    }
    for kind, at in unreadable.items():
        b.add(kind, b.mapped(kind, plan | {"at": at}), "temporal", "bad_time")
    left = contact_record("left", (3, "Leaving Person"), (12, "Timed Corp"), AT)
    b.add(
        "closing record with an unreadable time",
        b.mapped("closing bad time", left | {"at": "whenever"}),
        "temporal",
        "bad_time",
    )
    # Refused by the mapping itself: a time field must be text or an epoch number.
    not_times = {
        "mapped time an object": {"iso": "2025-02-01"},
        "mapped time a list": [2025, 2, 1],
        "mapped time a boolean": True,
        "mapped time a number that is no epoch": 12.5,
        "mapped time 1e300": 1e300,
        "mapped time negative epoch": -1700000000,
    }
    for kind, at in not_times.items():
        b.add(kind, b.mapped(kind, plan | {"at": at}), "extraction", "bad_time")


# ----------------------------------------------------------------------------- the store
def _duplicates(b: _Builder) -> tuple[list[dict[str, Any]], list[bytes]]:
    """An id re-sent with other content after its first episode was written: the mapped
    episode's processed marker is read with resolution's lookup (docs/streaming.md "Envelopes are
    taken
    exactly"). Beside it an id re-sent with the same content: written once, no dead letter."""
    conflict = b.mapped("conflicting duplicate", plan_record((21, "Twice Corp"), "Pro", AT))
    b.add(
        "id re-sent with other content",
        conflict | {"content": plan_record((21, "Twice Corp"), "Enterprise", AT)},
        "resolution",
        "conflicting_duplicate",
    )
    same = b.mapped("same duplicate", plan_record((22, "Again Corp"), "Basic", AT))
    resent = orjson.dumps(dict(reversed(same.items())))  # other bytes, the same episode
    return [conflict, same], [resent]


def _hop_records(b: _Builder) -> None:
    """Records on the extraction -> resolution hop that resolution cannot read (a producer
    bug): tidegraph/topics/records.py ExtractedRecord."""
    key = b.group.encode()
    episode = b.envelope("hop episode")
    origin = {"topic": "corpus.episodes", "partition": 0, "offset": 0}
    dangling = {
        "v": 1,
        "origin": origin,
        "extraction": {
            "episode": episode,
            "entities": [{"name": "Acme"}],
            "facts": [{"subject": 0, "object": 3, "relation": "USES", "fact": "Acme uses ?"}],
            "mapped": True,
        },
    }
    for kind, raw in {
        "hop record not JSON": b"garbage on the hop",
        "hop record of another schema": orjson.dumps({"v": 1, "origin": origin}),
        "hop record tombstone": None,
        "hop record with a fact naming a missing entity": orjson.dumps(dangling),
    }.items():
        b.add(kind, raw, "resolution", "bad_hop_record", key=key, topic="extracted")
    # Over the bounds of one extraction (issue 48: 2,000 entities and facts held the group's
    # next record 24 s; nested attributes with a 2**70 integer, 7 s).
    wide = {
        "entities": [{"name": f"Entity {n}", "key": f"k:{n}"} for n in range(2000)],
        "facts": [
            {"subject": n, "object": (n + 1) % 2000, "relation": "RELATES", "fact": f"{n}"}
            for n in range(2000)
        ],
    }
    attributes: dict[str, Any] = {"n": 2**70}
    for _ in range(60):
        attributes = {"x": attributes, "l": [2**70] * 20}
    deep = {"entities": [{"name": "Acme", "attributes": attributes}], "facts": []}
    for kind, drafts in {
        "hop record with 2,000 entities and 2,000 facts": wide,
        "hop record with nested attributes holding 2**70": deep,
    }.items():
        over = {**dangling, "extraction": {**dangling["extraction"], **drafts}}  # type: ignore[dict-item]
        b.add(kind, jsontext.dumps(over), "resolution", "extraction_too_large", key=key,
              topic="extracted")  # fmt: skip
