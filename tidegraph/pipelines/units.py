"""A unit: consecutive extractions of one group resolved, stamped, invalidated and written
together (docs: "Batch-native stages").

The chain's own steps run on each episode in order, as one at a time would, against a
``BatchView`` instead of the store: one read for the whole unit, each episode seeing the
earlier ones' effects in memory, and one ``write_episodes`` call at the end (one transaction on
Neo4j). A unit of one episode is the same path. ``UnitWriter.attempt`` makes one attempt and
answers, as a value, the outcomes of the episodes it committed (a prefix of the unit) and where
and why it stopped before the others: the runner (``tidegraph.pipelines.runner``) decides what
happens to the rest (the episode it stopped at is retried alone, the next ones form a unit).

Text episodes (judged by the LLM against stored facts) go in runs: each episode of a run is
resolved and stamped in turn, its entities held in the view ahead of its write (so the next
episode's resolution finds them), then the new facts of the whole run are judged in one LLM
call (``InvalidationStep.judge_together``), then each episode is invalidated and written in
order. A run ends before an episode that repeats one of the run, and before an episode whose
resolution searches the store (``ResolutionStep.searches``): the search must see the run's
entities, so the run is written first; meanwhile the judging call that episode's resolution
would make once the run is written is guessed and started (``tidegraph.pipelines.speculation``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tidegraph.embed.cache import CachingEmbedder
from tidegraph.metrics import BATCH_EPISODES, BATCHES, STAGE_EVENTS, STAGE_LATENCY
from tidegraph.pipelines.batch_view import BatchView
from tidegraph.pipelines.speculation import SearchWithHeld, SharedCalls
from tidegraph.processors.invalidation import InvalidationStep
from tidegraph.processors.prompts import StructuredLLM
from tidegraph.processors.resolution import ResolutionStep
from tidegraph.processors.steps import Components
from tidegraph.processors.temporal import TemporalStep
from tidegraph.records.conversation import embed_text
from tidegraph.records.graph import EntityLookup, EntityRecord
from tidegraph.records.outcome import Outcome
from tidegraph.records.stages import Extraction, Processed, StampedEpisode, WriteSummary
from tidegraph.stores.base import BatchWriteError

log = logging.getLogger(__name__)

T = TypeVar("T")

# What a unit's episode did at each stage: (stage, outcome, seconds), counted once the unit is
# written (an episode the unit gives back is counted when it is processed again).
Counted = list[tuple[str, str, float]]


@dataclass(frozen=True)
class Stop:
    """Where an attempt stopped before the end of its unit: the ``index`` of the episode it
    could not process, the stage that failed and the error; ``own``: the error is that
    episode's (a step failed on it), not the unit's (a write of several episodes in one
    transaction failed: any of them may be the cause)."""

    index: int
    stage: str
    error: BaseException
    own: bool = True


@dataclass
class UnitResult:
    """One attempt at a unit: the outcomes of its first ``len(outcomes)`` episodes (written,
    or found processed), and why it stopped before the others (None: it did not)."""

    outcomes: list[Outcome[WriteSummary]] = field(default_factory=list)
    stop: Stop | None = None


@dataclass
class Progress:
    """Where one attempt is: the stage it runs (what a failure or a timeout names)."""

    stage: str = "resolution"


@dataclass
class _Done:
    """A unit's episode, processed in memory: its outcome and what to count for it."""

    outcome: Outcome[WriteSummary]
    counted: Counted
    held: bool  # its write is held in the view (flushed with the unit's)


@dataclass
class _Steps:
    """The write-side steps of one unit, over its view."""

    resolution: ResolutionStep
    temporal: TemporalStep
    invalidation: InvalidationStep


