"""The search methods of the in-memory store (``store.MemoryStore``): exact, by brute
force over the dictionaries, with the rules every store keeps (``tidegraph.stores.hits``:
what a scope sees, the hits and their order, the breadth-first walk).

Fulltext is the approximation ``fulltext_entities`` makes (see the store module's docstring): a
record matches when it shares a word with the text (split like a search), scored by the number
of the text's words it has; no stemming, no term weights. Vector scores are exact cosine,
``(1 + cos) / 2``, like both stores.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import CommunityRecord, EntityRecord, EpisodeRecord, FactRecord
from tidegraph.records.ids import normalize_name
from tidegraph.records.search import Hit, Kind, SearchScope
from tidegraph.records.vectors import cosine
from tidegraph.stores import hits as rules
from tidegraph.stores.roles import Search
from tidegraph.stores.rows import check_embedding, cosine_score, unique
from tidegraph.stores.search_text import search_terms, text_words

if TYPE_CHECKING:
    from tidegraph.stores.memory.store import MemoryStore

# (record, its text, its embedding) of one kind, as a scope sees them.
Candidate = tuple[
    FactRecord | EntityRecord | EpisodeRecord | CommunityRecord, str, list[float] | None
]


class Facts(dict[str, FactRecord]):
    """The stored facts by uuid, indexed by group, by source and by either end."""

    def __init__(self) -> None:
        super().__init__()
        self.by_group: dict[str, set[str]] = defaultdict(set)
        self.by_source: dict[str, set[str]] = defaultdict(set)
        self.by_end: dict[str, set[str]] = defaultdict(set)

    def __setitem__(self, uuid: str, fact: FactRecord) -> None:
        if uuid in self:
            self._unindex(self[uuid])
        super().__setitem__(uuid, fact)
        self.by_group[fact.group_id].add(uuid)
        self.by_source[fact.source_uuid].add(uuid)
        self.by_end[fact.source_uuid].add(uuid)
        self.by_end[fact.target_uuid].add(uuid)

    def __delitem__(self, uuid: str) -> None:
        self._unindex(self[uuid])
        super().__delitem__(uuid)

    def _unindex(self, fact: FactRecord) -> None:
        self.by_group[fact.group_id].discard(fact.uuid)
        self.by_source[fact.source_uuid].discard(fact.uuid)
        self.by_end[fact.source_uuid].discard(fact.uuid)
        self.by_end[fact.target_uuid].discard(fact.uuid)


class Entities(dict[str, EntityRecord]):
    """The stored entities by uuid, indexed by group, by (group, normalised name or alias)
    and by (group, key)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_group: dict[str, set[str]] = defaultdict(set)
        self.by_name: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.by_key: dict[tuple[str, str], set[str]] = defaultdict(set)

    def __setitem__(self, uuid: str, entity: EntityRecord) -> None:
        if uuid in self:
            self._unindex(self[uuid])
        super().__setitem__(uuid, entity)
        group = entity.group_id
        self.by_group[group].add(uuid)
        for name in {normalize_name(entity.name), *entity.aliases}:
            self.by_name[(group, name)].add(uuid)
        if entity.key is not None:
            self.by_key[(group, entity.key)].add(uuid)

    def __delitem__(self, uuid: str) -> None:
        self._unindex(self[uuid])
        super().__delitem__(uuid)

    def _unindex(self, entity: EntityRecord) -> None:
        group = entity.group_id
        self.by_group[group].discard(entity.uuid)
        for name in {normalize_name(entity.name), *entity.aliases}:
            self.by_name[(group, name)].discard(entity.uuid)
        if entity.key is not None:
            self.by_key[(group, entity.key)].discard(entity.uuid)


@dataclass
class StoredCommunity:
    group_id: str
    name: str
    summary: str
    name_embedding: list[float] | None = None
    created_at: datetime | None = None


