"""The hops' handlers with no broker: consumed Kafka records in, the records to produce out.

The handlers are built as ``tidegraph/pipelines/streaming/app.py`` builds them (the extraction
hop and the write hop over one group runner) over the in-memory store, with the CRM mapping (docs:
"Streaming topology", "At-least-once with idempotent effects", "Retries and dead letters")."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

import orjson

from tests.support.crm_feed import crm_feed, crm_mappings
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.pipelines.streaming.config import WorkerSettings
from tidegraph.pipelines.streaming.handlers import (
    Consumed,
    Emit,
    ExtractionHandler,
    RecordHandler,
    WriteHandler,
)
from tidegraph.processors.steps import Components
from tidegraph.records.episode import parse_episode
from tidegraph.records.graph import EpisodeWrite
from tidegraph.records.sealed import is_sealed
from tidegraph.stores.memory.store import MemoryStore
from tidegraph.topics.names import TopicNames
from tidegraph.topics.records import DeadLetter, ExtractedRecord, NewEntityRecord, decode
from tidegraph.topics.sealing import Opened, Sealer, open_sealed

NAMES = TopicNames("t")
FEED = crm_feed(4, 1, run="t")  # envelopes of one tenant, in delivery order
GROUP = FEED[0]["group_id"]
WORKER = WorkerSettings(
    _env_file=None,  # type: ignore[call-arg]
    stage_max_attempts=3,
    retry_backoff_seconds=0.001,
    retry_backoff_max_seconds=0.001,
)
OFFSETS = itertools.count()


@dataclass
class Worker:
    """The handlers of one worker process, by hop: ``extraction`` and ``write`` (resolution,
    temporal, invalidation)."""

    store: MemoryStore
    extraction: ExtractionHandler
    write: WriteHandler


async def worker(store: MemoryStore | None = None, *, record_timeout: float = 60.0) -> Worker:
    store = store or MemoryStore()
    embedder = HashingEmbedder()
    await store.setup(embedder.dim)
    components = Components.of(store=store, embedder=embedder, llm=None, mappings=crm_mappings())
    runner = GroupRunner(components, policy=WORKER.retry_policy(), record_timeout=record_timeout)
    return Worker(
        store,
        ExtractionHandler(runner, NAMES, WORKER, record_timeout),
        WriteHandler(runner, NAMES, WORKER, record_timeout),
    )


async def handle(handler: RecordHandler, record: Consumed) -> list[Emit]:
    """One record's outputs (a job of one record)."""
    [outputs] = await handler.handle_group([record])
    return outputs


def consumed(topic: str, value: bytes | None, key: bytes | None) -> Consumed:
    return Consumed(topic, 0, next(OFFSETS), 1_700_000_000_000, key, value)


def envelope(record: dict[str, Any], key: str | None = None) -> Consumed:
    """An envelope on the input topic, keyed by its group unless ``key`` says otherwise."""
    return consumed(NAMES.episodes, orjson.dumps(record), (key or record["group_id"]).encode())


def hop_record(emit: Emit) -> Consumed:
    """What the write hop consumes once the extraction hop's output is produced."""
    assert emit.topic == NAMES.extracted
    return consumed(emit.topic, emit.value, emit.key)


def dead_letter(emits: list[Emit]) -> DeadLetter:
    [emit] = emits
    assert emit.topic == NAMES.dlq
    return decode(DeadLetter, emit.value)


async def extracted(worker: Worker, record: dict[str, Any]) -> Consumed:
    [emit] = await handle(worker.extraction, envelope(record))
    return hop_record(emit)


# ----------------------------------------------------------------------------- the happy path
async def test_a_mapped_envelope_becomes_one_extracted_record_with_its_origin() -> None:
    w = await worker()
    record = envelope(FEED[0])

    [emit] = await handle(w.extraction, record)
    assert (emit.topic, emit.key) == (NAMES.extracted, GROUP.encode())
    out = decode(ExtractedRecord, emit.value)
    assert out.origin == record.ref  # the episode's place on the input topic
    assert out.extraction.mapped and out.extraction.episode == parse_episode(record.value or b"")
    assert await w.store.browse.counts(GROUP) == {
        "episodes": 0,
        "entities": 0,
        "facts": 0,
        "mentions": 0,
    }


async def test_the_write_hop_writes_the_episode_and_announces_each_new_entity() -> None:
    w = await worker()
    episodes = [parse_episode(orjson.dumps(e)) for e in FEED[:2]]
    announced: list[set[str]] = []
    for record in FEED[:2]:
        before = {e.uuid for e in await w.store.browse.list_entities(GROUP)}
        emits = await handle(w.write, await extracted(w, record))
        assert {(e.topic, e.key) for e in emits} <= {(NAMES.entities_new, GROUP.encode())}
        events = [decode(NewEntityRecord, e.value) for e in emits]
        after = {e.uuid for e in await w.store.browse.list_entities(GROUP)}
        assert sorted(e.entity_uuid for e in events) == sorted(after - before)  # one per entity
        assert {(e.group_id, e.episode_uuid) for e in events} == {(GROUP, record_uuid(record))}
        announced.append({e.entity_uuid for e in events})
    assert all(announced) and not announced[0] & announced[1]
    for episode in episodes:
        assert await w.store.episode_processed(GROUP, episode.uuid, episode.content_hash)


