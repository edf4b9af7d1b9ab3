"""The Neo4j store's write statements: entity upserts, an episode's write (its marker, its
thread's context, mentions, facts, closures and changes), community upserts and memberships.

What a write does to a stored entity, fact or episode is not written here: the ON CREATE and
SET assignments are built from the write rules' tables (``tidegraph.stores.write_rules``,
``create_clause`` and ``set_clause``), field names from the tables only. What is written by
hand is what the rules do not cover: the MERGE patterns (a record's key), and the derived
search fields (``name_norm``, ``index_ids``, ``alias_key``, an episode's ``index_*``, a fact's
validity words ``set_fact_time_words``).

Like every statement of the store, fully parameterised: user and LLM text only ever travels
as a parameter.
"""

from __future__ import annotations

from collections.abc import Callable

from tidegraph.records.times import (
    TIME_DIGITS,
    TIME_WORD_LEVELS,
    WORDS_ORIGIN,
    WORDS_ORIGIN_EPOCH_SECONDS,
    time_words,
)
from tidegraph.stores.neo4j.plans import kept_plan
from tidegraph.stores.rows import TIME_FIELDS, TIME_LIST_FIELDS
from tidegraph.stores.write_rules import (
    CLOSURE,
    COMMUNITY,
    ENTITY,
    EPISODE,
    FACT,
    Rules,
    create_clause,
    set_clause,
)


def at(expression: str) -> str:
    """Cypher for a time written as an epoch pair (``rows.with_epoch_times``; null stays
    null)."""
    return (
        f"CASE WHEN {expression} IS NULL THEN null "
        f"ELSE datetime.fromepoch({expression}[0], {expression}[1]) END"
    )


def ats(expression: str) -> str:
    """Cypher for a list of times written as epoch pairs (a null list stays null)."""
    return f"[pair IN {expression} | datetime.fromepoch(pair[0], pair[1])]"


# ----------------------------------------------------------------------------- from the rules
def _written(row: str, group: str) -> Callable[[str], str]:
    """The expression of a written field: ``row``'s (a row of ``tidegraph.stores.rows``
    with its times as epoch pairs), the group from ``group``."""

    def expression(name: str) -> str:
        if name == "group_id":
            return group
        if name in TIME_FIELDS:
            return at(f"{row}.{name}")
        if name in TIME_LIST_FIELDS:
            return ats(f"{row}.{name}")
        return f"{row}.{name}"

    return expression


def _union(stored: str, written: str) -> str:
    return f"coalesce({stored}, []) + [item IN {written} WHERE NOT item IN coalesce({stored}, [])]"


def on_create(var: str, rules: Rules, row: str, group: str) -> list[str]:
    """The ON CREATE assignments of ``rules`` to the node or relationship ``var``."""
    return create_clause(rules, target=lambda n: f"{var}.{n}", written=_written(row, group))


def on_write(var: str, rules: Rules, row: str, group: str) -> list[str]:
    """The SET assignments of ``rules`` to ``var`` (on a create and on a match)."""
    return set_clause(
        rules,
        target=lambda n: f"{var}.{n}",
        stored=lambda n: f"{var}.{n}",
        written=_written(row, group),
        union=_union,
    )


def _listed(assignments: list[str], indent: str) -> str:
    return f",\n{indent}".join(assignments)


# ----------------------------------------------------------------------------- entities
def alias_probe(group: str, name: str) -> str:
    """Cypher for what ``alias_key`` holds when the entity of ``group`` has the alias ``name``.
    Normalised names never hold a newline or a tab (``ids.normalize_name`` folds whitespace)."""
    return f"('\\n' + {group} + '\\t' + {name} + '\\n')"


def set_alias_key(var: str) -> str:
    """A SET clause of the entity ``var``'s ``alias_key`` from its stored aliases (after the
    clause that writes them): each alias but its normalised name (found through the
    ``entity_group_name_norm`` index; resolution stores a new entity's name as its first
    alias) as ``alias_probe`` gives it, joined; null (no entry in the ``entity_alias_key``
    TEXT index) when it has no other. Neo4j indexes no list membership, so
    a name lookup finds an alias by ``alias_key CONTAINS alias_probe(...)`` through that index
    (``queries.named_branches``) instead of testing every entity of the group."""
    others = f"[x IN coalesce({var}.aliases, []) WHERE x <> {var}.name_norm]"
    return (
        f"SET {var}.alias_key = CASE WHEN size({others}) = 0 THEN null\n"
        f"  ELSE reduce(k = '', a IN {others} | k + '\\n' + {var}.group_id + '\\t' + a)"
        " + '\\n' END\n"
    )