class MemorySearch(Search):
    """``Search`` by brute force over the memory store's dictionaries."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def fulltext_search(
        self, scope: SearchScope, kind: Kind, text: str, limit: int
    ) -> list[Hit]:
        terms = set(search_terms(text))
        rules.check_kind(kind)
        if not terms or limit <= 0:
            return []

        def score(text: str, _: list[float] | None) -> float | None:
            found = len(terms & text_words(text))
            return float(found) if found else None

        return self._search(scope, kind, score, limit)

    async def vector_search(
        self, scope: SearchScope, kind: Kind, embedding: list[float], limit: int
    ) -> list[Hit]:
        vector = check_embedding(embedding, self.store._dimension(), "query embedding")
        rules.check_kind(kind)
        if vector is None or limit <= 0:
            return []

        def score(_: str, stored: list[float] | None) -> float | None:
            return None if stored is None else cosine_score(cosine(stored, vector))

        return self._search(scope, kind, score, limit)

    async def expand_facts(
        self, scope: SearchScope, seeds: list[str], hops: int, limit: int
    ) -> list[Hit]:
        if not seeds or hops < 1 or limit <= 0:
            return []
        hits = []
        for group_id in unique(scope.group_ids):
            nearest = await rules.expanded(self._touching(group_id, scope.asof), seeds, hops, limit)
            hits += [self._fact_hit(f, 1 / d, scope.asof, d) for f, d in nearest]
        return rules.best(hits, limit)

    async def recent_episode_entities(self, scope: SearchScope, episodes: int) -> list[str]:
        found: list[str] = []
        for group_id in unique(scope.group_ids):
            seen = [
                e
                for e in self._of_group(self.store._episodes, group_id)
                if rules.episode_seen(e, scope.asof)
            ]
            latest = sorted(seen, key=lambda e: (e.valid_at, e.uuid), reverse=True)[
                : max(episodes, 0)
            ]
            for episode in latest:
                found += sorted(e for ep, e in self.store._mentions if ep == episode.uuid)
        return unique(found)

    async def entity_distances(
        self, scope: SearchScope, centre: str, uuids: list[str], max_hops: int
    ) -> dict[str, int]:
        walks = [self._touching(g, scope.asof) for g in unique(scope.group_ids)]
        return await rules.distances(walks, centre, uuids, max_hops)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _of_group(records: dict[str, EpisodeRecord], group_id: str) -> Iterator[EpisodeRecord]:
        return (r for r in records.values() if r.group_id == group_id)

    def _touching(
        self, group_id: str, asof: AsOf
    ) -> Callable[[list[str]], Awaitable[list[FactRecord]]]:
        async def facts_of(entity_uuids: list[str]) -> list[FactRecord]:
            ends = set(entity_uuids)
            return [
                f.model_copy(deep=True)
                for f in self.store._facts.values()
                if f.group_id == group_id
                and {f.source_uuid, f.target_uuid} & ends
                and asof.believed(f)
            ]

        return facts_of

    def _search(
        self,
        scope: SearchScope,
        kind: Kind,
        score: Callable[[str, list[float] | None], float | None],
        limit: int,
    ) -> list[Hit]:
        hits = []
        for group_id in unique(scope.group_ids):
            for record, text, embedding in self._candidates(group_id, kind, scope.asof):
                found = score(text, embedding)
                if found is not None:
                    hits.append(self._hit(record, group_id, found, scope.asof))
        return rules.best(hits, limit)

    def _candidates(self, group_id: str, kind: Kind, asof: AsOf) -> list[Candidate]:
        """The group's records of ``kind`` that the scope sees, with text and embedding."""
        if kind == "fact":
            return [
                (f.model_copy(deep=True), f.fact, f.fact_embedding)
                for f in self.store._facts.values()
                if f.group_id == group_id and asof.believed(f)
            ]
        if kind == "entity":
            return [
                (e.model_copy(deep=True), f"{e.name} {e.summary}", e.name_embedding)
                for e in self.store._entities.values()
                if e.group_id == group_id and rules.known_by(e.created_at, asof)
            ]
        if kind == "episode":
            return [
                (e.model_copy(deep=True), e.content, e.content_embedding)
                for e in self._of_group(self.store._episodes, group_id)
                if rules.episode_seen(e, asof)
            ]
        return [
            (self._community(uuid, c), f"{c.name} {c.summary}", c.name_embedding)
            for uuid, c in self.store._communities.items()
            if c.group_id == group_id and rules.known_by(c.created_at, asof)
        ]

    def _community(self, uuid: str, stored: StoredCommunity) -> CommunityRecord:
        members = sorted(e for c, e in self.store._members if c == uuid)
        embedding = None if stored.name_embedding is None else list(stored.name_embedding)
        return CommunityRecord(
            uuid, stored.name, stored.summary, members, embedding, stored.created_at
        )

    def _hit(
        self,
        record: FactRecord | EntityRecord | EpisodeRecord | CommunityRecord,
        group_id: str,
        score: float,
        asof: AsOf,
    ) -> Hit:
        if isinstance(record, FactRecord):
            return self._fact_hit(record, score, asof, None)
        if isinstance(record, EntityRecord):
            producers = rules.latest_first(
                (self.store._episodes[ep].valid_at, self.store._episodes[ep].producer_id)
                for ep, e in self.store._mentions
                if e == record.uuid and rules.known_by(self.store._episodes[ep].created_at, asof)
            )
            return rules.entity_hit(record, score, producers)
        if isinstance(record, EpisodeRecord):
            return rules.episode_hit(record, score)
        return rules.community_hit(record, group_id, score)

    def _fact_hit(self, fact: FactRecord, score: float, asof: AsOf, distance: int | None) -> Hit:
        names = {u: self.store._entities[u].name for u in (fact.source_uuid, fact.target_uuid)}
        producers = {
            u: episode.producer_id
            for u in fact.episodes
            if (episode := self.store._episodes.get(u)) is not None
            and episode.group_id == fact.group_id
        }
        return rules.fact_hit(fact, score, asof, names, producers, distance)
