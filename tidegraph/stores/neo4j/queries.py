"""The Neo4j store's queries: the schema, and the reads by uuid, key, name and relation
(the write statements are in ``tidegraph.stores.neo4j.write_queries``, the community and
status reads in ``tidegraph.stores.neo4j.common_queries``, the search statements in
``tidegraph.stores.neo4j.search_queries``, the as-of filter in ``tidegraph.stores.neo4j.asof``).

Every query is fully parameterised: user and LLM text (names, summaries, facts, relation
types, group ids, search text) only ever travels as a parameter. What is formatted into the
text is our own constants (index names, field lists).

Reads answer with the column names ``tidegraph.stores.neo4j.core`` reads: an entity is ``e`` (a
property map) with ``community_uuid``; a fact ``r`` with ``source_uuid`` and ``target_uuid``;
an episode ``ep``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidegraph.records.conversation import CONTEXT_TURNS, CONTEXT_WITHIN

# Kept plans (``plans``) and the write statements, under the names the store reads them by.
from tidegraph.stores.neo4j.plans import KEEP_PLAN as KEEP_PLAN
from tidegraph.stores.neo4j.plans import kept_plan as kept_plan
from tidegraph.stores.neo4j.write_queries import ASSIGN_MEMBERS as ASSIGN_MEMBERS
from tidegraph.stores.neo4j.write_queries import EPISODE_TIME_FIELDS as EPISODE_TIME_FIELDS
from tidegraph.stores.neo4j.write_queries import FACT_ENDS_FIELD as FACT_ENDS_FIELD
from tidegraph.stores.neo4j.write_queries import FACT_TIME_FIELDS as FACT_TIME_FIELDS
from tidegraph.stores.neo4j.write_queries import RECORD_CHANGES as RECORD_CHANGES
from tidegraph.stores.neo4j.write_queries import UPSERT_COMMUNITIES as UPSERT_COMMUNITIES
from tidegraph.stores.neo4j.write_queries import UPSERT_ENTITIES as UPSERT_ENTITIES
from tidegraph.stores.neo4j.write_queries import WRITE_EPISODES as WRITE_EPISODES
from tidegraph.stores.neo4j.write_queries import WRITE_STATES as WRITE_STATES
from tidegraph.stores.neo4j.write_queries import alias_probe as alias_probe
from tidegraph.stores.neo4j.write_queries import at as at
from tidegraph.stores.neo4j.write_queries import ats as ats
from tidegraph.stores.neo4j.write_queries import set_alias_key as set_alias_key
from tidegraph.stores.neo4j.write_queries import (
    set_episode_time_words as set_episode_time_words,
)
from tidegraph.stores.neo4j.write_queries import set_fact_end_words as set_fact_end_words
from tidegraph.stores.neo4j.write_queries import set_fact_time_words as set_fact_time_words
from tidegraph.stores.neo4j.write_queries import thread_context as thread_context
from tidegraph.stores.rows import ENTITY_FIELDS, FACT_FIELDS

# The fields of the episode index, in the order episode_search.lucene_episode_query takes them.
EPISODE_INDEX_FIELDS = ("index_body", "index_speaker", "index_context", "index_when", "index_ids")

ENTITY_VECTOR_INDEX = "entity_name_embedding"
FACT_VECTOR_INDEX = "relates_to_fact_embedding"
EPISODE_VECTOR_INDEX = "episodic_content_embedding"
COMMUNITY_VECTOR_INDEX = "community_name_embedding"
# The fulltext indexes hold a record's identifier words beside its text (``index_ids``,
# docs/retrieval.md "Identifiers"), a fact's validity words (``FACT_TIME_FIELDS``, "Validity
# in the fulltext index") and its ends' words (``FACT_ENDS_FIELD``), an episode's times stored
# and said (``EPISODE_TIME_FIELDS``); older stores' indexes without them are dropped by setup.
ENTITY_FULLTEXT_INDEX = "entity_search"
FACT_FULLTEXT_INDEX = "relates_to_search_ends"
EPISODE_FULLTEXT_INDEX = "episodic_search_times"
COMMUNITY_FULLTEXT_INDEX = "community_name_summary"
VECTOR_INDEXES = (
    ENTITY_VECTOR_INDEX,
    FACT_VECTOR_INDEX,
    EPISODE_VECTOR_INDEX,
    COMMUNITY_VECTOR_INDEX,
)
CHANGE_INDEX = "change_group_last"
OLD_CHANGE_INDEX = "change_group_seq"
CHANGE_RECORD_GROUP_INDEX = "change_record_group"
CREATE_CHANGE_RECORD_GROUP_INDEX = (
    f"CREATE INDEX {CHANGE_RECORD_GROUP_INDEX} IF NOT EXISTS FOR (n:ChangeRecord) ON (n.group_id)"
)
FULLTEXT_ANALYZER = "english"  # Porter stemming + English stop words

_FULLTEXT_OPTIONS = "OPTIONS {indexConfig: {`fulltext.analyzer`: $analyzer}}"
_VECTOR_OPTIONS = (
    "OPTIONS {indexConfig: {`vector.dimensions`: $dim, `vector.similarity_function`: 'cosine'}}"
)

# Each statement runs alone (schema changes cannot share a transaction with anything else).
SCHEMA = (
    # uniqueness (IS KEY is Enterprise-only); relationship uniqueness works in Community 5.26
    "CREATE CONSTRAINT episodic_uuid IF NOT EXISTS FOR (n:Episodic) REQUIRE n.uuid IS UNIQUE",
    "CREATE CONSTRAINT entity_uuid IF NOT EXISTS FOR (n:Entity) REQUIRE n.uuid IS UNIQUE",
    "CREATE CONSTRAINT community_uuid IF NOT EXISTS FOR (n:Community) REQUIRE n.uuid IS UNIQUE",
    "CREATE CONSTRAINT relates_to_uuid IF NOT EXISTS "
    "FOR ()-[r:RELATES_TO]-() REQUIRE r.uuid IS UNIQUE",
    # the change stream's outbox: one log per group (its last seq, the group's write
    # version), the relay's cursor per group (what is published), a Change node per write
    # by (group, last): its changes are numbered seq to last
    "CREATE CONSTRAINT change_log_group IF NOT EXISTS "
    "FOR (n:ChangeLog) REQUIRE n.group_id IS UNIQUE",
    "CREATE CONSTRAINT change_cursor_group IF NOT EXISTS "
    "FOR (n:ChangeCursor) REQUIRE n.group_id IS UNIQUE",
    f"CREATE INDEX {CHANGE_INDEX} IF NOT EXISTS FOR (n:Change) ON (n.group_id, n.last)",
    # each record's Change nodes: a ChangeRecord {group_id, uuid, last} per record a Change
    # holds changes of, so that a forget reads only the nodes of what it purges (its group
    # index, CHANGE_RECORD_GROUP_INDEX, is created once the stored nodes are indexed)
    "CREATE INDEX change_record_uuid IF NOT EXISTS FOR (n:ChangeRecord) ON (n.uuid)",
    # and by row: a row's entries hold its changes' bodies by record (``rows.by_record``)
    "CREATE INDEX change_record_row IF NOT EXISTS FOR (n:ChangeRecord) ON (n.group_id, n.last)",
    # range
    "CREATE INDEX episodic_group_id IF NOT EXISTS FOR (n:Episodic) ON (n.group_id)",
    # a message's thread around it (thread_context)
    "CREATE INDEX episodic_group_valid_at IF NOT EXISTS "
    "FOR (n:Episodic) ON (n.group_id, n.valid_at)",
    # the words of each group's speakers' names (docs/retrieval.md "Conversation-aware episode
    # search")
    "CREATE CONSTRAINT speaker_word_group_word IF NOT EXISTS "
    "FOR (n:SpeakerWord) REQUIRE (n.group_id, n.word) IS UNIQUE",
    # the few episodes stored without extraction (docs/architecture.md "Episodes without an LLM")
    "CREATE INDEX episodic_not_extracted IF NOT EXISTS FOR (n:Episodic) ON (n.not_extracted)",
    "CREATE INDEX entity_group_id IF NOT EXISTS FOR (n:Entity) ON (n.group_id)",
    # a name looked up within its group: the normalised name, and the aliases as one string
    # (``write_queries.set_alias_key``: no index covers a list's members)
    "CREATE INDEX entity_group_name_norm IF NOT EXISTS FOR (n:Entity) ON (n.group_id, n.name_norm)",
    "CREATE TEXT INDEX entity_alias_key IF NOT EXISTS FOR (n:Entity) ON (n.alias_key)",
    # a stable key is looked up within its group (the same CRM ids recur in every tenant)
    "CREATE INDEX entity_group_key IF NOT EXISTS FOR (n:Entity) ON (n.group_id, n.key)",
    "CREATE INDEX community_group_id IF NOT EXISTS FOR (n:Community) ON (n.group_id)",
    "CREATE INDEX relates_to_group_id IF NOT EXISTS FOR ()-[r:RELATES_TO]-() ON (r.group_id)",
    "CREATE INDEX relates_to_created_at IF NOT EXISTS FOR ()-[r:RELATES_TO]-() ON (r.created_at)",
    # fulltext
    f"CREATE FULLTEXT INDEX {ENTITY_FULLTEXT_INDEX} IF NOT EXISTS "
    "FOR (n:Entity) ON EACH [n.name, n.summary, n.index_ids] " + _FULLTEXT_OPTIONS,
    f"CREATE FULLTEXT INDEX {FACT_FULLTEXT_INDEX} IF NOT EXISTS "
    "FOR ()-[r:RELATES_TO]-() ON EACH ["
    + ", ".join(f"r.{field}" for field in ("fact", "index_ids", *FACT_TIME_FIELDS, FACT_ENDS_FIELD))
    + "] "
    + _FULLTEXT_OPTIONS,
    # an episode's conversation fields (tidegraph/records/conversation.py), not its content
    f"CREATE FULLTEXT INDEX {EPISODE_FULLTEXT_INDEX} IF NOT EXISTS FOR (n:Episodic) ON EACH "
    "["
    + ", ".join(f"n.{field}" for field in (*EPISODE_INDEX_FIELDS, *EPISODE_TIME_FIELDS))
    + "] "
    + _FULLTEXT_OPTIONS,
    "CREATE FULLTEXT INDEX community_name_summary IF NOT EXISTS "
    "FOR (n:Community) ON EACH [n.name, n.summary] " + _FULLTEXT_OPTIONS,
    # vector (HNSW)
    "CREATE VECTOR INDEX entity_name_embedding IF NOT EXISTS "
    "FOR (n:Entity) ON n.name_embedding " + _VECTOR_OPTIONS,
    "CREATE VECTOR INDEX relates_to_fact_embedding IF NOT EXISTS "
    "FOR ()-[r:RELATES_TO]-() ON r.fact_embedding " + _VECTOR_OPTIONS,
    "CREATE VECTOR INDEX episodic_content_embedding IF NOT EXISTS "
    "FOR (n:Episodic) ON n.content_embedding " + _VECTOR_OPTIONS,
    "CREATE VECTOR INDEX community_name_embedding IF NOT EXISTS "
    "FOR (n:Community) ON n.name_embedding " + _VECTOR_OPTIONS,
)
# Indexes older stores made that nothing reads any more (community_name: name only; search
# reads community_name_summary). Dropped by setup.
# episodic_content: an episode's content alone, before the conversation fields (migrated at setup:
# EPISODES_TO_INDEX, THREADS_TO_INDEX).
# entity_name_summary, relates_to_fact, episodic_search: without the identifier words (migrated
# at setup: FACTS_TO_INDEX, ENTITIES_TO_INDEX, EPISODES_TO_INDEX).
# relates_to_search: without the validity words (migrated at setup: FACT_TIMES_TO_INDEX).
# episodic_search_ids: without the validity words (migrated at setup: EPISODE_TIMES_TO_INDEX).
# relates_to_search_times: without the end words (migrated at setup: FACT_ENDS_TO_INDEX).
# change_group_seq, change_uuid: the outbox's indexes when a Change node was one change
# (numbered at setup: CHANGES_TO_NUMBER).
DROPPED = (
    f"DROP INDEX {OLD_CHANGE_INDEX} IF EXISTS",
    "DROP INDEX change_uuid IF EXISTS",
    "DROP INDEX community_name IF EXISTS",
    "DROP INDEX episodic_content IF EXISTS",
    "DROP INDEX entity_name_summary IF EXISTS",
    "DROP INDEX relates_to_fact IF EXISTS",
    "DROP INDEX episodic_search IF EXISTS",
    "DROP INDEX relates_to_search IF EXISTS",
    "DROP INDEX episodic_search_ids IF EXISTS",
    "DROP INDEX relates_to_search_times IF EXISTS",
    # a name or a key is looked up within its group (entity_group_name_norm, entity_group_key)
    "DROP INDEX entity_name_norm IF EXISTS",
    "DROP INDEX entity_key IF EXISTS",
    # never read (``SHOW INDEXES YIELD readCount``, over the whole suite and the benchmarks:
    # every statement seeks its group first), and each a write of every episode, mention or fact
    "DROP INDEX episodic_valid_at IF EXISTS",
    "DROP INDEX mentions_group_id IF EXISTS",
    "DROP INDEX has_member_group_id IF EXISTS",
    "DROP INDEX relates_to_valid_at IF EXISTS",
    "DROP INDEX relates_to_invalid_at IF EXISTS",
    "DROP INDEX relates_to_expired_at IF EXISTS",
)


def thread_params() -> dict[str, int]:
    """The bounds of a message's context (tidegraph/records/conversation.py), as the
    statements that set it (``thread_context``) take them."""
    return {
        "context_turns": CONTEXT_TURNS,
        "context_seconds": int(CONTEXT_WITHIN.total_seconds()),
    }


# Which of $words are words of the group's speakers' names.
SPEAKER_WORDS = """
UNWIND $words AS word
MATCH (s:SpeakerWord {group_id: $group_id, word: word})
RETURN s.word AS word
"""

SHOW_VECTOR_INDEXES = """
SHOW VECTOR INDEXES YIELD name, options
WHERE name IN $names
RETURN name, options.indexConfig.`vector.dimensions` AS dim
"""

SHOW_INDEXES = "SHOW INDEXES YIELD name WHERE name IN $names RETURN name"

AWAIT_INDEXES = "CALL db.awaitIndexes($timeout)"

# ---- episodes
# Lookups by uuid name the uniqueness constraint's index: without the hint the planner may
# pick the group_id index and filter every episode (entity, fact) of the group instead.
# No hint here: clients (`ingest --via kafka`, `dlq replay`) ask before any worker may have
# created the schema, and a hint on a missing index is an error; the planner picks the unique
# index seek for this shape by itself (checked with EXPLAIN).
EPISODE_PROCESSED = """
MATCH (ep:Episodic {uuid: $uuid})
WHERE ep.group_id = $group_id AND ep.not_extracted IS NULL
RETURN ep.content_hash AS content_hash, ep.created_entities AS created_entities
"""

# The text write path's statements keep their plan (``plans.kept_plan``), as below.
EPISODES_PROCESSED = kept_plan(
    """
