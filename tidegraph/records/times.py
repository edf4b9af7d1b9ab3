"""Time values: every datetime tidegraph keeps is aware UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

# The times tidegraph takes from outside (a record's reference_time, a mapped time, a request's
# valid_at, known_at, since or until, a cursor): a day inside the years a datetime holds, so
# that a time zone's offset and the windows tidegraph puts around a time (a conversation's
# context, a day, a microsecond before) never leave them.
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)
TIME_RANGE = "0001-01-02 to 9999-12-30 (UTC)"


class TimeOutOfRange(ValueError):
    """A time from outside beyond ``EARLIEST``..``LATEST`` (or not convertible to UTC)."""


def within_range(dt: datetime) -> datetime:
    """``dt`` as aware UTC, once checked to be a time tidegraph takes from outside (between
    ``EARLIEST`` and ``LATEST``); ``TimeOutOfRange`` otherwise. Every time a client or a
    record sends goes through it where it is read."""
    try:
        at = utc(dt)
    except OverflowError:
        at = None
    if at is None or not EARLIEST <= at <= LATEST:
        raise TimeOutOfRange(f"{dt.isoformat()} is out of range: tidegraph reads {TIME_RANGE}")
    return at


def utc(dt: datetime) -> datetime:
    """Aware UTC datetime (naive input is taken as UTC), truncated to microseconds."""
    if dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(dt: datetime | None) -> str | None:
    return None if dt is None else utc(dt).isoformat().replace("+00:00", "Z")


def now_for(_: object) -> datetime:
    """The ingestion time (T') of a write about anything: now. A forget's replay writes at
    each episode's original time instead (``Components.clock``)."""
    return utcnow()


# Where a time's words count its seconds from (``time_words``).
WORDS_ORIGIN = datetime(1, 1, 1, tzinfo=UTC)
WORDS_ORIGIN_EPOCH_SECONDS = -62135596800  # WORDS_ORIGIN in seconds since 1970
# A time's words: its whole seconds since WORDS_ORIGIN in twelve digits, and those digits cut
# to fewer, each with its letter: (letter, digits kept), coarsest first. A range of times is
# then a few ranges of words (``neo4j.search_queries.time_range``): whole coarse steps (of
# 10^7 s, about 116 days; of 10^5 s, about a day) and the seconds of the last, rather than
# one word per second of the range.
TIME_WORD_LEVELS = (("b", 5), ("c", 7), ("t", 12))
TIME_DIGITS = TIME_WORD_LEVELS[-1][1]


def time_digits(dt: datetime) -> str:
    """``dt``'s whole seconds since WORDS_ORIGIN, in TIME_DIGITS digits."""
    return f"{(utc(dt) - WORDS_ORIGIN) // timedelta(seconds=1):0{TIME_DIGITS}d}"


def time_words(dt: datetime) -> str:
    """``dt``'s words at every level of TIME_WORD_LEVELS (written in Cypher by
    ``neo4j.write_queries.set_fact_time_words``)."""
    digits = time_digits(dt)
    return " ".join(letter + digits[:kept] for letter, kept in TIME_WORD_LEVELS)
