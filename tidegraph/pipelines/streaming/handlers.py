"""Handlers: one group's consumed records in, the records to produce out (no Faust here).

Each hop's handler decodes its records, hands the episodes to the group runner
(``tidegraph.pipelines.runner``: the same scheduler as in-process) and encodes each episode's
outcome: the extraction hop's record, the new-entity events after the write, or a dead letter.
Handlers never raise for a bad or failing record. Every effect is idempotent, so a handler may
safely see the same record again (a redelivery after a crash, a replay): each step skips an
already processed episode where it costs least (docs: "At-least-once with idempotent effects").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ValidationError

from tidegraph.metrics import (
    DEAD_LETTERS,
    END_TO_END_LATENCY,
    FORGET_REQUESTS,
    STAGE_EVENTS,
    WRITES_IN_EXTRACTION_HOP,
)
from tidegraph.pipelines.forget import ForgetError, forget
from tidegraph.pipelines.outage import StoreOutage, budget
from tidegraph.pipelines.runner import WRITE_STAGES, GroupRunner
from tidegraph.pipelines.streaming.config import WorkerSettings
from tidegraph.pipelines.streaming.fusing import WriteHere
from tidegraph.processors.failures import STORE_MAY_BE_DOWN, classify, validation_reason
from tidegraph.records import jsontext
from tidegraph.records.episode import Episode, parse_episode
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.forget import ForgetRequest, parse_record
from tidegraph.records.outcome import Failure, Outcome
from tidegraph.records.sealed import DataKey, is_sealed, seal
from tidegraph.records.stages import Extraction, WriteSummary
from tidegraph.records.times import utcnow
from tidegraph.stores.errors import StoreUnreachable
from tidegraph.stores.roles import Keys
from tidegraph.topics.names import TopicNames
from tidegraph.topics.records import (
    MAX_RECORD_VALUE_BYTES,
    DeadLetter,
    ExtractedRecord,
    ForgetRecord,
    NewEntityRecord,
    RecordRef,
    decode,
    decode_extracted,
    encode,
    encode_key,
    original_record,
    short_message,
)
from tidegraph.topics.sealing import Opened, hop_value, open_sealed, seal_hop

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

# The extraction stage: the extraction hop's, and a declared source's records that a mapping
# extracts where they are read (tidegraph/pipelines/streaming/sources.py).
EXTRACTION = "extraction"


@dataclass(frozen=True)
class Consumed:
    """A record as a stage consumed it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()  # read by declared sources' templates

    @property
    def ref(self) -> RecordRef:
        return RecordRef(
            topic=self.topic,
            partition=self.partition,
            offset=self.offset,
            timestamp_ms=self.timestamp_ms,
        )


@dataclass(frozen=True)
class Emit:
    """A record to produce."""

    topic: str
    key: bytes | None
    value: bytes


@dataclass(frozen=True)
class Taken:
    """An episode as a hop read it, and its record on the input topic."""

    episode: Episode
    origin: RecordRef
    key: DataKey | None = None  # the group's key that sealed it (docs/streaming.md)


