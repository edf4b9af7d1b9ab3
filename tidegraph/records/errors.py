"""Failures that belong to a record (retrying cannot help): each carries its dead-letter
reason, one of ``tidegraph.processors.failures.REASONS``."""

from __future__ import annotations


class RecordError(ValueError):
    """A record that cannot be processed as it is (retrying will not help). ``reason`` is
    the dead-letter reason, one of :data:`REASONS`."""

    reason: str = "invalid_value"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class InvalidEpisode(RecordError):
    """The input record is not a valid episode envelope (stage ``validation``)."""

    reason = "invalid_episode"


class NoExtractorError(RecordError):
    """The episode needs an LLM (or a mapping) that is not configured."""

    reason = "no_extractor"


class MappingError(RecordError):
    """A record matched a mapping rule but cannot be mapped (missing field, bad value)."""

    reason = "mapping_bad_value"


class BadTime(RecordError):
    """A time a mapping declared cannot be read (not a date, too long, out of range)."""

    reason = "bad_time"


class ValueTooLong(RecordError):
    """A name, key, summary or fact text over its limit."""

    reason = "value_too_long"
