"""Records that flow between the stages, and the graph records the store returns.

Everything here is plain data (pydantic), serialisable with orjson, and independent of the
transport (in-process or Kafka) and of the store (Neo4j or embedded).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import uuid as uuidlib
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

# Namespace of every deterministic uuid tidegraph derives (uuid5). Never change it: the uuids
# of stored nodes and facts depend on it.
TIDEGRAPH_NAMESPACE = uuidlib.UUID("6f1d2a4e-3c8b-5e7a-9b1f-0d4c2e8a7b63")

MAX_CONTENT_CHARS = 200_000
MAX_NAME_CHARS = 512
MAX_ID_CHARS = 512
MAX_GROUP_ID_CHARS = 256
# Objects and arrays nested deeper than this are refused before anything recursive (pydantic,
# str(), orjson's 254-level encoder) can meet them.
MAX_JSON_DEPTH = 64
RELATION_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
LABEL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
# Control characters (C0, DEL, C1): never part of an id or a group id.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def stable_uuid(*parts: str) -> str:
    """A deterministic uuid from its parts, joined with the unit separator (\\x1f).

    Unambiguous because only the last part of any call may contain the separator: group ids
    and episode ids refuse control characters (``Episode``), the other leading parts are
    constants, uuids and relation names (``RELATION_RE``)."""
    return str(uuidlib.uuid5(TIDEGRAPH_NAMESPACE, "\x1f".join(parts)))


def json_too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``value`` nests dicts/lists more than ``limit`` levels (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def normalize_name(name: str) -> str:
    """The form names are compared in: NFKC, casefolded, punctuation dropped, spaces folded."""
    text = unicodedata.normalize("NFKC", name).casefold()
    text = re.sub(r"[^\w\s]", " ", text)
    return " ".join(text.split())


def to_relation_name(raw: str) -> str:
    """UPPER_SNAKE_CASE relation type from any text; never empty, always RELATION_RE-valid."""
    text = unicodedata.normalize("NFKD", raw).encode("ascii", "ignore").decode()
    text = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").upper()
    if not text or not text[0].isalpha():
        text = "REL_" + text if text else "RELATES_TO"
    return text[:64]


def to_label(raw: str) -> str | None:
    """A safe node label (letters, digits, underscore; starts with a letter) or None."""
    text = re.sub(r"[^A-Za-z0-9_]+", "", raw.strip().replace(" ", "_"))
    if not text or not text[0].isalpha():
        return None
    text = text[:64]
    return text if LABEL_RE.match(text) else None


def utc(dt: datetime) -> datetime:
    """Aware UTC datetime (naive input is taken as UTC), truncated to microseconds."""
    if dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(dt: datetime | None) -> str | None:
    return None if dt is None else utc(dt).isoformat().replace("+00:00", "Z")


# ----------------------------------------------------------------------------- episodes
class Episode(BaseModel):
    """The input envelope (README "Topics"). Kafka key = group_id.

    ``id`` and ``group_id`` are kept exactly as sent: padding or control characters are
    refused, never trimmed (trimming would merge tenant "X " into "X"). A numeric
    ``reference_time`` is epoch seconds. Validation never raises anything but pydantic's
    ValidationError; custom problems carry their dead-letter reason as the error type."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    group_id: str = Field(min_length=1, max_length=MAX_GROUP_ID_CHARS)
    source: Literal["message", "text", "json"]
    name: str = Field("", max_length=MAX_NAME_CHARS)
    source_description: str = Field("", max_length=1024)
    content: str | dict[str, Any]
    reference_time: datetime

    @field_validator("id", "group_id", mode="before")
    @classmethod
    def _exact_id(cls, v: Any, info: Any) -> Any:
        if isinstance(v, str) and (v != v.strip() or _CONTROL.search(v)):
            reason = "invalid_id" if info.field_name == "id" else "invalid_group_id"
            raise PydanticCustomError(
                reason,
                "{field} {value} has leading/trailing spaces or control characters; it is "
                "kept exactly as sent, so send it without them",
                {"field": info.field_name, "value": repr(v[:80])},
            )
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
            return utc(v)
        except OverflowError:
            raise PydanticCustomError(
                "bad_timestamp",
                "reference_time {value} is out of range once converted to UTC",
                {"value": v.isoformat()},
            ) from None

    @field_validator("content", mode="before")
    @classmethod
    def _content_fits(cls, v: Any, info: ValidationInfo) -> Any:
        # A json episode's content is an object whatever else it is (a list is not "the
        # wrong type" of a json episode's content but no json episode at all); an empty
        # object is empty content, like "" (README "Retries and dead letters").
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
            size = len(_canonical_json(v))
        elif isinstance(v, str):
            if not v.strip():
                raise PydanticCustomError("invalid_content", "content is empty")
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

    @property
    def uuid(self) -> str:
        return stable_uuid("episode", self.group_id, self.id)

    def content_text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return _canonical_json(self.content)

    @property
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


_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def _canonical_json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


# ----------------------------------------------------------------------------- extraction
class EntityDraft(BaseModel):
    """An entity as extraction saw it, before resolution."""

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    labels: list[str] = Field(default_factory=list)  # type labels, already to_label()-safe
    summary: str = ""
    key: str | None = None  # stable external id (e.g. a CRM id) from a mapping
    attributes: dict[str, Any] = Field(default_factory=dict)


class FactDraft(BaseModel):
    """A fact as extraction saw it. subject/object index into Extraction.entities."""

    subject: int
    object: int  # -1: no object (only for closing facts: close whatever the subject has)
    relation: str  # UPPER_SNAKE_CASE (to_relation_name)
    fact: str
    valid_at: str | None = None  # as stated: ISO date/time or a phrase ("since last March")
    invalid_at: str | None = None
    cardinality: Literal["one", "many"] | None = None  # one: a new object closes the previous
    closes: bool = False  # a record that only ends the fact (no new fact stored)

    @field_validator("relation")
    @classmethod
    def _relation_name(cls, v: str) -> str:
        return to_relation_name(v)