class RecordHandler:
    """What every handler shares: its retry policy and time budget, and dead letters. A
    handler takes one group's records of a micro-batch together (``handle_group``, at most
    ``group_take``) and gives each one's outputs, in order; it never raises for a bad or
    failing record."""

    stage: str = "stage"
    # Whether the store answers (tidegraph.pipelines.outage): the handler's deadline stops
    # while it does not.
    outage: StoreOutage | None = None
    # The groups' data keys that open sealed records (docs/streaming.md "Sealed episodes").
    keys: Keys | None = None

    def __init__(self, names: TopicNames, worker: WorkerSettings, record_timeout: float) -> None:
        self.names = names
        self.worker = worker
        self.record_timeout = record_timeout
        self.policy = worker.retry_policy()

    def deadline(self, records: int) -> float:
        """The longest a group's job of ``records`` may take in this handler: a backstop
        behind the runner's own budgets (each record's, each unit's, retries included)."""
        return self.record_timeout * (2 * WRITE_STAGES + 1) * max(1, records)

    async def handle_group(self, records: Sequence[Consumed]) -> list[list[Emit]]:
        """The outputs of each of ``records`` (one group's, in order)."""
        raise NotImplementedError

    @property
    def group_take(self) -> int:
        """The most records of one group ``handle_group`` is given at once: the group's
        records waiting, up to this (``tidegraph.pipelines.streaming.lanes.KeyedBacklog``)."""
        return self.worker.batch_size

    def lane_of(self, topic: str, partition: int, key: bytes | None) -> Hashable:
        """The lane a record runs in (its lane's records in order, lanes concurrently): its
        Kafka key, the group on tidegraph's own topics."""
        return key

    def decode_hop(self, model: type[M], record: Consumed) -> M | Emit:
        """The hop record, or a dead letter when it cannot be read (a producer bug)."""
        try:
            return decode(model, record.value or b"")
        except (ValueError, ValidationError) as exc:
            return self.dead(
                record, Failure.of(self.stage, exc, "bad_hop_record"), raw=record.value
            )

    def failed(self, record: Consumed, failure: Failure, taken: Taken) -> Emit:
        """The dead letter of an episode the runner gave up on."""
        return self.dead(record, failure, episode=taken.episode, origin=taken.origin, key=taken.key)

    def written(self, record: Consumed, read: Taken, outcome: Outcome[WriteSummary]) -> list[Emit]:
        """The outputs of an episode the group runner wrote: its new-entity events, or its
        dead letter."""
        if outcome.failure is not None:
            return [self.failed(record, outcome.failure, read)]
        return self.new_entities(outcome, read)

    def new_entities(self, outcome: Outcome[WriteSummary], hop: Taken) -> list[Emit]:
        """The episode's new-entity events, after its write committed. Also sent again for
        an episode found already written (a worker that died between the write and the send
        loses none); consumers treat them idempotently."""
        if outcome.value is not None and not outcome.processed:
            created = outcome.value.created_entities
            if hop.origin.timestamp_ms is not None:
                END_TO_END_LATENCY.observe(max(0.0, time.time() - hop.origin.timestamp_ms / 1000))
        else:
            created = outcome.created_entities
        episode = hop.episode
        key = encode_key(episode.group_id)
        return [
            Emit(
                self.names.entities_new,
                key,
                encode(
                    NewEntityRecord(
                        group_id=episode.group_id, entity_uuid=uuid, episode_uuid=episode.uuid
                    )
                ),
            )
            for uuid in created
        ]

    def extracted_hop(self, record: Consumed, read: Taken, extraction: Extraction) -> Emit:
        """The episode's extraction as its ``{prefix}.extracted`` record, keyed by group
        (sealed as the episode came), or its dead letter when it is too large for Kafka."""
        group_id = read.episode.group_id
        data = encode(ExtractedRecord(origin=read.origin, extraction=extraction))
        if read.key is not None:
            data = seal_hop(data, group_id, read.key)
        if len(data) > MAX_RECORD_VALUE_BYTES:
            error = ValueError(
                f"the {self.names.extracted} record of this episode would be {len(data)} "
                f"bytes; Kafka takes at most {MAX_RECORD_VALUE_BYTES}"
            )
            return self.failed(record, Failure.of(EXTRACTION, error, "too_large"), read)
        return Emit(self.names.extracted, encode_key(group_id), data)

    async def open_sealed(
        self, records: Sequence[Consumed]
    ) -> list[Opened | InvalidEpisode | None]:
        """The sealed records opened with their groups' keys (docs/streaming.md "Sealed
        episodes"); while the store does not answer, it waits for the store and reads again."""
        while True:
            since = self.outage.outages if self.outage is not None else 0
            try:
                return await open_sealed(self.keys, [r.value for r in records])
            except StoreUnreachable:
                raise
            except Exception as exc:
                down = classify(exc).reason in STORE_MAY_BE_DOWN
                if down and self.outage is not None and await self.outage.held(since):
                    continue
                raise

    def dead(
        self,
        record: Consumed,
        failure: Failure,
        *,
        episode: Episode | None = None,
        origin: RecordRef | None = None,
        raw: bytes | None = None,
        key: DataKey | None = None,
    ) -> Emit:
        if episode is not None and key is not None:  # sealed as it came, and replayable
            raw = _sealed_episode_bytes(episode, key, fallback=record.value)
        elif episode is not None and not is_sealed(record.value):
            raw = _episode_bytes(episode, fallback=raw if raw is not None else record.value)
        elif episode is not None:
            raw = record.value
        body, encoding, truncated = original_record(raw)
        letter = DeadLetter(
            stage=failure.stage,
            reason=failure.reason,
            error_class=failure.error_class,
            message=short_message(failure.message),
            attempts=failure.attempts,
            failed_at=utcnow(),
            group_id=episode.group_id if episode else None,
            episode_id=episode.id if episode else None,
            episode_uuid=episode.uuid if episode else None,
            origin=origin,
            consumed=record.ref,
            record=body,
            record_encoding=encoding,
            truncated=truncated,
        )
        DEAD_LETTERS.labels(failure.stage, failure.reason).inc()
        STAGE_EVENTS.labels(failure.stage, "dead_lettered").inc()
        log.warning(
            "dead_letter stage=%s reason=%s group=%s episode=%s attempts=%d at=%s:%d:%d "
            "error=%s: %s",
            failure.stage, failure.reason, letter.group_id, letter.episode_id,
            failure.attempts, record.topic, record.partition, record.offset,
            letter.error_class, letter.message[:300],
        )  # fmt: skip
        kafka_key = encode_key(episode.group_id) if episode else record.key
        return Emit(self.names.dlq, kafka_key, encode(letter))

    def crashed(self, record: Consumed, exc: BaseException, *, reason: str) -> Emit:
        """The dead letter of a record whose handling raised (``internal_error``: a handler
        broke its contract) or ran out of its time budget (``timeout``): built from the
        consumed bytes alone, so that it cannot fail the way the handler did."""
        episode, origin = _episode_in(record.value)
        return self.dead(
            record,
            Failure.of(self.stage, exc, reason),
            episode=episode,
            origin=origin or record.ref,  # a hop record's origin, or this input record
            raw=record.value,
        )


