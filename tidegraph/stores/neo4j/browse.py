"""Browsing a group on Neo4j (``roles.Browsing``): episodes, facts as of a time, entities,
counts."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import (
    EntityRecord,
    EpisodeDetail,
    EpisodeEntry,
    EpisodeState,
    FactView,
)
from tidegraph.records.times import utc
from tidegraph.stores.neo4j import lifecycle_queries as lq
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.roles import Browsing
from tidegraph.stores.rows import fact_view, sort_views, to_utc

if TYPE_CHECKING:
    from tidegraph.stores.neo4j.store import Neo4jStore


class Neo4jBrowsing(Browsing):
    """``Browsing`` on the Neo4j store's executor."""

    def __init__(self, store: Neo4jStore) -> None:
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
        forgotten = status == "forgotten"
        query = lq.list_episodes_query(
            forgotten=forgotten,
            status=status,
            ranged=(since is not None, until is not None),
            paged=after is not None,
        )
        params: dict[str, Any] = {"group_id": group_id, "limit": max(limit, 0)}
        if since is not None:
            params["since"] = utc(since)
        if until is not None:
            params["until"] = utc(until)
        if after is not None:
            params["after_at"], params["after_uuid"] = utc(after[0]), after[1]
        return [_entry(r) for r in await self.store.ex.rows(query, params)]

    async def episode_detail(self, group_id: str, episode_uuid: str) -> EpisodeDetail | None:
        params = {"group_id": group_id, "uuid": episode_uuid}
        rows = await self.store.ex.rows(lq.EPISODE_DETAIL, params)
        if not rows:
            return None
        return EpisodeDetail(_entry(rows[0]), sorted(rows[0]["mentions"]))

    async def counts(self, group_id: str) -> dict[str, int]:
        found: dict[str, int] = {}
        for query in q.COUNTS:
            [row] = await self.store.ex.rows(query, {"group_id": group_id})
            found.update({name: int(value) for name, value in row.items()})
        return {name: found[name] for name in ("episodes", "entities", "facts", "mentions")}

    async def list_entities(self, group_id: str) -> list[EntityRecord]:
        return await self.store._entities(group_id, q.LIST_ENTITIES)

    async def facts_as_of(self, group_id: str, asof: AsOf) -> list[FactView]:
        rows = await self.store._believed(group_id, asof)
        producers = await self.store._producers(
            group_id, (u for r in rows for u in r["fact"].episodes)
        )
        return sort_views(
            (fact_view(r["fact"], r["subject"], r["object"], producers, asof), r["fact"])
            for r in rows
        )


def _entry(r: dict[str, Any]) -> EpisodeEntry:
    """A listing's row: the episode, or its tombstone (then its time is when it was
    forgotten)."""
    gone = to_utc(r["forgotten_at"])
    state: EpisodeState = (
        "forgotten" if gone else "written" if r["not_extracted"] is None else "not_extracted"
    )
    return EpisodeEntry(
        uuid=r["uuid"],
        producer_id=r["producer_id"] or "",
        name=r["name"] or "",
        source=r["source"] or "",
        valid_at=gone or to_utc(r["valid_at"]),
        created_at=to_utc(r["created_at"]),
        status=state,
        not_extracted=r["not_extracted"],
        content=r["content"] or "",
        forgotten_at=gone,
    )
