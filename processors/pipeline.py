"""The stages chained in one process: per-group order, groups in parallel.

The Kafka topology runs the same stage objects, one per topic hop; this module is the
in-process runner used by ``tidegraph ingest`` and ``tidegraph demo``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from processors.extraction import Extractor, StructuredLLM
from processors.failures import StageError, classify
from processors.mapping import MappingSet
from processors.resolution import Resolution, Resolver
from processors.temporal import Stamper
from processors.writer import FactWriter, prefetched_candidates
from tidegraph.embed.base import Embedder
from tidegraph.embed.cache import CachingEmbedder
from tidegraph.metrics import IN_FLIGHT, STAGE_EVENTS, STAGE_LATENCY
from tidegraph.records.episode import Episode, parse_episode
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.graph import EntityLookup, FactRecord
from tidegraph.records.stages import Extraction, StampedEpisode, WriteSummary
from tidegraph.store.base import GraphStore

T = TypeVar("T")


@dataclass
class Failure:
    """A record the pipeline could not process, with why (the dead-letter content)."""

    stage: str
    error_class: str
    message: str
    record: Any  # the original record (raw line or episode JSON)
    group_id: str | None = None
    episode_id: str | None = None
    attempts: int = 1
    reason: str = "error"  # one of processors.failures.REASONS
    line: int | None = None  # the line of the input file, when read from one


async def run_stage(
    stage: str,
    call: Callable[[], Awaitable[T]],
    *,
    skipped: Callable[[T], bool] | None = None,
) -> T:
    """Run one stage call with its metrics; wrap failures in StageError. A result for which
    ``skipped`` is true (an episode found already processed) counts as skipped, not ok."""
    started = time.perf_counter()
    IN_FLIGHT.labels(stage).inc()
    try:
        result = await call()
    except Exception as exc:
        STAGE_EVENTS.labels(stage, "error").inc()
        raise StageError(stage, exc) from exc
    finally:
        IN_FLIGHT.labels(stage).dec()
        STAGE_LATENCY.labels(stage).observe(time.perf_counter() - started)
    outcome = "skipped" if skipped is not None and skipped(result) else "ok"
    STAGE_EVENTS.labels(stage, outcome).inc()
    return result


class EpisodePipeline:
    """extraction -> resolution -> temporal -> invalidation + write, for one episode."""

    def __init__(
        self,
        *,
        store: GraphStore,
        embedder: Embedder,
        llm: StructuredLLM | None,
        mappings: MappingSet | None,
        context_episodes: int = 4,
    ) -> None:
        self.store = store
        # Fact texts and names recur across a group's episodes: each is embedded once.
        embedder = CachingEmbedder(embedder)
        self.extractor = Extractor(
            mappings=mappings, llm=llm, context=store, context_episodes=context_episodes
        )
        self.resolver = Resolver(store=store, embedder=embedder, llm=llm)
        self.stamper = Stamper()
        self.writer = FactWriter(store=store, embedder=embedder, llm=llm)

    async def process(self, episode: Episode) -> WriteSummary:
        """One episode through every stage; entities are written with the episode, in one
        transaction (process() runs one episode of a group at a time, so no later episode of
        the group needs them earlier)."""
        # Off the event loop: templates over a record of up to a megabyte.
        extraction = await asyncio.to_thread(self.extractor.mapped, episode)
        lookup: EntityLookup | None = None
        if extraction is None:
            if await ahead_of(
                "extraction",
                lambda: self.store.episode_processed(
                    episode.group_id, episode.uuid, episode.content_hash
                ),
            ):
                return self._skipped(episode)
            extraction = await run_stage("extraction", lambda: self.extractor.run(episode))
        else:
            # A mapped extraction needs no I/O: the processed marker and the stored facts the
            # new ones can merge with or close are read with the resolution lookup, in one
            # round trip.
            relations = sorted({f.relation for f in extraction.facts})
            lookup = await ahead_of(
                "resolution",
                lambda: self.resolver.lookup(
                    extraction, episode_uuid=episode.uuid, relations=relations
                ),
            )
            if lookup.processed:
                return self._skipped(episode)
            await run_stage("extraction", lambda: _ready(extraction))
        resolution = await run_stage("resolution", lambda: self._resolve(extraction, lookup))
        stamped = await run_stage("temporal", lambda: self.stamper.run(resolution.resolved))
        candidates = _prefetched(lookup, resolution, stamped)
        # The marker checked above still holds (one episode of a group at a time), and the
        # write re-checks it in its own transaction.
        return await run_stage(
            "invalidation",
            lambda: self.writer.run(
                stamped, unprocessed=True, entities=resolution.writes, candidates=candidates
            ),
        )

    async def _resolve(self, extraction: Extraction, lookup: EntityLookup | None) -> Resolution:
        if lookup is None:
            lookup = await self.resolver.lookup(extraction)
        return await self.resolver.resolve(extraction, lookup)

    @staticmethod
    def _skipped(episode: Episode) -> WriteSummary:
        STAGE_EVENTS.labels("extraction", "skipped").inc()
        return WriteSummary(
            group_id=episode.group_id,
            episode_uuid=episode.uuid,
            episode_id=episode.id,
            skipped=True,
        )


async def _ready(value: T) -> T:
    return value


async def ahead_of(stage: str, call: Callable[[], Awaitable[T]]) -> T:
    """A read made for ``stage`` before it runs (the processed marker, resolution's lookup):
    its failure is the stage's (an id reused for other content fails at resolution), as in
    the worker, whose stage handlers make the same reads (pipelines/stages.py)."""
    try:
        return await call()
    except Exception as exc:
        STAGE_EVENTS.labels(stage, "error").inc()
        raise StageError(stage, exc) from exc


def _prefetched(
    lookup: EntityLookup | None, resolution: Resolution, stamped: StampedEpisode
) -> list[FactRecord] | None:
    """The writer's candidate facts out of the lookup's, or None (the writer reads them)."""
    if lookup is None or lookup.facts is None:
        return None
    found = {e.uuid for e in [*lookup.by_key, *lookup.by_name]}
    created = {e.uuid for e in resolution.writes} - found  # new entities: no stored facts
    return prefetched_candidates(stamped.facts, lookup.facts, found | created)


@dataclass
class IngestReport:
    episodes: int = 0
    skipped: int = 0
    entities_new: int = 0
    facts_new: int = 0
    facts_merged: int = 0
    facts_closed: int = 0
    facts_born_closed: int = 0
    llm_calls: int = 0
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)

    def add(self, summary: WriteSummary) -> None:
        self.episodes += 1
        if summary.skipped:
            self.skipped += 1
            return
        self.entities_new += summary.entities_new
        self.facts_new += summary.facts_new
        self.facts_merged += summary.facts_merged
        self.facts_closed += summary.facts_closed
        self.facts_born_closed += summary.facts_born_closed
        self.llm_calls += summary.llm_calls

    def line(self) -> str:
        return (
            f"{self.episodes} episodes ({self.skipped} already processed), "
            f"{self.entities_new} new entities, "
            f"{self.facts_new} new facts, {self.facts_merged} merged, "
            f"{self.facts_closed + self.facts_born_closed} invalidations "
            f"({self.facts_born_closed} born closed), {self.llm_calls} LLM calls, "
            f"{len(self.failures)} failed, {self.seconds:.1f}s"
        )


def read_jsonl(lines: Iterable[bytes | str]) -> tuple[list[Episode], list[Failure]]:
    episodes: list[Episode] = []
    failures: list[Failure] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            episodes.append(parse_episode(line))
        except InvalidEpisode as exc:
            text = line.decode(errors="replace") if isinstance(line, bytes) else line
            failures.append(
                Failure(
                    "validation",
                    type(exc).__name__,
                    f"line {n}: {exc}",
                    text.strip(),
                    reason=exc.reason,
                    line=n,
                )
            )
    return episodes, failures


async def ingest(
    pipeline: EpisodePipeline,
    episodes: list[Episode],
    *,
    concurrency: int = 8,
    on_done: Callable[[WriteSummary | None], None] | None = None,
    record_timeout: float = 600.0,
) -> IngestReport:
    """Process episodes in order within each group, up to ``concurrency`` groups at once.
    A failing episode is recorded with its dead-letter reason and its group goes on with the
    next one; an episode that takes longer than ``record_timeout`` seconds fails as
    ``timeout``."""
    report = IngestReport()
    started = time.perf_counter()
    by_group: dict[str, list[Episode]] = {}
    for episode in episodes:
        by_group.setdefault(episode.group_id, []).append(episode)
    gate = asyncio.Semaphore(concurrency)

    async def run_group(items: list[Episode]) -> None:
        async with gate:
            for episode in items:
                budget = asyncio.timeout(record_timeout)
                try:
                    async with budget:
                        summary = await pipeline.process(episode)
                except Exception as exc:
                    # A stage's error, or one before any stage (the processed-marker read): the
                    # episode fails, its group goes on, the other groups are not cancelled.
                    timed_out = record_timeout if budget.expired() else None
                    report.failures.append(_failure(episode, exc, timed_out))
                    if on_done:
                        on_done(None)
                    continue
                report.add(summary)
                if on_done:
                    on_done(summary)

    await asyncio.gather(*(run_group(items) for items in by_group.values()))
    report.seconds = time.perf_counter() - started
    return report


def _failure(episode: Episode, exc: Exception, timed_out: float | None) -> Failure:
    """The failure of one episode; ``timed_out``: the budget it ran out of, if it did."""
    stage, cause = (exc.stage, exc.cause) if isinstance(exc, StageError) else ("ingest", exc)
    if timed_out is not None:
        reason, message = "timeout", f"took longer than {timed_out:g} s (record timeout)"
    else:
        reason, message = classify(cause).reason, str(cause)
    return Failure(
        stage=stage,
        error_class=type(cause).__name__,
        message=message,
        record=episode.model_dump(mode="json"),
        group_id=episode.group_id,
        episode_id=episode.id,
        reason=reason,
    )
