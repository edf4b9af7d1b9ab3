"""Store calls only tests make, over the stores' own role methods: a store carries no method
its product callers never use (docs/architecture.md "Store roles")."""

from __future__ import annotations

from datetime import datetime

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import EntityRecord, FactRecord
from tidegraph.records.search import SearchScope
from tidegraph.stores import errors
from tidegraph.stores.base import GraphStore
from tidegraph.stores.executor import Tx
from tidegraph.stores.memory.store import MemoryStore
from tidegraph.stores.neo4j import queries as neo4j_queries
from tidegraph.stores.neo4j.store import Neo4jStore
from tidegraph.stores.rows import entity_row, now_utc, unique, with_epoch_times
from tidegraph.stores.sqlite import writes as sqlite_writes
from tidegraph.stores.sqlite.db import Transaction
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.store import SqliteStore
from tidegraph.stores.sqlite.writes import stored_owners


async def neighbour_weights(
    store: GraphStore, group_id: str, entity_uuid: str, at: datetime | None = None
) -> dict[str, int]:
    """{neighbour uuid: number of facts valid at ``at`` between it and the entity}: one
    entity's ``neighbour_weights_many``."""
    [weights] = await store.communities.neighbour_weights_many(group_id, [entity_uuid], at)
    return weights


async def assign_member(
    store: GraphStore, group_id: str, community_uuid: str, entity_uuid: str
) -> None:
    """One ``assign_members`` assignment: the entity joins that community and leaves any
    other."""
    await store.communities.assign_members(group_id, [(community_uuid, entity_uuid)])


async def vector_facts(
    store: GraphStore, group_id: str, embedding: list[float], limit: int
) -> list[tuple[FactRecord, float]]:
    """The group's facts nearest to ``embedding`` (every fact believed now, ended or not) as a
    fact search finds them, best first, scored ``(1 + cos) / 2``."""
    scope = SearchScope((group_id,), AsOf.resolve(None, None, True, None))
    hits = await store.search.vector_search(scope, "fact", embedding, limit)
    return [(hit.record, hit.score) for hit in hits]  # type: ignore[misc]


async def upsert_entities(store: GraphStore, group_id: str, entities: list[EntityRecord]) -> None:
    """Entities written without an episode, as an episode write writes its entities (MERGE by
    uuid, ``tidegraph.stores.write_rules.merged_entity``; an entity of another group is
    refused), in one transaction: how tests build a graph."""
    if not entities:
        return
    if isinstance(store, MemoryStore):
        _memory_upsert(store, group_id, entities)
    elif isinstance(store, SqliteStore):
        await _sqlite_upsert(store, group_id, entities)
    elif isinstance(store, Neo4jStore):
        await _neo4j_upsert(store, group_id, entities)
    else:
        raise TypeError(f"no entity upsert for {type(store).__name__}")


def _memory_upsert(store: MemoryStore, group_id: str, entities: list[EntityRecord]) -> None:
    now = now_utc()
    rows = [entity_row(group_id, e, store._dimension(), now) for e in entities]  # checked
    errors.check_entity_owners(group_id, store._owners(unique(r["uuid"] for r in rows)))
    store._upsert(group_id, entities, now)


async def _sqlite_upsert(store: SqliteStore, group_id: str, entities: list[EntityRecord]) -> None:
    rows = [entity_row(group_id, e, store._dimension(), now_utc()) for e in entities]

    def write(conn: sqlite3.Connection) -> None:
        with Transaction(conn):
            owners = stored_owners(conn, unique(r["uuid"] for r in rows))
            errors.check_entity_owners(group_id, owners)
            sqlite_writes.upsert_entities(conn, group_id, rows)

    await store.db.run(write)


async def _neo4j_upsert(store: Neo4jStore, group_id: str, entities: list[EntityRecord]) -> None:
    dim, now = await store._embedding_dim(), now_utc()
    rows = [with_epoch_times(entity_row(group_id, e, dim, now)) for e in entities]
    uuids = unique(r["uuid"] for r in rows)

    async def work(tx: Tx) -> None:
        owners = await tx.rows(neo4j_queries.ENTITY_GROUPS, {"uuids": uuids})
        errors.check_entity_owners(group_id, {r["uuid"]: r["group_id"] for r in owners})
        await tx.rows(neo4j_queries.UPSERT_ENTITIES, {"group_id": group_id, "rows": rows})

    await store.ex.write("upsert_entities", len(rows), work)
