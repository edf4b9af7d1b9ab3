"""The input envelope (docs/streaming.md "Topics") and its validation: ``parse_episode`` turns raw
bytes
into an ``Episode`` or raises ``InvalidEpisode`` with the dead-letter reason of the first
problem found."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from functools import cached_property
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from tidegraph.records import jsontext
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.ids import SURROGATE, id_problem, stable_uuid
from tidegraph.records.times import TIME_RANGE, TimeOutOfRange, iso, within_range

MAX_CONTENT_CHARS = 200_000


MAX_NAME_CHARS = 512


MAX_ID_CHARS = 512


MAX_GROUP_ID_CHARS = 256


def _exact_group_id(value: str) -> str:
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(f"group id {value[:80]!r} {problem}; send it exactly, without them")
    return value


# A group id (tenant) as every way in takes it: 1-256 characters, kept exactly as sent (the
# worker's rule: ``id_problem``).
GroupId = Annotated[
    str, Field(min_length=1, max_length=MAX_GROUP_ID_CHARS), AfterValidator(_exact_group_id)
]


# Objects and arrays nested deeper than this are refused before anything recursive (pydantic,
# str(), orjson's 254-level encoder) can meet them.
MAX_JSON_DEPTH = 64


def json_too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``value`` nests dicts/lists more than ``limit`` levels (no recursion; only
    containers are stacked)."""
    if not isinstance(value, dict | list | tuple):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children: Iterable[Any] = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, dict | list | tuple):
                stack.append((child, depth + 1))
    return False


# ----------------------------------------------------------------------------- episodes
class Episode(BaseModel):
    """The input envelope (docs/streaming.md "Topics"). Kafka key = group_id.

    ``id`` (also read as ``episode_id``, the name the HTTP API and MCP use) and ``group_id``
    are kept exactly as sent: padding or control characters are refused, never trimmed
    (trimming would merge tenant "X " into "X"). ``source`` may be left out: ``json`` for an
    object, ``message`` for text. A numeric ``reference_time`` is epoch seconds. Validation
    never raises anything but pydantic's ValidationError; custom problems carry their
    dead-letter reason as the error type."""

    # Frozen: its uuid and content hash are computed once (an episode passes through every
    # stage, each asking for them).
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True)

    id: str = Field(
        min_length=1, max_length=MAX_ID_CHARS, validation_alias=AliasChoices("id", "episode_id")
    )
    group_id: str = Field(min_length=1, max_length=MAX_GROUP_ID_CHARS)
    source: Literal["message", "text", "json"]
    name: str = Field("", max_length=MAX_NAME_CHARS)
    source_description: str = Field("", max_length=1024)
    content: str | dict[str, Any]
    reference_time: datetime

    @model_validator(mode="before")
    @classmethod
    def _one_name_each(cls, data: Any) -> Any:
        """``episode_id`` is another name of ``id`` (never both); ``source`` follows from the
        content when left out."""
        if not isinstance(data, dict):
            return data
        if "id" in data and "episode_id" in data:
            raise PydanticCustomError(
                "invalid_id", "give the episode's id once: id or episode_id, not both"
            )
        if "source" not in data and "content" in data:
            data = {**data, "source": "json" if isinstance(data["content"], dict) else "message"}
        return data

    @field_validator("id", "group_id", mode="before")
    @classmethod
    def _exact_id(cls, v: Any, info: Any) -> Any:
        problem = id_problem(v) if isinstance(v, str) else None
        if problem is not None:
            reason = "invalid_id" if info.field_name == "id" else "invalid_group_id"
            raise PydanticCustomError(
                reason,
                "{field} {value} {problem}; it is kept exactly as sent, so send it without them",
                {"field": info.field_name, "value": repr(v[:80]), "problem": problem},
            )
        return v

    @field_validator("name", "source_description", mode="before")
    @classmethod
    def _text(cls, v: Any, info: Any) -> Any:
        if isinstance(v, str) and SURROGATE.search(v):
            raise PydanticCustomError(
                "invalid_utf8", "{field} has a lone UTF-16 surrogate (not text)",
                {"field": info.field_name},
            )  # fmt: skip
        return v

    @field_validator("reference_time", mode="before")
    @classmethod
    def _epoch_seconds(cls, v: Any) -> Any:
        if isinstance(v, str) and _NUMBER.match(v.strip()):
            v = float(v)
        if isinstance(v, int | float) and not isinstance(v, bool):
            try:
                return datetime.fromtimestamp(v, UTC)
            except (OverflowError, OSError, ValueError):
                raise PydanticCustomError(
                    "bad_timestamp",
                    "reference_time {value} is read as seconds since 1970 and is out of range "
                    "(send ISO 8601 or epoch seconds)",
                    {"value": v},
                ) from None
        return v

    @field_validator("reference_time")
    @classmethod
    def _aware_utc(cls, v: datetime) -> datetime:
        try:
            return within_range(v)
        except TimeOutOfRange:
            raise PydanticCustomError(
                "bad_timestamp",
                "reference_time {value} is out of range: tidegraph reads {range}",
                {"value": v.isoformat(), "range": TIME_RANGE},
            ) from None

    @field_validator("content", mode="before")
    @classmethod
    def _content_fits(cls, v: Any, info: ValidationInfo) -> Any:
        # A json episode's content is an object whatever else it is (a list is not "the
        # wrong type" of a json episode's content but no json episode at all); an empty
        # object is empty content, like "" (docs/streaming.md "Retries and dead letters").
        if info.data.get("source") == "json" and not isinstance(v, dict):
            raise PydanticCustomError(
                "invalid_content", "a json episode's content must be an object"
            )
        if isinstance(v, dict):
            if not v:
                raise PydanticCustomError("invalid_content", "content is empty")
            if json_too_deep(v):
                raise PydanticCustomError(
                    "too_deep", "content nests more than {limit} levels", {"limit": MAX_JSON_DEPTH}
                )
            try:
                size = len(_canonical_json(v))
            except (TypeError, ValueError) as exc:  # a surrogate, a 5,000-digit integer
                raise PydanticCustomError(
                    "invalid_content", "content cannot be written as JSON: {error}",
                    {"error": str(exc)[:200]},
                ) from None  # fmt: skip
        elif isinstance(v, str):
            if not v.strip():
                raise PydanticCustomError("invalid_content", "content is empty")
            if SURROGATE.search(v):
                raise PydanticCustomError(
                    "invalid_utf8", "content has a lone UTF-16 surrogate (not text)"
                )
            size = len(v)
        else:
            return v  # pydantic refuses it with its own type error
        if size > MAX_CONTENT_CHARS:
            raise PydanticCustomError(
                "oversized",
                "content is {size} characters; the limit is {limit}",
                {"size": size, "limit": MAX_CONTENT_CHARS},
            )
        return v

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Episode:
        copy = super().model_copy(update=update, deep=deep)
        if update:  # other fields: what was computed from the old ones goes
            for name in _COMPUTED:
                copy.__dict__.pop(name, None)
        return copy

    @cached_property
    def uuid(self) -> str:
        return stable_uuid("episode", self.group_id, self.id)

    def content_text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return _canonical_json(self.content)

    @cached_property
    def content_hash(self) -> str:
        """What identifies the episode's content (everything but its ids): a re-sent episode
        has the same hash; an id reused for other content has another."""
        return hashlib.sha256(
            _canonical_json(
                {
                    "source": self.source,
                    "name": self.name,
                    "source_description": self.source_description,
                    "content": self.content,
                    "reference_time": iso(self.reference_time),
                }
            ).encode()
        ).hexdigest()


