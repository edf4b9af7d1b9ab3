"""The search methods of the embedded store (``store.SqliteStore``;
docs/retrieval.md), with the rules every store keeps (``store.hits``: what a scope sees, the hits
and their order, the breadth-first walk).

Fulltext: SQLite's FTS5 (BM25 over Porter-stemmed words), the text's words from
``search_text.search_terms`` as quoted strings, the group's rows only (the group is a column
of each fulltext table, weighted 0). Vector: an exact scan of the group's embeddings of the
kind (numpy), scored ``(1 + cos) / 2`` like the other stores: the embedded store holds what one
machine holds, and a scan is exact where an index is approximate.

Candidates the scope does not see (a fact not believed then, an entity created later) are
dropped after scoring, so more are taken until ``limit`` hits are found or none are left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import CommunityRecord, EntityRecord, FactRecord
from tidegraph.records.search import Hit, Kind, MethodSearch, SearchScope
from tidegraph.stores import hits as rules
from tidegraph.stores.episode_search import episode_query
from tidegraph.stores.roles import Search
from tidegraph.stores.rows import rank, to_utc, unique
from tidegraph.stores.search_text import search_terms
from tidegraph.stores.sqlite.db import (
    BELIEVED_GROUP,
    BM25_WEIGHTS,
    FULLTEXT,
    fulltext_phrase,
    ids,
    json_text,
    micros,
    vector_of,
)
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.group_cache import (
    Scored,
    VectorScores,
    group_shares,
    group_vectors,
)
from tidegraph.stores.sqlite.rows import (
    ENTITY_FULL,
    ENTITY_HIT,
    EPISODE,
    FACT,
    FACT_FULL,
    IN_LIST,
    believed_facts,
    believed_sql,
    believed_where,
    entity_of,
    episode_of,
    fact_of,
    names_of,
    producers_of,
)

if TYPE_CHECKING:
    from tidegraph.stores.sqlite.store import SqliteStore


# ----------------------------------------------------------------------------- candidates
def fulltext_query(group_id: str, text: str, by_group: bool = True) -> str | None:
    """The FTS5 query of ``text``'s words in the group's rows (None: nothing searchable).
    Every word and the group id are quoted strings, never syntax. ``by_group``: the group's
    token is matched too (``_by_group``); the join keeps only the group's rows either way."""
    terms = search_terms(text)
    if not terms:
        return None
    words = " OR ".join(fulltext_phrase(t) for t in terms)
    return _in_group(group_id, f"text : ({words})", by_group)


def _in_group(group_id: str, match: str, by_group: bool) -> str:
    if not by_group or not any(ch.isalnum() for ch in group_id):  # no token to match
        return match
    return f"group_id : {fulltext_phrase(group_id)} AND ({match})"


def episode_fulltext_query(
    conn: sqlite3.Connection, group_id: str, text: str, by_group: bool = True
) -> str | None:
    """The FTS5 query of ``text`` over the group's episodes' conversation fields
    (``episode_search``: the words in body, context or date, the names on the speaker)."""
    terms = search_terms(text)
    if not terms:
        return None
    names = ids(
        conn,
        f"SELECT word FROM speaker_word WHERE group_id = ? AND word {IN_LIST}",
        group_id,
        json_text(terms),
    )
    query = episode_query(text, names)
    if query is None:
        return None
    words = " OR ".join(fulltext_phrase(t) for t in query.words)
    match = f"{{body context said_on}} : ({words})"
    if query.names:  # the words again, so that a turn matching by its speaker alone is none
        said_by = " OR ".join(fulltext_phrase(t) for t in query.names)
        match = f"({match}) OR (({match}) AND speaker : ({said_by}))"
    return _in_group(group_id, match, by_group)


