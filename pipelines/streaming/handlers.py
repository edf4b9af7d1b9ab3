"""Handlers: a consumed record in, the records to produce out (no Faust here).

``HopHandler`` runs the stages of one hop of the chain (``tidegraph.pipelines.chain``) on a consumed
record: it reads the hop's input (the episode envelope, or the extraction hop's record), runs the
hop's steps through ``tidegraph.pipelines.step_runner.run_steps`` (the same runner as in-process),
and turns the result into the hop's output (the extraction record, or the new-entity events after
the write) or into a dead letter. Handlers never raise for a bad or failing record. Every effect is
idempotent, so a handler may safely see the same record again (a redelivery after a crash, a
replay): each step skips an already processed episode where it costs least (README "At-least-once
with idempotent effects").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from tidegraph.metrics import DEAD_LETTERS, END_TO_END_LATENCY, STAGE_EVENTS, STAGE_LATENCY
from tidegraph.pipelines.batches import (
    DEFAULT_BATCH_EPISODES,
    DEFAULT_EXTRACT_AHEAD,
    process_extractions,
)
from tidegraph.pipelines.chain import Hop
from tidegraph.pipelines.retry import RetryPolicy
from tidegraph.pipelines.step_runner import ChainResult, run_steps
from tidegraph.pipelines.streaming.config import WorkerSettings
from tidegraph.processors.extraction import (
    ExtractionStep,
    JointExtraction,
    Prepared,
    PreparedExtraction,
    prepared_steps,
)
from tidegraph.processors.steps import Components, Step
from tidegraph.records import jsontext
from tidegraph.records.episode import Episode, parse_episode
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.stages import Extraction, WriteSummary
from tidegraph.records.times import utcnow
from tidegraph.topics.names import TopicNames
from tidegraph.topics.records import (
    MAX_RECORD_VALUE_BYTES,
    DeadLetter,
    ExtractedRecord,
    NewEntityRecord,
    RecordRef,
    decode,
    encode,
    encode_key,
    original_record,
    short_message,
)

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


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


class RecordHandler:
    """What every handler shares: its retry policy and time budget, and dead letters."""

    stage: str = "stage"

    def __init__(self, names: TopicNames, worker: WorkerSettings, record_timeout: float) -> None:
        self.names = names
        self.worker = worker
        self.record_timeout = record_timeout
        self.steps: list[Step[Any, Any]] = []  # the chain's steps this handler runs, if any
        self.policy = RetryPolicy(
            max_attempts=worker.stage_max_attempts,
            backoff=worker.retry_backoff_seconds,
            backoff_max=worker.retry_backoff_max_seconds,
        )

    @property
    def deadline(self) -> float:
        """The longest a record may take in this handler, all its steps included: a backstop
        behind the steps' own budgets (``tidegraph.pipelines.step_runner.run_step``)."""
        return self.record_timeout * (len(self.steps) + 1)

    async def handle(self, record: Consumed) -> list[Emit]:
        raise NotImplementedError

    @property
    def groups_records(self) -> bool:
        """Whether the worker hands this handler a group's records of a micro-batch together
        (``handle_group``) rather than one at a time (``handle``)."""
        return False

    async def handle_group(self, records: Sequence[Consumed]) -> list[list[Emit]]:
        """The outputs of each of ``records`` (one group's, in order); handlers whose
        ``groups_records`` is true define it."""
        raise NotImplementedError

    @property
    def group_take(self) -> int:
        """The most records of one group ``handle_group`` is given at once: the group's
        records waiting, up to this (``tidegraph.pipelines.streaming.lanes.KeyedBacklog``)."""
        return self.worker.batch_size

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
            record_encoding=encoding,
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


@dataclass(frozen=True)
class Taken:
    """A hop's input as read from a consumed record."""

    item: Any  # what the hop's first step takes
    episode: Episode
    origin: RecordRef  # the episode's record on the input topic


