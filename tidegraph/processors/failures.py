"""Why a record failed: the dead-letter reasons, and which failures are worth retrying.

Every record-level failure ends as a dead letter (Kafka) or an ingest failure (in-process) with one
of the reasons in :data:`REASONS`; docs/streaming.md "Retries and dead letters" lists the same table
(a test keeps the two equal). Permanent failures raise a :class:`RecordError` that carries its
reason; everything else is classified here by type:

- transient (retried with backoff, then dead-lettered): Neo4j errors the driver marks
  retryable and commits whose outcome is unknown (the write is idempotent), LLM errors of
  kind rate_limited / server / timeout, timeouts and connection errors, and unexpected
  exceptions (they may be infrastructure nobody foresaw);
- permanent (dead-lettered at once): invalid records, unmapped records without an LLM,
  mapping errors, unreadable times, LLM invalid_output / other, store integrity and schema
  errors, and errors a retry cannot fix (OverflowError, RecursionError, UnicodeError).
"""

from __future__ import annotations

from dataclasses import dataclass

from neo4j.exceptions import DriverError, IncompleteCommit, Neo4jError
from pydantic import ValidationError

from tidegraph.llm import LLMError
from tidegraph.records.errors import RecordError
from tidegraph.records.stages import TOO_LARGE
from tidegraph.stores import EpisodeConflictError, StoreIntegrityError, StoreSchemaError


@dataclass(frozen=True)
class Verdict:
    transient: bool
    reason: str  # dead-letter / metric label: short, lowercase, one of REASONS


# Every reason a dead letter (or an in-process ingest failure) can carry: what it means and
# what to do. docs/streaming.md "Retries and dead letters" shows this table.
REASONS: dict[str, str] = {
    # -- the input record (stage validation)
    "empty_record": "the record has no value (an empty Kafka value or a tombstone; `produce` "
    "and `ingest` skip blank lines)",
    "oversized": "the record is over TIDEGRAPH_MAX_RECORD_BYTES, or its content over "
    "200,000 characters",
    "invalid_utf8": "the record is not UTF-8 text, or a text field holds a lone UTF-16 surrogate",
    "invalid_json": "the record is not JSON",
    "too_deep": "the record or its content nests objects/arrays more than 64 levels deep",
    "not_an_object": "the record is JSON but not an object",
    "missing_field": "a required envelope field (id or episode_id, group_id, content, "
    "reference_time) is missing",
    "unknown_field": "the envelope has a field it does not define",
    "wrong_type": "an envelope field has the wrong JSON type",
    "invalid_id": "id is empty, over 512 characters, padded with spaces or holds control "
    "characters",
    "invalid_group_id": "group_id is empty, over 256 characters, padded with spaces or holds "
    "control characters (group ids are kept exactly: 'X ' is never tenant 'X')",
    "unknown_source": "source is not message, text or json",
    "bad_timestamp": "reference_time is not ISO 8601 or epoch seconds, or is out of range "
    "(0001-01-02 to 9999-12-30 in UTC)",
    "invalid_content": "content is empty, or a json episode's content is not an object",
    "field_too_long": "name (512) or source_description (1,024 characters) is too long",
    "invalid_episode": "the envelope failed a check not listed above (the message says which)",
    "key_mismatch": "the Kafka key is not the episode's group_id (dlq replay re-sends it "
    "with the right key)",
    "invalid_forget": "a forget request names no group, or not exactly one of episode_ids, "
    'subject or group (docs/architecture.md "Forgetting")',
    "key_erased": "a sealed episode's data key is erased (its group was forgotten with purge: "
    'docs/streaming.md "Sealed episodes"); the record can no longer be read, by design',
    "seal_broken": "a sealed episode's body does not open with its group's key (altered, or "
    "moved from another group or episode)",
    # -- declared sources (docs/sources.md)
    "source_undecodable": "a source record's bytes are not its declared format (not JSON; not "
    "the schema registry's wire format; Avro that does not decode with its schema)",
    "unknown_schema": "a source record names a schema id the registry does not have",
    "registry_refused": "the schema registry refused the schema's request (4xx other than 404: "
    "credentials, permissions)",
    "registry_unavailable": "the schema registry stayed unreachable after every retry (replay "
    "the dead letter's source record once it answers)",
    "unknown_op": "a change event's op is not a row change tidegraph knows (r, c, u, d, t; m "
    "is skipped by the source, and t too unless the source declares truncate: close)",
    "truncate_unkeyed": "a truncate (truncate: close) matched a mapping rule whose facts' "
    "subject has no key with a fixed beginning (like crm:account:{row.id}) to tell the "
    "table's rows by",
    # -- extraction
    "no_extractor": "no mapping rule matches the json record and no LLM is configured (a "
    "text or message episode without an LLM is stored unextracted instead: docs/"
    'architecture.md "Episodes without an LLM")',
    "mapping_missing_field": "the record matched a mapping rule but lacks a field the rule needs",
    "mapping_bad_value": "a field the rule needs is null, empty, or not a scalar, or a key's "
    "field is text padded with whitespace or holding control characters (ids are kept exactly)",
    "value_too_long": "a mapped entity name or key (512), summary (4,000) or fact text "
    "(2,000 characters) is too long",
    "bad_time": "a time field the mapping declares is not a time tidegraph can read (not a "
    "date, over 100 characters, or out of range)",
    "llm_rate_limited": "the LLM kept answering 429 after every retry",
    "llm_server": "the LLM kept failing (5xx, connection) after every retry",
    "llm_timeout": "the LLM kept timing out after every retry",
    "llm_invalid_output": "the LLM's answer did not fit the schema after every retry",
    "llm_other": "the LLM refused the request (4xx other than 429: key, model, prompt)",
    # (The llm_* reasons dead-letter json records only: a text or message episode is stored
    # unextracted instead, docs/architecture.md "Episodes without an LLM".)
    # -- the graph store (resolution, invalidation)
    "conflicting_duplicate": "the episode's id was already processed in its group with "
    "other content (a new episode needs a new id)",
    "store_unavailable": "Neo4j stayed unavailable (or a commit's outcome unknown) after "
    "every retry",
    "store_error": "Neo4j refused the write or read (a client error)",
    "store_integrity": "the write would cross groups or point at missing nodes",
    "store_schema": "the store's schema does not fit this configuration",
    "forget_failed": "a forget could not be done (its message says why: e.g. the LLM a group's "
    "text episodes need to be replayed is not configured); nothing was forgotten",
    # -- any stage
    "too_large": "the stage's output for this record is over Kafka's record size",
    "bad_hop_record": "a record between two stages cannot be read (a producer bug)",
    "extraction_too_large": "the episode's extraction has more than 256 entities or 512 "
    "facts, or an entity's attributes nest more than 8 levels or are over 4,096 characters "
    "as JSON: one record's write would hold its group's next records too long (a text or "
    "message episode the LLM extracted that much from is stored unextracted instead)",
    "timeout": "the record's stage took longer than TIDEGRAPH_RECORD_TIMEOUT_SECONDS",
    "io": "a timeout or connection error persisted after every retry",
    "invalid_record": "a record a stage built failed its schema (the message names the field)",
    "invalid_value": "a value a stage cannot use (the message says which)",
    "unprocessable": "the record made a stage fail in a way no retry can fix (overflow, "
    "recursion, encoding)",
    "error": "an unexpected exception persisted after every retry: please report it",
    "internal_error": "a stage broke its contract on this record (a bug): please report it",
}

