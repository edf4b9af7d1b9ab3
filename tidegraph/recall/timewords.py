"""Time words in a query: "where did Alice work in March 2023?" asks about March 2023.

``find_time(query, now)`` finds the first explicit time phrase and the period it names,
relative to ``now``; the search then looks at the graph as valid at ``TimeWords.valid_at``
(when the caller gave no valid-at). The query text itself is searched unchanged.

Phrases understood (English, case-insensitive, optionally after "in", "on", "during", "at",
"by", "as of", "as at"):

==========================================  ===============================================
``2023-05-08``                              that day
``8 May 2023``, ``May 8th, 2023``           that day (read by dateparser)
``March 2023``, ``Sept 2023``               that month
``in 2023``, ``during 2023``, ``as of 2023`` that year (a bare year needs the preposition)
``last March``                              the latest March before this month
``last week`` / ``last month`` / ``last year``  the previous calendar week (Monday first),
                                            month, year
``yesterday``                               the day before ``now``
``3 days ago``, ``a week ago``, ``two months ago``, ``a year ago``
                                            that day (days, weeks), month, year
==========================================  ===============================================

A period is looked at at its last moment (the state at its end, after every change within
it); a period that contains ``now`` at ``now``. Only the first ``MAX_QUERY_SCAN`` characters
are read, and dateparser only ever sees a matched phrase of a few dozen characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import dateparser

from tidegraph.records.times import utc

MAX_QUERY_SCAN = 1000
_MONTH_NAMES = (
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
)  # fmt: skip
_MONTH = (
    r"(?P<month>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
    r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_YEAR = r"(?P<year>(?:19|20|21)\d\d)"
_PREFIX = r"(?:\b(?:as\s+of|as\s+at|in|on|during|at|by)\s+)?"
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_NUMBERS |= {"seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
_COUNT = r"(?P<count>\d{1,3}|" + "|".join(_NUMBERS) + ")"
_ORDINAL = r"(?:st|nd|rd|th)?"

# (shape, pattern): the shape says how the match is read.
_PATTERNS = [
    ("iso", r"\b(?P<iso>(?:19|20|21)\d\d-\d\d-\d\d)(?!\d)"),
    ("day", rf"\b\d{{1,2}}{_ORDINAL}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b"),
    ("day", rf"\b{_MONTH}\s+\d{{1,2}}{_ORDINAL},?\s+{_YEAR}\b"),
    ("month", rf"\b{_MONTH},?\s+(?:of\s+)?{_YEAR}\b"),
    ("year", rf"\b(?:as\s+of|as\s+at|in|during)\s+{_YEAR}\b(?![-/.]\d)"),
    ("last_month_name", rf"\blast\s+{_MONTH}(?!\w)"),
    ("last_unit", r"\blast\s+(?P<unit>week|month|year)\b"),
    ("yesterday", r"\byesterday\b"),
    ("ago", rf"\b{_COUNT}\s+(?P<unit>day|week|month|year)s?\s+ago\b"),
]
_COMPILED = [
    (shape, re.compile(("" if shape == "year" else _PREFIX) + pattern, re.IGNORECASE))
    for shape, pattern in _PATTERNS
]


@dataclass(frozen=True)
class TimeWords:
    """A time phrase found in a query: the words, the period ``[start, end)`` they name, and
    the moment the search looks at (``valid_at``)."""

    phrase: str
    start: datetime
    end: datetime
    valid_at: datetime


def reads_a_written_day(query: str) -> bool:
    """Whether ``find_time`` would hand a phrase of ``query`` to dateparser (a written day,
    "8 May 2023"): the one slow reading, worth doing off the event loop. Every other shape
    is read by its pattern alone, in microseconds."""
    text = query[:MAX_QUERY_SCAN]
    return any(shape == "day" and pattern.search(text) for shape, pattern in _COMPILED)


def find_time(query: str, now: datetime) -> TimeWords | None:
    """The first time phrase of ``query`` (the longest where two start together), or None."""
    now = utc(now)
    text = query[:MAX_QUERY_SCAN]
    found: list[tuple[int, int, str, re.Match[str]]] = []
    for shape, pattern in _COMPILED:
        for match in pattern.finditer(text):
            found.append((match.start(), -len(match.group(0)), shape, match))
    for _, _, shape, match in sorted(found, key=lambda f: (f[0], f[1])):
        period = _period(shape, match, now)
        if period is not None:
            start, end = period
            valid_at = now if start <= now < end else end - timedelta(microseconds=1)
            return TimeWords(match.group(0).strip(), start, end, valid_at)
    return None


def _period(shape: str, match: re.Match[str], now: datetime) -> tuple[datetime, datetime] | None:
    groups = match.groupdict()
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    try:
        if shape == "iso":
            return _day(datetime.fromisoformat(groups["iso"]).replace(tzinfo=UTC))
        if shape == "day":
            return _read_day(match.group(0), now)
        if shape == "month":
            return _month(int(groups["year"]), _month_number(groups["month"]))
        if shape == "year":
            year = int(groups["year"])
            return datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)
        if shape == "last_month_name":
            month = _month_number(groups["month"])
            return _month(now.year if month < now.month else now.year - 1, month)
        if shape == "yesterday":
            return _day(today - timedelta(days=1))
        if shape == "last_unit":
            return _ago(1, groups["unit"], today, calendar=True)
        if shape == "ago":
            count = groups["count"].lower()
            number = int(count) if count.isdigit() else _NUMBERS[count]
            return _ago(number, groups["unit"].lower(), today, calendar=False)
    except (ValueError, OverflowError):  # 2023-02-30, a year out of range
        return None
    raise AssertionError(f"unknown time shape {shape}")


def _read_day(phrase: str, now: datetime) -> tuple[datetime, datetime] | None:
    """A written date ("8 May 2023", "May 8th, 2023") through dateparser: a few words."""
    words = re.sub(r"^(?:as\s+of|as\s+at|in|on|during|at|by)\s+", "", phrase.strip(), flags=re.I)
    parsed = dateparser.parse(
        words,
        languages=["en"],
        settings={
            "RELATIVE_BASE": now.replace(tzinfo=None),
            "TIMEZONE": "UTC",
            "RETURN_AS_TIMEZONE_AWARE": False,
            "STRICT_PARSING": True,
        },
    )
    return None if parsed is None else _day(parsed.replace(tzinfo=UTC))


def _month_number(name: str) -> int:
    return _MONTH_NAMES.index(name[:3].lower()) + 1


def _day(at: datetime) -> tuple[datetime, datetime]:
    start = datetime(at.year, at.month, at.day, tzinfo=UTC)
    return start, start + timedelta(days=1)


def _month(year: int, month: int) -> tuple[datetime, datetime]:
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def _ago(count: int, unit: str, today: datetime, *, calendar: bool) -> tuple[datetime, datetime]:
    """``count`` units before ``today``: the day (days, weeks), month or year it falls in;
    ``calendar`` (``last week``): the whole calendar week, Monday first."""
    if unit == "day":
        return _day(today - timedelta(days=count))
    if unit == "week":
        if calendar:
            monday = today - timedelta(days=today.weekday() + 7 * count)
            return monday, monday + timedelta(days=7)
        return _day(today - timedelta(weeks=count))
    if unit == "month":
        index = today.year * 12 + today.month - 1 - count
        return _month(index // 12, index % 12 + 1)
    return datetime(today.year - count, 1, 1, tzinfo=UTC), datetime(
        today.year - count + 1, 1, 1, tzinfo=UTC
    )
