"""Client side of the topology: produce episodes, read and replay dead letters, and wait until
the graph reflects what was produced. Used by the CLI (``tidegraph produce``, ``dlq``,
``ingest --via kafka``), the tests and the benchmark."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from tidegraph.connections import KafkaConnection
from tidegraph.embed import make_embedder
from tidegraph.records.changes import Change
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.forget import ForgetRequest, parse_record
from tidegraph.records.times import utc
from tidegraph.settings import Settings
from tidegraph.stores import GraphStore, open_store
from tidegraph.topics.admin import ensure_topics, partitions_of
from tidegraph.topics.names import TopicNames
from tidegraph.topics.partitioning import KeyPartitioner
from tidegraph.topics.records import DeadLetter, RecordRef, decode
from tidegraph.topics.sealing import sealer_for

log = logging.getLogger(__name__)

REPLAY_HEADER = "tidegraph-replay-of"


# ----------------------------------------------------------------------------- produce
@dataclass
class Produced:
    """One line of the file as sent."""

    line: int
    group_id: str | None
    episode_uuid: str | None  # set for valid episodes
    problem: str | None = None  # why the line is not a valid episode (it is sent anyway)
    forget: bool = False  # a forget request (docs/architecture.md "Forgetting"), not an episode
    partition: int = -1
    offset: int = -1
    timestamp_ms: int | None = None  # the record's Kafka timestamp


@dataclass
class ProduceReport:
    topic: str
    sent: list[Produced] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)  # (line, Kafka's reason)
    skipped_invalid: int = 0
    seconds: float = 0.0

    @property
    def invalid(self) -> list[Produced]:
        return [p for p in self.sent if p.problem is not None]


def describe_line(line: int, raw: bytes) -> Produced:
    """Key (group_id) and episode uuid of a line, as the pipeline will see it."""
    try:
        parsed = parse_record(raw)
    except InvalidEpisode as exc:
        group = None
        try:
            data = orjson.loads(raw)
            if isinstance(data, dict) and isinstance(data.get("group_id"), str):
                group = data["group_id"] or None  # the key exactly as the group id was sent
        except orjson.JSONDecodeError:
            pass
        return Produced(line, group, None, problem=f"{exc.reason}: {exc}")
    if isinstance(parsed, ForgetRequest):
        return Produced(line, parsed.group_id, None, forget=True)
    return Produced(line, parsed.group_id, parsed.uuid)


def producer_for(settings: Settings) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        **KafkaConnection.from_settings(settings).client_options(),
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        partitioner=KeyPartitioner(),  # Kafka's default placement, each key hashed once
    )


async def ensure_all_topics(settings: Settings) -> None:
    await ensure_topics(
        KafkaConnection.from_settings(settings),
        TopicNames(settings.topic_prefix),
        partitions=settings.partitions,
        replication_factor=settings.replication_factor,
    )


async def produce_lines(
    settings: Settings,
    lines: Iterable[bytes],
    *,
    skip_invalid: bool = False,
    rate: float | None = None,
    on_delivered: Callable[[], None] | None = None,
    store: GraphStore | None = None,
) -> ProduceReport:
    """Send each non-empty line to the input topic, key = its group_id; wait for Kafka to
    acknowledge every record (acks=all). Lines that are not valid episodes are sent too (the
    pipeline dead-letters them with the reason) unless ``skip_invalid``. ``rate``: at most
    this many records per second (default: as fast as Kafka takes them). With
    ``TIDEGRAPH_ENCRYPT_EPISODES`` each valid episode is sealed with its group's key from
    ``store`` (default: the settings' store, opened for the call)."""
    names = TopicNames(settings.topic_prefix)
    await ensure_all_topics(settings)
    report = ProduceReport(topic=names.episodes)
    started = time.perf_counter()
    producer = producer_for(settings)
    opened = open_store(settings) if settings.encrypt_episodes and store is None else None
    sealer = sealer_for(settings, store or opened)
    try:
        await producer.start()  # inside: a failed start still closes the client
        pending: list[tuple[Produced, asyncio.Future]] = []
        clock = time.monotonic()
        for n, raw in enumerate(lines, 1):
            raw = raw.strip()
            if not raw:
                continue
            if rate:
                due = clock + len(pending) / rate
                if due > time.monotonic():
                    await asyncio.sleep(due - time.monotonic())
            item = describe_line(n, raw)
            if item.problem is not None and skip_invalid:
                report.skipped_invalid += 1
                continue
            key = item.group_id.encode() if item.group_id else None
            if sealer is not None and item.episode_uuid is not None and item.group_id:
                raw = await sealer.seal(raw, item.group_id)  # a valid episode: its content
            try:
                future = await producer.send(names.episodes, raw, key=key)
            except KafkaError as exc:  # e.g. larger than the producer's max request size
                report.refused.append((n, f"{type(exc).__name__}: {exc}"))
                continue
            if on_delivered is not None:
                future.add_done_callback(lambda _: on_delivered())
            pending.append((item, future))
        for item, future in pending:
            try:
                metadata = await future
            except KafkaError as exc:
                report.refused.append((item.line, f"{type(exc).__name__}: {exc}"))
                continue
            item.partition, item.offset = metadata.partition, metadata.offset
            item.timestamp_ms = metadata.timestamp if metadata.timestamp >= 0 else None
            report.sent.append(item)
    finally:
        await producer.stop()
        if opened is not None:
            await opened.close()
    report.seconds = time.perf_counter() - started
    return report


# ----------------------------------------------------------------------------- dead letters
@dataclass(frozen=True)
class StoredLetter:
    at: RecordRef  # the dead letter's own place in the dlq topic
    letter: DeadLetter
    key: bytes | None = None  # the dead letter's key (a declared source's record key)


def dlq_consumer(settings: Settings) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        **KafkaConnection.from_settings(settings).client_options(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        group_id=None,
    )


async def _assign_all(
    settings: Settings, consumer: AIOKafkaConsumer, topic: str
) -> list[TopicPartition]:
    """Assign every partition of ``topic`` (none when the topic does not exist yet)."""
    partitions = await partitions_of(KafkaConnection.from_settings(settings), topic)
    tps = [TopicPartition(topic, p) for p in partitions]
    if tps:
        consumer.assign(tps)
    return tps


async def dlq_end_offsets(settings: Settings) -> dict[int, int]:
    """The dead-letter topic's current end offset per partition."""
    topic = TopicNames(settings.topic_prefix).dlq
    consumer = dlq_consumer(settings)
    try:
        await consumer.start()  # inside: a failed start still closes the client
        tps = await _assign_all(settings, consumer, topic)
        if not tps:
            return {}
        ends = await consumer.end_offsets(tps)
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()


@dataclass(frozen=True)
class UnreadableLetter:
    """A record of the dead-letter topic that is no dead letter this version reads (written
    by hand, or by a foreign producer): shown as such, never dropped silently."""

    at: RecordRef
    problem: str


@dataclass
class DeadLetters:
    letters: list[StoredLetter] = field(default_factory=list)
    unreadable: list[UnreadableLetter] = field(default_factory=list)


def _decode_letter(message: object) -> StoredLetter | UnreadableLetter:
    ref = RecordRef(
        topic=message.topic,  # type: ignore[attr-defined]
        partition=message.partition,  # type: ignore[attr-defined]
        offset=message.offset,  # type: ignore[attr-defined]
        timestamp_ms=message.timestamp,  # type: ignore[attr-defined]
    )
    try:
        letter = decode(DeadLetter, message.value)  # type: ignore[attr-defined]
    except ValueError as exc:
        return UnreadableLetter(ref, _first_line(exc))
    return StoredLetter(ref, letter, message.key)  # type: ignore[attr-defined]


def _first_line(exc: ValueError) -> str:
    """What is wrong with an unreadable letter, in one line (a ValidationError's first
    problem)."""
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "letter"
        return f"{where}: {first['msg']}"
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__


async def read_dead_letters(
    settings: Settings,
    *,
    stage: str | None = None,
    since: datetime | None = None,
    groups: list[str] | None = None,
) -> list[StoredLetter]:
    """``read_dlq``'s readable letters; an unreadable one is logged and left out."""
    found = await read_dlq(settings, stage=stage, since=since, groups=groups)
    for odd in found.unreadable:
        log.warning(
            "unreadable dead letter at %s:%s:%s: %s",
            odd.at.topic, odd.at.partition, odd.at.offset, odd.problem,
        )  # fmt: skip
    return found.letters


async def read_dlq(
    settings: Settings,
    *,
    stage: str | None = None,
    since: datetime | None = None,
    groups: list[str] | None = None,
) -> DeadLetters:
    """Every dead letter (optionally of ``stage``, failed at or after ``since``, of one of
    ``groups``), oldest first per partition, read up to the topic's end at the time of the
    call; and the records of the topic that are no readable dead letter (only when no
    filter is asked: their stage and group are unknown)."""
    topic = TopicNames(settings.topic_prefix).dlq
    consumer = dlq_consumer(settings)
    found = DeadLetters()
    try:
        await consumer.start()  # inside: a failed start still closes the consumer
        tps = await _assign_all(settings, consumer, topic)
        if not tps:
            return found
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
        if since is not None:
            found_at = await consumer.offsets_for_times(
                {tp: int(utc(since).timestamp() * 1000) for tp in tps}
            )
            starts = {tp: (found_at[tp].offset if found_at.get(tp) else ends[tp]) for tp in tps}
        for tp in tps:
            consumer.seek(tp, starts[tp])
        remaining = {tp for tp in tps if starts[tp] < ends[tp]}
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=1000)
            for tp, messages in batch.items():
                for message in messages:
                    if message.offset >= ends[tp]:
                        continue
                    stored = _decode_letter(message)
                    if isinstance(stored, StoredLetter):
                        found.letters.append(stored)
                    else:
                        found.unreadable.append(stored)
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
    finally:
        await consumer.stop()
    found.letters = [
        s
        for s in found.letters
        if (stage is None or s.letter.stage == stage)
        and (since is None or s.letter.failed_at >= utc(since))
        and (not groups or s.letter.group_id in groups)
    ]
    if stage is not None or groups:
        found.unreadable = []
    return found


