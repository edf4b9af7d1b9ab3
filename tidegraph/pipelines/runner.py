"""The group runner: the one scheduler of a group's consecutive episodes, for every way of
ingesting (docs: "Architecture"; the walk of a record through it is drawn there).

``GroupRunner`` takes one group's episodes in order and gives one ``Outcome`` per episode, in
the same order. It owns:

- **extraction** (``extract``): a record a declared mapping extracts is mapped at once (pure,
  nothing to retry); an episode for the LLM is prepared in the group's order (processed check
  and context), and consecutive ones share one LLM call (up to ``episodes_per_call``), their
  calls running ahead of each other and of the writes (at most ``extract_ahead`` calls' worth
  of episodes in flight); anything else runs the extraction step with its retries and budget;
- **writing** (``write``): consecutive extractions of one kind (mapped, or not) go in units
  (``tidegraph.pipelines.units``) of up to ``unit_episodes``: one read, the steps in memory,
  one write. A unit gives back the outcomes of what it committed and where it stopped; the
  episode it stopped at is retried alone (a unit of one) with backoff for transient errors,
  within its time budget, then fails with its reason; the next ones form the next unit;
- **both in one process** (``run``): extraction runs ahead while the writes follow in order,
  the extractions done at the head of the queue written as one unit.

The Kafka hops call ``extract`` (the extraction hop) and ``write`` (the write hop);
``tidegraph ingest``, the demo, ``extract --pending``, the Python API and the HTTP and MCP
servers in-process call ``run``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

from tidegraph.embed.base import Embedder
from tidegraph.metrics import RETRIES, STAGE_EVENTS, STAGE_LATENCY, labelled
from tidegraph.pipelines.outage import StoreOutage, store_outage
from tidegraph.pipelines.retry import RetryPolicy
from tidegraph.pipelines.step_runner import run_step
from tidegraph.pipelines.units import Progress, Stop, UnitResult, UnitWriter
from tidegraph.processors.extraction import (
    ExtractionStep,
    JointExtraction,
    Prepared,
    prepared_steps,
)
from tidegraph.processors.failures import STORE_MAY_BE_DOWN, classify
from tidegraph.processors.mapping import MappingSet
from tidegraph.processors.prompts import StructuredLLM
from tidegraph.processors.steps import Components
from tidegraph.records.episode import Episode
from tidegraph.records.outcome import Failure, Outcome
from tidegraph.records.stages import Extraction, WriteSummary
from tidegraph.stores.base import GraphStore

log = logging.getLogger(__name__)

# Episodes of one group written as one unit, at most.
DEFAULT_UNIT_EPISODES = 64
# LLM extraction calls of one group in flight ahead of its writes, at most.
DEFAULT_EXTRACT_AHEAD = 4
DEFAULT_RECORD_TIMEOUT = 600.0
# The write side's stages (resolution, temporal, invalidation): an episode retried alone has
# a stage's budget for each.
WRITE_STAGES = 3

OnOutcome = Callable[[Outcome[WriteSummary]], None]


class GroupRunner:
    """Runs one group's consecutive episodes through the chain (see the module docstring).
    One runner serves every group of a process; each call is about one group."""

    def __init__(
        self,
        components: Components,
        *,
        policy: RetryPolicy | None = None,
        record_timeout: float = DEFAULT_RECORD_TIMEOUT,
        unit_episodes: int = DEFAULT_UNIT_EPISODES,
        extract_ahead: int = DEFAULT_EXTRACT_AHEAD,
        outage: StoreOutage | None = None,
    ) -> None:
        self.components = components
        self.policy = policy or RetryPolicy()
        self.record_timeout = record_timeout
        # A store that does not answer holds the group's record instead of failing it
        # (tidegraph.pipelines.outage); by default waiting as long as a record's budget.
        self.outage = outage or store_outage(
            components.store, hold_seconds=record_timeout * WRITE_STAGES
        )
        self.unit_episodes = unit_episodes
        self.extract_ahead = extract_ahead
        self.extraction = ExtractionStep(
            mappings=components.mappings,
            llm=components.llm,
            store=components.store,
            context=components.context,
            context_episodes=components.context_episodes,
            episodes_per_call=components.episodes_per_call,
        )
        self.units = UnitWriter(components)

    @classmethod
    def of(
        cls,
        *,
        store: GraphStore,
        embedder: Embedder,
        llm: StructuredLLM | None,
        mappings: MappingSet | None,
        context_episodes: int = 4,
        episodes_per_call: int = 4,
        **options: Any,
    ) -> GroupRunner:
        """A runner over components made of these (``Components.of``); ``options`` as for
        the constructor."""
        components = Components.of(
            store=store,
            embedder=embedder,
            llm=llm,
            mappings=mappings,
            context_episodes=context_episodes,
            episodes_per_call=episodes_per_call,
        )
        return cls(components, **options)

    # ------------------------------------------------------------------ the three entries
    async def extract(self, episodes: Sequence[Episode]) -> list[Outcome[Extraction]]:
        """Each episode's extraction (or why there is none), in order."""
        queue = Extractions(self, episodes)
        try:
            return await queue.all()
        finally:
            queue.close()

    async def write(
        self, extractions: Sequence[Extraction], on_outcome: OnOutcome | None = None
    ) -> list[Outcome[WriteSummary]]:
        """Each extraction resolved, stamped, invalidated and written, in order."""
        outcomes: list[Outcome[WriteSummary]] = []

        def done(outcome: Outcome[WriteSummary]) -> None:
            outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)

        at = 0
        while at < len(extractions):
            unit = self._unit(extractions, at)
            since = self.outage.outages
            result = await self._attempt(unit)
            for outcome in result.outcomes:
                done(outcome)
            at += len(result.outcomes)
            if result.stop is not None and at < len(extractions):
                # The failed attempt counts as the first of its own when the error is its own.
                first = result.stop if result.stop.own else None
                done(await self._alone(extractions[at], first, since))
                at += 1
        return outcomes

    async def run(
        self, episodes: Sequence[Episode], on_outcome: OnOutcome | None = None
    ) -> list[Outcome[WriteSummary]]:
        """Each episode through the whole chain, in order: extraction ahead, the writes in
        order, the extractions done at the head of the queue written as one unit."""
        outcomes: list[Outcome[WriteSummary]] = []

        def done(outcome: Outcome[WriteSummary]) -> None:
            outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)

        queue = Extractions(self, episodes, hold=True)
        try:
            while ready := await queue.next_ready(self.unit_episodes):
                at = 0
                while at < len(ready):
                    end = at
                    while end < len(ready) and ready[end].status == "extracted":
                        end += 1
                    if end > at:
                        values = [cast(Extraction, o.value) for o in ready[at:end]]
                        await self.write(values, done)
                        at = end
                    else:
                        done(_not_written(ready[at]))
                        at += 1
                queue.release_taken()
        finally:
            queue.close()
        return outcomes

    # ------------------------------------------------------------------ writing
    def _unit(self, extractions: Sequence[Extraction], at: int) -> list[Extraction]:
        """The next unit from ``at``: consecutive extractions of one kind, at most
        ``unit_episodes``."""
        mapped = extractions[at].mapped
        unit = []
        for extraction in extractions[at : at + self.unit_episodes]:
            if extraction.mapped != mapped:
                break
            unit.append(extraction)
        return unit

    async def _attempt(self, unit: list[Extraction]) -> UnitResult:
        """One attempt at a unit, within the budget of its episodes' write."""
        budget = self.record_timeout * WRITE_STAGES
        progress = Progress()
        try:
            async with self.outage.budget(budget) as limit:
                return await self.units.attempt(unit, progress)
        except TimeoutError as exc:
            if not limit.expired():
                raise
            # Whatever it committed is found processed when the episodes come again.
            log.warning("a unit of %d episodes ran out of time; its first goes alone", len(unit))
            return UnitResult(stop=Stop(0, progress.stage, exc, own=False))

    async def _alone(
        self, extraction: Extraction, first: Stop | None, since: int
    ) -> Outcome[WriteSummary]:
        """``extraction`` as a unit of one (``_alone_once``); when it fails for a reason the
        store may be behind and the store does not answer (or did not while it was tried:
        ``since``, the outages counted before), it waits for the store and goes again from
        the start (``StoreOutage.held``)."""
        while True:
            outcome = await self._alone_once(extraction, first)
            failure = outcome.failure
            if failure is None or failure.reason not in STORE_MAY_BE_DOWN:
                return outcome
            if not await self.outage.held(since):
                return outcome
            first = None
            since = self.outage.outages

    async def _alone_once(
        self, extraction: Extraction, first: Stop | None
    ) -> Outcome[WriteSummary]:
        """``extraction`` as a unit of one, retried with backoff while its failures are
        transient (``first``: the failed attempt already made), all within its budget."""
        episode = extraction.episode
        budget = self.record_timeout * WRITE_STAGES
        attempt = 0
        stop = first
        progress = Progress(first.stage if first is not None else "resolution")
        try:
            async with self.outage.budget(budget) as limit:
                while True:
                    if stop is None:
                        result = await self.units.attempt([extraction], progress)
                        if result.outcomes:
                            return result.outcomes[0]
                        assert result.stop is not None
                        stop = result.stop
                    attempt += 1
                    verdict = classify(stop.error)
                    if verdict.reason in STORE_MAY_BE_DOWN and not await self.outage.check():
                        # Not this record's failure: ``_alone`` waits for the store.
                        failure = Failure.of(stop.stage, stop.error, verdict.reason, attempt)
                        return Outcome.failed(episode, failure)
                    if not verdict.transient or attempt >= self.policy.max_attempts:
                        STAGE_EVENTS.labels(stop.stage, "error").inc()
                        failure = Failure.of(stop.stage, stop.error, verdict.reason, attempt)
                        return Outcome.failed(episode, failure)
                    wait = self.policy.delay(attempt)
                    RETRIES.labels(stop.stage, verdict.reason).inc()
                    STAGE_EVENTS.labels(stop.stage, "retried").inc()
                    log.warning(
                        "retry stage=%s group=%s episode=%s reason=%s attempt=%d/%d "
                        "wait=%.2fs error=%s: %s",
                        stop.stage, episode.group_id, episode.id, verdict.reason, attempt,
                        self.policy.max_attempts, wait, type(stop.error).__name__, stop.error,
                    )  # fmt: skip
                    stop = None
                    await asyncio.sleep(wait)
        except TimeoutError:
            if not limit.expired():
                raise
        stage = progress.stage
        STAGE_EVENTS.labels(stage, "error").inc()
        error = TimeoutError(
            f"stage {stage} took longer than {budget:g} s on this record, retries included "
            "(TIDEGRAPH_RECORD_TIMEOUT_SECONDS)"
        )
        return Outcome.failed(episode, Failure.of(stage, error, "timeout", attempt + 1))

    # ------------------------------------------------------------------ extraction
    async def map_now(self, episode: Episode) -> Outcome[Extraction] | None:
        """The extraction of an episode a declared mapping extracts (pure and quick: no
        retries, no budget; a rule that matches but cannot map it fails it with the rule's
        reason); None when no rule matches it (nothing done)."""
        step = self.extraction
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            mapped = await step.map_record(episode)
        except Exception as exc:
            verdict = classify(exc)
            STAGE_EVENTS.labels(step.stage, "error").inc()
            return Outcome.failed(episode, Failure.of(step.stage, exc, verdict.reason))
        if mapped is None:
            return None
        labelled(STAGE_EVENTS, step.stage, "ok").inc()
        labelled(STAGE_LATENCY, step.stage).observe(loop.time() - started)
        return Outcome(episode, mapped)

    async def extract_now(self, episode: Episode) -> Outcome[Extraction]:
        """The extraction of an episode that needs no LLM call ahead: a record a declared
        mapping extracts, mapped here (``map_now``); any other through the extraction step with
        its retries and budget."""
        mapped = await self.map_now(episode)
        if mapped is not None:
            return mapped
        step = self.extraction
        return await run_step(
            step,
            episode,
            episode,
            policy=self.policy,
            budget=self.record_timeout,
            outage=self.outage,
        )