UNWIND $uuids AS uuid
MATCH (ep:Episodic {uuid: uuid})
USING INDEX ep:Episodic(uuid)
WHERE ep.group_id = $group_id AND ep.not_extracted IS NULL
RETURN ep.uuid AS uuid, ep.content_hash AS content_hash, ep.created_entities AS created_entities
"""
)

PENDING_EPISODES = """
MATCH (ep:Episodic)
WHERE ep.group_id = $group_id AND ep.not_extracted IS NOT NULL
RETURN ep {.*} AS ep
ORDER BY ep.valid_at, ep.producer_id
LIMIT $limit
"""

RECENT_EPISODES = """
MATCH (ep:Episodic)
WHERE ep.group_id = $group_id AND ep.valid_at < $before
RETURN ep {.*} AS ep
ORDER BY ep.valid_at DESC, ep.uuid DESC
LIMIT $limit
"""

# RECENT_EPISODES for several times at once, in the order of $befores.
RECENT_EPISODES_BEFORE = kept_plan(
    """
UNWIND range(0, size($befores) - 1) AS i
CALL (i) {
  MATCH (ep:Episodic)
  USING INDEX ep:Episodic(group_id, valid_at)
  WHERE ep.group_id = $group_id AND ep.valid_at < $befores[i]
  WITH ep ORDER BY ep.valid_at DESC, ep.uuid DESC LIMIT $limit
  RETURN collect(ep {.*}) AS eps
}
RETURN i, eps
ORDER BY i
"""
)

PRODUCER_IDS = """
MATCH (ep:Episodic)
WHERE ep.uuid IN $uuids AND ep.group_id = $group_id
RETURN ep.uuid AS uuid, ep.producer_id AS producer_id
"""


def epoch_micros(expression: str) -> str:
    """Cypher for a datetime as microseconds since the epoch (null stays null): the driver
    turns an int into Python far faster than a DateTime, and ``rows.to_utc`` reads it back."""
    return f"{expression}.epochSeconds * 1000000 + {expression}.microsecond"


def times_as_micros(variable: str, fields: tuple[str, ...]) -> str:
    return ", ".join(f"{name}: {epoch_micros(f'{variable}.{name}')}" for name in fields)


FACT_MICROS_FIELDS = ("valid_at", "invalid_at", "created_at", "expired_at")
FACT_TIMES = times_as_micros("r", FACT_MICROS_FIELDS)


def stored(
    variable: str,
    fields: Sequence[str],
    *,
    without: Sequence[str] = (),
    micros: Sequence[str] = (),
    **given: str,
) -> str:
    """The map projection of a record read from ``variable``: its ``fields`` by name (but
    those ``without`` names), those in ``micros`` as epoch microseconds (``epoch_micros``),
    then ``given`` (field: Cypher expression) in place of what is stored. Never ``variable
    {.*}``: that also loads the search indexes' helper properties (``index_*``) and the
    embedding even when the projection then overrides it with null: twice the server's time
    of reading many facts (docs/performance.md "Where the CPU goes at the paced rate")."""
    parts = [
        f"{name}: {epoch_micros(f'{variable}.{name}')}" if name in micros else f".{name}"
        for name in fields
        if name not in without and name not in given
    ]
    parts += [f"{name}: {expression}" for name, expression in given.items()]
    return f"{variable} {{{', '.join(parts)}}}"


# A unit's or a resolution's read: the entity without its name embedding, the facts without
# theirs (the batch view reads those when a step asks), each fact with its target.
_LOOKUP_ENTITY = stored("e", ENTITY_FIELDS, without=("name_embedding",), micros=("created_at",))
_LOOKUP_FACT = stored(
    "r", FACT_FIELDS, without=("fact_embedding",), micros=FACT_MICROS_FIELDS, target_uuid="t.uuid"
)


# ---- entities
COMMUNITY_OF_E = """COLLECT {
  MATCH (c:Community)-[:HAS_MEMBER]->(e) WHERE c.group_id = $group_id
  RETURN c.uuid ORDER BY c.uuid LIMIT 1
}[0]"""

# The entity projection every entity read ends with.
_ENTITY_RETURN = f"""
RETURN {stored("e", ENTITY_FIELDS)} AS e,
       {COMMUNITY_OF_E} AS community_uuid