class HopHandler(RecordHandler):
    """The stages of one hop on one consumed record."""

    def __init__(
        self,
        hop: Hop,
        steps: Sequence[Step[Any, Any]],
        names: TopicNames,
        worker: WorkerSettings,
        record_timeout: float,
        batch: Components | None = None,
    ) -> None:
        """``batch``: the components a micro-batch of one group's extractions is processed
        with as one unit (``handle_group``); None: one record at a time."""
        super().__init__(names, worker, record_timeout)
        self.batch = batch if hop.consumes == "extracted" else None
        self.hop = hop
        self.stage = hop.name
        self.steps = list(steps)
        # The extraction hop with an LLM: a group's LLM extractions run ahead of each other.
        first = self.steps[0] if self.steps else None
        self.ahead = (
            first
            if hop.consumes == "episodes" and isinstance(first, ExtractionStep) and first.llm
            else None
        )
        # The extraction hop maps the records a declared mapping extracts itself
        # (``_map_records``).
        self.mapper = (
            first if hop.consumes == "episodes" and isinstance(first, ExtractionStep) else None
        )
        self._read: Callable[[Consumed], Taken | Emit] = getattr(self, READERS[hop.consumes])
        self._write: Callable[[Consumed, Taken, ChainResult], list[Emit]] = getattr(
            self, WRITERS[hop.produces]
        )

    async def handle(self, record: Consumed) -> list[Emit]:
        taken = self._read(record)
        if isinstance(taken, Emit):
            return [taken]
        episode = taken.episode
        result = await run_steps(
            self.steps,
            taken.item,
            policy=self.policy,
            budget=self.record_timeout,
            what=f"group={episode.group_id} episode={episode.id}",
        )
        return self._outputs(record, taken, result)

    @property
    def groups_records(self) -> bool:
        """The worker hands a hop a group's waiting records together (``handle_group``): the
        write hop batches them, the extraction hop extracts ahead with an LLM, and every hop
        produces a job's outputs together (one wait for Kafka's acknowledgements, not one per
        record)."""
        return True

    @property
    def group_take(self) -> int:
        if self.ahead is not None:  # what it extracts at once: outputs wait for the slowest
            return DEFAULT_EXTRACT_AHEAD * self.ahead.episodes_per_call
        if self.batch is not None:  # one unit, as in-process
            return min(super().group_take, DEFAULT_BATCH_EPISODES)
        return super().group_take

    def _outputs(self, record: Consumed, taken: Taken, result: ChainResult) -> list[Emit]:
        episode = taken.episode
        if result.failure is not None:
            failure = result.failure
            return [
                self.dead(
                    record,
                    stage=failure.stage,
                    reason=failure.reason,
                    exc=failure.error,
                    attempts=failure.attempts,
                    episode=episode,
                    origin=taken.origin,
                )
            ]
        return self._write(record, taken, result)

    async def handle_group(self, records: Sequence[Consumed]) -> list[list[Emit]]:
        """The outputs of each of ``records`` (one group's, in order): runs of mapped
        extractions, and runs of LLM-extracted ones, each as one unit
        (``tidegraph.pipelines.batches.process_extractions``), the record a batch stops at one at a
        time through ``handle``."""
        if self.ahead is not None:
            return await self._extract_ahead(self.ahead, records)
        if self.mapper is not None:
            return await self._map_records(self.mapper, records)
        outputs: list[list[Emit]] = []
        reads: dict[int, Taken | Emit] = {}  # each record read once (a dead letter counts)

        def read(n: int) -> Taken | Emit:
            if n not in reads:
                reads[n] = self._read(records[n])
            return reads[n]

        i = 0
        while i < len(records):
            run: list[Taken] = []
            for n in range(i, len(records)) if self.batch is not None else ():
                taken = read(n)
                if isinstance(taken, Emit) or (run and taken.item.mapped != run[0].item.mapped):
                    break
                run.append(taken)
            done = await self._batched([t.item for t in run]) if run else []
            for n, (taken, summary) in enumerate(zip(run, done, strict=False), start=i):
                outputs.append(self._write(records[n], taken, ChainResult(value=summary)))
            i += len(done)
            if done:
                continue  # the record after them starts the next run
            unreadable = reads.get(i)
            if isinstance(unreadable, Emit):
                outputs.append([unreadable])
            else:
                outputs.append(await handled(self, records[i], self.deadline))
            i += 1
        return outputs

    async def _map_records(
        self, mapper: ExtractionStep, records: Sequence[Consumed]
    ) -> list[list[Emit]]:
        """The extraction hop without an LLM: each record as ``_mapped_outputs``, or through
        ``handled``."""
        outputs: list[list[Emit]] = []
        for record in records:
            taken = self._read(record)
            if isinstance(taken, Emit):
                outputs.append([taken])
                continue
            mapped = await self._mapped_outputs(mapper, record, taken)
            if mapped is None:
                mapped = await handled(self, record, self.deadline)
            outputs.append(mapped)
        return outputs

    async def _mapped_outputs(
        self, mapper: ExtractionStep, record: Consumed, taken: Taken
    ) -> list[Emit] | None:
        """The outputs of a record a declared mapping extracts, mapped here: the mapping is
        pure and quick, with nothing to retry or time out, so it goes without ``handled``'s
        budget and retries (a fifth of a worker's time at full load went to them). None for
        any other record, and for one whose mapping fails: it goes through ``handled`` as
        usual (its LLM extraction, or its dead letter and reason)."""
        started = time.perf_counter()
        try:
            extraction = await mapper.map_record(taken.episode)
            if extraction is None:
                return None
            outputs = self._write(record, taken, ChainResult(value=extraction))
        except Exception:  # noqa: BLE001 - ``handled`` meets it again and gives its reason
            return None
        STAGE_EVENTS.labels(mapper.stage, "ok").inc()
        STAGE_LATENCY.labels(mapper.stage).observe(time.perf_counter() - started)
        return outputs

    async def _extract_ahead(
        self, step: ExtractionStep, records: Sequence[Consumed]
    ) -> list[list[Emit]]:
        """The extraction hop on one group's records: each prepared in order (processed
        check and context, ``ExtractionStep.prepare``), consecutive ones asked in one LLM
        call (up to ``episodes_per_call``), their calls running beside the next ones' (at
        most ``DEFAULT_EXTRACT_AHEAD`` calls' worth of records at once); records without an
        LLM call run in their place. Outputs in record order, so the write hop sees the
        group's order."""
        per_call = step.episodes_per_call
        slots = asyncio.Semaphore(DEFAULT_EXTRACT_AHEAD * per_call)
        pending: list[asyncio.Task[list[Emit]] | list[Emit] | None] = []
        chunk: list[tuple[int, Consumed, Taken, Prepared]] = []  # prepared, not started
        joints: list[JointExtraction] = []

        def start_chunk() -> None:
            ready = [prepared for *_, prepared in chunk]
            steps, joint = prepared_steps(step, ready, self.record_timeout)
            if joint is not None:
                joints.append(joint)
            for (at, record, taken, _), prepared_step in zip(chunk, steps, strict=True):
                task = asyncio.create_task(self._extract_prepared(record, taken, prepared_step))
                task.add_done_callback(lambda _: slots.release())
                pending[at] = task
            chunk.clear()

        try:
            for record in records:
                taken = self._read(record)
                if isinstance(taken, Emit):
                    pending.append([taken])
                    continue
                prepared = None
                if step.extracts_by_llm(taken.episode):
                    try:
                        prepared = await step.prepare(taken.episode)
                    except Exception:
                        prepared = None  # alone, in its place: it fails (or not) as it would
                if prepared is None:
                    start_chunk()
                    mapped = await self._mapped_outputs(step, record, taken)
                    if mapped is None:
                        mapped = await handled(self, record, self.deadline)
                    pending.append(mapped)
                    continue
                await slots.acquire()
                chunk.append((len(pending), record, taken, prepared))
                pending.append(None)
                if len(chunk) == per_call:
                    start_chunk()
            start_chunk()
            outputs = []
            for p in pending:
                assert p is not None
                outputs.append(p if isinstance(p, list) else await p)
            return outputs
        finally:
            for p in pending:
                if isinstance(p, asyncio.Task):
                    p.cancel()
            for joint in joints:
                joint.cancel()

    async def _extract_prepared(
        self, record: Consumed, taken: Taken, step: PreparedExtraction
    ) -> list[Emit]:
        """``handled`` for a prepared extraction."""
        episode = taken.episode

        async def extract() -> list[Emit]:
            result = await run_steps(
                [step],
                taken.item,
                policy=self.policy,
                budget=self.record_timeout,
                what=f"group={episode.group_id} episode={episode.id}",
            )
            return self._outputs(record, taken, result)

        return await within_budget(self, record, self.deadline, extract)

    async def _batched(self, extractions: list[Extraction]) -> list[WriteSummary]:
        assert self.batch is not None
        try:
            async with asyncio.timeout(self.deadline):
                return await process_extractions(self.batch, extractions)
        except TimeoutError:
            # Whatever it committed is found processed one at a time (idempotent writes).
            log.warning("a batch of %d records ran out of time; one at a time", len(extractions))
            return []

    # ---- inputs
    def _read_episode(self, record: Consumed) -> Taken | Emit:
        """The input topic: an envelope as produced, checked (size, validity, key)."""
        raw = record.value or b""
        if len(raw) > self.worker.max_record_bytes:
            error = ValueError(
                f"record is {len(raw)} bytes; the limit is {self.worker.max_record_bytes} "
                "(TIDEGRAPH_MAX_RECORD_BYTES)"
            )
            return self._invalid(record, "oversized", error)
        try:
            episode = parse_episode(raw)
        except InvalidEpisode as exc:
            return self._invalid(record, exc.reason, exc)
        if record.key != encode_key(episode.group_id):
            error = ValueError(
                f"record key {record.key!r} is not the episode's group_id "
                f"{episode.group_id!r}: per-group order needs key = group_id "
                "(`tidegraph dlq replay` re-sends it with the right key)"
            )
            return self._invalid(record, "key_mismatch", error)
        return Taken(episode, episode, record.ref)

    def _read_extracted(self, record: Consumed) -> Taken | Emit:
        hop = self.decode_hop(ExtractedRecord, record)
        if isinstance(hop, Emit):
            return hop
        return Taken(hop.extraction, hop.extraction.episode, hop.origin)

    def _invalid(self, record: Consumed, reason: str, exc: Exception) -> Emit:
        return self.dead(
            record,
            stage="validation",
            reason=reason,
            exc=exc,
            attempts=1,
            origin=record.ref,
            raw=record.value,
        )

    # ---- outputs
    def _write_extracted(self, record: Consumed, taken: Taken, result: ChainResult) -> list[Emit]:
        if result.processed is not None:
            return []  # already in the graph: nothing to hand on
        extraction: Extraction = result.value
        out = ExtractedRecord(origin=taken.origin, extraction=extraction)
        return [self.emit(self.names.extracted, out, record, taken.episode, taken.origin)]

    def _write_new_entities(
        self, record: Consumed, taken: Taken, result: ChainResult
    ) -> list[Emit]:
        """The episode's new-entity events, after its write committed. Also sent again for
        an episode found already written (a worker that died between the write and the send
        loses none); consumers treat them idempotently."""
        if result.processed is not None:
            created = result.processed.created_entities
        else:
            summary: WriteSummary = result.value
            created = summary.created_entities
            if not summary.skipped and taken.origin.timestamp_ms is not None:
                END_TO_END_LATENCY.observe(max(0.0, time.time() - taken.origin.timestamp_ms / 1000))
        episode = taken.episode
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


