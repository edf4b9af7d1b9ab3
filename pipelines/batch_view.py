"""The store as the episodes of one group's micro-batch see it, one after the other.

A micro-batch of one group's episodes (``tidegraph.pipelines.batches``) is resolved, stamped and
invalidated by the same steps as one episode at a time, with ``BatchView`` in place of the
store: one read for the whole batch, then each episode's lookups are answered from that read
plus the writes of the batch's earlier episodes, which stay in memory until ``flush`` writes
them all in one call (one transaction on Neo4j). So each episode sees exactly what it would
have read had every earlier episode been committed alone (README "Batch-native stages"); a
question the read cannot answer exactly raises ``BatchMiss`` and the batch stops there.

What the read holds depends on the episodes:
- mapped ones: every key, name and relation they look up, their processed markers, and the
  found entities' stored facts of those relations;
- LLM-extracted ones (text, ``judged``): every key and name and the markers. The rest is read
  when first asked: every stored fact touching an entity the judging needs (with embeddings:
  the LLM judges new facts against them), the names of those facts' other ends. A fulltext
  and vector search (a draft no key or name finds) is asked of the store itself, after the
  held writes are written (``flush``): the store then holds everything before the episode,
  and the writes after it are held again. A later read from the store is merged under what
  the view holds (the view's version of a record wins): it answers for the store as the
  held writes leave it, since nothing else writes the group meanwhile (its order is kept).

Applying a write in memory follows the stores' write rules (``GraphStore.write_episode``,
``upsert_entities``): an entity keeps its name and creation time, gains labels and aliases,
takes a non-empty summary, keeps a key once set; a fact takes its new state but keeps its
``created_at``, its first ``expired_at``, and the histories a write leaves empty; a closure
sets ``invalid_at`` and the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypeVar

from tidegraph.processors.resolution import lookup_terms
from tidegraph.records.graph import EntityLookup, EntityRecord, EpisodeWrite, FactRecord
from tidegraph.records.ids import normalize_name
from tidegraph.records.stages import Extraction
from tidegraph.records.times import utc, utcnow
from tidegraph.stores.base import BatchWriteError, GraphStore
from tidegraph.stores.errors import check_same_episode
from tidegraph.stores.rows import clean_labels, sort_entities, sort_facts, unique

_Record = TypeVar("_Record", EntityRecord, FactRecord)


class BatchMiss(Exception):
    """The batch's read cannot answer this question exactly: process the batch one episode
    at a time."""


class EntitiesAhead(BatchMiss):
    """A search the store answers, while the view holds entities of episodes not yet
    written (``hold_entities``): write those episodes first, then ask again."""


class BatchView:
    """Answers ``lookup_entities``, ``fact_candidates`` and ``entities_by_uuids`` for the
    episodes of one group's batch and holds their writes (``write_episode``) until ``flush``."""

    def __init__(self, store: GraphStore, group_id: str, *, judged: bool = False) -> None:
        self.store = store
        self.group_id = group_id
        # LLM-extracted episodes: ``sources`` hold every fact touching them, with embeddings,
        # read when first asked.
        self.judged = judged
        self.keys: set[str] = set()
        self.names: set[str] = set()
        self.relations: set[str] = set()
        self.entities: dict[str, EntityRecord] = {}
        self.facts: dict[str, FactRecord] = {}
        # Entities whose every fact of ``relations`` is in ``facts``: the ones the read found,
        # and the ones the batch creates.
        self.sources: set[str] = set()
        self.processed: dict[str, tuple[str | None, list[str]]] = {}  # uuid -> (hash, created)
        # Judged: the stored entities at the other end of a read fact, for their names only.
        self.others: dict[str, EntityRecord] = {}
        self.writes: list[EpisodeWrite] = []  # held
        # Episodes whose entity upserts are applied ahead of their write (``hold_entities``).
        self.ahead: set[str] = set()
        self.written: list[bool] = []  # what the flushed writes gave, in order
        # Indexes over ``entities`` and ``facts``, kept as writes are applied.
        self._by_key: dict[str, set[str]] = {}
        self._by_name: dict[str, set[str]] = {}  # normalised name or alias -> entity uuids
        self._by_source: dict[str, set[str]] = {}  # entity uuid -> uuids of its facts
        self._by_end: dict[str, set[str]] = {}  # entity uuid -> uuids of facts touching it

    @classmethod
    async def read(
        cls, store: GraphStore, extractions: list[Extraction], *, judged: bool = False
    ) -> BatchView:
        """The read for every episode of ``extractions`` (all of one group; all mapped, or
        with ``judged`` all LLM-extracted), in one round trip."""
        group = extractions[0].episode.group_id
        view = cls(store, group, judged=judged)
        for extraction in extractions:
            if extraction.episode.group_id != group or extraction.mapped == judged:
                raise BatchMiss("a batch holds one group's episodes of one kind")
            keys, names, relations = lookup_terms(extraction)
            view.keys.update(keys)
            view.names.update(names)
            view.relations.update(relations or [])
        episodes: list[tuple[str, str | None]] = [
            (x.episode.uuid, x.episode.content_hash) for x in extractions
        ]
        read = await store.read_batch(
            group, sorted(view.keys), sorted(view.names), sorted(view.relations), episodes
        )
        for entity in [*read.lookup.by_key, *read.lookup.by_name]:
            view._put_entity(entity)
            if not judged:
                view.sources.add(entity.uuid)
        for fact in read.lookup.facts or []:
            view._put_fact(fact)
        hashes = dict(episodes)
        for uuid, created in read.markers.items():
            view.processed[uuid] = (hashes[uuid], created)
        return view

    # ------------------------------------------------------------------ what the steps call
    async def lookup_entities(
        self,
        group_id: str,
        keys: list[str],
        names: list[str],
        episode_uuid: str | None = None,
        relations: list[str] | None = None,
        content_hash: str | None = None,
    ) -> EntityLookup:
        self._same_group(group_id)
        if not (set(keys) <= self.keys and set(names) <= self.names):
            raise BatchMiss("a key or name outside the batch's read")
        if relations is not None and not set(relations) <= self.relations:
            raise BatchMiss("a relation outside the batch's read")
        if episode_uuid is not None and episode_uuid in self.processed:
            stored_hash, created = self.processed[episode_uuid]
            check_same_episode(episode_uuid, stored_hash, content_hash)
            return EntityLookup(processed=True, created_entities=list(created))
        by_key = self._entities(self._by_key, keys)
        by_name = self._entities(self._by_name, names)
        lookup = EntityLookup(by_key=_copies(by_key), by_name=_copies(by_name))
        if relations is not None:
            wanted = set(relations)
            found = {e.uuid for e in [*by_key, *by_name]}
            lookup.facts = _plain(f for f in self._facts_of(found) if f.name in wanted)
        return lookup

    async def fact_candidates(
        self,
        group_id: str,
        pairs: list[tuple[str, str]],
        ends: list[str],
        *,
        embeddings: bool = True,
    ) -> list[FactRecord]:
        self._same_group(group_id)
        if not self.judged:
            if ends or embeddings:
                raise BatchMiss("judged candidates are read from the store")
            if any(s not in self.sources or r not in self.relations for s, r in pairs):
                raise BatchMiss("a subject or relation outside the batch's read")
        else:
            await self._read_facts({s for s, _ in pairs} | set(ends))
        wanted = set(pairs)
        sources = {source for source, _ in pairs}
        found = {f.uuid: f for f in self._facts_of(sources) if (f.source_uuid, f.name) in wanted}
        found.update((u, self.facts[u]) for end in ends for u in self._by_end.get(end, ()))
        if embeddings:
            return sort_facts(_copy(f) for f in found.values())
        return _plain(found.values())

    async def entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]:
        """Judged: the entities (the ones the view does not hold read from the store; without
        name embeddings: the judging prompt reads their names)."""
        self._same_group(group_id)
        if not self.judged:
            raise BatchMiss("entities by uuid are read from the store")
        wanted = unique(uuids)
        unread = [u for u in wanted if u not in self.entities and u not in self.others]
        if unread:
            for entity in await self.store.entities_by_uuids(group_id, unread):
                self.others[entity.uuid] = _copy(entity, name_embedding=None)
        found = [self.entities.get(u) or self.others.get(u) for u in wanted]
        return [_copy(e) for e in found if e is not None]

    async def entity_candidates(
        self, group_id: str, searches: list[tuple[str, list[float]]], limit: int
    ) -> list[tuple[list[tuple[EntityRecord, float]], list[tuple[EntityRecord, float]]]]:
        """Judged: the store's answer once the held writes are written (a search the view
        cannot answer exactly); the entities it finds join the view."""
        self._same_group(group_id)
        if not self.judged:
            raise BatchMiss("entity search is answered by the store")
        if self.ahead:
            raise EntitiesAhead("entities held ahead of their episodes' writes")
        await self.flush()
        answers = await self.store.entity_candidates(group_id, searches, limit)
        for by_vector, by_text in answers:
            for entity, _ in [*by_vector, *by_text]:
                if entity.uuid not in self.entities:
                    self._put_entity(_copy(entity, name_embedding=None, community_uuid=None))
        return answers

    def hold_entities(self, episode_uuid: str, entities: list[EntityRecord]) -> None:
        """Apply an episode's entity upserts before its write (which applies them again, to
        the same effect): the next episodes' resolution finds them, while the facts of this
        one are still being judged (``tidegraph.pipelines.batches``). Until the episode is written,
        an entity search raises ``EntitiesAhead`` (the store would not find them)."""
        now = utcnow()
        for entity in entities:
            self._apply_entity(entity, now)
        self.ahead.add(episode_uuid)

    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        """Held for ``flush``; what it writes is applied to the view at once."""
        self._same_group(group_id)
        episode = write.episode
        self.ahead.discard(episode.uuid)
        if episode.uuid in self.processed:
            return False
        now = utcnow()
        for entity in write.entities:
            self._apply_entity(entity, now)
        for fact in write.facts:
            self._apply_fact(fact, now)
        for closure in write.closures:
            stored = self.facts.get(closure.uuid)
            if stored is None:
                raise BatchMiss("a closure of a fact outside the batch's read")
            stored.invalid_at = utc(closure.invalid_at)
            _keep_history(
                stored,
                "end",
                list(closure.prior_ends),
                list(closure.prior_ends_learned_at),
                closure.end_learned_at,
            )
            if stored.expired_at is None:
                stored.expired_at = utc(closure.expired_at)
        self.processed[episode.uuid] = (episode.content_hash or None, list(write.created))
        self.writes.append(write)
        return True

    async def flush(self) -> list[bool]:
        """Every held write, in order, in one ``write_episodes`` call: what every write the
        view flushed gave, in order. BatchWriteError (with the results of the writes
        committed, this call's and the earlier ones') when it fails."""
        if self.writes:
            held, self.writes = self.writes, []
            try:
                self.written += await self.store.write_episodes(self.group_id, held)
            except BatchWriteError as exc:
                raise BatchWriteError(self.written + exc.written) from exc.__cause__
            except Exception as exc:
                raise BatchWriteError(list(self.written)) from exc
        return list(self.written)

    async def _read_facts(self, entities: set[str]) -> None:
        """Judged: every stored fact touching ``entities`` (with embeddings), for the ones
        whose facts the view does not hold yet; the view's own versions win."""
        unread = sorted(entities - self.sources)
        if not unread:
            return
        for fact in await self.store.fact_candidates(self.group_id, [], unread):
            if fact.uuid not in self.facts:
                self._put_fact(fact)
        self.sources.update(unread)

    # ------------------------------------------------------------------ the write rules
    def _apply_entity(self, entity: EntityRecord, now: datetime) -> None:
        labels = clean_labels(entity.labels)
        aliases = unique(entity.aliases)
        summary = entity.summary if entity.summary.strip() else None
        stored = self.entities.get(entity.uuid)
        if stored is None:
            created = EntityRecord(
                uuid=entity.uuid,
                group_id=self.group_id,
                name=entity.name,
                labels=labels,
                summary=summary or "",
                key=entity.key,
                aliases=aliases,
                created_at=utc(entity.created_at) if entity.created_at else now,
            )
            self._put_entity(created)
            self.sources.add(entity.uuid)
            return
        stored.labels = unique([*stored.labels, *labels])
        stored.aliases = unique([*stored.aliases, *aliases])
        if summary is not None:
            stored.summary = summary
        if stored.key is None:
            stored.key = entity.key
        self._put_entity(stored)

    def _apply_fact(self, fact: FactRecord, now: datetime) -> None:
        stored = self.facts.get(fact.uuid)
        state = FactRecord(
            uuid=fact.uuid,
            group_id=self.group_id,
            source_uuid=fact.source_uuid,
            target_uuid=fact.target_uuid,
            name=fact.name,
            fact=fact.fact,
            episodes=list(fact.episodes),
            valid_at=_opt_utc(fact.valid_at),
            invalid_at=_opt_utc(fact.invalid_at),
            cardinality=fact.cardinality,
            # a fact written without an embedding keeps the stored one
            fact_embedding=fact.fact_embedding or (stored.fact_embedding if stored else None),
        )
        if stored is None:
            state.created_at = utc(fact.created_at) if fact.created_at else now
            state.expired_at = _opt_utc(fact.expired_at)
        else:
            state.created_at = stored.created_at
            state.expired_at = stored.expired_at or _opt_utc(fact.expired_at)
            for kind in ("end", "start"):
                _copy_history(stored, state, kind)
        _keep_history(
            state, "end", fact.prior_ends, fact.prior_ends_learned_at, fact.end_learned_at
        )
        _keep_history(
            state, "start", fact.prior_starts, fact.prior_starts_learned_at, fact.start_learned_at
        )
        self._put_fact(state)

    def _put_entity(self, entity: EntityRecord) -> None:
        self.entities[entity.uuid] = entity
        if entity.key is not None:
            self._by_key.setdefault(entity.key, set()).add(entity.uuid)
        for name in (normalize_name(entity.name), *entity.aliases):
            self._by_name.setdefault(name, set()).add(entity.uuid)

    def _put_fact(self, fact: FactRecord) -> None:
        self.facts[fact.uuid] = fact
        self._by_source.setdefault(fact.source_uuid, set()).add(fact.uuid)
        for end in (fact.source_uuid, fact.target_uuid):
            self._by_end.setdefault(end, set()).add(fact.uuid)

    def _entities(self, index: dict[str, set[str]], terms: list[str]) -> list[EntityRecord]:
        uuids = {u for term in terms for u in index.get(term, ())}
        return [self.entities[u] for u in uuids]

    def _facts_of(self, sources: set[str]) -> list[FactRecord]:
        return [self.facts[u] for s in sources for u in self._by_source.get(s, ())]

    def _same_group(self, group_id: str) -> None:
        if group_id != self.group_id:
            raise BatchMiss("another group's question")


