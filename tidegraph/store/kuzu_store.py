"""The embedded graph store, on kuzu 0.11.3 (no server; the data lives in one folder).

The same graph as Neo4j (see ``tidegraph.store.cypher``), bent around kuzu's rules, each
measured on 0.11.3 (the vector and fts extensions are linked in: nothing is downloaded, and
both indexes work with no network at all):

- the schema is declared (tables are created by ``setup``); list types are ``STRING[]`` and
  embeddings ``DOUBLE[dim]`` (doubles, so they come back exactly as Neo4j returns them);
- a vector-indexed property cannot be SET after creation, not even by MERGE's ON CREATE SET,
  so an entity is CREATEd with its ``name_embedding`` inline (it never changes afterwards);
- the HNSW and BM25 indexes follow single-row inserts, updates (also UNWIND-batched), deletes,
  rollbacks and reopening by themselves, BUT a multi-row CREATE into a fulltext-indexed table
  indexes every row under the first row's words, and a multi-row MERGE that creates such
  nodes crashes the process: those nodes are created one statement per row;
- a fulltext index with a custom stop-word table crashes on the next insert: the default
  (English, ~570 words) is kept, and ``cypher.SEARCH_STOP_WORDS`` mirrors it for both stores;
  digits are never indexed;
- relationship properties cannot be indexed, and a fixed-size array on a relationship table
  makes every checkpoint rewrite all of them (measured: 0.4 s at 2,000 facts, 76 s at
  12,000). So each fact has a row in the node table ``FactIndex``, keyed by the fact's uuid:
  its group, its two ends and its embedding (checkpoint 0.5 s at 12,000). A fact is found by
  uuid through it (a primary-key lookup, then the source's adjacency), never by scanning
  RELATES_TO; fact vector search is an exact cosine scan of the group's rows;
- ``TIMESTAMP`` drops the UTC offset, so naive UTC goes in and comes back as aware UTC;
- an UNWIND row whose field is null in every row is typed STRING, hence the CASTs; a null
  embedding inside rows that also carry embeddings fails, hence rows are split by it;
- a statement failing inside a manual transaction rolls the transaction back at once;
- no ``SET n += map``, no ``CALL {}``, no list comprehensions, no startNode(); parameters
  inside ``any(...)`` or list lambdas crash 0.11.3, so those are avoided.

kuzu is synchronous: every call runs in a worker thread, one at a time (an asyncio lock), so
the event loop is never blocked. One process at a time may open the folder (kuzu locks it).
"""

from __future__ import annotations

import asyncio
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import kuzu

from tidegraph.metrics import STORE_ERRORS, STORE_MAINTENANCE_LATENCY
from tidegraph.records.asof import AsOf
from tidegraph.records.graph import (
    CommunityRecord,
    EntityLookup,
    EntityRecord,
    EpisodeRecord,
    EpisodeWrite,
    FactRecord,
    FactView,
    WeightedEdge,
)
from tidegraph.records.ids import normalize_name
from tidegraph.records.times import utc
from tidegraph.store import cypher as q
from tidegraph.store.base import GraphStore
from tidegraph.store.cypher import (
    ENTITY_FIELDS,
    EPISODE_FIELDS,
    FACT_FIELDS,
    EntityState,
    StoredFact,
    StoreSchemaError,
    as_of_params,
    as_of_query,
    check_community_owners,
    check_embedding,
    check_entity_owners,
    check_episode_write,
    check_same_episode,
    closure_row,
    community_rows,
    cosine_score,
    entity_record,
    entity_row,
    episode_record,
    episode_row,
    fact_record,
    fact_row,
    fact_view,
    fold_communities,
    fold_edges,
    fold_entity_rows,
    neighbour_weights_of,
    now_utc,
    observe_write,
    rank,
    search_text,
    sort_entities,
    sort_facts,
    sort_views,
    top,
    unique,
    vector_candidates,
)

T = TypeVar("T")

DB_FILE = "graph.kuzu"
# Checkpoint once the WAL holds this much: kuzu keeps every uncheckpointed change (with its
# vector and fulltext index updates) in the buffer pool, and a long ingest into one database
# otherwise exhausts the pool and crashes the process (kuzu's default threshold is 16 MiB).
CHECKPOINT_THRESHOLD_BYTES = 4 * 1024 * 1024
# Every checkpoint in kuzu 0.11.3 leaks the buffer manager's handle on the shadow file, with
# the frame groups it took (about 9 MiB of the database's address space for a one-row
# checkpoint, more for larger ones); a database that runs out fails every write ("No more
# frame groups can be added to the allocator") and then segfaults. Closing the database returns
# all of it, so the store checkpoints by itself (auto-checkpoint off) and reopens the database
# after this many checkpoints. (Not what crashed the 512 MiB buffer pool at about 47,000
# records of the throughput benchmark's feed: that is a checkpoint running out of pool, see
# README Performance; 2 GiB finishes 50,000.)
REOPEN_AFTER_CHECKPOINTS = 16
# Prepared statements kept (the queries are constants: a few dozen texts).
MAX_PREPARED_STATEMENTS = 256
ENTITY_VECTOR_INDEX = "entity_name_embedding"
ENTITY_FULLTEXT_INDEX = "entity_name_summary"
_ARRAY_DIM = re.compile(r"^DOUBLE\[(\d+)\]$")


# ----------------------------------------------------------------------------- schema
def schema(dim: int) -> list[str]:
    """The DDL (DDL takes no parameters: ``dim`` is a checked int, nothing else varies)."""
    vector = f"DOUBLE[{int(dim)}]"
    return [
        "CREATE NODE TABLE IF NOT EXISTS Episodic(uuid STRING PRIMARY KEY, group_id STRING, "
        "name STRING, source STRING, source_description STRING, content STRING, "
        "valid_at TIMESTAMP, created_at TIMESTAMP, producer_id STRING, content_hash STRING)",
        "CREATE NODE TABLE IF NOT EXISTS Entity(uuid STRING PRIMARY KEY, group_id STRING, "
        "name STRING, name_norm STRING, labels STRING[], summary STRING, key STRING, "
        f"aliases STRING[], name_embedding {vector}, created_at TIMESTAMP)",
        "CREATE NODE TABLE IF NOT EXISTS Community(uuid STRING PRIMARY KEY, group_id STRING, "
        f"name STRING, summary STRING, name_embedding {vector})",
        "CREATE REL TABLE IF NOT EXISTS RELATES_TO(FROM Entity TO Entity, uuid STRING, "
        "group_id STRING, name STRING, fact STRING, "
        "episodes STRING[], valid_at TIMESTAMP, invalid_at TIMESTAMP, created_at TIMESTAMP, "
        "expired_at TIMESTAMP, cardinality STRING, prior_ends TIMESTAMP[], "
        "prior_ends_learned_at TIMESTAMP[], end_learned_at TIMESTAMP, "
        "prior_starts TIMESTAMP[], prior_starts_learned_at TIMESTAMP[], "
        "start_learned_at TIMESTAMP)",
        "CREATE NODE TABLE IF NOT EXISTS FactIndex(uuid STRING PRIMARY KEY, group_id STRING, "
        f"source_uuid STRING, target_uuid STRING, embedding {vector})",
        "CREATE NODE TABLE IF NOT EXISTS EntityLookupKey(id STRING PRIMARY KEY, "
        "group_id STRING, uuids STRING[])",
        "CREATE REL TABLE IF NOT EXISTS MENTIONS(FROM Episodic TO Entity, group_id STRING)",
        "CREATE REL TABLE IF NOT EXISTS HAS_MEMBER(FROM Community TO Entity, group_id STRING)",
    ]