def upsert_entity_rows(rows: str, group: str) -> str:
    """One MERGE per row of ``rows`` (entity rows), by ``write_rules.ENTITY``. An entity
    created without a summary stores '' (what every store reads back); its identifier words
    (``index_ids``) are the row's when its summary or key changes."""
    return f"""
UNWIND {rows} AS row
MERGE (e:Entity {{uuid: row.uuid}})
ON CREATE SET {_listed(on_create("e", ENTITY, "row", group), "              ")},
              e.name_norm = row.name_norm,
              e.summary = '',
              e.index_ids = row.index_ids
SET e.index_ids = CASE WHEN row.summary IS NULL AND (e.key IS NOT NULL OR row.key IS NULL)
                       THEN coalesce(e.index_ids, row.index_ids) ELSE row.index_ids END
SET {_listed(on_write("e", ENTITY, "row", group), "    ")}
{set_alias_key("e")}SET e:$(row.labels)
"""


UPSERT_ENTITIES = upsert_entity_rows("$rows", "$group_id")


# ----------------------------------------------------------------------------- facts
# A fact's times as words of the fact fulltext index, so that a search's Lucene query can
# require what its scope sees (``search_queries.fact_fulltext_query``; docs/retrieval.md
# "Validity in the fulltext index"): its whole seconds at every level of
# ``times.TIME_WORD_LEVELS``, which sort as the times do (``times.time_words``). The start of
# a fact with none is the earliest time's; an open end has none.
FACT_TIME_FIELDS = ("index_created_at", "index_valid_at", "index_invalid_at", "index_ended_at")


def _time_words(expression: str) -> str:
    digits = (
        f"right('{'0' * TIME_DIGITS}' + toString({expression}.epochSeconds - "
        f"({WORDS_ORIGIN_EPOCH_SECONDS})), {TIME_DIGITS})"
    )
    words = " + ' ' + ".join(f"'{letter}' + left(d, {kept})" for letter, kept in TIME_WORD_LEVELS)
    return f"CASE WHEN {expression} IS NULL THEN null ELSE [d IN [{digits}] | {words}][0] END"


def set_fact_time_words(r: str) -> str:
    """A SET clause of the fact ``r``'s validity words from its stored times (a clause of its
    own, after the one that writes the times: it reads them as written)."""
    created, valid, invalid, ended = FACT_TIME_FIELDS
    earliest = time_words(WORDS_ORIGIN)
    return (
        f"SET {r}.{created} = {_time_words(f'{r}.created_at')},\n"
        f"    {r}.{valid} = coalesce({_time_words(f'{r}.valid_at')}, '{earliest}'),\n"
        f"    {r}.{invalid} = {_time_words(f'{r}.invalid_at')},\n"
        f"    {r}.{ended} = {_time_words(f'coalesce({r}.end_learned_at, {r}.expired_at)')}\n"
    )


# A fact's ends as words of the fact fulltext index, so that the walk of a search reads the
# facts of a seed entity that its scope may see from the index
# (``search_queries.FACTS_NEAR_INDEXED``), not every fact of the entity: each end's uuid
# without its hyphens, after the letter ``e`` (``search_queries.end_word``, one token of the
# index's analyzer).
FACT_ENDS_FIELD = "index_ends"


def _end_word(node: str) -> str:
    return f"'e' + replace({node}.uuid, '-', '')"


def set_fact_end_words(r: str) -> str:
    """A SET clause of the fact ``r``'s end words (from its stored ends)."""
    return (
        f"SET {r}.{FACT_ENDS_FIELD} = {_end_word(f'startNode({r})')} + ' ' + "
        f"{_end_word(f'endNode({r})')}\n"
    )


# An episode's times as words of the episode fulltext index, the same words as a fact's
# (``set_fact_time_words``), so that a search's Lucene query can require what its scope sees
# of episodes (``search_queries.episode_fulltext_query``): stored (``created_at``) and said
# (``valid_at``) by the asked times. An episode without a time takes the earliest time's.
EPISODE_TIME_FIELDS = ("index_created_at", "index_said_at")


def set_episode_time_words(ep: str) -> str:
    """A SET clause of the episode ``ep``'s validity words from its stored times (a clause of
    its own, after the one that writes the times: it reads them as written)."""
    created, said = EPISODE_TIME_FIELDS
    earliest = time_words(WORDS_ORIGIN)
    return (
        f"SET {ep}.{created} = coalesce({_time_words(f'{ep}.created_at')}, '{earliest}'),\n"
        f"    {ep}.{said} = coalesce({_time_words(f'{ep}.valid_at')}, '{earliest}')\n"
    )


