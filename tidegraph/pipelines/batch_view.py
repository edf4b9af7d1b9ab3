"""The store as the episodes of one unit see it, one after the other.

A unit is consecutive episodes of one group resolved, stamped and invalidated by the chain's
steps, then written in one call (``tidegraph.pipelines.units``). The steps run against a
``BatchView`` instead of the store: one read for the whole unit (``read``), then each
episode's questions are answered from what the view holds, which includes the writes of the
unit's earlier episodes (applied in memory by the one definition of the write rules,
``tidegraph.stores.write_rules``, and held until ``flush`` writes them all in one
``write_episodes`` call, one transaction on Neo4j). What the view does not hold yet it reads
from the store when first asked and keeps, the view's own version of a record winning: nothing
else writes the group meanwhile (its order is kept), so the store plus the held writes is
exactly what the episode would have read had every earlier episode been committed alone
(docs: "Batch-native stages").

A fulltext and vector search (a draft no key or name finds) cannot be answered from memory:
the view writes what it holds first, then asks the store. Entities applied ahead of their
episode's write (``hold_entities``: the next episode's resolution finds them while this one's
facts are judged) are not in the store yet, so the runner ends a run of text episodes before an
episode whose resolution searches (``ResolutionStep.searches``).
"""

from __future__ import annotations

from typing import Any

from tidegraph.processors.resolution import lookup_terms
from tidegraph.processors.temporal import earliest_start
from tidegraph.records.changes import entity_changes, fact_changes, fact_state
from tidegraph.records.graph import (
    EntityLookup,
    EntityRecord,
    EpisodeWrite,
    FactRecord,
    updated,
)
from tidegraph.records.ids import normalize_name
from tidegraph.records.stages import Extraction
from tidegraph.records.times import utcnow
from tidegraph.stores.base import BatchWriteError, GraphStore
from tidegraph.stores.errors import check_same_episode
from tidegraph.stores.rows import copied, sort_entities, sort_facts, unique
from tidegraph.stores.write_rules import closed_fact, merged_entity, merged_fact


