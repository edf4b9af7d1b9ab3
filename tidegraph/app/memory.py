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
import time
import uuid as uuid_module
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tidegraph.app.browse import (
    EPISODE_STATUSES,
    MAX_PAGE,
    ChangePage,
    EpisodeDetailView,
    EpisodePage,
    EpisodeView,
    ForgetResult,
    GroupView,
    episode_cursor,
    read_episode_cursor,
)
from tidegraph.embed import make_embedder
from tidegraph.embed.base import Embedder
from tidegraph.recall.context import build_context
from tidegraph.recall.crossencoder import cross_encoder_from_settings
from tidegraph.recall.rerank import CrossEncoder
from tidegraph.recall.search import Searcher, SearchResults
from tidegraph.records import jsontext
from tidegraph.records.episode import Episode, parse_episode
from tidegraph.records.forget import ForgetRequest
from tidegraph.records.graph import EntityRecord, FactView
from tidegraph.records.search import SearchRequest
from tidegraph.records.times import utc, utcnow
from tidegraph.settings import Settings, get_settings
from tidegraph.stores import GraphStore, open_store

if TYPE_CHECKING:
    from tidegraph.pipelines.runner import GroupRunner
    from tidegraph.pipelines.runtime import Runtime

Via = Literal["process", "kafka"]
CHANGE_POLL_SECONDS = 0.1  # a long poll's first look again; doubles up to a second


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
        found = await store.open_existing(embedder.dim, embedder.model_name)
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
        self.searcher = Searcher(parts.store.search, parts.embedder, parts.cross_encoder)
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
        report = await produce_lines(self.settings, [raw], store=self.store)
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
        return await self.store.browse.query_facts(
            group_id, valid_at=valid_at, known_at=known_at, include_invalid=include_invalid
        )

    async def entities(self, group_id: str) -> list[EntityRecord]:
        """The group's entities."""
        return await self.store.browse.list_entities(group_id)

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

    # ------------------------------------------------------------------------- lifecycle
    async def forget(self, request: ForgetRequest, *, dry_run: bool = False) -> ForgetResult:
        """Take episodes out of the memory (docs/architecture.md "Forgetting"): the named
        episodes, every episode mentioning a subject (an entity uuid, key or exact name: see
        ``find_subject``), or the whole group. In this process the graph afterwards is the one
        the remaining episodes give; ``via="kafka"`` puts a forget record on the input topic
        (the worker that owns the group runs it in the group's order). ``dry_run`` says what
        would go and writes nothing. Raises ``ForgetError`` when it cannot be done."""
        from tidegraph.pipelines.forget import forget as forget_in_store

        if request.subject is not None:
            request = request.model_copy(
                update={"subject": await self.find_subject(request.group_id, request.subject)}
            )
        if self.via == "kafka" and not dry_run:
            return await self._produce_forget(request)
        if self._runner is None:
            self._runner = self.runtime.runner()
        lock = self._group_locks.setdefault(request.group_id, asyncio.Lock())
        async with lock:  # after the group's adds in this process, before the next ones
            grouped = not dry_run and bool(
                await self.store.communities.list_communities(request.group_id)
            )
            report = await forget_in_store(self._runner, request, dry_run=dry_run)
            if grouped and (report.entities_removed or report.entities_changed):
                await self._regroup(request.group_id)
        return ForgetResult(
            request.group_id,
            "dry_run" if dry_run else "forgotten",
            report.episodes,
            report.forgotten,
            report.facts_removed,
            report.facts_changed,
            report.entities_removed,
            report.entities_changed,
        )

    async def find_subject(self, group_id: str, subject: str) -> str:
        """The uuid of the group's entity ``subject`` names: its uuid, its key (a mapping's
        ``key``, e.g. ``crm:contact:7``) or its exact name (letter case and spacing aside);
        ``ForgetError`` when none or several match."""
        from tidegraph.pipelines.forget import ForgetError
        from tidegraph.records.ids import normalize_name

        entities = await self.store.browse.list_entities(group_id)
        for rule in (
            lambda e: e.uuid == subject,
            lambda e: e.key is not None and e.key == subject,
            lambda e: normalize_name(e.name) == normalize_name(subject),
        ):
            found = [e for e in entities if rule(e)]
            if len(found) == 1:
                return found[0].uuid
            if len(found) > 1:
                named = ", ".join(f"{e.name} ({e.uuid})" for e in found[:5])
                raise ForgetError(
                    f"{subject!r} names {len(found)} entities of group {group_id!r}: {named}; "
                    "give the uuid of the one to forget"
                )
        raise ForgetError(f"group {group_id!r} has no entity {subject!r} (uuid, key or name)")

    async def _regroup(self, group_id: str) -> None:
        """The group's communities again, once a forget removed the ones whose members it
        changed (their names and summaries may have carried what was forgotten)."""
        from tidegraph.pipelines.community_service import CommunityService

        runtime = self.runtime
        await CommunityService(runtime.store, runtime.llm, runtime.embedder).refresh(
            group_id, trigger="forget"
        )

    async def _produce_forget(self, request: ForgetRequest) -> ForgetResult:
        from tidegraph.topics.client import produce_lines

        body = request.model_dump(mode="json", exclude_defaults=True)
        report = await produce_lines(self.settings, [jsontext.dumps({"forget": body})])
        if report.refused:
            raise RuntimeError(f"Kafka refused the forget request: {report.refused[0][1]}")
        sent = report.sent[0]
        return ForgetResult(
            request.group_id,
            "queued",
            list(request.episode_ids),
            topic=report.topic,
            partition=sent.partition,
            offset=sent.offset,
        )

    async def episodes(
        self,
        group_id: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        content: bool = False,
    ) -> EpisodePage:
        """The group's episodes by event time (``reference_time``; a tombstone by when it was
        forgotten), a page at a time: ``status`` one of written, not_extracted, forgotten,
        dead_lettered (read from the Kafka dead-letter topic) or None (the stored ones);
        ``cursor`` the previous page's ``next_cursor``. ``BadCursor`` or ``ValueError``
        for a cursor or status not of this listing."""
        if status is not None and status not in EPISODE_STATUSES:
            raise ValueError(f"status: one of {', '.join(EPISODE_STATUSES)}, not {status!r}")
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit: 1 to {MAX_PAGE}, not {limit}")
        after = read_episode_cursor(cursor, group_id) if cursor else None
        if status == "dead_lettered":
            return await self._dead_lettered(group_id, since, until, after, limit)
        entries = await self.store.browse.list_episodes(
            group_id, since=since, until=until, status=status, after=after, limit=limit + 1
        )
        page = entries[:limit]
        more = len(entries) > limit
        return EpisodePage(
            group_id,
            status,
            [EpisodeView.of(e, content=content) for e in page],
            episode_cursor(group_id, page[-1]) if more else None,
        )

    async def _dead_lettered(
        self,
        group_id: str,
        since: datetime | None,
        until: datetime | None,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> EpisodePage:
        """The group's dead letters whose episode is not in the store (written or forgotten
        since), by when they failed."""
        from tidegraph.records.graph import EpisodeEntry
        from tidegraph.topics.client import read_dead_letters

        letters = [s.letter for s in await read_dead_letters(self.settings, groups=[group_id])]
        uuids = sorted({x.episode_uuid for x in letters if x.episode_uuid})
        statuses = await self.store.episode_statuses(group_id, uuids) if uuids else {}
        views: dict[str, tuple[datetime, EpisodeEntry, EpisodeView]] = {}
        for letter in letters:
            uuid = letter.episode_uuid or ""
            if statuses.get(uuid, "missing") != "missing":
                continue
            at = utc(letter.failed_at)
            if (since and at < since) or (until and at >= until) or (after and (at, uuid) <= after):
                continue
            entry = EpisodeEntry(uuid, letter.episode_id or "", "", "", at, at, "written")
            view = EpisodeView(
                uuid=uuid,
                episode_id=letter.episode_id or "",
                status="dead_lettered",
                created_at=at.isoformat(),
                reason=letter.reason,
                stage=letter.stage,
                message=letter.message,
            )
            views[uuid or f"{at.isoformat()}:{len(views)}"] = (at, entry, view)  # its latest
        ordered = sorted(views.values(), key=lambda row: (row[0], row[1].uuid))
        page = ordered[:limit]
        more = len(ordered) > limit
        return EpisodePage(
            group_id,
            "dead_lettered",
            [view for _, _, view in page],
            episode_cursor(group_id, page[-1][1]) if more else None,
            source=f"Kafka topic {self.settings.topic_prefix}.dlq",
        )

    async def episode(self, group_id: str, episode_id: str) -> EpisodeDetailView | None:
        """One episode of the group (by your id, or its uuid) and what it produced: the
        entities it mentions and the facts it supports; None when the group has none such."""
        from tidegraph.records.ids import stable_uuid

        for uuid in dict.fromkeys([stable_uuid("episode", group_id, episode_id), episode_id]):
            detail = await self.store.browse.episode_detail(group_id, uuid)
            if detail is None:
                continue
            entities = await self.store.entities_by_uuids(group_id, detail.mentions)
            touching = await self.store.facts_touching(group_id, detail.mentions)
            facts = sorted(
                (f for f in touching if uuid in f.episodes),
                key=lambda f: (f.valid_at is None, f.valid_at, f.uuid),
            )
            return EpisodeDetailView(
                EpisodeView.of(detail.entry, content=True),
                sorted(entities, key=lambda e: (e.name, e.uuid)),
                facts,
            )
        return None

    async def groups(self, allowed: Iterable[str] | None = None) -> list[GroupView]:
        """The groups a caller may read (``allowed``; None: every group the store has
        written) with what each holds."""
        logs = {log.group_id: log for log in await self.store.outbox.change_logs(
            None if allowed is None else sorted(set(allowed))
        )}  # fmt: skip
        names = sorted(logs) if allowed is None else sorted(set(allowed))
        views = []
        for group_id in names:
            counts = await self.store.browse.counts(group_id)
            log = logs.get(group_id)
            views.append(
                GroupView(
                    group_id,
                    counts.get("episodes", 0),
                    counts.get("entities", 0),
                    counts.get("facts", 0),
                    log.seq if log else 0,
                )
            )
        return views

    async def changes(
        self, group_id: str, *, after: int = 0, limit: int = 100, wait_seconds: float = 0.0
    ) -> ChangePage:
        """The group's changes after the cursor ``after`` (a seq), in commit order, at most
        ``limit``; with ``wait_seconds``, waits up to that long for the first one (a long
        poll: the answer comes as soon as a change is committed)."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit: 1 to {MAX_PAGE}, not {limit}")
        if after < 0:
            raise ValueError(f"after: a cursor is a change's seq (0 or more), not {after}")
        deadline = time.monotonic() + max(0.0, wait_seconds)
        pause = CHANGE_POLL_SECONDS
        while True:
            found = await self.store.outbox.changes(group_id, after, limit)
            left = deadline - time.monotonic()
            if found or left <= 0:
                return ChangePage(group_id, found, found[-1].seq if found else after)
            await asyncio.sleep(min(pause, left))  # the store is the only source of truth
            pause = min(pause * 2, 1.0)

    async def prune_changes(self) -> int:
        """Drop the outbox's changes past their retention (TIDEGRAPH_CHANGES_RETENTION_HOURS)
        in the groups of this deployment; through Kafka only those the workers' relay has
        published. How many went."""
        from tidegraph.pipelines.outbox import prune_outbox

        groups = [log.group_id for log in await self.store.outbox.change_logs(own=True)]
        return await prune_outbox(
            self.store.outbox,
            groups,
            self.settings.changes_retention_hours,
            published_only=self.via == "kafka",
        )
