"""An in-memory ``GraphStore``: the whole interface of ``tidegraph/stores/base.py`` and its roles
(``tidegraph/stores/roles.py``: one module each here, over this store's dictionaries),
faithful to their docstrings, with no server. It is the scratch store a forget replays a
group's remaining episodes into (``tidegraph.pipelines.forget``), and the store of the unit
tests.

It keeps the rules the steps rely on, with the helpers the Neo4j and embedded stores use
themselves (``tidegraph/stores/rows.py``, ``errors.py``,
``search_text.py``):

- every call is scoped by ``group_id``; uuids are unique across groups (the stores' uniqueness
  constraints), so a write naming another group's entity, fact or community is refused with
  ``StoreIntegrityError`` (``errors.check_write``, ``errors.check_entity_owners``,
  ``errors.check_community_owners``);
- writes are MERGEs by uuid, applied with the one definition of the write rules
  (``tidegraph.stores.write_rules``, which the batch view applies too): ``created_at`` only on
  create, ``expired_at`` only while null, a fact without an embedding or an end/start history
  keeps the stored one, entity upserts add labels and aliases, replace a non-empty summary,
  set a key while null, and never change name, created_at or name_embedding;
- ``write_episode`` checks everything before it changes anything, so it is all or nothing like
  the stores' transaction; it skips an episode whose marker is stored in the group (False) and
  raises ``EpisodeConflictError`` for one stored with another content hash;
- every read hands out copies: a caller changing a record (``plan_facts`` moves ends) changes
  nothing stored;
- ``query_facts`` and the community graph answer with ``AsOf.believed`` and ``fact_view``, as
  both stores do after their Cypher filter (``as_of_match``);
- vector searches are exact cosine, scored ``(1 + cos) / 2`` like both stores.

Writes and vector searches need ``setup(dim)`` first, as in the real stores. The search methods
(exact, brute force) are in ``search``.

One approximation: ``fulltext_entities`` finds the entities sharing a word with the text (split
and stop-word filtered by ``search_terms``, as both stores split it) in their name or summary,
scored by the number of the text's words found. Neo4j (Lucene's English analyzer) and the
embedded store (FTS5, BM25) also stem words and weigh them, so "companies" finds "Company"
there and not here, and scores and ties may rank differently.

Size: about 650 lines because it is the whole ``GraphStore`` (episodes, entities, facts,
communities, the outbox, forgetting) over one set of dicts that every method reads together;
only the search methods, which share nothing else, are apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from tidegraph.records.asof import AsOf
from tidegraph.records.changes import Change
from tidegraph.records.graph import (
    ChangeLog,
    EntityRecord,
    EpisodeRecord,
    EpisodeWrite,
    FactRecord,
)
from tidegraph.records.times import utc
from tidegraph.records.vectors import cosine
from tidegraph.settings import DEFAULT_TOPIC_PREFIX
from tidegraph.stores import errors, write_rules
from tidegraph.stores.base import GraphStore
from tidegraph.stores.memory.browse import MemoryBrowsing
from tidegraph.stores.memory.communities import MemoryCommunities
from tidegraph.stores.memory.forget import MemoryForgetting
from tidegraph.stores.memory.keys import MemoryKeys
from tidegraph.stores.memory.outbox import MemoryOutbox
from tidegraph.stores.memory.search import Entities, Facts, MemorySearch, StoredCommunity
from tidegraph.stores.rows import (
    check_embedding,
    copied,
    cosine_score,
    entity_row,
    episode_record,
    episode_row,
    fact_row,
    now_utc,
    outbox_row,
    purged_row,
    rank,
    sort_entities,
    sort_facts,
    stored_changes,
    unique,
)
from tidegraph.stores.search_text import search_terms, text_words


class MemoryStore(GraphStore):
    """``GraphStore`` in dictionaries (see the module docstring)."""

    name = "memory"

    def __init__(self, *, deployment: str = DEFAULT_TOPIC_PREFIX) -> None:
        self.deployment = deployment
        self.outbox = MemoryOutbox(self)
        self.forget = MemoryForgetting(self)
        self.keys = MemoryKeys(self)
        self.browse = MemoryBrowsing(self)
        self.search = MemorySearch(self)
        self.communities = MemoryCommunities(self)
        self._dim: int | None = None
        self._episodes: dict[str, EpisodeRecord] = {}
        self._created: dict[str, list[str]] = {}  # episode uuid -> the entities it created
        self._entities = Entities()
        self._facts = Facts()
        self._mentions: set[tuple[str, str]] = set()  # (episode uuid, entity uuid)
        self._communities: dict[str, StoredCommunity] = {}
        self._members: set[tuple[str, str]] = set()  # HAS_MEMBER: (community uuid, entity uuid)
        # Forgotten episodes' tombstones: uuid -> (group, when); what stays of them.
        self._forgotten: dict[str, tuple[str, datetime]] = {}
        self._logs: dict[str, ChangeLog] = {}
        # per group its outbox rows in order (``rows.outbox_row``, with ``seq`` and ``last``)
        self._changes: dict[str, list[dict[str, Any]]] = {}

    # ------------------------------------------------------------------ lifecycle
    async def setup(self, embedding_dim: int, embedding_model: str | None = None) -> None:
        if embedding_dim < 1:
            raise ValueError("embedding_dim must be positive")
        if self._dim is not None and self._dim != embedding_dim:
            raise errors.StoreSchemaError(
                f"the memory store holds {self._dim}-dimensional embeddings but the embedder "
                f"produces {embedding_dim}"
            )
        self._dim = embedding_dim

    async def close(self) -> None:
        """Nothing to release."""

    def _dimension(self) -> int:
        if self._dim is None:
            raise errors.StoreSchemaError("the memory store has no schema: run setup() first")
        return self._dim

    # ------------------------------------------------------------------ episodes
    async def _episode_marker(
        self, group_id: str, episode_uuid: str, content_hash: str | None = None
    ) -> list[str] | None:
        if self._forgotten.get(episode_uuid, ("", None))[0] == group_id:
            return []  # a tombstone: processed, nothing to send again
        stored = self._episodes.get(episode_uuid)
        if stored is None or stored.group_id != group_id or stored.not_extracted is not None:
            return None
        errors.check_same_episode(episode_uuid, stored.content_hash, content_hash)
        return list(self._created.get(episode_uuid, []))

    async def episode_status(self, group_id: str, episode_uuid: str) -> str:
        if self._forgotten.get(episode_uuid, ("", None))[0] == group_id:
            return "forgotten"
        stored = self._episodes.get(episode_uuid)
        if stored is None or stored.group_id != group_id:
            return "missing"
        return "processed" if stored.not_extracted is None else "not_extracted"

    async def pending_episodes(self, group_id: str, limit: int) -> list[EpisodeRecord]:
        pending = [e for e in self._episodes.values() if e.group_id == group_id and e.not_extracted]
        pending.sort(key=lambda e: (utc(e.valid_at), e.producer_id))
        return [e.model_copy(deep=True) for e in pending[: max(limit, 0)]]

    async def pending_groups(self) -> list[str]:
        return sorted({e.group_id for e in self._episodes.values() if e.not_extracted})

    async def recent_episodes(
        self, group_id: str, before: datetime, limit: int
    ) -> list[EpisodeRecord]:
        if limit <= 0:
            return []
        cutoff = utc(before)
        earlier = [e for e in self._episodes.values() if e.group_id == group_id]
        earlier = [e for e in earlier if e.valid_at < cutoff]
        latest = sorted(earlier, key=lambda e: (e.valid_at, e.uuid))[-limit:]
        return [e.model_copy(deep=True) for e in latest]

    # ------------------------------------------------------------------ entities
    def _entity_out(self, entity: EntityRecord) -> EntityRecord:
        """A copy of a stored entity with its community (the lowest uuid, as the stores)."""
        communities = sorted(
            c
            for c, e in self._members
            if e == entity.uuid and self._communities[c].group_id == entity.group_id
        )
        community = communities[0] if communities else None
        return copied(entity, community_uuid=community)

    def _group_entities(
        self,
        group_id: str,
        keep: Callable[[EntityRecord], bool] = lambda e: True,
        among: Iterable[str] | None = None,
    ) -> list[EntityRecord]:
        """Copies of the group's entities (``among`` these uuids) that ``keep`` accepts, by
        name then uuid."""
        uuids = self._entities.by_group.get(group_id, set())
        if among is not None:
            uuids = uuids & set(among)
        return sort_entities(
            self._entity_out(e) for e in (self._entities[u] for u in uuids) if keep(e)
        )

    async def entities_by_names(self, group_id: str, names: list[str]) -> list[EntityRecord]:
        found = (u for n in set(names) for u in self._entities.by_name.get((group_id, n), ()))
        return self._group_entities(group_id, among=found)

    async def entities_by_keys(self, group_id: str, keys: list[str]) -> list[EntityRecord]:
        found = (u for k in set(keys) for u in self._entities.by_key.get((group_id, k), ()))
        return self._group_entities(group_id, among=found)

    async def entities_by_key_prefix(self, group_id: str, prefix: str) -> list[EntityRecord]:
        return self._group_entities(
            group_id, lambda e: e.key is not None and e.key.startswith(prefix)
        )

    async def entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]:
        return self._group_entities(group_id, among=uuids)

    async def fulltext_entities(
        self, group_id: str, text: str, limit: int
    ) -> list[tuple[EntityRecord, float]]:
        """Entities sharing a word with ``text`` (see the module docstring: no stemming)."""
        terms = search_terms(text)
        if not terms or limit <= 0:
            return []
        hits = []
        for entity in self._group_entities(group_id):
            found = len(set(terms) & text_words(f"{entity.name} {entity.summary}"))
            if found:
                hits.append((entity, float(found)))
        return rank(hits, limit)

    async def vector_entities(
        self, group_id: str, embedding: list[float], limit: int
    ) -> list[tuple[EntityRecord, float]]:
        vector = check_embedding(embedding, self._dimension(), "query embedding")
        if limit <= 0 or vector is None:
            return []
        hits = [
            (entity, cosine_score(cosine(entity.name_embedding, vector)))
            for entity in self._group_entities(group_id)
            if entity.name_embedding is not None
        ]
        return rank(hits, limit)

    def _owners(self, uuids: Iterable[str]) -> dict[str, str]:
        """The group of each stored entity among ``uuids``."""
        return {u: self._entities[u].group_id for u in uuids if u in self._entities}

    def _upsert(self, group_id: str, entities: list[EntityRecord], now: datetime) -> None:
        """Entity upserts applied in order (``write_rules.merged_entity``; checked before)."""
        for entity in entities:
            written = entity.model_copy(update={"group_id": group_id, "community_uuid": None})
            self._entities[entity.uuid] = write_rules.merged_entity(
                self._entities.get(entity.uuid), written, now
            )

    # ------------------------------------------------------------------ facts
    def _group_facts(self, group_id: str) -> Iterator[FactRecord]:
        return (self._facts[u] for u in self._facts.by_group.get(group_id, ()))

    async def facts_touching(self, group_id: str, entity_uuids: list[str]) -> list[FactRecord]:
        found = {u for e in entity_uuids for u in self._facts.by_end.get(e, ())}
        return sort_facts(
            copied(f) for f in (self._facts[u] for u in found) if f.group_id == group_id
        )

    async def _fact_candidates(
        self, group_id: str, pairs: list[tuple[str, str]], ends: list[str], embeddings: bool
    ) -> list[FactRecord]:
        """``GraphStore.fact_candidates`` from the indexes: the facts of each (source,
        relation) pair and those touching ``ends``."""
        wanted = set(pairs)
        found = {
            u
            for source, _ in wanted
            for u in self._facts.by_source.get(source, ())
            if (source, self._facts[u].name) in wanted
        }
        found.update(u for e in ends for u in self._facts.by_end.get(e, ()))
        facts = (self._facts[u] for u in found)
        if embeddings:
            return sort_facts(copied(f) for f in facts if f.group_id == group_id)
        return sort_facts(copied(f, fact_embedding=None) for f in facts if f.group_id == group_id)

    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        dim = self._dimension()
        now = now_utc()
        for entity in write.entities:
            entity_row(group_id, entity, dim, now)  # checked: group, embedding
        episode = episode_row(group_id, write.episode, dim, now, write.created)
        for fact in write.facts:
            fact_row(group_id, fact, dim, now)  # checked: group, embedding, histories
        if write.episode.uuid in self._forgotten:
            return False  # forgotten: it stays forgotten
        stored = self._episodes.get(write.episode.uuid)
        if stored is not None and errors.skips_write(
            group_id, write, stored.group_id, stored.content_hash, stored.not_extracted
        ):
            return False  # already processed: nothing may change (GraphStore.write_episode)
        self._check_write(group_id, write, None if stored is None else stored.group_id)
        # Checked: nothing below can fail, so the write is all or nothing (one transaction).
        self._upsert(group_id, write.entities, now)
        self._episodes[episode["uuid"]] = write_rules.merged_episode(
            self._episodes.get(episode["uuid"]),
            episode_record({**episode, "group_id": group_id}),
            now,
        )
        self._created[episode["uuid"]] = episode["created_entities"]
        self._mentions.update((episode["uuid"], u) for u in unique(write.mentions))
        for fact in write.facts:
            self._facts[fact.uuid] = write_rules.merged_fact(self._facts.get(fact.uuid), fact, now)
        for closure in write.closures:
            # checked: stored in the group, or written just now
            self._facts[closure.uuid] = write_rules.closed_fact(self._facts[closure.uuid], closure)
        self._record(group_id, write.changes)
        return True

    def _record(self, group_id: str, changes: list[Change]) -> None:
        """Append one write's changes to the group's outbox (one row) in commit order, bump
        its write version; the log names the writer's deployment unless it has one."""
        log = self._logs.setdefault(group_id, ChangeLog(group_id))
        log.deployment = log.deployment or self.deployment
        if changes:
            row = outbox_row(group_id, changes)
            self._changes.setdefault(group_id, []).append(
                {**row, "seq": log.seq + 1, "last": log.seq + len(changes)}
            )
            log.seq += len(changes)
        log.version += 1

    # ------------------------------------------------------------------ browsing

    # ------------------------------------------------------------------ the change stream

    def _skip_dropped(self, group_id: str, dropped: list[int]) -> None:
        """After the group's changes up to ``max(dropped)`` (seqs) went: a relay cursor right
        before dropped ones moves past them, up to the first change still there (the relay
        never waits for a change that is gone)."""
        log = self._logs.get(group_id)
        if log is None or not dropped:
            return
        past = max(dropped)
        after = [
            seq
            for row in self._changes.get(group_id, [])
            if row["last"] > log.published
            for seq, _, _ in stored_changes(row["seq"], row["change_id"], row["body"])
            if seq > log.published
        ]
        if after:
            past = min(past, after[0] - 1)
        log.published = max(log.published, past)

    def _purge_changes(self, group_id: str, uuids: list[str]) -> None:
        """Take the changes of records ``uuids`` out of the group's outbox (a forget)."""
        purged, kept, dropped = set(uuids), [], []
        for row in self._changes.get(group_id, []):
            left = purged_row(row, purged)
            if left is not row:
                dropped.append(row["last"])
            if left is not None:
                kept.append(left)
        if dropped:
            self._changes[group_id] = kept
            self._skip_dropped(group_id, dropped)

    # ------------------------------------------------------------------ forgetting

    def _check_write(self, group_id: str, write: EpisodeWrite, episode_group: str | None) -> None:
        """Refuse a write that would cross groups or dangle, exactly as both stores check it."""
        owners = self._owners(errors.written_entity_uuids(write)[1])
        facts = {
            uuid: errors.StoredFact(f.group_id, f.source_uuid, f.target_uuid)
            for uuid in errors.written_fact_uuids(write)
            if (f := self._facts.get(uuid)) is not None
        }
        errors.check_write(group_id, write, episode_group, owners, facts)

    def _believed(self, group_id: str, asof: AsOf) -> list[FactRecord]:
        """Copies of the group's facts ``asof`` believes (about ``asof.entity_uuid`` if set)."""
        about = asof.entity_uuid
        return [
            f.model_copy(deep=True)
            for f in self._group_facts(group_id)
            if asof.believed(f) and (about is None or about in (f.source_uuid, f.target_uuid))
        ]

    # ------------------------------------------------------------------ maintenance
