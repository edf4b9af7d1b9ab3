"""An exact in-memory ``SearchSource`` (tidegraph/recall/source.py) over hand-built records,
for the unit tests of memory retrieval, and helpers to build those records.

Scope as the protocol says: only the scope's groups; facts ``AsOf.believed``; entities
created by known_at; episodes created by known_at that happened by valid_at. BM25 is the
textbook one (k1 1.2, b 0.75) over lower-cased words without stop words; vector search is
exact cosine scored ``(1 + cos) / 2``. Every search is recorded in ``calls``."""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tidegraph.embed.base import cosine
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.records.graph import CommunityRecord, EntityRecord, EpisodeRecord, FactRecord
from tidegraph.records.search import Hit, Kind, Record, SearchScope

G = "g"
T0 = datetime(2024, 1, 1, tzinfo=UTC)
K0 = datetime(2024, 1, 1, tzinfo=UTC)
EMBEDDER = HashingEmbedder(dim=64)
_STOP = frozenset("a an and are as at be by for from has have in is it of on or the to was".split())


def day(n: int) -> datetime:
    return T0 + timedelta(days=n)


def words(text: str) -> list[str]:
    return [w for w in re.findall(r"\w+", text.casefold()) if w not in _STOP]


def embed(text: str) -> list[float]:
    return EMBEDDER.embed_sync(text)


def entity(uuid: str, name: str, summary: str = "", group: str = G, **kw: Any) -> EntityRecord:
    return EntityRecord(
        uuid=uuid,
        group_id=group,
        name=name,
        summary=summary,
        name_embedding=embed(name),
        created_at=kw.pop("created_at", K0),
        **kw,
    )


def fact(uuid: str, source: str, target: str, text: str, group: str = G, **kw: Any) -> FactRecord:
    values: dict[str, Any] = {
        "name": "RELATES_TO",
        "valid_at": day(0),
        "created_at": K0,
        "fact_embedding": embed(text),
        **kw,
    }
    return FactRecord(
        uuid=uuid, group_id=group, source_uuid=source, target_uuid=target, fact=text, **values
    )


def episode(uuid: str, content: str, valid_at: datetime, group: str = G) -> EpisodeRecord:
    return EpisodeRecord(
        uuid=uuid,
        group_id=group,
        name=f"msg-{uuid}",
        source="message",
        source_description="chat",
        content=content,
        valid_at=valid_at,
        created_at=valid_at,
        producer_id=f"p-{uuid}",
        content_embedding=embed(content),
    )


def community(uuid: str, name: str, summary: str, members: list[str]) -> CommunityRecord:
    return CommunityRecord(
        uuid=uuid, name=name, summary=summary, members=members, name_embedding=embed(name)
    )


