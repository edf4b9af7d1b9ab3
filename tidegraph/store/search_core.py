"""The search methods of ``GraphStore`` (README "Memory retrieval"), written once for Neo4j
and kuzu: ``SearchCore`` asks a dialect's search queries (``neo4j_search_queries``,
``kuzu_search_queries``) for scored candidates of one group at a time, reads their records,
keeps those the scope sees (``store.hits``) and turns them into hits.

Each group is asked on its own, so a hit, and everything it carries (mentions, producer ids,
entity names), is of one group. Candidates the scope does not see (a fact not believed then,
an entity created later) are dropped after the index answered, so more are asked for until
``limit`` hits are found or the index has no more (``_seen``).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Iterable
from types import ModuleType
from typing import Any

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import CommunityRecord, EntityRecord, FactRecord
from tidegraph.records.search import Hit, Kind, SearchScope
from tidegraph.store import common_queries as cq
from tidegraph.store.base import GraphStore
from tidegraph.store.executor import Executor
from tidegraph.store.hits import (
    best,
    check_kind,
    community_hit,
    distances,
    entity_hit,
    episode_hit,
    episode_seen,
    expanded,
    fact_hit,
    known_by,
)
from tidegraph.store.rows import (
    check_embedding,
    episode_record,
    to_utc,
    top,
    unique,
    vector_candidates,
)

# How many candidates one group is asked for at most (``_seen``).
MAX_CANDIDATES = 10_000
Found = Callable[[int], Awaitable[list[tuple[str, float]]]]


class SearchCore(GraphStore):
    """The search methods over an executor, given the hooks ``StoreCore`` implements."""

    ex: Executor
    sq: ModuleType  # the dialect's search queries

    @abc.abstractmethod
    async def _embedding_dim(self) -> int: ...

    @abc.abstractmethod
    async def _facts_by_uuids(self, group_id: str, uuids: list[str]) -> list[FactRecord]: ...

    @abc.abstractmethod
    async def _producers(self, group_id: str, episode_uuids: Iterable[str]) -> dict[str, str]: ...

    # ------------------------------------------------------------------ the methods
    async def fulltext_search(
        self, scope: SearchScope, kind: Kind, text: str, limit: int
    ) -> list[Hit]:
        kind = check_kind(kind)
        query = self.sq.fulltext_query(text)
        if query is None or limit <= 0:
            return []
        hits: list[Hit] = []
        for group_id in unique(scope.group_ids):

            async def found(k: int, group_id: str = group_id) -> list[tuple[str, float]]:
                params = {"group_id": group_id, "query": query, "limit": k}
                rows = await self.ex.rows(self.sq.FULLTEXT[kind], params)
                return [(r["uuid"], float(r["score"])) for r in rows]

            hits += await self._seen(group_id, kind, scope.asof, found, limit)
        return best(hits, limit)

    async def vector_search(
        self, scope: SearchScope, kind: Kind, embedding: list[float], limit: int
    ) -> list[Hit]:
        candidates, scan = self.sq.VECTOR[check_kind(kind)]
        hits: list[Hit] = []
        for group_id in unique(scope.group_ids):

            async def found(k: int, group_id: str = group_id) -> list[tuple[str, float]]:
                return await self._nearest(candidates, scan, [group_id], embedding, k)

            hits += await self._seen(group_id, kind, scope.asof, found, limit)
        return best(hits, limit)

    async def expand_facts(
        self, scope: SearchScope, seeds: list[str], hops: int, limit: int
    ) -> list[Hit]:
        if not seeds or hops < 1 or limit <= 0:
            return []
        hits: list[Hit] = []
        for group_id in unique(scope.group_ids):
            facts_of = self._believed_touching(group_id, scope.asof)
            nearest = await expanded(facts_of, seeds, hops, limit)
            hits += await self._fact_hits(group_id, scope.asof, [(f, 1 / d, d) for f, d in nearest])
        return best(hits, limit)

    async def recent_episode_entities(self, scope: SearchScope, episodes: int) -> list[str]:
        if episodes <= 0:
            return []
        asof = scope.asof
        found: list[str] = []
        for group_id in unique(scope.group_ids):
            params = {
                "group_id": group_id,
                "valid_at": asof.valid_at,
                "known_at": asof.known_at,
                "limit": episodes,
            }
            latest = [r["uuid"] for r in await self.ex.rows(cq.RECENT_EPISODE_UUIDS, params)]
            if not latest:
                continue
            params = {"group_id": group_id, "uuids": latest}
            mentioned: dict[str, list[str]] = {}
            for row in await self.ex.rows(cq.EPISODE_MENTIONS, params):
                mentioned.setdefault(row["episode"], []).append(row["entity"])
            found += [e for episode in latest for e in sorted(mentioned.get(episode, []))]
        return unique(found)

    async def entity_distances(
        self, scope: SearchScope, centre: str, uuids: list[str], max_hops: int
    ) -> dict[str, int]:
        walks = [self._believed_touching(g, scope.asof) for g in unique(scope.group_ids)]
        return await distances(walks, centre, uuids, max_hops)

    # ------------------------------------------------------------------ candidates -> hits
    async def _nearest(
        self,
        candidates: str | None,
        scan: str,
        group_ids: list[str],
        embedding: list[float] | None,
        limit: int,
    ) -> list[tuple[str, float]]:
        """(uuid, score) of the groups' nearest neighbours, best first: from the engine's
        global vector index (``candidates``: its top neighbours, rescored exactly on the stored
        vectors), or by an exact ``scan`` of the groups when the index's top candidates hold
        too few of them (or the engine indexes none)."""
        vector = check_embedding(embedding, await self._embedding_dim(), "query embedding")
        if limit <= 0 or vector is None:
            return []
        k = vector_candidates(limit)
        params = {"group_ids": group_ids, "embedding": vector}
        found = await self.ex.rows(candidates, {**params, "k": k}) if candidates else []
        wanted = set(group_ids)
        hits = [(r["uuid"], float(r["score"])) for r in found if r["group_id"] in wanted]
        if candidates is None or (len(hits) < limit and len(found) >= k):
            scanned = await self.ex.rows(scan, {**params, "limit": limit})
            hits = [(r["uuid"], float(r["score"])) for r in scanned]
        return top(((u, min(1.0, max(0.0, s))) for u, s in hits), limit)

    def _believed_touching(
        self, group_id: str, asof: AsOf
    ) -> Callable[[list[str]], Awaitable[list[FactRecord]]]:
        async def facts_of(entity_uuids: list[str]) -> list[FactRecord]:
            return [
                f for f in await self.facts_touching(group_id, entity_uuids) if asof.believed(f)
            ]

        return facts_of

    async def _seen(
        self, group_id: str, kind: Kind, asof: AsOf, found: Found, limit: int
    ) -> list[Hit]:
        """The best ``limit`` hits of the candidates ``found(k)`` gives (the best k of the
        group, best first) that the scope sees: k grows until enough are seen or no more."""
        k = max(4 * limit, 20)
        while True:
            scored = await found(k)
            hits = await self._hits(group_id, kind, asof, dict(scored))
            if len(hits) >= limit or len(scored) < k or k >= MAX_CANDIDATES:
                return best(hits, limit)
            k *= 4

    async def _hits(
        self, group_id: str, kind: Kind, asof: AsOf, scores: dict[str, float]
    ) -> list[Hit]:
        """The hits of the scored uuids of the group that the scope sees."""
        uuids = list(scores)
        if not uuids:
            return []
        if kind == "fact":
            facts = [f for f in await self._facts_by_uuids(group_id, uuids) if asof.believed(f)]
            return await self._fact_hits(group_id, asof, [(f, scores[f.uuid], None) for f in facts])
        if kind == "entity":
            return await self._entity_hits(group_id, asof, scores)
        params = {"group_id": group_id, "uuids": uuids}
        if kind == "episode":
            rows = await self.ex.rows(self.sq.EPISODES_BY_UUIDS, params)
            episodes = (episode_record(r["ep"]) for r in rows)
            return [episode_hit(e, scores[e.uuid]) for e in episodes if episode_seen(e, asof)]
        return [
            community_hit(c, group_id, scores[c.uuid])
            for c in await self._communities_by_uuids(params)
            if known_by(c.created_at, asof)
        ]

    async def _fact_hits(
        self, group_id: str, asof: AsOf, facts: list[tuple[FactRecord, float, int | None]]
    ) -> list[Hit]:
        ends = unique(u for f, _, _ in facts for u in (f.source_uuid, f.target_uuid))
        names = {e.uuid: e.name for e in await self.entities_by_uuids(group_id, ends)}
        producers = await self._producers(group_id, [u for f, _, _ in facts for u in f.episodes])
        return [fact_hit(f, s, asof, names, producers, d) for f, s, d in facts]

    async def _entity_hits(self, group_id: str, asof: AsOf, scores: dict[str, float]) -> list[Hit]:
        entities: list[EntityRecord] = [
            e
            for e in await self.entities_by_uuids(group_id, list(scores))
            if known_by(e.created_at, asof)
        ]
        params = {
            "group_id": group_id,
            "uuids": [e.uuid for e in entities],
            "known_at": asof.known_at,
        }
        producers: dict[str, list[str]] = {}
        for row in await self.ex.rows(cq.ENTITY_MENTIONS, params) if entities else []:
            producers.setdefault(row["uuid"], []).append(row["producer_id"] or "")
        return [entity_hit(e, scores[e.uuid], producers.get(e.uuid, [])) for e in entities]

    async def _communities_by_uuids(self, params: dict[str, Any]) -> list[CommunityRecord]:
        heads = await self.ex.rows(cq.COMMUNITIES_BY_UUIDS, params)
        members: dict[str, list[str]] = {}
        for row in await self.ex.rows(cq.COMMUNITY_MEMBERS_OF, params):
            members.setdefault(row["community"], []).append(row["entity"])
        return [
            CommunityRecord(
                uuid=r["uuid"],
                name=r["name"] or "",
                summary=r["summary"] or "",
                members=sorted(members.get(r["uuid"], [])),
                name_embedding=None if r["name_embedding"] is None else list(r["name_embedding"]),
                created_at=to_utc(r["created_at"]),
            )
            for r in heads
        ]