def record_uuid(record: dict[str, Any]) -> str:
    return parse_episode(orjson.dumps(record)).uuid


async def test_a_redelivered_record_writes_nothing_again() -> None:
    w = await worker()
    first = await extracted(w, FEED[0])
    await handle(w.write, first)
    facts = await w.store.browse.query_facts(GROUP, include_invalid=True)
    counts = await w.store.browse.counts(GROUP)

    again = await extracted(w, FEED[0])  # a mapped episode is mapped again and forwarded
    for record in (first, again):
        emits = await handle(w.write, record)
        assert all(e.topic == NAMES.entities_new for e in emits)  # no dead letter
    assert await w.store.browse.query_facts(GROUP, include_invalid=True) == facts  # created_at too
    assert await w.store.browse.counts(GROUP) == counts


async def test_a_redelivered_record_sends_its_new_entity_events_again() -> None:
    w = await worker()
    record = await extracted(w, FEED[0])
    sent = await handle(w.write, record)  # then the worker dies before producing them
    assert sent

    assert await handle(w.write, record) == sent


# ----------------------------------------------------------------------------- dead letters
async def test_an_invalid_envelope_is_dead_lettered_at_validation() -> None:
    w = await worker()
    broken = {k: v for k, v in FEED[0].items() if k != "content"}
    record = envelope(broken)

    letter = dead_letter(await handle(w.extraction, record))
    assert (letter.stage, letter.reason, letter.attempts) == ("validation", "missing_field", 1)
    assert letter.origin == letter.consumed == record.ref
    assert (letter.record, letter.record_encoding) == (broken, "json")  # replayable as sent


async def test_a_key_that_is_not_the_group_is_refused() -> None:
    w = await worker()
    letter = dead_letter(await handle(w.extraction, envelope(FEED[0], key="another-group")))
    assert (letter.stage, letter.reason) == ("validation", "key_mismatch")
    assert letter.original_bytes() == orjson.dumps(FEED[0])


async def test_an_unreadable_hop_record_is_dead_lettered() -> None:
    w = await worker()
    valid = orjson.loads((await extracted(w, FEED[0])).value or b"")
    valid["extraction"]["facts"][0]["object"] = 99  # names an entity the record does not have
    for value in (b"not a hop record", orjson.dumps(valid)):
        letter = dead_letter(await handle(w.write, consumed(NAMES.extracted, value, b"k")))
        assert (letter.stage, letter.reason) == ("resolution", "bad_hop_record")
    assert await w.store.browse.counts(GROUP) == {
        "episodes": 0,
        "entities": 0,
        "facts": 0,
        "mentions": 0,
    }


class FailingWrites(MemoryStore):
    """Neo4j gone: every episode write fails with a connection error (transient)."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        self.attempts += 1
        raise ConnectionError("connection refused")


async def test_a_transient_failure_is_retried_then_dead_lettered_by_its_stage() -> None:
    store = FailingWrites()
    w = await worker(store)
    first = envelope(FEED[0])
    [emit] = await handle(w.extraction, first)
    record = hop_record(emit)

    letter = dead_letter(await handle(w.write, record))
    assert (letter.stage, letter.reason) == ("invalidation", "io")
    assert letter.attempts == store.attempts == WORKER.stage_max_attempts
    assert (letter.group_id, letter.episode_id) == (GROUP, FEED[0]["id"])
    assert (letter.origin, letter.consumed) == (first.ref, record.ref)
    assert parse_episode(letter.original_bytes()) == parse_episode(orjson.dumps(FEED[0]))


class HangingWrites(MemoryStore):
    """A write that never answers."""

    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_stage_slower_than_the_record_budget_times_out() -> None:
    w = await worker(HangingWrites(), record_timeout=0.2)
    letter = dead_letter(await handle(w.write, await extracted(w, FEED[0])))
    assert (letter.stage, letter.reason, letter.episode_id) == (
        "invalidation",
        "timeout",
        FEED[0]["id"],
    )


async def test_a_sealed_episode_goes_through_both_hops_sealed_and_its_dead_letter_too() -> None:
    """docs/streaming.md "Sealed episodes": the hop record is sealed with the episode's key;
    a write that fails gives a dead letter holding the envelope sealed again, which opens to
    the episode as produced; once the key is erased the hop record is ``key_erased``."""
    store = FailingWrites()
    w = await worker(store)
    sealed = await Sealer(store.keys).seal(orjson.dumps(FEED[0]), GROUP)
    first = consumed(NAMES.episodes, sealed, GROUP.encode())
    [emit] = await handle(w.extraction, first)
    assert emit.topic == NAMES.extracted and is_sealed(emit.value)
    letter = dead_letter(await handle(w.write, hop_record(emit)))
    assert (letter.reason, letter.episode_id) == ("io", FEED[0]["id"])
    kept = letter.original_bytes()
    assert is_sealed(kept) and b"content" not in kept
    [opened] = await open_sealed(store.keys, [kept])
    assert isinstance(opened, Opened)
    assert parse_episode(opened.value) == parse_episode(orjson.dumps(FEED[0]))

    await store.keys.erase_group_keys(GROUP)
    erased = dead_letter(await handle(w.write, hop_record(emit)))
    assert (erased.stage, erased.reason) == ("resolution", "key_erased")
    assert dead_letter(await handle(w.extraction, first)).reason == "key_erased"
