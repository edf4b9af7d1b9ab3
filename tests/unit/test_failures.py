"""Failure reasons: envelope validation, the classification of errors, the time budget of the
per-record CPU steps, and the table of reasons in docs/streaming.md."""

from __future__ import annotations

import asyncio
import re
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from neo4j.exceptions import IncompleteCommit, ServiceUnavailable, TransientError

from tidegraph.llm import LLMError
from tidegraph.pipelines.ingest import read_jsonl
from tidegraph.processors.failures import REASONS, classify
from tidegraph.processors.temporal import MAX_TIME_TEXT, TemporalStep, parse_when, stamp_interval
from tidegraph.records.episode import CUSTOM_REASONS, Episode, parse_episode
from tidegraph.records.errors import (
    BadTime,
    InvalidEpisode,
    MappingError,
    NoExtractorError,
    RecordError,
    ValueTooLong,
)
from tidegraph.records.stages import EntityDraft, Extraction, FactDraft, ResolvedEpisode
from tidegraph.stores import EpisodeConflictError, StoreIntegrityError

STREAMING_MD = Path(__file__).resolve().parents[2] / "docs" / "streaming.md"
WHEN = "2025-01-01T00:00:00Z"


def envelope(**fields: Any) -> bytes:
    base = {"id": "a", "group_id": "g", "source": "text", "content": "x", "reference_time": WHEN}
    base.update(fields)
    return orjson.dumps({k: v for k, v in base.items() if v is not DROP})


DROP = object()


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def reason_of(raw: bytes | str) -> str:
    with pytest.raises(InvalidEpisode) as caught:
        parse_episode(raw)
    return caught.value.reason


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "empty_record"),
        (b"   ", "empty_record"),
        (b'{"id": "a", ', "invalid_json"),
        (b"\xff\xfe{}", "invalid_utf8"),
        (b"[" * 2000 + b"]" * 2000, "too_deep"),
        (b"[1, 2]", "not_an_object"),
        (b'"text"', "not_an_object"),
        (envelope(reference_time=DROP), "missing_field"),
        (envelope(extra=1), "unknown_field"),
        (envelope(reference_time="soonish"), "bad_timestamp"),
        (envelope(source="fax"), "unknown_source"),
        (envelope(content="x" * 200_001), "oversized"),
        (envelope(source="json", content="text"), "invalid_content"),
        (envelope(content="   "), "invalid_content"),
        (envelope(content=[1, 2]), "wrong_type"),
        (envelope(id=7), "wrong_type"),
        (envelope(name="n" * 513), "field_too_long"),
        (envelope(source_description="d" * 1025), "field_too_long"),
        (envelope(id=""), "invalid_id"),
        (envelope(id="i" * 513), "invalid_id"),
        (envelope(group_id="g" * 257), "invalid_group_id"),
    ],
)
def test_each_invalid_envelope_has_its_reason(raw: bytes, reason: str) -> None:
    assert reason_of(raw) == reason


@pytest.mark.parametrize(
    "when", ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00", 1e20, -(10**15), "1e300"]
)
def test_times_out_of_range_are_bad_timestamps_not_crashes(when: Any) -> None:
    # OverflowError escaped the validator and stopped the worker at every restart
    assert reason_of(envelope(reference_time=when)) == "bad_timestamp"


def test_a_numeric_reference_time_is_epoch_seconds() -> None:
    # 253402300799 was read as milliseconds: 1978-01-11
    episode = parse_episode(envelope(reference_time=253402128000))
    assert episode.reference_time == datetime(9999, 12, 30, tzinfo=UTC)
    assert parse_episode(envelope(reference_time="1700000000")).reference_time.year == 2023


@pytest.mark.parametrize("depth", [65, 300, 1000])
def test_deeply_nested_content_is_refused_before_anything_recurses(depth: int) -> None:
    # RecursionError in str(), in the dead letter's serialisation and in the context cache
    raw = envelope(source="json", content=nested(depth)) if depth < 250 else _deep_raw(depth)
    assert reason_of(raw) == "too_deep"


def _deep_raw(depth: int) -> bytes:
    # orjson cannot even encode it; built as text
    head = b'{"id": "a", "group_id": "g", "source": "json", "reference_time": "' + WHEN.encode()
    return head + b'", "content": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"


def test_content_nested_to_the_limit_is_taken() -> None:
    episode = parse_episode(envelope(source="json", content=nested(64)))
    assert len(episode.content_text()) > 64


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("group_id", "X ", "invalid_group_id"),
        ("group_id", " X", "invalid_group_id"),
        ("group_id", "a\x1fb", "invalid_group_id"),
        ("group_id", "a\nb", "invalid_group_id"),
        ("id", "x ", "invalid_id"),
        ("id", "b\x1fc", "invalid_id"),
        ("id", "b\x00", "invalid_id"),
    ],
)
def test_ids_are_kept_exactly_or_refused(field: str, value: str, reason: str) -> None:
    # "X " used to be trimmed into tenant "X"; ids with \x1f made uuids collide across groups
    assert reason_of(envelope(**{field: value})) == reason


