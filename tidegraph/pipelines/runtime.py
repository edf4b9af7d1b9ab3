"""Opens the configured components (store, embedder, LLM, mappings) once per process.

The CLI, the demo and the Faust worker all start from here, so one process has exactly one
store connection, one embedder and one LLM client (hence one global rate limiter); the steps
the group runner runs are built from ``Runtime.components``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tidegraph.embed import make_embedder
from tidegraph.embed.base import Embedder
from tidegraph.llm import LLMClient
from tidegraph.pipelines.outage import StoreOutage, store_outage
from tidegraph.pipelines.retry import RetryPolicy
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.processors.mapping import MappingSet
from tidegraph.processors.steps import Components
from tidegraph.recall.crossencoder import CrossEncoder, cross_encoder_from_settings
from tidegraph.settings import Settings
from tidegraph.stores import GraphStore, open_store


@dataclass
class Runtime:
    settings: Settings
    store: GraphStore
    embedder: Embedder
    llm: LLMClient | None
    mappings: MappingSet | None
    components: Components
    # Whether the store answers, for every runner, hop and timer of the process
    # (tidegraph.pipelines.outage): records wait for it up to TIDEGRAPH_STORE_OUTAGE_LIMIT_SECONDS.
    outage: StoreOutage
    cross_encoder: CrossEncoder | None = None  # the optional reranker (TIDEGRAPH_RERANK_*)

    def runner(self, policy: RetryPolicy | None = None) -> GroupRunner:
        """The group runner of this process, over these components (``policy``: its retries
        of transient failures; default ``RetryPolicy()``)."""
        return GroupRunner(
            self.components,
            policy=policy,
            record_timeout=self.settings.record_timeout_seconds,
            outage=self.outage,
        )

    async def close(self) -> None:
        await self.outage.close()
        if self.llm is not None:
            await self.llm.close()
        if self.cross_encoder is not None:
            await self.cross_encoder.close()
        await self.embedder.close()
        await self.store.close()


async def open_runtime(
    settings: Settings,
    *,
    mapping_path: Path | str | None = None,
    store: GraphStore | None = None,
    embedder: Embedder | None = None,
    llm: LLMClient | None = None,
    use_llm: bool = True,
) -> Runtime:
    """Open and set up everything; ``mapping_path``, ``store``, ``embedder`` and ``llm``
    override the settings (the mapping file defaults to ``TIDEGRAPH_MAPPINGS``)."""
    embedder = embedder or make_embedder(settings)
    store = store or open_store(settings)
    await store.setup(embedder.dim, embedder.model_name)
    if llm is None and use_llm:
        llm = LLMClient.from_settings(settings)
    mapping_path = mapping_path or settings.mappings
    mappings = MappingSet.load(mapping_path) if mapping_path else None
    components = Components.of(
        store=store,
        embedder=embedder,
        llm=llm,
        mappings=mappings,
        context_episodes=settings.context_episodes,
        episodes_per_call=settings.llm_episodes_per_call,
        embed_mapped_content=settings.embed_mapped_content,
    )
    components.record_changes = settings.changes_enabled
    outage = store_outage(
        store,
        hold_seconds=settings.store_outage_limit_seconds,
        what=f"Neo4j at {settings.neo4j_uri}" if settings.store == "neo4j" else "the store",
    )
    return Runtime(
        settings,
        store,
        embedder,
        llm,
        mappings,
        components,
        outage,
        cross_encoder_from_settings(settings),
    )