"""

ENTITY_GROUPS = """
MATCH (e:Entity)
WHERE e.uuid IN $uuids
RETURN e.uuid AS uuid, e.group_id AS group_id
"""


def named_branches(group: str, names: str, first: str = "") -> str:
    """Two UNION ALL branches returning ``e, 'name' AS how``: the entities of ``group`` whose
    normalised name is in ``names``, then those with an alias in it, each branch after
    ``first``. Both seek an index per name: the group's names (``entity_group_name_norm``) and
    the aliases' key (``entity_alias_key``, a TEXT index; the list itself decides). A name
    lookup that tested every entity of the group grew with the tenant (docs/performance.md,
    "What bounds the paced p99 on two cores"). An entity may come from both: collect the hows
    DISTINCT."""
    return f"""{first}
  UNWIND {names} AS name
  MATCH (e:Entity)
  USING INDEX e:Entity(group_id, name_norm)
  WHERE e.group_id = {group} AND e.name_norm = name
  RETURN e, 'name' AS how
  UNION ALL{first}
  UNWIND {names} AS name
  MATCH (e:Entity)
  USING TEXT INDEX e:Entity(alias_key)
  WHERE e.alias_key CONTAINS {alias_probe(group, "name")}
    AND e.group_id = {group} AND name IN e.aliases
  RETURN e, 'name' AS how