class UnitWriter:
    """Attempts units of one process's components (see the module docstring)."""

    def __init__(self, components: Components) -> None:
        self.components = components

    async def attempt(
        self, extractions: Sequence[Extraction], progress: Progress | None = None
    ) -> UnitResult:
        """One attempt at ``extractions`` (one group's, in order, all mapped or all not);
        ``progress`` says, meanwhile, where it is."""
        components = self.components
        at = progress or Progress()
        at.stage = "resolution"
        try:
            view = await BatchView.read(
                components.store, list(extractions), record_changes=components.record_changes
            )
        except Exception as exc:
            return UnitResult(stop=Stop(0, "resolution", exc, own=len(extractions) == 1))
        shared = SharedCalls(components.llm) if view.judged and components.llm else None
        steps = self._steps(view, shared or components.llm)
        done: list[_Done] = []
        try:
            if shared is not None:
                stop = await self._judged(at, view, steps, shared, extractions, done)
            else:
                await self._embed_ahead(extractions)
                async with in_memory_turn():
                    stop = await self._plain(at, steps, extractions, done)
            at.stage = "invalidation"
            written = await view.flush()
        except BatchWriteError as exc:  # the flush at the end, or one before a search
            held = [d.held for d in done]
            committed = _committed(held, len(exc.written))
            unsure = sum(held[committed:]) > 1  # the failed call wrote several episodes
            stop = Stop(committed, "invalidation", exc.__cause__ or exc, own=not unsure)
            done, written = done[:committed], exc.written
        finally:
            if shared is not None:
                shared.close()
        outcomes = _with_written(done, written)
        if len(extractions) > 1:  # a unit of several: written together, or not at all
            BATCHES.labels("batched" if outcomes else "fallback").inc()
            if outcomes:
                BATCH_EPISODES.observe(len(outcomes))
        _count_stages(done)
        return UnitResult(outcomes, stop)

    def _steps(self, view: BatchView, llm: StructuredLLM | None) -> _Steps:
        c = self.components
        return _Steps(
            ResolutionStep(store=view, embedder=c.embedder, llm=llm, clock=c.clock),
            TemporalStep(),
            InvalidationStep(
                store=view,
                embedder=c.embedder,
                llm=llm,
                embed_mapped_content=c.embed_mapped_content,
                clock=c.clock,
            ),
        )

    async def _plain(
        self, at: Progress, steps: _Steps, extractions: Sequence[Extraction], done: list[_Done]
    ) -> Stop | None:
        """Each episode through the three steps in turn (mapped records, or text without an
        LLM); stops at the first that fails."""
        for index, extraction in enumerate(extractions):
            await asyncio.sleep(0)  # the loop serves I/O between episodes
            counted: Counted = []
            try:
                lookup = await self._timed(
                    at, counted, "resolution", steps.resolution.lookup(extraction)
                )
                resolved = await self._timed(
                    at, counted, "resolution", steps.resolution.resolved_from(extraction, lookup)
                )
                if isinstance(resolved, Processed):
                    done.append(_Done(_processed(resolved), counted, held=False))
                    continue
                stamped = await self._timed(at, counted, "temporal", steps.temporal.run(resolved))
                summary = await self._timed(
                    at, counted, "invalidation", steps.invalidation.run(stamped)
                )
            except BatchWriteError:
                raise
            except Exception as exc:
                return Stop(index, at.stage, exc)
            done.append(_written(extraction, summary, counted))
        return None

    async def _judged(
        self,
        progress: Progress,
        view: BatchView,
        steps: _Steps,
        shared: SharedCalls,
        extractions: Sequence[Extraction],
        done: list[_Done],
    ) -> Stop | None:
        """Text episodes in runs (see the module docstring)."""
        at = 0
        guess: asyncio.Task[None] | None = None
        try:
            while at < len(extractions):
                run: list[tuple[StampedEpisode | Processed, Counted]] = []
                stop: Stop | None = None
                seen: set[str] = set()
                for index in range(at, len(extractions)):
                    extraction = extractions[index]
                    if extraction.episode.uuid in seen:
                        break
                    if guess is not None:
                        await guess  # its call is started before the real one may ask for it
                        guess = None
                    counted: Counted = []
                    try:
                        lookup = await self._timed(
                            progress, counted, "resolution", steps.resolution.lookup(extraction)
                        )
                        if view.holds_entities_ahead and steps.resolution.searches(
                            extraction, lookup
                        ):
                            held = view.entities_ahead()
                            guess = asyncio.create_task(
                                self._speculate(steps.resolution, extraction, lookup, shared, held)
                            )
                            break
                        out = await self._resolve_and_stamp(
                            progress, steps, extraction, lookup, counted
                        )
                    except BatchWriteError:
                        raise
                    except Exception as exc:
                        stop = Stop(index, progress.stage, exc)
                        break
                    seen.add(extraction.episode.uuid)
                    if isinstance(out, StampedEpisode):
                        view.hold_entities(out.episode.uuid, out.pending.entities)
                    run.append((out, counted))
                failed = await self._judge_and_write(progress, steps, at, run, done)
                if failed is not None:
                    return failed
                at += len(run)
                if stop is not None or not run:
                    return stop
            return None
        finally:
            if guess is not None:
                guess.cancel()

    async def _resolve_and_stamp(
        self,
        at: Progress,
        steps: _Steps,
        extraction: Extraction,
        lookup: EntityLookup,
        counted: Counted,
    ) -> StampedEpisode | Processed:
        resolved = await self._timed(
            at, counted, "resolution", steps.resolution.resolved_from(extraction, lookup)
        )
        if isinstance(resolved, Processed):
            return resolved
        return await self._timed(at, counted, "temporal", steps.temporal.run(resolved))

    async def _judge_and_write(
        self,
        progress: Progress,
        steps: _Steps,
        at: int,
        run: list[tuple[StampedEpisode | Processed, Counted]],
        done: list[_Done],
    ) -> Stop | None:
        """The run's new facts judged in one call, then each episode invalidated and written
        (held) in order; stops at the first that fails (``at``: the run's first index)."""
        stamped = [out for out, _ in run if isinstance(out, StampedEpisode)]
        progress.stage = "invalidation"
        try:
            joint = await steps.invalidation.judge_together(stamped)
        except Exception as exc:  # each episode then asks alone
            log.info("joint fact judgement failed, each episode asks alone: %s", exc)
            joint = None
        for n, (out, counted) in enumerate(run):
            if isinstance(out, Processed):
                done.append(_Done(_processed(out), counted, held=False))
                continue
            try:
                summary = await self._timed(
                    progress, counted, "invalidation", steps.invalidation.run(out, joint)
                )
            except Exception as exc:
                return Stop(at + n, "invalidation", exc)
            done.append(_written(out, summary, counted))
        return None

    async def _speculate(
        self,
        resolution: ResolutionStep,
        extraction: Extraction,
        lookup: EntityLookup,
        shared: SharedCalls,
        held: list[EntityRecord],
    ) -> None:
        """Start the judging call ``extraction``'s resolution would make once the run before
        it is written: against the store as it stands with the run's ``held`` entities put in
        (``SearchWithHeld``); whatever goes wrong only means no call is started."""
        search = SearchWithHeld(self.components.store, held, self.components.embedder)
        try:
            request = await resolution.speculate(extraction, lookup, search)
        except Exception as exc:
            log.debug("no judging call started ahead: %s", exc)
            return
        if request is not None:
            shared.start(request)

    @staticmethod
    async def _timed(at: Progress, counted: Counted, stage: str, call: Awaitable[T]) -> T:
        """``call`` as part of ``stage``: one count per stage and episode, its time summed."""
        at.stage = stage
        started = time.perf_counter()
        result = await call
        outcome = "skipped" if isinstance(result, Processed) else "ok"
        seconds = time.perf_counter() - started
        if counted and counted[-1][0] == stage:
            seconds += counted.pop()[2]
        counted.append((stage, outcome, seconds))
        return result

    async def _embed_ahead(self, extractions: Sequence[Extraction]) -> None:
        """Every text the unit's steps may embed (entity names, the facts but closing ones,
        the content when mapped content is embedded), in one call before its turn: the steps
        then find them in the embedder's cache, and the turn waits on no embedding service."""
        embedder = self.components.embedder
        if not isinstance(embedder, CachingEmbedder):
            return
        texts: dict[str, None] = {}
        for extraction in extractions:
            texts.update(dict.fromkeys(entity.name for entity in extraction.entities))
            texts.update(dict.fromkeys(fact.fact for fact in extraction.facts if not fact.closes))
            if self.components.embed_mapped_content:
                episode = extraction.episode
                texts[
                    embed_text(episode.source, episode.content_text(), episode.reference_time)
                ] = None
        await embedder.warm(list(texts))


