"""No record may stop or stall a worker (issue 16): the bad-input corpus
(``tests/corpus/bad_records.py``) through a real worker and through ``tidegraph ingest``, good
records of several groups around it. Every bad record ends as exactly one dead letter (or ingest
failure) with its expected stage and reason, every good one is written, the worker never exits
(docs/streaming.md "Retries and dead letters")."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from tests.corpus.bad_records import GROUP_KEY, BadCase, Corpus, bad_corpus
from tests.integration.topology_harness import REPO, TIDEGRAPH, Topology, eventually
from tests.support.crm_feed import CRM_MAPPING, crm_feed, crm_mappings, group_name
from tidegraph.connections import KafkaConnection
from tidegraph.processors.extraction import ExtractionStep
from tidegraph.processors.failures import validation_reason
from tidegraph.processors.temporal import stamp_interval
from tidegraph.records.episode import Episode, parse_episode
from tidegraph.records.errors import InvalidEpisode, RecordError
from tidegraph.settings import Settings
from tidegraph.stores import open_store
from tidegraph.topics.admin import partitions_of
from tidegraph.topics.client import Produced, ProduceReport, describe_line, producer_for
from tidegraph.topics.records import DeadLetter, ExtractedRecord, decode, encode_key

GROUPS = 4
GOOD = 24  # good records of crm_feed, over GROUPS groups
STORE_DECIDED = {"conflicting_duplicate"}  # reasons only a store holding the first write gives


def corpus_of(run: str) -> tuple[list[str], list[dict[str, Any]], Corpus]:
    groups = [group_name(run, i) for i in range(GROUPS)]
    return groups, crm_feed(GOOD, GROUPS, run=run), bad_corpus(groups)


def test_the_corpus_has_over_80_distinct_kinds_and_records() -> None:
    _, good, corpus = corpus_of("kinds")
    assert len({c.kind for c in corpus.cases}) == len(corpus.cases) >= 80
    for topic in ("episodes", "extracted"):
        raws = [c.raw for c in corpus.cases if c.topic == topic]
        assert len(set(raws)) == len(raws), f"two {topic} cases send the same record"
    assert not {c.raw for c in corpus.cases} & {orjson.dumps(e) for e in good + corpus.originals}
    assert sum(not c.worker_only for c in corpus.cases) >= 80


# ----------------------------------------------------------------------------- without a store
async def outcome_without_store(case: BadCase) -> tuple[str, str] | None:
    """(stage, reason) of the failure the pipeline's store-less steps give a record, in the
    order the pipeline runs them; None when they all take it."""
    if case.topic == "extracted":
        try:
            decode(ExtractedRecord, case.raw or b"")
        except ValidationError as exc:  # over the bounds of an extraction, or unreadable
            return "resolution", validation_reason(exc, "bad_hop_record")
        except ValueError:
            return "resolution", "bad_hop_record"
        return None
    try:
        episode = parse_episode(case.raw or b"")
    except InvalidEpisode as exc:
        return "validation", exc.reason
    if case.key != GROUP_KEY and case.key != encode_key(episode.group_id):
        return "validation", "key_mismatch"
    return await extracted_and_stamped(episode)


async def extracted_and_stamped(episode: Episode) -> tuple[str, str] | None:
    try:
        extraction = await ExtractionStep(mappings=crm_mappings(), llm=None).run(episode)
    except RecordError as exc:
        return "extraction", exc.reason
    try:
        for fact in extraction.facts:
            stamp_interval(fact.valid_at, fact.invalid_at, episode, strict=extraction.mapped)
    except RecordError as exc:
        return "temporal", exc.reason
    return None


_, _, PURE = corpus_of("pure")


@pytest.mark.parametrize(
    "case", [c for c in PURE.cases if c.reason not in STORE_DECIDED], ids=lambda c: c.kind
)
async def test_each_case_fails_where_expected_before_any_store(case: BadCase) -> None:
    assert await outcome_without_store(case) == (case.stage, case.reason)


async def test_the_good_records_and_the_store_decided_cases_pass_every_store_less_step() -> None:
    _, good, corpus = corpus_of("pure")
    store_decided = [c.raw for c in corpus.cases if c.reason in STORE_DECIDED]
    assert store_decided
    raws = [orjson.dumps(e) for e in good + corpus.originals] + corpus.resent + store_decided
    for raw in raws:
        assert await extracted_and_stamped(parse_episode(raw)) is None, raw[:200]


# ----------------------------------------------------------------------------- the worker
def spread(cases: list[bytes], good: list[bytes]) -> list[bytes]:
    """``cases`` with the ``good`` records between them, evenly."""
    step = max(1, len(cases) // (len(good) + 1))
    out, rest = [], list(good)
    for n, case in enumerate(cases, 1):
        out.append(case)
        if n % step == 0 and rest:
            out.append(rest.pop(0))
    return out + rest


def flat(text: str) -> str:
    """CLI output with rich's line wrapping undone."""
    return " ".join(text.split())