def fulltext_scored(
    conn: sqlite3.Connection,
    group_id: str,
    kind: Kind,
    query: str,
    limit: int,
    asof: AsOf | None = None,
) -> Scored:
    """The group's best ``limit`` records of ``kind`` for an FTS5 ``query`` (BM25); with
    ``asof`` (facts), of those ``believed_sql`` lets through: the matches are checked against
    those ids (read from the ``fact_believed`` index, without the facts' rows) before a fact's
    row is read or a score computed, so a question on a long history reads the rows of what
    is valid then, not of every match (its common words match most of the history: 82 → 31
    ms for 30,000 facts; the ``+`` keeps FTS5 from looking each id up apart, 25 s)."""
    table, records = FULLTEXT[kind]
    seen, params = "", list[Any]()
    if asof is not None and kind == "fact":
        where, believed = believed_sql(asof)
        params = [group_id, *believed]
        seen = (
            " AND +t.rowid IN (SELECT f.id FROM fact f INDEXED BY fact_believed "
            f"WHERE {BELIEVED_GROUP} = ? AND {where})"
        )
    rows = conn.execute(
        f"SELECT f.uuid, -bm25({table}, {BM25_WEIGHTS[table]}) AS score FROM {table} t "
        f"JOIN {records} f ON f.id = t.rowid WHERE {table} MATCH ?{seen} AND f.group_id = ? "
        "ORDER BY score DESC, f.uuid LIMIT ?",
        (query, *params, group_id, limit),
    )
    return [(uuid, float(score)) for uuid, score in rows]


# The walk's first read: the best two seeds' facts (each a few, and a read here costs little
# more than its rows, so reading the next ones only when these are too few saves building
# facts never kept; the answer is the same, ``rules.walk``).
WALK_FIRST_CHUNK = 2


# ----------------------------------------------------------------------------- hits
def fact_hits(
    conn: sqlite3.Connection,
    group_id: str,
    scope: SearchScope,
    facts: Sequence[tuple[FactRecord, float, int | None]],
) -> list[Hit]:
    """Hits of facts already read and believed (with their ends' names and producer ids
    when ``scope.details``)."""
    if not facts:
        return []
    if not scope.details:
        return [rules.fact_hit(f, s, scope.asof, None, None, d) for f, s, d in facts]
    names = names_of(conn, (u for f, _, _ in facts for u in (f.source_uuid, f.target_uuid)))
    producers = producers_of(conn, group_id, (u for f, _, _ in facts for u in f.episodes))
    return [rules.fact_hit(f, s, scope.asof, names, producers, d) for f, s, d in facts]


def entity_hits(
    conn: sqlite3.Connection,
    group_id: str,
    scope: SearchScope,
    scores: dict[str, float],
) -> list[Hit]:
    columns = ENTITY_FULL if scope.embeddings else ENTITY_HIT
    query = f"SELECT {columns} FROM entity e WHERE +e.group_id = ? AND e.uuid {IN_LIST}"
    rows = conn.execute(query, (group_id, json_text(scores)))
    entities = [e for e in map(entity_of, rows) if rules.known_by(e.created_at, scope.asof)]
    if not scope.details:
        return [rules.entity_hit(e, scores[e.uuid], None) for e in entities]
    mentioned = mentioning(conn, group_id, scope.asof, [e.uuid for e in entities])
    return [rules.entity_hit(e, scores[e.uuid], mentioned.get(e.uuid, [])) for e in entities]


def mentioning(
    conn: sqlite3.Connection, group_id: str, asof: AsOf, entity_uuids: Sequence[str]
) -> dict[str, list[str]]:
    """The producer ids of the episodes (stored by the known-at time) that mention each
    entity: the latest episode first, ties by producer id (``rules.latest_first``)."""
    mentioned: dict[str, list[str]] = {}
    if not entity_uuids:
        return mentioned
    found = conn.execute(
        "SELECT m.entity_uuid, coalesce(ep.producer_id, '') AS producer FROM mention m "
        "JOIN episode ep INDEXED BY episode_said ON ep.uuid = m.episode_uuid "
        f"WHERE m.group_id = ? AND ep.group_id = ? AND ep.created_at <= ? "
        f"AND m.entity_uuid {IN_LIST} ORDER BY ep.valid_at DESC, producer",
        (group_id, group_id, micros(asof.known_at), json_text(entity_uuids)),
    )
    for uuid, producer in found:
        mentioned.setdefault(uuid, []).append(producer)
    return mentioned


