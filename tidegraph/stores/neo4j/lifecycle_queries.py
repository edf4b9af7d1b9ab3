"""The Neo4j store's Cypher for the memory lifecycle: the change stream's outbox and what a
forget reads and writes (docs/architecture.md "Forgetting"). Fully parameterised, every match
scoped by its group."""

from __future__ import annotations

from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j.queries import (
    at,
    ats,
    kept_plan,
    set_alias_key,
    set_fact_end_words,
    set_fact_time_words,
)

# A forget runs its statements with their parameters in one map (``queries.kept_plan``).


# ---- the outbox purge's blanking: a ``Change`` node's columns, a line per change
OUTBOX_COLUMNS = ("change_id", "kind", "uuid", "body")


def _lines_of(column: str) -> str:
    """A ``WITH`` that adds the lines of ``c.<column>`` (one of ``OUTBOX_COLUMNS``) and where
    each starts (characters; a line ends at the next's start less its newline)."""
    return f"""WITH *, split(c.{column}, '\\n') AS {column}_lines
WITH *, reduce(at = [0], line IN {column}_lines | at + [last(at) + size(line) + 1])
     AS {column}_starts
"""


def _blanked(column: str) -> str:
    """``c.<column>`` with its lines ``gone`` (ascending) emptied: the text between them kept,
    a few substrings joined (not the row's lines one by one)."""
    lines, starts = f"{column}_lines", f"{column}_starts"
    return (
        f"reduce(cut = {{text: '', rest: 0}}, i IN gone | "
        f"{{text: cut.text + substring(c.{column}, cut.rest, {starts}[i] - cut.rest), "
        f"rest: {starts}[i] + size({lines}[i])}}).text\n"
        f"      + substring(c.{column}, {starts}[last(gone)] + size({lines}[last(gone)]))"
    )


# A row's changes' bodies by record (``rows.by_record``: [uuid, body] each), which readers join
# in the row's order (``rows.joined_body``). A row written before bodies were kept by record
# holds them in ``c.body`` (its entries hold none).
ROW_PARTS = """
CALL (c) {
  OPTIONAL MATCH (r:ChangeRecord)
  USING INDEX r:ChangeRecord(group_id, last)
  WHERE r.group_id = c.group_id AND r.last = c.last AND r.body IS NOT NULL
  RETURN collect([r.uuid, r.body]) AS parts
}"""

# ---- the change stream: a ``Change`` node per write of a group, its changes numbered
# ``seq`` to ``last`` one per line (``tidegraph.stores.rows.outbox_row``), found by
# (group, last)
CHANGES = (
    """
MATCH (c:Change)
WHERE c.group_id = $group_id AND c.last > $after
WITH c
ORDER BY c.last
LIMIT $rows"""
    + ROW_PARTS
    + """
RETURN c.seq AS seq, c.last AS last, c.change_id AS change_ids, c.uuid AS uuids,
       c.body AS body, parts
ORDER BY c.last
"""
)

# The relay's cursor is a node of its own: the writes lock their group's ChangeLog for their
# whole transaction, and the relay moving its cursor must not wait for them (nor they for it).
# The relay reads and moves only the logs of its deployment. Both statements run every relay
# round: they keep their plans (``plans``).
CHANGE_LOGS = kept_plan(
    """
MATCH (log:ChangeLog)
WHERE ($groups IS NULL OR log.group_id IN $groups)
  AND (NOT $own OR log.deployment = $deployment)
OPTIONAL MATCH (cursor:ChangeCursor {group_id: log.group_id})
WITH log, coalesce(cursor.published, 0) AS published
WHERE NOT $unpublished OR log.seq > published
RETURN log.group_id AS group_id, log.seq AS seq, published, log.version AS version,
       log.deployment AS deployment
ORDER BY group_id
"""
)

