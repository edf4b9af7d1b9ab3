"""The kuzu dialect: the embedded store's schema and every query text it sends that Neo4j does
not share (shared ones: ``tidegraph.store.common_queries``, ``tidegraph.store.asof_cypher``).
Why each is shaped as it is: ``tidegraph.store.kuzu_store``'s docstring.

Fully parameterised, like Neo4j's; DDL takes no parameters, so the embedding dimension (a
checked int) and our own index names are the only values formatted into text. Reads answer
with the column names ``tidegraph.store.core`` reads, the same as Neo4j's.
"""

from __future__ import annotations

from tidegraph.store.rows import ENTITY_FIELDS, EPISODE_FIELDS

ENTITY_VECTOR_INDEX = "entity_name_embedding"
ENTITY_FULLTEXT_INDEX = "entity_name_summary"
EPISODE_VECTOR_INDEX = "episodic_content_embedding"
FACT_VECTOR_INDEX = "fact_vector_embedding"
COMMUNITY_VECTOR_INDEX = "community_vector_embedding"
EPISODE_FULLTEXT_INDEX = "episodic_content"
FACT_FULLTEXT_INDEX = "fact_text"
COMMUNITY_FULLTEXT_INDEX = "community_name_summary"


def props_of(variable: str, fields: tuple[str, ...], nulls: tuple[str, ...] = ()) -> str:
    """A struct of the variable's properties (those in ``nulls`` as NULL): kuzu's
    ``e {.*}``."""
    values = (f"{name}: {'NULL' if name in nulls else f'{variable}.{name}'}" for name in fields)
    return "{" + ", ".join(values) + "}"


# ----------------------------------------------------------------------------- schema
# Embeddings that change (a fact's, a community's) are searched in tables of their own, one
# row per embedding: kuzu cannot SET a vector-indexed property, and an HNSW index that was
# once emptied finds nothing again, so a new embedding is a new row (created before the old
# one is deleted). By table: the column naming what the embedding is of.
VECTOR_TABLES = {"FactVector": "fact_uuid", "CommunityVector": "community_uuid"}


def schema(dim: int) -> list[str]:
    """The DDL (DDL takes no parameters: ``dim`` is a checked int, nothing else varies)."""
    vector = f"DOUBLE[{int(dim)}]"
    return [
        "CREATE NODE TABLE IF NOT EXISTS Episodic(uuid STRING PRIMARY KEY, group_id STRING, "
        "name STRING, source STRING, source_description STRING, content STRING, "
        "valid_at TIMESTAMP, created_at TIMESTAMP, producer_id STRING, content_hash STRING, "
        f"created_entities STRING[], not_extracted STRING, content_embedding {vector})",
        "CREATE NODE TABLE IF NOT EXISTS Entity(uuid STRING PRIMARY KEY, group_id STRING, "
        "name STRING, name_norm STRING, labels STRING[], summary STRING, key STRING, "
        f"aliases STRING[], name_embedding {vector}, created_at TIMESTAMP)",
        "CREATE NODE TABLE IF NOT EXISTS Community(uuid STRING PRIMARY KEY, group_id STRING, "
        f"name STRING, summary STRING, name_embedding {vector}, created_at TIMESTAMP, "
        "vector_id STRING)",
        "CREATE REL TABLE IF NOT EXISTS RELATES_TO(FROM Entity TO Entity, uuid STRING, "
        "group_id STRING, name STRING, fact STRING, "
        "episodes STRING[], valid_at TIMESTAMP, invalid_at TIMESTAMP, created_at TIMESTAMP, "
        "expired_at TIMESTAMP, cardinality STRING, prior_ends TIMESTAMP[], "
        "prior_ends_learned_at TIMESTAMP[], end_learned_at TIMESTAMP, "
        "prior_starts TIMESTAMP[], prior_starts_learned_at TIMESTAMP[], "
        "start_learned_at TIMESTAMP)",
        "CREATE NODE TABLE IF NOT EXISTS FactIndex(uuid STRING PRIMARY KEY, group_id STRING, "
        f"source_uuid STRING, target_uuid STRING, embedding {vector}, fact STRING, "
        "vector_id STRING)",
        *(
            f"CREATE NODE TABLE IF NOT EXISTS {table}(id STRING PRIMARY KEY, group_id STRING, "
            f"{owner} STRING, embedding {vector})"
            for table, owner in VECTOR_TABLES.items()
        ),
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
    *(
        (
            index,
            f"CALL CREATE_VECTOR_INDEX('{table}', '{index}', '{prop}', "
            "metric := 'cosine', mu := 16, ml := 32, efc := 100)",
        )
        for table, index, prop in (
            ("Episodic", EPISODE_VECTOR_INDEX, "content_embedding"),
            ("FactVector", FACT_VECTOR_INDEX, "embedding"),
            ("CommunityVector", COMMUNITY_VECTOR_INDEX, "embedding"),
        )
    ),
    *(
        (index, f"CALL CREATE_FTS_INDEX('{table}', '{index}', [{columns}])")
        for table, index, columns in (
            ("Episodic", EPISODE_FULLTEXT_INDEX, "'content'"),
            ("FactIndex", FACT_FULLTEXT_INDEX, "'fact'"),
            ("Community", COMMUNITY_FULLTEXT_INDEX, "'name', 'summary'"),
        )
    ),
)