def completed(conn: sqlite3.Connection, scope: SearchScope, hits: Sequence[Hit]) -> list[Hit]:
    """``SqliteSearch.complete_hits`` on the database's thread: each group's facts and
    entities read once more for their details, and whole where they were read partially
    (``partial_records``; episodes and communities carry theirs)."""
    done: dict[tuple[str, str], Hit] = {}
    for group_id in unique(h.group_id for h in hits):
        facts = [h for h in hits if h.group_id == group_id and h.kind == "fact"]
        done |= {("fact", h.uuid): h for h in _completed_facts(conn, group_id, scope, facts)}
        entities = [h for h in hits if h.group_id == group_id and h.kind == "entity"]
        if partial_records(scope) and entities:
            scores = {h.uuid: h.score for h in entities}
            entities = entity_hits(conn, group_id, scope, scores)
        mentioned = mentioning(conn, group_id, scope.asof, [h.uuid for h in entities])
        for hit in entities:
            done["entity", hit.uuid] = rules.with_mentions(hit, mentioned.get(hit.uuid, []))
    # A fact or entity deleted since its candidate was read (a forget between the reads) is
    # left out, not answered partially.
    completes = ("fact", "entity")
    return [
        done.get((h.kind, h.uuid), h)
        for h in hits
        if h.kind not in completes or (h.kind, h.uuid) in done
    ]


def _completed_facts(
    conn: sqlite3.Connection, group_id: str, scope: SearchScope, hits: Sequence[Hit]
) -> list[Hit]:
    """The group's fact hits with their details (and whole records, where partial)."""
    if not hits:
        return []
    if partial_records(scope):
        query = f"SELECT {FACT} FROM fact f WHERE +f.group_id = ? AND f.uuid {IN_LIST}"
        rows = conn.execute(query, (group_id, json_text([h.uuid for h in hits])))
        whole = {f.uuid: f for f in map(fact_of, rows)}
        hits = [h for h in hits if h.uuid in whole]  # one deleted since is left out
        records = [whole[h.uuid] for h in hits]
    else:
        records = [h.record for h in hits if isinstance(h.record, FactRecord)]
    names = names_of(conn, (u for f in records for u in (f.source_uuid, f.target_uuid)))
    producers = producers_of(conn, group_id, (u for f in records for u in f.episodes))
    if not partial_records(scope):
        return [
            rules.with_fact_details(hit, fact, names, producers)
            for hit, fact in zip(hits, records, strict=True)
        ]
    return [
        rules.fact_hit(fact, hit.score, scope.asof, names, producers, hit.distance)
        for hit, fact in zip(hits, records, strict=True)
    ]


def communities_by_uuids(
    conn: sqlite3.Connection, group_id: str, uuids: Sequence[str]
) -> list[CommunityRecord]:
    param = (group_id, json_text(uuids))
    heads = conn.execute(
        "SELECT uuid, name, summary, name_embedding, created_at FROM community "
        f"WHERE +group_id = ? AND uuid {IN_LIST}",
        param,
    ).fetchall()
    members: dict[str, list[str]] = {}
    query = (
        "SELECT community_uuid, entity_uuid FROM member "
        f"WHERE +group_id = ? AND community_uuid {IN_LIST}"
    )
    for community, entity in conn.execute(query, param):
        members.setdefault(community, []).append(entity)
    return [
        CommunityRecord(
            uuid=r["uuid"],
            name=r["name"],
            summary=r["summary"],
            members=sorted(members.get(r["uuid"], [])),
            name_embedding=vector_of(r["name_embedding"]),
            created_at=to_utc(r["created_at"]),
        )
        for r in heads
    ]