class BatchView:
    """``UnitStore`` (``tidegraph.processors.steps``) for the episodes of one group's unit:
    answers from the unit's read plus its held writes, reads through to the store for the
    rest, holds the writes until ``flush``."""

    def __init__(
        self, store: GraphStore, group_id: str, *, judged: bool = False, record_changes: bool = True
    ) -> None:
        """``judged``: the unit's episodes are judged by the LLM against stored facts, so
        facts are read with their embeddings; ``record_changes``: each held write carries
        what it changes (the change stream)."""
        self.store = store
        self.record_changes = record_changes
        self.group_id = group_id
        self.judged = judged
        self.entities: dict[str, EntityRecord] = {}  # without name embeddings once read
        self.facts: dict[str, FactRecord] = {}
        # What the view holds all of: entities of these keys and names, facts of these
        # (source, relation) pairs (but those that ended before the unit's earliest new fact
        # starts, when it read them: they change none of its plans), every fact touching
        # these entities.
        self._keys: set[str] = set()
        self._names: set[str] = set()
        self._pairs: set[tuple[str, str]] = set()
        self._touching: set[str] = set()
        self._names_of: dict[str, str] = {}  # entity uuid -> name, read for judging prompts
        self.processed: dict[str, tuple[str | None, list[str]]] = {}  # uuid -> (hash, created)
        self._markers_read: set[str] = set()
        self.writes: list[EpisodeWrite] = []  # held
        # Episodes whose entity upserts are applied ahead of their write (``hold_entities``),
        # and the states those entities had before (what the write changes).
        self.ahead: set[str] = set()
        self._held_before: dict[str, dict[str, EntityRecord | None]] = {}
        self.written: list[bool] = []  # what the flushed writes gave, in order
        self._by_key: dict[str, set[str]] = {}
        self._by_name: dict[str, set[str]] = {}  # normalised name or alias -> entity uuids
        self._by_source: dict[str, set[str]] = {}  # entity uuid -> uuids of its facts
        self._by_end: dict[str, set[str]] = {}  # entity uuid -> uuids of facts touching it
        self._states: dict[str, tuple[FactRecord, dict[str, Any]]] = {}  # see ``_state``

    @classmethod
    async def read(
        cls, store: GraphStore, extractions: list[Extraction], *, record_changes: bool = True
    ) -> BatchView:
        """The view of a unit (one group's episodes, all mapped or all not), with what every
        one of its episodes looks up read in one round trip (``GraphStore.read_batch``)."""
        group = extractions[0].episode.group_id
        judged = not extractions[0].mapped
        if any(x.episode.group_id != group or x.mapped == judged for x in extractions):
            raise ValueError("a unit holds one group's episodes, all mapped or all not")
        keys: set[str] = set()
        names: set[str] = set()
        relations: set[str] = set()
        for extraction in extractions:
            k, n, r = lookup_terms(extraction)
            keys.update(k)
            names.update(n)
            relations.update(r or [])
        episodes: list[tuple[str, str | None]] = [
            (x.episode.uuid, x.episode.content_hash) for x in extractions
        ]
        # Facts that ended before the unit's earliest new fact starts cannot change its plans
        # (tidegraph.processors.timeline): an entity's long history is not read.
        facts_from = None if judged else earliest_start(extractions)
        read = await store.read_batch(
            group, sorted(keys), sorted(names), sorted(relations), episodes, facts_from
        )
        view = cls(store, group, judged=judged, record_changes=record_changes)
        view._keys, view._names = keys, names
        found = [*read.lookup.by_key, *read.lookup.by_name]
        for entity in found:
            view._put_entity(entity)
        for fact in read.lookup.facts or []:
            view._put_fact(fact)
        view._pairs = {(e.uuid, relation) for e in found for relation in relations}
        hashes = dict(episodes)
        view._markers_read = set(hashes)
        for uuid, created in read.markers.items():
            view.processed[uuid] = (hashes[uuid], created)
        return view

    # ------------------------------------------------------------------ UnitStore
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
        if episode_uuid is not None:
            await self._read_marker(episode_uuid, content_hash)
            if episode_uuid in self.processed:
                stored_hash, created = self.processed[episode_uuid]
                check_same_episode(episode_uuid, stored_hash, content_hash)
                return EntityLookup(processed=True, created_entities=list(created))
        keys_unread = sorted(set(keys) - self._keys)
        names_unread = sorted(set(names) - self._names)
        if keys_unread or names_unread:
            read = await self.store.lookup_entities(group_id, keys_unread, names_unread)
            for entity in [*read.by_key, *read.by_name]:
                if entity.uuid not in self.entities:
                    self._put_entity(entity)
            self._keys.update(keys_unread)
            self._names.update(names_unread)
        by_key = self._entities(self._by_key, keys)
        by_name = self._entities(self._by_name, names)
        # The held records themselves, as ``fact_candidates`` answers.
        lookup = EntityLookup(by_key=sort_entities(by_key), by_name=sort_entities(by_name))
        if relations is not None:
            found = sorted({e.uuid for e in [*by_key, *by_name]})
            pairs = [(uuid, relation) for uuid in found for relation in unique(relations)]
            lookup.facts = await self.fact_candidates(group_id, pairs, [], embeddings=False)
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
        await self._read_facts(pairs, ends, embeddings)
        wanted = set(pairs)
        found = {
            u: self.facts[u]
            for source in {s for s, _ in pairs}
            for u in self._by_source.get(source, ())
            if (source, self.facts[u].name) in wanted
        }
        found.update((u, self.facts[u]) for end in ends for u in self._by_end.get(end, ()))
        # The held records themselves: nothing changes a record in place but the planner,
        # which changes its own copies (``timeline.plan_facts``), and the view replaces a held
        # record (a write, an embedding read later), never changes it.
        if embeddings:
            return sort_facts(found.values())
        return sort_facts(
            f if f.fact_embedding is None else updated(f, {"fact_embedding": None})
            for f in found.values()
        )

    async def entity_names(self, group_id: str, uuids: list[str]) -> dict[str, str]:
        self._same_group(group_id)
        unread = [u for u in unique(uuids) if u not in self.entities and u not in self._names_of]
        if unread:
            self._names_of.update(await self.store.entity_names(group_id, unread))
        names = {**self._names_of, **{u: e.name for u, e in self.entities.items()}}
        return {u: names[u] for u in uuids if u in names}

    async def entities_by_key_prefix(self, group_id: str, prefix: str) -> list[EntityRecord]:
        """The store's entities of keys starting with ``prefix``, and the view's (those the
        unit's earlier episodes create)."""
        self._same_group(group_id)
        for entity in await self.store.entities_by_key_prefix(group_id, prefix):
            if entity.uuid not in self.entities:
                self._put_entity(entity)
            if entity.key is not None:
                self._keys.add(entity.key)
        keys = [k for k in self._by_key if k.startswith(prefix)]
        return sort_entities(self._entities(self._by_key, keys))

    async def entity_candidates(
        self, group_id: str, searches: list[tuple[str, list[float]]], limit: int
    ) -> list[tuple[list[tuple[EntityRecord, float]], list[tuple[EntityRecord, float]]]]:
        """The store's answer once the held writes are written (the store's indexes answer a
        search, not the view); the entities it finds join the view."""
        self._same_group(group_id)
        if self.ahead:
            raise RuntimeError(
                "an entity search while entities are held ahead of their episodes' writes: "
                "the unit must end before an episode whose resolution searches"
            )
        await self.flush()
        answers = await self.store.entity_candidates(group_id, searches, limit)
        for by_vector, by_text in answers:
            for entity, _ in [*by_vector, *by_text]:
                if entity.uuid not in self.entities:
                    self._put_entity(entity)
        return answers

    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        """Held for ``flush``; what it writes is applied to the view at once, and what that
        changes recorded on the write (``EpisodeWrite.changes``, for the change stream).
        False when the episode is processed (as the store answers)."""
        self._same_group(group_id)
        episode = write.episode
        held_before = self._held_before.pop(episode.uuid, {})
        self.ahead.discard(episode.uuid)
        await self._read_marker(episode.uuid, episode.content_hash or None)
        if episode.uuid in self.processed:
            return False
        now = utcnow()
        entities_before = {
            e.uuid: held_before.get(e.uuid, self.entities.get(e.uuid)) for e in write.entities
        }
        facts_before = {
            u: self.facts.get(u)
            for u in [*(f.uuid for f in write.facts), *(c.uuid for c in write.closures)]
        }
        for entity in write.entities:
            self._apply_entity(entity, now)
        for fact in write.facts:
            self._put_fact(merged_fact(self.facts.get(fact.uuid), fact, now))
        for closure in write.closures:
            stored = self.facts.get(closure.uuid)
            if stored is None:
                raise RuntimeError(f"closure of fact {closure.uuid}, which no step read")
            self._put_fact(closed_fact(stored, closure))
        at = episode.extracted_at or episode.created_at or now
        cause, producer = episode.uuid, episode.producer_id
        write.changes = (
            []
            if not self.record_changes
            else [
                *(
                    change
                    for uuid, before in entities_before.items()
                    for change in entity_changes(
                        group_id, cause, producer, before, self.entities[uuid], at
                    )
                ),
                *(
                    change
                    for uuid, before in facts_before.items()
                    for change in fact_changes(
                        group_id, cause, producer, before, self.facts[uuid], at, state=self._state
                    )
                ),
            ]
        )
        if episode.not_extracted is None:  # an episode stored unextracted is not processed
            self.processed[episode.uuid] = (episode.content_hash or None, list(write.created))
        self.writes.append(write)
        return True

    # ------------------------------------------------------------------ the runner's
    def hold_entities(self, episode_uuid: str, entities: list[EntityRecord]) -> None:
        """Apply an episode's entity upserts before its write (which applies them again, to
        the same effect): the next episodes' resolution finds them while the facts of this
        one are still being judged. Until the episode is written, the store does not hold
        them: an entity search then is refused (``entity_candidates``)."""
        now = utcnow()
        before = self._held_before.setdefault(episode_uuid, {})
        for entity in entities:
            before.setdefault(entity.uuid, self.entities.get(entity.uuid))
            self._apply_entity(entity, now)
        self.ahead.add(episode_uuid)

    @property
    def holds_entities_ahead(self) -> bool:
        return bool(self.ahead)

    def entities_ahead(self) -> list[EntityRecord]:
        """The entities held ahead of their episodes' writes, as those writes leave them
        (without name embeddings), in uuid order."""
        uuids = {uuid for episode in self.ahead for uuid in self._held_before.get(episode, {})}
        return sort_entities(self.entities[uuid] for uuid in uuids)

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

    # ------------------------------------------------------------------ reading through
    async def _read_marker(self, episode_uuid: str, content_hash: str | None) -> None:
        if episode_uuid in self._markers_read:
            return
        markers = await self.store.episode_markers(self.group_id, [(episode_uuid, content_hash)])
        if episode_uuid in markers:
            self.processed[episode_uuid] = (content_hash, markers[episode_uuid])
        self._markers_read.add(episode_uuid)

    async def _read_facts(
        self, pairs: list[tuple[str, str]], ends: list[str], embeddings: bool
    ) -> None:
        """Read the facts of ``pairs`` and touching ``ends`` the view does not hold all of
        (and, asked ``embeddings`` of a view that reads without them, the embeddings its facts
        lack: a write without one keeps the stored one, so the store's is the current)."""
        with_vectors = self.judged or embeddings
        if with_vectors and not self.judged:  # held without embeddings: read them all
            unread_pairs, unread_ends = sorted(set(pairs)), sorted(set(ends))
        else:
            unread_pairs = sorted(
                p for p in set(pairs) if p not in self._pairs and p[0] not in self._touching
            )
            unread_ends = sorted(e for e in set(ends) if e not in self._touching)
        if not unread_pairs and not unread_ends:
            return
        read = await self.store.fact_candidates(
            self.group_id, unread_pairs, unread_ends, embeddings=with_vectors
        )
        for fact in read:
            mine = self.facts.get(fact.uuid)
            if mine is None:
                self._put_fact(fact)
            elif mine.fact_embedding is None and fact.fact_embedding is not None:
                self.facts[fact.uuid] = updated(mine, {"fact_embedding": fact.fact_embedding})
        self._pairs.update(unread_pairs)
        self._touching.update(unread_ends)

    # ------------------------------------------------------------------ holding
    def _apply_entity(self, entity: EntityRecord, now: Any) -> None:
        created = entity.uuid not in self.entities
        self._put_entity(merged_entity(self.entities.get(entity.uuid), entity, now))
        if created:
            # Created by the unit: the store holds no fact of it.
            self._touching.add(entity.uuid)

    def _put_entity(self, entity: EntityRecord) -> None:
        entity = copied(entity, name_embedding=None, community_uuid=None)
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

    def _state(self, fact: FactRecord | None) -> dict[str, Any] | None:
        """``fact_state`` of a fact the view holds, kept while the view holds that version: a
        write (or an embedding read later, which no state carries) replaces a held fact and
        never changes it, so a fact the unit's episodes change again is dumped once, as one
        change's after and the next one's before."""
        if fact is None:
            return None
        held = self._states.get(fact.uuid)
        if held is not None and held[0] is fact:
            return held[1]
        state = fact_state(fact)
        assert state is not None
        self._states[fact.uuid] = (fact, state)
        return state

    def _entities(self, index: dict[str, set[str]], terms: list[str]) -> list[EntityRecord]:
        uuids = {u for term in terms for u in index.get(term, ())}
        return [self.entities[u] for u in uuids]

    def _same_group(self, group_id: str) -> None:
        if group_id != self.group_id:
            raise ValueError(f"the view of group {self.group_id!r} was asked about {group_id!r}")
