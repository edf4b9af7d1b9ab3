"""An exact in-memory ``SearchSource`` (tidegraph/recall/source.py) over hand-built records,
for the unit tests of memory retrieval, and helpers to build those records.

Scope as the protocol says: only the scope's groups; facts ``AsOf.believed``; entities
created by known_at; episodes created by known_at that happened by valid_at. BM25 is the
textbook one (k1 1.2, b 0.75) over lower-cased words without stop words; vector search is
exact cosine scored ``(1 + cos) / 2``. Every search is recorded in ``calls``."""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.recall.rerank import CrossEncoder
from tidegraph.records.graph import CommunityRecord, EntityRecord, EpisodeRecord, FactRecord
from tidegraph.records.search import Hit, Kind, MethodSearch, Record, SearchScope
from tidegraph.records.vectors import cosine

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
    seeds: list[list[str]] = field(default_factory=list)  # of each expand_facts call

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
        if not scope.details:
            return hit
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
    async def complete_hits(self, scope: SearchScope, hits: Sequence[Hit]) -> list[Hit]:
        self.calls.append(("complete", None))
        if scope.details:
            return list(hits)
        detailed = dataclasses.replace(scope, details=True)
        done = []
        for hit in hits:
            full = self.hit(hit.kind, hit.record, hit.score, detailed)
            full.distance = hit.distance
            done.append(full)
        return done

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

    async def search_lists(
        self, scope: SearchScope, searches: Sequence[MethodSearch]
    ) -> list[list[Hit]]:
        found = []
        for search in searches:
            if search.text is not None:
                found.append(
                    await self.fulltext_search(scope, search.kind, search.text, search.limit)
                )
            else:
                assert search.embedding is not None
                found.append(
                    await self.vector_search(scope, search.kind, search.embedding, search.limit)
                )
        return found

    async def expand_facts(
        self, scope: SearchScope, seeds: list[str], hops: int, limit: int
    ) -> list[Hit]:
        self.calls.append(("bfs", "fact"))
        self.seeds.append(list(seeds))
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


def people_graph() -> RecallGraph:
    """Alice worked at Acme (days 0-100), then at Globex; Bob is her friend and likes tea;
    Acme is in Paris. Three episodes, one community, and one fact of another group that no
    search of group ``g`` may ever see."""
    graph = RecallGraph()
    graph.add(
        entity("alice", "Alice Smith", "software engineer"),
        entity("acme", "Acme Corp", "a software company"),
        entity("globex", "Globex", "a logistics company"),
        entity("bob", "Bob Jones", "Alice's friend"),
        entity("paris", "Paris", "capital of France"),
        entity("tea", "green tea"),
        entity("initech", "Initech", group="other"),
        fact(
            "f_acme",
            "alice",
            "acme",
            "Alice Smith works at Acme Corp as an engineer",
            name="WORKS_AT",
            valid_at=day(0),
            invalid_at=day(100),
            expired_at=K0,
            episodes=["e1"],
        ),  # fmt: skip
        fact(
            "f_globex",
            "alice",
            "globex",
            "Alice Smith works at Globex",
            name="WORKS_AT",
            valid_at=day(100),
            episodes=["e2"],
        ),  # fmt: skip
        fact("f_paris", "acme", "paris", "Acme Corp is headquartered in Paris", episodes=["e1"]),
        fact("f_friend", "bob", "alice", "Bob Jones is a friend of Alice Smith", episodes=["e3"]),
        fact("f_tea", "bob", "tea", "Bob Jones likes green tea", episodes=["e3"]),
        fact("f_other", "initech", "initech", "Alice Smith works at Initech", group="other"),
        episode("e1", "Alice started at Acme Corp today, as an engineer in Paris.", day(0)),
        episode("e2", "Alice told us she moved to Globex.", day(100)),
        episode("e3", "Bob had green tea with Alice and talked about her new job.", day(120)),
    )
    graph.add(community("c_acme", "Acme people", "Alice Smith and Acme Corp, in Paris",
                        ["alice", "acme", "paris"]))  # fmt: skip
    graph.mention("e1", "alice", "acme", "paris")
    graph.mention("e2", "alice", "globex")
    graph.mention("e3", "bob", "alice", "tea")
    return graph


class LengthEncoder(CrossEncoder):
    """Scores a text by its length (a stand-in for a model)."""

    def __init__(self, answer: list[float] | None = None) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.answer = answer

    async def scores(self, query: str, texts: list[str]) -> list[float]:
        self.calls.append((query, texts))
        return self.answer if self.answer is not None else [float(len(t)) for t in texts]