class RunnerHandler(RecordHandler):
    """A hop over the group runner: its outage tracker and its store's data keys."""

    def __init__(
        self, runner: GroupRunner, names: TopicNames, worker: WorkerSettings, record_timeout: float
    ) -> None:
        super().__init__(names, worker, record_timeout)
        self.runner = runner
        self.outage = runner.outage
        self.keys = runner.components.store.keys


class ExtractionHandler(RunnerHandler):
    """The extraction hop: envelopes from ``{prefix}.episodes`` checked and extracted by the
    group runner (``GroupRunner.extract``), each extraction produced to
    ``{prefix}.extracted`` with the origin of its envelope."""

    stage = EXTRACTION

    @property
    def group_take(self) -> int:
        extraction = self.runner.extraction
        if extraction.llm is not None:  # what it extracts at once: outputs wait for the slowest
            return self.runner.extract_ahead * extraction.episodes_per_call
        return super().group_take

    # Mapped records written here rather than handed on, when nothing of their group is on its
    # way to the write hop (tidegraph/pipelines/streaming/fusing.py); None: always handed on.
    write_here: WriteHere | None = None

    async def handle_group(self, records: Sequence[Consumed]) -> list[list[Emit]]:
        opened = await self.open_sealed(records)
        taken = [self._read_episode(r, o) for r, o in zip(records, opened, strict=True)]
        episodes = [t.episode for t in taken if isinstance(t, Taken)]
        outcomes = iter(await self.runner.extract(episodes))
        outputs: list[list[Emit]] = []
        # The leading mapped extractions, until the first record handed on: written here if
        # they may be (their outputs are filled in then), else handed on like the rest.
        here: list[tuple[int, Consumed, Taken, Extraction]] = []
        may_write_here = self.write_here is not None
        for record, read in zip(records, taken, strict=True):
            if isinstance(read, Emit):
                outputs.append([read])
            elif isinstance(read, ForgetRecord):  # handed on, in its group's order
                outputs.append([self._hop_record(read, record, read.forget.group_id)])
                FORGET_REQUESTS.labels("taken").inc()
                may_write_here = False
            else:
                outcome = next(outcomes)
                if outcome.failure is not None:
                    outputs.append([self.failed(record, outcome.failure, read)])
                elif outcome.processed or outcome.value is None:
                    outputs.append([])  # already in the graph: nothing to hand on
                elif may_write_here and outcome.value.mapped:
                    here.append((len(outputs), record, read, outcome.value))
                    outputs.append([])
                else:
                    outputs.append([self.extracted_hop(record, read, outcome.value)])
                    may_write_here = False
                    if outcome.value.mapped:
                        WRITES_IN_EXTRACTION_HOP.labels("handed_on").inc()
        if here:
            written = await self._write(here)
            for (at, *_), emits in zip(here, written, strict=True):
                outputs[at] = emits
        return outputs

    async def _write(self, here: list[tuple[int, Consumed, Taken, Extraction]]) -> list[list[Emit]]:
        """The outputs of one group's mapped records: written here (their new-entity events
        or dead letters), or their ``{prefix}.extracted`` records when they must take the
        hop."""
        assert self.write_here is not None
        first = here[0][1]
        extractions = [extraction for *_, extraction in here]
        outcomes = await self.write_here.write(
            encode_key(here[0][2].episode.group_id) or b"",
            first.partition,
            lambda: self.runner.write(extractions),
        )
        if outcomes is None:
            WRITES_IN_EXTRACTION_HOP.labels("handed_on").inc(len(here))
            return [[self.extracted_hop(r, read, x)] for _, r, read, x in here]
        WRITES_IN_EXTRACTION_HOP.labels("written").inc(len(here))
        return [
            self.written(record, read, outcome)
            for (_, record, read, _), outcome in zip(here, outcomes, strict=True)
        ]

    def _hop_record(self, hop: ForgetRecord, record: Consumed, group_id: str) -> Emit:
        """A forget request handed on to the write hop, in its group's order."""
        return Emit(self.names.extracted, encode_key(group_id), encode(hop))

    def _read_episode(
        self, record: Consumed, opened: Opened | InvalidEpisode | None
    ) -> Taken | ForgetRecord | Emit:
        """The input topic: an envelope (or a forget request) as produced, checked (size,
        validity, key); a sealed one as ``open_sealed`` opened it."""
        raw = record.value or b""
        if isinstance(opened, InvalidEpisode):  # its key erased, or its body altered
            return self._invalid(record, opened.reason, opened)
        if len(raw) > self.worker.max_record_bytes:
            error = ValueError(
                f"record is {len(raw)} bytes; the limit is {self.worker.max_record_bytes} "
                "(TIDEGRAPH_MAX_RECORD_BYTES)"
            )
            return self._invalid(record, "oversized", error)
        try:
            parsed = parse_record(raw if opened is None else opened.value)
        except InvalidEpisode as exc:
            return self._invalid(record, exc.reason, exc)
        if record.key != encode_key(parsed.group_id):
            error = ValueError(
                f"record key {record.key!r} is not the record's group_id "
                f"{parsed.group_id!r}: per-group order needs key = group_id "
                "(`tidegraph dlq replay` re-sends it with the right key)"
            )
            return self._invalid(record, "key_mismatch", error)
        if isinstance(parsed, ForgetRequest):
            return ForgetRecord(origin=record.ref, forget=parsed)
        return Taken(parsed, record.ref, opened.key if opened is not None else None)

    def _invalid(self, record: Consumed, reason: str, exc: Exception) -> Emit:
        failure = Failure.of("validation", exc, reason)
        return self.dead(record, failure, origin=record.ref, raw=record.value)