"""


_ENTITIES_KEYED = """
MATCH (e:Entity)
USING INDEX e:Entity(group_id, key)
WHERE e.group_id = $group_id AND e.key IN $keys
"""

ENTITIES_BY_NAMES = kept_plan(
    "\nCALL () {" + named_branches("$group_id", "$names") + "}\nWITH DISTINCT e" + _ENTITY_RETURN
)

ENTITIES_BY_KEYS = kept_plan(_ENTITIES_KEYED + _ENTITY_RETURN)

ENTITIES_BY_KEY_PREFIX = (
    """
MATCH (e:Entity)
USING INDEX e:Entity(group_id, key)
WHERE e.group_id = $group_id AND e.key STARTS WITH $prefix
"""
    + _ENTITY_RETURN
)


# Everything resolution needs in one round trip: whether the episode is already processed
# (then nothing else is read), the entities matching the drafts' keys or names (without their
# name embeddings and communities, which resolution does not use) and, of each, the stored facts
# it is the source of with a relation in $relations (without their embeddings). One row per
# entity found (``hows``: by key, by name or both), or a single row with a null entity.
RESOLUTION_LOOKUP = (
    """
OPTIONAL MATCH (ep:Episodic {uuid: $episode_uuid})
USING INDEX ep:Episodic(uuid)
WHERE ep.group_id = $group_id
WITH ep IS NOT NULL AND ep.not_extracted IS NULL AS processed, ep.content_hash AS stored_hash,
     ep.created_entities AS created_entities