# The reasons a store that does not answer may be behind: before a failure with one of them
# counts, the store is probed, and while it does not answer the record waits at the head of
# its group instead (tidegraph/pipelines/outage.py).
STORE_MAY_BE_DOWN = frozenset({"store_unavailable", "io", "timeout", "error"})

_TRANSIENT_LLM = frozenset({"rate_limited", "server", "timeout"})


def classify(exc: BaseException) -> Verdict:
    cause = exc
    if isinstance(cause, RecordError):
        return Verdict(False, cause.reason)
    if isinstance(cause, LLMError):
        return Verdict(cause.kind in _TRANSIENT_LLM, f"llm_{cause.kind}")
    if isinstance(cause, IncompleteCommit):
        # The connection broke during COMMIT: the write may or may not have landed. It is
        # idempotent (MERGE by deterministic uuid, the processed marker), so retry it.
        return Verdict(True, "store_unavailable")
    if isinstance(cause, Neo4jError | DriverError):
        if cause.is_retryable():
            return Verdict(True, "store_unavailable")
        return Verdict(False, "store_error")
    if isinstance(cause, EpisodeConflictError):
        return Verdict(False, "conflicting_duplicate")
    if isinstance(cause, StoreIntegrityError):
        return Verdict(False, "store_integrity")
    if isinstance(cause, StoreSchemaError):
        return Verdict(False, "store_schema")
    if isinstance(cause, ValidationError):
        return Verdict(False, validation_reason(cause, "invalid_record"))
    if isinstance(cause, OverflowError | RecursionError | UnicodeError):
        return Verdict(False, "unprocessable")
    if isinstance(cause, ValueError):
        return Verdict(False, "invalid_value")
    if isinstance(cause, TimeoutError | ConnectionError):
        return Verdict(True, "io")
    return Verdict(True, "error")


def validation_reason(error: ValidationError, otherwise: str) -> str:
    """The reason of a record that failed its schema: ``extraction_too_large`` when it is over
    the bounds of one extraction (``tidegraph.records.stages``), else ``otherwise``."""
    if any(e["type"] == TOO_LARGE for e in error.errors(include_url=False)):
        return TOO_LARGE
    return otherwise