# Fulltext indexes older stores made and nothing reads (search reads community_name_summary).
# Dropped on setup.
DROPPED_INDEXES = (("community_name", "CALL DROP_FTS_INDEX('Community', 'community_name')"),)

SHOW_TABLES = "CALL SHOW_TABLES() RETURN name"
SHOW_INDEXES = "CALL SHOW_INDEXES() RETURN index_name"


def table_info(table: str) -> str:
    """The columns of one of our tables (a constant name: TABLE_INFO takes no parameter)."""
    if table not in {"Episodic", "Entity", "Community", "RELATES_TO", "FactIndex", *VECTOR_TABLES}:
        raise ValueError(f"not a table of the store: {table!r}")
    return f"CALL TABLE_INFO('{table}') RETURN name, type"


# Stores made before FactIndex (embeddings on RELATES_TO): every fact gets its row, then the
# column goes. Idempotent, should it be interrupted.
LEGACY_FACT_INDEX = (
    """
    MATCH (s:Entity)-[r:RELATES_TO]->(t:Entity)
    MERGE (x:FactIndex {uuid: r.uuid})
    ON CREATE SET x.group_id = r.group_id, x.source_uuid = s.uuid, x.target_uuid = t.uuid
    SET x.embedding = r.fact_embedding
    """,
    "ALTER TABLE RELATES_TO DROP fact_embedding",
)


# Columns added since stores were first made, by table (ALTER is skipped for new stores, whose
# CREATE already has them; the new columns start null, which is what they mean: no hash to
# compare, see errors.check_same_episode; no end or start history).
def added_columns(dim: int) -> dict[str, tuple[tuple[str, str], ...]]:
    """The columns added since stores were first made, by table: (name, ALTER statement)."""
    return {
        **ADDED_COLUMNS,
        "Episodic": (
            *ADDED_COLUMNS["Episodic"],
            (
                "content_embedding",
                f"ALTER TABLE Episodic ADD content_embedding DOUBLE[{int(dim)}]",
            ),
        ),
    }


# Search arrived: the text of every fact and the embeddings of facts and communities are
# copied where they are indexed (run once, when the columns and tables are new).
BACKFILL = {
    "FactIndex.fact": """
    MATCH (s:Entity)-[r:RELATES_TO]->(:Entity)
    MATCH (x:FactIndex {uuid: r.uuid})
    SET x.fact = r.fact
    """,
    "FactVector": """
    MATCH (x:FactIndex) WHERE x.embedding IS NOT NULL
    SET x.vector_id = x.uuid
    WITH x
    CREATE (:FactVector {id: x.uuid, group_id: x.group_id, fact_uuid: x.uuid,
                         embedding: x.embedding})
    """,
    "CommunityVector": """
    MATCH (c:Community) WHERE c.name_embedding IS NOT NULL
    SET c.vector_id = c.uuid
    WITH c
    CREATE (:CommunityVector {id: c.uuid, group_id: c.group_id, community_uuid: c.uuid,
                              embedding: c.name_embedding})
    """,
}