OPTIONAL CALL (processed) {
  WITH processed WHERE NOT processed"""
    + _ENTITIES_KEYED
    + """  RETURN e, 'key' AS how
  UNION ALL"""
    + named_branches("$group_id", "$names", "\n  WITH processed WHERE NOT processed")
    + """}
WITH processed, stored_hash, created_entities, e, collect(DISTINCT how) AS hows
RETURN processed, stored_hash, created_entities, hows,
       """
    + _LOOKUP_ENTITY
    + """ AS e,
       COLLECT {
         MATCH (e)-[r:RELATES_TO]->(t:Entity)
         WHERE r.group_id = $group_id AND r.name IN $relations
         RETURN """
    + _LOOKUP_FACT
    + """
       } AS facts
"""
)

# What the batches of several groups read before they are processed, in one round trip
# (``Neo4jStore.read_batch``): per ask (``ask.i``, its group, keys, names, relations and
# episodes), the processed markers of its episodes and the entities its keys and names find
# (``hows``: by key, by name or both), each once with its facts of the ask's relations (not
# those that ended before ``ask.facts_from``: ``FactRecord.ended_before``). Its
# plan is kept: the names through the group's index, and an entity's facts by expanding from
# it (their relations filtered after the expansion: with the filter on the pattern, a plan
# made on an empty store sought the group's every fact through its index for each entity).
READ_BATCHES = kept_plan(
    """