class WriteHandler(RunnerHandler):
    """The write hop: extractions from ``{prefix}.extracted`` resolved, stamped, invalidated
    and written by the group runner (``GroupRunner.write``); then each episode's new-entity
    events to ``{prefix}.entities.new``."""

    stage = "resolution"  # the hop's first stage names it (metrics, dead letters)

    @property
    def group_take(self) -> int:  # one unit, as in-process
        return min(super().group_take, self.runner.unit_episodes)

    async def handle_group(self, records: Sequence[Consumed]) -> list[list[Emit]]:
        opened = await self.open_sealed(records)
        taken = [self._read_hop(r, o) for r, o in zip(records, opened, strict=True)]
        outputs: list[list[Emit]] = []
        at = 0
        while at < len(records):  # runs of extractions, and the forgets between them
            read = taken[at]
            if isinstance(read, Emit):
                outputs.append([read])
                at += 1
            elif isinstance(read, ForgetRecord):
                outputs.append(await self._forget(records[at], read))
                at += 1
            else:
                end = at
                while end < len(records) and isinstance(taken[end], ExtractedRecord):
                    end += 1
                run = cast(list[ExtractedRecord], taken[at:end])
                outcomes = await self.runner.write([hop.extraction for hop in run])
                keys = [o.key if isinstance(o, Opened) else None for o in opened[at:end]]
                for record, hop, key, outcome in zip(
                    records[at:end], run, keys, outcomes, strict=True
                ):
                    read_hop = Taken(hop.extraction.episode, hop.origin, key)
                    outputs.append(self.written(record, read_hop, outcome))
                at = end
        return outputs

    def _read_hop(
        self, record: Consumed, opened: Opened | InvalidEpisode | None
    ) -> ExtractedRecord | ForgetRecord | Emit:
        """The hop record (a sealed one opened), or a dead letter when it cannot be read (a
        producer bug; its key erased meanwhile)."""
        if isinstance(opened, InvalidEpisode):
            return self.dead(
                record, Failure.of(self.stage, opened, opened.reason), raw=record.value
            )
        try:
            value = hop_value(opened) if opened is not None else record.value
            return decode_extracted(value or b"")
        except (ValueError, ValidationError) as exc:
            reason = "bad_hop_record"
            if isinstance(exc, ValidationError):  # one over the bounds of an extraction
                reason = validation_reason(exc, reason)
            return self.dead(record, Failure.of(self.stage, exc, reason), raw=record.value)

    async def _forget(self, record: Consumed, hop: ForgetRecord) -> list[Emit]:
        """A forget request, run in its group's order; a dead letter when it cannot be done
        (nothing was forgotten then: replaying the letter tries again). While the store does
        not answer, it waits for the store and runs again (a forget is idempotent)."""
        while True:
            since = self.runner.outage.outages
            try:
                report = await forget(self.runner, hop.forget)
                break
            except StoreUnreachable:
                raise
            except Exception as exc:
                reason = "forget_failed" if isinstance(exc, ForgetError) else classify(exc).reason
                if reason in STORE_MAY_BE_DOWN and await self.runner.outage.held(since):
                    continue
                FORGET_REQUESTS.labels("failed").inc()
                letter = self.dead(record, Failure.of("forget", exc, reason), origin=hop.origin)
                return [letter]
        FORGET_REQUESTS.labels("done").inc()
        log.info("forget request done: %s", report.line())
        return []


