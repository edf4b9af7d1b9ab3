"""Browsing a group on the embedded store (``roles.Browsing``)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import EntityRecord, EpisodeDetail, EpisodeEntry, FactView
from tidegraph.stores.roles import Browsing
from tidegraph.stores.rows import fact_view, sort_entities, sort_views
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.lifecycle import episode_detail, list_episodes
from tidegraph.stores.sqlite.rows import (
    ENTITY_FULL,
    believed_facts,
    entity_of,
    names_of,
    producers_of,
)

if TYPE_CHECKING:
    from tidegraph.stores.sqlite.store import SqliteStore


class SqliteBrowsing(Browsing):
    """``Browsing`` on the embedded store's database."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    async def list_episodes(
        self,
        group_id: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        status: str | None = None,
        after: tuple[datetime, str] | None = None,
        limit: int = 100,
    ) -> list[EpisodeEntry]:
        return await self.store.db.run(
            list_episodes, group_id, since, until, status, after, max(limit, 0)
        )

    async def episode_detail(self, group_id: str, episode_uuid: str) -> EpisodeDetail | None:
        return await self.store.db.run(episode_detail, group_id, episode_uuid)

    async def counts(self, group_id: str) -> dict[str, int]:
        def read(conn: sqlite3.Connection) -> dict[str, int]:
            tables = {
                "episodes": "episode",
                "entities": "entity",
                "facts": "fact",
                "mentions": "mention",
            }
            counts = {
                name: conn.execute(
                    f"SELECT count(*) FROM {table} WHERE group_id = ?", (group_id,)
                ).fetchone()[0]
                for name, table in tables.items()
            }
            [tombstones] = conn.execute(
                "SELECT count(*) FROM episode WHERE group_id = ? AND forgotten_at IS NOT NULL",
                (group_id,),
            ).fetchone()
            counts["episodes"] -= tombstones  # a forgotten episode's tombstone is not one
            return counts

        return await self.store.db.run(read)

    async def facts_as_of(self, group_id: str, asof: AsOf) -> list[FactView]:
        def read(conn: sqlite3.Connection) -> list[FactView]:
            about = None if asof.entity_uuid is None else [asof.entity_uuid]
            facts = believed_facts(conn, group_id, asof, about)
            names = names_of(conn, (u for f in facts for u in (f.source_uuid, f.target_uuid)))
            producers = producers_of(conn, group_id, (u for f in facts for u in f.episodes))
            return sort_views(
                (fact_view(f, names[f.source_uuid], names[f.target_uuid], producers, asof), f)
                for f in facts
            )

        return await self.store.db.run(read)

    async def list_entities(self, group_id: str) -> list[EntityRecord]:
        def read(conn: sqlite3.Connection) -> list[EntityRecord]:
            query = f"SELECT {ENTITY_FULL} FROM entity e WHERE e.group_id = ?"
            return sort_entities(map(entity_of, conn.execute(query, (group_id,))))

        return await self.store.db.run(read)