# (index name, statement) — created when SHOW_INDEXES does not list the name.
INDEXES = (
    (
        ENTITY_VECTOR_INDEX,
        # HNSW shaped like Neo4j's (m 16, ef_construction 100): twice as fast to insert as
        # kuzu's default (mu 30, efc 200), recall@10 0.99 vs 1.00 on 3k random 384-d vectors
        f"CALL CREATE_VECTOR_INDEX('Entity', '{ENTITY_VECTOR_INDEX}', 'name_embedding', "
        "metric := 'cosine', mu := 16, ml := 32, efc := 100)",
    ),
    (
        ENTITY_FULLTEXT_INDEX,
        f"CALL CREATE_FTS_INDEX('Entity', '{ENTITY_FULLTEXT_INDEX}', ['name', 'summary'])",
    ),
)

# Fulltext indexes older stores made and nothing reads: kuzu maintains an FTS index on every
# insert, and the episode one grew with each episode's content. Dropped on setup.
DROPPED_INDEXES = (
    ("episodic_content", "CALL DROP_FTS_INDEX('Episodic', 'episodic_content')"),
    ("community_name", "CALL DROP_FTS_INDEX('Community', 'community_name')"),
)

# ----------------------------------------------------------------------------- queries
_ENTITY_COLUMNS = ", ".join(f"e.{name}" for name in ENTITY_FIELDS)
_EPISODE_COLUMNS = ", ".join(f"ep.{name}" for name in EPISODE_FIELDS)
# A fact's embedding is not on the relationship (see the module docstring): read from its
# FactIndex row where it is wanted.
_FACT_COLUMNS = (
    ", ".join("NULL" if name == "fact_embedding" else f"r.{name}" for name in FACT_FIELDS)
    + ", s.uuid, t.uuid"
)

EPISODE_PROCESSED = """
MATCH (ep:Episodic) WHERE ep.uuid = $uuid AND ep.group_id = $group_id RETURN ep.content_hash
"""
RECENT_EPISODES = f"""
MATCH (ep:Episodic) WHERE ep.group_id = $group_id AND ep.valid_at < $before
RETURN {_EPISODE_COLUMNS}
ORDER BY ep.valid_at DESC, ep.uuid DESC
LIMIT $limit
"""
EPISODE_GROUP = "MATCH (ep:Episodic) WHERE ep.uuid = $uuid RETURN ep.group_id, ep.content_hash"
MERGE_EPISODE = """
MERGE (ep:Episodic {uuid: $uuid})
ON CREATE SET ep.group_id = $group_id, ep.created_at = $created_at
SET ep.name = $name,
    ep.source = $source,
    ep.source_description = $source_description,
    ep.content = $content,
    ep.valid_at = $valid_at,
    ep.producer_id = $producer_id,
    ep.content_hash = $content_hash
"""
# An episode's MENTIONS and new facts are CREATEd one statement per row, by primary key: the
# episode is new (a processed one is never written again) and so are those facts, and kuzu
# plans a MERGE of a relationship, or any UNWIND-driven match, as a scan of the whole table.
CREATE_MENTION = """
MATCH (ep:Episodic {uuid: $episode_uuid}), (e:Entity {uuid: $entity_uuid})
CREATE (ep)-[:MENTIONS {group_id: $group_id}]->(e)
"""
PRODUCER_IDS = """
MATCH (ep:Episodic) WHERE ep.uuid IN $uuids AND ep.group_id = $group_id
RETURN ep.uuid, ep.producer_id
"""

ENTITY_STATE = """
MATCH (e:Entity {uuid: $uuid})
RETURN e.uuid, e.group_id, e.labels, e.aliases, e.summary, e.key
"""
# By primary key, one statement per entity: kuzu plans `uuid IN [...]` as a scan of the table.
ENTITY_GROUP = "MATCH (e:Entity {uuid: $uuid}) RETURN e.group_id"
# One row per statement: kuzu 0.11.3 indexes every row of a multi-row CREATE under the
# first row's words in its fulltext index (and a multi-row MERGE that creates nodes in a
# fulltext-indexed table crashes the process).
_CREATE_ENTITY = """
CREATE (e:Entity {{uuid: $uuid, group_id: $group_id, name: $name, name_norm: $name_norm,
                  labels: CAST($labels AS STRING[]), summary: $summary,
                  key: CAST($key AS STRING), aliases: CAST($aliases AS STRING[]),
                  created_at: $created_at{embedding}}})
"""
CREATE_ENTITY = _CREATE_ENTITY.format(embedding="")
CREATE_ENTITY_EMBEDDED = _CREATE_ENTITY.format(embedding=", name_embedding: $name_embedding")
UPDATE_ENTITIES = """
UNWIND $rows AS r
MATCH (e:Entity {uuid: r.uuid})
SET e.labels = CAST(r.labels AS STRING[]),
    e.aliases = CAST(r.aliases AS STRING[]),
    e.summary = r.summary,
    e.key = CAST(r.key AS STRING)
"""
# One statement per uuid (a primary-key lookup): kuzu plans `uuid IN [...]` as a scan.
ENTITY_BY_UUID = f"MATCH (e:Entity {{uuid: $uuid}}) RETURN {_ENTITY_COLUMNS}"
LIST_ENTITIES = f"MATCH (e:Entity) WHERE e.group_id = $group_id RETURN {_ENTITY_COLUMNS}"
# Resolution's lookups (EntityLookup): the same rows without the name embedding.
_LOOKUP_COLUMNS = ", ".join(
    "NULL" if name == "name_embedding" else f"e.{name}" for name in ENTITY_FIELDS
)
LOOKUP_BY_UUID = ENTITY_BY_UUID.replace(_ENTITY_COLUMNS, _LOOKUP_COLUMNS)
# Entities by key and by name go through EntityLookupKey, kuzu having no secondary index: one
# row per (group, key) and per (group, normalised name or alias), keyed by them, with the uuids
# of the entities that have it. Without it, every lookup scanned the entities of every group
# (the largest cost of a mapped episode at 50,000 records, growing with the store). A row only
# gains uuids (an entity's key, name and aliases are only ever added to), and a read checks
# each entity it finds, so an entry that no longer applies finds nothing.
LOOKUP_KEY = "MATCH (x:EntityLookupKey {id: $id}) RETURN x.uuids"
ADD_LOOKUP_KEY = """
MERGE (x:EntityLookupKey {id: $id})
ON CREATE SET x.group_id = $group_id, x.uuids = [$uuid]
ON MATCH SET x.uuids = CASE WHEN list_contains(x.uuids, $uuid) THEN x.uuids
                            ELSE list_append(x.uuids, $uuid) END
"""
ALL_ENTITY_NAMES = "MATCH (e:Entity) RETURN e.uuid, e.group_id, e.key, e.name_norm, e.aliases"
CREATE_LOOKUP_KEYS = """
UNWIND $rows AS row
CREATE (:EntityLookupKey {id: row.id, group_id: row.group_id, uuids: row.uuids})
"""


def lookup_key_id(group_id: str, kind: str, value: str) -> str:
    """The EntityLookupKey id of a key (``kind`` "key") or a normalised name ("name")."""
    return "\x1f".join((group_id, kind, value))


def lookup_key_ids(group_id: str, key: str | None, names: list[str]) -> list[tuple[str, str]]:
    """(kind, id) of every lookup row an entity with this key and these names belongs to."""
    ids = [("name", lookup_key_id(group_id, "name", n)) for n in unique(n for n in names if n)]
    return ([("key", lookup_key_id(group_id, "key", key))] if key else []) + ids