def merge_fact_rows(rows: str, group: str) -> str:
    """One MERGE per row of ``rows`` (fact rows, a fact's full state), by
    ``write_rules.FACT``."""
    return f"""
UNWIND {rows} AS row
MATCH (s:Entity {{uuid: row.source_uuid}}), (t:Entity {{uuid: row.target_uuid}})
MERGE (s)-[r:RELATES_TO {{uuid: row.uuid}}]->(t)
ON CREATE SET {_listed(on_create("r", FACT, "row", group), "              ")}
SET r.index_ids = row.index_ids,
    {_listed(on_write("r", FACT, "row", group), "    ")}
{set_fact_time_words("r")}{set_fact_end_words("r")}"""


def close_fact_rows(rows: str, group: str) -> str:
    """Each row of ``rows`` (closure rows) applied to the group's fact, by
    ``write_rules.CLOSURE``."""
    return f"""
UNWIND {rows} AS row
MATCH ()-[r:RELATES_TO {{uuid: row.uuid}}]->()
USING INDEX r:RELATES_TO(uuid)
WHERE r.group_id = {group}
SET {_listed(on_write("r", CLOSURE, "row", group), "    ")}
{set_fact_time_words("r")}"""


# ----------------------------------------------------------------------------- episodes
def thread_context(var: str) -> str:
    """Set ``var``'s ``index_context`` (an Episodic message) from its thread as stored: the
    bodies of the $context_turns messages before it within $context_seconds, oldest first
    (tidegraph/records/conversation.py)."""
    return f"""
  CALL ({var}) {{
    OPTIONAL MATCH (p:Episodic)
    USING INDEX p:Episodic(group_id, valid_at)
    WHERE p.group_id = {var}.group_id AND p.valid_at < {var}.valid_at
      AND p.valid_at >= {var}.valid_at - duration({{seconds: $context_seconds}})
      AND p.source = 'message' AND p.source_description = {var}.source_description
    WITH p ORDER BY p.valid_at DESC, p.uuid DESC LIMIT $context_turns
    RETURN collect(p.index_body) AS bodies
  }}
  SET {var}.index_context =
    reduce(text = '', body IN reverse(bodies) |
           CASE WHEN text = '' THEN body ELSE text + ' ' + body END)
"""


# A message written: its own context, and that of the messages after it whose context it is
# now (so the index is the same whatever order a thread's messages arrive in).
_THREAD_OF_EP = (
    """
  CALL (ep) {
    WITH ep WHERE ep.source = 'message'"""
    + thread_context("ep")
    + """  }
  CALL (ep) {
    WITH ep WHERE ep.source = 'message'
    MATCH (n:Episodic)
    USING INDEX n:Episodic(group_id, valid_at)
    WHERE n.group_id = ep.group_id AND n.valid_at > ep.valid_at
      AND n.valid_at <= ep.valid_at + duration({seconds: $context_seconds})
      AND n.source = 'message' AND n.source_description = ep.source_description
    WITH n ORDER BY n.valid_at, n.uuid LIMIT $context_turns"""
    + thread_context("n")
    + """  }
"""
)

# The Episodic marker of write ``w`` (``w.ep``: an episode row), by ``write_rules.EPISODE``,
# with its search fields (``w.index``) and its speaker's name words.
_MERGE_EPISODE = f"""
  MERGE (ep:Episodic {{uuid: w.ep.uuid}})
  ON CREATE SET {_listed(on_create("ep", EPISODE, "w.ep", "w.group_id"), "                ")}
  SET {_listed(on_write("ep", EPISODE, "w.ep", "w.group_id"), "      ")},
      ep.index_body = w.index.body,
      ep.index_speaker = w.index.speaker,
      ep.index_when = w.index.when,
      ep.index_ids = w.index.ids,
      ep.index_speaker_words = w.index.speaker_words
  {set_episode_time_words("ep")}  FOREACH (word IN w.index.speaker_words |
    MERGE (:SpeakerWord {{group_id: w.group_id, word: word}}))
"""

# ----------------------------------------------------------------------------- one episode's write
# What the checks of an episode write need (see ``errors.check_write``): the group of a stored
# Episodic with this uuid (the processed marker), and of the stored entities and facts the
# write names.
# What the checks of a transaction's episode writes read, for all of them at once
# (``errors.check_write`` runs on it in Python, each write seeing the ones before it): the
# stored Episodic of each episode, the group of each entity named and the group and ends of
# each fact written or closed.
WRITE_STATES = kept_plan(
    """
CALL () {
  UNWIND $episode_uuids AS uuid
  MATCH (ep:Episodic {uuid: uuid})
  RETURN collect([ep.uuid, ep.group_id, ep.content_hash, ep.not_extracted]) AS episodes
}
CALL () {
  UNWIND $entity_uuids AS uuid
  MATCH (e:Entity {uuid: uuid})
  RETURN collect([e.uuid, e.group_id]) AS entities
}
CALL () {
  UNWIND $fact_uuids AS uuid
  MATCH (s)-[r:RELATES_TO {uuid: uuid}]->(t)
  USING INDEX r:RELATES_TO(uuid)
  RETURN collect([r.uuid, r.group_id, s.uuid, t.uuid]) AS facts
}
RETURN episodes, entities, facts
"""
)