@dataclass
class ReplayReport:
    replayed: int = 0
    duplicates: int = 0  # dead letters of a record already replayed in this run
    not_replayable: list[tuple[StoredLetter, str]] = field(default_factory=list)
    unreadable: list[UnreadableLetter] = field(default_factory=list)  # no dead letter at all


def _source_topic(stored: StoredLetter) -> str | None:
    """The source topic a declared source's dead letter came from (docs/sources.md)."""
    letter = stored.letter
    if letter.stage == "source" and letter.consumed is not None:
        return letter.consumed.topic
    return None


def _replay_key(raw: bytes, letter: DeadLetter) -> bytes | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("group_id"), str) and data["group_id"]:
        return data["group_id"].strip().encode()
    return letter.group_id.encode() if letter.group_id else None


async def _forgotten(
    settings: Settings, chosen: dict[bytes, tuple[StoredLetter, bytes]]
) -> list[bytes]:
    """The records among ``chosen`` whose episode has been forgotten since (its tombstone is
    in the configured store)."""
    named = [(raw, s.letter) for raw, (s, _) in chosen.items() if s.letter.episode_uuid]
    if not named:
        return []
    store = open_store(settings)
    embedder = make_embedder(settings)
    try:
        if not await store.open_existing(embedder.dim, embedder.model_name):
            return []  # nothing was ever written there (a fresh folder): nothing forgotten
        gone = []
        for raw, letter in named:
            assert letter.group_id is not None and letter.episode_uuid is not None
            if await store.episode_status(letter.group_id, letter.episode_uuid) == "forgotten":
                gone.append(raw)
        return gone
    finally:
        await embedder.close()
        await store.close()


