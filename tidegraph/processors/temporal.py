"""Temporal stamping: validity intervals on the event timeline T (docs/architecture.md "Two
timelines").

Dates come as stated (ISO from a mapping field or the LLM, epoch seconds, or a phrase such as
"since last March") and are resolved against the episode's reference_time. A fact with no
stated start is valid from the reference_time.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import dateparser

from tidegraph.records.episode import Episode
from tidegraph.records.errors import BadTime
from tidegraph.records.stages import Extraction, ResolvedEpisode, StampedEpisode, StampedFact
from tidegraph.records.times import TIME_RANGE, utc, within_range

_PREFIX = re.compile(
    r"^\s*(since|from|as of|starting|started|starting on|beginning|effective|until|till|to|"
    r"ended|ending|on|in)\s+",
    re.IGNORECASE,
)
_LAST_MONTH = re.compile(
    r"^last\s+(january|february|march|april|may|june|july|august|september|october|"
    r"november|december)$",
    re.IGNORECASE,
)
_MONTHS = [
    "january", "february", "march", "april", "may", "june", "july", "august", "september",
    "october", "november", "december",
]  # fmt: skip
_YEAR = re.compile(r"^\d{4}$")
_EPOCH = re.compile(r"^\d{9,11}(\.\d+)?$")
_EPOCH_MS = re.compile(r"^\d{12,14}$")
_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?$")
# dateparser reads almost anything as a date ("N/A", "x", "1", "on" all become dates), so a
# phrase is only handed to it when it looks like a date: a year (4+ digits), a d/m/y shape, or
# a word of three letters or more ("March", "yesterday", "3 days ago", "desde marzo").
_DATE_SHAPE = re.compile(r"\d{4}|\d{1,2}\s*[/.\-]\s*\d{1,2}|[^\W\d_]{3,}")
# Ways of saying "no date" (never a date, whatever dateparser thinks).
_NO_DATE = frozenset(
    {"n/a", "n.a.", "n.a", "na", "nan", "nil", "null", "none", "unknown", "tbd", "tba",
     "undefined", "unspecified", "not specified", "not stated", "no date", "-"}
)  # fmt: skip
# Ways of saying "still true" where an end time is asked for: an open end, not a date.
_OPEN_END = frozenset(
    {"now", "present", "the present", "present day", "current", "currently", "ongoing",
     "still", "date", "to date", "this day"}
)  # fmt: skip


# The longest time text read: longer text is not a time (and dateparser's cost grows with
# its input: 187 KB of "since 2024 " took it 46 s).
MAX_TIME_TEXT = 100


def parse_when(text: str | None, reference: datetime) -> datetime | None:
    """Resolve a stated time against ``reference``; None when it cannot be understood."""
    try:
        return read_when(text, reference)
    except BadTime:
        return None


def read_when(text: str | None, reference: datetime) -> datetime | None:
    """Resolve a stated time against ``reference``: None for no text or a way of saying "no
    date" ("N/A", "unknown"); raises BadTime for text that is not a time it can read (not a
    date, over MAX_TIME_TEXT characters, outside ``TIME_RANGE``)."""
    if text is None:
        return None
    raw = text.strip()
    if not raw or raw.casefold() in _NO_DATE:
        return None
    if len(raw) > MAX_TIME_TEXT:
        raise BadTime(
            f"{raw[:40]!r}... is {len(raw)} characters; a time has at most {MAX_TIME_TEXT}"
        )
    try:
        parsed = _read(raw, reference)
        if parsed is not None:
            return within_range(parsed)
    except (OverflowError, OSError, ValueError):
        raise BadTime(f"{raw!r} is out of range: tidegraph reads {TIME_RANGE}") from None
    raise BadTime(f"{raw!r} is not a time tidegraph can read")


def _read(raw: str, reference: datetime) -> datetime | None:
    if _EPOCH.match(raw):
        return datetime.fromtimestamp(float(raw), UTC)
    if _EPOCH_MS.match(raw):
        return datetime.fromtimestamp(int(raw) / 1000, UTC)
    try:
        return utc(datetime.fromisoformat(raw.replace("Z", "+00:00")))
    except ValueError:
        pass
    phrase = _PREFIX.sub("", raw).strip()
    if _YEAR.match(phrase):
        return datetime(int(phrase), 1, 1, tzinfo=UTC)
    last = _LAST_MONTH.match(phrase)
    if last:
        month = _MONTHS.index(last.group(1).lower()) + 1
        year = reference.year if month < reference.month else reference.year - 1
        return datetime(year, month, 1, tzinfo=UTC)
    if phrase.casefold() in _NO_DATE or not _DATE_SHAPE.search(phrase):
        return None
    settings: Any = {
        "RELATIVE_BASE": utc(reference).replace(tzinfo=None),
        "PREFER_DATES_FROM": "past",
        "PREFER_DAY_OF_MONTH": "first",
        "PREFER_MONTH_OF_YEAR": "first",
        "TIMEZONE": "UTC",
        "RETURN_AS_TIMEZONE_AWARE": False,
    }
    # English: detecting the language among all of dateparser's loads their data (a phrase
    # English does not read took 2 s, each process once). Only a phrase with letters beyond
    # ASCII ("hace 3 días") is worth that detection.
    parsed = dateparser.parse(phrase, languages=["en"], settings=settings)
    if parsed is None and not phrase.isascii():
        parsed = dateparser.parse(phrase, settings=settings)
    return None if parsed is None else parsed.replace(tzinfo=UTC)


def open_end(text: str) -> bool:
    """True when an end time says the fact is still true ("present", "until now")."""
    return _PREFIX.sub("", text.strip()).strip().casefold() in _OPEN_END


def stamp_interval(
    valid_text: str | None, invalid_text: str | None, episode: Episode, *, strict: bool = False
) -> tuple[datetime, datetime | None, list[str]]:
    """(valid_at, invalid_at, notes) for a fact stated in ``episode``. Lenient (LLM output): a
    time it cannot read is noted and ignored. ``strict`` (a declared mapping, the exact path):
    such a time raises BadTime, and the record is dead-lettered instead of being stored with
    the wrong dates."""
    notes: list[str] = []
    valid_at = _when(valid_text, episode, "valid_at", strict)
    if valid_at is None:
        if valid_text and not strict:
            notes.append(
                f"valid_at {valid_text[:MAX_TIME_TEXT]!r} not understood; using reference_time"
            )
        valid_at = episode.reference_time
    if invalid_text and open_end(invalid_text):
        invalid_text = None  # "until now", "to present": still true, not ended now
    invalid_at = _when(invalid_text, episode, "invalid_at", strict)
    if invalid_text and invalid_at is None and not strict:
        notes.append(f"invalid_at {invalid_text[:MAX_TIME_TEXT]!r} not understood; ignored")
    if invalid_at is not None and invalid_at <= valid_at:
        notes.append(f"invalid_at {invalid_text!r} is not after valid_at; ignored")
        invalid_at = None
    return valid_at, invalid_at, notes


def _when(text: str | None, episode: Episode, what: str, strict: bool) -> datetime | None:
    if not strict:
        return parse_when(text, episode.reference_time)
    try:
        return read_when(text, episode.reference_time)
    except BadTime as exc:
        raise BadTime(f"{what} {exc}") from exc


def earliest_start(extractions: Iterable[Extraction]) -> datetime | None:
    """The earliest time a fact of ``extractions`` will be stamped valid from, each episode's
    reference_time counted too (a truncate's closing facts start there): what a unit's batch
    read may leave out the facts that ended before (``FactRecord.ended_before``), as
    ``stamp_interval`` stamps them. None when a time is a phrase (reading one is this stage's
    job, off the event loop) or cannot be read (the stage then says why): nothing is left
    out."""
    starts: list[datetime] = []
    for extraction in extractions:
        episode = extraction.episode
        starts.append(episode.reference_time)
        for draft in extraction.facts:
            if not (plain_time(draft.valid_at) and plain_time(draft.invalid_at)):
                return None
            try:
                start, _, _ = stamp_interval(
                    draft.valid_at, draft.invalid_at, episode, strict=extraction.mapped
                )
            except BadTime:
                return None
            starts.append(start)
    return min(starts, default=None)


class TemporalStep:
    """``run(resolved) -> StampedEpisode``: pure, no I/O."""

    stage = "temporal"

    async def run(self, resolved: ResolvedEpisode) -> StampedEpisode:
        if all(
            plain_time(t) for f in resolved.extraction.facts for t in (f.valid_at, f.invalid_at)
        ):
            return stamp(resolved)  # microseconds: a thread hop would cost more
        # Off the event loop: date phrases go through dateparser (bounded by MAX_TIME_TEXT, but
        # still milliseconds a phrase), and one record must never hold up every group.
        return await asyncio.to_thread(stamp, resolved)


def plain_time(text: str | None) -> bool:
    """True for no time, or one ``read_when`` reads without dateparser (ISO 8601, epoch)."""
    return text is None or bool(
        len(text) <= MAX_TIME_TEXT
        and (_ISO.match(text) or _EPOCH.match(text) or _EPOCH_MS.match(text))
    )


def stamp(resolved: ResolvedEpisode) -> StampedEpisode:
    extraction = resolved.extraction
    uuids = resolved.entity_uuids
    facts: list[StampedFact] = []
    for draft in extraction.facts:
        valid_at, invalid_at, notes = stamp_interval(
            draft.valid_at, draft.invalid_at, extraction.episode, strict=extraction.mapped
        )
        if draft.closes:
            # A closing record's valid_at is the moment the fact ends.
            invalid_at = None
        facts.append(
            StampedFact(
                source_uuid=uuids[draft.subject],
                target_uuid=uuids[draft.object] if draft.object >= 0 else None,
                relation=draft.relation,
                fact=draft.fact,
                valid_at=valid_at,
                invalid_at=invalid_at,
                cardinality=draft.cardinality,
                closes=draft.closes,
                notes=notes,
            )
        )
    return StampedEpisode(
        episode=extraction.episode,
        mentions=list(dict.fromkeys(uuids)),
        facts=facts,
        llm_calls=resolved.llm_calls,
        mapped=extraction.mapped,
        entities_new=resolved.entities_new,
        pending=resolved.pending,
        not_extracted=extraction.not_extracted,
        extraction=extraction,
    )
