"""The statements that bring a Neo4j store written by an earlier version up to date, run by
``Neo4jStore.setup`` (``tidegraph.stores.neo4j.store``): a batch at a time of what lacks a
field the current code reads, until none is left. They read across groups on purpose: a
migration is the store's, not a tenant's."""

from __future__ import annotations

from tidegraph.stores.neo4j.write_queries import (
    set_alias_key,
    set_episode_time_words,
    set_fact_end_words,
    set_fact_time_words,
    thread_context,
)

# The migration of episodes stored before the conversation fields (``setup``): a batch of
# those without them, then their fields and speakers' words set, then the messages' contexts.
EPISODES_TO_INDEX = """
MATCH (ep:Episodic)
WHERE ep.index_ids IS NULL AND ep.forgotten_at IS NULL
RETURN ep.uuid AS uuid, ep.group_id AS group_id, ep.source AS source, ep.content AS content,
       ep.valid_at.epochMillis AS valid_at_ms
LIMIT $limit
"""
SET_EPISODE_INDEX = """
UNWIND $rows AS row
MATCH (ep:Episodic {uuid: row.uuid})
SET ep.index_body = row.index.body, ep.index_speaker = row.index.speaker,
    ep.index_when = row.index.when, ep.index_speaker_words = row.index.speaker_words,
    ep.index_ids = row.index.ids
FOREACH (word IN row.index.speaker_words |
  MERGE (:SpeakerWord {group_id: ep.group_id, word: word}))
"""
THREADS_TO_INDEX = (
    """
MATCH (ep:Episodic)
WHERE ep.source = 'message' AND ep.index_context IS NULL AND ep.index_when IS NOT NULL
WITH ep LIMIT $limit"""
    + thread_context("ep")
    + """
RETURN count(*) AS indexed
"""
)

# The migration of facts and entities stored before their identifier words (``setup``): a batch
# of those without them, then their words set ('' when they have none).
FACTS_TO_INDEX = """
MATCH ()-[r:RELATES_TO]->()
WHERE r.index_ids IS NULL
RETURN r.uuid AS uuid, r.fact AS text
LIMIT $limit
"""
SET_FACT_IDS = """
UNWIND $rows AS row
MATCH ()-[r:RELATES_TO {uuid: row.uuid}]->()
SET r.index_ids = row.ids
"""
# The migration of facts stored before their validity words (``setup``): a batch of those
# without them, or without the words of an end they have (written by code that set the
# words of a fact's start and not yet of its end), their words set from their times.
FACT_TIMES_TO_INDEX = (
    """
MATCH ()-[r:RELATES_TO]->()
WHERE r.index_created_at IS NULL
   OR (r.invalid_at IS NOT NULL AND r.index_invalid_at IS NULL)
   OR (coalesce(r.end_learned_at, r.expired_at) IS NOT NULL AND r.index_ended_at IS NULL)
WITH r LIMIT $limit
"""
    + set_fact_time_words("r")
    + "RETURN count(*) AS indexed\n"
)
# The migration of facts stored before their end words (``setup``).
FACT_ENDS_TO_INDEX = (
    """
MATCH ()-[r:RELATES_TO]->()
WHERE r.index_ends IS NULL
WITH r LIMIT $limit
"""
    + set_fact_end_words("r")
    + "RETURN count(*) AS indexed\n"
)
# The same of episodes (not forgotten: a forgotten episode keeps no search field).
EPISODE_TIMES_TO_INDEX = (
    """
MATCH (ep:Episodic)
WHERE ep.index_said_at IS NULL AND ep.forgotten_at IS NULL
WITH ep LIMIT $limit
"""
    + set_episode_time_words("ep")
    + "RETURN count(*) AS indexed\n"
)
ENTITIES_TO_INDEX = """
MATCH (e:Entity)
WHERE e.index_ids IS NULL
RETURN e.uuid AS uuid, e.name + ' ' + coalesce(e.summary, '') + ' ' + coalesce(e.key, '') AS text
LIMIT $limit
"""
SET_ENTITY_IDS = """
UNWIND $rows AS row
MATCH (e:Entity {uuid: row.uuid})
SET e.index_ids = row.ids
"""

# The migration of entities stored with aliases before their alias key (``setup``; the name
# lookups find an alias through it: ``queries.named_branches``).
ALIAS_KEYS_TO_SET = (
    """
MATCH (e:Entity)
WHERE e.alias_key IS NULL AND any(a IN coalesce(e.aliases, []) WHERE a <> e.name_norm)
WITH e LIMIT $limit
"""
    + set_alias_key("e")
    + "RETURN count(*) AS indexed\n"
)