def test_uuids_of_distinct_group_and_id_pairs_differ() -> None:
    a = parse_episode(envelope(group_id="a", id="b/c"))
    b = parse_episode(envelope(group_id="a/b", id="c"))
    assert a.uuid != b.uuid


def test_the_content_hash_tells_a_resent_episode_from_a_reused_id() -> None:
    first = parse_episode(envelope(content="hello"))
    again = parse_episode(envelope(content="hello"))
    other = parse_episode(envelope(content="hello, world"))
    later = parse_episode(envelope(content="hello", reference_time="2025-01-02T00:00:00Z"))
    assert first.uuid == other.uuid == later.uuid
    assert first.content_hash == again.content_hash
    assert len({first.content_hash, other.content_hash, later.content_hash}) == 3


def test_a_copy_with_other_fields_has_their_uuid_and_hash() -> None:
    # An episode's uuid and content hash are computed once; a copy with other ids or
    # content must not keep the original's.
    first = parse_episode(envelope(content="hello"))
    uuid, content_hash = first.uuid, first.content_hash  # computed (and cached) first
    moved = first.model_copy(update={"group_id": "elsewhere"})
    edited = first.model_copy(update={"content": "hello, world"})
    assert moved.uuid == parse_episode(envelope(group_id="elsewhere", content="hello")).uuid
    assert moved.uuid != uuid
    assert edited.content_hash == parse_episode(envelope(content="hello, world")).content_hash
    assert edited.content_hash != content_hash
    assert first.model_copy().uuid == uuid


def test_reading_a_file_reports_every_bad_line_with_its_reason_and_goes_on() -> None:
    lines = [
        envelope(id="ok-1"),
        envelope(reference_time="9999-12-31T23:59:59-01:00"),
        _deep_raw(300),
        b"not json",
        envelope(id="ok-2"),
    ]
    episodes, failures = read_jsonl(lines)
    assert [e.id for e in episodes] == ["ok-1", "ok-2"]
    assert [(f.line, f.failure.reason) for f in failures] == [
        (2, "bad_timestamp"),
        (3, "too_deep"),
        (4, "invalid_json"),
    ]


# ----------------------------------------------------------------------------- classification
def llm(kind: str) -> LLMError:
    return LLMError("x", stage="extraction", kind=kind, attempts=5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "transient", "reason"),
    [
        (llm("rate_limited"), True, "llm_rate_limited"),
        (llm("server"), True, "llm_server"),
        (llm("timeout"), True, "llm_timeout"),
        (llm("invalid_output"), False, "llm_invalid_output"),
        (llm("other"), False, "llm_other"),
        (ServiceUnavailable("down"), True, "store_unavailable"),
        (TransientError("deadlock"), True, "store_unavailable"),
        # the connection broke during COMMIT: the idempotent write is retried, not given up
        (IncompleteCommit("cut off"), True, "store_unavailable"),
        (StoreIntegrityError("crosses groups"), False, "store_integrity"),
        (EpisodeConflictError("reused id"), False, "conflicting_duplicate"),
        (NoExtractorError("no"), False, "no_extractor"),
        (MappingError("field 'plan' is missing", reason="mapping_missing_field"), False,
         "mapping_missing_field"),
        (BadTime("valid_at out of range"), False, "bad_time"),
        (ValueTooLong("name too long"), False, "value_too_long"),
        (OverflowError("date value out of range"), False, "unprocessable"),
        (RecursionError("too deep"), False, "unprocessable"),
        (ValueError("bad"), False, "invalid_value"),
        (TimeoutError(), True, "io"),
        (KeyError("bug"), True, "error"),
    ],
)  # fmt: skip
def test_failures_are_classified(exc: BaseException, transient: bool, reason: str) -> None:
    assert (classify(exc).transient, classify(exc).reason) == (transient, reason)


def test_every_reason_a_failure_can_carry_is_documented() -> None:
    text = STREAMING_MD.read_text()
    table = text[text.index("| reason | meaning |") :]
    documented = re.findall(r"^\| `([a-z_0-9]+)` \| ", table[: table.index("\n\n")], re.M)
    assert documented == list(REASONS)


def test_record_errors_carry_documented_reasons() -> None:
    assert CUSTOM_REASONS <= set(REASONS)
    import tidegraph.records.errors as errors

    for name in dir(errors):
        value = getattr(errors, name)
        if isinstance(value, type) and issubclass(value, errors.RecordError):
            assert value.reason in REASONS, name


