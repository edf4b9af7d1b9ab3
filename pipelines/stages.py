"""One handler per stage: a consumed record in, the records to produce out.

Handlers are transport-agnostic (no Faust here) and never raise for a bad or failing record:
transient failures are retried (``pipelines.retry``), and a record that still fails, or fails
permanently, becomes a dead letter among the outputs. Every effect is idempotent, so a handler
may safely see the same record again (redelivery after a crash, a replay):

- extraction skips an episode whose processed marker (its Episodic node) exists before it
  asks the LLM; a mapped episode costs no LLM call, and resolution checks its marker instead;
- resolution skips a processed episode (the marker is read with its entity lookup, in one
  round trip) and MERGEs entities by deterministic uuid (a re-run matches what it wrote);
- temporal stamping is pure;
- the writer skips a processed episode, else writes everything in one transaction that also
  creates the marker (MERGE by deterministic uuid).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from pipelines.config import WorkerSettings
from pipelines.context import RecentEpisodes
from pipelines.retry import Attempted, RetryPolicy, with_retries
from pipelines.runtime import Runtime
from processors.extraction import Extraction, Extractor
from processors.failures import root_cause
from processors.pipeline import run_stage
from processors.resolution import Resolver, new_entity_uuid
from processors.temporal import Stamper
from processors.writer import FactWriter
from tidegraph.metrics import DEAD_LETTERS, END_TO_END_LATENCY, STAGE_EVENTS
from tidegraph.records.episode import Episode, parse_episode
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.graph import EntityLookup
from tidegraph.records.stages import ResolvedEpisode, StampedEpisode, WriteSummary
from tidegraph.records.times import utcnow
from topics.names import TopicNames
from topics.records import (
    MAX_RECORD_VALUE_BYTES,
    DeadLetter,
    ExtractedRecord,
    NewEntityRecord,
    RecordRef,
    ResolvedRecord,
    StampedRecord,
    decode,
    encode,
    encode_key,
    original_record,
    short_message,
)

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


@dataclass(frozen=True)
class Consumed:
    """A record as a stage consumed it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None

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


class StageHandler:
    """Common plumbing: retries, dead letters, decoding of hop records."""

    stage: str = "stage"

    def __init__(self, runtime: Runtime, names: TopicNames, worker: WorkerSettings) -> None:
        self.runtime = runtime
        self.store = runtime.store
        self.names = names
        self.worker = worker
        self.policy = RetryPolicy(
            max_attempts=worker.stage_max_attempts,
            backoff=worker.retry_backoff_seconds,
            backoff_max=worker.retry_backoff_max_seconds,
        )

    async def handle(self, record: Consumed) -> list[Emit]:
        raise NotImplementedError

    async def retried(self, call: Callable[[], Awaitable[Any]], episode: Episode) -> Attempted:
        return await with_retries(
            self.stage, call, self.policy, what=f"group={episode.group_id} episode={episode.id}"
        )

    def decode_hop(self, model: type[M], record: Consumed) -> M | Emit:
        """The hop record, or a dead letter when it cannot be read (a producer bug)."""
        try:
            return decode(model, record.value or b"")
        except (ValueError, ValidationError) as exc:
            return self.dead(
                record,
                reason="bad_hop_record",
                exc=exc,
                attempts=1,
                raw=record.value,
            )

    def failed(
        self, record: Consumed, outcome: Attempted, episode: Episode, origin: RecordRef
    ) -> Emit:
        assert outcome.error is not None and outcome.verdict is not None
        return self.dead(
            record,
            reason=outcome.verdict.reason,
            exc=root_cause(outcome.error),
            attempts=outcome.attempts,
            episode=episode,
            origin=origin,
        )

    def dead(
        self,
        record: Consumed,
        *,
        reason: str,
        exc: BaseException,
        attempts: int,
        stage: str | None = None,
        episode: Episode | None = None,
        origin: RecordRef | None = None,
        raw: bytes | None = None,
    ) -> Emit:
        stage = stage or self.stage
        if episode is not None:
            raw = _episode_bytes(episode, fallback=raw if raw is not None else record.value)
        body, encoding, truncated = original_record(raw)
        letter = DeadLetter(
            stage=stage,
            reason=reason,
            error_class=type(exc).__name__,
            message=short_message(str(exc)),
            attempts=attempts,
            failed_at=utcnow(),
            group_id=episode.group_id if episode else None,
            episode_id=episode.id if episode else None,
            episode_uuid=episode.uuid if episode else None,
            origin=origin,
            consumed=record.ref,
            record=body,
            record_encoding=encoding,  # type: ignore[arg-type]
            truncated=truncated,
        )
        DEAD_LETTERS.labels(stage, reason).inc()
        STAGE_EVENTS.labels(stage, "dead_lettered").inc()
        log.warning(
            "dead_letter stage=%s reason=%s group=%s episode=%s attempts=%d at=%s:%d:%d "
            "error=%s: %s",
            stage, reason, letter.group_id, letter.episode_id, attempts, record.topic,
            record.partition, record.offset, letter.error_class, letter.message[:300],
        )  # fmt: skip
        key = encode_key(episode.group_id) if episode else record.key
        return Emit(self.names.dlq, key, encode(letter))

    def crashed(self, record: Consumed, exc: BaseException, *, reason: str) -> Emit:
        """The dead letter of a record whose handling raised (``internal_error``: a handler
        broke its contract) or ran out of its time budget (``timeout``): built from the
        consumed bytes alone, so that it cannot fail the way the handler did."""
        episode, origin = _episode_in(record.value)
        return self.dead(
            record,
            reason=reason,
            exc=exc,
            attempts=1,
            episode=episode,
            origin=origin or record.ref,  # a hop record's origin, or this input record
            raw=record.value,
        )

    def emit(
        self,
        topic: str,
        value: BaseModel,
        record: Consumed,
        episode: Episode,
        origin: RecordRef,
    ) -> Emit:
        """The hop record to produce, or a dead letter when it is too large for Kafka."""
        data = encode(value)
        if len(data) > MAX_RECORD_VALUE_BYTES:
            error = ValueError(
                f"the {topic} record of this episode would be {len(data)} bytes; Kafka takes "
                f"at most {MAX_RECORD_VALUE_BYTES}"
            )
            return self.dead(
                record, reason="too_large", exc=error, attempts=1, episode=episode, origin=origin
            )
        return Emit(topic, encode_key(episode.group_id), data)


