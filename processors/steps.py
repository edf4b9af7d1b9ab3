"""What a stage is: a step with an async ``run`` from one record to the next, and the
components steps are built from.

Every stage of the chain (``tidegraph.pipelines.chain.CHAIN``) is a step: ``run(item)`` returns the
next record, or ``Processed`` when the episode is already processed (a redelivery or a replay:
nothing to do; the chain stops there). Each step decides that itself, where it costs the least
(README "At-least-once with idempotent effects"). Steps know nothing of Kafka or of how they are
run: the Faust agents (``tidegraph.pipelines.streaming.handlers``) and the in-process chain
(``tidegraph.pipelines.inprocess``) run the same objects, built once per process from the same
``Components``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

from tidegraph.embed.base import Embedder
from tidegraph.embed.cache import CachingEmbedder
from tidegraph.processors.context import RecentEpisodes
from tidegraph.processors.mapping import MappingSet
from tidegraph.processors.prompts import StructuredLLM
from tidegraph.records.stages import Processed
from tidegraph.stores.base import GraphStore

In = TypeVar("In", contravariant=True)
Out = TypeVar("Out", covariant=True)


class Step(Protocol[In, Out]):
    """One stage. A step may also define ``fallback(item, reason) -> Out | None``: what the
    chain goes on with when the step gives up on ``item``
    (``tidegraph.pipelines.step_runner.run_steps``)."""

    stage: str  # the stage's name: metric label, dead-letter stage

    async def run(self, item: In) -> Out | Processed:
        """The next record, or ``Processed`` when the episode is already processed."""
        ...


@dataclass
class Components:
    """Everything the steps of one process share: one store connection, one embedder (with
    its cache), one LLM client (hence one rate limiter), the mappings, and the recent
    episodes extraction gives the LLM as context."""

    store: GraphStore
    embedder: Embedder
    llm: StructuredLLM | None
    mappings: MappingSet | None
    context: RecentEpisodes
    context_episodes: int = 4
    episodes_per_call: int = 4
    embed_mapped_content: bool = False

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
        embed_mapped_content: bool = False,
    ) -> Components:
        """Components around one store, embedder and LLM client: fact texts and names recur
        across a group's episodes, so the steps share one embedding cache; extraction's
        context keeps a few more recent episodes per group than it gives the LLM."""
        return cls(
            store=store,
            embedder=CachingEmbedder(embedder),
            llm=llm,
            mappings=mappings,
            context=RecentEpisodes(store, per_group=max(16, 4 * context_episodes)),
            context_episodes=context_episodes,
            episodes_per_call=episodes_per_call,
            embed_mapped_content=embed_mapped_content,
        )