# The changes one transaction commits for a group (``o``: ``rows.by_record``) appended to
# its outbox as one ``Change`` node numbered ``seq`` to ``last`` in commit order (the
# changes' bodies on its entries in the index of records, a ``ChangeRecord`` per record), the
# group's write version bumped (a rebuild checks it did not move while it computed; bumped with no
# change too), the log stamped with the writer's deployment unless it has one (its relay
# publishes the group). The first SET reads what it writes, so Cypher takes the log's write
# lock before it: ``base`` is read under the lock, and two writes of a group never number
# their changes alike.
_RECORD_CHANGES = """
    MERGE (log:ChangeLog {group_id: o.group_id})
    ON CREATE SET log.seq = 0, log.version = 0
    SET log.version = log.version + 1, log.deployment = coalesce(log.deployment, $deployment)
    WITH o, log, log.seq AS base
    SET log.seq = base + o.n
    WITH o, base
    WHERE o.n > 0
    CREATE (:Change {group_id: o.group_id, seq: base + 1, last: base + o.n,
                     change_id: o.change_id, kind: o.kind, uuid: o.uuid,
                     committed_at: o.committed_at})
    WITH o, base
    UNWIND o.parts AS part
    CREATE (:ChangeRecord {group_id: o.group_id, uuid: part.uuid, last: base + o.n,
                           body: part.body})
"""
# The same alone (a forget's rebuild): ``$outbox`` holds the group's one row.
RECORD_CHANGES = "UNWIND $outbox AS o\nCALL (o) {" + _RECORD_CHANGES + "}\n"


# Every episode write of a transaction in one statement, in order: each write is one run of
# the subquery, and a run sees what the runs before it wrote (Cypher's CALL semantics), so
# the result is that of one statement per write. Per write: entities first (mentions and
# facts point at them), then the Episodic marker, its MENTIONS, the facts (full state) and
# the closures; then each group's changes, one outbox row per group (``$outbox``).
WRITE_EPISODES = kept_plan(
    """
UNWIND $writes AS w
CALL (w) {
  CALL (w) {"""
    + upsert_entity_rows("w.entities", "w.group_id")
    + "  }"
    + _MERGE_EPISODE
    + "  WITH ep, w"
    + _THREAD_OF_EP
    + """  WITH ep
  CALL (ep, w) {
    UNWIND w.mentions AS mention
    MATCH (e:Entity {uuid: mention})
    MERGE (ep)-[m:MENTIONS]->(e)
    ON CREATE SET m.group_id = w.group_id
  }
  CALL (w) {"""
    + merge_fact_rows("w.facts", "w.group_id")
    + """  }
  CALL (w) {"""
    + close_fact_rows("w.closures", "w.group_id")
    + """  }
}
WITH count(*) AS written
"""
    + RECORD_CHANGES
)

# Community memberships in order (each row names its group: the assignments of several
# groups share a transaction), each as
# ``tidegraph.stores.neo4j.communities.Neo4jCommunities.assign_members`` does it in three
# statements: an assignment whose community or entity is not in the group changes nothing;
# otherwise the entity leaves its other communities and joins this one (each run of the
# subquery sees the runs before it, so a later assignment of an entity wins).
ASSIGN_MEMBERS = kept_plan(
    """
UNWIND $rows AS row
CALL (row) {
  MATCH (c:Community {uuid: row.community_uuid})
  USING INDEX c:Community(uuid)
  WHERE c.group_id = row.group_id
  MATCH (e:Entity {uuid: row.entity_uuid})
  USING INDEX e:Entity(uuid)
  WHERE e.group_id = row.group_id
  OPTIONAL MATCH (e)<-[old:HAS_MEMBER]-(other)
  WHERE other.group_id = row.group_id AND other <> c
  DELETE old
  WITH DISTINCT c, e
  MERGE (c)-[m:HAS_MEMBER]->(e)
  ON CREATE SET m.group_id = row.group_id
}
"""
)


# ----------------------------------------------------------------------------- communities
# (the reads: tidegraph.stores.neo4j.common_queries). A refresh's write keeps its plan like
# its reads (``plans``); its MERGE finds a community by the uniqueness constraint on its uuid
# (``community_uuid``), whatever the statistics.
UPSERT_COMMUNITIES = kept_plan(
    f"""
UNWIND $rows AS row
MERGE (c:Community {{uuid: row.uuid}})
ON CREATE SET {_listed(on_create("c", COMMUNITY, "row", "$group_id"), "              ")}
SET {_listed(on_write("c", COMMUNITY, "row", "$group_id"), "    ")}
"""
)