def _copy_history(source: FactRecord, target: FactRecord, kind: str) -> None:
    for name in (f"prior_{kind}s", f"prior_{kind}s_learned_at", f"{kind}_learned_at"):
        value = getattr(source, name)
        setattr(target, name, list(value) if isinstance(value, list) else value)


def _keep_history(
    fact: FactRecord,
    kind: str,
    prior: list[datetime],
    learned: list[datetime],
    current: datetime | None,
) -> None:
    """A written history replaces the stored one; an empty one leaves it (a history only
    grows: ``rows.end_history_row``)."""
    if prior:
        setattr(fact, f"prior_{kind}s", [utc(t) for t in prior])
    if learned:
        setattr(fact, f"prior_{kind}s_learned_at", [utc(t) for t in learned])
    if current is not None:
        setattr(fact, f"{kind}_learned_at", utc(current))


def _opt_utc(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value)


def _copy(record: _Record, **update: Any) -> _Record:
    """A copy that shares nothing a step may change: the records' fields are immutable
    values or lists of them, so fresh lists make it as good as a deep copy (and several times
    cheaper than one, for a 384-number embedding)."""
    lists = {
        k: list(v) for k, v in record.__dict__.items() if isinstance(v, list) and k not in update
    }
    return record.model_copy(update=lists | update)


def _copies(entities: Iterable[EntityRecord]) -> list[EntityRecord]:
    return sort_entities(_copy(e) for e in entities)


def _plain(facts: Iterable[FactRecord]) -> list[FactRecord]:
    """Copies, as the store returns them without embeddings (steps may change what they get)."""
    return sort_facts(_copy(f, fact_embedding=None) for f in facts)
