"""The search methods of the Cypher store (docs/retrieval.md "Memory retrieval"; the embedded
store's:
``sqlite/search.py``): ``Neo4jSearch`` asks the search queries (``search_queries``)
for scored candidates of one group at a time, reads their records,
keeps those the scope sees (``store.hits``) and turns them into hits.

Each group is asked on its own, so a hit, and everything it carries (mentions, producer ids,
entity names), is of one group. Candidates the scope does not see (a fact not believed then,
an entity created later) are dropped after the index answered, so more are asked for until
``limit`` hits are found or the index has no more (``_seen``).
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import CommunityRecord, FactRecord
from tidegraph.records.search import Hit, Kind, SearchScope
from tidegraph.stores.episode_search import episode_query, lucene_episode_query
from tidegraph.stores.executor import Params
from tidegraph.stores.hits import (
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
    with_mentions,
)
from tidegraph.stores.neo4j import common_queries as cq
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j import search_queries as sq
from tidegraph.stores.roles import Search
from tidegraph.stores.rows import (
    check_embedding,
    entity_record,
    episode_record,
    fact_of,
    to_utc,
    top,
    unique,
    vector_candidates,
)
from tidegraph.stores.search_text import search_terms

if TYPE_CHECKING:
    from tidegraph.stores.neo4j.core import StoreCore

# How many candidates one group is asked for at most (``_seen``; the statements find only
# what the scope sees, so k grows only past facts whose end or start moved later).
MAX_CANDIDATES = 1_000
# The most neighbours a global vector index is asked for (an HNSW search costs about its k)
# before scanning the groups instead.
MAX_VECTOR_K = 1000
# Groups with fewer records of a kind than this are scanned exactly instead of asking the
# global index: a tenant among many holds a small share of the index, and the index query
# that finds its top hits returns hundreds of other tenants' (measured on the Graphiti
# comparison's 16 groups: 22.4 → 32.0 episodes/s, Neo4j's CPU per episode 39 → 25 ms).
SCAN_BELOW = 1000
# How long groups found to hold at least SCAN_BELOW records of a kind skip the check (it
# reads up to SCAN_BELOW records from the group index, a search and kind). Groups only
# shrink by a forget or a delete, and the index path answers a small group correctly too.
LARGE_FOR_SECONDS = 60.0
# The best k candidates of a group, best first, as (uuid, score), with their hits' rows
# (``sq.HITS_BY_UUIDS``) when read with them, else None.
Candidates = tuple[list[tuple[str, float]], list[dict[str, Any]] | None]
Found = Callable[[int], Awaitable[Candidates]]
# Groups holding more records of a kind than this are too large to scan cheaply: rather than
# scan them, the index is asked for MAX_VECTOR_K neighbours first (an exact scan of 100,000
# facts took 1.07 s, an index query of k = 1,000 44-75 ms).
WIDEN_ABOVE = 10_000
# The most neighbours a vector index is asked for, for groups too large to scan
# (``WIDEN_ABOVE``), when it already gave ``limit`` of the groups' records but the search's
# scope sees fewer (a question as of a past time on a long
# history, where most of a slot's facts are closed then): further neighbours are only less
# like the question, and an HNSW query of k = 1,000 cost 3-7 times one of 320 at 60,000
# facts; 160 rather than 320 cut an as-of search's p95 by about an eighth at 100,000 facts,
# every id question still answered right (docs/retrieval.md "Long histories"). The list is
# then what the scope sees among them.
MAX_SCOPED_K = 160
# When groups were last found large and how many records of the kind they held then, by
# (groups, small-scan statement).
LargeGroups = dict[tuple[tuple[str, ...], str | None], tuple[float, int]]
# When a search of groups too large to scan last needed the scoped widening (its scope saw
# too few of the index's first neighbours), by the same key: for LARGE_FOR_SECONDS, the
# next search of those groups asks for MAX_SCOPED_K at once. On a long history most
# searches as of a time need it, and one HNSW query of k = 320 cost less than two, of 80
# then 320 (docs/retrieval.md "Long histories").
ScopedGroups = dict[tuple[tuple[str, ...], str | None], float]


class Neo4jSearch(Search):
    """``Search`` on the Neo4j store's executor; also the nearest-neighbour reads of its
    entity and fact searches (``_nearest``)."""

    scan_below = SCAN_BELOW  # see SCAN_BELOW (an attribute, so that tests can move it)
    widen_above = WIDEN_ABOVE  # see WIDEN_ABOVE (the same)

    def __init__(self, store: StoreCore) -> None:
        self.store = store
        self.ex = store.ex
        self._large_groups: LargeGroups = {}
        self._scoped_groups: ScopedGroups = {}

    # ------------------------------------------------------------------ the methods
    async def fulltext_search(
        self, scope: SearchScope, kind: Kind, text: str, limit: int
    ) -> list[Hit]:
        kind = check_kind(kind)
        words = sq.fulltext_query(text)
        if words is None or limit <= 0:
            return []
        hits: list[Hit] = []
        for group_id in unique(scope.group_ids):
            query = words
            if kind == "episode":
                query = sq.episode_fulltext_query(
                    await self._episode_query(group_id, text), scope.asof
                )
            elif kind == "fact":
                query = sq.fact_fulltext_query(words, scope.asof)
            params = {"group_id": group_id, "query": query, **hit_params(scope)}

            async def found(k: int, params: dict[str, Any] = params) -> Candidates:
                if kind == "community":  # read as hits apart (``_hits``)
                    rows = await self.ex.rows(sq.FULLTEXT[kind], {**params, "limit": k})
                    return [(r["uuid"], float(r["score"])) for r in rows], None
                # the candidates with their hits' rows, in one round trip
                rows = await self.ex.rows(sq.FULLTEXT_HITS[kind], {**params, "limit": k})
                return [(r["uuid"], float(r["score"])) for r in rows], rows

            hits += await self._seen(group_id, kind, scope, found, limit)
        return best(hits, limit)

    async def _episode_query(self, group_id: str, text: str) -> str:
        """The Lucene query of ``text`` over the group's episodes' conversation fields
        (``episode_search``: which of its words name one of the group's speakers is read)."""
        terms = search_terms(text)
        rows = await self.ex.rows(q.SPEAKER_WORDS, {"group_id": group_id, "words": terms})
        query = episode_query(text, [r["word"] for r in rows])
        assert query is not None  # the text has terms (fulltext_query said so)
        return lucene_episode_query(query, q.EPISODE_INDEX_FIELDS)

    async def vector_search(
        self, scope: SearchScope, kind: Kind, embedding: list[float], limit: int
    ) -> list[Hit]:
        kind = check_kind(kind)
        # of the records the scope sees, facts, entities and episodes with their hits' rows
        candidates, scan, small = sq.SEARCH_VECTOR[kind]
        hits: list[Hit] = []
        for group_id in unique(scope.group_ids):
            reads = {"group_id": group_id, **hit_params(scope)}

            async def found(k: int, group_id: str = group_id, reads: Params = reads) -> Candidates:
                return await self._nearest(candidates, scan, [group_id], embedding, k, small, reads)

            hits += await self._seen(group_id, kind, scope, found, limit)
        return best(hits, limit)

    async def expand_facts(
        self, scope: SearchScope, seeds: list[str], hops: int, limit: int
    ) -> list[Hit]:
        if not seeds or hops < 1 or limit <= 0:
            return []
        hits: list[Hit] = []
        for group_id in unique(scope.group_ids):
            # the hit rows of the facts the walk keeps, read by the walk (``sq.WALK_HITS``)
            rows: dict[str, dict[str, Any]] = {}
            facts_of = self._believed_touching(group_id, scope.asof, limit, (scope, rows))
            hops_of = {f.uuid: d for f, d in await expanded(facts_of, seeds, hops, limit)}
            scores = {uuid: 1 / d for uuid, d in hops_of.items()}
            whole = [rows[uuid] for uuid in hops_of if uuid in rows]
            hits += _hits_of_rows("fact", scope.asof, whole, scores, hops_of)
            unread = {uuid: score for uuid, score in scores.items() if uuid not in rows}
            hits += await self._hits(group_id, "fact", scope, unread, hops_of)
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
            rows = await self.ex.rows(cq.RECENT_EPISODE_ENTITIES, params)
            found += [entity for row in rows for entity in row["entities"]]
        return unique(found)

    async def entity_distances(
        self, scope: SearchScope, centre: str, uuids: list[str], max_hops: int
    ) -> dict[str, int]:
        walks = [self._believed_touching(g, scope.asof) for g in unique(scope.group_ids)]
        return await distances(walks, centre, uuids, max_hops)

    async def complete_hits(self, scope: SearchScope, hits: Sequence[Hit]) -> list[Hit]:
        """The entity hits read without their details with their producers (facts,
        episodes and communities always carry theirs here), one read per group; an entity
        deleted since its candidate was read is left out."""
        if scope.details:
            return list(hits)
        producers: dict[tuple[str, str], list[str]] = {}
        for group_id in unique(h.group_id for h in hits):
            uuids = [h.uuid for h in hits if h.kind == "entity" and h.group_id == group_id]
            if not uuids:
                continue
            params = {"group_id": group_id, "uuids": uuids, "known_at": scope.asof.known_at}
            for row in await self.ex.rows(sq.ENTITY_PRODUCERS_BY_UUIDS, params):
                producers[group_id, row["uuid"]] = _producer_ids(row["producers"])
        return [
            with_mentions(h, producers[h.group_id, h.uuid]) if h.kind == "entity" else h
            for h in hits
            if h.kind != "entity" or (h.group_id, h.uuid) in producers
        ]

    # ------------------------------------------------------------------ candidates -> hits
    async def _nearest(
        self,
        candidates: str | None,
        scan: str,
        group_ids: list[str],
        embedding: list[float] | None,
        limit: int,
        small_scan: str | None = None,
        reads: Params | None = None,
    ) -> Candidates:
        """(uuid, score) of the groups' nearest neighbours, best first: by an exact scan when
        the groups hold fewer than ``scan_below`` records of the kind (``small_scan``); else from
        Neo4j's global vector index (``candidates``: its top
        k neighbours, rescored exactly on the stored vectors; k grows while too few are of
        the groups), or by an exact ``scan`` of the groups when more than ``MAX_VECTOR_K``
        neighbours would be needed (a small group among many) or no index holds the kind;
        groups too large to scan cheaply (``widen_above``) are asked for ``MAX_VECTOR_K`` and
        answered from them, never scanned. With the
        statements of ``sq.VECTOR_HITS`` and ``sq.SMALL_SCAN_HITS`` (and their ``reads``
        parameters), the hits' rows come with the best, else None."""
        vector = check_embedding(embedding, await self.store._embedding_dim(), "query embedding")
        if limit <= 0 or vector is None:
            return [], None
        params = {**(reads or {}), "group_ids": group_ids, "embedding": vector, "limit": limit}
        large = (tuple(sorted(group_ids)), small_scan)
        held = self._still_large(large)  # the groups' records of the kind, when large
        if small_scan is not None and held is None:
            bounds = {"limit": limit, "scan_below": self.scan_below}
            [row] = await self.ex.rows(small_scan, {**params, **bounds})
            if row["small"]:
                return _best(row["hits"], limit), row.get("records")
            held = int(row["held"])
            self._large_groups[large] = (time.monotonic(), held)
        k = vector_candidates(limit)
        if held is not None and held > self.widen_above and self._fresh(self._scoped_groups, large):
            k = max(k, MAX_SCOPED_K)
        while candidates is not None:
            [row] = await self.ex.rows(candidates, {**params, "k": k})
            hits = row["hits"]
            if len(hits) >= limit or row["found"] < k:
                return _best(hits, limit), row.get("records")
            large_enough = held is not None and held > self.widen_above
            # Groups too large to scan, whose records the index gave enough of: the scope's
            # filter, not the groups' share of the index, leaves the list short.
            scoped = large_enough and row["of_groups"] >= limit
            if scoped:
                self._scoped_groups[large] = time.monotonic()
            if scoped and k >= MAX_SCOPED_K:
                return _best(hits, limit), row.get("records")
            # Each round trip costs more than a larger k (an HNSW query's cost grows slowly
            # with k), so k grows in few large steps: fourfold, or enough for ``limit`` at the
            # share of the groups seen so far with a margin. A group too small a share of the
            # index for that is scanned, unless the groups are too large to scan cheaply
            # (``widen_above``): a query near other tenants' records finds none of a large
            # group's among its first candidates, so the index is asked for MAX_VECTOR_K.
            share = len(hits) / row["found"]
            if share:
                needed = max(4 * k, math.ceil(2 * limit / share))
            else:
                needed = MAX_VECTOR_K if large_enough else MAX_VECTOR_K + 1
            if scoped:
                k = min(needed, MAX_SCOPED_K)
                continue
            if needed > MAX_VECTOR_K:
                if not large_enough:
                    break
                if k >= MAX_VECTOR_K:
                    # Too large to scan within a search's time and memory: the index's widest
                    # answer is the answer (what the scope sees among its neighbours).
                    return _best(hits, limit), row.get("records")
                needed = MAX_VECTOR_K
            k = needed
        scanned = await self.ex.rows(scan, params)
        return _best(((r["uuid"], r["score"]) for r in scanned), limit), None

    def _still_large(self, key: tuple[tuple[str, ...], str | None]) -> int | None:
        """How many records of the kind the groups held when found large, if that was within
        LARGE_FOR_SECONDS."""
        seen = self._large_groups.get(key)
        if seen is None or time.monotonic() - seen[0] >= LARGE_FOR_SECONDS:
            return None
        return seen[1]

    @staticmethod
    def _fresh(when: ScopedGroups, key: tuple[tuple[str, ...], str | None]) -> bool:
        """Whether ``when`` holds a time for ``key`` within LARGE_FOR_SECONDS."""
        at = when.get(key)
        return at is not None and time.monotonic() - at < LARGE_FOR_SECONDS

    def _believed_touching(
        self,
        group_id: str,
        asof: AsOf,
        per_entity: int | None = None,
        hit_rows: tuple[SearchScope, dict[str, dict[str, Any]]] | None = None,
    ) -> Callable[[list[str]], Awaitable[list[FactRecord]]]:
        """The walk's read: the group's facts touching some entities that the scope sees, as
        light records (``sq.FACTS_NEAR``: ends and times; a walk may read hundreds).

        ``hit_rows`` (a search's scope and a dict; with ``per_entity``): the read also gives
        the hit rows (the columns of ``sq.HITS_BY_UUIDS["fact"]``) of the first
        ``per_entity`` facts in the walk's order (``sq.WALK_HITS``), kept in the dict by uuid:
        the facts a walk that stops at this read keeps need no read of their own.

        ``per_entity`` (a walk that keeps at most that many facts, ``expanded``): of each
        entity only the first that many by uuid. The walk's answer is the same: a fact left
        out has that many before it (by hop, then seed, then uuid) from the entity it would be
        ranked by, and the walk stops at this read. The statement's filter lets through a
        superset of what the scope believes (``sq.seen_by_scope``): when an entity's facts
        were cut and some read are not believed, they are read again without the cut."""

        near, indexed = sq.FACTS_NEAR, sq.FACTS_NEAR_INDEXED
        scoped: dict[str, Any] = scope_params(asof)
        if hit_rows is not None:
            near, indexed = sq.WALK_HITS, sq.WALK_HITS_INDEXED
            scoped = {**hit_params(hit_rows[0]), "whole": per_entity or 0}

        async def read(uuids: list[str], cut: int | None) -> list[dict[str, Any]]:
            params = {
                "group_id": group_id,
                "uuids": uuids,
                "per_entity": sys.maxsize if cut is None else cut,
                **scoped,
            }
            query = sq.walk_fulltext_query(uuids, asof)
            if query is not None:
                rows = await self.ex.rows(indexed, {**params, "query": query})
            else:
                rows = [row for query in near for row in await self.ex.rows(query, params)]
            if hit_rows is not None:  # the rows read whole carry their producers
                hit_rows[1].update((r["r"]["uuid"], r) for r in rows if r["producers"] is not None)
            return rows

        async def facts_of(entity_uuids: list[str]) -> list[FactRecord]:
            uuids = unique(entity_uuids)
            asked = set(uuids)
            facts = [fact_of(row) for row in await read(uuids, per_entity)]
            believed = [f for f in facts if asof.believed(f)]
            if per_entity is not None and len(believed) < len(facts):
                touching = Counter(
                    end for f in facts for end in {f.source_uuid, f.target_uuid} if end in asked
                )
                if any(n >= per_entity for n in touching.values()):  # maybe cut: read all
                    facts = [fact_of(row) for row in await read(uuids, None)]
                    believed = [f for f in facts if asof.believed(f)]
            return believed

        return facts_of

    async def _seen(
        self, group_id: str, kind: Kind, scope: SearchScope, found: Found, limit: int
    ) -> list[Hit]:
        """The best ``limit`` hits of the candidates ``found(k)`` gives (the best k of the
        group, best first) that the scope sees: k grows with the share seen so far until
        enough are seen or there are no more; each candidate is read once."""
        k = max(limit, 10)  # most candidates are seen: ask for more only when they are not
        hits: list[Hit] = []
        judged: set[str] = set()
        while True:
            scored, rows = await found(k)
            fresh = {uuid: score for uuid, score in scored if uuid not in judged}
            read = [r for r in rows or [] if r["uuid"] in fresh]
            hits += _hits_of_rows(kind, scope.asof, read, fresh)
            unread = {uuid: fresh[uuid] for uuid in fresh.keys() - {r["uuid"] for r in read}}
            hits += await self._hits(group_id, kind, scope, unread)
            judged.update(fresh)
            if len(hits) >= limit or len(scored) < k or k >= MAX_CANDIDATES:
                return best(hits, limit)
            # enough for ``limit`` at the share seen so far, with a margin
            k = min(MAX_CANDIDATES, max(2 * k, math.ceil(1.5 * k * limit / max(len(hits), 1))))

    async def _hits(
        self,
        group_id: str,
        kind: Kind,
        scope: SearchScope,
        scores: dict[str, float],
        distances: dict[str, int] | None = None,
    ) -> list[Hit]:
        """The hits of the scored uuids of the group that the scope sees (with their records'
        embeddings and their details as the scope asks; ``distances``: a walk's hops, of
        facts)."""
        uuids = list(scores)
        if not uuids:
            return []
        asof = scope.asof
        params = {"group_id": group_id, "uuids": uuids, **hit_params(scope)}
        if kind != "community":
            rows = await self.ex.rows(sq.HITS_BY_UUIDS[kind], params)
            return _hits_of_rows(kind, asof, rows, scores, distances)
        return [
            community_hit(c, group_id, scores[c.uuid])
            for c in await self._communities_by_uuids(params)
            if known_by(c.created_at, asof)
        ]

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


def _hits_of_rows(
    kind: Kind,
    asof: AsOf,
    rows: list[dict[str, Any]],
    scores: dict[str, float],
    distances: dict[str, int] | None = None,
) -> list[Hit]:
    """The hits of the rows of ``sq.HITS_BY_UUIDS[kind]`` (a fact, an entity or an episode)
    that the scope sees, scored by ``scores``."""
    if kind == "fact":
        return [hit for hit in (_fact_hit(row, asof, scores, distances) for row in rows) if hit]
    if kind == "entity":
        found = [(entity_record(r["e"], r["community_uuid"]), r["producers"]) for r in rows]
        return [
            entity_hit(e, scores[e.uuid], None if producers is None else _producer_ids(producers))
            for e, producers in found
            if known_by(e.created_at, asof)
        ]
    episodes = (episode_record(r["ep"]) for r in rows)
    return [episode_hit(e, scores[e.uuid]) for e in episodes if episode_seen(e, asof)]


def _producer_ids(producers: list[str | None]) -> list[str]:
    """An entity's producers as read (``sq.ENTITY_PRODUCERS_BY_UUIDS``): an episode without
    a producer id is ``""``."""
    return [p or "" for p in producers]


def _fact_hit(
    row: dict[str, Any],
    asof: AsOf,
    scores: dict[str, float],
    distances: dict[str, int] | None,
) -> Hit | None:
    """A fact's hit, with its ends' names and its episodes' producer ids, if the scope
    believes it."""
    fact = fact_of(row)
    if not asof.believed(fact):
        return None
    names = {fact.source_uuid: row["source_name"], fact.target_uuid: row["target_name"]}
    distance = None if distances is None else distances[fact.uuid]
    return fact_hit(fact, scores[fact.uuid], asof, names, dict(row["producers"]), distance)


def hit_params(scope: SearchScope) -> dict[str, Any]:
    """The parameters of a read of hits: the scope's (``scope_params``), whether the hits
    carry their records' embeddings and their details (an entity's producers)."""
    return {
        "embeddings": scope.embeddings,
        "details": scope.details,
        **scope_params(scope.asof),
    }


def scope_params(asof: AsOf) -> dict[str, Any]:
    """The parameters of ``sq.seen_by_scope``."""
    return {
        "known_at": asof.known_at,
        "valid_at": asof.valid_at,
        "include_invalid": asof.include_invalid,
    }


def _best(pairs: Iterable[Sequence[Any]], limit: int) -> list[tuple[str, float]]:
    """The best ``limit`` (uuid, score) pairs, scores kept within [0, 1] (a cosine's
    rounding may leave them just outside)."""
    return top(((uuid, min(1.0, max(0.0, float(score)))) for uuid, score in pairs), limit)