# Each group's rows after its cursor, as many as its next ``$limit`` numbers reach (at least
# one): a row's changes are numbered on from the row before, so the rows starting within
# those numbers hold at most ``$limit`` changes, fewer where changes went. A relay round
# reads it five times a second: it keeps its plan, as the writes do.
UNPUBLISHED_CHANGES = kept_plan(
    """
UNWIND $groups AS group_id
MATCH (log:ChangeLog {group_id: group_id})
WHERE log.deployment = $deployment
OPTIONAL MATCH (cursor:ChangeCursor {group_id: group_id})
WITH group_id, log, coalesce(cursor.published, 0) AS published
WHERE log.seq > published
CALL (group_id, published) {
  MATCH (c:Change)
  USING INDEX c:Change(group_id, last)
  WHERE c.group_id = group_id AND c.last > published
  WITH c
  ORDER BY c.last
  LIMIT $limit
  WITH collect(c) AS rows
  UNWIND rows AS c
  WITH c, rows[0] AS first
  WHERE c = first OR c.seq <= published + $limit
  RETURN c
}
WITH group_id, published, c"""
    + ROW_PARTS
    + """
RETURN group_id, published, c.seq AS seq, c.change_id AS change_ids, c.uuid AS uuids,
       c.body AS body, parts
ORDER BY group_id, seq
"""
)

# A cursor moves to a change the relay published only while that change is stored at its seq.
MARK_PUBLISHED = kept_plan(
    """
UNWIND $cursors AS row
MATCH (log:ChangeLog {group_id: row.group_id})
WHERE log.deployment = $deployment
CALL (row) {
  MATCH (c:Change)
  USING INDEX c:Change(group_id, last)
  WHERE c.group_id = row.group_id AND c.last >= row.seq
  WITH c
  ORDER BY c.last
  LIMIT 1
  WITH c
  WHERE c.seq <= row.seq AND split(c.change_id, '\\n')[row.seq - c.seq] = row.change_id
  RETURN c
}
WITH DISTINCT row
MERGE (cursor:ChangeCursor {group_id: row.group_id})
ON CREATE SET cursor.published = 0
SET cursor.published = CASE WHEN row.seq > cursor.published THEN row.seq
                            ELSE cursor.published END
"""
)

PRUNE_CHANGES = """
OPTIONAL MATCH (cursor:ChangeCursor {group_id: $group_id})
WITH coalesce(cursor.published, 0) AS published
MATCH (c:Change)
WHERE c.group_id = $group_id AND coalesce(c.committed_at, 0) < $before
  AND (NOT $published_only OR c.last <= published)
WITH c LIMIT $batch
CALL (c) {
  UNWIND split(c.uuid, '\\n') AS uuid
  WITH DISTINCT c, uuid
  MATCH (r:ChangeRecord {uuid: uuid})
  WHERE r.group_id = c.group_id AND r.last = c.last
  DELETE r
}
WITH c, c.last AS last, size([id IN split(c.change_id, '\\n') WHERE trim(id) <> '']) AS held
DELETE c
RETURN count(*) AS deleted, max(last) AS dropped, coalesce(sum(held), 0) AS changes
"""

# After changes up to ``$dropped`` were deleted in this transaction: a cursor right before
# deleted ones moves past them, up to the first change still there (the relay never waits for
# a change that is gone, and moves a cursor itself only past changes Kafka acknowledged). A
# row holding the cursor's next change keeps it where it is.
SKIP_DROPPED = kept_plan(
    """
OPTIONAL MATCH (cursor:ChangeCursor {group_id: $group_id})
WITH coalesce(cursor.published, 0) AS published
WHERE $dropped > published
CALL (published) {
  OPTIONAL MATCH (c:Change)
  USING INDEX c:Change(group_id, last)
  WHERE c.group_id = $group_id AND c.last > published
  WITH c
  ORDER BY c.last
  LIMIT 1
  RETURN CASE WHEN c IS NULL THEN null
              WHEN c.seq > published THEN c.seq
              ELSE published + 1 END AS kept
}
WITH published,
     CASE WHEN kept IS NOT NULL AND kept - 1 < $dropped THEN kept - 1 ELSE $dropped END AS past
WHERE past > published
MERGE (cursor:ChangeCursor {group_id: $group_id})
ON CREATE SET cursor.published = 0
SET cursor.published = CASE WHEN past > cursor.published THEN past ELSE cursor.published END
"""
)

# Stored Change nodes not yet in the index of records (``Neo4jStore.setup``, while
# ``change_record_group`` is missing): one pass over the outbox, committed every ``$rows``
# rows (``CALL ... IN TRANSACTIONS``, so an auto-commit statement: ``Neo4jExecutor.batched``).
# Rows indexed before an interruption are skipped when it runs again. A pass per batch, as
# before, read the whole outbox each time: quadratic in its size.
CHANGES_TO_INDEX = """
MATCH (c:Change)
WITH c, [u IN split(c.uuid, '\\n') WHERE trim(u) <> ''] AS held
WHERE size(held) > 0 AND NOT EXISTS {
  MATCH (r:ChangeRecord {uuid: held[0]}) WHERE r.group_id = c.group_id AND r.last = c.last
}
CALL (c, held) {
  UNWIND held AS uuid
  WITH DISTINCT uuid
  CREATE (:ChangeRecord {group_id: c.group_id, uuid: uuid, last: c.last})
} IN TRANSACTIONS OF $rows ROWS
RETURN count(*) AS indexed
"""