def hits_of(
    conn: sqlite3.Connection,
    group_id: str,
    kind: Kind,
    scope: SearchScope,
    scores: dict[str, float],
) -> list[Hit]:
    """The hits of the scored uuids of the group that the scope sees (with their records'
    embeddings when ``scope.embeddings``, their details when ``scope.details``)."""
    if not scores:
        return []
    asof = scope.asof
    param = (group_id, json_text(scores))
    if kind in ("fact", "entity") and partial_records(scope):
        return _partial_hits(conn, group_id, kind, asof, scores)
    if kind == "fact":
        columns = FACT_FULL if scope.embeddings else FACT
        query = f"SELECT {columns} FROM fact f WHERE +f.group_id = ? AND f.uuid {IN_LIST}"
        facts = [f for f in map(fact_of, conn.execute(query, param)) if asof.believed(f)]
        return fact_hits(conn, group_id, scope, [(f, scores[f.uuid], None) for f in facts])
    if kind == "entity":
        return entity_hits(conn, group_id, scope, scores)
    if kind == "episode":
        embedding = "ep.content_embedding" if scope.embeddings else "NULL AS content_embedding"
        query = (
            f"SELECT {EPISODE}, {embedding} FROM episode ep "
            f"WHERE +ep.group_id = ? AND ep.uuid {IN_LIST}"
        )
        episodes = map(episode_of, conn.execute(query, param))
        return [
            rules.episode_hit(e, scores[e.uuid]) for e in episodes if rules.episode_seen(e, asof)
        ]
    return [
        rules.community_hit(c, group_id, scores[c.uuid])
        for c in communities_by_uuids(conn, group_id, list(scores))
        if rules.known_by(c.created_at, asof)
    ]


def partial_records(scope: SearchScope) -> bool:
    """Whether the scope's fact and entity hits are read with partial records: a fact's ends
    (``rows.ends_of``), an entity's uuid and group. Read so when neither details nor
    embeddings are wanted (a search's candidates: their records are built for the hits kept
    only, by ``completed``; most candidates are never kept)."""
    return not scope.details and not scope.embeddings


def _partial_hits(
    conn: sqlite3.Connection,
    group_id: str,
    kind: Kind,
    asof: AsOf,
    scores: dict[str, float],
) -> list[Hit]:
    """The hits of the scored facts or entities of the group that the scope sees, with
    partial records (``partial_records``)."""
    uuids = json_text(scores)
    if kind == "fact":
        matches = [(f"+f.group_id = ? AND f.uuid {IN_LIST}", [group_id, uuids])]
        facts = believed_where(conn, asof, matches, ends_only=True)
        return [rules.fact_hit(f, scores[f.uuid], asof, None, None) for f in facts]
    rows = conn.execute(
        f"SELECT uuid FROM entity e WHERE +e.group_id = ? AND e.uuid {IN_LIST} "
        "AND (e.created_at IS NULL OR e.created_at <= ?)",
        (group_id, uuids, micros(asof.known_at)),
    )
    return [
        rules.entity_hit(EntityRecord(uuid=uuid, group_id=group_id, name=""), scores[uuid], None)
        for (uuid,) in rows
    ]


def seen(
    conn: sqlite3.Connection,
    group_id: str,
    kind: Kind,
    scope: SearchScope,
    scored: Callable[[int], Scored],
    limit: int,
    narrow: Callable[[], Callable[[int], Scored]] | None = None,
) -> list[Hit]:
    """The best ``limit`` hits the scope sees among the candidates ``scored(k)`` gives (the
    group's best k, best first): k doubles until enough are seen or there are no more.
    ``narrow``: called once when the first candidates were not enough (most of them are not
    seen: a question as of a past time on a long history), it answers the candidates of
    those the scope may see, judged again from the best."""
    k = max(limit, 10)  # most candidates are seen: ask for more only when they are not
    hits: list[Hit] = []
    judged = 0
    while True:
        candidates = scored(k)
        fresh = dict(candidates[judged:])
        hits += hits_of(conn, group_id, kind, scope, fresh)
        judged = len(candidates)
        if len(hits) >= limit or len(candidates) < k:
            return rules.best(hits, limit)
        if narrow is not None:
            scored, narrow, hits, judged = narrow(), None, [], 0
            continue
        k *= 2


