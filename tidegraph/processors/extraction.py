"""Extraction stage: an episode -> entities and facts (with dates as stated).

JSON records that a declared mapping matches skip the LLM entirely and touch no store: their
processed marker is read with resolution's lookup, in the round trip that stage makes anyway.
Everything else takes one structured LLM call, with the group's previous episodes as context,
after a check that the episode is not processed yet (so that a replay costs no LLM call);
several waiting episodes of a group may share one call (``ask_together``, docs/streaming.md
"Batch-native stages").

A text or message episode the LLM cannot extract now (no LLM configured, or the LLM failed on it
after every retry) is not lost: the step answers an empty extraction marked ``not_extracted`` with
why, so the episode is stored with its content, searchable at once, and ``tidegraph extract
--pending`` extracts it later (docs/architecture.md "Episodes without an LLM"). A json record is
business data: one that no mapping rule matches, without an LLM, is dead-lettered (``no_extractor``)
to be replayed once a rule covers it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidegraph.metrics import EPISODES_NOT_EXTRACTED
from tidegraph.processors.context import RecentEpisodes
from tidegraph.processors.mapping import MappingSet
from tidegraph.processors.prompts import (
    EPISODES_EXTRACTION_SYSTEM,
    EXTRACTION_SYSTEM,
    EpisodesExtractionOutput,
    ExtractionOutput,
    StructuredLLM,
    episodes_extraction_user,
    extraction_user,
)
from tidegraph.records.episode import Episode
from tidegraph.records.errors import NoExtractorError, RecordError
from tidegraph.records.graph import EpisodeRecord
from tidegraph.records.ids import to_label
from tidegraph.records.stages import (
    MAX_EXTRACTED_ENTITIES,
    MAX_EXTRACTED_FACTS,
    TOO_LARGE,
    EntityDraft,
    Extraction,
    FactDraft,
    Processed,
)

if TYPE_CHECKING:
    from tidegraph.processors.steps import ExtractionStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """An LLM extraction with everything read that must be read in episode order: whether the
    episode is processed, and its context (``ExtractionStep.prepare``)."""

    episode: Episode
    processed: bool
    context: list[EpisodeRecord]


class ExtractionStep:
    """``run(episode) -> Extraction``, or ``Processed`` for an episode already processed (only
    asked before an LLM call)."""

    stage = "extraction"

    def __init__(
        self,
        *,
        mappings: MappingSet | None,
        llm: StructuredLLM | None,
        store: ExtractionStore | None = None,
        context: RecentEpisodes | None = None,
        context_episodes: int = 4,
        episodes_per_call: int = 4,
    ) -> None:
        """``store``: where the processed marker of an episode for the LLM is read (None:
        not read). ``context``: the recent episodes given to the LLM (None: none).
        ``episodes_per_call``: how many waiting episodes of a group one LLM call may extract
        (``ask_together``, used by the pipelines' run-ahead)."""
        self.mappings = mappings
        self.llm = llm
        self.store = store
        self.context = context
        self.context_episodes = context_episodes
        self.episodes_per_call = episodes_per_call

    async def run(self, episode: Episode) -> Extraction | Processed:
        extraction = await self._mapped(episode)
        if extraction is None:
            extraction = await self._extracted(episode)
        if extraction is None:
            return Processed(episode=episode)
        if self.context is not None:
            self.context.remember(episode)
        return extraction

    def extracts_by_llm(self, episode: Episode) -> bool:
        """Whether ``run`` asks the LLM about ``episode`` (not a JSON record: those are mapped,
        or dead-lettered without a rule)."""
        return self.llm is not None and episode.source != "json"

    async def prepare(self, episode: Episode) -> Prepared:
        """The part of ``run`` for an LLM episode that must happen in the group's order: the
        processed check and the context read; the episode is then remembered, so that the next
        episode's context holds it whether or not this one's LLM call has returned. The LLM call
        itself (``run_prepared``) may then run ahead of the group's ordered stages
        (docs/streaming.md "Batch-native stages"); its prompt is the one ``run`` would have
        built."""
        processed, stored = await self._reads(episode)
        return self._prepared(episode, processed, stored)

    async def prepare_many(self, episodes: list[Episode]) -> list[Prepared | None]:
        """``prepare`` for consecutive episodes of one group, their reads all at once: the
        processed checks and the stored context of every episode are read concurrently, then
        in order each context is merged with the episodes remembered before it and the
        episode is remembered. The same answers as preparing them one after the other: every
        earlier episode of the group is stored or remembered either way. None for an episode
        whose read failed (as ``prepare`` would have raised, it is not remembered)."""
        reads: list[tuple[bool, list[EpisodeRecord]] | BaseException]
        try:
            reads = list(await self._reads_together(episodes))
        except Exception:  # one of them fails (a reused id): each alone, to find which
            reads = await asyncio.gather(
                *(self._reads(episode) for episode in episodes), return_exceptions=True
            )
        prepared: list[Prepared | None] = []
        for episode, read in zip(episodes, reads, strict=True):
            if isinstance(read, BaseException):
                if not isinstance(read, Exception):
                    raise read
                prepared.append(None)
                continue
            prepared.append(self._prepared(episode, *read))
        return prepared

    def _prepared(self, episode: Episode, processed: bool, stored: list[EpisodeRecord]) -> Prepared:
        """The episode prepared from its reads: its context merged with the episodes
        remembered before it; then it is remembered for the next one's context."""
        context: list[EpisodeRecord] = []
        if not processed and self.context is not None:
            context = self.context.merged(
                episode.group_id, episode.reference_time, self.context_episodes, stored
            )
        if self.context is not None:
            self.context.remember(episode)
        return Prepared(episode, processed, context)

    async def _reads_together(
        self, episodes: list[Episode]
    ) -> list[tuple[bool, list[EpisodeRecord]]]:
        """``_reads`` of consecutive episodes of one group: their processed markers in one
        read, their stored contexts in another, both at once."""
        group = episodes[0].group_id
        if any(e.group_id != group for e in episodes):
            raise ValueError("episodes of one group")
        markers = (
            self.store.episode_markers(group, [(e.uuid, e.content_hash) for e in episodes])
            if self.store is not None
            else _no_markers()
        )
        stored = (
            self.context.store.recent_episodes_before(
                group, [e.reference_time for e in episodes], self.context_episodes
            )
            if self.context is not None and self.context_episodes > 0
            else _no_contexts(len(episodes))
        )
        processed, contexts = await asyncio.gather(markers, stored)
        return [(e.uuid in processed, c) for e, c in zip(episodes, contexts, strict=True)]

    async def _reads(self, episode: Episode) -> tuple[bool, list[EpisodeRecord]]:
        """The processed check and the stored context of ``episode``, at once: they are on
        the group's ordered path, and an episode found processed (a redelivery, rare) only
        wastes its context read."""
        if self.context is None or self.context_episodes <= 0:
            return await self._processed(episode), []
        stored = self.context.store.recent_episodes(
            episode.group_id, episode.reference_time, self.context_episodes
        )
        processed, context = await asyncio.gather(self._processed(episode), stored)
        return processed, context

    async def _processed(self, episode: Episode) -> bool:
        if self.store is None:
            return False
        markers = await self.store.episode_markers(
            episode.group_id, [(episode.uuid, episode.content_hash)]
        )
        return episode.uuid in markers

    async def run_prepared(self, prepared: Prepared) -> Extraction | Processed:
        """``run`` from ``prepare``'s answer: the LLM call."""
        if prepared.processed:
            return Processed(episode=prepared.episode)
        return await self._ask(prepared.episode, prepared.context)

    async def map_record(self, episode: Episode) -> Extraction | None:
        """``run`` for an episode a declared mapping extracts; None for any other (nothing
        done). For a micro-batch of mapped episodes (``tidegraph.pipelines.units``)."""
        extraction = await self._mapped(episode)
        if extraction is not None and self.context is not None:
            self.context.remember(episode)
        return extraction

    async def _mapped(self, episode: Episode) -> Extraction | None:
        """The extraction a declared mapping gives; None when no rule matches. A rule that
        matches but cannot map the record raises (RecordError with its reason)."""
        if episode.source != "json" or self.mappings is None:
            return None
        # On the event loop: a rule renders field values of a record of at most
        # MAX_CONTENT_CHARS, well under a millisecond even at that size, less than a thread hop.
        return self.mappings.extract(episode)

    def fallback(self, episode: Episode, reason: str) -> Extraction | None:
        """What the chain goes on with when this step gives up on ``episode`` for ``reason``
        (``tidegraph.pipelines.step_runner.run_step``, after every retry): an LLM failure leaves
        the episode
        stored but not extracted, never lost (so does an LLM answer over the bounds of one
        extraction); every other failure is the record's own."""
        llm_failed = reason.startswith("llm_") or reason in ("timeout", TOO_LARGE)
        if episode.source == "json" or not llm_failed:
            return None
        return not_extracted(episode, reason)

    async def _extracted(self, episode: Episode) -> Extraction | None:
        if self.llm is None:
            if episode.source != "json":
                return not_extracted(episode, "no_llm")
            raise NoExtractorError(
                "no declared mapping matches this json record and no LLM is configured: add "
                "a mapping rule (then replay it from the dead-letter topic) or set "
                "TIDEGRAPH_LLM_BASE_URL (and TIDEGRAPH_LLM_API_KEY, TIDEGRAPH_LLM_MODEL)"
            )
        extraction = await self.run_prepared(await self.prepare(episode))
        return None if isinstance(extraction, Processed) else extraction

    async def _ask(self, episode: Episode, context: list[EpisodeRecord]) -> Extraction:
        assert self.llm is not None
        output: ExtractionOutput = await self.llm.structured(
            stage=self.stage,
            system=EXTRACTION_SYSTEM,
            user=extraction_user(episode, context),
            schema=ExtractionOutput,
        )
        return from_llm_output(episode, output)

    async def ask_together(self, prepared: list[Prepared]) -> list[Extraction | None]:
        """One LLM call extracting several prepared episodes of a group (consecutive, in
        order, none processed), with the first one's context: each episode's extraction, or
        None for one the answer leaves out (it is then asked alone). docs/streaming.md "Batch-native
        stages"."""
        assert self.llm is not None
        episodes = [p.episode for p in prepared]
        output: EpisodesExtractionOutput = await self.llm.structured(
            stage=self.stage,
            system=EPISODES_EXTRACTION_SYSTEM,
            user=episodes_extraction_user(episodes, prepared[0].context),
            schema=EpisodesExtractionOutput,
        )
        answers: dict[int, ExtractionOutput] = {}
        for answer in output.episodes:
            if 0 <= answer.episode < len(episodes) and answer.episode not in answers:
                answers[answer.episode] = ExtractionOutput(
                    entities=answer.entities, facts=answer.facts
                )
        results: list[Extraction | None] = []
        calls = 1  # counted on the first episode the call answered
        for index, episode in enumerate(episodes):
            if index not in answers:
                results.append(None)
                continue
            extraction = from_llm_output(episode, answers[index])
            extraction.llm_calls, calls = calls, 0
            results.append(extraction)
        return results


class JointExtraction:
    """Several prepared episodes of a group extracted by one LLM call
    (``ExtractionStep.ask_together``), started at once; each episode's step
    (``PreparedExtraction``) takes its part of the answer. An episode the call fails on or
    leaves out is asked alone, retried and given up on as the step itself is."""

    def __init__(self, step: ExtractionStep, prepared: list[Prepared], wait: float) -> None:
        """``wait``: how long an episode waits for the call's answer before it asks alone
        (so that one episode the LLM is stuck on does not use up the others' budget)."""
        self.wait = wait
        self._task = asyncio.create_task(step.ask_together(prepared))

    async def extraction(self, index: int, episode: Episode) -> Extraction | None:
        """The answer for the call's ``index``-th episode (``episode``); None when the call
        failed, left it out or did not answer within ``wait``."""
        try:
            async with asyncio.timeout(self.wait):
                results = await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if self._task.cancelled():
                return None  # the call was cancelled, not this episode's step
            raise
        except Exception as exc:  # TimeoutError included
            log.info(
                "joint extraction failed; its episode is asked alone",
                extra={"group_id": episode.group_id, "reason": type(exc).__name__},
            )
            return None
        return results[index]

    def cancel(self) -> None:
        """Stop the call when no episode of it will take its answer."""
        self._task.cancel()


class PreparedExtraction:
    """The extraction step on a prepared episode (``ExtractionStep.prepare``): its LLM call
    (its part of a joint call when it has one), retried and given up on as the step itself
    is."""

    stage = "extraction"

    def __init__(
        self,
        step: ExtractionStep,
        prepared: Prepared,
        joint: JointExtraction | None = None,
        index: int = 0,
    ) -> None:
        """``joint``: the call this episode is the ``index``-th of (None: its own call)."""
        self.step = step
        self.prepared = prepared
        self.joint = joint
        self.index = index

    async def run(self, episode: Episode) -> Extraction | Processed:
        if self.joint is not None:
            extraction = await self.joint.extraction(self.index, self.prepared.episode)
            if extraction is not None:
                return extraction
            self.joint = None  # asked alone from now on, retries included
        return await self.step.run_prepared(self.prepared)

    def fallback(self, episode: Episode, reason: str) -> Extraction | None:
        return self.step.fallback(episode, reason)


def prepared_steps(
    step: ExtractionStep, prepared: list[Prepared], budget: float
) -> tuple[list[PreparedExtraction], JointExtraction | None]:
    """The extraction steps of consecutive prepared episodes of a group, in order: the ones
    not processed yet share one LLM call (``JointExtraction``) when there are several, each
    waiting for it half its ``budget`` (seconds) at most before it asks alone. The call starts
    now; cancel it (the second value) when the steps are abandoned."""
    asked = [p for p in prepared if not p.processed]
    joint = JointExtraction(step, asked, budget / 2) if len(asked) > 1 else None
    steps, index = [], 0
    for p in prepared:
        if p.processed or joint is None:
            steps.append(PreparedExtraction(step, p))
            continue
        steps.append(PreparedExtraction(step, p, joint, index))
        index += 1
    return steps, joint


def not_extracted(episode: Episode, reason: str) -> Extraction:
    """The episode stored with its content and nothing extracted, because of ``reason``."""
    EPISODES_NOT_EXTRACTED.labels(reason).inc()
    log.info(  # one per episode: counted by the metric, not worth a warning each
        "episode stored without extraction",
        extra={"group_id": episode.group_id, "episode_id": episode.id, "reason": reason},
    )
    return Extraction(episode=episode, not_extracted=reason)


def from_llm_output(episode: Episode, output: ExtractionOutput) -> Extraction:
    """Validate untrusted LLM output into an Extraction (names are data, never code)."""
    entities: list[EntityDraft] = []
    index: dict[str, int] = {}

    def entity_index(name: str, type_: str | None = None, summary: str | None = None) -> int:
        clean = " ".join(name.split())[:512]
        key = clean.casefold()
        if key not in index:
            label = to_label(type_) if type_ else None
            entities.append(
                EntityDraft(name=clean, labels=[label] if label else [], summary=summary or "")
            )
            index[key] = len(entities) - 1
        return index[key]

    for e in output.entities:
        if e.name.strip():
            entity_index(e.name, e.type, e.summary)
    facts: list[FactDraft] = []
    for f in output.facts:
        if not (f.subject.strip() and f.object.strip() and f.fact.strip()):
            continue
        facts.append(
            FactDraft(
                subject=entity_index(f.subject),
                object=entity_index(f.object),
                relation=f.relation,
                fact=f.fact.strip()[:2000],
                valid_at=f.valid_at,
                invalid_at=f.invalid_at,
            )
        )
    if len(entities) > MAX_EXTRACTED_ENTITIES or len(facts) > MAX_EXTRACTED_FACTS:
        raise RecordError(
            f"the LLM extracted {len(entities)} entities and {len(facts)} facts from one "
            f"episode; at most {MAX_EXTRACTED_ENTITIES} and {MAX_EXTRACTED_FACTS} are written "
            "(split the episode)",
            reason=TOO_LARGE,
        )
    return Extraction(episode=episode, entities=entities, facts=facts, llm_calls=1)


async def _no_markers() -> dict[str, list[str]]:
    return {}


async def _no_contexts(n: int) -> list[list[EpisodeRecord]]:
    return [[] for _ in range(n)]