# The stored changes numbered before ``last`` was kept (a row of one each), found by
# (group, last) like the others (``Neo4jStore.setup``, while ``change_group_seq`` exists).
CHANGES_TO_NUMBER = """
MATCH (c:Change)
WHERE c.last IS NULL
WITH c LIMIT $limit
SET c.last = c.seq
RETURN count(*) AS numbered
"""


# ---- what a forget reads (the version first: a write after it makes the rebuild refused)
GROUP_VERSION = kept_plan(
    """
OPTIONAL MATCH (log:ChangeLog {group_id: $group_id})
RETURN coalesce(log.version, 0) AS version
"""
)

HISTORY_EPISODES = """
MATCH (ep:Episodic)
WHERE ep.group_id = $group_id AND ep.forgotten_at IS NULL
RETURN ep {.*} AS ep,
       [(ep)-[:MENTIONS]->(e:Entity) WHERE e.group_id = $group_id | e.uuid] AS mentions
ORDER BY coalesce(ep.extracted_at, ep.created_at), ep.uuid
"""

HISTORY_ENTITIES = """
MATCH (e:Entity)
WHERE e.group_id = $group_id
RETURN e {.*} AS e
"""

HISTORY_FACTS = """
MATCH (s:Entity)-[r:RELATES_TO]->(t:Entity)
WHERE r.group_id = $group_id
RETURN r {.*} AS r, s.uuid AS source_uuid, t.uuid AS target_uuid
"""

# The episodes named, those mentioning the entities named and those that created the entities
# named (``Forgetting.history_part``), each found through a uuid constraint.
HISTORY_PART = kept_plan(
    """
CALL () {
  MATCH (ep:Episodic) WHERE ep.uuid IN $episodes RETURN ep
  UNION
  MATCH (e:Entity)<-[:MENTIONS]-(ep:Episodic) WHERE e.uuid IN $mentioning RETURN ep
  UNION
  MATCH (e:Entity)<-[:MENTIONS]-(ep:Episodic)
  WHERE e.uuid IN $creating AND e.uuid IN coalesce(ep.created_entities, []) RETURN ep
}
WITH ep WHERE ep.group_id = $group_id AND ep.forgotten_at IS NULL
RETURN ep {.*} AS ep,
       [(ep)-[:MENTIONS]->(e:Entity) WHERE e.group_id = $group_id | e.uuid] AS mentions
ORDER BY coalesce(ep.extracted_at, ep.created_at), ep.uuid
"""
)

GROUP_PROFILE = kept_plan(
    """
RETURN EXISTS {
         MATCH (ep:Episodic)
         USING INDEX ep:Episodic(group_id)
         WHERE ep.group_id = $group_id AND ep.forgotten_at IS NULL AND ep.not_extracted IS NULL
           AND ep.extraction IS NOT NULL AND NOT ep.extraction CONTAINS $mapped
       } AS judged,
       EXISTS {
         MATCH (ep:Episodic)
         USING INDEX ep:Episodic(group_id)
         WHERE ep.group_id = $group_id AND ep.forgotten_at IS NULL AND ep.not_extracted IS NULL
           AND ep.extraction IS NULL
       } AS without_extraction
"""
)
# Up to $up_to of the group's live extracted episodes (``Forgetting.extracted_episodes``).
EXTRACTED_EPISODES = kept_plan(
    """
MATCH (ep:Episodic)
USING INDEX ep:Episodic(group_id)
WHERE ep.group_id = $group_id AND ep.forgotten_at IS NULL AND ep.not_extracted IS NULL
WITH ep LIMIT $up_to
RETURN count(ep) AS extracted
"""
)

# ---- what a forget writes, in one transaction, in this order
# The entities a rebuild writes that exist, and their groups (a rebuild never takes over
# another group's entity).
REBUILD_OWNERS = kept_plan(
    """
UNWIND $uuids AS uuid
MATCH (e:Entity {uuid: uuid})
RETURN e.uuid AS uuid, e.group_id AS group_id
"""
)
REBUILD_VERSION = kept_plan(
    """
OPTIONAL MATCH (log:ChangeLog {group_id: $group_id})
RETURN coalesce(log.version, 0) AS version
"""
)