# ----------------------------------------------------------------------------- the methods
class SqliteSearch(Search):
    """``Search`` on the embedded store's database."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    async def fulltext_search(
        self, scope: SearchScope, kind: Kind, text: str, limit: int
    ) -> list[Hit]:
        kind = rules.check_kind(kind)
        if not search_terms(text) or limit <= 0:
            return []
        return await self.store.db.read(_fulltext_hits, scope, kind, text, limit)

    async def vector_search(
        self, scope: SearchScope, kind: Kind, embedding: list[float], limit: int
    ) -> list[Hit]:
        kind = rules.check_kind(kind)
        vector = self.store._vector(embedding)
        if vector is None or limit <= 0:
            return []
        return await self.store.db.read(_vector_hits, scope, kind, vector, limit)

    async def search_lists(
        self, scope: SearchScope, searches: Sequence[MethodSearch]
    ) -> list[list[Hit]]:
        """Every search in one call on the database's thread (a hand-off each cost more
        CPU than most of the reads)."""
        for search in searches:
            rules.check_kind(search.kind)
        # The lists of a search share the query's embedding: it is checked once.
        checked: dict[int, list[float] | None] = {}
        for search in searches:
            if search.embedding is not None and id(search.embedding) not in checked:
                checked[id(search.embedding)] = self.store._vector(search.embedding)
        vectors = [None if s.embedding is None else checked[id(s.embedding)] for s in searches]

        def read(conn: sqlite3.Connection) -> list[list[Hit]]:
            found: list[list[Hit]] = []
            for search, vector in zip(searches, vectors, strict=True):
                if search.limit <= 0:
                    found.append([])
                elif search.text is not None:
                    terms = search_terms(search.text)
                    found.append(
                        _fulltext_hits(conn, scope, search.kind, search.text, search.limit)
                        if terms
                        else []
                    )
                elif vector is None:
                    found.append([])
                else:
                    hits = _vector_hits(conn, scope, search.kind, vector, search.limit)
                    found.append(hits)
            return found

        return await self.store.db.read(read)

    async def complete_hits(self, scope: SearchScope, hits: Sequence[Hit]) -> list[Hit]:
        if scope.details or not hits:
            return list(hits)
        return await self.store.db.read(completed, scope, hits)

    async def expand_facts(
        self, scope: SearchScope, seeds: list[str], hops: int, limit: int
    ) -> list[Hit]:
        if not seeds or hops < 1 or limit <= 0:
            return []
        hits: list[Hit] = []
        for group_id in unique(scope.group_ids):
            facts_of = self._touching(group_id, scope.asof, partial_records(scope))
            nearest = await rules.expanded(facts_of, seeds, hops, limit, WALK_FIRST_CHUNK)
            found = [(f, 1 / d, d) for f, d in nearest]
            hits += await self.store.db.read(fact_hits, group_id, scope, found)
        return rules.best(hits, limit)

    async def recent_episode_entities(self, scope: SearchScope, episodes: int) -> list[str]:
        if episodes <= 0:
            return []
        asof = scope.asof

        def read(conn: sqlite3.Connection) -> list[str]:
            found: list[str] = []
            for group_id in unique(scope.group_ids):
                latest = [
                    r[0]
                    for r in conn.execute(
                        "SELECT uuid FROM episode WHERE group_id = ? AND valid_at <= ? "
                        "AND created_at <= ? ORDER BY valid_at DESC, uuid DESC LIMIT ?",
                        (group_id, micros(asof.valid_at), micros(asof.known_at), episodes),
                    )
                ]
                mentioned: dict[str, list[str]] = {}
                query = (
                    "SELECT episode_uuid, entity_uuid FROM mention "
                    f"WHERE +group_id = ? AND episode_uuid {IN_LIST}"
                )
                for episode, entity in conn.execute(query, (group_id, json_text(latest))):
                    mentioned.setdefault(episode, []).append(entity)
                found += [e for episode in latest for e in sorted(mentioned.get(episode, []))]
            return unique(found)

        return await self.store.db.read(read)

    async def entity_distances(
        self, scope: SearchScope, centre: str, uuids: list[str], max_hops: int
    ) -> dict[str, int]:
        walks = [self._touching(g, scope.asof, True) for g in unique(scope.group_ids)]
        return await rules.distances(walks, centre, uuids, max_hops)

    def _touching(self, group_id: str, asof: AsOf, ends_only: bool) -> rules.FactsOf:
        """The walk's read: the group's facts touching some entities that the scope
        believes, without their embeddings (``ends_only``: partial, ``rows.ends_of``)."""

        async def facts_of(entity_uuids: list[str]) -> list[FactRecord]:
            uuids = unique(entity_uuids)
            return await self.store.db.read(believed_facts, group_id, asof, uuids, ends_only)

        return facts_of


def _fulltext_hits(
    conn: sqlite3.Connection,
    scope: SearchScope,
    kind: Kind,
    text: str,
    limit: int,
) -> list[Hit]:
    """``fulltext_search`` on the database's thread (``text`` has search terms)."""
    hits: list[Hit] = []
    for group_id in unique(scope.group_ids):
        by_group = not group_shares(conn).holds_most(conn, group_id, kind)
        if kind == "episode":
            query = episode_fulltext_query(conn, group_id, text, by_group)
        else:
            query = fulltext_query(group_id, text, by_group)
        assert query is not None  # the text has terms
        # facts: of those the scope may believe from the first read (``fulltext_scored``)
        asof = scope.asof if kind == "fact" else None
        scored = partial(fulltext_scored, conn, group_id, kind, query, asof=asof)
        hits += seen(conn, group_id, kind, scope, scored, limit)
    return rules.best(hits, limit)