COMMUNITIES = """
MATCH (c:Community)-[:HAS_MEMBER]->(e:Entity)
WHERE e.uuid IN $uuids AND c.group_id = $group_id
RETURN e.uuid, min(c.uuid)
"""
FULLTEXT_ENTITIES = f"""
CALL QUERY_FTS_INDEX('Entity', '{ENTITY_FULLTEXT_INDEX}', $query)
WITH node AS e, score
WHERE e.group_id = $group_id
RETURN e.uuid, score
ORDER BY score DESC, e.uuid
LIMIT $limit
"""
VECTOR_ENTITY_CANDIDATES = f"""
CALL QUERY_VECTOR_INDEX('Entity', '{ENTITY_VECTOR_INDEX}', $embedding, $k)
RETURN node.uuid, node.group_id, distance
"""
VECTOR_ENTITY_SCAN = """
MATCH (e:Entity)
WHERE e.group_id = $group_id AND e.name_embedding IS NOT NULL
RETURN e.uuid, array_cosine_similarity(e.name_embedding, $embedding) AS cos
ORDER BY cos DESC, e.uuid
LIMIT $limit
"""

VECTOR_ENTITY_RESCORE = """
MATCH (e:Entity)
WHERE e.uuid IN $uuids AND e.group_id = $group_id
RETURN e.uuid, array_cosine_similarity(e.name_embedding, $embedding)
"""

FACT_INDEX_ROW = """
MATCH (x:FactIndex {uuid: $uuid})
RETURN x.group_id, x.source_uuid, x.target_uuid, x.embedding
"""
_CREATE_FACT_INDEX_ROW = """
CREATE (:FactIndex {{uuid: $uuid, group_id: $group_id, source_uuid: $source_uuid,
                    target_uuid: $target_uuid{embedding}}})
"""
CREATE_FACT_INDEX_ROW = _CREATE_FACT_INDEX_ROW.format(embedding="")
CREATE_FACT_INDEX_ROW_EMBEDDED = _CREATE_FACT_INDEX_ROW.format(embedding=", embedding: $embedding")
# A row without an embedding leaves the stored one (an embedding never changes).
SET_FACT_EMBEDDING = "MATCH (x:FactIndex {uuid: $uuid}) SET x.embedding = $embedding"
CREATE_FACT = """
MATCH (s:Entity {uuid: $source_uuid}), (t:Entity {uuid: $target_uuid})
CREATE (s)-[:RELATES_TO {uuid: $uuid, group_id: $group_id, name: $name, fact: $fact,
                         episodes: CAST($episodes AS STRING[]),
                         valid_at: CAST($valid_at AS TIMESTAMP),
                         invalid_at: CAST($invalid_at AS TIMESTAMP),
                         created_at: CAST($created_at AS TIMESTAMP),
                         expired_at: CAST($expired_at AS TIMESTAMP),
                         cardinality: CAST($cardinality AS STRING),
                         prior_ends: CAST($prior_ends AS TIMESTAMP[]),
                         prior_ends_learned_at: CAST($prior_ends_learned_at AS TIMESTAMP[]),
                         end_learned_at: CAST($end_learned_at AS TIMESTAMP),
                         prior_starts: CAST($prior_starts AS TIMESTAMP[]),
                         prior_starts_learned_at: CAST($prior_starts_learned_at AS TIMESTAMP[]),
                         start_learned_at: CAST($start_learned_at AS TIMESTAMP)}]->(t)
"""
# A stored fact takes the given state, except created_at, a set expired_at and a stored
# history the row does not carry.
UPDATE_FACT = """
MATCH (s:Entity {uuid: $source_uuid})-[r:RELATES_TO]->(t:Entity {uuid: $target_uuid})
WHERE r.uuid = $uuid
SET r.name = $name,
    r.fact = $fact,
    r.episodes = CAST($episodes AS STRING[]),
    r.valid_at = CAST($valid_at AS TIMESTAMP),
    r.invalid_at = CAST($invalid_at AS TIMESTAMP),
    r.cardinality = CAST($cardinality AS STRING),
    r.prior_ends = coalesce(CAST($prior_ends AS TIMESTAMP[]), r.prior_ends),
    r.prior_ends_learned_at = coalesce(
        CAST($prior_ends_learned_at AS TIMESTAMP[]), r.prior_ends_learned_at
    ),
    r.end_learned_at = coalesce(CAST($end_learned_at AS TIMESTAMP), r.end_learned_at),
    r.prior_starts = coalesce(CAST($prior_starts AS TIMESTAMP[]), r.prior_starts),
    r.prior_starts_learned_at = coalesce(
        CAST($prior_starts_learned_at AS TIMESTAMP[]), r.prior_starts_learned_at
    ),
    r.start_learned_at = coalesce(CAST($start_learned_at AS TIMESTAMP), r.start_learned_at),
    r.expired_at = coalesce(r.expired_at, CAST($expired_at AS TIMESTAMP))
"""
CLOSE_FACT = """
MATCH (s:Entity {uuid: $source_uuid})-[r:RELATES_TO]->(t:Entity {uuid: $target_uuid})
WHERE r.uuid = $uuid AND r.group_id = $group_id
SET r.invalid_at = $invalid_at,
    r.prior_ends = coalesce(CAST($prior_ends AS TIMESTAMP[]), r.prior_ends),
    r.prior_ends_learned_at = coalesce(
        CAST($prior_ends_learned_at AS TIMESTAMP[]), r.prior_ends_learned_at
    ),
    r.end_learned_at = coalesce(CAST($end_learned_at AS TIMESTAMP), r.end_learned_at),
    r.expired_at = coalesce(r.expired_at, $expired_at)
"""
FACTS_TOUCHING = f"""
MATCH (s:Entity)-[r:RELATES_TO]->(t:Entity)
WHERE r.group_id = $group_id AND (s.uuid IN $uuids OR t.uuid IN $uuids)
RETURN {_FACT_COLUMNS}
"""
# One statement per subject (a primary-key lookup, then its adjacency): kuzu plans an
# UNWIND-driven match as a scan of every fact. The HINT keeps kuzu walking from the looked-up
# node: with a filter on the relationship it otherwise joins against a scan of Entity (at
# 6,000 records 2.5 ms a statement instead of 0.9, growing with the table).
FROM_SOURCE = "HINT (s JOIN r) JOIN t"
# The same for the two halves of an as-of question about one entity (cypher.as_of_query).
ANCHOR_HINTS: q.AnchorHints = {"s": ("", FROM_SOURCE), "t": ("", "HINT (t JOIN r) JOIN s")}
_FACTS_OF_PAIR = f"""
MATCH (s:Entity {{{{uuid: $source}}}})-[r:RELATES_TO]->(t:Entity)
WHERE r.group_id = $group_id AND r.name = $relation
{FROM_SOURCE}
RETURN {{columns}}
"""
_FACTS_FROM = f"""
MATCH (s:Entity {{{{uuid: $uuid}}}})-[r:RELATES_TO]->(t:Entity)
WHERE r.group_id = $group_id
{FROM_SOURCE}
RETURN {{columns}}
"""
_FACTS_TO = """
MATCH (s:Entity)-[r:RELATES_TO]->(t:Entity {{uuid: $uuid}})
WHERE r.group_id = $group_id
HINT (t JOIN r) JOIN s
RETURN {columns}
"""
# The lookup's facts: a found entity's facts of the episode's relations.
FACTS_OF_SOURCE = f"""
MATCH (s:Entity {{uuid: $uuid}})-[r:RELATES_TO]->(t:Entity)
WHERE r.group_id = $group_id AND r.name IN $relations
{FROM_SOURCE}
RETURN {_FACT_COLUMNS}
"""
FACT_CANDIDATE_QUERIES = {
    name: text.format(columns=_FACT_COLUMNS)
    for name, text in (("pair", _FACTS_OF_PAIR), ("from", _FACTS_FROM), ("to", _FACTS_TO))
}
# A fact by uuid, from its FactIndex row's source.
FACT_FROM_SOURCE = f"""
MATCH (s:Entity {{uuid: $source_uuid}})-[r:RELATES_TO]->(t:Entity)
WHERE r.uuid = $uuid AND r.group_id = $group_id
{FROM_SOURCE}
RETURN {_FACT_COLUMNS}
"""
# An exact scan of the group's fact embeddings.
VECTOR_FACT_SCAN = """
MATCH (x:FactIndex)
WHERE x.group_id = $group_id AND x.embedding IS NOT NULL
RETURN x.uuid, array_cosine_similarity(x.embedding, $embedding) AS cos, x.source_uuid,
       x.embedding
ORDER BY cos DESC, x.uuid
LIMIT $limit
"""