async def handled(handler: RecordHandler, records: Sequence[Consumed]) -> list[list[Emit]]:
    """The handler's outputs for one group's records, within its deadline. Handlers turn
    record failures into dead letters themselves; whatever still escapes them (a bug), or a
    job that takes longer than the deadline, makes a dead letter of each of its records here:
    a record never stops the worker or holds its group for longer than that."""
    deadline = handler.deadline(len(records))
    try:
        async with budget(handler.outage, deadline) as limit:
            return await handler.handle_group(records)
    except StoreUnreachable:
        raise  # the store stayed down past its limit: the worker stops, committing nothing
    except Exception as exc:
        if limit.expired():
            error = TimeoutError(
                f"stage {handler.stage} took longer than {deadline:g} s on these records "
                "(TIDEGRAPH_RECORD_TIMEOUT_SECONDS)"
            )
            return [[handler.crashed(record, error, reason="timeout")] for record in records]
        log.exception(
            "stage=%s failed on %d records of %s:%d outside its error handling (a bug)",
            handler.stage, len(records), records[0].topic, records[0].partition,
        )  # fmt: skip
        return [[handler.crashed(record, exc, reason="internal_error")] for record in records]


# Where a hop record (``tidegraph.topics.records``) holds the episode, by the key of its payload.
_EPISODE_PATHS = (("extraction", "episode"),)


def _episode_in(value: bytes | None) -> tuple[Episode | None, RecordRef | None]:
    """The episode and origin a consumed record carries (the envelope itself on the input
    topic, or inside a hop record), so that its dead letter replays; (None, None) when it
    cannot be read."""
    try:
        data = jsontext.loads(value or b"")
        if not isinstance(data, dict):
            return None, None
        origin = RecordRef.model_validate(data["origin"]) if "origin" in data else None
        for path in _EPISODE_PATHS:
            node: Any = data
            for key in path:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict):
                return Episode.model_validate(node), origin
        return parse_episode(value or b""), None
    except Exception:
        return None, None


def _sealed_episode_bytes(
    episode: Episode, key: DataKey, *, fallback: bytes | None
) -> bytes | None:
    """A sealed episode as an envelope sealed again with its key, for a dead letter that
    replays onto the input topic and opens like the record it came as."""
    try:
        return jsontext.dumps(seal(episode.model_dump(mode="json"), key))
    except Exception:
        return fallback


def _episode_bytes(episode: Episode, *, fallback: bytes | None) -> bytes | None:
    """The episode as JSON for a dead letter, or ``fallback`` (the consumed bytes) when it
    cannot be serialised."""
    try:
        return jsontext.dumps(episode.model_dump(mode="json"))
    except Exception:
        return fallback