async def replay_dead_letters(
    settings: Settings,
    *,
    stage: str | None = None,
    since: datetime | None = None,
    dry_run: bool = False,
) -> ReplayReport:
    """Send the original records of matching dead letters back to the input topic (key =
    group_id, header ``tidegraph-replay-of: <partition>:<offset>`` of the dead letter); a
    declared source's record (stage ``source``) goes back to its source topic with its key.
    Each distinct original record is sent once (its latest dead letter); processed episodes
    are skipped by the pipeline, so replaying twice is harmless."""
    found = await read_dlq(settings, stage=stage, since=since)
    report = ReplayReport(unreadable=found.unreadable)
    chosen: dict[bytes, tuple[StoredLetter, bytes]] = {}
    for stored in found.letters:
        if stored.letter.truncated:
            report.not_replayable.append((stored, "the dead letter holds a truncated record"))
            continue
        if stored.letter.reason == "bad_hop_record":
            report.not_replayable.append((stored, "an unreadable internal record, not an episode"))
            continue
        try:
            raw = stored.letter.original_bytes()
        except ValueError as exc:
            report.not_replayable.append((stored, f"cannot decode the record: {exc}"))
            continue
        if _source_topic(stored) is not None:  # a source's record: distinct by its place
            raw_key = raw + b"\0" + f"{stored.letter.consumed}".encode()
        else:
            raw_key = raw
        if raw_key in chosen:
            report.duplicates += 1
        chosen[raw_key] = (stored, raw)
    for raw in await _forgotten(settings, chosen):
        # erased: it never comes back (docs/architecture.md "Forgetting")
        report.not_replayable.append((chosen.pop(raw)[0], "its episode was forgotten"))
    if dry_run:
        report.replayed = len(chosen)
        return report
    names = TopicNames(settings.topic_prefix)
    producer = producer_for(settings)
    try:
        await producer.start()  # inside: a failed start still closes the client
        futures = []
        for stored, raw in chosen.values():
            origin = f"{stored.at.partition}:{stored.at.offset}".encode()
            source_topic = _source_topic(stored)
            futures.append(
                await producer.send(
                    source_topic or names.episodes,
                    raw,
                    key=stored.key if source_topic else _replay_key(raw, stored.letter),
                    headers=[(REPLAY_HEADER, origin)],
                )
            )
        for future in futures:
            await future
    finally:
        await producer.stop()
    report.replayed = len(chosen)
    return report