# The forgotten episodes become tombstones: uuid, group and when; nothing else of them stays.
TOMBSTONES = kept_plan(
    """
UNWIND $uuids AS uuid
MATCH (ep:Episodic {uuid: uuid})
WHERE ep.group_id = $group_id
OPTIONAL MATCH (ep)-[m:MENTIONS]->()
DELETE m
WITH DISTINCT ep
SET ep = {uuid: ep.uuid, group_id: ep.group_id, forgotten_at: """
    + at("$forgotten_at")
    + """}
"""
)

# Before forgetting episodes: the messages whose context they are (re-indexed after), and
# the words of their speakers (kept only while a remaining message has them).
FORGOTTEN_THREADS = kept_plan(
    """
UNWIND $uuids AS uuid
MATCH (ep:Episodic {uuid: uuid})
WHERE ep.group_id = $group_id AND ep.source = 'message'
OPTIONAL MATCH (n:Episodic)
USING INDEX n:Episodic(group_id, valid_at)
WHERE n.group_id = ep.group_id AND n.source = 'message'
  AND n.source_description = ep.source_description AND n.valid_at > ep.valid_at
  AND n.valid_at <= ep.valid_at + duration({seconds: $context_seconds})
RETURN collect(DISTINCT n.uuid) AS followers,
       collect(DISTINCT ep.index_speaker_words) AS words
"""
)
# After: their contexts without the forgotten messages, and the speaker words no remaining
# message has removed.
REINDEX_THREADS = kept_plan(
    """
UNWIND $followers AS uuid
MATCH (n:Episodic {uuid: uuid})
WHERE n.group_id = $group_id AND n.forgotten_at IS NULL"""
    + q.thread_context("n")
)
DROP_SPEAKER_WORDS = kept_plan(
    """
UNWIND $words AS word
MATCH (s:SpeakerWord {group_id: $group_id, word: word})
WHERE NOT EXISTS {
  MATCH (ep:Episodic)
  USING INDEX ep:Episodic(group_id)
  WHERE ep.group_id = $group_id AND ep.source = 'message' AND word IN ep.index_speaker_words
}
DETACH DELETE s
"""
)

DELETE_FACTS = kept_plan(
    """
UNWIND $uuids AS uuid
MATCH ()-[r:RELATES_TO {uuid: uuid}]->()
WHERE r.group_id = $group_id
DELETE r
"""
)

DELETE_ENTITIES = kept_plan(
    """
UNWIND $uuids AS uuid
MATCH (e:Entity {uuid: uuid})
WHERE e.group_id = $group_id
DETACH DELETE e
"""
)

# Entities in full: created, or every property replaced; type labels become node labels as
# in the usual upsert (checked names, ``rows.clean_labels``).
OVERWRITE_ENTITIES = kept_plan(
    """
UNWIND $rows AS row
MERGE (e:Entity {uuid: row.uuid})
ON CREATE SET e.group_id = $group_id
SET e.name = row.name,
    e.name_norm = row.name_norm,
    e.labels = row.labels,
    e.summary = coalesce(row.summary, ''),
    e.index_ids = row.index_ids,
    e.key = row.key,
    e.aliases = row.aliases,
    e.name_embedding = coalesce(row.name_embedding, e.name_embedding),
    e.created_at = """
    + at("row.created_at")
    + "\n"
    + set_alias_key("e")
    + """SET e:$(row.labels)
"""
)

