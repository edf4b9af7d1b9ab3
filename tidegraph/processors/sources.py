"""Declared sources: the feeds users already run (Debezium change events, schema-registry
Avro, Protobuf or JSON Schema, any JSON topic), read by the worker beside its input topic
(docs/sources.md).

A sources file (YAML) declares per source its topics, the value format, the envelope, and how
each record becomes an episode: its group id, its id, its reference time. ``SourceSet.load``
validates it at start (``SourceFileError``: one line that names the file and the problem).
``SourceSpec.episode`` turns one decoded record into the project's one spelling of an episode
(``tidegraph.records.episode``), or says why it is skipped (a tombstone, a heartbeat, ...), or
raises a ``RecordError`` with the dead-letter reason. Pure logic: the bytes are decoded by
``tidegraph.pipelines.streaming.sources`` (JSON here, Avro through the registry there).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from tidegraph.processors.mapping import render
from tidegraph.records import jsontext
from tidegraph.records.episode import MAX_ID_CHARS, Episode, parse_episode
from tidegraph.records.errors import MappingError, RecordError

# Debezium's change-event fields kept as an episode's content (the transaction block and the
# connector's own processing time are left out: they say nothing about the row).
CHANGE_FIELDS = ("op", "before", "after", "source")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
# A template field read from a row (what a truncate event lacks).
_ROW_FIELD = re.compile(r"(?<!\{)\{\s*(row|after|before|key)\b")


class SourceFileError(ValueError):
    """A sources file that cannot be used; the message is one line naming the problem."""


class RegistrySpec(BaseModel):
    """A schema registry with Confluent's API (Confluent, Apicurio's ccompat API, ...)."""

    model_config = ConfigDict(extra="forbid")

    url: str
    username: str | None = None
    password: str | None = None  # "${NAME}": the environment variable NAME's value

    @field_validator("password")
    @classmethod
    def _from_environment(cls, v: str | None) -> str | None:
        if v is not None and (m := _ENV_REF.fullmatch(v)):
            if m.group(1) not in os.environ:
                raise ValueError(f"registry password names ${{{m.group(1)}}}, which is not set")
            return os.environ[m.group(1)]
        return v

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"registry url {v!r} must start with http:// or https://")
        return v.rstrip("/")


class SourceSpec(BaseModel):
    """One declared source (docs/sources.md "The sources file")."""

    model_config = ConfigDict(extra="forbid")

    name: str
    topics: list[str] = Field(default_factory=list)
    pattern: str | None = None  # a regular expression over topic names
    format: Literal["json", "avro", "jsonschema", "protobuf"] = "json"
    envelope: Literal["debezium", "none"] = "none"
    registry: RegistrySpec | None = None
    group: str  # a template ({after.tenant}, {key.id}, {headers.tenant}) or a constant
    episode_id: str | None = None  # a template; default: the source position
    reference_time: str | None = None  # a field path; default: source.ts_ms, else the record's
    # What a truncate (op t) does: ignore (skipped, counted), or close every open fact of
    # the table's rows in the group at the truncate's time (docs/sources.md "Truncates").
    truncate: Literal["ignore", "close"] = "ignore"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"source name {v!r} must be 1-100 letters, digits, '_', '.', '-'")
        return v

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"pattern {v!r} is not a regular expression: {exc}") from None
        return v

    @field_validator("group", "episode_id")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None:
            _check_template(v)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> SourceSpec:
        if bool(self.topics) == (self.pattern is not None):
            raise ValueError(f"source {self.name!r}: give either topics or pattern")
        if self.format != "json" and self.registry is None:
            raise ValueError(
                f"source {self.name!r}: format {self.format} needs a registry (its url)"
            )
        if self.truncate == "close":
            if self.envelope != "debezium":
                raise ValueError(
                    f"source {self.name!r}: truncate: close reads Debezium's truncates "
                    "(envelope: debezium)"
                )
            rowwise = _ROW_FIELD.search(self.group)
            if rowwise:
                raise ValueError(
                    f"source {self.name!r}: truncate: close needs a group without "
                    f"{{{rowwise.group(1)}...}} (a truncate has no row, no key): a constant, "
                    "{source.db}, {headers.NAME}"
                )
        return self

    def reads(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics

    # ------------------------------------------------------------------ records -> episodes
    def episode(self, record: SourceRecord) -> Episode | Skipped:
        """The episode ``record`` (decoded) becomes, or why it is skipped. Raises a
        ``RecordError`` (its reason is the dead letter's) when it does not fit."""
        if record.value is None:
            return Skipped("tombstone")
        value = record.value
        if not isinstance(value, dict):
            raise RecordError(
                f"source {self.name}: the value is {type(value).__name__}, not an object",
                reason="not_an_object",
            )
        if self.envelope == "debezium":
            value = _unwrap_schema(value)
            skipped = _not_a_row_change(value)
            if skipped is not None:
                return skipped
            if value["op"] == "t" and self.truncate == "ignore":
                return Skipped("truncate")
            content = {field: value.get(field) for field in CHANGE_FIELDS}
        else:
            content = value
        fields = {
            **content,
            "key": _unwrap_schema(record.key) if isinstance(record.key, dict) else record.key,
            "headers": record.headers,
            "kafka": {"topic": record.topic, "partition": record.partition,
                      "offset": record.offset},
        }  # fmt: skip
        if self.envelope == "debezium":
            op = content["op"]
            fields["row"] = content["before"] if op == "d" else content["after"]
        envelope = {
            "id": self._episode_id(record, fields, content),
            # exactly as rendered: a padded tenant is refused, never trimmed into another
            "group_id": _filled(self.group, fields, "group", exact=True),
            "source": "json",
            "name": self._name_of(record, content),
            "source_description": f"source {self.name} ({record.topic})",
            "content": content,
            "reference_time": self._reference_time(record, fields),
        }
        return parse_episode(envelope)

    def _episode_id(
        self, record: SourceRecord, fields: dict[str, Any], content: dict[str, Any]
    ) -> str:
        if self.episode_id is not None:
            text = _filled(self.episode_id, fields, "episode_id")
        elif self.envelope == "debezium":
            # The database's own position of the change: the same change read again (a
            # redelivery, a connector restart, the topic re-read) is the same episode. A
            # snapshot's rows share one position: the row's key tells them apart.
            source = content.get("source") or {}
            position = ":".join(
                str(source.get(part)) for part in ("lsn", "txId", "ts_ms") if part in source
            )
            if not position:
                position = f"{record.partition}:{record.offset}"
            key = jsontext.dumps(fields["key"], sort_keys=True).decode()
            text = f"{record.topic}:{content['op']}:{position}:{key}"
        else:
            text = f"{record.topic}:{record.partition}:{record.offset}"
        if len(text) > MAX_ID_CHARS:
            text = f"{self.name}:{hashlib.sha256(text.encode()).hexdigest()}"
        return text

    def _name_of(self, record: SourceRecord, content: dict[str, Any]) -> str:
        if self.envelope == "debezium":
            table = (content.get("source") or {}).get("table") or record.topic
            return f"{table} {content['op']}"[:200]
        return f"{self.name} {record.topic}"[:200]

    def _reference_time(self, record: SourceRecord, fields: dict[str, Any]) -> str | float:
        if self.reference_time is not None:
            value = _field(fields, self.reference_time)
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise RecordError(
                    f"source {self.name}: reference_time field {self.reference_time!r} is "
                    f"{value!r}, not a time",
                    reason="bad_timestamp",
                )
            return _epoch_seconds(value) if not isinstance(value, str) else value
        if self.envelope == "debezium":
            ts = (fields.get("source") or {}).get("ts_ms")
            if isinstance(ts, int | float) and not isinstance(ts, bool):
                return ts / 1000.0
        if record.timestamp_ms is None:
            raise RecordError(
                f"source {self.name}: the record has no timestamp and no reference_time field "
                "is declared",
                reason="bad_timestamp",
            )
        return record.timestamp_ms / 1000.0


@dataclass(frozen=True)
class SourceRecord:
    """A consumed record of a source, its key and value decoded (None: null)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: Any
    value: Any
    headers: dict[str, str]


@dataclass(frozen=True)
class Skipped:
    """A record that is no episode and no failure: ``kind`` is the metric's label
    (tombstone, heartbeat, schema_change, transaction, truncate, message)."""

    kind: str


class SourceSet(BaseModel):
    """The sources file."""

    model_config = ConfigDict(extra="forbid")

    sources: list[SourceSpec]
    _by_topic: dict[str, SourceSpec | None] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _unique(self) -> SourceSet:
        names = [s.name for s in self.sources]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"source names must be unique: {', '.join(twice)}")
        if not self.sources:
            raise ValueError("the file declares no source")
        return self

    @classmethod
    def load(cls, path: Path | str) -> SourceSet:
        """The validated file; ``SourceFileError`` (one line) when it cannot be used."""
        try:
            data = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise SourceFileError(f"sources file {path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise SourceFileError(f"sources file {path} is not YAML: {_one_line(exc)}") from None
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            message = str(first["msg"]).removeprefix("Value error, ")
            raise SourceFileError(
                f"sources file {path} is invalid: {where + ': ' if where else ''}{message}"
            ) from None

    def for_topic(self, topic: str) -> SourceSpec | None:
        """The source that reads ``topic`` (the first declared), looked up once per topic."""
        if topic not in self._by_topic:
            self._by_topic[topic] = next((s for s in self.sources if s.reads(topic)), None)
        return self._by_topic[topic]


# ----------------------------------------------------------------------------- helpers
def _check_template(template: str) -> None:
    """A template's braces must pair (``{path}``, ``{{``/``}}`` for literal braces)."""
    stripped = re.sub(r"\{\{|\}\}|\{[^{}]+\}", "", template)
    if "{" in stripped or "}" in stripped:
        raise ValueError(f"template {template!r} has an unpaired brace")


def _filled(template: str, fields: dict[str, Any], what: str, *, exact: bool = False) -> str:
    """The template filled in: values as in a mapping's keys (``key_text``), or ``exact``ly
    as they are."""
    try:
        return render(template, fields, key=not exact)
    except MappingError as exc:
        raise RecordError(f"{what} template {template!r}: {exc}", reason=exc.reason) from None


def _field(fields: dict[str, Any], path: str) -> Any:
    value: Any = fields
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise RecordError(f"field {path!r} is missing", reason="mapping_missing_field")
        value = value[part]
    return value


def _epoch_seconds(value: int | float) -> float:
    """A numeric time: epoch milliseconds from 12 digits on, else seconds."""
    return value / 1000.0 if abs(value) >= 1e11 else float(value)


def _unwrap_schema(value: dict[str, Any]) -> Any:
    """Connect's JSON converter with schemas: ``{schema, payload}`` -> the payload."""
    if set(value) == {"schema", "payload"}:
        return value["payload"]
    return value


def _not_a_row_change(value: Any) -> Skipped | None:
    """Debezium's events that are no row change: heartbeats (``ts_ms`` only), schema changes
    (``ddl``/``tableChanges``), transaction boundaries (``status`` BEGIN/END), logical decoding
    messages (op ``m``). An event with no ``op`` at all and none of these shapes is not
    Debezium's (a dead letter)."""
    if not isinstance(value, dict):
        raise RecordError("a change event must be an object", reason="not_an_object")
    op = value.get("op")
    if op is None:
        if "ddl" in value or "tableChanges" in value:
            return Skipped("schema_change")
        if value.get("status") in ("BEGIN", "END"):
            return Skipped("transaction")
        if set(value) <= {"ts_ms", "databaseName"}:
            return Skipped("heartbeat")
        raise RecordError(
            "the value is not a Debezium change event (no op)", reason="missing_field"
        )
    if op == "m":
        return Skipped("message")
    if op not in ("r", "c", "u", "d", "t"):
        raise RecordError(f"op {op!r} is not one of r, c, u, d, t", reason="unknown_op")
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
