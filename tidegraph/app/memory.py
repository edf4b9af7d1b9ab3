"""The Python API an agent loop uses (docs/retrieval.md "Memory retrieval"): add episodes, search
the memory, build a context string, list facts and entities.

    from tidegraph import Memory, SearchRequest

    async with await Memory.open() as memory:          # the embedded default, in-process
        await memory.add_episode(group_id="acme", content="Dana: we moved to the Pro plan",
                                 reference_time=datetime.now(UTC))
        ask = SearchRequest(query="which plan is Acme on?", group_ids=["acme"])
        print(await memory.context(ask))

``Memory.open(settings, via="kafka")`` produces added episodes to the input topic instead (the
workers write them; the result carries the topic, partition and offset Kafka acknowledged).
``Memory.open(settings, read_only=True)`` opens only what reads need (the store as it is, the
embedder, the optional cross-encoder): no LLM client, no mapping, nothing created; a store
that does not exist yet raises ``NoStore``. Reads always go to the configured store, scoped to
the group ids the caller passes.
"""

from __future__ import annotations

import asyncio
import uuid as uuid_module
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tidegraph.embed import make_embedder
from tidegraph.embed.base import Embedder
from tidegraph.recall.context import build_context
from tidegraph.recall.crossencoder import cross_encoder_from_settings
from tidegraph.recall.rerank import CrossEncoder
from tidegraph.recall.search import Searcher, SearchResults
from tidegraph.records import jsontext
from tidegraph.records.episode import Episode, parse_episode
from tidegraph.records.graph import EntityRecord, FactView
from tidegraph.records.search import SearchRequest
from tidegraph.records.times import utcnow
from tidegraph.settings import Settings, get_settings
from tidegraph.stores import GraphStore, open_store

if TYPE_CHECKING:
    from tidegraph.pipelines.runner import GroupRunner
    from tidegraph.pipelines.runtime import Runtime

Via = Literal["process", "kafka"]


def new_episode_id() -> str:
    """The id of an episode added without one (a retry of it would add it again)."""
    return uuid_module.uuid4().hex


class NoStore(LookupError):
    """A read-only open found no graph at the configured place (nothing was added there)."""


class ReadOnlyMemory(RuntimeError):
    """An add on a memory opened with ``read_only=True``."""


@dataclass(frozen=True)
class AddResult:
    """What happened to an added episode.

    ``status``: ``written`` (in-process: in the store, searchable now), ``skipped`` (already
    stored: the same id was added before), ``queued`` (Kafka acknowledged it; a worker writes
    it), ``failed`` (in-process: the chain gave up on it; ``reason`` is its dead-letter
    reason). ``not_extracted``: written as an episode (searchable) but without entities and
    facts yet, and why (``no_llm``: text needs an LLM; ``message`` says what to do)."""

    group_id: str
    episode_id: str
    episode_uuid: str
    status: Literal["written", "skipped", "queued", "failed"]
    reason: str | None = None
    message: str | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    not_extracted: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


NOT_EXTRACTED_HINT = (
    "stored and searchable as an episode, but no entities or facts come from it until an LLM "
    "(TIDEGRAPH_LLM_BASE_URL) or a mapping rule covers it: then run tidegraph extract --pending"
)


NO_FACTS_NOTE = (
    "no facts come from text episodes here: no LLM is configured (TIDEGRAPH_LLM_BASE_URL), so "
    "they are stored and searched as episodes only; configure one and run tidegraph extract "
    "--pending"
)


class Parts(Protocol):
    """What a memory reads through (``pipelines.runtime.Runtime`` has these and the write
    side; ``Reader`` only these)."""

    settings: Settings
    store: GraphStore
    embedder: Embedder
    cross_encoder: CrossEncoder | None

    async def close(self) -> None: ...


@dataclass
class Reader:
    """The read side alone: the store as it is, the embedder and the optional reranker."""

    settings: Settings
    store: GraphStore
    embedder: Embedder
    cross_encoder: CrossEncoder | None = None

    async def close(self) -> None:
        if self.cross_encoder is not None:
            await self.cross_encoder.close()
        await self.embedder.close()
        await self.store.close()


async def open_reader(settings: Settings) -> Reader:
    """The configured store opened for reading (``GraphStore.open_existing``); ``NoStore``
    when nothing was ever written there."""
    embedder = make_embedder(settings)
    store = open_store(settings)
    try:
        found = await store.open_existing(embedder.dim)
    except BaseException:
        await store.close()
        raise
    if not found:
        await store.close()
        raise NoStore(_no_store_message(settings))
    return Reader(settings, store, embedder, cross_encoder_from_settings(settings))


def _no_store_message(settings: Settings) -> str:
    if settings.store == "neo4j":
        return (
            f"no tidegraph graph in Neo4j at {settings.neo4j_uri} (database "
            f"{settings.neo4j_database!r}): nothing was added there yet"
        )
    return (
        f"no tidegraph store in {settings.data_dir.resolve()}: nothing was added there yet (point "
        "--data-dir or TIDEGRAPH_DATA_DIR at the folder you ingested into)"
    )