ADDED_COLUMNS = {
    "Episodic": (
        ("content_hash", "ALTER TABLE Episodic ADD content_hash STRING"),
        ("created_entities", "ALTER TABLE Episodic ADD created_entities STRING[]"),
        ("not_extracted", "ALTER TABLE Episodic ADD not_extracted STRING"),
    ),
    "FactIndex": (
        ("fact", "ALTER TABLE FactIndex ADD fact STRING"),
        ("vector_id", "ALTER TABLE FactIndex ADD vector_id STRING"),
    ),
    "Community": (
        ("created_at", "ALTER TABLE Community ADD created_at TIMESTAMP"),
        ("vector_id", "ALTER TABLE Community ADD vector_id STRING"),
    ),
    "RELATES_TO": (
        ("prior_ends", "ALTER TABLE RELATES_TO ADD prior_ends TIMESTAMP[]"),
        ("prior_ends_learned_at", "ALTER TABLE RELATES_TO ADD prior_ends_learned_at TIMESTAMP[]"),
        ("end_learned_at", "ALTER TABLE RELATES_TO ADD end_learned_at TIMESTAMP"),
        ("prior_starts", "ALTER TABLE RELATES_TO ADD prior_starts TIMESTAMP[]"),
        (
            "prior_starts_learned_at",
            "ALTER TABLE RELATES_TO ADD prior_starts_learned_at TIMESTAMP[]",
        ),
        ("start_learned_at", "ALTER TABLE RELATES_TO ADD start_learned_at TIMESTAMP"),
    ),
}

# ----------------------------------------------------------------------------- episodes
EPISODE_PROCESSED = """
MATCH (ep:Episodic)
WHERE ep.uuid = $uuid AND ep.group_id = $group_id AND ep.not_extracted IS NULL
RETURN ep.content_hash AS content_hash, ep.created_entities AS created_entities
"""
PENDING_EPISODES = f"""
MATCH (ep:Episodic) WHERE ep.group_id = $group_id AND ep.not_extracted IS NOT NULL
RETURN {props_of("ep", EPISODE_FIELDS)} AS ep
ORDER BY ep.valid_at, ep.producer_id
LIMIT $limit
"""
RECENT_EPISODES = f"""
MATCH (ep:Episodic) WHERE ep.group_id = $group_id AND ep.valid_at < $before
RETURN {props_of("ep", EPISODE_FIELDS)} AS ep
ORDER BY ep.valid_at DESC, ep.uuid DESC
LIMIT $limit
"""
EPISODE_GROUP = """
MATCH (ep:Episodic) WHERE ep.uuid = $uuid
RETURN ep.group_id AS group_id, ep.content_hash AS content_hash,
       ep.not_extracted AS not_extracted
"""
# Created once (a processed episode is never written again), one statement per row (the
# fulltext index), with its content embedding inline (vector-indexed: never SET).
_CREATE_EPISODE = """
CREATE (ep:Episodic {{uuid: $uuid, group_id: $group_id, created_at: $created_at, name: $name,
                     source: $source, source_description: $source_description,
                     content: $content, valid_at: $valid_at, producer_id: $producer_id,
                     content_hash: CAST($content_hash AS STRING),
                     created_entities: CAST($created_entities AS STRING[]),
                     not_extracted: CAST($not_extracted AS STRING){embedding}}})
"""
# The one change to a stored episode: the extraction of one stored without it (README
# "Episodes without an LLM"); its content and embedding are the same (same content hash).
MARK_EXTRACTED = """
MATCH (ep:Episodic {uuid: $uuid})
SET ep.not_extracted = NULL, ep.created_entities = CAST($created_entities AS STRING[])
"""
CREATE_EPISODE = _CREATE_EPISODE.format(embedding="")
CREATE_EPISODE_EMBEDDED = _CREATE_EPISODE.format(
    embedding=", content_embedding: $content_embedding"
)
# An episode's MENTIONS and new facts are CREATEd one statement per row, by primary key: the
# episode is new (a processed one is never written again) and so are those facts, and kuzu
# plans a MERGE of a relationship, or any UNWIND-driven match, as a scan of the whole table.
CREATE_MENTION = """
MATCH (ep:Episodic {uuid: $episode_uuid}), (e:Entity {uuid: $entity_uuid})
CREATE (ep)-[:MENTIONS {group_id: $group_id}]->(e)
"""
PRODUCER_IDS = """
MATCH (ep:Episodic) WHERE ep.uuid IN $uuids AND ep.group_id = $group_id
RETURN ep.uuid AS uuid, ep.producer_id AS producer_id
"""

