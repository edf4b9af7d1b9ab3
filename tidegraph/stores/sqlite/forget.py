"""What a forget reads and writes on the embedded store (``roles.Forgetting``)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from tidegraph.records.graph import GroupHistory, GroupProfile, Rebuild
from tidegraph.stores.executor import observe_write
from tidegraph.stores.roles import Forgetting
from tidegraph.stores.rows import entity_row, fact_row, now_utc
from tidegraph.stores.sqlite.db import Transaction
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.erasure import truncate_log
from tidegraph.stores.sqlite.lifecycle import (
    apply_rebuild,
    extracted_episodes,
    forget_group,
    group_history,
    group_profile,
    history_part,
)

if TYPE_CHECKING:
    from tidegraph.stores.sqlite.store import SqliteStore


class SqliteForgetting(Forgetting):
    """``Forgetting`` on the embedded store's database."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    async def group_history(self, group_id: str) -> GroupHistory:
        return await self.store.db.run(group_history, group_id)

    async def history_part(
        self,
        group_id: str,
        episodes: list[str],
        mentioning: list[str],
        creating: list[str] | None = None,
    ) -> GroupHistory:
        return await self.store.db.run(
            history_part, group_id, episodes, mentioning, list(creating or ())
        )

    async def group_profile(self, group_id: str) -> GroupProfile:
        return await self.store.db.run(group_profile, group_id)

    async def extracted_episodes(self, group_id: str, up_to: int) -> int:
        return await self.store.db.run(extracted_episodes, group_id, up_to)

    async def apply_rebuild(self, group_id: str, rebuild: Rebuild) -> None:
        dim = self.store._dimension()
        now = now_utc()
        entities = [entity_row(group_id, e, dim, now) for e in rebuild.entities]
        facts = [fact_row(group_id, f, dim, now) for f in rebuild.facts]

        def write(conn: sqlite3.Connection) -> None:
            with Transaction(conn):
                apply_rebuild(conn, group_id, rebuild, entities, facts, self.store.deployment)
            truncate_log(conn, self.store.db.path)

        with observe_write("apply_rebuild", len(entities) + len(facts) + len(rebuild.forgotten)):
            await self.store.db.run(write)

    async def forget_group(self, group_id: str, at: datetime, *, purge: bool = False) -> int:
        def write(conn: sqlite3.Connection) -> int:
            with Transaction(conn):
                forgotten = forget_group(conn, group_id, at, purge, self.store.deployment)
            truncate_log(conn, self.store.db.path)
            return forgotten

        with observe_write("forget_group", 1):
            return await self.store.db.run(write)

    async def delete_group(self, group_id: str) -> None:
        def delete(conn: sqlite3.Connection) -> None:
            with Transaction(conn):
                for table, kind in (
                    ("fact_text", "fact"),
                    ("entity_text", "entity"),
                    ("episode_search", "episode"),
                    ("community_text", "community"),
                ):
                    conn.execute(
                        f"DELETE FROM {table} WHERE rowid IN "
                        f"(SELECT id FROM {kind} WHERE group_id = ?)",
                        (group_id,),
                    )
                for table in (
                    "fact",
                    "speaker_word",
                    "mention",
                    "member",
                    "entity_name",
                    "entity",
                    "episode",
                    "community",
                    "change",
                    "change_record",
                    "change_log",
                ):
                    conn.execute(f"DELETE FROM {table} WHERE group_id = ?", (group_id,))
            truncate_log(conn, self.store.db.path)

        with observe_write("delete_group", 1):
            await self.store.db.run(delete)