# ----------------------------------------------------------------------------- CPU steps
def test_long_time_text_never_reaches_the_date_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    import dateparser

    seen: list[int] = []
    real = dateparser.parse

    def parse(text: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(len(text))
        return real(text, *args, **kwargs)

    monkeypatch.setattr(dateparser, "parse", parse)
    now = datetime(2025, 6, 1, tzinfo=UTC)
    assert parse_when("since 2024 " * 17000, now) is None  # 187 KB held a worker for 46 s
    assert parse_when("since last Tuesday afternoon", now) is not None
    assert seen and max(seen) <= MAX_TIME_TEXT


def test_mapped_times_are_strict_and_llm_times_lenient() -> None:
    episode = Episode.model_validate(
        {"id": "a", "group_id": "g", "source": "json", "content": {"a": 1}, "reference_time": WHEN}
    )
    # an LLM's unreadable or out-of-range date is noted and the reference time used
    for text in ("banana", "9999-12-31T23:59:59-01:00", "x" * 500):
        valid_at, _, notes = stamp_interval(text, None, episode)
        assert valid_at == episode.reference_time and notes
    # a declared mapping's is a permanent failure with a clear reason (it was retried as
    # transient and dead-lettered as "error")
    for text in ("banana", "9999-12-31T23:59:59-01:00", "since 2024 " * 100):
        with pytest.raises(BadTime) as caught:
            stamp_interval(text, None, episode, strict=True)
        assert classify(caught.value) == classify(BadTime("x"))
    valid_at, _, _ = stamp_interval("N/A", None, episode, strict=True)
    assert valid_at == episode.reference_time  # a way of saying "no date" is no date


async def test_temporal_stamping_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import tidegraph.processors.temporal as temporal

    threads: list[threading.Thread] = []
    real = temporal.stamp

    def stamp(resolved: ResolvedEpisode) -> Any:
        threads.append(threading.current_thread())
        return real(resolved)

    monkeypatch.setattr(temporal, "stamp", stamp)
    episode = Episode.model_validate(
        {"id": "a", "group_id": "g", "source": "json", "content": {"a": 1}, "reference_time": WHEN}
    )
    extraction = Extraction(
        episode=episode,
        entities=[EntityDraft(name="A"), EntityDraft(name="B")],
        facts=[FactDraft(subject=0, object=1, relation="R", fact="A R B", valid_at="2024")],
        mapped=True,
    )
    stamped = await TemporalStep().run(
        ResolvedEpisode(extraction=extraction, entity_uuids=["a", "b"])
    )
    assert stamped.facts[0].valid_at.year == 2024
    assert threads and threads[0] is not threading.main_thread()
    assert asyncio.get_running_loop() is not None


def test_an_extraction_over_its_bounds_is_extraction_too_large() -> None:
    """Issue 48: one record's write holds its group; its extraction is bounded."""
    from pydantic import ValidationError

    from tidegraph.processors.extraction import ExtractionStep, from_llm_output
    from tidegraph.processors.prompts import ExtractionOutput, LLMEntity, LLMFact
    from tidegraph.records.stages import MAX_EXTRACTED_ENTITIES, MAX_EXTRACTED_FACTS

    episode = parse_episode(envelope())
    entity = EntityDraft(name="Acme")
    for entities, facts in ((MAX_EXTRACTED_ENTITIES + 1, 0), (1, MAX_EXTRACTED_FACTS + 1)):
        fact = FactDraft(subject=0, object=0, relation="IS", fact="x")
        with pytest.raises(ValidationError) as caught:
            Extraction(episode=episode, entities=[entity] * entities, facts=[fact] * facts)
        assert classify(caught.value).reason == "extraction_too_large"
    fits = Extraction(
        episode=episode,
        entities=[entity] * MAX_EXTRACTED_ENTITIES,
        facts=[FactDraft(subject=0, object=1, relation="IS", fact="x")] * MAX_EXTRACTED_FACTS,
    )
    assert len(fits.facts) == MAX_EXTRACTED_FACTS
    nested: dict[str, Any] = {"n": 2**70}
    for _ in range(9):
        nested = {"x": nested}
    for attributes in (nested, {"long": "a" * 5000}):
        with pytest.raises(ValidationError) as caught:
            EntityDraft(name="Acme", attributes=attributes)
        assert classify(caught.value).reason == "extraction_too_large"
    assert EntityDraft(name="Acme", attributes={"n": 2**70}).attributes == {"n": 2**70}
    # An LLM answer over the bounds: a text episode is stored unextracted, not lost.
    many = ExtractionOutput(
        entities=[LLMEntity(name=f"E{n}", type=None, summary=None) for n in range(300)],
        facts=[
            LLMFact(subject="E0", relation="IS", object="E1", fact="x", valid_at=None,
                    invalid_at=None)
        ],
    )  # fmt: skip
    with pytest.raises(RecordError) as failed:
        from_llm_output(episode, many)
    assert failed.value.reason == "extraction_too_large"
    kept = ExtractionStep(mappings=None, llm=None).fallback(episode, "extraction_too_large")
    assert kept is not None and kept.not_extracted == "extraction_too_large"