class ExtractionHandler(StageHandler):
    """episodes -> extracted: validate the envelope, skip processed episodes, extract."""

    stage = "extraction"

    def __init__(self, runtime: Runtime, names: TopicNames, worker: WorkerSettings) -> None:
        super().__init__(runtime, names, worker)
        limit = runtime.settings.context_episodes
        self.context = RecentEpisodes(runtime.store, per_group=max(16, 4 * limit))
        self.extractor = Extractor(
            mappings=runtime.mappings,
            llm=runtime.llm,
            context=self.context,
            context_episodes=limit,
        )

    def invalid(self, record: Consumed, reason: str, exc: Exception) -> Emit:
        return self.dead(
            record,
            stage="validation",
            reason=reason,
            exc=exc,
            attempts=1,
            origin=record.ref,
            raw=record.value,
        )

    async def handle(self, record: Consumed) -> list[Emit]:
        origin = record.ref
        raw = record.value or b""
        if len(raw) > self.worker.max_record_bytes:
            error = ValueError(
                f"record is {len(raw)} bytes; the limit is {self.worker.max_record_bytes} "
                "(TIDEGRAPH_MAX_RECORD_BYTES)"
            )
            return [self.invalid(record, "oversized", error)]
        try:
            episode = parse_episode(raw)
        except InvalidEpisode as exc:
            return [self.invalid(record, exc.reason, exc)]
        if record.key != encode_key(episode.group_id):
            error = ValueError(
                f"record key {record.key!r} is not the episode's group_id "
                f"{episode.group_id!r}: per-group order needs key = group_id "
                "(`tidegraph dlq replay` re-sends it with the right key)"
            )
            return [self.invalid(record, "key_mismatch", error)]

        async def attempt() -> Extraction | None:
            # A mapped episode is pure computation: its processed marker is read by
            # resolution's lookup, in the round trip that stage makes anyway. An episode for
            # the LLM is checked first, so that a replay costs no LLM call.
            # Off the event loop: templates over a record of up to a megabyte.
            mapped = await asyncio.to_thread(self.extractor.mapped, episode)
            if mapped is not None:
                return await run_stage(self.stage, lambda: _ready(mapped))
            if await self.store.episode_processed(
                episode.group_id, episode.uuid, episode.content_hash
            ):
                return None
            return await run_stage(self.stage, lambda: self.extractor.run(episode))

        outcome = await self.retried(attempt, episode)
        if not outcome.ok:
            return [self.failed(record, outcome, episode, origin)]
        if outcome.value is None:
            STAGE_EVENTS.labels(self.stage, "skipped").inc()
            return []
        self.context.remember(episode)
        out = ExtractedRecord(origin=origin, extraction=outcome.value)
        return [self.emit(self.names.extracted, out, record, episode, origin)]


