"""Record schemas of every tidegraph topic, and their orjson serde.

Every record is keyed by ``group_id`` (UTF-8 bytes). Values are JSON (orjson), one pydantic model
per topic. The input topic carries the episode envelope exactly as produced (docs/streaming.md
"Topics"); the hop record between the two hops (``tidegraph.pipelines.runner``) carries extraction's
output plus ``origin``, the position and Kafka timestamp of the episode's record on the input topic
(used for the produce->written latency and to match dead letters to what was produced).
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, Field

from tidegraph.records import jsontext
from tidegraph.records.episode import MAX_JSON_DEPTH, json_too_deep
from tidegraph.records.forget import ForgetRequest
from tidegraph.records.stages import Extraction

M = TypeVar("M", bound=BaseModel)

SCHEMA_VERSION: Literal[1] = 1
# A dead letter keeps at most this much of the original record (Kafka's default maximum
# message size is ~1 MB); longer records are cut and marked ``truncated``.
MAX_DEAD_RECORD_BYTES = 512 * 1024
MAX_MESSAGE_CHARS = 4000
# The largest record value a stage produces (Kafka's default limit is ~1 MB per record,
# headers and key included); a larger hop record becomes a dead letter instead.
MAX_RECORD_VALUE_BYTES = 1_000_000 - 16 * 1024


class RecordRef(BaseModel):
    """A record's place in Kafka."""

    topic: str
    # Kafka's own ranges (a 32-bit partition, 64-bit offsets and times): a reference beyond
    # them names no record, and is refused where it is read.
    partition: int = Field(ge=0, le=2**31 - 1)
    offset: int = Field(ge=0, le=2**63 - 1)
    timestamp_ms: int | None = Field(None, ge=-1, le=2**63 - 1)  # its Kafka CreateTime


class ExtractedRecord(BaseModel):
    """``{prefix}.extracted``: the extraction hop -> the write hop."""

    v: Literal[1] = SCHEMA_VERSION
    origin: RecordRef
    extraction: Extraction


class ForgetRecord(BaseModel):
    """``{prefix}.extracted``: a forget request from the input topic, handed on in its
    group's order (the write hop runs it between the episodes before and after it)."""

    v: Literal[1] = SCHEMA_VERSION
    origin: RecordRef
    forget: ForgetRequest


def decode_extracted(value: bytes) -> ExtractedRecord | ForgetRecord:
    """A record of ``{prefix}.extracted``: an extraction, or a forget."""
    data = jsontext.loads(value)  # the episode's integers exact
    if isinstance(data, dict) and "forget" in data:
        return ForgetRecord.model_validate(data)
    return ExtractedRecord.model_validate(data)


class NewEntityRecord(BaseModel):
    """``{prefix}.entities.new``: one entity an episode's resolution created (emitted after
    the episode's write committed, so its facts are in the graph)."""

    v: Literal[1] = SCHEMA_VERSION
    group_id: str
    entity_uuid: str
    episode_uuid: str


class DeadLetter(BaseModel):
    """``{prefix}.dlq``: a record a stage gave up on, with why."""

    v: Literal[1] = SCHEMA_VERSION
    stage: str  # validation, extraction, resolution, temporal, invalidation
    reason: str  # short machine-readable cause: tidegraph.processors.failures.REASONS
    error_class: str
    message: str
    attempts: int
    failed_at: datetime
    group_id: str | None = None
    episode_id: str | None = None
    episode_uuid: str | None = None
    origin: RecordRef | None = None  # the episode's record on the input topic
    consumed: RecordRef | None = None  # the record the failing stage consumed
    record: Any = None  # the original episode record (see record_encoding)
    record_encoding: Literal["json", "text", "base64"] = "json"
    truncated: bool = False

    def original_bytes(self) -> bytes:
        """The original record as bytes, for replay onto the input topic."""
        if self.record_encoding == "json":
            return jsontext.dumps(self.record)
        if self.record_encoding == "text":
            return str(self.record).encode()
        return base64.b64decode(str(self.record))


def original_record(raw: bytes | None) -> tuple[Any, Literal["json", "text", "base64"], bool]:
    """(record, encoding, truncated) of raw input bytes for a dead letter: parsed JSON when it
    parses and nests no deeper than an envelope may, else the text, else base64; cut to
    MAX_DEAD_RECORD_BYTES."""
    if raw is None:
        return None, "text", False
    truncated = len(raw) > MAX_DEAD_RECORD_BYTES
    if not truncated:
        try:
            parsed = jsontext.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            # JSON nested some hundred levels parses but cannot be encoded again (pydantic's
            # and orjson's serialisers stop at about 255): the dead letter of such a record
            # (too_deep) failed to encode and stopped the worker. It is kept as its text.
            if not json_too_deep(parsed, MAX_JSON_DEPTH + 1):
                return parsed, "json", False
    cut = raw[:MAX_DEAD_RECORD_BYTES]
    try:
        return cut.decode(), "text", truncated
    except UnicodeDecodeError:
        if truncated:  # the cut may split a character: keep the valid prefix as text
            text = cut.decode(errors="ignore")
            if text:
                return text, "text", True
        return base64.b64encode(cut).decode(), "base64", truncated


def short_message(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


# ----------------------------------------------------------------------------- serde
def encode(record: BaseModel) -> bytes:
    return jsontext.dumps(record.model_dump(mode="json"))  # an episode's integers exact


def decode(model: type[M], data: bytes) -> M:
    return model.model_validate(jsontext.loads(data))


def encode_key(group_id: str | None) -> bytes | None:
    return None if group_id is None else group_id.encode()


def decode_key(key: bytes | None) -> str | None:
    if key is None:
        return None
    return key.decode(errors="replace")