# ----------------------------------------------------------------------------- entities
ENTITY_STATE = """
MATCH (e:Entity {uuid: $uuid})
RETURN e.group_id AS group_id, e.labels AS labels, e.aliases AS aliases, e.summary AS summary,
       e.key AS key
"""
# By primary key, one statement per entity: kuzu plans `uuid IN [...]` as a scan of the table.
ENTITY_GROUP = "MATCH (e:Entity {uuid: $uuid}) RETURN e.group_id AS group_id"
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
_ENTITY = props_of("e", ENTITY_FIELDS)
# One statement per uuid (a primary-key lookup): kuzu plans `uuid IN [...]` as a scan.
ENTITY_BY_UUID = f"MATCH (e:Entity {{uuid: $uuid}}) RETURN {_ENTITY} AS e"
# Resolution's lookups (EntityLookup): the same without the name embedding.
LOOKUP_BY_UUID = (
    "MATCH (e:Entity {uuid: $uuid}) "
    f"RETURN {props_of('e', ENTITY_FIELDS, ('name_embedding',))} AS e"
)
LIST_ENTITIES = f"MATCH (e:Entity) WHERE e.group_id = $group_id RETURN {_ENTITY} AS e"
# Entities by key and by name go through EntityLookupKey, kuzu having no secondary index: one
# row per (group, key) and per (group, normalised name or alias), keyed by them, with the uuids
# of the entities that have it. Without it, every lookup scanned the entities of every group
# (the largest cost of a mapped episode at 50,000 records, growing with the store). A row only
# gains uuids (an entity's key, name and aliases are only ever added to), and a read checks
# each entity it finds, so an entry that no longer applies finds nothing.
LOOKUP_KEY = "MATCH (x:EntityLookupKey {id: $id}) RETURN x.uuids AS uuids"
ADD_LOOKUP_KEY = """
MERGE (x:EntityLookupKey {id: $id})
ON CREATE SET x.group_id = $group_id, x.uuids = [$uuid]
ON MATCH SET x.uuids = CASE WHEN list_contains(x.uuids, $uuid) THEN x.uuids
                            ELSE list_append(x.uuids, $uuid) END
"""
ALL_ENTITY_NAMES = """
MATCH (e:Entity)
RETURN e.uuid AS uuid, e.group_id AS group_id, e.key AS key, e.name_norm AS name_norm,
       e.aliases AS aliases
"""
CREATE_LOOKUP_KEYS = """
UNWIND $rows AS row
CREATE (:EntityLookupKey {id: row.id, group_id: row.group_id, uuids: row.uuids})
"""

COMMUNITIES = """
MATCH (c:Community)-[:HAS_MEMBER]->(e:Entity)
WHERE e.uuid IN $uuids AND c.group_id = $group_id
RETURN e.uuid AS uuid, min(c.uuid) AS community_uuid
"""