# How a hop reads the topic it consumes and what it writes to the topic it produces (the
# short names of tidegraph.pipelines.chain); tests check that every hop of the chain has both.
READERS = {"episodes": "_read_episode", "extracted": "_read_extracted"}
WRITERS: dict[str | None, str] = {
    "extracted": "_write_extracted",
    "entities.new": "_write_new_entities",
}


# Where a hop record (tidegraph.topics.records) holds the episode, by the key of its payload.
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


def _episode_bytes(episode: Episode, *, fallback: bytes | None) -> bytes | None:
    """The episode as JSON for a dead letter, or ``fallback`` (the consumed bytes) when it
    cannot be serialised."""
    try:
        return jsontext.dumps(episode.model_dump(mode="json"))
    except Exception:
        return fallback


async def handled(handler: RecordHandler, record: Consumed, budget: float) -> list[Emit]:
    """The handler's outputs for one record, within its time budget (``within_budget``)."""
    return await within_budget(handler, record, budget, lambda: handler.handle(record))


async def within_budget(
    handler: RecordHandler,
    record: Consumed,
    budget: float,
    work: Callable[[], Awaitable[list[Emit]]],
) -> list[Emit]:
    """``work``'s outputs for ``record``. Handlers turn record failures into dead letters
    themselves; whatever still escapes them (a bug), or a record that takes longer than
    ``budget`` seconds, becomes a dead letter here too: a record never stops the worker or
    holds its group for longer than the budget."""
    limit = asyncio.timeout(budget)
    try:
        async with limit:
            return await work()
    except Exception as exc:
        if limit.expired():
            error = TimeoutError(
                f"stage {handler.stage} took longer than {budget:g} s on this record "
                "(TIDEGRAPH_RECORD_TIMEOUT_SECONDS)"
            )
            return [handler.crashed(record, error, reason="timeout")]
        log.exception(
            "stage=%s failed on %s:%d:%d outside its error handling (a bug)",
            handler.stage, record.topic, record.partition, record.offset,
        )  # fmt: skip
        return [handler.crashed(record, exc, reason="internal_error")]
