"""The embedded store's communities (docs/communities.md "Communities"): the valid-fact graph
the label propagation reads, neighbour weights for a new entity's assignment, and the
communities with their memberships, written in one transaction each. ``SqliteStore.communities``,
over its database."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import CommunityRecord, WeightedEdge
from tidegraph.stores import errors
from tidegraph.stores.executor import observe_write
from tidegraph.stores.roles import Communities
from tidegraph.stores.rows import (
    community_rows,
    fold_communities,
    fold_edges,
    neighbour_weights_of,
    now_utc,
    unique,
)
from tidegraph.stores.sqlite import write_sql
from tidegraph.stores.sqlite.db import (
    Transaction,
    ids,
    json_text,
)
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.rows import COMMUNITY_OF, IN_LIST, believed_facts
from tidegraph.stores.sqlite.writes import delete_communities, index_text, stored_owners

if TYPE_CHECKING:
    from tidegraph.stores.sqlite.store import SqliteStore


class SqliteCommunities(Communities):
    """``Communities`` on the embedded store's database."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    async def entity_graph(
        self, group_id: str, at: datetime | None = None
    ) -> tuple[list[str], list[WeightedEdge]]:
        asof = AsOf.resolve(at, None, False, None)

        def read(conn: sqlite3.Connection) -> tuple[list[str], list[WeightedEdge]]:
            nodes = ids(conn, "SELECT uuid FROM entity WHERE group_id = ? ORDER BY uuid", group_id)
            facts = believed_facts(conn, group_id, asof, None, ends_only=True)
            edges = fold_edges((f.source_uuid, f.target_uuid, 1) for f in facts)
            return nodes, [WeightedEdge(a, b, w) for a, b, w in edges]

        return await self.store.db.run(read)

    async def neighbour_weights_many(
        self, group_id: str, entity_uuids: list[str], at: datetime | None = None
    ) -> list[dict[str, int]]:
        if not entity_uuids:
            return []
        asof = AsOf.resolve(at, None, False, None)

        def read(conn: sqlite3.Connection) -> list[dict[str, int]]:
            facts = believed_facts(conn, group_id, asof, unique(entity_uuids), ends_only=True)
            return [
                neighbour_weights_of(
                    uuid,
                    (
                        (f.source_uuid, f.target_uuid, 1)
                        for f in facts
                        if uuid in (f.source_uuid, f.target_uuid)
                    ),
                )
                for uuid in entity_uuids
            ]

        return await self.store.db.run(read)

    async def communities_of(self, group_id: str, entity_uuids: list[str]) -> dict[str, str | None]:
        def read(conn: sqlite3.Connection) -> dict[str, str | None]:
            query = (
                f"SELECT e.uuid, {COMMUNITY_OF} FROM entity e "
                f"WHERE +e.group_id = ? AND e.uuid {IN_LIST}"
            )
            return dict(conn.execute(query, (group_id, json_text(entity_uuids))).fetchall())

        return await self.store.db.run(read) if entity_uuids else {}

    async def list_communities(self, group_id: str) -> list[CommunityRecord]:
        def read(conn: sqlite3.Connection) -> list[CommunityRecord]:
            heads = conn.execute(
                "SELECT uuid, name, summary FROM community WHERE group_id = ?", (group_id,)
            )
            members = conn.execute(
                "SELECT community_uuid, entity_uuid FROM member WHERE group_id = ?", (group_id,)
            )
            folded = fold_communities(list(heads), list(members))
            return [CommunityRecord(u, n, s, m) for u, n, s, m in folded]

        return await self.store.db.run(read)

    async def write_communities(
        self, group_id: str, upserts: list[CommunityRecord], deletes: list[str]
    ) -> None:
        if not upserts and not deletes:
            return
        rows, memberships, members = community_rows(upserts, self.store._dimension(), now_utc())

        def write(conn: sqlite3.Connection) -> None:
            with Transaction(conn):
                named = unique([*(r["uuid"] for r in rows), *deletes])
                query = f"SELECT uuid, group_id FROM community WHERE uuid {IN_LIST}"
                errors.check_community_owners(
                    group_id, dict(conn.execute(query, (json_text(named),)).fetchall())
                )
                delete_communities(conn, group_id, unique(deletes))
                for row in rows:
                    _upsert_community(conn, group_id, row)
                if rows:  # the upserted communities' members are replaced, and leave others
                    conn.execute(
                        f"DELETE FROM member WHERE group_id = ? AND (community_uuid {IN_LIST} "
                        f"OR entity_uuid {IN_LIST})",
                        (group_id, json_text(r["uuid"] for r in rows), json_text(members)),
                    )
                owned = set(stored_owners(conn, members).items())
                conn.executemany(
                    "INSERT OR IGNORE INTO member (community_uuid, entity_uuid, group_id) "
                    "VALUES (?, ?, ?)",
                    [
                        (m["community"], m["entity"], group_id)
                        for m in memberships
                        if (m["entity"], group_id) in owned
                    ],
                )

        with observe_write("write_communities", len(rows) + len(memberships)):
            await self.store.db.run(write)

    async def assign_members(self, group_id: str, assignments: list[tuple[str, str]]) -> None:
        if not assignments:
            return

        def write(conn: sqlite3.Connection) -> None:
            with Transaction(conn):
                for community_uuid, entity_uuid in assignments:
                    found = conn.execute(
                        "SELECT (SELECT count(*) FROM community WHERE uuid = ? AND group_id = ?) "
                        "* (SELECT count(*) FROM entity WHERE uuid = ? AND group_id = ?)",
                        (community_uuid, group_id, entity_uuid, group_id),
                    ).fetchone()[0]
                    if not found:
                        continue
                    conn.execute(
                        "DELETE FROM member WHERE entity_uuid = ? AND group_id = ?",
                        (entity_uuid, group_id),
                    )
                    conn.execute(
                        "INSERT INTO member (community_uuid, entity_uuid, group_id) "
                        "VALUES (?, ?, ?)",
                        (community_uuid, entity_uuid, group_id),
                    )

        with observe_write("assign_member", len(assignments)):
            await self.store.db.run(write)


def _upsert_community(conn: sqlite3.Connection, group_id: str, row: dict[str, Any]) -> None:
    """MERGE one community row (``rows.community_rows``) by ``write_rules.COMMUNITY``."""
    row_id = write_sql.upsert(conn, "community", write_sql.UPSERT_COMMUNITY, group_id, row)
    index_text(conn, "community_text", row_id, group_id, f"{row['name']} {row['summary']}")