def in_memory_turn() -> asyncio.Lock:
    """The turn of a unit's in-memory work on this event loop: one unit at a time.

    The work is CPU-bound on one thread either way. Interleaved, the units of all groups
    would finish together and their writes would queue behind each other while the store
    idles (a convoy: read, compute, write, each in turn for everyone); one at a time, the
    first unit's write runs while the next one computes. Between episodes the holder yields
    to the event loop, so the store's round trips are served meanwhile."""
    loop = asyncio.get_running_loop()
    turn = _TURNS.get(loop)
    if turn is None:
        turn = _TURNS[loop] = asyncio.Lock()
    return turn


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _processed(processed: Processed) -> Outcome[WriteSummary]:
    return Outcome.already(processed.episode, processed.created_entities, processed.not_extracted)


def _written(
    extraction: Extraction | StampedEpisode, result: WriteSummary | Processed, counted: Counted
) -> _Done:
    if isinstance(result, Processed):  # the view found it processed when writing
        return _Done(_processed(result), counted, held=False)
    return _Done(Outcome(extraction.episode, result), counted, held=True)


def _committed(held: list[bool], writes: int) -> int:
    """How many of a unit's episodes are committed when ``writes`` of its held writes are:
    every episode up to the first held write that was not."""
    for index, is_held in enumerate(held):
        if is_held:
            if writes == 0:
                return index
            writes -= 1
    return len(held)


def _with_written(done: list[_Done], written: list[bool]) -> list[Outcome[WriteSummary]]:
    """The outcomes, those whose held write the store skipped (processed meanwhile, or
    stored without extraction before and again now) as processed."""
    results = iter(written)
    outcomes: list[Outcome[WriteSummary]] = []
    for item in done:
        outcome = item.outcome
        if item.held and not next(results):
            summary = outcome.value
            assert summary is not None
            outcome = Outcome.already(
                outcome.episode, summary.created_entities, summary.not_extracted
            )
        outcomes.append(outcome)
    return outcomes


def _count_stages(done: list[_Done]) -> None:
    """Each episode's count and time per stage, into the stage metrics: each stage's series
    looked up once per unit rather than once per episode."""
    events: dict[tuple[str, str], int] = {}
    times: dict[str, list[float]] = {}
    for item in done:
        for stage, outcome, seconds in item.counted:
            events[stage, outcome] = events.get((stage, outcome), 0) + 1
            times.setdefault(stage, []).append(seconds)
    for (stage, outcome), count in events.items():
        STAGE_EVENTS.labels(stage, outcome).inc(count)
    for stage, values in times.items():
        latency = STAGE_LATENCY.labels(stage)
        for seconds in values:
            latency.observe(seconds)
