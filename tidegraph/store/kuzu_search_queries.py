"""The kuzu dialect of search (``tidegraph.store.search_core``): fulltext and vector
candidates of each kind, and the reads that turn them into hits. Parameterised like
``kuzu_queries``; index and table names are our constants.

Fulltext: kuzu's FTS extension (BM25, English stop words and stemming), queried with
``search_text.search_text``; a fact's text is on its FactIndex row (relationships cannot be
indexed). Vector: its HNSW extension (cosine); facts and communities through their vector
tables (``kuzu_queries.VECTOR_TABLES``), rescored exactly, ``(1 + cos) / 2``.
"""

from __future__ import annotations

from tidegraph.store import common_queries as cq
from tidegraph.store import kuzu_queries as q
from tidegraph.store.rows import EPISODE_FIELDS
from tidegraph.store.search_text import search_text


def fulltext_query(text: str) -> str | None:
    """Search text as QUERY_FTS_INDEX takes it (None: nothing searchable)."""
    return search_text(text)


def _fulltext(table: str, index: str) -> str:
    return f"""
CALL QUERY_FTS_INDEX('{table}', '{index}', $query)
WITH node AS x, score
WHERE x.group_id = $group_id
RETURN x.uuid AS uuid, score
ORDER BY score DESC, uuid
LIMIT $limit
"""


def _candidates(table: str, index: str, uuid: str) -> str:
    return f"""
CALL QUERY_VECTOR_INDEX('{table}', '{index}', $embedding, $k)
RETURN node.{uuid} AS uuid, node.group_id AS group_id,
       CASE WHEN node.group_id IN $group_ids
       THEN (1.0 + array_cosine_similarity(node.embedding, $embedding)) / 2.0 END AS score
"""


def _scan(table: str, prop: str) -> str:
    return f"""
MATCH (x:{table})
WHERE x.group_id IN $group_ids AND x.{prop} IS NOT NULL
WITH x, (1.0 + array_cosine_similarity(x.{prop}, $embedding)) / 2.0 AS score
RETURN x.uuid AS uuid, score
ORDER BY score DESC, uuid
LIMIT $limit
"""


# The best $limit of the group's matches: (uuid, score).
FULLTEXT = {
    "entity": _fulltext("Entity", q.ENTITY_FULLTEXT_INDEX),
    "fact": _fulltext("FactIndex", q.FACT_FULLTEXT_INDEX),
    "episode": _fulltext("Episodic", q.EPISODE_FULLTEXT_INDEX),
    "community": _fulltext("Community", q.COMMUNITY_FULLTEXT_INDEX),
}
# (candidates of the global index: uuid, group_id, score or null; exact scan: uuid, score)
VECTOR = {
    "entity": (
        f"""
CALL QUERY_VECTOR_INDEX('Entity', '{q.ENTITY_VECTOR_INDEX}', $embedding, $k)
RETURN node.uuid AS uuid, node.group_id AS group_id,
       CASE WHEN node.group_id IN $group_ids
       THEN (1.0 + array_cosine_similarity(node.name_embedding, $embedding)) / 2.0 END AS score
""",
        _scan("Entity", "name_embedding"),
    ),
    "fact": (
        _candidates("FactVector", q.FACT_VECTOR_INDEX, "fact_uuid"),
        _scan("FactIndex", "embedding"),
    ),
    "episode": (
        f"""
CALL QUERY_VECTOR_INDEX('Episodic', '{q.EPISODE_VECTOR_INDEX}', $embedding, $k)
RETURN node.uuid AS uuid, node.group_id AS group_id,
       CASE WHEN node.group_id IN $group_ids
       THEN (1.0 + array_cosine_similarity(node.content_embedding, $embedding)) / 2.0 END
       AS score
""",
        _scan("Episodic", "content_embedding"),
    ),
    "community": (
        _candidates("CommunityVector", q.COMMUNITY_VECTOR_INDEX, "community_uuid"),
        _scan("Community", "name_embedding"),
    ),
}

# No scan before the index query here (``SearchCore._nearest``): kuzu 0.11.3 has no
# ``CALL {}`` subqueries to bound it in one statement.
SMALL_SCAN: dict[str, str | None] = dict.fromkeys(VECTOR)

EPISODES_BY_UUIDS = f"""
MATCH (ep:Episodic)
WHERE ep.uuid IN $uuids AND ep.group_id = $group_id
RETURN {q.props_of("ep", EPISODE_FIELDS)} AS ep
"""

# The walk's read (``SearchCore._believed_touching``): fact rows carry no embedding here.
FACTS_NEAR = q.FACTS_TOUCHING
FACT_CONTEXT = cq.FACT_CONTEXT
# No one-read hit queries: reads are in-process, several cost little (``SearchCore._hits``).
FACT_HITS: str | None = None
ENTITY_HITS: str | None = None