# Episode's cached properties.
_COMPUTED = ("uuid", "content_hash")

_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def _canonical_json(value: Any) -> str:
    return jsontext.dumps(value, sort_keys=True).decode()


# pydantic's error types that name a reason by themselves (Episode's own checks raise their
# reason as the error type).
_PYDANTIC_REASONS = {"missing": "missing_field", "extra_forbidden": "unknown_field"}
# The error types Episode's own checks raise: each is its dead-letter reason.
CUSTOM_REASONS = frozenset(
    {
        "invalid_id",
        "invalid_group_id",
        "bad_timestamp",
        "too_deep",
        "oversized",
        "invalid_content",
        "invalid_utf8",
    }
)


_FIELD_REASONS = {
    "id": "invalid_id",
    "group_id": "invalid_group_id",
    "source": "unknown_source",
    "reference_time": "bad_timestamp",
    "name": "field_too_long",
    "source_description": "field_too_long",
}


def parse_episode(raw: bytes | str | dict[str, Any]) -> Episode:
    """Validate one envelope. Raises InvalidEpisode (a ValueError) with a readable message and
    the dead-letter reason of the first problem found; never anything else."""
    try:
        return _parse_episode(raw)
    except InvalidEpisode:
        raise
    except Exception as exc:  # a check this module did not foresee: still the record's fault
        raise InvalidEpisode(
            f"invalid episode: {type(exc).__name__}: {exc}", reason="invalid_episode"
        ) from exc


def _parse_episode(raw: bytes | str | dict[str, Any]) -> Episode:
    if isinstance(raw, dict):
        data: Any = raw
    else:
        if not raw.strip():
            raise InvalidEpisode("the record is empty", reason="empty_record")
        try:
            data = jsontext.loads(raw)
        except orjson.JSONDecodeError as exc:
            reason = "invalid_json"
            # orjson says "str is not valid UTF-8" for bytes that are not UTF-8; a leading
            # byte order mark ("UTF-8 byte order mark (BOM) is not supported") is UTF-8 text
            # that is not JSON (RFC 8259 §8.1).
            if "not valid UTF-8" in str(exc):
                reason = "invalid_utf8"
            elif "depth limit" in str(exc):
                reason = "too_deep"
            raise InvalidEpisode(f"not valid JSON: {exc}", reason=reason) from exc
    if not isinstance(data, dict):
        raise InvalidEpisode(
            f"an episode must be a JSON object, not {type(data).__name__}",
            reason="not_an_object",
        )
    if json_too_deep(data, MAX_JSON_DEPTH + 1):
        raise InvalidEpisode(
            f"the record nests more than {MAX_JSON_DEPTH} levels", reason="too_deep"
        )
    try:
        episode = Episode.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'episode'}: {e['msg']}" for e in errors
        )
        raise InvalidEpisode(f"invalid episode: {problems}", reason=_reason_of(errors[0])) from exc
    return episode


def _reason_of(error: Any) -> str:
    """The dead-letter reason of one of pydantic's errors about an envelope."""
    kind = str(error["type"])
    if kind in CUSTOM_REASONS:
        return kind
    if kind in _PYDANTIC_REASONS:
        return _PYDANTIC_REASONS[kind]
    field = str(error["loc"][0]) if error["loc"] else ""
    if kind.endswith("_type") and field != "source":
        return "wrong_type"
    return _FIELD_REASONS.get(field, "invalid_episode")
