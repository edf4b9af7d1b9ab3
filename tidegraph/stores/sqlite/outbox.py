"""The embedded store's change outbox (``roles.Outbox``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from tidegraph.records.changes import Change, PublishedChange
from tidegraph.records.graph import ChangeLog
from tidegraph.stores.roles import Outbox
from tidegraph.stores.rows import change_of, published_change
from tidegraph.stores.sqlite.db import Transaction, json_text, micros
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.rows import IN_LIST
from tidegraph.stores.sqlite.writes import skip_dropped

if TYPE_CHECKING:
    from tidegraph.stores.sqlite.store import SqliteStore


class SqliteOutbox(Outbox):
    """``Outbox`` on the embedded store's database."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    async def changes(self, group_id: str, after: int, limit: int) -> list[Change]:
        def read(conn: sqlite3.Connection) -> list[Change]:
            rows = conn.execute(
                "SELECT body, seq FROM change WHERE group_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (group_id, after, max(limit, 0)),
            )
            return [change_of(body, seq) for body, seq in rows]

        return await self.store.db.run(read)

    async def change_logs(
        self, group_ids: list[str] | None = None, *, unpublished: bool = False, own: bool = False
    ) -> list[ChangeLog]:
        def read(conn: sqlite3.Connection) -> list[ChangeLog]:
            rows = conn.execute(
                "SELECT group_id, seq, published, version, deployment FROM change_log "
                "WHERE (:groups IS NULL OR group_id IN (SELECT value FROM json_each(:groups))) "
                "AND (NOT :unpublished OR seq > published) "
                "AND (NOT :own OR deployment = :deployment) ORDER BY group_id",
                {
                    "groups": None if group_ids is None else json_text(group_ids),
                    "unpublished": unpublished,
                    "own": own,
                    "deployment": self.store.deployment,
                },
            )
            return [ChangeLog(*row) for row in rows]

        return await self.store.db.run(read)

    async def unpublished_changes(
        self, group_ids: list[str], per_group: int
    ) -> list[PublishedChange]:
        def read(conn: sqlite3.Connection) -> list[PublishedChange]:
            rows = conn.execute(
                "SELECT group_id, body, seq, change_id FROM (SELECT c.body, c.seq, c.group_id, "
                "c.change_id, "
                "row_number() OVER "
                "(PARTITION BY c.group_id ORDER BY c.seq) AS n FROM change c "
                "JOIN change_log log ON log.group_id = c.group_id "
                f"WHERE log.group_id {IN_LIST} AND log.deployment = ? "
                "AND c.seq > log.published) WHERE n <= ? ORDER BY group_id, seq",
                (json_text(sorted(set(group_ids))), self.store.deployment, max(per_group, 0)),
            )
            return [published_change(*row) for row in rows]

        return await self.store.db.run(read)

    async def mark_published(self, acknowledged: Sequence[PublishedChange]) -> None:
        def write(conn: sqlite3.Connection) -> None:
            with Transaction(conn):
                conn.executemany(
                    "UPDATE change_log SET published = max(published, :seq) "
                    "WHERE group_id = :group AND deployment = :deployment AND EXISTS "
                    "(SELECT 1 FROM change WHERE group_id = :group AND seq = :seq "
                    "AND change_id = :change_id)",
                    [
                        {
                            "group": c.group_id,
                            "seq": c.seq,
                            "change_id": c.change_id,
                            "deployment": self.store.deployment,
                        }
                        for c in acknowledged
                    ],
                )

        if acknowledged:
            await self.store.db.run(write)

    async def prune_changes(
        self, group_id: str, before: datetime, *, published_only: bool = True
    ) -> int:
        def write(conn: sqlite3.Connection) -> int:
            with Transaction(conn):
                dropped = [
                    seq
                    for (seq,) in conn.execute(
                        "DELETE FROM change WHERE group_id = ? AND coalesce(committed_at, 0) < ? "
                        "AND (NOT ? OR seq <= "
                        "(SELECT published FROM change_log WHERE group_id = ?)) RETURNING seq",
                        (group_id, micros(before), published_only, group_id),
                    )
                ]
                skip_dropped(conn, group_id, dropped)
                return len(dropped)

        return await self.store.db.run(write)