def produce_file(
    topology: Topology, name: str, lines: list[bytes]
) -> subprocess.CompletedProcess[str]:
    """`tidegraph produce FILE`: it must send every line, report the invalid ones, exit 0."""
    path = topology.tmp / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return topology.cli("produce", str(path))


async def input_records(settings: Settings, topic: str) -> list[Any]:
    """Every record of ``topic`` up to its end now, in partition and offset order."""
    consumer = AIOKafkaConsumer(
        **KafkaConnection.from_settings(settings).client_options(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        group_id=None,
    )
    await consumer.start()
    try:
        partitions = await partitions_of(KafkaConnection.from_settings(settings), topic)
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        records: list[Any] = []
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            for tp, messages in (await consumer.getmany(*remaining, timeout_ms=1000)).items():
                records += [m for m in messages if m.offset < ends[tp]]
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
    finally:
        await consumer.stop()
    return sorted(records, key=lambda m: (m.partition, m.offset))


def report_of(topic: str, records: list[Any]) -> ProduceReport:
    """A ProduceReport of records read back from the input topic: `wait_until_reflected`
    matches dead letters to them by origin (partition, offset)."""
    sent: list[Produced] = []
    for n, message in enumerate(records, 1):
        item = describe_line(n, message.value or b"")
        item.partition, item.offset = message.partition, message.offset
        item.timestamp_ms = message.timestamp
        sent.append(item)
    return ProduceReport(topic=topic, sent=sent)


@pytest.mark.integration
async def test_every_bad_record_is_dead_lettered_once_with_its_reason_and_the_worker_lives(
    topology: Topology,
) -> None:
    groups, good, corpus = corpus_of(topology.run)
    settings, names = topology.settings(), topology.names
    lines = [c for c in corpus.cases if c.is_line]
    special = [c for c in corpus.cases if not c.is_line]
    half = GOOD // 2
    worker = topology.start_worker(TIDEGRAPH_COMMUNITIES_ENABLED="false")

    # 1. Half of the good records, and the first episodes of the ids the corpus re-sends.
    first = produce_file(
        topology, "first.jsonl", [orjson.dumps(e) for e in good[:half] + corpus.originals]
    )
    assert "not valid episodes" not in first.stdout, first.stdout
    records = await input_records(settings, names.episodes)
    result = await topology.wait_reflected(report_of(names.episodes, records))
    assert result.processed == half + len(corpus.originals) and not result.dead

    # 2. Every case, the rest of the good records before, between and after them: the lines
    # through `tidegraph produce`, the rest (tombstones, blank values, wrong keys, the hop
    # topic) through a producer of this test's own.
    rest = [orjson.dumps(e) for e in good[half:]]
    second = rest[:3] + spread([c.raw for c in lines if c.raw], rest[3:-3]) + corpus.resent
    out = produce_file(topology, "second.jsonl", second + rest[-3:])
    invalid = [c for c in lines if c.stage == "validation"]
    assert f"; {len(invalid)} of them are not valid episodes" in flat(out.stdout), out.stdout
    first_invalid = next(n for n, raw in enumerate(second, 1) if raw == invalid[0].raw)
    assert f"line {first_invalid}: {invalid[0].reason}: " in flat(out.stderr), out.stderr
    hop_at = await send_special(topology, special)

    records = await input_records(settings, names.episodes)
    result = await topology.wait_reflected(report_of(names.episodes, records), timeout=90)
    assert worker.alive()

    async def letters_so_far() -> list[DeadLetter]:
        topology.check_workers()
        return await topology.dead_letters()

    letters = await eventually(
        letters_so_far,
        lambda got: len(got) >= len(corpus.cases),
        timeout=30,
        what=f"{len(corpus.cases)} dead letters",
    )

    # Each case: exactly one dead letter, with its stage and reason; no letter for the rest.
    at = {(m.partition, m.offset): m.value for m in records}
    by_raw = {c.raw: c for c in corpus.cases if c.topic == "episodes"}
    found: dict[str, list[tuple[str, str]]] = {}
    for letter in letters:
        if letter.origin is None:  # an unreadable hop record: no episode, no origin
            assert letter.consumed is not None and letter.consumed.topic == names.extracted
            case = hop_at[(letter.consumed.partition, letter.consumed.offset)]
        else:
            assert letter.origin.topic == names.episodes, letter
            case = by_raw[at[(letter.origin.partition, letter.origin.offset)]]
        found.setdefault(case.kind, []).append((letter.stage, letter.reason))
        assert letter.attempts == 1 and letter.message and letter.error_class, letter
        if case.stage == "validation" and case.raw and not letter.truncated:
            assert kept_as_sent(letter, case.raw), case.kind  # `dlq replay` can re-send it
    expected = {c.kind: [(c.stage, c.reason)] for c in corpus.cases}
    assert found == expected, mismatches(found, expected)

    # Every good episode is written, once; the worker never stopped.
    written = good + corpus.originals
    store = topology.store()
    try:
        for envelope in written:
            episode = Episode.model_validate(envelope)
            assert await store.episode_processed(episode.group_id, episode.uuid), episode.id
    finally:
        await store.close()
    assert await topology.episodes_written(groups) == len(written)
    topology.check_workers()
    assert worker.alive()
    assert worker.value("tidegraph_dead_letters_total") == len(corpus.cases)

    # `dlq list --group G` lists exactly G's letters (those of valid envelopes).
    group = groups[1]
    listed = topology.cli("dlq", "list", "--group", group, "--json").stdout.splitlines()
    mine = [(d.stage, d.reason, d.episode_id) for d in letters if d.group_id == group]
    assert len(mine) >= 5
    rows = [orjson.loads(row) for row in listed]
    assert sorted((r["stage"], r["reason"], r["episode_id"]) for r in rows) == sorted(mine)


def kept_as_sent(letter: DeadLetter, raw: bytes) -> bool:
    """The dead letter holds the record as it was sent: its bytes, or the same JSON."""
    kept = letter.original_bytes()
    if letter.record_encoding == "json":
        return bool(orjson.loads(kept) == orjson.loads(raw))
    return kept == raw


async def send_special(topology: Topology, cases: list[BadCase]) -> dict[tuple[int, int], BadCase]:
    """Send the cases `tidegraph produce` cannot (with their own key, or to the hop topic);
    returns the hop records' (partition, offset)."""
    names = topology.names
    producer = producer_for(topology.settings())
    await producer.start()
    try:
        sent: list[tuple[BadCase, Any]] = []
        for case in cases:
            topic = names.extracted if case.topic == "extracted" else names.episodes
            key = case.key
            if key == GROUP_KEY:
                group_id = describe_line(0, case.raw or b"").group_id
                key = group_id.encode() if group_id else None
            sent.append((case, await producer.send(topic, case.raw, key=key)))
        hops: dict[tuple[int, int], BadCase] = {}
        for case, future in sent:
            metadata = await future
            if case.topic == "extracted":
                hops[(metadata.partition, metadata.offset)] = case
        return hops
    finally:
        await producer.stop()


def mismatches(
    found: dict[str, list[tuple[str, str]]], expected: dict[str, list[tuple[str, str]]]
) -> str:
    return "\n".join(
        f"{kind}: expected {expected.get(kind)}, got {found.get(kind)}"
        for kind in sorted(set(found) | set(expected))
        if found.get(kind) != expected.get(kind)
    )


# ----------------------------------------------------------------------------- ingest
async def test_every_bad_line_fails_with_its_reason_through_ingest_and_the_good_ones_are_written(
    tmp_path: Path,
) -> None:
    groups, good, corpus = corpus_of("ingest")
    cases = [c for c in corpus.cases if not c.worker_only]
    half = GOOD // 2
    lines = (
        [orjson.dumps(e) for e in corpus.originals + good[:half]]
        + spread([c.raw for c in cases if c.raw], [orjson.dumps(e) for e in good[half:-3]])
        + corpus.resent
        + [orjson.dumps(e) for e in good[-3:]]
    )
    path, failures, mapping = (
        tmp_path / "feed.jsonl",
        tmp_path / "failures.jsonl",
        tmp_path / "m.yaml",
    )
    path.write_bytes(b"\n".join(lines) + b"\n")
    mapping.write_text(CRM_MAPPING)
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGRAPH_")}
    env.update(
        TIDEGRAPH_STORE="embedded", TIDEGRAPH_DATA_DIR=str(data), TIDEGRAPH_EMBEDDER="hashing"
    )
    args = ["ingest", str(path), "--mapping", str(mapping), "--failures", str(failures)]
    done = await asyncio.to_thread(
        subprocess.run,
        [TIDEGRAPH, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr

    # One failure per bad line, with its stage and reason: by line (validation) or episode.
    by_line = {n: raw for n, raw in enumerate(lines, 1)}
    by_raw = {c.raw: c for c in cases}
    by_episode = {(c.group_id, c.episode_id): c for c in cases if c.episode_id is not None}
    found: dict[str, list[tuple[str, str]]] = {}
    for row in map(orjson.loads, failures.read_bytes().splitlines()):
        if row["line"] is not None:
            case = by_raw[by_line[row["line"]]]
        else:
            case = by_episode[(row["group_id"], row["episode_id"])]
        found.setdefault(case.kind, []).append((row["stage"], row["reason"]))
        assert row["message"] and row["error_class"] and row["record"], row
    expected = {c.kind: [(c.stage, c.reason)] for c in cases}
    assert found == expected, mismatches(found, expected)
    shown = re.search(r"failures by reason: (.*?) all \d+ failures written to ", flat(done.stderr))
    assert shown, done.stderr
    counts = dict(part.split(": ") for part in shown.group(1).split(", "))
    assert {r: int(n) for r, n in counts.items()} == Counter(c.reason for c in cases)

    # Every good episode written once (the same-content re-send skipped).
    written = good + corpus.originals
    episodes = len(written) + len(corpus.resent)
    assert f"{episodes} episodes ({len(corpus.resent)} already processed)" in flat(done.stdout)
    assert await count_written(data, groups, written) == len(written)


async def count_written(data: Path, groups: list[str], written: list[dict[str, Any]]) -> int:
    store = open_store(Settings(store="embedded", data_dir=data, embedder="hashing"))
    try:
        for envelope in written:
            episode = Episode.model_validate(envelope)
            assert await store.episode_processed(episode.group_id, episode.uuid), episode.id
        return sum([(await store.browse.counts(g))["episodes"] for g in groups])
    finally:
        await store.close()