class Extraction(BaseModel):
    episode: Episode
    entities: list[EntityDraft] = Field(default_factory=list)
    facts: list[FactDraft] = Field(default_factory=list)
    mapped: bool = False  # produced by a declared mapping (no LLM)
    llm_calls: int = 0

    @model_validator(mode="after")
    def _facts_name_its_entities(self) -> Extraction:
        # Checked here so that a hop record breaking it is unreadable (bad_hop_record) rather
        # than an IndexError in a later stage.
        count = len(self.entities)
        for fact in self.facts:
            lowest = -1 if fact.closes else 0
            if not (0 <= fact.subject < count and lowest <= fact.object < count):
                raise ValueError(
                    f"fact {fact.relation} names entities {fact.subject} and {fact.object}; "
                    f"the extraction has {count}"
                )
        return self


# ----------------------------------------------------------------------------- graph records
class EntityRecord(BaseModel):
    uuid: str
    group_id: str
    name: str
    labels: list[str] = Field(default_factory=list)
    summary: str = ""
    key: str | None = None
    aliases: list[str] = Field(default_factory=list)  # normalised names that resolved here
    name_embedding: list[float] | None = None
    created_at: datetime | None = None
    community_uuid: str | None = None


class FactRecord(BaseModel):
    uuid: str
    group_id: str
    source_uuid: str
    target_uuid: str
    name: str  # relation type, UPPER_SNAKE_CASE
    fact: str
    fact_embedding: list[float] | None = None
    episodes: list[str] = Field(default_factory=list)  # episode uuids
    valid_at: datetime | None = None
    invalid_at: datetime | None = None
    created_at: datetime | None = None
    expired_at: datetime | None = None
    cardinality: Literal["one", "many"] | None = None
    # What was believed before the end moved (a late fact tightened an already-closed
    # interval): the earlier invalid_at values, oldest first, and when tidegraph learned each
    # (T'); end_learned_at is when it learned the current invalid_at (None: at expired_at).
    # Empty and None while the end has never moved, which is nearly always.
    prior_ends: list[datetime] = Field(default_factory=list)
    prior_ends_learned_at: list[datetime] = Field(default_factory=list)
    end_learned_at: datetime | None = None
    # The same for the start (an earlier restatement, delivered late, moved valid_at
    # earlier): the earlier valid_at values, oldest first, when each was learned (T'), and
    # when the current one was learned (None: at created_at).
    prior_starts: list[datetime] = Field(default_factory=list)
    prior_starts_learned_at: list[datetime] = Field(default_factory=list)
    start_learned_at: datetime | None = None

    def end_known_at(self, known_at: datetime) -> datetime | None:
        """``invalid_at`` as tidegraph believed it at ``known_at`` (None: no end known yet)."""
        if self.expired_at is None or self.expired_at > known_at:
            return None
        if (self.end_learned_at or self.expired_at) <= known_at:
            return self.invalid_at
        believed = [
            end
            for end, learned in zip(self.prior_ends, self.prior_ends_learned_at, strict=True)
            if learned <= known_at
        ]
        return believed[-1] if believed else None

    def move_end(self, at: datetime, now: datetime) -> None:
        """Set ``invalid_at`` to ``at`` as learned ``now``: the first end sets ``expired_at``
        (once); moving an end already stored keeps the one it replaces in the history, so
        that questions about an earlier belief (known-at) still see it."""
        learned = self.end_learned_at or self.expired_at
        if self.invalid_at is not None and learned is not None and learned < now:
            self.prior_ends = [*self.prior_ends, self.invalid_at]
            self.prior_ends_learned_at = [*self.prior_ends_learned_at, learned]
            self.end_learned_at = now
        self.invalid_at = at
        if self.expired_at is None:
            self.expired_at = now

    def start_known_at(self, known_at: datetime) -> datetime | None:
        """``valid_at`` as tidegraph believed it at ``known_at`` (for a fact created by then;
        None: an open start)."""
        if self.start_learned_at is None or self.start_learned_at <= known_at:
            return self.valid_at
        believed = [
            start
            for start, learned in zip(self.prior_starts, self.prior_starts_learned_at, strict=True)
            if learned <= known_at
        ]
        if believed:
            return believed[-1]
        return self.prior_starts[0] if self.prior_starts else self.valid_at

    def move_start(self, at: datetime, now: datetime) -> None:
        """Set ``valid_at`` to ``at`` (earlier) as learned ``now``: the start it replaces is
        kept in the history when it had been stored before ``now`` (see ``move_end``)."""
        learned = self.start_learned_at or self.created_at
        if self.valid_at is not None and learned is not None and learned < now:
            self.prior_starts = [*self.prior_starts, self.valid_at]
            self.prior_starts_learned_at = [*self.prior_starts_learned_at, learned]
            self.start_learned_at = now
        self.valid_at = at


class EpisodeRecord(BaseModel):
    uuid: str
    group_id: str
    name: str
    source: str
    source_description: str
    content: str
    valid_at: datetime
    created_at: datetime | None = None
    producer_id: str = ""
    content_hash: str = ""  # Episode.content_hash; "" on episodes stored before it existed


class FactView(BaseModel):
    """A fact as the query commands print it (`tidegraph facts --json`)."""

    uuid: str
    subject: str
    relation: str
    object: str
    fact: str
    valid_at: str | None
    invalid_at: str | None
    created_at: str | None
    expired_at: str | None
    episodes: list[str]  # producer ids of the episodes