UNWIND $asks AS ask
CALL (ask) {
  UNWIND ask.episodes AS uuid
  MATCH (ep:Episodic {uuid: uuid})
  USING INDEX ep:Episodic(uuid)
  WHERE ep.group_id = ask.group_id AND ep.not_extracted IS NULL
  RETURN collect([ep.uuid, ep.content_hash, ep.created_entities]) AS markers
}
CALL (ask) {
  CALL (ask) {
    MATCH (e:Entity)
    USING INDEX e:Entity(group_id, key)
    WHERE e.group_id = ask.group_id AND e.key IN ask.keys
    RETURN e, 'key' AS how
    UNION ALL"""
    + named_branches("ask.group_id", "ask.names")
    + """  }
  WITH e, collect(DISTINCT how) AS hows
  RETURN collect({
    hows: hows,
    e: """
    + _LOOKUP_ENTITY
    + """,
    facts: COLLECT {
      UNWIND [(e)-[r:RELATES_TO]->(t:Entity) | [r, t]] AS fact
      WITH fact[0] AS r, fact[1] AS t
      WHERE r.group_id = ask.group_id AND r.name IN ask.relations
        AND (ask.facts_from IS NULL OR r.invalid_at IS NULL OR r.invalid_at >= ask.facts_from)
      RETURN """
    + _LOOKUP_FACT
    + """
    }
  }) AS found
}
RETURN ask.i AS i, markers, found
"""
)

# The community of each of the group's entities among $uuids (``communities_of``).
# The community assignment's read (per batch of new entities): keeps its plan (``plans``).
COMMUNITIES_OF = kept_plan(
    f"""