# ----------------------------------------------------------------------------- waiting
@dataclass
class WaitReport:
    processed: int = 0
    dead: list[DeadLetter] = field(default_factory=list)
    pending: list[Produced] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def done(self) -> bool:
        return not self.pending


class StalledError(RuntimeError):
    """Nothing progressed for too long (are the workers running?)."""

    def __init__(self, message: str, pending: list[Produced]) -> None:
        super().__init__(message)
        self.pending = pending


async def wait_until_reflected(
    settings: Settings,
    report: ProduceReport,
    *,
    dlq_from: dict[int, int] | None = None,
    stall_seconds: float = 300.0,
    poll_seconds: float = 0.5,
    on_progress: Callable[[int], None] | None = None,
) -> WaitReport:
    """Wait until every sent record is reflected: a valid episode's processed marker exists,
    or a dead letter names the record (by its partition and offset on the input topic).
    ``dlq_from``: dead-letter offsets to read from (taken before producing); default: all.
    Raises StalledError when nothing changes for ``stall_seconds``."""
    started = time.perf_counter()
    result = WaitReport()
    # A forget request is not waited for: it leaves nothing to see but what it erased.
    by_position = {(p.partition, p.offset): p for p in report.sent if not p.forget}
    valid = {pos for pos, p in by_position.items() if p.episode_uuid is not None}
    pending = set(by_position)
    store = open_store(settings)
    consumer = dlq_consumer(settings)
    try:
        await consumer.start()  # inside: a failed start still closes the client
        tps = await _assign_all(settings, consumer, TopicNames(settings.topic_prefix).dlq)
        if not tps:
            raise RuntimeError(f"topic {TopicNames(settings.topic_prefix).dlq} does not exist")
        for tp in tps:
            if dlq_from is not None and tp.partition in dlq_from:
                consumer.seek(tp, dlq_from[tp.partition])
            else:
                await consumer.seek_to_beginning(tp)
        last_change = time.monotonic()
        while pending:
            before = len(pending)
            batch = await consumer.getmany(timeout_ms=int(poll_seconds * 1000))
            for messages in batch.values():
                for message in messages:
                    stored = _decode_letter(message)
                    if not isinstance(stored, StoredLetter):
                        continue  # no dead letter of a record produced here
                    origin = stored.letter.origin
                    if origin is None or origin.topic != report.topic:
                        continue
                    position = (origin.partition, origin.offset)
                    if position in pending:
                        pending.discard(position)
                        result.dead.append(stored.letter)
            for pos in await _newly_processed(store, [by_position[p] for p in pending & valid]):
                pending.discard(pos)
                result.processed += 1
            if len(pending) != before:
                last_change = time.monotonic()
                if on_progress is not None:
                    on_progress(before - len(pending))
            elif time.monotonic() - last_change > stall_seconds:
                raise StalledError(
                    f"{len(pending)} of {len(by_position)} records not reflected in the graph "
                    f"after {stall_seconds:.0f}s without progress: are workers running "
                    f"(`tidegraph worker`) on topic prefix {settings.topic_prefix!r}?",
                    [by_position[pos] for pos in sorted(pending)],
                )
    finally:
        await consumer.stop()
        await store.close()
    result.seconds = time.perf_counter() - started
    return result


