"""Which failures are worth retrying, and the short reason a dead letter records.

Transient (retried with backoff, then dead-lettered): Neo4j errors the driver marks retryable
(TransientError, ServiceUnavailable, SessionExpired...), LLM errors of kind rate_limited /
server / timeout (the LLM client has already retried those itself), timeouts and connection
errors, and unexpected exceptions (they may be infrastructure we did not foresee).
Permanent (dead-lettered at once): invalid records, unmapped records without an LLM,
mapping errors, LLM invalid_output / other, store integrity and schema errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from neo4j.exceptions import DriverError, Neo4jError
from pydantic import ValidationError

from processors.extraction import NoExtractorError
from processors.mapping import MappingError
from processors.pipeline import StageError
from tidegraph.llm import LLMError
from tidegraph.store import StoreIntegrityError, StoreSchemaError

_TRANSIENT_LLM = frozenset({"rate_limited", "server", "timeout"})


@dataclass(frozen=True)
class Verdict:
    transient: bool
    reason: str  # dead-letter / metric label: short, lowercase, bounded set


def root_cause(exc: BaseException) -> BaseException:
    return exc.cause if isinstance(exc, StageError) else exc


def classify(exc: BaseException) -> Verdict:
    cause = root_cause(exc)
    if isinstance(cause, LLMError):
        return Verdict(cause.kind in _TRANSIENT_LLM, f"llm_{cause.kind}")
    if isinstance(cause, Neo4jError | DriverError):
        if cause.is_retryable():
            return Verdict(True, "store_unavailable")
        return Verdict(False, "store_error")
    if isinstance(cause, NoExtractorError):
        return Verdict(False, "no_extractor")
    if isinstance(cause, MappingError):
        return Verdict(False, "mapping")
    if isinstance(cause, StoreIntegrityError):
        return Verdict(False, "store_integrity")
    if isinstance(cause, StoreSchemaError):
        return Verdict(False, "store_schema")
    if isinstance(cause, ValidationError):
        return Verdict(False, "invalid_record")
    if isinstance(cause, ValueError):
        return Verdict(False, "invalid")
    if isinstance(cause, TimeoutError | ConnectionError):
        return Verdict(True, "io")
    return Verdict(True, "error")


def validation_reason(exc: ValueError) -> str:
    """The reason of an episode envelope that ``parse_episode`` refused."""
    cause = exc.__cause__
    if not isinstance(cause, ValidationError):
        text = str(exc)
        if text.startswith("not valid JSON"):
            return "invalid_json"
        if "content" in text:
            return "invalid_content"
        return "invalid_episode"
    kinds: list[str] = []
    for err in cause.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        if err["type"] == "missing":
            kinds.append("missing_field")
        elif err["type"] == "extra_forbidden":
            kinds.append("unknown_field")
        elif field == "reference_time":
            kinds.append("bad_timestamp")
        elif field == "source":
            kinds.append("unknown_source")
        elif field == "content" and "limit" in str(err.get("msg", "")):
            kinds.append("oversized")
        else:
            kinds.append("invalid_episode")
    return kinds[0] if len(set(kinds)) == 1 else "invalid_episode"
