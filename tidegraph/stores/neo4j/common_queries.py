"""Cypher of the Neo4j store shared by ``core`` and ``search``: the group's entity
uuids and the community queries (the as-of filter is ``tidegraph.stores.neo4j.asof``). Fully
parameterised; answers with the column names ``tidegraph.stores.neo4j.core`` reads."""

from __future__ import annotations

from tidegraph.stores.neo4j.plans import kept_plan

# ---- episodes stored without extraction (docs/architecture.md "Episodes without an LLM")
EPISODE_STATUSES = """
UNWIND $uuids AS uuid
MATCH (ep:Episodic) WHERE ep.uuid = uuid AND ep.group_id = $group_id
RETURN ep.uuid AS uuid, ep.not_extracted AS not_extracted, ep.forgotten_at AS forgotten_at
"""
PENDING_GROUPS = """
MATCH (ep:Episodic) WHERE ep.not_extracted IS NOT NULL
RETURN DISTINCT ep.group_id AS group_id
ORDER BY group_id
"""

# ---- a community refresh (``Neo4jCommunities``: the graph, the stored communities, their
# rewrite). A worker refreshes each group it writes while the group grows, so these keep their
# plans (``plans``: the statistics they were planned with move between two refreshes) and
# name their indexes.
GROUP_ENTITY_UUIDS = kept_plan(
    "MATCH (e:Entity) USING INDEX e:Entity(group_id) WHERE e.group_id = $group_id "
    "RETURN e.uuid AS uuid"
)

GROUP_COMMUNITIES = kept_plan(
    """
MATCH (c:Community) USING INDEX c:Community(group_id) WHERE c.group_id = $group_id
RETURN c.uuid AS uuid, c.name AS name, c.summary AS summary
"""
)
GROUP_COMMUNITY_MEMBERS = kept_plan(
    """
MATCH (c:Community)-[:HAS_MEMBER]->(e:Entity)
USING INDEX c:Community(group_id)
WHERE c.group_id = $group_id AND e.group_id = $group_id
RETURN c.uuid AS community, e.uuid AS entity
"""
)
COMMUNITY_GROUPS = kept_plan(
    """
MATCH (c:Community) USING INDEX c:Community(uuid) WHERE c.uuid IN $uuids
RETURN c.uuid AS uuid, c.group_id AS group_id
"""
)
DELETE_COMMUNITIES = kept_plan(
    """
MATCH (c:Community) USING INDEX c:Community(uuid)
WHERE c.uuid IN $uuids AND c.group_id = $group_id
DETACH DELETE c
"""
)
DROP_MEMBERSHIPS = kept_plan(
    """
MATCH (c:Community)-[m:HAS_MEMBER]->(e:Entity)
USING INDEX c:Community(group_id)
WHERE c.group_id = $group_id AND (c.uuid IN $uuids OR e.uuid IN $members)
DELETE m
"""
)
ADD_MEMBERSHIPS = kept_plan(
    """
UNWIND $rows AS row
MATCH (c:Community {uuid: row.community})
USING INDEX c:Community(uuid)
MATCH (e:Entity {uuid: row.entity})
USING INDEX e:Entity(uuid)
WHERE c.group_id = $group_id AND e.group_id = $group_id
CREATE (c)-[:HAS_MEMBER {group_id: $group_id}]->(e)
"""
)
# ---- search (tidegraph.stores.neo4j.search)
COMMUNITIES_BY_UUIDS = """
MATCH (c:Community) WHERE c.uuid IN $uuids AND c.group_id = $group_id
RETURN c.uuid AS uuid, c.name AS name, c.summary AS summary,
       c.name_embedding AS name_embedding, c.created_at AS created_at
"""
COMMUNITY_MEMBERS_OF = """
MATCH (c:Community)-[:HAS_MEMBER]->(e:Entity)
WHERE c.uuid IN $uuids AND c.group_id = $group_id AND e.group_id = $group_id
RETURN c.uuid AS community, e.uuid AS entity
"""
# The group's $limit latest episodes as of a scope (happened by $valid_at, stored by
# $known_at; valid_at, then uuid, descending), each with the entities it mentions. The first
# part reads the (group_id, valid_at) index backwards, stopping at the $limit-th latest time
# (ordering by both properties is what lets the planner read the index in order: a plain ORDER
# BY valid_at read and sorted all the group's episodes, 13 ms at 10,000); the second reads the
# episodes from that time on, ties included, and orders them exactly.
RECENT_EPISODE_ENTITIES = """
MATCH (ep:Episodic)
WHERE ep.group_id = $group_id AND ep.valid_at <= $valid_at
WITH ep ORDER BY ep.group_id DESC, ep.valid_at DESC
WHERE ep.created_at <= $known_at
WITH ep.valid_at AS at LIMIT $limit
WITH min(at) AS since
MATCH (ep:Episodic)
WHERE ep.group_id = $group_id AND since <= ep.valid_at <= $valid_at
  AND ep.created_at <= $known_at
RETURN ep.uuid AS uuid,
       COLLECT { MATCH (ep)-[:MENTIONS]->(e:Entity) RETURN e.uuid ORDER BY e.uuid } AS entities
ORDER BY ep.valid_at DESC, ep.uuid DESC
LIMIT $limit
"""
