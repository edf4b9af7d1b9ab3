"""The chain in one process (``tidegraph ingest``, ``tidegraph demo``, benchmarks): every stage
of ``tidegraph.pipelines.chain.CHAIN`` in order on each episode, per-group order kept, groups in
parallel.

The steps are the ones the Faust agents run, built from the same table and run through the same
``tidegraph.pipelines.step_runner.run_steps`` (retries, metrics, time budget); only the topics are
left out. A failing episode is recorded with its dead-letter reason and its group goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from tidegraph.embed.base import Embedder
from tidegraph.pipelines.batches import (
    DEFAULT_BATCH_EPISODES,
    DEFAULT_EXTRACT_AHEAD,
    batchable,
    process_batch,
    process_extractions,
)
from tidegraph.pipelines.chain import CHAIN, build_steps
from tidegraph.pipelines.retry import RetryPolicy
from tidegraph.pipelines.step_runner import ChainResult, run_steps
from tidegraph.processors.extraction import ExtractionStep, JointExtraction, prepared_steps
from tidegraph.processors.mapping import MappingSet
from tidegraph.processors.prompts import StructuredLLM
from tidegraph.processors.steps import Components
from tidegraph.records.episode import Episode, parse_episode
from tidegraph.records.errors import InvalidEpisode
from tidegraph.records.stages import Extraction, WriteSummary
from tidegraph.stores.base import GraphStore

DEFAULT_RECORD_TIMEOUT = 600.0


@dataclass
class Failure:
    """A record the chain could not process, with why (what its dead letter would say)."""

    stage: str
    error_class: str
    message: str
    record: Any  # the original record (raw line or episode JSON)
    group_id: str | None = None
    episode_id: str | None = None
    attempts: int = 1
    reason: str = "error"  # one of tidegraph.processors.failures.REASONS
    line: int | None = None  # the line of the input file, when read from one


class EpisodeFailed(Exception):
    """An episode the chain gave up on (``failure`` says where and why)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(f"{failure.stage}: {failure.reason}: {failure.message}")
        self.failure = failure


