"""What a stage is: a step with an async ``run`` from one record to the next; what the steps
read and write (two narrow protocols every graph store and the batch view implement); and the
components the steps are built from.

Every stage is a step: ``run(item)`` returns the next record, or ``Processed`` when the episode
is already processed (a redelivery or a replay: nothing to do). Each step decides that itself,
where it costs the least. Steps know nothing of Kafka or of how they are run: the group runner
(``tidegraph.pipelines.runner``) runs them for every way of ingesting, built from the same
``Components``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeVar

from tidegraph.embed.base import Embedder
from tidegraph.embed.cache import CachingEmbedder
from tidegraph.processors.context import RecentEpisodes
from tidegraph.processors.mapping import MappingSet
from tidegraph.processors.prompts import StructuredLLM
from tidegraph.records.episode import Episode
from tidegraph.records.graph import (
    EntityLookup,
    EntityRecord,
    EpisodeRecord,
    EpisodeWrite,
    FactRecord,
)
from tidegraph.records.stages import Processed
from tidegraph.records.times import now_for
from tidegraph.stores.base import GraphStore

In = TypeVar("In", contravariant=True)
Out = TypeVar("Out", covariant=True)


class Step(Protocol[In, Out]):
    """One stage. A step may also define ``fallback(item, reason) -> Out | None``: what the
    chain goes on with when the step gives up on ``item``
    (``tidegraph.pipelines.step_runner.run_step``)."""

    stage: str  # the stage's name: metric label, dead-letter stage

    async def run(self, item: In) -> Out | Processed:
        """The next record, or ``Processed`` when the episode is already processed."""
        ...


class ExtractionStore(Protocol):
    """What extraction reads (``GraphStore`` docstrings): whether episodes are processed, and
    the group's earlier episodes as context."""

    async def episode_markers(
        self, group_id: str, episodes: list[tuple[str, str | None]]
    ) -> dict[str, list[str]]: ...

    async def recent_episodes(
        self, group_id: str, before: datetime, limit: int
    ) -> list[EpisodeRecord]: ...

    async def recent_episodes_before(
        self, group_id: str, befores: list[datetime], limit: int
    ) -> list[list[EpisodeRecord]]: ...


class EntitySearch(Protocol):
    """The entity search resolution judges candidates from (``GraphStore`` docstrings)."""

    async def entity_candidates(
        self, group_id: str, searches: list[tuple[str, list[float]]], limit: int
    ) -> list[tuple[list[tuple[EntityRecord, float]], list[tuple[EntityRecord, float]]]]: ...


class UnitStore(Protocol):
    """What resolution and invalidation read and write (``GraphStore`` docstrings): a graph
    store, or the batch view of a unit of episodes (``tidegraph.pipelines.batch_view``)."""

    async def lookup_entities(
        self,
        group_id: str,
        keys: list[str],
        names: list[str],
        episode_uuid: str | None = None,
        relations: list[str] | None = None,
        content_hash: str | None = None,
    ) -> EntityLookup: ...

    async def entity_candidates(
        self, group_id: str, searches: list[tuple[str, list[float]]], limit: int
    ) -> list[tuple[list[tuple[EntityRecord, float]], list[tuple[EntityRecord, float]]]]: ...

    async def fact_candidates(
        self,
        group_id: str,
        pairs: list[tuple[str, str]],
        ends: list[str],
        *,
        embeddings: bool = True,
    ) -> list[FactRecord]: ...

    async def entity_names(self, group_id: str, uuids: list[str]) -> dict[str, str]: ...

    async def entities_by_key_prefix(self, group_id: str, prefix: str) -> list[EntityRecord]: ...

    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool: ...


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
    # The ingestion time (T') the write of an episode is stamped with: now, except in a
    # forget's replay (each episode's original time).
    clock: Callable[[Episode], datetime] = now_for
    # Record what each write changes for the change stream (``TIDEGRAPH_CHANGES_ENABLED``).
    record_changes: bool = True

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