class Memory:
    """An agent's memory over one store: ``add_episode``, ``search``, ``context``, ``facts``,
    ``entities``."""

    def __init__(self, parts: Parts, *, via: Via = "process") -> None:
        self.parts = parts
        self.settings = parts.settings
        self.store = parts.store
        self.via = via
        self.searcher = Searcher(parts.store, parts.embedder, parts.cross_encoder)
        self._runner: GroupRunner | None = None
        self._group_locks: dict[str, asyncio.Lock] = {}

    @classmethod
    async def open(
        cls,
        settings: Settings | None = None,
        *,
        via: Via = "process",
        mapping_path: str | None = None,
        read_only: bool = False,
    ) -> Memory:
        """The memory of ``settings`` (default: the environment's, i.e. the embedded store
        under ``TIDEGRAPH_DATA_DIR``). ``via="kafka"`` sends added episodes to Kafka;
        ``read_only`` opens the read side alone (see the module docstring)."""
        settings = settings or get_settings()
        if read_only:
            return cls(await open_reader(settings))
        from tidegraph.pipelines.runtime import open_runtime

        return cls(await open_runtime(settings, mapping_path=mapping_path), via=via)

    @property
    def read_only(self) -> bool:
        return isinstance(self.parts, Reader)

    @property
    def runtime(self) -> Runtime:
        """The write side (store, embedder, LLM, mappings, the chain's components)."""
        from tidegraph.pipelines.runtime import Runtime

        if not isinstance(self.parts, Runtime):
            raise ReadOnlyMemory("this memory was opened read-only: it has no write side")
        return self.parts

    async def __aenter__(self) -> Memory:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.parts.close()

    # ------------------------------------------------------------------------- writing
    async def add_episode(
        self,
        *,
        group_id: str,
        content: str | dict[str, Any],
        reference_time: datetime | None = None,
        source: Literal["message", "text", "json"] | None = None,
        name: str = "",
        source_description: str = "",
        episode_id: str | None = None,
    ) -> AddResult:
        """Add one episode. ``reference_time`` is when it happened (default: now);
        ``episode_id`` is your id for it (default: a new one): adding the same id again is a
        no-op, so a retry never duplicates; ``source`` defaults to ``json`` for an object and
        ``message`` for text. Invalid input raises ``InvalidEpisode`` (its ``reason`` says
        what to fix)."""
        record: dict[str, Any] = {
            "id": episode_id or new_episode_id(),
            "group_id": group_id,
            "name": name,
            "source_description": source_description,
            "content": content,
            "reference_time": (reference_time or utcnow()).isoformat(),
        }
        if source is not None:
            record["source"] = source
        return await self.add(parse_episode(record))

    async def add(self, episode: Episode) -> AddResult:
        """Add an episode already read (``parse_episode``): written in this process, or sent
        to Kafka (``via="kafka"``)."""
        if self.read_only:
            raise ReadOnlyMemory("this memory was opened read-only: open it without read_only")
        if self.via == "kafka":
            return await self._produce(episode)
        return await self._write(episode)

    async def _write(self, episode: Episode) -> AddResult:
        if self._runner is None:
            self._runner = self.runtime.runner()
        lock = self._group_locks.setdefault(episode.group_id, asyncio.Lock())
        async with lock:  # one group's episodes in the order they were added
            [outcome] = await self._runner.run([episode])
        ids = (episode.group_id, episode.id, episode.uuid)
        if outcome.failure is not None:
            failure = outcome.failure
            return AddResult(*ids, "failed", reason=failure.reason, message=failure.message)
        if outcome.processed:
            return AddResult(*ids, "skipped")
        if outcome.not_extracted is not None:
            return AddResult(
                *ids, "written", not_extracted=outcome.not_extracted, message=NOT_EXTRACTED_HINT
            )
        return AddResult(*ids, "written")

    async def _produce(self, episode: Episode) -> AddResult:
        from tidegraph.topics.client import produce_lines

        raw = jsontext.dumps(episode.model_dump(mode="json"))
        report = await produce_lines(self.settings, [raw])
        if report.refused:
            raise RuntimeError(f"Kafka refused the episode: {report.refused[0][1]}")
        sent = report.sent[0]
        return AddResult(
            episode.group_id,
            episode.id,
            episode.uuid,
            "queued",
            topic=report.topic,
            partition=sent.partition,
            offset=sent.offset,
        )

    # ------------------------------------------------------------------------- reading
    async def search(self, request: SearchRequest) -> SearchResults:
        """Facts, entities, episodes and community summaries that answer the request
        (docs/retrieval.md "Memory retrieval" lists the recipes)."""
        return await self.searcher.search(request)

    async def context(
        self, request: SearchRequest, *, max_chars: int = 4000, episodes: bool = True
    ) -> str:
        """The context string for the agent's prompt (docs/retrieval.md "Memory retrieval": the
        template), within ``max_chars``; ``episodes``: with episode excerpts."""
        results = await self.search(request)
        return build_context(results, max_chars=max_chars, episodes=episodes)

    async def facts(
        self,
        group_id: str,
        *,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        include_invalid: bool = False,
    ) -> list[FactView]:
        """The group's facts valid at ``valid_at`` as believed at ``known_at`` (both default
        to now; ``include_invalid``: every fact, valid or not)."""
        return await self.store.query_facts(
            group_id, valid_at=valid_at, known_at=known_at, include_invalid=include_invalid
        )

    async def entities(self, group_id: str) -> list[EntityRecord]:
        """The group's entities."""
        return await self.store.list_entities(group_id)

    async def missing_facts_note(self, results: SearchResults) -> str | None:
        """Why a search found no facts, when it is that no LLM extracts these groups' episodes
        (they are stored and searched as episodes; no facts come from them yet)."""
        if results.facts:
            return None
        has_llm = (
            bool(self.settings.llm_base_url) if self.read_only else self.runtime.llm is not None
        )
        if has_llm:
            return None
        for group_id in results.scope.group_ids:
            if await self.store.pending_episodes(group_id, 1):
                return NO_FACTS_NOTE
        return None
