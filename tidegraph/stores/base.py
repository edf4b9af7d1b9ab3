"""The graph store: the write path's interface (``GraphStore``), holding the store's other
roles (``tidegraph.stores.roles``: search, browsing, outbox, forgetting, communities) as
attributes. Neo4j, the embedded store and the memory store implement them identically
(docs/architecture.md "Store roles").

Rules every implementation of every role keeps:
- every read and write is scoped by ``group_id`` (no call ever touches another group's data);
- names, labels, relation types and any other user/LLM text travel only as query
  parameters, never as query text (labels that must become real node labels are checked
  against ``tidegraph.records.ids.LABEL_RE`` first);
- writes are idempotent: MERGE by deterministic uuid, ``created_at`` only on create,
  ``expired_at`` only when still null;
- datetimes go in and come out as aware UTC ``datetime``.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass
from datetime import datetime

from tidegraph.records.graph import (
    EntityLookup,
    EntityRecord,
    EpisodeRecord,
    EpisodeWrite,
    FactRecord,
)
from tidegraph.settings import DEFAULT_TOPIC_PREFIX
from tidegraph.stores.roles import Browsing, Communities, Forgetting, Keys, Outbox, Search
from tidegraph.stores.rows import unique


@dataclass(frozen=True)
class LookupRequest:
    """What ``lookup_entities`` asks, its lists without duplicates (see there)."""

    keys: list[str]
    names: list[str]
    episode_uuid: str | None
    content_hash: str | None
    relations: list[str] | None


@dataclass(frozen=True)
class BatchRead:
    """What a batch of one group's mapped episodes reads before it is processed
    (``read_batch``): the entities of its keys and names with their facts of its relations,
    and the processed markers of its episodes."""

    lookup: EntityLookup
    markers: dict[str, list[str]]


class BatchWriteError(Exception):
    """``write_episodes`` failed at one of its writes: ``written`` holds the results of the
    writes before it, which are committed (empty where the batch is one transaction), and
    ``__cause__`` the error."""

    def __init__(self, written: list[bool]) -> None:
        super().__init__(f"batch write failed after {len(written)} writes")
        self.written = written


class GraphStore(abc.ABC):
    """Async graph store: setup and close, the write path, and the other roles as attributes.
    All methods are group-scoped; see the module docstring."""

    name: str = "store"
    # The deployment the store writes for (its topic prefix, given when it is opened): the
    # change logs of the groups it writes name it, and its relay publishes only those.
    deployment: str = DEFAULT_TOPIC_PREFIX
    # The store's other roles (``tidegraph.stores.roles``), each over the same connection.
    outbox: Outbox
    forget: Forgetting
    browse: Browsing
    communities: Communities
    search: Search
    keys: Keys

    # ---------------------------------------------------------------- lifecycle
    @abc.abstractmethod
    async def setup(self, embedding_dim: int, embedding_model: str | None = None) -> None:
        """Create constraints and indexes idempotently (vector indexes of ``embedding_dim``).

        Raises a clear error if existing vector indexes have another dimension, or
        (``StoreSchemaError``, saying how to switch) if the store records that another
        ``embedding_model`` made its vectors: a store that records none yet records this one.
        Stores that keep no model name (Neo4j, the in-memory store) check the dimension only."""

    async def open_existing(self, embedding_dim: int, embedding_model: str | None = None) -> bool:
        """Use the graph already there, to read it: False when there is none (nothing is
        created or changed), True when there is one (its vectors checked as ``setup`` checks
        them). Stores without a place of their own set themselves up."""
        await self.setup(embedding_dim, embedding_model)
        return True

    @abc.abstractmethod
    async def close(self) -> None: ...

    # ---------------------------------------------------------------- episodes
    async def episode_processed(
        self, group_id: str, episode_uuid: str, content_hash: str | None = None
    ) -> bool:
        """True once ``write_episode`` committed this episode extracted (the processed
        marker; an episode stored without extraction is not processed yet). With
        ``content_hash``, an episode stored with another hash raises EpisodeConflictError
        (its id was reused for other content)."""
        return await self._episode_marker(group_id, episode_uuid, content_hash) is not None

    @abc.abstractmethod
    async def _episode_marker(
        self, group_id: str, episode_uuid: str, content_hash: str | None = None
    ) -> list[str] | None:
        """The uuids of the entities the processed episode created (``EpisodeWrite.created``,
        stored on its marker; empty for episodes stored before they were), or None when the
        episode is not processed. EpisodeConflictError as ``episode_processed``."""

    async def episode_markers(
        self, group_id: str, episodes: list[tuple[str, str | None]]
    ) -> dict[str, list[str]]:
        """``_episode_marker`` of each (uuid, content hash): the processed ones only, by uuid.
        EpisodeConflictError as there."""
        found: dict[str, list[str]] = {}
        for uuid, content_hash in episodes:
            created = await self._episode_marker(group_id, uuid, content_hash)
            if created is not None:
                found[uuid] = created
        return found

    async def read_batch(
        self,
        group_id: str,
        keys: list[str],
        names: list[str],
        relations: list[str],
        episodes: list[tuple[str, str | None]],
        facts_from: datetime | None = None,
    ) -> BatchRead:
        """``lookup_entities(group_id, keys, names, relations=relations)`` and
        ``episode_markers(group_id, episodes)``, in one round trip where the store can (on
        Neo4j one statement, shared with the other groups' batch reads waiting at the same
        moment). ``facts_from``: the facts that ended before it are left out
        (``FactRecord.ended_before``). EpisodeConflictError as ``episode_markers``."""
        lookup = await self.lookup_entities(group_id, keys, names, None, relations)
        if facts_from is not None and lookup.facts is not None:
            lookup.facts = [f for f in lookup.facts if not f.ended_before(facts_from)]
        return BatchRead(lookup, await self.episode_markers(group_id, episodes))

    @abc.abstractmethod
    async def episode_status(self, group_id: str, episode_uuid: str) -> str:
        """``missing`` (not stored in the group), ``not_extracted`` (stored, searchable, not
        extracted yet: docs/architecture.md "Episodes without an LLM"), ``processed`` or
        ``forgotten`` (a tombstone)."""

    async def episode_statuses(self, group_id: str, episode_uuids: list[str]) -> dict[str, str]:
        """``episode_status`` of each uuid, in one read where the store can."""
        return {uuid: await self.episode_status(group_id, uuid) for uuid in episode_uuids}

    @abc.abstractmethod
    async def pending_episodes(self, group_id: str, limit: int) -> list[EpisodeRecord]:
        """Up to ``limit`` of the group's episodes stored without extraction, in event order
        (``valid_at``, then producer id)."""

    @abc.abstractmethod
    async def pending_groups(self) -> list[str]:
        """The groups with episodes stored without extraction (an operator's view: every
        tenant; `tidegraph extract --pending` and the worker's sweep)."""

    @abc.abstractmethod
    async def recent_episodes(
        self, group_id: str, before: datetime, limit: int
    ) -> list[EpisodeRecord]:
        """Up to ``limit`` episodes with ``valid_at < before``, oldest first."""

    async def recent_episodes_before(
        self, group_id: str, befores: list[datetime], limit: int
    ) -> list[list[EpisodeRecord]]:
        """``recent_episodes`` for each of ``befores``, in order (a store with round trips
        answers them in one)."""
        return [await self.recent_episodes(group_id, before, limit) for before in befores]

    # ---------------------------------------------------------------- entities
    @abc.abstractmethod
    async def entities_by_names(self, group_id: str, names: list[str]) -> list[EntityRecord]:
        """Entities whose normalised name or one of whose aliases is in ``names``
        (already normalised with ``tidegraph.records.ids.normalize_name``)."""

    @abc.abstractmethod
    async def entities_by_keys(self, group_id: str, keys: list[str]) -> list[EntityRecord]:
        """Entities whose stable external ``key`` is in ``keys``."""

    @abc.abstractmethod
    async def entities_by_key_prefix(self, group_id: str, prefix: str) -> list[EntityRecord]:
        """Entities whose stable external ``key`` starts with ``prefix`` (the rows of one
        table, as its mapping keys them: what a truncate closes)."""

    @abc.abstractmethod
    async def entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]: ...

    async def entity_names(self, group_id: str, uuids: list[str]) -> dict[str, str]:
        """{uuid: name} of the group's entities among ``uuids``."""
        return {e.uuid: e.name for e in await self.entities_by_uuids(group_id, uuids)}

    @abc.abstractmethod
    async def fulltext_entities(
        self, group_id: str, text: str, limit: int
    ) -> list[tuple[EntityRecord, float]]:
        """Entities matching ``text`` (plain user text, escaped by the store) on name and
        summary, best first, with the engine's score."""

    @abc.abstractmethod
    async def vector_entities(
        self, group_id: str, embedding: list[float], limit: int
    ) -> list[tuple[EntityRecord, float]]:
        """Nearest entities by name embedding (cosine similarity in [0, 1]), best first."""

    async def entity_candidates(
        self, group_id: str, searches: list[tuple[str, list[float]]], limit: int
    ) -> list[tuple[list[tuple[EntityRecord, float]], list[tuple[EntityRecord, float]]]]:
        """For each (name, name embedding): ``vector_entities(embedding, limit)`` and
        ``fulltext_entities(name, limit)``, all at once (on Neo4j in two round trips for a
        group small enough to be scanned)."""
        found = await asyncio.gather(
            *(self.vector_entities(group_id, embedding, limit) for _, embedding in searches),
            *(self.fulltext_entities(group_id, name, limit) for name, _ in searches),
        )
        n = len(searches)
        return list(zip(found[:n], found[n:], strict=True))

    async def lookup_entities(
        self,
        group_id: str,
        keys: list[str],
        names: list[str],
        episode_uuid: str | None = None,
        relations: list[str] | None = None,
        content_hash: str | None = None,
    ) -> EntityLookup:
        """``entities_by_keys(keys)`` and ``entities_by_names(names)`` (without name
        embeddings) and, when ``episode_uuid`` is given, ``_episode_marker`` (with
        ``content_hash``, as there: a processed episode answers with its created entities and
        nothing else); with ``relations``, the found entities' facts of those relations too
        (see ``EntityLookup``) — in one round trip where the store can."""
        ask = LookupRequest(
            keys=unique(keys),
            names=unique(names),
            episode_uuid=episode_uuid,
            content_hash=content_hash,
            relations=None if relations is None else unique(relations),
        )
        return await self._lookup(group_id, ask)

    async def _lookup(self, group_id: str, ask: LookupRequest) -> EntityLookup:
        """``lookup_entities`` from the other methods (up to four calls)."""
        if ask.episode_uuid:
            created = await self._episode_marker(group_id, ask.episode_uuid, ask.content_hash)
            if created is not None:
                return EntityLookup(processed=True, created_entities=created)
        by_key = await self.entities_by_keys(group_id, ask.keys) if ask.keys else []
        by_name = await self.entities_by_names(group_id, ask.names) if ask.names else []
        lookup = EntityLookup(
            by_key=_without_embeddings(by_key), by_name=_without_embeddings(by_name)
        )
        if ask.relations is not None:
            sources = sorted({e.uuid for e in [*by_key, *by_name]})
            pairs = [(source, relation) for source in sources for relation in ask.relations]
            lookup.facts = (
                await self.fact_candidates(group_id, pairs, [], embeddings=False) if pairs else []
            )
        return lookup

    # ---------------------------------------------------------------- facts
    @abc.abstractmethod
    async def facts_touching(self, group_id: str, entity_uuids: list[str]) -> list[FactRecord]:
        """Every fact (open or closed) with its source or target in ``entity_uuids``."""

    async def fact_candidates(
        self,
        group_id: str,
        pairs: list[tuple[str, str]],
        ends: list[str],
        *,
        embeddings: bool = True,
    ) -> list[FactRecord]:
        """The facts (open or closed) whose (source uuid, relation name) is in ``pairs``, and
        those with their source or target in ``ends``; ordered like ``facts_touching``.
        ``embeddings=False``: without ``fact_embedding`` (cheaper where it is not compared)."""
        if not pairs and not ends:
            return []
        return await self._fact_candidates(group_id, sorted(set(pairs)), unique(ends), embeddings)

    async def _fact_candidates(
        self, group_id: str, pairs: list[tuple[str, str]], ends: list[str], embeddings: bool
    ) -> list[FactRecord]:
        """``fact_candidates`` from ``facts_touching``."""
        wanted = set(pairs)
        touched = set(ends)
        read = sorted(touched | {source for source, _ in wanted})
        found = [
            f
            for f in await self.facts_touching(group_id, read)
            if (f.source_uuid, f.name) in wanted or {f.source_uuid, f.target_uuid} & touched
        ]
        if embeddings:
            return found
        return [f.model_copy(update={"fact_embedding": None}) for f in found]

    @abc.abstractmethod
    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        """One transaction: the entity upserts (MERGE by uuid, ``write_rules.merged_entity``),
        then MERGE the Episodic node (the processed marker), its MENTIONS, the facts (MERGE by
        uuid, then SET the given state except ``created_at`` which only applies on create,
        ``expired_at`` which is only set while null and ``fact_embedding`` which a record
        without one leaves as stored), and closures (``invalid_at`` set, ``expired_at`` only
        while null).

        When the episode's marker is already stored in the group, nothing is written and the
        answer is False (a late or repeated writer of a processed episode must not reopen what
        later episodes closed); EpisodeConflictError when it was stored with another content
        hash. True when written. The marker is checked inside the write's own transaction."""

    async def write_episodes(self, group_id: str, writes: list[EpisodeWrite]) -> list[bool]:
        """``write_episode`` of each write, in order, as if one after the other (a micro-batch
        of one group: ``tidegraph.pipelines.units``). On the first failure, BatchWriteError with
        the results of the writes before it, which stay committed; a store that writes the batch
        in one transaction commits none of it then."""
        written: list[bool] = []
        for write in writes:
            try:
                written.append(await self.write_episode(group_id, write))
            except Exception as exc:
                raise BatchWriteError(written) from exc
        return written


def _without_embeddings(records: list[EntityRecord]) -> list[EntityRecord]:
    return [r.model_copy(update={"name_embedding": None, "community_uuid": None}) for r in records]