class InProcessChain:
    """Every stage of the chain, in order, on one episode at a time per group."""

    def __init__(
        self,
        *,
        store: GraphStore,
        embedder: Embedder,
        llm: StructuredLLM | None,
        mappings: MappingSet | None,
        context_episodes: int = 4,
        episodes_per_call: int = 4,
        policy: RetryPolicy | None = None,
        record_timeout: float = DEFAULT_RECORD_TIMEOUT,
    ) -> None:
        components = Components.of(
            store=store,
            embedder=embedder,
            llm=llm,
            mappings=mappings,
            context_episodes=context_episodes,
            episodes_per_call=episodes_per_call,
        )
        self._setup(components, policy, record_timeout)

    @classmethod
    def from_components(
        cls,
        components: Components,
        *,
        policy: RetryPolicy | None = None,
        record_timeout: float = DEFAULT_RECORD_TIMEOUT,
    ) -> InProcessChain:
        """The chain over components opened elsewhere (``tidegraph.pipelines.runtime``)."""
        chain = cls.__new__(cls)
        chain._setup(components, policy, record_timeout)
        return chain

    def _setup(
        self, components: Components, policy: RetryPolicy | None, record_timeout: float
    ) -> None:
        self.components = components
        self.steps = build_steps(components, CHAIN)
        self.policy = policy or RetryPolicy()
        self.record_timeout = record_timeout
        self.batch_episodes = DEFAULT_BATCH_EPISODES
        self.extract_ahead = DEFAULT_EXTRACT_AHEAD
        self._extraction = cast(ExtractionStep, self.steps[0])

    async def process_group(
        self,
        episodes: list[Episode],
        on_result: Callable[[WriteSummary | Failure], None] | None = None,
    ) -> list[WriteSummary | Failure]:
        """Episodes of one group, in order: each run of consecutive mapped episodes (up to
        ``batch_episodes``) as one unit (``tidegraph.pipelines.batches``); the others, and an
        episode a batch stops at, one at a time. A failure is the episode's own; the others go on.
        ``on_result`` is called with each result as soon as it is known."""
        results: _Results = _Results(on_result)
        i = 0
        while i < len(episodes):
            run = []
            for episode in episodes[i : i + self.batch_episodes]:
                if not batchable(episode, self.components):
                    break
                run.append(episode)
            if len(run) > 1:
                done = await process_batch(self.components, run)
                results.extend(done)
                i += len(done)
                if done:
                    continue
            ahead = []
            for episode in episodes[i:]:
                if not self._extraction.extracts_by_llm(episode):
                    break
                ahead.append(episode)
            if len(ahead) > 1:
                await self._extract_ahead(ahead, results)
                i += len(ahead)
                continue
            # Not batchable, or the episode a batch stopped at: alone.
            results.append(await self._one(episodes[i]))
            i += 1
        return list(results)

    async def _extract_ahead(self, episodes: list[Episode], results: _Results) -> None:
        """LLM episodes of one group, in order, their extraction calls up to
        ``extract_ahead`` calls ahead of the ordered stages, each call extracting up to
        ``episodes_per_call`` consecutive episodes: each episode is prepared in order
        (processed check, context: ``ExtractionStep.prepare``), its call then runs while
        earlier episodes are resolved and written. One conversation is not held to one LLM
        round trip at a time, nor to one call per episode. Preparing runs beside the ordered
        stages; the extracted episodes waiting at the head are resolved and written as one
        unit (``_finish_run``)."""
        per_call = self._extraction.episodes_per_call
        window = self.extract_ahead * per_call
        in_flight: deque[tuple[Episode, asyncio.Task[ChainResult] | None]] = deque()
        joints: list[JointExtraction] = []
        slots = asyncio.Semaphore(window)  # episodes started and not yet finished
        started = asyncio.Event()

        async def start_all() -> None:
            for at in range(0, len(episodes), per_call):
                chunk = episodes[at : at + per_call]
                for _ in chunk:
                    await slots.acquire()
                in_flight.extend(await self._start_extractions(chunk, joints))
                started.set()

        starter = asyncio.create_task(start_all())
        try:
            while in_flight or not starter.done():
                if not in_flight:
                    started.clear()
                    waiter = asyncio.ensure_future(started.wait())
                    try:
                        await asyncio.wait([starter, waiter], return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        waiter.cancel()
                    continue
                finished = await self._finish_run(in_flight, window)
                results.extend(finished)
                for _ in finished:
                    slots.release()
            await starter  # its failure (a bug: preparing catches its own) is raised here
        finally:
            starter.cancel()
            for _, task in in_flight:
                if task is not None:
                    task.cancel()
            for joint in joints:
                joint.cancel()

    async def _start_extractions(
        self, episodes: list[Episode], joints: list[JointExtraction]
    ) -> list[tuple[Episode, asyncio.Task[ChainResult] | None]]:
        """The episodes' extractions, prepared in order and started, in one LLM call when
        several ask for one; None for an episode whose preparing failed (it then goes alone,
        and fails there as it would have)."""
        prepared = await self._extraction.prepare_many(episodes)
        steps, joint = prepared_steps(
            self._extraction, [p for p in prepared if p is not None], self.record_timeout
        )
        if joint is not None:
            joints.append(joint)
        step_of = iter(steps)
        started: list[tuple[Episode, asyncio.Task[ChainResult] | None]] = []
        for episode, ready in zip(episodes, prepared, strict=True):
            task = None
            if ready is not None:
                step = next(step_of)
                task = asyncio.create_task(
                    run_steps(
                        [step],
                        episode,
                        policy=self.policy,
                        budget=self.record_timeout,
                        what=f"group={episode.group_id} episode={episode.id}",
                    )
                )
            started.append((episode, task))
        return started

    async def _finish_run(
        self,
        in_flight: deque[tuple[Episode, asyncio.Task[ChainResult] | None]],
        most: int,
    ) -> list[WriteSummary | Failure]:
        """The ordered stages of the head of ``in_flight`` and of the episodes after it whose
        extraction is already done (``most`` in all): consecutive extracted ones as one unit
        (``tidegraph.pipelines.batches.process_extractions``: one read, one write), the others
        alone. It never waits for an extraction beyond the head's: once the head's is over, the ones
        after it that are over too (the episodes of its joint call) join the unit."""
        head = in_flight[0][1]
        if head is not None and not head.done():
            await asyncio.wait([head])
        run = [in_flight.popleft()]
        while in_flight and len(run) < most and _extracted(in_flight[0][1]):
            run.append(in_flight.popleft())
        results: list[WriteSummary | Failure] = []
        extracted: list[tuple[Episode, Extraction]] = []
        for episode, task in run:
            if task is None:
                results += await self._ordered(extracted)
                results.append(await self._one(episode))
                continue
            try:
                done = await task
            except Exception as exc:
                results += await self._ordered(extracted)
                results.append(_failure_of(episode, exc))
                continue
            if done.failure is not None or done.processed is not None:
                results += await self._ordered(extracted)
                results.append(self._summary(episode, done))
                continue
            extracted.append((episode, done.value))
        results += await self._ordered(extracted)
        return results

    async def _ordered(
        self, extracted: list[tuple[Episode, Extraction]]
    ) -> list[WriteSummary | Failure]:
        """The ordered stages of consecutive extracted episodes (emptying ``extracted``):
        as one unit while they can be (``process_extractions``), the episode a unit stops at
        alone, with the usual retries and dead letters."""
        waiting = list(extracted)
        results: list[WriteSummary | Failure] = []
        extracted.clear()
        while waiting:
            done = await process_extractions(self.components, [x for _, x in waiting])
            results += done
            del waiting[: len(done)]
            if waiting:  # the episode the unit stopped at (or a lone one)
                episode, extraction = waiting.pop(0)
                results.append(await self._after_extraction(episode, extraction))
        return results

    async def _after_extraction(
        self, episode: Episode, extraction: Extraction
    ) -> WriteSummary | Failure:
        """The episode's ordered stages after its extraction, alone."""
        try:
            rest = await run_steps(
                self.steps[1:],
                extraction,
                policy=self.policy,
                budget=self.record_timeout,
                what=f"group={episode.group_id} episode={episode.id}",
            )
            return self._summary(episode, rest)
        except Exception as exc:
            return _failure_of(episode, exc)

    async def _one(self, episode: Episode) -> WriteSummary | Failure:
        try:
            return await self.process(episode)
        except Exception as exc:
            # EpisodeFailed, or a bug outside the steps' error handling: the episode fails,
            # its group goes on, the other groups are not cancelled.
            return _failure_of(episode, exc)

    async def process(self, episode: Episode) -> WriteSummary:
        """The episode through every stage: its write summary (``skipped`` when it was already
        processed). Raises EpisodeFailed when a stage gives up on it."""
        result: ChainResult = await run_steps(
            self.steps,
            episode,
            policy=self.policy,
            budget=self.record_timeout,
            what=f"group={episode.group_id} episode={episode.id}",
        )
        summary = self._summary(episode, result)
        if isinstance(summary, Failure):
            raise EpisodeFailed(summary)
        return summary

    @staticmethod
    def _summary(episode: Episode, result: ChainResult) -> WriteSummary | Failure:
        """What running steps on ``episode`` came to."""
        if result.failure is not None:
            failure = result.failure
            return Failure(
                stage=failure.stage,
                error_class=type(failure.error).__name__,
                message=str(failure.error),
                record=episode.model_dump(mode="json"),
                group_id=episode.group_id,
                episode_id=episode.id,
                attempts=failure.attempts,
                reason=failure.reason,
            )
        if result.processed is not None:
            return WriteSummary(
                group_id=episode.group_id,
                episode_uuid=episode.uuid,
                episode_id=episode.id,
                skipped=True,
                created_entities=result.processed.created_entities,
            )
        summary: WriteSummary = result.value
        return summary


class _Results(list[WriteSummary | Failure]):
    """A list that tells ``on_result`` of each result added."""

    def __init__(self, on_result: Callable[[WriteSummary | Failure], None] | None) -> None:
        super().__init__()
        self._on_result = on_result

    def append(self, result: WriteSummary | Failure) -> None:
        super().append(result)
        if self._on_result is not None:
            self._on_result(result)

    def extend(self, results: Iterable[WriteSummary | Failure]) -> None:
        for result in results:
            self.append(result)


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
    """The valid episodes of a file's lines, and a failure (with its reason) for each line
    that is not one; blank lines are skipped."""
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
    chain: InProcessChain,
    episodes: list[Episode],
    *,
    concurrency: int = 8,
    on_done: Callable[[WriteSummary | None], None] | None = None,
) -> IngestReport:
    """Process episodes in order within each group, up to ``concurrency`` groups at once. A
    failing episode is recorded with its reason and its group goes on with the next one."""
    report = IngestReport()
    started = time.perf_counter()
    by_group: dict[str, list[Episode]] = {}
    for episode in episodes:
        by_group.setdefault(episode.group_id, []).append(episode)
    gate = asyncio.Semaphore(concurrency)

    def done(result: WriteSummary | Failure) -> None:
        if isinstance(result, Failure):
            report.failures.append(result)
        else:
            report.add(result)
        if on_done:
            on_done(None if isinstance(result, Failure) else result)

    async def run_group(items: list[Episode]) -> None:
        async with gate:
            await chain.process_group(items, done)

    await asyncio.gather(*(run_group(items) for items in by_group.values()))
    report.seconds = time.perf_counter() - started
    return report


def _extracted(task: asyncio.Task[ChainResult] | None) -> bool:
    """Whether an in-flight extraction is over (an episode without one goes alone: ready)."""
    return task is None or task.done()


def _failure_of(episode: Episode, exc: Exception) -> Failure:
    if isinstance(exc, EpisodeFailed):
        return exc.failure
    return Failure(
        stage="ingest",
        error_class=type(exc).__name__,
        message=str(exc),
        record=episode.model_dump(mode="json"),
        group_id=episode.group_id,
        episode_id=episode.id,
        reason="internal_error",
    )
