"""Time phrases in a query (tidegraph/recall/timewords.py), relative to a fixed now."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from tidegraph.recall.timewords import MAX_QUERY_SCAN, find_time, reads_a_written_day

NOW = datetime(2024, 6, 15, 12, 30, tzinfo=UTC)  # a Saturday


def d(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def last_moment(end: datetime) -> datetime:
    return end - timedelta(microseconds=1)


@pytest.mark.parametrize(
    ("query", "phrase", "start", "end"),
    [
        ("where did Alice work in March 2023?", "in March 2023", d(2023, 3, 1), d(2023, 4, 1)),
        ("Acme's plan last March", "last March", d(2024, 3, 1), d(2024, 4, 1)),
        ("plan last June", "last June", d(2023, 6, 1), d(2023, 7, 1)),  # this month: a year ago
        ("what happened on 2023-05-08?", "on 2023-05-08", d(2023, 5, 8), d(2023, 5, 9)),
        ("at 2023-05-08T10:00", "at 2023-05-08", d(2023, 5, 8), d(2023, 5, 9)),
        ("yesterday's call", "yesterday", d(2024, 6, 14), d(2024, 6, 15)),
        ("as of 1 May 2024 who owned it", "as of 1 May 2024", d(2024, 5, 1), d(2024, 5, 2)),
        ("the May 8th, 2023 meeting", "May 8th, 2023", d(2023, 5, 8), d(2023, 5, 9)),
        ("Sept 2023 invoices", "Sept 2023", d(2023, 9, 1), d(2023, 10, 1)),
        ("customers in 2023", "in 2023", d(2023, 1, 1), d(2024, 1, 1)),
        ("tickets last week", "last week", d(2024, 6, 3), d(2024, 6, 10)),
        ("tickets last month", "last month", d(2024, 5, 1), d(2024, 6, 1)),
        ("revenue last year", "last year", d(2023, 1, 1), d(2024, 1, 1)),
        ("3 days ago", "3 days ago", d(2024, 6, 12), d(2024, 6, 13)),
        ("a week ago", "a week ago", d(2024, 6, 8), d(2024, 6, 9)),
        ("two months ago", "two months ago", d(2024, 4, 1), d(2024, 5, 1)),
        ("a year ago", "a year ago", d(2023, 1, 1), d(2024, 1, 1)),
    ],
)
def test_phrases_name_periods(query, phrase, start, end):
    found = find_time(query, NOW)
    assert found is not None
    assert (found.phrase, found.start, found.end) == (phrase, start, end)
    assert found.valid_at == last_moment(end)  # the state at the end of the period


def test_a_period_that_contains_now_is_looked_at_now():
    found = find_time("deals during 2024", NOW)
    assert found is not None and found.start == d(2024, 1, 1) and found.valid_at == NOW


@pytest.mark.parametrize(
    "query",
    [
        "who is Alice?",
        "I may go to Paris",  # "may" the verb
        "order 2023 items",  # a bare number is not a year
        "in March",  # no year: which March?
        "on 2023-02-30",  # no such day
        "room 12-05-2023b",
        "",
    ],
)
def test_no_phrase_no_time(query):
    assert find_time(query, NOW) is None


def test_the_first_phrase_wins_and_the_longest_of_those_starting_together():
    found = find_time("between May 2023 and June 2022", NOW)
    assert found is not None and found.phrase == "May 2023"
    found = find_time("as of 2023-05-08", NOW)  # "as of 2023" starts there too
    assert found is not None and found.phrase == "as of 2023-05-08"


def test_naive_now_is_utc_and_long_queries_are_read_only_so_far():
    found = find_time("yesterday", datetime(2024, 6, 15, 12))
    assert found is not None and found.start == d(2024, 6, 14)
    late = "x " * MAX_QUERY_SCAN + "in March 2023"
    assert find_time(late, NOW) is None
    started = time.perf_counter()
    assert find_time("since " * 50_000, NOW) is None
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize(
    ("query", "slow"),
    [
        ("where did Alice work on 8 May 2023?", True),
        ("what happened May 8th, 2023", True),
        ("where did Alice work in March 2023?", False),
        ("what changed last week", False),
        ("as of 2023-05-08 who owned it", False),
        ("which plan is Acme on?", False),
    ],
)
def test_only_a_written_day_is_read_off_the_event_loop(query: str, slow: bool) -> None:
    """A search reads its time words at once, except a written day (dateparser's), which
    it reads on a thread: the answer is the same either way."""
    assert reads_a_written_day(query) is slow
    if slow:
        assert find_time(query, NOW) is not None
