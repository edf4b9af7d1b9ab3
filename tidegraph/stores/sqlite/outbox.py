"""The embedded store's change outbox (``roles.Outbox``): the ``change`` table, a row per
write (``tidegraph.stores.rows.outbox_row``) found by (group, last)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from tidegraph.records.changes import Change, PublishedChange
from tidegraph.records.graph import ChangeLog
from tidegraph.stores.roles import Outbox
from tidegraph.stores.rows import row_changes, row_published, stored_changes
from tidegraph.stores.sqlite.db import Transaction, json_text, micros
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.writes import skip_dropped, unindex_records

if TYPE_CHECKING:
    from tidegraph.stores.sqlite.store import SqliteStore

# Rows read at a time while a page of changes is not full (each holds one or more).
ROWS_PER_READ = 64


def _rows_after(
    conn: sqlite3.Connection, group_id: str, after: int, limit: int
) -> list[tuple[int, str, str]]:
    """The group's rows holding changes numbered past ``after`` (seq, change ids, bodies), in
    order, as many as hold ``limit`` changes (or all there are)."""
    found: list[tuple[int, str, str]] = []
    held, past = 0, after
    while held < limit:
        rows = conn.execute(
            "SELECT seq, last, change_id, body FROM change WHERE group_id = ? AND last > ? "
            "ORDER BY last LIMIT ?",
            (group_id, past, ROWS_PER_READ),
        ).fetchall()
        for seq, last, change_ids, body in rows:
            found.append((seq, change_ids, body))
            held += sum(1 for s, _, _ in stored_changes(seq, change_ids, body) if s > after)
            past = last
            if held >= limit:
                break
        if len(rows) < ROWS_PER_READ:
            break
    return found


class SqliteOutbox(Outbox):
    """``Outbox`` on the embedded store's database."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    async def changes(self, group_id: str, after: int, limit: int) -> list[Change]:
        def read(conn: sqlite3.Connection) -> list[Change]:
            found = [
                change
                for seq, change_ids, body in _rows_after(conn, group_id, after, limit)
                for change in row_changes(seq, change_ids, body, after)
            ]
            return found[: max(limit, 0)]

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
            logs = conn.execute(
                "SELECT group_id, published FROM change_log WHERE group_id IN "
                "(SELECT value FROM json_each(?)) AND deployment = ? AND seq > published "
                "ORDER BY group_id",
                (json_text(sorted(set(group_ids))), self.store.deployment),
            ).fetchall()
            found: list[PublishedChange] = []
            for group_id, published in logs:
                group = [
                    change
                    for seq, change_ids, body in _rows_after(conn, group_id, published, per_group)
                    for change in row_published(group_id, seq, change_ids, body, published)
                ]
                found += group[: max(per_group, 0)]
            return found

        return await self.store.db.run(read)

    async def mark_published(self, acknowledged: Sequence[PublishedChange]) -> None:
        def write(conn: sqlite3.Connection) -> None:
            with Transaction(conn):
                for c in acknowledged:
                    row = conn.execute(
                        "SELECT seq, change_id, body FROM change "
                        "WHERE group_id = ? AND last >= ? ORDER BY last LIMIT 1",
                        (c.group_id, c.seq),
                    ).fetchone()
                    stored = {} if row is None else {s: i for s, i, _ in stored_changes(*row)}
                    if stored.get(c.seq) != c.change_id:
                        continue  # not the change stored at its seq: the cursor stays
                    conn.execute(
                        "UPDATE change_log SET published = max(published, ?) "
                        "WHERE group_id = ? AND deployment = ?",
                        (c.seq, c.group_id, self.store.deployment),
                    )

        if acknowledged:
            await self.store.db.run(write)

    async def prune_changes(
        self, group_id: str, before: datetime, *, published_only: bool = True
    ) -> int:
        def write(conn: sqlite3.Connection) -> int:
            with Transaction(conn):
                dropped = conn.execute(
                    "DELETE FROM change WHERE group_id = ? AND coalesce(committed_at, 0) < ? "
                    "AND (NOT ? OR last <= "
                    "(SELECT published FROM change_log WHERE group_id = ?)) "
                    "RETURNING seq, last, change_id, body, uuid",
                    (group_id, micros(before), published_only, group_id),
                ).fetchall()
                unindex_records(conn, group_id, [(last, uuids) for _, last, _, _, uuids in dropped])
                skip_dropped(conn, group_id, [last for _, last, _, _, _ in dropped])
                return sum(len(stored_changes(seq, ids, body)) for seq, _, ids, body, _ in dropped)

        return await self.store.db.run(write)