class Extractions:
    """The extractions of a group's consecutive episodes, started in order: the futures of
    their outcomes, in episode order (see ``GroupRunner``). LLM episodes are prepared in
    order and started in chunks that share one call; at most ``extract_ahead`` calls' worth
    of them are in flight: until their extraction is over, or with ``hold`` until the caller
    is done with them (``release_taken``: in-process, once they are written)."""

    def __init__(
        self, runner: GroupRunner, episodes: Sequence[Episode], *, hold: bool = False
    ) -> None:
        self.runner = runner
        per_call = runner.extraction.episodes_per_call
        self._slots = asyncio.Semaphore(runner.extract_ahead * per_call)
        self._hold = hold
        self._holding: set[asyncio.Future[Outcome[Extraction]]] = set()  # slots held
        self._taken = 0  # slots held by outcomes taken and not released yet
        self._futures: deque[asyncio.Future[Outcome[Extraction]]] = deque()
        self._added = asyncio.Event()
        self._tasks: set[asyncio.Task[Outcome[Extraction]]] = set()
        self._joints: list[JointExtraction] = []
        self._starter = asyncio.create_task(self._start_all(list(episodes)))

    async def all(self) -> list[Outcome[Extraction]]:
        """Every outcome, in order."""
        outcomes: list[Outcome[Extraction]] = []
        while ready := await self.next_ready(len(self._futures) + 1):
            outcomes += ready
        return outcomes

    async def next_ready(self, most: int) -> list[Outcome[Extraction]]:
        """The next outcome, waited for, and the ones after it already done (``most`` in
        all); empty once every episode's outcome was taken."""
        while not self._futures:
            if self._starter.done():
                self._starter.result()  # a bug in starting is raised here
                if not self._futures:
                    return []
                break
            self._added.clear()
            waiter = asyncio.ensure_future(self._added.wait())
            try:
                await asyncio.wait([self._starter, waiter], return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        head = self._futures.popleft()
        ready = [await head]
        self._take(head)
        while self._futures and len(ready) < most and self._futures[0].done():
            future = self._futures.popleft()
            ready.append(future.result())
            self._take(future)
        return ready

    def _take(self, future: asyncio.Future[Outcome[Extraction]]) -> None:
        if future in self._holding:
            self._holding.discard(future)
            self._taken += 1

    def release_taken(self) -> None:
        """Free the slots of the outcomes taken so far (``hold``)."""
        for _ in range(self._taken):
            self._slots.release()
        self._taken = 0

    def close(self) -> None:
        """Stop what is still running (the caller gave up on the rest)."""
        self._starter.cancel()
        for task in self._tasks:
            task.cancel()
        for joint in self._joints:
            joint.cancel()

    # ------------------------------------------------------------------ starting
    async def _start_all(self, episodes: list[Episode]) -> None:
        runner = self.runner
        per_call = runner.extraction.episodes_per_call
        chunk: list[tuple[Episode, asyncio.Future[Outcome[Extraction]]]] = []
        for episode in episodes:
            if not runner.extraction.extracts_by_llm(episode):
                await self._start_chunk(chunk)
                chunk = []
                future = self._add()
                future.set_result(await runner.extract_now(episode))
                continue
            await self._slots.acquire()
            future = self._add()
            if self._hold:
                self._holding.add(future)
            chunk.append((episode, future))
            if len(chunk) == per_call:
                await self._start_chunk(chunk)
                chunk = []
        await self._start_chunk(chunk)

    def _add(self) -> asyncio.Future[Outcome[Extraction]]:
        future: asyncio.Future[Outcome[Extraction]] = asyncio.get_running_loop().create_future()
        self._futures.append(future)
        self._added.set()
        return future

    async def _start_chunk(
        self, chunk: list[tuple[Episode, asyncio.Future[Outcome[Extraction]]]]
    ) -> None:
        """The chunk's episodes prepared together, then their extractions started, in one
        LLM call when several ask for one; an episode whose preparing failed runs the whole
        step alone (and fails there as it would have)."""
        if not chunk:
            return
        runner = self.runner
        step = runner.extraction
        prepared = await step.prepare_many([episode for episode, _ in chunk])
        ready: list[Prepared] = [p for p in prepared if p is not None]
        steps, joint = prepared_steps(step, ready, runner.record_timeout)
        if joint is not None:
            self._joints.append(joint)
        step_of = iter(steps)
        for (episode, future), one in zip(chunk, prepared, strict=True):
            run = next(step_of) if one is not None else step
            task = asyncio.create_task(
                run_step(
                    run,
                    episode,
                    episode,
                    policy=runner.policy,
                    budget=runner.record_timeout,
                    outage=runner.outage,
                )
            )
            task.add_done_callback(self._settle(future))
            self._tasks.add(task)

    def _settle(
        self, future: asyncio.Future[Outcome[Extraction]]
    ) -> Callable[[asyncio.Task[Outcome[Extraction]]], None]:
        def settle(task: asyncio.Task[Outcome[Extraction]]) -> None:
            if not self._hold:
                self._slots.release()
            self._tasks.discard(task)
            if future.done():
                return
            if task.cancelled():
                future.cancel()
            elif task.exception() is not None:
                future.set_exception(cast(BaseException, task.exception()))
            else:
                future.set_result(task.result())

        return settle


def _not_written(outcome: Outcome[Extraction]) -> Outcome[WriteSummary]:
    """An extraction outcome that goes no further (failed, or found processed)."""
    if outcome.failure is not None:
        return Outcome.failed(outcome.episode, outcome.failure)
    return Outcome.already(outcome.episode, outcome.created_entities)