# Facts in full: created between their ends, or every property replaced (ends, histories and
# their nulls included: a comprehension over a null list is null).
OVERWRITE_FACTS = kept_plan(
    """
UNWIND $rows AS row
MATCH (s:Entity {uuid: row.source_uuid}) WHERE s.group_id = $group_id
MATCH (t:Entity {uuid: row.target_uuid}) WHERE t.group_id = $group_id
MERGE (s)-[r:RELATES_TO {uuid: row.uuid}]->(t)
SET r.group_id = $group_id,
    r.name = row.name,
    r.fact = row.fact,
    r.index_ids = row.index_ids,
    r.fact_embedding = coalesce(row.fact_embedding, r.fact_embedding),
    r.episodes = row.episodes,
    r.valid_at = """
    + at("row.valid_at")
    + """,
    r.invalid_at = """
    + at("row.invalid_at")
    + """,
    r.created_at = """
    + at("row.created_at")
    + """,
    r.expired_at = """
    + at("row.expired_at")
    + """,
    r.cardinality = row.cardinality,
    r.prior_ends = CASE WHEN row.prior_ends IS NULL THEN null ELSE """
    + ats("row.prior_ends")
    + """ END,
    r.prior_ends_learned_at = CASE WHEN row.prior_ends_learned_at IS NULL THEN null
                              ELSE """
    + ats("row.prior_ends_learned_at")
    + """ END,
    r.end_learned_at = """
    + at("row.end_learned_at")
    + """,
    r.prior_starts = CASE WHEN row.prior_starts IS NULL THEN null ELSE """
    + ats("row.prior_starts")
    + """ END,
    r.prior_starts_learned_at = CASE WHEN row.prior_starts_learned_at IS NULL THEN null
                                ELSE """
    + ats("row.prior_starts_learned_at")
    + """ END,
    r.start_learned_at = """
    + at("row.start_learned_at")
    + "\n"
    + set_fact_time_words("r")
    + set_fact_end_words("r")
)

REPLACE_MENTIONS = kept_plan(
    """
UNWIND $rows AS row
MATCH (ep:Episodic {uuid: row.episode})
WHERE ep.group_id = $group_id
OPTIONAL MATCH (ep)-[m:MENTIONS]->()
DELETE m
WITH DISTINCT ep, row
UNWIND row.entities AS uuid
MATCH (e:Entity {uuid: uuid}) WHERE e.group_id = $group_id
MERGE (ep)-[n:MENTIONS]->(e)
ON CREATE SET n.group_id = $group_id
"""
)

SET_CREATED = kept_plan(
    """
UNWIND $rows AS row
MATCH (ep:Episodic {uuid: row.episode})
WHERE ep.group_id = $group_id
SET ep.created_entities = row.created
"""
)

# The rebuild's changes, in the group's outbox (the write path's own statement, kept).
REBUILD_CHANGES = kept_plan(q.RECORD_CHANGES)

# The changes of records ``$uuids`` out of the group's outbox, in one statement on the server
# (a row is a write unit's changes, on the order of 150 kB: read to the client and written
# back whole, a subject's rows were megabytes each way). The rows holding one are found
# through the index of records; in each, the lines of those records are blanked (emptied:
# every line keeps its place, so the others keep their seq, ``rows.held``), or the row is
# deleted when it then holds no change. Returns the last change number of the rows it
# touched (``SKIP_DROPPED`` moves a cursor past what went).
PURGE_ROWS = kept_plan(
    """
MATCH (r:ChangeRecord)
USING INDEX r:ChangeRecord(uuid)
WHERE r.uuid IN $uuids AND r.group_id = $group_id
WITH DISTINCT r.last AS row_last
MATCH (c:Change)
USING INDEX c:Change(group_id, last)
WHERE c.group_id = $group_id AND c.last = row_last
WITH c, row_last, split(c.uuid, '\\n') AS uuids
WITH c, row_last, uuids, [i IN range(0, size(uuids) - 1) WHERE uuids[i] IN $uuids] AS gone
WHERE size(gone) > 0
WITH c, row_last, gone,
     any(i IN range(0, size(uuids) - 1) WHERE NOT i IN gone AND trim(uuids[i]) <> '') AS holds
"""
    + "".join(_lines_of(column) for column in OUTBOX_COLUMNS)
    + """FOREACH (_ IN CASE WHEN holds THEN [1] ELSE [] END |
  SET """
    + ",\n      ".join(f"c.{column} = {_blanked(column)}" for column in OUTBOX_COLUMNS)
    + """)
FOREACH (_ IN CASE WHEN holds THEN [] ELSE [1] END | DELETE c)
RETURN count(row_last) AS rows, coalesce(max(row_last), 0) AS dropped
"""
)

# The purged records out of the index of records.
UNINDEX_PURGED = kept_plan(
    """
MATCH (r:ChangeRecord)
USING INDEX r:ChangeRecord(uuid)
WHERE r.uuid IN $uuids AND r.group_id = $group_id
DELETE r
"""
)


# Not episodes: the tombstones of forgotten ones.
LIVE_EPISODE = "ep.forgotten_at IS NULL"

# ---- a whole group (re-runnable in batches: what is done is not done again)
GROUP_LIVE_EPISODES = """
MATCH (ep:Episodic)
WHERE ep.group_id = $group_id AND ep.forgotten_at IS NULL
RETURN count(ep) AS episodes
"""