async def _newly_processed(
    store: GraphStore, items: list[Produced], window: int = 256
) -> list[tuple[int, int]]:
    """Positions of ``items`` stored in the graph (processed, or stored without extraction:
    searchable either way, docs/architecture.md "Episodes without an LLM"). A group's episodes are
    written in order, so each group's oldest ``window`` pending episodes are asked, in one read per
    group (bounded work per poll on big files, and little beside the workers' own)."""
    by_group: dict[str | None, list[Produced]] = {}
    for item in sorted(items, key=lambda p: (p.partition, p.offset)):
        by_group.setdefault(item.group_id, []).append(item)

    async def front(group_items: list[Produced]) -> list[tuple[int, int]]:
        chunk = group_items[:window]
        group = chunk[0].group_id
        assert group is not None  # only valid episodes are asked
        statuses = await store.episode_statuses(group, [str(p.episode_uuid) for p in chunk])
        return [
            (p.partition, p.offset) for p in chunk if statuses[str(p.episode_uuid)] != "missing"
        ]

    results = await asyncio.gather(*(front(g) for g in by_group.values()))
    return [pos for group_done in results for pos in group_done]


async def read_changes(settings: Settings, groups: list[str] | None = None) -> list[Change]:
    """Every change on ``{prefix}.changes`` (of ``groups``) up to its current end, as consumed:
    per partition in offset order, duplicates included (a relay that died after producing
    publishes again; consumers drop what they have seen by ``change_id``)."""
    return [change async for change in stream_changes(settings, groups)]


async def stream_changes(
    settings: Settings,
    groups: Iterable[str] | None = None,
    *,
    follow: bool = False,
    poll_seconds: float = 1.0,
) -> AsyncIterator[Change]:
    """The changes on ``{prefix}.changes`` (of ``groups``) from the topic's beginning, each
    group's in commit order; with ``follow``, then every new one as the relay publishes it,
    until the caller stops iterating (waiting for the topic if no worker created it yet).
    Close the iterator (``contextlib.aclosing``) to stop its consumer promptly."""
    topic = TopicNames(settings.topic_prefix).changes
    wanted = None if groups is None else set(groups)
    # The relay keys each change by its group (tidegraph/pipelines/streaming/relay.py): the
    # other groups' changes are passed over by their key, not decoded.
    wanted_keys = None if wanted is None else {group.encode() for group in wanted}
    consumer = dlq_consumer(settings)
    try:
        await consumer.start()  # inside: a failed start still closes the consumer
        tps = await _assign_all(settings, consumer, topic)
        while follow and not tps:
            await asyncio.sleep(poll_seconds)
            tps = await _assign_all(settings, consumer, topic)
        if not tps:
            return
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            await consumer.seek_to_beginning(tp)
        remaining = {tp for tp in tps if ends[tp] > 0}
        while follow or remaining:
            batch = await consumer.getmany(*tps, timeout_ms=int(poll_seconds * 1000))
            for tp, messages in batch.items():
                for message in messages:
                    if (not follow and message.offset >= ends[tp]) or message.value is None:
                        continue
                    key = message.key
                    if wanted_keys is not None and key is not None and key not in wanted_keys:
                        continue
                    try:
                        change = Change.model_validate_json(message.value)
                    except ValueError:
                        log.warning(
                            "skipping a record on %s that is not a change (partition %d, "
                            "offset %d)", topic, tp.partition, message.offset,
                        )  # fmt: skip
                        continue
                    if wanted is None or change.group_id in wanted:
                        yield change
            if not follow:
                for tp in list(remaining):
                    if await consumer.position(tp) >= ends[tp]:
                        remaining.discard(tp)
    finally:
        await consumer.stop()