UNWIND $uuids AS uuid
MATCH (e:Entity {{uuid: uuid}})
USING INDEX e:Entity(uuid)
WHERE e.group_id = $group_id
RETURN e.uuid AS uuid, {COMMUNITY_OF_E} AS community_uuid
"""
)

ENTITIES_BY_UUIDS = kept_plan(
    """
MATCH (e:Entity)
USING INDEX e:Entity(uuid)
WHERE e.uuid IN $uuids AND e.group_id = $group_id
"""
    + _ENTITY_RETURN
)

LIST_ENTITIES = (
    """
MATCH (e:Entity)
WHERE e.group_id = $group_id
"""
    + _ENTITY_RETURN
)


FULLTEXT_ENTITIES = (
    f"""
CALL db.index.fulltext.queryNodes('{ENTITY_FULLTEXT_INDEX}', $query) YIELD node, score
WITH node AS e, score
WHERE e.group_id = $group_id
ORDER BY score DESC, e.uuid
LIMIT $limit
WITH e, score
"""
    + _ENTITY_RETURN
    + ", score"
)

# Entity resolution's candidate searches for several drafts of one group in one round trip
# (``Neo4jStore.entity_candidates``): when the group holds fewer than $scan_below name
# embeddings (``small``), each draft's best $limit by exact cosine over them (the
# small-group scan of ``tidegraph.stores.neo4j.search.Neo4jSearch._nearest``) and, when it
# has a fulltext query, its best $limit of FULLTEXT_ENTITIES; [uuid, score] pairs, one row
# per draft (``i``).
ENTITY_CANDIDATES = kept_plan(
    f"""
CALL () {{
  MATCH (x:Entity)
  USING INDEX x:Entity(group_id)
  WHERE x.group_id = $group_id AND x.name_embedding IS NOT NULL
  RETURN x LIMIT $scan_below
}}
WITH collect(x) AS xs
WITH xs, size(xs) < $scan_below AS small
UNWIND range(0, size($drafts) - 1) AS i
WITH xs, small, i, $drafts[i] AS draft
CALL (xs, small, draft) {{
  WITH xs, draft WHERE small
  UNWIND xs AS x
  WITH x, vector.similarity.cosine(x.name_embedding, draft.embedding) AS score
  ORDER BY score DESC, x.uuid
  LIMIT $limit
  RETURN collect([x.uuid, score]) AS vector_hits
}}
CALL (draft) {{
  WITH draft WHERE draft.query IS NOT NULL
  CALL db.index.fulltext.queryNodes('{ENTITY_FULLTEXT_INDEX}', draft.query) YIELD node, score
  WITH node AS e, score
  WHERE e.group_id = $group_id
  ORDER BY score DESC, e.uuid
  LIMIT $limit
  RETURN collect([e.uuid, score]) AS fulltext_hits
}}
CALL (vector_hits, fulltext_hits) {{
  UNWIND [h IN vector_hits | h[0]] + [h IN fulltext_hits | h[0]] AS u
  WITH DISTINCT u
  MATCH (e:Entity {{uuid: u}})
  USING INDEX e:Entity(uuid)
  WHERE e.group_id = $group_id
  RETURN collect({{e: {stored("e", ENTITY_FIELDS)}, community_uuid: {COMMUNITY_OF_E}}}) AS records
}}
RETURN i, small, vector_hits, fulltext_hits, records
"""
)

# ---- facts
_FACT_RETURN = f"""
RETURN {stored("r", FACT_FIELDS)} AS r, s.uuid AS source_uuid, t.uuid AS target_uuid
"""
FACTS_TOUCHING = (  # one statement
    (
        """