class ResolutionHandler(StageHandler):
    """extracted -> resolved: entities resolved and written (so later episodes of the group
    see them even while this one is still in flight)."""

    stage = "resolution"

    def __init__(self, runtime: Runtime, names: TopicNames, worker: WorkerSettings) -> None:
        super().__init__(runtime, names, worker)
        self.resolver: Resolver = runtime.pipeline.resolver

    async def handle(self, record: Consumed) -> list[Emit]:
        hop = self.decode_hop(ExtractedRecord, record)
        if isinstance(hop, Emit):
            return [hop]
        extraction = hop.extraction
        episode = extraction.episode
        group = episode.group_id
        # Entities resolution would create: those its first lookup (before it wrote anything)
        # did not find. Taken from the first attempt, so that a retry after a write whose
        # answer was lost still reports them as created by this episode.
        candidates = {new_entity_uuid(group, d.name, d.key) for d in extraction.entities}
        first: list[EntityLookup] = []

        def remember(lookup: EntityLookup) -> None:
            if not first:
                first.append(lookup)

        outcome = await self.retried(
            lambda: run_stage(
                self.stage,
                lambda: self.resolver.run(extraction, on_lookup=remember, skip_processed=True),
                skipped=lambda resolved: resolved is None,
            ),
            episode,
        )
        if not outcome.ok:
            return [self.failed(record, outcome, episode, hop.origin)]
        if outcome.value is None:  # already processed (a redelivery or a replay)
            return []
        resolved: ResolvedEpisode = outcome.value
        before = {e.uuid for e in (*first[0].by_key, *first[0].by_name)} if first else set()
        created = [
            u for u in dict.fromkeys(resolved.entity_uuids) if u in candidates and u not in before
        ]
        out = ResolvedRecord(origin=hop.origin, resolved=resolved, created_entities=created)
        return [self.emit(self.names.resolved, out, record, episode, hop.origin)]


class TemporalHandler(StageHandler):
    """resolved -> stamped: validity intervals on T (pure)."""

    stage = "temporal"

    def __init__(self, runtime: Runtime, names: TopicNames, worker: WorkerSettings) -> None:
        super().__init__(runtime, names, worker)
        self.stamper: Stamper = runtime.pipeline.stamper

    async def handle(self, record: Consumed) -> list[Emit]:
        hop = self.decode_hop(ResolvedRecord, record)
        if isinstance(hop, Emit):
            return [hop]
        episode = hop.resolved.extraction.episode
        outcome = await self.retried(
            lambda: run_stage(self.stage, lambda: self.stamper.run(hop.resolved)), episode
        )
        if not outcome.ok:
            return [self.failed(record, outcome, episode, hop.origin)]
        stamped: StampedEpisode = outcome.value
        out = StampedRecord(
            origin=hop.origin, stamped=stamped, created_entities=hop.created_entities
        )
        return [self.emit(self.names.stamped, out, record, episode, hop.origin)]


class WriteHandler(StageHandler):
    """stamped -> graph: invalidation + one idempotent write; then the new-entity events."""

    stage = "invalidation"

    def __init__(self, runtime: Runtime, names: TopicNames, worker: WorkerSettings) -> None:
        super().__init__(runtime, names, worker)
        self.writer: FactWriter = runtime.pipeline.writer

    async def handle(self, record: Consumed) -> list[Emit]:
        hop = self.decode_hop(StampedRecord, record)
        if isinstance(hop, Emit):
            return [hop]
        stamped = hop.stamped
        episode = stamped.episode

        # A mapped episode costs no LLM call to write: its write transaction's own marker check
        # is enough, and saves a round trip. Otherwise read the marker first, so that a replay
        # does not pay for fact judgements that would be thrown away.
        check_first = not stamped.mapped and self.writer.llm is not None

        async def attempt() -> WriteSummary | None:
            if check_first and await self.store.episode_processed(
                episode.group_id, episode.uuid, episode.content_hash
            ):
                return None
            # The writer need not read the marker (again): its transaction skips an episode
            # that is already processed (a replay, or a zombie worker's race).
            return await run_stage(
                self.stage,
                lambda: self.writer.run(stamped, unprocessed=True),
                skipped=lambda summary: summary.skipped,
            )

        outcome = await self.retried(attempt, episode)
        if not outcome.ok:
            return [self.failed(record, outcome, episode, hop.origin)]
        summary: WriteSummary | None = outcome.value
        if summary is None:  # found processed before the stage ran
            STAGE_EVENTS.labels(self.stage, "skipped").inc()
        elif not summary.skipped and hop.origin.timestamp_ms is not None:
            END_TO_END_LATENCY.observe(max(0.0, time.time() - hop.origin.timestamp_ms / 1000))
        # Also re-sent for a skipped (already written) episode: the events of a write whose
        # worker died before producing them are not lost; consumers treat them idempotently.
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
            for uuid in hop.created_entities
        ]


async def _ready(value: T) -> T:
    return value


# Where a hop record (topics.records) holds the episode, by the key of its payload.
_EPISODE_PATHS = (
    ("extraction", "episode"),
    ("resolved", "extraction", "episode"),
    ("stamped", "episode"),
)


def _episode_in(value: bytes | None) -> tuple[Episode | None, RecordRef | None]:
    """The episode and origin a consumed record carries (the envelope itself on the input
    topic, or inside a hop record), so that its dead letter replays; (None, None) when it
    cannot be read."""
    try:
        data = orjson.loads(value or b"")
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


def _episode_bytes(episode: Episode, *, fallback: bytes | None) -> bytes | None:
    """The episode as JSON for a dead letter, or ``fallback`` (the consumed bytes) when it
    cannot be serialised."""
    try:
        return orjson.dumps(episode.model_dump(mode="json"))
    except Exception:
        return fallback


HANDLERS: tuple[type[StageHandler], ...] = (
    ExtractionHandler,
    ResolutionHandler,
    TemporalHandler,
    WriteHandler,
)