def _vector_hits(
    conn: sqlite3.Connection,
    scope: SearchScope,
    kind: Kind,
    vector: Sequence[float],
    limit: int,
) -> list[Hit]:
    """``vector_search`` on the database's thread."""
    hits: list[Hit] = []
    for group_id in unique(scope.group_ids):
        every = VectorScores(conn, group_vectors(conn), group_id, kind, vector)
        narrow = None
        if kind == "fact" and not scope.asof.include_invalid:

            def narrow(every: VectorScores = every, group_id: str = group_id) -> ScoredBy:
                every.keep_only(believed_uuids(conn, group_id, scope.asof))
                return every.best

        hits += seen(conn, group_id, kind, scope, every.best, limit, narrow)
    return rules.best(hits, limit)


def believed_uuids(conn: sqlite3.Connection, group_id: str, asof: AsOf) -> set[str]:
    """The uuids of the group's facts ``believed_sql`` lets through (a superset of those the
    scope believes)."""
    where, params = believed_sql(asof)
    query = (
        f"SELECT f.uuid FROM fact f INDEXED BY fact_believed WHERE {BELIEVED_GROUP} = ? AND {where}"
    )
    return {uuid for (uuid,) in conn.execute(query, (group_id, *params))}


EntityHits = list[tuple[EntityRecord, float]]
ScoredBy = Callable[[int], Scored]


def entity_text_hits(conn: sqlite3.Connection, group_id: str, text: str, limit: int) -> EntityHits:
    query = fulltext_query(group_id, text)
    if query is None or limit <= 0:
        return []
    return _entities_scored(conn, group_id, fulltext_scored(conn, group_id, "entity", query, limit))


def entity_vector_hits(
    conn: sqlite3.Connection,
    group_id: str,
    vector: Sequence[float] | None,
    limit: int,
) -> EntityHits:
    if vector is None or limit <= 0:
        return []
    scored = VectorScores(conn, group_vectors(conn), group_id, "entity", vector).best(limit)
    return _entities_scored(conn, group_id, scored)


def _entities_scored(conn: sqlite3.Connection, group_id: str, scored: Scored) -> EntityHits:
    """The group's entities of ``scored`` (best first), with their scores."""
    best = dict(scored)
    if not best:
        return []
    query = f"SELECT {ENTITY_FULL} FROM entity e WHERE +e.group_id = ? AND e.uuid {IN_LIST}"
    entities = map(entity_of, conn.execute(query, (group_id, json_text(best))))
    return rank(((e, best[e.uuid]) for e in entities), len(best))