UNWIND $uuids AS uuid
MATCH (e:Entity {uuid: uuid})-[r:RELATES_TO]-()
USING INDEX e:Entity(uuid)
WHERE e.group_id = $group_id AND r.group_id = $group_id
WITH DISTINCT r
MATCH (s:Entity)-[r]->(t:Entity)
"""
        + _FACT_RETURN
    ),
)

# The stored facts a new episode's facts can merge with or close: those of each
# (subject, relation) in $pairs, and every fact touching an entity of $ends.
_FACT_CANDIDATES = """
CALL () {
  UNWIND $pairs AS pair
  MATCH (s:Entity {uuid: pair.source})-[r:RELATES_TO]->(:Entity)
  USING INDEX s:Entity(uuid)
  WHERE s.group_id = $group_id AND r.group_id = $group_id AND r.name = pair.relation
  RETURN r
  UNION
  UNWIND $ends AS uuid
  MATCH (e:Entity {uuid: uuid})-[r:RELATES_TO]-(:Entity)
  USING INDEX e:Entity(uuid)
  WHERE e.group_id = $group_id AND r.group_id = $group_id
  RETURN r
}
MATCH (s:Entity)-[r]->(t:Entity)
"""
# (times as epoch microseconds: see epoch_micros)
FACT_CANDIDATES = kept_plan(
    _FACT_CANDIDATES
    + f"RETURN {stored('r', FACT_FIELDS, micros=FACT_MICROS_FIELDS)} AS r, "
    + "s.uuid AS source_uuid, t.uuid AS target_uuid\n"
)
FACT_CANDIDATES_PLAIN = kept_plan(
    _FACT_CANDIDATES
    + f"RETURN {stored('r', FACT_FIELDS, without=('fact_embedding',), micros=FACT_MICROS_FIELDS)} "
    + "AS r, s.uuid AS source_uuid, t.uuid AS target_uuid\n"
)

FACTS_BY_UUIDS = (
    """
MATCH (s:Entity)-[r:RELATES_TO]->(t:Entity)
WHERE r.uuid IN $uuids AND r.group_id = $group_id
"""
    + _FACT_RETURN
)

# ---- as-of questions (tidegraph.stores.neo4j.asof)
# The walk from the anchor node of a question about one entity.
ANCHOR_HINTS = {
    "s": ("USING INDEX s:Entity(uuid)", ""),
    "t": ("USING INDEX t:Entity(uuid)", ""),
}
# What ``query_facts`` returns of each fact the as-of filter lets through.
FACT_VIEW_RETURN = (
    f"RETURN {stored('r', FACT_FIELDS)} AS r, s.uuid AS source_uuid, t.uuid AS target_uuid, "
    "s.name AS subject, t.name AS object"
)

# ---- maintenance
COUNTS = (
    """
CALL () {
  MATCH (ep:Episodic) WHERE ep.group_id = $group_id AND ep.forgotten_at IS NULL
  RETURN count(ep) AS episodes
}
CALL () { MATCH (e:Entity) WHERE e.group_id = $group_id RETURN count(e) AS entities }
CALL () {
  MATCH ()-[r:RELATES_TO]->() WHERE r.group_id = $group_id RETURN count(r) AS facts
}
CALL () {
  MATCH (ep:Episodic)-[m:MENTIONS]->() WHERE ep.group_id = $group_id RETURN count(m) AS mentions
}
RETURN episodes, entities, facts, mentions
""",
)

# Outbox rows deleted per transaction (a whole group, retention): a row holds a whole write's
# changes, and Neo4j keeps a deleted node's properties in the transaction's memory
# (``dbms.memory.transaction.total.max``), so these go in smaller batches than other nodes.
OUTBOX_ROW_BATCH = 100


def batch_limit(label: str) -> str:
    """The parameter that bounds one batch of deleted ``label`` nodes."""
    return "$row_batch" if label == "Change" else "$batch"


# One batch per call, per label (the group_id index is per label); repeated until 0.
DELETE_GROUP = (
    # Facts first, in batches of their own: deleting a well-connected entity would otherwise
    # delete all its facts (with their embeddings) in one transaction.
    """
MATCH (s:Entity)-[r:RELATES_TO]->()
WHERE s.group_id = $group_id
WITH r LIMIT $batch
DELETE r
RETURN count(*) AS deleted
""",
    *(
        f"""
MATCH (n:{label})
WHERE n.group_id = $group_id
WITH n LIMIT {batch_limit(label)}
DETACH DELETE n
RETURN count(*) AS deleted
"""
        for label in (
            "Episodic",
            "Community",
            "Entity",
            "Change",
            "ChangeRecord",
            "ChangeLog",
            "ChangeCursor",
            "SpeakerWord",
        )  # fmt: skip
    ),
)