FULLTEXT_ENTITIES = f"""
CALL QUERY_FTS_INDEX('Entity', '{ENTITY_FULLTEXT_INDEX}', $query)
WITH node AS e, score
WHERE e.group_id = $group_id
RETURN {_ENTITY} AS e, score
ORDER BY score DESC, e.uuid
LIMIT $limit
"""
# ----------------------------------------------------------------------------- facts
# A fact's embedding is not on the relationship (see kuzu_store's docstring): read from its
# FactIndex row where it is wanted.
_FACT_RETURN = "RETURN r, s.uuid AS source_uuid, t.uuid AS target_uuid"

FACT_INDEX_ROW = """
MATCH (x:FactIndex {uuid: $uuid})
RETURN x.group_id AS group_id, x.source_uuid AS source_uuid, x.target_uuid AS target_uuid,
       x.embedding AS embedding, x.vector_id AS vector_id
"""
# A fact's row: its ends, its text (fulltext-indexed) and its embedding, whose searchable copy
# is the FactVector row ``vector_id`` (see VECTOR_TABLES).
_CREATE_FACT_INDEX_ROW = """
CREATE (:FactIndex {{uuid: $uuid, group_id: $group_id, source_uuid: $source_uuid,
                    target_uuid: $target_uuid, fact: $fact{embedding}}})
"""
CREATE_FACT_INDEX_ROW = _CREATE_FACT_INDEX_ROW.format(embedding="")
CREATE_FACT_INDEX_ROW_EMBEDDED = _CREATE_FACT_INDEX_ROW.format(
    embedding=", embedding: $embedding, vector_id: $vector_id"
)
SET_FACT_TEXT = "MATCH (x:FactIndex {uuid: $uuid}) SET x.fact = $fact"
# A row without an embedding leaves the stored one.
SET_FACT_EMBEDDING = """
MATCH (x:FactIndex {uuid: $uuid}) SET x.embedding = $embedding, x.vector_id = $vector_id
"""
CREATE_VECTOR = {
    table: f"""
CREATE (:{table} {{id: $id, group_id: $group_id, {owner}: $owner, embedding: $embedding}})
"""
    for table, owner in VECTOR_TABLES.items()
}
DELETE_VECTOR = {table: f"MATCH (v:{table} {{id: $id}}) DELETE v" for table in VECTOR_TABLES}
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
# The facts touching $uuids, in two statements whose rows the reader concatenates: those from
# them, then those to them (a fact between two of them comes twice; the reader keeps one).
# Each walks from the looked-up entities (the HINTs below): one match with ``s.uuid IN $uuids
# OR t.uuid IN $uuids`` scans every fact, and kuzu 0.11.3 crashes on a prepared UNION ALL.
FACTS_TOUCHING = (
    f"""
MATCH (s:Entity)-[r:RELATES_TO]->(t:Entity)
WHERE s.uuid IN $uuids AND r.group_id = $group_id
HINT (s JOIN r) JOIN t
{_FACT_RETURN}
""",
    f"""
MATCH (s:Entity)-[r:RELATES_TO]->(t:Entity)
WHERE t.uuid IN $uuids AND r.group_id = $group_id
HINT (t JOIN r) JOIN s
{_FACT_RETURN}
""",
)
# One statement per subject (a primary-key lookup, then its adjacency): kuzu plans an
# UNWIND-driven match as a scan of every fact. The HINT keeps kuzu walking from the looked-up
# node: with a filter on the relationship it otherwise joins against a scan of Entity (at
# 6,000 records 2.5 ms a statement instead of 0.9, growing with the table).
FROM_SOURCE = "HINT (s JOIN r) JOIN t"
FROM_TARGET = "HINT (t JOIN r) JOIN s"
# The same for the two halves of an as-of question about one entity (asof_cypher.as_of_query).
ANCHOR_HINTS = {"s": ("", FROM_SOURCE), "t": ("", FROM_TARGET)}
# What ``query_facts`` returns of each fact the as-of filter lets through.
FACT_VIEW_RETURN = f"{_FACT_RETURN}, s.name AS subject, t.name AS object"