COUNTS = {
    "episodes": "MATCH (ep:Episodic) WHERE ep.group_id = $group_id RETURN count(ep)",
    "entities": "MATCH (e:Entity) WHERE e.group_id = $group_id RETURN count(e)",
    "facts": "MATCH ()-[r:RELATES_TO]->() WHERE r.group_id = $group_id RETURN count(r)",
    "mentions": (
        "MATCH (ep:Episodic)-[m:MENTIONS]->() WHERE ep.group_id = $group_id RETURN count(m)"
    ),
}
DELETE_GROUP = [
    f"MATCH (n:{label}) WHERE n.group_id = $group_id DETACH DELETE n"
    for label in ("Episodic", "Community", "Entity", "FactIndex", "EntityLookupKey")
]
# Stores made before FactIndex (embeddings on RELATES_TO): every fact gets its row, then the
# column goes. Idempotent, should it be interrupted.
LEGACY_FACT_INDEX = [
    """
    MATCH (s:Entity)-[r:RELATES_TO]->(t:Entity)
    MERGE (x:FactIndex {uuid: r.uuid})
    ON CREATE SET x.group_id = r.group_id, x.source_uuid = s.uuid, x.target_uuid = t.uuid
    SET x.embedding = r.fact_embedding
    """,
    "ALTER TABLE RELATES_TO DROP fact_embedding",
]

# Columns added to Episodic since stores were first made (null on older episodes: no hash
# to compare, see cypher.check_same_episode).
ADDED_EPISODE_COLUMNS = (("content_hash", "ALTER TABLE Episodic ADD content_hash STRING"),)

# Columns added to RELATES_TO since stores were first made (ALTER is a no-op for new stores,
# whose CREATE already has them; the new columns start null, which is what they mean).
ADDED_FACT_COLUMNS = (
    ("prior_ends", "ALTER TABLE RELATES_TO ADD prior_ends TIMESTAMP[]"),
    ("prior_ends_learned_at", "ALTER TABLE RELATES_TO ADD prior_ends_learned_at TIMESTAMP[]"),
    ("end_learned_at", "ALTER TABLE RELATES_TO ADD end_learned_at TIMESTAMP"),
    ("prior_starts", "ALTER TABLE RELATES_TO ADD prior_starts TIMESTAMP[]"),
    ("prior_starts_learned_at", "ALTER TABLE RELATES_TO ADD prior_starts_learned_at TIMESTAMP[]"),
    ("start_learned_at", "ALTER TABLE RELATES_TO ADD start_learned_at TIMESTAMP"),
)

# Community has a fulltext index on name: created one statement per row (see the module
# docstring); it has no vector index, so its name_embedding may be SET later.
_CREATE_COMMUNITY = """
CREATE (c:Community {{uuid: $uuid, group_id: $group_id, name: $name, summary: $summary{embedding}}})
"""
CREATE_COMMUNITY = _CREATE_COMMUNITY.format(embedding="")
CREATE_COMMUNITY_EMBEDDED = _CREATE_COMMUNITY.format(embedding=", name_embedding: $name_embedding")
_UPDATE_COMMUNITY = """
MATCH (c:Community) WHERE c.uuid = $uuid
SET c.name = $name, c.summary = $summary{embedding}
"""
UPDATE_COMMUNITY = _UPDATE_COMMUNITY.format(embedding="")
UPDATE_COMMUNITY_EMBEDDED = _UPDATE_COMMUNITY.format(
    embedding=", c.name_embedding = $name_embedding"
)


def query_facts_text(asof: AsOf) -> str:
    return as_of_query(asof, f"RETURN {_FACT_COLUMNS}, s.name, t.name", ANCHOR_HINTS)