@dataclass
class RecallGraph:
    """Records in dictionaries; ``mentions`` are (episode uuid, entity uuid)."""

    entities: dict[str, EntityRecord] = field(default_factory=dict)
    facts: dict[str, FactRecord] = field(default_factory=dict)
    episodes: dict[str, EpisodeRecord] = field(default_factory=dict)
    communities: dict[str, tuple[str, CommunityRecord]] = field(default_factory=dict)
    mentions: list[tuple[str, str]] = field(default_factory=list)
    calls: list[tuple[str, Kind | None]] = field(default_factory=list)

    def add(self, *records: Record, group: str = G) -> RecallGraph:
        for r in records:
            if isinstance(r, EntityRecord):
                self.entities[r.uuid] = r
            elif isinstance(r, FactRecord):
                self.facts[r.uuid] = r
            elif isinstance(r, EpisodeRecord):
                self.episodes[r.uuid] = r
            else:
                self.communities[r.uuid] = (group, r)
        return self

    def mention(self, episode_uuid: str, *entity_uuids: str) -> RecallGraph:
        self.mentions += [(episode_uuid, e) for e in entity_uuids]
        return self

    # ------------------------------------------------------------------ scope
    def _facts(self, scope: SearchScope) -> list[FactRecord]:
        return [
            f
            for f in self.facts.values()
            if f.group_id in scope.group_ids and scope.asof.believed(f)
        ]

    def _episodes(self, scope: SearchScope) -> list[EpisodeRecord]:
        asof = scope.asof
        return [
            e
            for e in self.episodes.values()
            if e.group_id in scope.group_ids
            and (e.created_at is None or e.created_at <= asof.known_at)
            and e.valid_at <= asof.valid_at
        ]

    def _candidates(self, scope: SearchScope, kind: Kind) -> list[Record]:
        if kind == "fact":
            return list(self._facts(scope))
        if kind == "episode":
            return list(self._episodes(scope))
        if kind == "entity":
            return [
                e
                for e in self.entities.values()
                if e.group_id in scope.group_ids
                and (e.created_at is None or e.created_at <= scope.asof.known_at)
            ]
        return [c for g, c in self.communities.values() if g in scope.group_ids]

    def hit(self, kind: Kind, record: Record, score: float, scope: SearchScope) -> Hit:
        group = getattr(record, "group_id", None) or self.communities[record.uuid][0]
        hit = Hit(kind=kind, uuid=record.uuid, score=score, record=record, group_id=group)
        if isinstance(record, FactRecord):
            hit.episodes = [self.episodes[e].producer_id for e in record.episodes]
            hit.subject = self.entities[record.source_uuid].name
            hit.object = self.entities[record.target_uuid].name
        elif isinstance(record, EntityRecord):
            seen = {e.uuid for e in self._episodes(scope)}
            by = [ep for ep, en in self.mentions if en == record.uuid and ep in seen]
            hit.episodes = [self.episodes[ep].producer_id for ep in by]
            hit.mentions = len(by)
        return hit

    # ------------------------------------------------------------------ SearchSource
    async def fulltext_search(
        self, scope: SearchScope, kind: Kind, text: str, limit: int
    ) -> list[Hit]:
        self.calls.append(("fulltext", kind))
        docs = [(r, words(_document(r))) for r in self._candidates(scope, kind)]
        terms = set(words(text))
        if not docs or not terms:
            return []
        average = sum(len(d) for _, d in docs) / len(docs)
        frequency = Counter(t for _, d in docs for t in set(d))
        scored = []
        for record, doc in docs:
            counts = Counter(doc)
            score = 0.0
            for term in terms & counts.keys():
                idf = math.log(1 + (len(docs) - frequency[term] + 0.5) / (frequency[term] + 0.5))
                tf = counts[term]
                score += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(doc) / average))
            if score > 0:
                scored.append((score, record))
        scored.sort(key=lambda s: (-s[0], s[1].uuid))
        return [self.hit(kind, r, s, scope) for s, r in scored[:limit]]

    async def vector_search(
        self, scope: SearchScope, kind: Kind, embedding: list[float], limit: int
    ) -> list[Hit]:
        self.calls.append(("vector", kind))
        scored = []
        for record in self._candidates(scope, kind):
            vector = Hit(kind, record.uuid, 0.0, record, "").embedding
            if vector is not None:
                scored.append(((1 + cosine(vector, embedding)) / 2, record))
        scored.sort(key=lambda s: (-s[0], s[1].uuid))
        return [self.hit(kind, r, s, scope) for s, r in scored[:limit]]

    async def expand_facts(
        self, scope: SearchScope, seeds: list[str], hops: int, limit: int
    ) -> list[Hit]:
        self.calls.append(("bfs", "fact"))
        facts = self._facts(scope)
        reached = set(seeds)
        frontier = set(seeds)
        found: dict[str, tuple[int, FactRecord]] = {}
        for hop in range(1, hops + 1):
            step = [
                f
                for f in facts
                if f.uuid not in found and {f.source_uuid, f.target_uuid} & frontier
            ]
            for f in step:
                found[f.uuid] = (hop, f)
            frontier = {u for f in step for u in (f.source_uuid, f.target_uuid)} - reached
            reached |= frontier
        ordered = sorted(found.values(), key=lambda p: (p[0], p[1].uuid))[:limit]
        hits = []
        for hop, f in ordered:
            hit = self.hit("fact", f, 1.0 / hop, scope)
            hit.distance = hop
            hits.append(hit)
        return hits

    async def recent_episode_entities(self, scope: SearchScope, episodes: int) -> list[str]:
        self.calls.append(("recent", None))
        recent = sorted(self._episodes(scope), key=lambda e: (e.valid_at, e.uuid), reverse=True)
        uuids: list[str] = []
        for ep in recent[:episodes]:
            uuids += [en for e, en in self.mentions if e == ep.uuid and en not in uuids]
        return uuids

    async def entity_distances(
        self, scope: SearchScope, centre: str, uuids: list[str], max_hops: int
    ) -> dict[str, int]:
        self.calls.append(("distances", None))
        distance = {centre: 0}
        queue = deque([centre])
        facts = self._facts(scope)
        while queue:
            node = queue.popleft()
            if distance[node] == max_hops:
                continue
            for f in facts:
                if node in (f.source_uuid, f.target_uuid):
                    other = f.target_uuid if node == f.source_uuid else f.source_uuid
                    if other not in distance:
                        distance[other] = distance[node] + 1
                        queue.append(other)
        return {u: distance[u] for u in uuids if u in distance}


def _document(record: Record) -> str:
    if isinstance(record, FactRecord):
        return record.fact
    if isinstance(record, EpisodeRecord):
        return record.content
    return f"{record.name} {record.summary}"
