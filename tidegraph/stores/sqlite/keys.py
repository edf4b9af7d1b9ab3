"""``roles.Keys`` on the embedded store (``tidegraph/stores/keys.py``): the table
``group_key``, made at first use. Erasing a group's keys zeroes their bytes
(``secure_delete``) and truncates the write-ahead log (``erasure.truncate_log``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidegraph.records.sealed import DataKey
from tidegraph.stores.roles import Keys
from tidegraph.stores.sqlite.db import Transaction, micros, time_of
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.erasure import truncate_log

if TYPE_CHECKING:
    from tidegraph.stores.sqlite.store import SqliteStore

_TABLE = """CREATE TABLE IF NOT EXISTS group_key (
    group_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    secret BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (group_id, key_id)) WITHOUT ROWID"""


class SqliteKeys(Keys):
    """``Keys`` in the embedded store's database."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    async def group_keys(self, group_id: str) -> list[DataKey]:
        def read(conn: sqlite3.Connection) -> list[DataKey]:
            conn.execute(_TABLE)
            rows = conn.execute(
                "SELECT key_id, secret, created_at FROM group_key WHERE group_id = ? "
                "ORDER BY created_at, key_id",
                (group_id,),
            )
            return [DataKey(k, bytes(s), time_of(at)) for k, s, at in rows]  # type: ignore[arg-type]

        return await self.store.db.run(read)

    async def add_group_key(self, group_id: str, key: DataKey) -> None:
        def write(conn: sqlite3.Connection) -> None:
            conn.execute(_TABLE)
            with Transaction(conn):
                conn.execute(
                    "INSERT OR IGNORE INTO group_key (group_id, key_id, secret, created_at) "
                    "VALUES (?, ?, ?, ?)",
                    (group_id, key.key_id, key.secret, micros(key.created_at)),
                )

        await self.store.db.run(write)

    async def erase_group_keys(self, group_id: str) -> int:
        def write(conn: sqlite3.Connection) -> int:
            conn.execute(_TABLE)
            with Transaction(conn):
                erased = conn.execute(
                    "DELETE FROM group_key WHERE group_id = ?", (group_id,)
                ).rowcount
            truncate_log(conn, self.store.db.path)
            return int(erased)

        return await self.store.db.run(write)