# ----------------------------------------------------------------------------- helpers
def _naive(value: Any) -> Any:
    """Parameters for kuzu: aware datetimes become naive UTC (kuzu drops offsets)."""
    if isinstance(value, datetime):
        return utc(value).replace(tzinfo=None)
    if isinstance(value, dict):
        return {k: _naive(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_naive(v) for v in value]
    return value


def _entity(row: list[Any], community_uuid: str | None = None) -> EntityRecord:
    return entity_record(dict(zip(ENTITY_FIELDS, row, strict=True)), community_uuid)


def _fact(row: list[Any]) -> FactRecord:
    n = len(FACT_FIELDS)
    return fact_record(dict(zip(FACT_FIELDS, row[:n], strict=True)), row[n], row[n + 1])


@contextmanager
def _count_errors() -> Iterator[None]:
    try:
        yield
    except ValueError:
        raise
    except Exception:
        STORE_ERRORS.labels("other").inc()
        raise


class KuzuStore(GraphStore):
    """``GraphStore`` on an embedded kuzu database in the folder ``path``."""

    name = "kuzu"

    def __init__(
        self, path: Path, buffer_pool_mb: int = 2048, max_db_size_mb: int | None = None
    ) -> None:
        self._dir = Path(path)
        self._buffer_pool = buffer_pool_mb * 1024 * 1024
        # kuzu's own default (8 TiB of address space) unless given: tests set it small
        self._max_db_size = None if max_db_size_mb is None else max_db_size_mb * 1024 * 1024
        self._checkpoints_since_open = 0
        self._db: kuzu.Database | None = None
        self._conn: kuzu.Connection | None = None
        self._closed = False
        self._dim: int | None = None
        self._lock = asyncio.Lock()
        self._statements: dict[str, kuzu.PreparedStatement] = {}

    # ------------------------------------------------------------------ plumbing
    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` in a worker thread, one call at a time."""
        async with self._lock:
            with _count_errors():
                return await asyncio.to_thread(fn, *args)

    def _then_checkpoint(self, fn: Callable[..., T], *args: Any) -> T:
        result = fn(*args)
        self._checkpoint_if_due()
        return result

    def _checkpoint_if_due(self) -> None:
        """Checkpoint once the WAL passes the threshold (what kuzu's auto-checkpoint does at
        commit) and reopen the database every ``REOPEN_AFTER_CHECKPOINTS`` checkpoints."""
        try:
            wal_bytes = (self._dir / f"{DB_FILE}.wal").stat().st_size
        except FileNotFoundError:
            return
        if wal_bytes < CHECKPOINT_THRESHOLD_BYTES:
            return
        with STORE_MAINTENANCE_LATENCY.labels("kuzu", "checkpoint").time():
            self._rows("CHECKPOINT")
        self._checkpoints_since_open += 1
        if self._checkpoints_since_open >= REOPEN_AFTER_CHECKPOINTS:
            with STORE_MAINTENANCE_LATENCY.labels("kuzu", "reopen").time():
                self._release()
                self._connection()

    async def _write_call(self, operation: str, rows: int, fn: Callable[..., T], *args: Any) -> T:
        """A write: ``fn``, then a checkpoint if the WAL has grown past the threshold."""
        with observe_write(operation, rows):
            return await self._call(self._then_checkpoint, fn, *args)

    def _connection(self) -> kuzu.Connection:
        if self._conn is None:
            if self._closed:
                raise RuntimeError("the kuzu store is closed")
            self._dir.mkdir(parents=True, exist_ok=True)
            limits: dict[str, Any] = (
                {} if self._max_db_size is None else {"max_db_size": self._max_db_size}
            )
            self._db = kuzu.Database(
                str(self._dir / DB_FILE),
                buffer_pool_size=self._buffer_pool,
                auto_checkpoint=False,  # _checkpoint_if_due
                **limits,
            )
            self._conn = kuzu.Connection(self._db)
            self._checkpoints_since_open = 0
        return self._conn

    def _rows(self, query: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        connection = self._connection()
        if params:
            result = connection.execute(self._prepared(connection, query), _naive(params))
        else:
            result = connection.execute(query)
        if not isinstance(result, kuzu.QueryResult):  # several statements: never sent
            raise TypeError("one statement per query")
        try:
            return [list(row) for row in result.get_all()]
        finally:
            result.close()

    def _prepared(self, connection: kuzu.Connection, query: str) -> kuzu.PreparedStatement:
        """The query prepared once and reused: kuzu 0.11.3 never frees the statement it
        prepares for each call with parameters (~11 KB a call: gigabytes over a long ingest),
        and preparing is a good part of a small query's time."""
        statement = self._statements.get(query)
        if statement is None:
            if len(self._statements) >= MAX_PREPARED_STATEMENTS:
                self._statements.clear()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # prepare() is deprecated
                statement = self._statements[query] = connection.prepare(query)
        return statement

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._rows("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            try:
                self._rows("ROLLBACK")
            except RuntimeError:
                pass  # a failed statement has already rolled the transaction back
            raise
        self._rows("COMMIT")

    def _entity_dims(self) -> dict[str, int] | None:
        """Declared embedding sizes by table, or None before the schema exists."""
        tables = {row[1] for row in self._rows("CALL SHOW_TABLES() RETURN *")}
        if "Entity" not in tables:
            return None
        dims = {}
        for table, prop in (
            ("Entity", "name_embedding"),
            ("Community", "name_embedding"),
            ("FactIndex", "embedding"),
            ("RELATES_TO", "fact_embedding"),  # a store made before FactIndex
        ):
            if table not in tables:
                continue
            for row in self._rows(f"CALL TABLE_INFO('{table}') RETURN *"):
                match = _ARRAY_DIM.match(str(row[2]))
                if row[1] == prop and match:
                    dims[f"{table}.{prop}"] = int(match.group(1))
        return dims

    def _dimension(self) -> int:
        if self._dim is None:
            dims = self._entity_dims()
            if not dims or "Entity.name_embedding" not in dims:
                raise StoreSchemaError("the kuzu schema is missing: run setup() first")
            self._dim = dims["Entity.name_embedding"]
        return self._dim

    # ------------------------------------------------------------------ lifecycle
    async def setup(self, embedding_dim: int) -> None:
        if embedding_dim < 1:
            raise ValueError("embedding_dim must be positive")
        await self._call(self._setup, embedding_dim)

    def _setup(self, dim: int) -> None:
        for name, declared in sorted((self._entity_dims() or {}).items()):
            if declared != dim:
                raise StoreSchemaError(
                    f"the embedded store at {self._dir} holds {declared}-dimensional embeddings "
                    f"({name}) but the embedder produces {dim}. Either configure the embedder "
                    f"that made it (TIDEGRAPH_EMBEDDER / TIDEGRAPH_EMBEDDING_DIM), or start a "
                    f"new store in another data folder and replay the episodes into it."
                )
        legacy = "RELATES_TO.fact_embedding" in (self._entity_dims() or {})
        tables = {row[1] for row in self._rows("CALL SHOW_TABLES() RETURN *")}
        for statement in schema(dim):
            self._rows(statement)
        if "Entity" in tables and "EntityLookupKey" not in tables:
            self._build_lookup_keys()  # a store made before the lookup table
        if legacy:
            for statement in LEGACY_FACT_INDEX:
                self._rows(statement)
        for table, added in (
            ("Episodic", ADDED_EPISODE_COLUMNS),
            ("RELATES_TO", ADDED_FACT_COLUMNS),
        ):
            columns = {row[1] for row in self._rows(f"CALL TABLE_INFO('{table}') RETURN *")}
            for name, statement in added:
                if name not in columns:
                    self._rows(statement)
        present = {row[1] for row in self._rows("CALL SHOW_INDEXES() RETURN *")}
        for name, statement in INDEXES:
            if name not in present:
                self._rows(statement)
        for name, statement in DROPPED_INDEXES:
            if name in present:
                self._rows(statement)
        self._statements.clear()  # prepared before the schema changed
        self._dim = dim

    def _build_lookup_keys(self) -> None:
        uuids: dict[str, tuple[str, list[str]]] = {}
        for uuid, group, key, name_norm, aliases in self._rows(ALL_ENTITY_NAMES):
            for _, row_id in lookup_key_ids(group, key, [name_norm, *(aliases or [])]):
                uuids.setdefault(row_id, (group, []))[1].append(uuid)
        rows = [{"id": i, "group_id": g, "uuids": sorted(u)} for i, (g, u) in uuids.items()]
        with self._transaction():
            for start in range(0, len(rows), 1000):
                self._rows(CREATE_LOOKUP_KEYS, {"rows": rows[start : start + 1000]})

    async def close(self) -> None:
        await self._call(self._close)

    def _close(self) -> None:
        self._closed = True
        self._release()

    def _release(self) -> None:
        """Close the connection and the database (kuzu checkpoints on close)."""
        self._statements.clear()
        if self._conn is not None:
            self._conn.close()
        if self._db is not None:
            self._db.close()
        self._conn = self._db = None

    # ------------------------------------------------------------------ episodes
    async def episode_processed(
        self, group_id: str, episode_uuid: str, content_hash: str | None = None
    ) -> bool:
        rows = await self._call(
            self._rows, EPISODE_PROCESSED, {"group_id": group_id, "uuid": episode_uuid}
        )
        if not rows:
            return False
        check_same_episode(episode_uuid, rows[0][0], content_hash)
        return True

    async def recent_episodes(
        self, group_id: str, before: datetime, limit: int
    ) -> list[EpisodeRecord]:
        if limit <= 0:
            return []
        rows = await self._call(
            self._rows, RECENT_EPISODES, {"group_id": group_id, "before": before, "limit": limit}
        )
        return [episode_record(dict(zip(EPISODE_FIELDS, row, strict=True))) for row in rows[::-1]]

    # ------------------------------------------------------------------ entities
    def _entities(self, group_id: str, query: str, params: dict[str, Any]) -> list[EntityRecord]:
        return self._with_communities(group_id, self._rows(query, {"group_id": group_id, **params}))

    def _with_communities(self, group_id: str, rows: list[list[Any]]) -> list[EntityRecord]:
        uuids = [row[0] for row in rows]
        communities = (
            dict(self._rows(COMMUNITIES, {"group_id": group_id, "uuids": uuids})) if uuids else {}
        )
        return sort_entities(_entity(row, communities.get(row[0])) for row in rows)

    def _entity_rows(self, group_id: str, uuids: list[str], query: str) -> list[list[Any]]:
        """The group's entities of these uuids (``query``: ENTITY_BY_UUID or LOOKUP_BY_UUID)."""
        rows = [row for uuid in unique(uuids) for row in self._rows(query, {"uuid": uuid})]
        group_at = ENTITY_FIELDS.index("group_id")
        return [row for row in rows if row[group_at] == group_id]

    def _find_rows(
        self, group_id: str, kind: str, values: list[str], query: str
    ) -> list[list[Any]]:
        """The group's entities with one of these keys (``kind`` "key") or normalised names
        or aliases ("name"), through EntityLookupKey, each checked against what it holds."""
        wanted = set(values)
        uuids = [
            uuid
            for value in unique(values)
            for row in self._rows(LOOKUP_KEY, {"id": lookup_key_id(group_id, kind, value)})
            for uuid in row[0] or []
        ]
        fields = {name: ENTITY_FIELDS.index(name) for name in ("key", "name", "aliases")}

        def matches(row: list[Any]) -> bool:
            if kind == "key":
                return row[fields["key"]] in wanted
            names = {normalize_name(row[fields["name"]]), *(row[fields["aliases"]] or [])}
            return bool(names & wanted)

        return [row for row in self._entity_rows(group_id, uuids, query) if matches(row)]

    async def entities_by_names(self, group_id: str, names: list[str]) -> list[EntityRecord]:
        if not names:
            return []
        return await self._call(self._entities_found, group_id, "name", unique(names))

    async def entities_by_keys(self, group_id: str, keys: list[str]) -> list[EntityRecord]:
        if not keys:
            return []
        return await self._call(self._entities_found, group_id, "key", unique(keys))

    def _entities_found(self, group_id: str, kind: str, values: list[str]) -> list[EntityRecord]:
        rows = self._find_rows(group_id, kind, values, ENTITY_BY_UUID)
        return self._with_communities(group_id, rows)

    async def lookup_entities(
        self,
        group_id: str,
        keys: list[str],
        names: list[str],
        episode_uuid: str | None = None,
        relations: list[str] | None = None,
        content_hash: str | None = None,
    ) -> EntityLookup:
        return await self._call(
            self._lookup_entities, group_id, keys, names, episode_uuid, relations, content_hash
        )

    def _lookup_entities(
        self,
        group_id: str,
        keys: list[str],
        names: list[str],
        episode_uuid: str | None,
        relations: list[str] | None,
        content_hash: str | None,
    ) -> EntityLookup:
        if episode_uuid:
            marker = self._rows(EPISODE_PROCESSED, {"group_id": group_id, "uuid": episode_uuid})
            if marker:
                check_same_episode(episode_uuid, marker[0][0], content_hash)
                return EntityLookup(processed=True)

        def read(kind: str, values: list[str]) -> list[EntityRecord]:
            rows = self._find_rows(group_id, kind, values, LOOKUP_BY_UUID) if values else []
            return sort_entities(_entity(row) for row in rows)

        lookup = EntityLookup(by_key=read("key", keys), by_name=read("name", names))
        if relations is not None:
            rows = []
            params = {"group_id": group_id, "relations": unique(relations)}
            for source in unique(e.uuid for e in [*lookup.by_key, *lookup.by_name]):
                if relations:
                    rows += self._rows(FACTS_OF_SOURCE, {**params, "uuid": source})
            lookup.facts = sort_facts({f.uuid: f for f in map(_fact, rows)}.values())
        return lookup

    async def entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]:
        if not uuids:
            return []
        return await self._call(self._entities_by_uuids, group_id, uuids)

    def _entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]:
        return self._with_communities(group_id, self._entity_rows(group_id, uuids, ENTITY_BY_UUID))

    async def list_entities(self, group_id: str) -> list[EntityRecord]:
        return await self._call(self._entities, group_id, LIST_ENTITIES, {})

    async def fulltext_entities(
        self, group_id: str, text: str, limit: int
    ) -> list[tuple[EntityRecord, float]]:
        query = search_text(text)
        if query is None or limit <= 0:
            return []
        return await self._call(self._fulltext_entities, group_id, query, limit)

    def _fulltext_entities(
        self, group_id: str, query: str, limit: int
    ) -> list[tuple[EntityRecord, float]]:
        hits = self._rows(FULLTEXT_ENTITIES, {"group_id": group_id, "query": query, "limit": limit})
        return self._with_entities(group_id, [(uuid, float(score)) for uuid, score in hits], limit)

    def _with_entities(
        self, group_id: str, hits: list[tuple[str, float]], limit: int
    ) -> list[tuple[EntityRecord, float]]:
        hits = top(hits, limit)
        uuids = [uuid for uuid, _ in hits]
        found = {e.uuid: e for e in self._entities_by_uuids(group_id, uuids)}
        return rank(((found[u], s) for u, s in hits if u in found), limit)

    async def vector_entities(
        self, group_id: str, embedding: list[float], limit: int
    ) -> list[tuple[EntityRecord, float]]:
        return await self._call(self._vector_entities, group_id, embedding, limit)

    def _vector_entities(
        self, group_id: str, embedding: list[float], limit: int
    ) -> list[tuple[EntityRecord, float]]:
        vector = check_embedding(embedding, self._dimension(), "query embedding")
        if limit <= 0 or vector is None:
            return []
        k = vector_candidates(limit)
        candidates = self._rows(VECTOR_ENTITY_CANDIDATES, {"embedding": vector, "k": k})
        mine = [uuid for uuid, group, _ in candidates if group == group_id]
        params = {"group_id": group_id, "embedding": vector}
        if len(mine) < limit and len(candidates) >= k:
            # The group is a small part of the index: an exact scan of the group instead.
            scored = self._rows(VECTOR_ENTITY_SCAN, {**params, "limit": limit})
        else:
            # Exact cosine on the stored vectors, as the Neo4j store reports it.
            scored = self._rows(VECTOR_ENTITY_RESCORE, {**params, "uuids": mine}) if mine else []
        hits = [(uuid, cosine_score(cos)) for uuid, cos in scored]
        return self._with_entities(group_id, hits, limit)

    async def upsert_entities(self, group_id: str, entities: list[EntityRecord]) -> None:
        if not entities:
            return
        await self._write_call(
            "upsert_entities", len(entities), self._upsert_entities, group_id, entities
        )

    def _upsert_entities(self, group_id: str, entities: list[EntityRecord]) -> None:
        with self._transaction():
            self._write_entities(group_id, entities)

    def _write_entities(self, group_id: str, entities: list[EntityRecord]) -> None:
        """The upsert's statements, inside the caller's transaction."""
        now = now_utc()
        rows = [entity_row(group_id, e, self._dimension(), now) for e in entities]
        stored = [
            found
            for uuid in unique(r["uuid"] for r in rows)
            for found in self._rows(ENTITY_STATE, {"uuid": uuid})
        ]
        check_entity_owners(group_id, {row[0]: row[1] for row in stored})
        states = {
            uuid: EntityState(list(labels or []), list(aliases or []), summary or "", key)
            for uuid, _, labels, aliases, summary, key in stored
        }
        creates, updates = fold_entity_rows(rows, states)
        for row in creates:
            self._create_entity(group_id, row)
        if updates:
            update_rows = [{"uuid": u, **vars(s)} for u, s in updates.items()]
            self._rows(UPDATE_ENTITIES, {"rows": update_rows})
        # The lookup rows of every key, name and alias the write added.
        added: list[tuple[str, str]] = []
        for row in creates:
            names = [row["name_norm"], *row["aliases"]]
            added += [(row["uuid"], i) for _, i in lookup_key_ids(group_id, row["key"], names)]
        for uuid, state in updates.items():
            before = states[uuid]
            key = state.key if state.key != before.key else None
            new_aliases = [a for a in state.aliases if a not in before.aliases]
            added += [(uuid, i) for _, i in lookup_key_ids(group_id, key, new_aliases)]
        for uuid, row_id in added:
            self._rows(ADD_LOOKUP_KEY, {"id": row_id, "group_id": group_id, "uuid": uuid})

    def _create_entity(self, group_id: str, row: dict[str, Any]) -> None:
        fields = ("uuid", "name", "name_norm", "labels", "summary", "key", "aliases", "created_at")
        params = {"group_id": group_id, **{name: row[name] for name in fields}}
        if row["name_embedding"] is None:
            self._rows(CREATE_ENTITY, params)
        else:
            self._rows(CREATE_ENTITY_EMBEDDED, {**params, "name_embedding": row["name_embedding"]})

    # ------------------------------------------------------------------ facts
    async def facts_touching(self, group_id: str, entity_uuids: list[str]) -> list[FactRecord]:
        if not entity_uuids:
            return []
        return await self._call(self._facts_touching, group_id, unique(entity_uuids))

    def _facts_touching(self, group_id: str, entity_uuids: list[str]) -> list[FactRecord]:
        rows = self._rows(FACTS_TOUCHING, {"group_id": group_id, "uuids": entity_uuids})
        return self._with_fact_embeddings(group_id, sort_facts(map(_fact, rows)))

    def _fact_index(self, uuids: list[str]) -> dict[str, tuple[StoredFact, list[float] | None]]:
        """The FactIndex rows of these facts (one primary-key lookup each: kuzu plans
        ``uuid IN [...]`` as a scan of the whole table)."""
        found = {}
        for uuid in uuids:
            for group, source, target, embedding in self._rows(FACT_INDEX_ROW, {"uuid": uuid}):
                stored = StoredFact(group, source, target)
                found[uuid] = (stored, None if embedding is None else list(embedding))
        return found

    def _with_fact_embeddings(self, group_id: str, facts: list[FactRecord]) -> list[FactRecord]:
        index = self._fact_index([f.uuid for f in facts])
        found = []
        for fact in facts:
            stored, embedding = index.get(fact.uuid, (None, None))
            if stored is not None and stored.group_id == group_id and embedding is not None:
                fact = fact.model_copy(update={"fact_embedding": embedding})
            found.append(fact)
        return found

    async def fact_candidates(
        self,
        group_id: str,
        pairs: list[tuple[str, str]],
        ends: list[str],
        *,
        embeddings: bool = True,
    ) -> list[FactRecord]:
        if not pairs and not ends:
            return []
        return await self._call(self._fact_candidates, group_id, pairs, ends, embeddings)

    def _fact_candidates(
        self, group_id: str, pairs: list[tuple[str, str]], ends: list[str], embeddings: bool
    ) -> list[FactRecord]:
        rows: list[list[Any]] = []
        for source, relation in sorted(set(pairs)):
            params = {"group_id": group_id, "source": source, "relation": relation}
            rows += self._rows(FACT_CANDIDATE_QUERIES["pair"], params)
        for uuid in unique(ends):
            for part in ("from", "to"):
                params = {"group_id": group_id, "uuid": uuid}
                rows += self._rows(FACT_CANDIDATE_QUERIES[part], params)
        facts = sort_facts({fact.uuid: fact for fact in map(_fact, rows)}.values())
        return self._with_fact_embeddings(group_id, facts) if embeddings else facts

    async def vector_facts(
        self, group_id: str, embedding: list[float], limit: int
    ) -> list[tuple[FactRecord, float]]:
        return await self._call(self._vector_facts, group_id, embedding, limit)

    def _vector_facts(
        self, group_id: str, embedding: list[float], limit: int
    ) -> list[tuple[FactRecord, float]]:
        vector = check_embedding(embedding, self._dimension(), "query embedding")
        if limit <= 0 or vector is None:
            return []
        scanned = self._rows(
            VECTOR_FACT_SCAN, {"group_id": group_id, "embedding": vector, "limit": limit}
        )
        scores = top([(uuid, cos) for uuid, cos, _, _ in scanned], limit)
        rows = {uuid: (source, list(embedding)) for uuid, _, source, embedding in scanned}
        found = {}
        for uuid, _ in scores:
            source, embedding = rows[uuid]
            params = {"group_id": group_id, "uuid": uuid, "source_uuid": source}
            for row in self._rows(FACT_FROM_SOURCE, params):
                found[uuid] = _fact(row).model_copy(update={"fact_embedding": embedding})
        return rank(((found[u], cosine_score(c)) for u, c in scores if u in found), limit)

    async def write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        rows = (
            1 + len(write.entities) + len(write.mentions) + len(write.facts) + len(write.closures)
        )
        return await self._write_call("write_episode", rows, self._write_episode, group_id, write)

    def _write_episode(self, group_id: str, write: EpisodeWrite) -> bool:
        dim = self._dimension()
        now = now_utc()
        episode = episode_row(group_id, write.episode, now)
        facts = [fact_row(group_id, f, dim, now) for f in write.facts]
        closures = [closure_row(c) for c in write.closures]
        stored = self._rows(EPISODE_GROUP, {"uuid": write.episode.uuid})
        episode_group = stored[0][0] if stored else None
        if episode_group == group_id:
            check_same_episode(write.episode.uuid, stored[0][1], write.episode.content_hash)
            return False  # already processed: nothing may change (see GraphStore)
        # Checked before anything is written: the entities go in a transaction of their own,
        # committed first, because inside one transaction kuzu 0.11.3 finds the wrong node by
        # primary key (`uuid IN [...]`) once nodes were created in it, and may crash. Nothing
        # else runs in between (one call at a time).
        stored_facts = self._check_write(group_id, write, episode_group)
        if write.entities:
            with self._transaction():
                self._write_entities(group_id, write.entities)
        with self._transaction():
            self._rows(MERGE_EPISODE, {"group_id": group_id, **episode})
            for entity_uuid in unique(write.mentions):
                self._rows(
                    CREATE_MENTION,
                    {
                        "group_id": group_id,
                        "episode_uuid": episode["uuid"],
                        "entity_uuid": entity_uuid,
                    },
                )
            for row in facts:
                self._write_fact(group_id, row, row["uuid"] in stored_facts)
                stored_facts[row["uuid"]] = StoredFact(
                    group_id, row["source_uuid"], row["target_uuid"]
                )
            for row in closures:
                ends = stored_facts[row["uuid"]]  # checked: written or stored in the group
                self._rows(
                    CLOSE_FACT,
                    {
                        **row,
                        "group_id": group_id,
                        "source_uuid": ends.source_uuid,
                        "target_uuid": ends.target_uuid,
                    },
                )
        return True

    def _write_fact(self, group_id: str, row: dict[str, Any], stored: bool) -> None:
        params = {"group_id": group_id, **row}
        embedding = params.pop("fact_embedding")
        index = {
            "uuid": row["uuid"],
            "group_id": group_id,
            "source_uuid": row["source_uuid"],
            "target_uuid": row["target_uuid"],
        }
        if stored:
            del params["group_id"], params["created_at"]
            self._rows(UPDATE_FACT, params)
            if embedding is not None:
                self._rows(SET_FACT_EMBEDDING, {"uuid": row["uuid"], "embedding": embedding})
        else:
            self._rows(CREATE_FACT, params)
            if embedding is None:
                self._rows(CREATE_FACT_INDEX_ROW, index)
            else:
                self._rows(CREATE_FACT_INDEX_ROW_EMBEDDED, {**index, "embedding": embedding})

    def _check_write(
        self, group_id: str, write: EpisodeWrite, episode_group: str | None
    ) -> dict[str, StoredFact]:
        """Refuse a write that would cross groups or dangle (its entity upserts count as the
        group's); its stored facts, by uuid."""
        upserted = unique(e.uuid for e in write.entities)
        entity_uuids = unique(
            [
                *upserted,
                *write.mentions,
                *(u for f in write.facts for u in (f.source_uuid, f.target_uuid)),
            ]
        )
        owners = {
            uuid: row[0]
            for uuid in entity_uuids
            for row in self._rows(ENTITY_GROUP, {"uuid": uuid})
        }
        check_entity_owners(group_id, {u: owners[u] for u in upserted if u in owners})
        fact_uuids = unique([*(f.uuid for f in write.facts), *(c.uuid for c in write.closures)])
        facts = {uuid: stored for uuid, (stored, _) in self._fact_index(fact_uuids).items()}
        check_episode_write(
            group_id, write, episode_group, {**owners, **dict.fromkeys(upserted, group_id)}, facts
        )
        return facts

    async def query_facts(
        self,
        group_id: str,
        *,
        valid_at: datetime | None = None,
        known_at: datetime | None = None,
        include_invalid: bool = False,
        entity_uuid: str | None = None,
    ) -> list[FactView]:
        asof = AsOf.resolve(valid_at, known_at, include_invalid, entity_uuid)
        return await self._call(self._query_facts, group_id, asof)

    def _query_facts(self, group_id: str, asof: AsOf) -> list[FactView]:
        rows = self._rows(query_facts_text(asof), as_of_params(group_id, asof))
        facts = [(_fact(row[:-2]), row[-2], row[-1]) for row in rows]
        facts = [(f, s, o) for f, s, o in facts if asof.believed(f)]
        uuids = unique(u for f, _, _ in facts for u in f.episodes)
        producers = (
            {
                u: p or ""
                for u, p in self._rows(PRODUCER_IDS, {"group_id": group_id, "uuids": uuids})
            }
            if uuids
            else {}
        )
        return sort_views((fact_view(f, s, o, producers, asof), f) for f, s, o in facts)

    # ------------------------------------------------------------------ communities
    async def entity_graph(
        self, group_id: str, at: datetime | None = None
    ) -> tuple[list[str], list[WeightedEdge]]:
        asof = AsOf.resolve(at, None, False, None)
        return await self._call(self._entity_graph, group_id, asof)

    def _entity_graph(self, group_id: str, asof: AsOf) -> tuple[list[str], list[WeightedEdge]]:
        nodes = self._rows(q.GROUP_ENTITY_UUIDS, {"group_id": group_id})
        rows = self._rows(q.entity_graph_cypher(asof, ANCHOR_HINTS), as_of_params(group_id, asof))
        edges = [WeightedEdge(a, b, w) for a, b, w in fold_edges(rows)]
        return sorted(row[0] for row in nodes), edges

    async def neighbour_weights(
        self, group_id: str, entity_uuid: str, at: datetime | None = None
    ) -> dict[str, int]:
        asof = AsOf.resolve(at, None, False, entity_uuid)
        rows = await self._call(
            self._rows, q.entity_graph_cypher(asof, ANCHOR_HINTS), as_of_params(group_id, asof)
        )
        return neighbour_weights_of(entity_uuid, rows)

    async def communities(self, group_id: str) -> list[CommunityRecord]:
        return await self._call(self._communities, group_id)

    def _communities(self, group_id: str) -> list[CommunityRecord]:
        heads = self._rows(q.GROUP_COMMUNITIES, {"group_id": group_id})
        members = self._rows(q.GROUP_COMMUNITY_MEMBERS, {"group_id": group_id})
        return [CommunityRecord(u, n, s, m) for u, n, s, m in fold_communities(heads, members)]

    async def write_communities(
        self, group_id: str, upserts: list[CommunityRecord], deletes: list[str]
    ) -> None:
        if not upserts and not deletes:
            return
        rows = len(upserts)
        await self._write_call(
            "write_communities", rows, self._write_communities, group_id, upserts, deletes
        )

    def _write_communities(
        self, group_id: str, upserts: list[CommunityRecord], deletes: list[str]
    ) -> None:
        rows, memberships, members = community_rows(upserts, self._dimension())
        uuids = [r["uuid"] for r in rows]
        params = {"group_id": group_id}
        with self._transaction():
            owners = self._rows(q.COMMUNITY_GROUPS, {"uuids": unique([*uuids, *deletes])})
            check_community_owners(group_id, {uuid: owner for uuid, owner in owners})
            if deletes:
                self._rows(q.DELETE_COMMUNITIES, {**params, "uuids": unique(deletes)})
            existing = {uuid for uuid, _ in owners} - set(deletes)
            for row in rows:
                self._upsert_community(group_id, row, row["uuid"] in existing)
                existing.add(row["uuid"])
            if rows:
                self._rows(q.DROP_MEMBERSHIPS, {**params, "uuids": uuids, "members": members})
            if memberships:
                self._rows(q.ADD_MEMBERSHIPS, {**params, "rows": memberships})

    def _upsert_community(self, group_id: str, row: dict[str, Any], exists: bool) -> None:
        params = {"uuid": row["uuid"], "name": row["name"], "summary": row["summary"]}
        embedding = row["name_embedding"]
        if exists:
            query = UPDATE_COMMUNITY if embedding is None else UPDATE_COMMUNITY_EMBEDDED
        else:
            params["group_id"] = group_id
            query = CREATE_COMMUNITY if embedding is None else CREATE_COMMUNITY_EMBEDDED
        if embedding is not None:
            params["name_embedding"] = embedding
        self._rows(query, params)

    async def assign_member(self, group_id: str, community_uuid: str, entity_uuid: str) -> None:
        params = {
            "group_id": group_id,
            "community_uuid": community_uuid,
            "entity_uuid": entity_uuid,
        }
        await self._write_call("assign_member", 1, self._assign_member, params)

    def _assign_member(self, params: dict[str, Any]) -> None:
        with self._transaction():
            if int(self._rows(q.MEMBER_TARGETS, params)[0][0]) == 0:
                return
            self._rows(q.DROP_OTHER_MEMBERSHIPS, params)
            self._rows(q.MERGE_MEMBERSHIP, params)

    # ------------------------------------------------------------------ maintenance
    async def counts(self, group_id: str) -> dict[str, int]:
        return await self._call(self._counts, group_id)

    def _counts(self, group_id: str) -> dict[str, int]:
        return {
            name: int(self._rows(query, {"group_id": group_id})[0][0])
            for name, query in COUNTS.items()
        }

    async def delete_group(self, group_id: str) -> None:
        await self._write_call("delete_group", 1, self._delete_group, group_id)

    def _delete_group(self, group_id: str) -> None:
        with self._transaction():
            for statement in DELETE_GROUP:
                self._rows(statement, {"group_id": group_id})
