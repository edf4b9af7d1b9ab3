"""An in-memory ``GraphStore``: the whole interface of ``tidegraph/stores/base.py``, faithful to
its docstrings, with no server. It is the scratch store a forget replays a group's remaining
episodes into (``tidegraph.pipelines.forget``), and the store of the unit tests.

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

from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime

from tidegraph.records.asof import AsOf
from tidegraph.records.changes import (
    Change,
    PublishedChange,
    group_forgotten,
    published_form,
    stored_form,
)
from tidegraph.records.graph import (
    ChangeLog,
    CommunityRecord,
    EntityRecord,
    EpisodeDetail,
    EpisodeEntry,
    EpisodeRecord,
    EpisodeState,
    EpisodeWrite,
    FactRecord,
    FactView,
    GroupHistory,
    Rebuild,
    WeightedEdge,
)
from tidegraph.records.times import utc
from tidegraph.records.vectors import cosine
from tidegraph.settings import DEFAULT_TOPIC_PREFIX
from tidegraph.stores import errors, write_rules
from tidegraph.stores.memory.keys import MemoryKeys
from tidegraph.stores.memory.search import Entities, Facts, MemorySearch, StoredCommunity
from tidegraph.stores.rows import (
    check_embedding,
    community_rows,
    copied,
    cosine_score,
    entity_row,
    episode_record,
    episode_row,
    fact_row,
    fact_view,
    fold_communities,
    fold_edges,
    neighbour_weights_of,
    now_utc,
    page_of,
    rank,
    sort_entities,
    sort_facts,
    sort_views,
    unique,
)
from tidegraph.stores.search_text import search_terms, text_words


class MemoryStore(MemorySearch, MemoryKeys):
    """``GraphStore`` in dictionaries (see the module docstring)."""

    name = "memory"

    def __init__(self, *, deployment: str = DEFAULT_TOPIC_PREFIX) -> None:
        self.deployment = deployment
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
        self._changes: dict[str, list[Change]] = {}

    # ------------------------------------------------------------------ lifecycle
    async def setup(self, embedding_dim: int) -> None:
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
    async def episode_marker(
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

    async def entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]:
        return self._group_entities(group_id, among=uuids)

    async def list_entities(self, group_id: str) -> list[EntityRecord]:
        return self._group_entities(group_id)

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

    async def upsert_entities(self, group_id: str, entities: list[EntityRecord]) -> None:
        if not entities:
            return
        now = now_utc()
        rows = [entity_row(group_id, e, self._dimension(), now) for e in entities]  # checked
        errors.check_entity_owners(group_id, self._owners(unique(r["uuid"] for r in rows)))
        self._upsert(group_id, entities, now)

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

    async def vector_facts(
        self, group_id: str, embedding: list[float], limit: int
    ) -> list[tuple[FactRecord, float]]:
        vector = check_embedding(embedding, self._dimension(), "query embedding")
        if limit <= 0 or vector is None:
            return []
        hits = [
            (f.model_copy(deep=True), cosine_score(cosine(f.fact_embedding, vector)))
            for f in self._group_facts(group_id)
            if f.fact_embedding is not None
        ]
        return rank(hits, limit)

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
        """Append to the group's outbox in commit order, bump its write version; the log
        names the writer's deployment unless it has one."""
        log = self._logs.setdefault(group_id, ChangeLog(group_id))
        log.deployment = log.deployment or self.deployment
        outbox = self._changes.setdefault(group_id, [])
        for change in changes:
            log.seq += 1
            outbox.append(change.model_copy(update={"seq": log.seq}))
        log.version += 1

    async def episode_detail(self, group_id: str, episode_uuid: str) -> EpisodeDetail | None:
        if self._forgotten.get(episode_uuid, ("", None))[0] == group_id:
            at = self._forgotten[episode_uuid][1]
            entry = EpisodeEntry(episode_uuid, "", "", "", at, None, "forgotten", forgotten_at=at)
            return EpisodeDetail(entry)
        e = self._episodes.get(episode_uuid)
        if e is None or e.group_id != group_id:
            return None
        state: EpisodeState = "written" if e.not_extracted is None else "not_extracted"
        entry = EpisodeEntry(
            e.uuid, e.producer_id, e.name, e.source, utc(e.valid_at), e.created_at, state,
            e.not_extracted, e.content,
        )  # fmt: skip
        mentions = sorted(entity for ep, entity in self._mentions if ep == episode_uuid)
        return EpisodeDetail(entry, mentions)

    # ------------------------------------------------------------------ browsing
    async def list_episodes(
        self,
        group_id: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        status: str | None = None,
        after: tuple[datetime, str] | None = None,
        limit: int = 100,
    ) -> list[EpisodeEntry]:
        entries: list[EpisodeEntry] = []
        if status == "forgotten":
            for uuid, (group, at) in self._forgotten.items():
                if group == group_id:
                    entries.append(
                        EpisodeEntry(uuid, "", "", "", at, None, "forgotten", forgotten_at=at)
                    )
        else:
            for e in self._episodes.values():
                state: EpisodeState = "written" if e.not_extracted is None else "not_extracted"
                if e.group_id != group_id or status not in (None, state):
                    continue
                entries.append(
                    EpisodeEntry(
                        e.uuid, e.producer_id, e.name, e.source, utc(e.valid_at), e.created_at,
                        state, e.not_extracted, e.content,
                    )
                )  # fmt: skip
        return page_of(entries, since, until, after, limit)

    # ------------------------------------------------------------------ the change stream
    async def changes(self, group_id: str, after: int, limit: int) -> list[Change]:
        found = [c for c in self._changes.get(group_id, []) if c.seq > after]
        return [c.model_copy(deep=True) for c in found[: max(limit, 0)]]

    async def change_logs(
        self, group_ids: list[str] | None = None, *, unpublished: bool = False, own: bool = False
    ) -> list[ChangeLog]:
        wanted = {
            g: log
            for g, log in self._logs.items()
            if (group_ids is None or g in group_ids)
            and (not unpublished or log.seq > log.published)
            and (not own or log.deployment == self.deployment)
        }
        return [ChangeLog(**vars(log)) for _, log in sorted(wanted.items())]

    async def unpublished_changes(
        self, group_ids: list[str], per_group: int
    ) -> list[PublishedChange]:
        found: list[PublishedChange] = []
        for group_id in sorted(set(group_ids)):
            log = self._logs.get(group_id)
            if log is not None and log.deployment == self.deployment:
                found += [
                    PublishedChange(
                        c.group_id, c.seq, published_form(stored_form(c), c.seq), c.change_id
                    )
                    for c in await self.changes(group_id, log.published, per_group)
                ]
        return found

    async def mark_published(self, acknowledged: Sequence[PublishedChange]) -> None:
        for change in acknowledged:
            log = self._logs.get(change.group_id)
            stored = {c.seq: c.change_id for c in self._changes.get(change.group_id, [])}
            if (
                log is not None
                and log.deployment == self.deployment
                and stored.get(change.seq) == change.change_id
            ):
                log.published = max(log.published, change.seq)

    async def prune_changes(
        self, group_id: str, before: datetime, *, published_only: bool = True
    ) -> int:
        log = self._logs.get(group_id)
        published = log.published if log is not None else 0
        outbox = self._changes.get(group_id, [])
        gone = [
            (not published_only or c.seq <= published)
            and (c.committed_at is None or utc(c.committed_at) < utc(before))
            for c in outbox
        ]
        self._changes[group_id] = [c for c, out in zip(outbox, gone, strict=True) if not out]
        dropped = [c.seq for c, out in zip(outbox, gone, strict=True) if out]
        self._skip_dropped(group_id, dropped)
        return len(dropped)

    def _skip_dropped(self, group_id: str, dropped: list[int]) -> None:
        """After the group's changes ``dropped`` (seqs) went: a relay cursor right before
        dropped ones moves past them, up to the first change still there (the relay never
        waits for a change that is gone)."""
        log = self._logs.get(group_id)
        if log is None or not dropped:
            return
        past = max(dropped)
        after = [c.seq for c in self._changes.get(group_id, []) if c.seq > log.published]
        if after:
            past = min(past, after[0] - 1)
        log.published = max(log.published, past)

    # ------------------------------------------------------------------ forgetting
    async def group_history(self, group_id: str) -> GroupHistory:
        episodes = sorted(
            (e for e in self._episodes.values() if e.group_id == group_id),
            key=lambda e: (utc(e.extracted_at or e.created_at or e.valid_at), e.uuid),
        )
        uuids = {e.uuid for e in episodes}
        mentions: dict[str, list[str]] = {}
        for episode, entity in sorted(self._mentions):
            if episode in uuids:
                mentions.setdefault(episode, []).append(entity)
        log = self._logs.get(group_id)
        return GroupHistory(
            episodes=[e.model_copy(deep=True) for e in episodes],
            entities={
                u: copied(self._entities[u], community_uuid=None)
                for u in self._entities.by_group.get(group_id, ())
            },
            facts={f.uuid: copied(f) for f in self._group_facts(group_id)},
            mentions=mentions,
            created={u: list(self._created.get(u, [])) for u in uuids},
            version=log.version if log is not None else 0,
        )

    async def apply_rebuild(self, group_id: str, rebuild: Rebuild) -> None:
        log = self._logs.get(group_id)
        if (log.version if log is not None else 0) != rebuild.version:
            raise errors.RebuildConflict(group_id)
        dim = self._dimension()
        now = now_utc()
        for entity in rebuild.entities:
            entity_row(group_id, entity, dim, now)  # checked: group, embedding
        for fact in rebuild.facts:
            fact_row(group_id, fact, dim, now)
        errors.check_entity_owners(group_id, self._owners(e.uuid for e in rebuild.entities))
        gone_episodes = set(rebuild.forgotten)
        gone_entities = set(rebuild.delete_entities)
        for uuid in gone_episodes:
            if self._episodes.get(uuid) is not None and self._episodes[uuid].group_id == group_id:
                del self._episodes[uuid]
                self._created.pop(uuid, None)
            self._forgotten[uuid] = (group_id, rebuild.forgotten_at)
        for uuid in rebuild.delete_facts:
            gone = self._facts.get(uuid)
            if gone is not None and gone.group_id == group_id:
                del self._facts[uuid]
        for uuid in gone_entities:
            if uuid in self._entities and self._entities[uuid].group_id == group_id:
                del self._entities[uuid]
        self._mentions = {
            (p, e)
            for p, e in self._mentions
            if p not in gone_episodes and e not in gone_entities and p not in rebuild.mentions
        }
        # Communities with a member removed or changed go (see the SQLite store's).
        touched = gone_entities | {e.uuid for e in rebuild.entities}
        stale = {
            c
            for c, e in self._members
            if e in touched and self._communities[c].group_id == group_id
        }
        for uuid in stale:
            del self._communities[uuid]
        self._members = {
            (c, e) for c, e in self._members if e not in gone_entities and c not in stale
        }
        for entity in rebuild.entities:
            self._entities[entity.uuid] = entity.model_copy(
                deep=True, update={"group_id": group_id, "community_uuid": None}
            )
        for fact in rebuild.facts:
            self._facts[fact.uuid] = fact.model_copy(deep=True, update={"group_id": group_id})
        for episode, entities in rebuild.mentions.items():
            self._mentions.update((episode, e) for e in entities)
        for episode, created in rebuild.created.items():
            self._created[episode] = list(created)
        purged = set(rebuild.purged)
        outbox = self._changes.get(group_id, [])
        self._changes[group_id] = [c for c in outbox if c.uuid not in purged]
        self._skip_dropped(group_id, [c.seq for c in outbox if c.uuid in purged])
        self._record(group_id, rebuild.changes)

    def _check_write(self, group_id: str, write: EpisodeWrite, episode_group: str | None) -> None:
        """Refuse a write that would cross groups or dangle, exactly as both stores check it."""
        owners = self._owners(errors.written_entity_uuids(write)[1])
        facts = {
            uuid: errors.StoredFact(f.group_id, f.source_uuid, f.target_uuid)
            for uuid in errors.written_fact_uuids(write)
            if (f := self._facts.get(uuid)) is not None
        }
        errors.check_write(group_id, write, episode_group, owners, facts)

    async def facts_as_of(self, group_id: str, asof: AsOf) -> list[FactView]:
        producers = {u: e.producer_id for u, e in self._episodes.items() if e.group_id == group_id}
        views = []
        for fact in self._believed(group_id, asof):
            subject = self._entities[fact.source_uuid].name
            obj = self._entities[fact.target_uuid].name
            views.append((fact_view(fact, subject, obj, producers, asof), fact))
        return sort_views(views)

    def _believed(self, group_id: str, asof: AsOf) -> list[FactRecord]:
        """Copies of the group's facts ``asof`` believes (about ``asof.entity_uuid`` if set)."""
        about = asof.entity_uuid
        return [
            f.model_copy(deep=True)
            for f in self._group_facts(group_id)
            if asof.believed(f) and (about is None or about in (f.source_uuid, f.target_uuid))
        ]

    # ------------------------------------------------------------------ maintenance
    async def forget_group(self, group_id: str, at: datetime, *, purge: bool = False) -> int:
        episodes = [u for u, e in self._episodes.items() if e.group_id == group_id]
        tombstones = {u: f for u, f in self._forgotten.items() if f[0] == group_id}
        log = self._logs.get(group_id)
        await self.delete_group(group_id)
        if not purge:
            self._forgotten.update(tombstones)
            self._forgotten.update((u, (group_id, at)) for u in episodes)
            self._logs[group_id] = log or ChangeLog(group_id)
            self._record(group_id, [group_forgotten(group_id, at)])
        return len(episodes)

    async def counts(self, group_id: str) -> dict[str, int]:
        episodes = {u for u, e in self._episodes.items() if e.group_id == group_id}
        return {
            "episodes": len(episodes),
            "entities": len(self._entities.by_group.get(group_id, ())),
            "facts": sum(1 for _ in self._group_facts(group_id)),
            "mentions": sum(1 for episode, _ in self._mentions if episode in episodes),
        }

    async def delete_group(self, group_id: str) -> None:
        episodes = {u for u, e in self._episodes.items() if e.group_id == group_id}
        entities = set(self._entities.by_group.get(group_id, ()))
        communities = {u for u, c in self._communities.items() if c.group_id == group_id}
        for uuid in [
            u
            for u, f in self._facts.items()
            if f.group_id == group_id or {f.source_uuid, f.target_uuid} & entities
        ]:
            del self._facts[uuid]
        # DETACH DELETE: the relationships of every node removed go with it.
        self._mentions = {
            (p, e) for p, e in self._mentions if p not in episodes and e not in entities
        }
        self._members = {
            (c, e) for c, e in self._members if c not in communities and e not in entities
        }
        for uuid in episodes:
            del self._episodes[uuid]
            self._created.pop(uuid, None)
        self._forgotten = {u: f for u, f in self._forgotten.items() if f[0] != group_id}
        self._logs.pop(group_id, None)
        self._changes.pop(group_id, None)
        for uuid in entities:
            del self._entities[uuid]
        for uuid in communities:
            del self._communities[uuid]

    # ------------------------------------------------------------------ communities
    async def entity_graph(
        self, group_id: str, at: datetime | None = None
    ) -> tuple[list[str], list[WeightedEdge]]:
        asof = AsOf.resolve(at, None, False, None)
        nodes = sorted(u for u, e in self._entities.items() if e.group_id == group_id)
        rows = ((f.source_uuid, f.target_uuid, 1) for f in self._believed(group_id, asof))
        return nodes, [WeightedEdge(a, b, w) for a, b, w in fold_edges(rows)]

    async def neighbour_weights(
        self, group_id: str, entity_uuid: str, at: datetime | None = None
    ) -> dict[str, int]:
        asof = AsOf.resolve(at, None, False, entity_uuid)
        rows = ((f.source_uuid, f.target_uuid, 1) for f in self._believed(group_id, asof))
        return neighbour_weights_of(entity_uuid, rows)

    async def communities(self, group_id: str) -> list[CommunityRecord]:
        heads = [
            (u, c.name, c.summary) for u, c in self._communities.items() if c.group_id == group_id
        ]
        mine = {u for u, _, _ in heads}
        members = [(c, e) for c, e in self._members if c in mine]
        return [CommunityRecord(u, n, s, m) for u, n, s, m in fold_communities(heads, members)]

    async def write_communities(
        self, group_id: str, upserts: list[CommunityRecord], deletes: list[str]
    ) -> None:
        if not upserts and not deletes:
            return
        rows, memberships, members = community_rows(upserts, self._dimension(), now_utc())
        uuids = [r["uuid"] for r in rows]
        named = unique([*uuids, *deletes])
        errors.check_community_owners(
            group_id, {u: self._communities[u].group_id for u in named if u in self._communities}
        )
        gone = set(deletes)
        self._communities = {u: c for u, c in self._communities.items() if u not in gone}
        self._members = {(c, e) for c, e in self._members if c not in gone}
        for row in rows:  # by ``write_rules.COMMUNITY``
            stored = self._communities.get(row["uuid"])
            state = write_rules.merged_values(
                write_rules.COMMUNITY,
                None if stored is None else vars(stored),
                {**row, "group_id": group_id},
            )
            del state["uuid"]
            self._communities[row["uuid"]] = StoredCommunity(**state)
        if rows:  # the upserted communities' members are replaced, and leave other ones
            moved, replaced = set(members), set(uuids)
            self._members = {
                (c, e)
                for c, e in self._members
                if self._communities[c].group_id != group_id
                or (c not in replaced and e not in moved)
            }
        for m in memberships:
            if self._owners([m["entity"]]).get(m["entity"]) == group_id:
                self._members.add((m["community"], m["entity"]))

    async def assign_members(self, group_id: str, assignments: list[tuple[str, str]]) -> None:
        for community_uuid, entity_uuid in assignments:
            community = self._communities.get(community_uuid)
            if community is None or community.group_id != group_id:
                continue
            if self._owners([entity_uuid]).get(entity_uuid) != group_id:
                continue
            self._members = {
                (c, e)
                for c, e in self._members
                if e != entity_uuid or self._communities[c].group_id != group_id
            }
            self._members.add((community_uuid, entity_uuid))