# The stored facts a new episode's facts can merge with or close, by kind of read.
FACT_CANDIDATES = {
    "pair": f"""
MATCH (s:Entity {{uuid: $source}})-[r:RELATES_TO]->(t:Entity)
WHERE r.group_id = $group_id AND r.name = $relation
{FROM_SOURCE}
{_FACT_RETURN}
""",
    "from": f"""
MATCH (s:Entity {{uuid: $uuid}})-[r:RELATES_TO]->(t:Entity)
WHERE r.group_id = $group_id
{FROM_SOURCE}
{_FACT_RETURN}
""",
    "to": f"""
MATCH (s:Entity)-[r:RELATES_TO]->(t:Entity {{uuid: $uuid}})
WHERE r.group_id = $group_id
{FROM_TARGET}
{_FACT_RETURN}
""",
}
# The lookup's facts: a found entity's facts of the episode's relations.
FACTS_OF_SOURCE = f"""
MATCH (s:Entity {{uuid: $uuid}})-[r:RELATES_TO]->(t:Entity)
WHERE r.group_id = $group_id AND r.name IN $relations
{FROM_SOURCE}
{_FACT_RETURN}
"""
# A fact by uuid, from its FactIndex row's source.
# The facts of $uuids, given their subjects ($sources), in one statement walking from them.
FACTS_FROM_SOURCES = f"""
MATCH (s:Entity)-[r:RELATES_TO]->(t:Entity)
WHERE s.uuid IN $sources AND r.uuid IN $uuids AND r.group_id = $group_id
{FROM_SOURCE}
{_FACT_RETURN}
"""
# ----------------------------------------------------------------------------- maintenance
COUNTS = (
    "MATCH (ep:Episodic) WHERE ep.group_id = $group_id RETURN count(ep) AS episodes",
    "MATCH (e:Entity) WHERE e.group_id = $group_id RETURN count(e) AS entities",
    "MATCH ()-[r:RELATES_TO]->() WHERE r.group_id = $group_id RETURN count(r) AS facts",
    "MATCH (ep:Episodic)-[m:MENTIONS]->() WHERE ep.group_id = $group_id "
    "RETURN count(m) AS mentions",
)
# One batch per call, per table; repeated until 0.
DELETE_GROUP = tuple(
    f"""
MATCH (n:{table})
WHERE n.group_id = $group_id
WITH n LIMIT $batch
DETACH DELETE n
RETURN count(*) AS deleted
"""
    for table in ("Episodic", "Community", "Entity", "FactIndex", "EntityLookupKey", *VECTOR_TABLES)
)

# ----------------------------------------------------------------------------- communities
# Community rows are created one statement per row (see kuzu_store's docstring); the
# searchable copy of the name embedding is the CommunityVector row ``vector_id``.
_CREATE_COMMUNITY = """
CREATE (c:Community {{uuid: $uuid, group_id: $group_id, name: $name, summary: $summary,
                      created_at: $created_at{embedding}}})
"""
CREATE_COMMUNITY = _CREATE_COMMUNITY.format(embedding="")
CREATE_COMMUNITY_EMBEDDED = _CREATE_COMMUNITY.format(
    embedding=", name_embedding: $name_embedding, vector_id: $vector_id"
)
_UPDATE_COMMUNITY = """
MATCH (c:Community) WHERE c.uuid = $uuid
SET c.name = $name, c.summary = $summary{embedding}
"""
UPDATE_COMMUNITY = _UPDATE_COMMUNITY.format(embedding="")
UPDATE_COMMUNITY_EMBEDDED = _UPDATE_COMMUNITY.format(
    embedding=", c.name_embedding = $name_embedding, c.vector_id = $vector_id"
)
COMMUNITY_VECTOR_ID = "MATCH (c:Community {uuid: $uuid}) RETURN c.vector_id AS vector_id"
# The searchable embeddings of communities a write deleted.
DROP_COMMUNITY_VECTORS = """
MATCH (v:CommunityVector) WHERE v.group_id = $group_id AND v.community_uuid IN $uuids
DELETE v
"""
