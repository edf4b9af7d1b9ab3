"""Temporal stamping: stated times resolved against the episode's reference time
(docs/architecture.md "Two
timelines")."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tidegraph.processors.temporal import (
    MAX_TIME_TEXT,
    earliest_start,
    open_end,
    parse_when,
    plain_time,
    stamp,
    stamp_interval,
)
from tidegraph.records.episode import Episode
from tidegraph.records.stages import EntityDraft, Extraction, FactDraft, ResolvedEpisode

REF = datetime(2024, 5, 10, 12, 0, tzinfo=UTC)


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-03-01", at(2024, 3, 1)),
        ("2024-03-01T10:15:00Z", at(2024, 3, 1, 10, 15)),
        ("2024-03-01T10:15:00+02:00", at(2024, 3, 1, 8, 15)),
        ("2024-03-01 10:15", at(2024, 3, 1, 10, 15)),
        ("20240301", at(2024, 3, 1)),
        (" 2024-03-01 ", at(2024, 3, 1)),
    ],
)
def test_iso_dates_and_times(text: str, expected: datetime) -> None:
    assert parse_when(text, REF) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1700000000", at(2023, 11, 14, 22, 13, 20)),
        ("1700000000.5", datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=UTC)),
        ("1700000000000", at(2023, 11, 14, 22, 13, 20)),  # milliseconds
    ],
)
def test_epoch_seconds_and_milliseconds(text: str, expected: datetime) -> None:
    assert parse_when(text, REF) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2019", at(2019, 1, 1)),
        ("since 2019", at(2019, 1, 1)),
        ("from 2021", at(2021, 1, 1)),
        ("until 2022", at(2022, 1, 1)),
    ],
)
def test_a_bare_year_is_its_first_day(text: str, expected: datetime) -> None:
    assert parse_when(text, REF) == expected


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        (at(2024, 5, 10), at(2024, 3, 1)),  # March of this year is past
        (at(2024, 3, 20), at(2023, 3, 1)),  # in March, "last March" is a year ago
        (at(2024, 1, 5), at(2023, 3, 1)),
    ],
)
def test_since_last_march_is_resolved_against_the_reference(
    reference: datetime, expected: datetime
) -> None:
    assert parse_when("since last March", reference) == expected
    assert parse_when("last march", reference) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("yesterday", at(2024, 5, 9, 12)),
        ("3 days ago", at(2024, 5, 7, 12)),
        ("2 weeks ago", at(2024, 4, 26, 12)),
        ("March 3, 2023", at(2023, 3, 3)),
        ("March 2023", at(2023, 3, 1)),
        ("effective 1 April 2024", at(2024, 4, 1)),
        ("3 March 2024 10:00 +0200", at(2024, 3, 3, 8)),
        ("Q1 2023", at(2023, 1, 1)),
        ("2023/05/01", at(2023, 5, 1)),
        ("hace 3 días", at(2024, 5, 7, 12)),
    ],
)
def test_phrases_dateparser_handles(text: str, expected: datetime) -> None:
    assert parse_when(text, REF) == expected


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "   ",
        "banana",
        "asdf qwer",
        "soon",
        "recently",
        "2023-13-45",
        # dateparser turns each of these into some date; none of them is one
        "N/A",
        "n/a",
        "na",
        "NaN",
        "null",
        "unknown",
        "x",
        "a",
        "on",
        "1",
        "-1",
        "12",
        "1e9",
    ],
)
def test_garbage_is_none(text: str | None) -> None:
    assert parse_when(text, REF) is None


def test_results_are_aware_utc() -> None:
    for text in ("2024-03-01", "1700000000", "yesterday", "since last March", "2019"):
        parsed = parse_when(text, REF)
        assert parsed is not None and parsed.tzinfo is not None
        assert parsed.utcoffset().total_seconds() == 0  # type: ignore[union-attr]


def episode(reference: datetime = REF) -> Episode:
    return Episode(
        id="ep-1", group_id="g", source="text", content="something", reference_time=reference
    )


def test_interval_defaults_to_the_reference_time() -> None:
    assert stamp_interval(None, None, episode()) == (REF, None, [])


def test_interval_from_stated_times() -> None:
    valid_at, invalid_at, notes = stamp_interval("from 2019", "2021-06-30", episode())
    assert (valid_at, invalid_at, notes) == (at(2019, 1, 1), at(2021, 6, 30), [])


def test_unreadable_times_leave_a_note() -> None:
    valid_at, invalid_at, notes = stamp_interval("banana", "N/A", episode())
    assert valid_at == REF and invalid_at is None
    assert len(notes) == 2 and "banana" in notes[0] and "N/A" in notes[1]


def test_an_end_before_the_start_is_ignored() -> None:
    valid_at, invalid_at, notes = stamp_interval("2022-01-01", "2021-01-01", episode())
    assert (valid_at, invalid_at) == (at(2022, 1, 1), None)
    assert notes and "not after valid_at" in notes[0]


@pytest.mark.parametrize("text", ["present", "until now", "to present", "ongoing", "currently"])
def test_an_open_end_is_not_the_reference_time(text: str) -> None:
    assert open_end(text)
    assert stamp_interval("2019", text, episode()) == (at(2019, 1, 1), None, [])


def test_an_end_stated_as_a_day_still_ends() -> None:
    assert not open_end("today")
    assert stamp_interval("2019", "today", episode())[1] == REF


def test_stamp_maps_entities_and_keeps_closing_records_open_ended() -> None:
    ep = episode()
    extraction = Extraction(
        episode=ep,
        entities=[EntityDraft(name="Alice"), EntityDraft(name="Acme"), EntityDraft(name="Alice")],
        facts=[
            FactDraft(subject=0, object=1, relation="works at", fact="Alice works at Acme",
                      valid_at="since last March"),
            FactDraft(subject=2, object=-1, relation="WORKS_AT", fact="Alice left",
                      valid_at="2024-05-01", invalid_at="2024-06-01", closes=True),
        ],
    )  # fmt: skip
    stamped = stamp(ResolvedEpisode(extraction=extraction, entity_uuids=["a", "b", "a"]))
    assert stamped.mentions == ["a", "b"]
    first, closing = stamped.facts
    assert (first.source_uuid, first.target_uuid, first.relation) == ("a", "b", "WORKS_AT")
    assert first.valid_at == at(2024, 3, 1) and first.invalid_at is None
    assert closing.closes and closing.target_uuid is None
    assert closing.valid_at == at(2024, 5, 1) and closing.invalid_at is None


def test_only_times_the_date_parser_would_read_leave_the_event_loop() -> None:
    # Read without dateparser: stamped on the event loop.
    for text in (
        None,
        "2024-03-01",
        "2024-03-01T10:00:00Z",
        "2024-03-01 10:00+02:00",
        "1700000000",
    ):
        assert plain_time(text), text
    # A phrase, or an ISO-looking text too long to be a time: in a worker thread.
    for text in (
        "since March 2024",
        "last week",
        " 2024-03-01",
        "2024-03-01" + "0" * MAX_TIME_TEXT,
    ):
        assert not plain_time(text), text


def mapped(reference: datetime, *starts: str | None) -> Extraction:
    return Extraction(
        episode=episode(reference),
        entities=[EntityDraft(name="Acme")],
        facts=[FactDraft(subject=0, object=0, relation="R", fact="f", valid_at=s) for s in starts],
        mapped=True,
    )


def test_a_units_earliest_start_is_its_earliest_fact_start_or_reference_time() -> None:
    """The bound of a unit's batch read: the earliest start a fact will be stamped with, each
    reference time counted (a fact without a stated start, a truncate's closes)."""
    later = at(2024, 6, 1)
    assert earliest_start([mapped(later, "2024-05-20")]) == at(2024, 5, 20)
    assert earliest_start([mapped(later, "2024-07-01")]) == later
    assert earliest_start([mapped(later, None), mapped(REF)]) == REF
    assert earliest_start([mapped(later, "1714000000")]) == at(2024, 4, 24, 23, 6, 40)
    assert earliest_start([]) is None


def test_a_start_stamping_must_work_out_leaves_the_unit_unbounded() -> None:
    """A phrase is read by the stage (off the event loop), a bad time dead-lettered there:
    either way the batch read leaves nothing out."""
    assert earliest_start([mapped(REF, "2024-05-01"), mapped(REF, "since last March")]) is None
    assert earliest_start([mapped(REF, "2024-13-45")]) is None