TOMBSTONE_GROUP_BATCH = (
    """
MATCH (ep:Episodic)
WHERE ep.group_id = $group_id AND ep.forgotten_at IS NULL
WITH ep LIMIT $batch
OPTIONAL MATCH (ep)-[m:MENTIONS]->()
DELETE m
WITH DISTINCT ep
SET ep = {uuid: ep.uuid, group_id: ep.group_id, forgotten_at: """
    + at("$forgotten_at")
    + """}
RETURN count(*) AS deleted
"""
)


DELETE_GROUP_FACTS = """
MATCH (s:Entity)-[r:RELATES_TO]->()
WHERE s.group_id = $group_id
WITH r LIMIT $batch
DELETE r
RETURN count(*) AS deleted
"""


def delete_group_nodes(label: str) -> str:
    """One batch of a group's nodes of ``label`` (one of ours, a constant) deleted."""
    return f"""
MATCH (n:{label})
WHERE n.group_id = $group_id
WITH n LIMIT {q.batch_limit(label)}
DETACH DELETE n
RETURN count(*) AS deleted
"""


# What forgetting a whole group runs, each statement in batches until it deletes no more.
FORGET_GROUP = (
    TOMBSTONE_GROUP_BATCH,
    DELETE_GROUP_FACTS,
    *(
        delete_group_nodes(label)
        for label in ("Community", "Entity", "Change", "ChangeRecord", "SpeakerWord")
    ),
)
PURGE_GROUP = (
    DELETE_GROUP_FACTS,
    *(
        delete_group_nodes(label)
        for label in ("Episodic", "Community", "Entity", "Change", "ChangeRecord", "SpeakerWord")
    ),
    delete_group_nodes("ChangeLog"),
    delete_group_nodes("ChangeCursor"),
)


# Episode listings: one statement per filter shape, the values all parameters.
def list_episodes_query(
    *, forgotten: bool, status: str | None, ranged: tuple[bool, bool], paged: bool
) -> str:
    """The listing of ``Browsing.list_episodes`` for one combination of filters (the
    statement is made of constant fragments; every value is a parameter)."""
    at = "ep.forgotten_at" if forgotten else "ep.valid_at"
    where = ["ep.group_id = $group_id"]
    where.append("ep.forgotten_at IS NOT NULL" if forgotten else "ep.forgotten_at IS NULL")
    if status == "written":
        where.append("ep.not_extracted IS NULL")
    elif status == "not_extracted":
        where.append("ep.not_extracted IS NOT NULL")
    if ranged[0]:
        where.append(f"{at} >= $since")
    if ranged[1]:
        where.append(f"{at} < $until")
    if paged:
        where.append(f"({at} > $after_at OR ({at} = $after_at AND ep.uuid > $after_uuid))")
    return (
        "MATCH (ep:Episodic) WHERE "
        + " AND ".join(where)
        + " RETURN ep.uuid AS uuid, ep.producer_id AS producer_id, ep.name AS name, "
        "ep.source AS source, ep.valid_at AS valid_at, ep.created_at AS created_at, "
        "ep.not_extracted AS not_extracted, ep.content AS content, "
        f"ep.forgotten_at AS forgotten_at ORDER BY {at}, ep.uuid LIMIT $limit"
    )


EPISODE_DETAIL = """
MATCH (ep:Episodic {uuid: $uuid})
WHERE ep.group_id = $group_id
RETURN ep.uuid AS uuid, ep.producer_id AS producer_id, ep.name AS name,
       ep.source AS source, ep.valid_at AS valid_at, ep.created_at AS created_at,
       ep.not_extracted AS not_extracted, ep.content AS content,
       ep.forgotten_at AS forgotten_at,
       [(ep)-[:MENTIONS]->(e:Entity) WHERE e.group_id = $group_id | e.uuid] AS mentions
"""


# Communities with a member removed or changed go (their names and summaries may carry what
# was forgotten); the next refresh groups the remaining members again.
DELETE_STALE_COMMUNITIES = kept_plan(
    """
MATCH (c:Community)-[:HAS_MEMBER]->(e:Entity)
USING INDEX e:Entity(uuid)
WHERE c.group_id = $group_id AND e.group_id = $group_id AND e.uuid IN $uuids
WITH DISTINCT c
DETACH DELETE c
"""
)
