"""The Python API an agent loop uses (docs/retrieval.md "Memory retrieval"): add episodes, search
the
memory, build a context string.

    async with await Memory.open() as memory:          # the embedded default, in-process
        await memory.add_episode(group_id="acme", content="Dana: we moved to the Pro plan",
                                 reference_time=datetime.now(UTC))
        print(await memory.context("which plan is Acme on?", group_ids=["acme"]))

``Memory.open(settings, via="kafka")`` produces added episodes to the input topic instead (the
workers write them; the result carries the topic, partition and offset Kafka acknowledged).
Reads always go to the configured store, scoped to the group ids the caller passes.
"""

from __future__ import annotations

import asyncio
import uuid as uuid_module
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson

from tidegraph.pipelines.runner import GroupRunner
from tidegraph.pipelines.runtime import Runtime, open_runtime
from tidegraph.recall.context import build_context
from tidegraph.recall.search import Searcher, SearchResults
from tidegraph.records.episode import Episode
from tidegraph.records.times import utcnow
from tidegraph.settings import Settings, get_settings

Via = Literal["process", "kafka"]


@dataclass(frozen=True)
class AddResult:
    """What happened to an added episode.

    ``status``: ``written`` (in-process: in the store, searchable now), ``skipped`` (already
    stored: the same id was added before), ``queued`` (Kafka acknowledged it; a worker writes
    it), ``failed`` (in-process: the chain gave up on it; ``reason`` is its dead-letter
    reason)."""

    group_id: str
    episode_id: str
    episode_uuid: str
    status: Literal["written", "skipped", "queued", "failed"]
    reason: str | None = None
    message: str | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


class Memory:
    """An agent's memory over one store: ``add_episode``, ``search``, ``context``."""

    def __init__(self, runtime: Runtime, *, via: Via = "process") -> None:
        self.runtime = runtime
        self.via = via
        self.searcher = Searcher(runtime.store, runtime.embedder, runtime.cross_encoder)
        self._runner: GroupRunner | None = None
        self._group_locks: dict[str, asyncio.Lock] = {}

    @classmethod
    async def open(
        cls,
        settings: Settings | None = None,
        *,
        via: Via = "process",
        mapping_path: str | None = None,
    ) -> Memory:
        """The memory of ``settings`` (default: the environment's, i.e. the embedded store
        under ``TIDEGRAPH_DATA_DIR``). ``via="kafka"`` sends added episodes to Kafka."""
        settings = settings or get_settings()
        runtime = await open_runtime(settings, mapping_path=mapping_path)
        return cls(runtime, via=via)

    async def __aenter__(self) -> Memory:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.runtime.close()

    # ------------------------------------------------------------------------- writing
    async def add_episode(
        self,
        *,
        group_id: str,
        content: str | dict[str, Any],
        reference_time: datetime | None = None,
        source: Literal["message", "text", "json"] = "message",
        name: str = "",
        source_description: str = "",
        episode_id: str | None = None,
    ) -> AddResult:
        """Add one episode. ``reference_time`` is when it happened (default: now);
        ``episode_id`` is your id for it (default: a new one): adding the same id again is a
        no-op, so a retry never duplicates. Invalid input raises ``InvalidEpisode`` (its
        ``reason`` says what to fix)."""
        from tidegraph.records.episode import parse_episode

        record = {
            "id": episode_id or uuid_module.uuid4().hex,
            "group_id": group_id,
            "source": source,
            "name": name,
            "source_description": source_description,
            "content": content,
            "reference_time": (reference_time or utcnow()).isoformat(),
        }
        raw = orjson.dumps(record)
        episode = parse_episode(raw)
        if self.via == "kafka":
            return await self._produce(episode, raw)
        return await self._write(episode)

    async def _write(self, episode: Episode) -> AddResult:
        if self._runner is None:
            self._runner = self.runtime.runner()
        lock = self._group_locks.setdefault(episode.group_id, asyncio.Lock())
        async with lock:  # one group's episodes in the order they were added
            [outcome] = await self._runner.run([episode])
        if outcome.failure is not None:
            return AddResult(
                episode.group_id,
                episode.id,
                episode.uuid,
                "failed",
                reason=outcome.failure.reason,
                message=outcome.failure.message,
            )
        status: Literal["written", "skipped"] = "skipped" if outcome.processed else "written"
        return AddResult(episode.group_id, episode.id, episode.uuid, status)

    async def _produce(self, episode: Episode, raw: bytes) -> AddResult:
        from tidegraph.topics.client import produce_lines

        report = await produce_lines(self.runtime.settings, [raw])
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
    async def search(
        self,
        query: str,
        *,
        group_ids: list[str],
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        include_invalid: bool = False,
        recipe: str = "combined",
        limit: int | None = None,
        centre: str | None = None,
    ) -> SearchResults:
        """Facts, entities, episodes and community summaries that answer ``query`` in the
        memory of ``group_ids``, valid at ``valid_at`` as known at ``known_at`` (both default
        to now; docs/retrieval.md "Memory retrieval" lists the recipes)."""
        return await self.searcher.search(
            query,
            group_ids,
            valid_at=valid_at,
            known_at=known_at,
            include_invalid=include_invalid,
            recipe=recipe,
            limit=limit,
            centre=centre,
        )

    async def context(
        self,
        query: str,
        *,
        group_ids: list[str],
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        recipe: str = "combined",
        max_chars: int = 4000,
        episodes: bool = True,
    ) -> str:
        """The context string for the agent's prompt (docs/retrieval.md "Memory retrieval": the
        template), within ``max_chars``."""
        results = await self.search(
            query, group_ids=group_ids, valid_at=valid_at, known_at=known_at, recipe=recipe
        )
        return build_context(results, max_chars=max_chars, episodes=episodes)
