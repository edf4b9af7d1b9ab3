"""The stage chain: one table says, for each stage, the step it runs, the record it takes and
gives, and the topic it reads or writes. Both ways of running the chain are built from it:

- the Faust topology (``tidegraph.pipelines.streaming.app``): one agent per **hop**, a hop being the
stages from
  one that consumes a topic up to the next one that does; the stages of a hop run one after
  the other on the same record, in the same per-group lane;
- the in-process chain (``tidegraph.pipelines.inprocess``): every stage in table order, no topics.

Two hops, not one per stage (README "Streaming topology"). Extraction has a hop of its own:
its LLM calls are the slow, rate-limited and failing part, and an extraction is a function of
the episode and earlier episodes' content (known at intake), so extraction may run ahead of
the writes. Resolution, temporal stamping and invalidation share the second hop: each
episode's resolution must see the entities and facts of every earlier episode of its group,
which its write commits together, so they run in order per group anyway; a topic between them
bought only latency, a produce/consume/commit per record, and an entity write of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from tidegraph.processors.extraction import ExtractionStep
from tidegraph.processors.invalidation import InvalidationStep
from tidegraph.processors.resolution import ResolutionStep
from tidegraph.processors.steps import Components, Step
from tidegraph.processors.temporal import TemporalStep
from tidegraph.records.episode import Episode
from tidegraph.records.stages import Extraction, ResolvedEpisode, StampedEpisode, WriteSummary


@dataclass(frozen=True)
class Stage:
    """One row of the chain. ``consumes``: the topic (short name, see ``TopicNames.named``)
    whose records start a hop with this stage; None: it takes the previous stage's output in
    the same hop. ``produces``: the topic its output goes to, ending the hop; None: the next
    stage takes it in the same hop."""

    name: str
    build: Callable[[Components], Step[Any, Any]]
    takes: type[BaseModel]
    gives: type[BaseModel]
    consumes: str | None = None
    produces: str | None = None


def _extraction(c: Components) -> ExtractionStep:
    return ExtractionStep(
        mappings=c.mappings,
        llm=c.llm,
        store=c.store,
        context=c.context,
        context_episodes=c.context_episodes,
        episodes_per_call=c.episodes_per_call,
    )


def _resolution(c: Components) -> ResolutionStep:
    return ResolutionStep(store=c.store, embedder=c.embedder, llm=c.llm)


def _temporal(c: Components) -> TemporalStep:
    return TemporalStep()


def _invalidation(c: Components) -> InvalidationStep:
    return InvalidationStep(
        store=c.store,
        embedder=c.embedder,
        llm=c.llm,
        embed_mapped_content=c.embed_mapped_content,
    )


CHAIN: tuple[Stage, ...] = (
    Stage(
        "extraction", _extraction, Episode, Extraction, consumes="episodes", produces="extracted"
    ),
    Stage("resolution", _resolution, Extraction, ResolvedEpisode, consumes="extracted"),
    Stage("temporal", _temporal, ResolvedEpisode, StampedEpisode),
    Stage("invalidation", _invalidation, StampedEpisode, WriteSummary, produces="entities.new"),
)


@dataclass(frozen=True)
class Hop:
    """Consecutive stages run by one agent: from a stage that consumes a topic to the stage
    before the next one that does."""

    stages: tuple[Stage, ...]

    @property
    def name(self) -> str:
        return self.stages[0].name

    @property
    def consumes(self) -> str:
        topic = self.stages[0].consumes
        assert topic is not None
        return topic

    @property
    def produces(self) -> str | None:
        return self.stages[-1].produces


def hops(chain: tuple[Stage, ...] = CHAIN) -> list[Hop]:
    """The chain cut where a stage consumes a topic."""
    cut: list[list[Stage]] = []
    for stage in chain:
        if stage.consumes is not None or not cut:
            cut.append([])
        cut[-1].append(stage)
    return [Hop(tuple(stages)) for stages in cut]


def build_steps(components: Components, chain: tuple[Stage, ...] = CHAIN) -> list[Step[Any, Any]]:
    """One step per stage, in chain order, sharing ``components``."""
    return [stage.build(components) for stage in chain]
