"""Browsing a group on the memory store (``roles.Browsing``)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import (
    EntityRecord,
    EpisodeDetail,
    EpisodeEntry,
    EpisodeState,
    FactView,
)
from tidegraph.records.times import utc
from tidegraph.stores.roles import Browsing
from tidegraph.stores.rows import fact_view, page_of, sort_views

if TYPE_CHECKING:
    from tidegraph.stores.memory.store import MemoryStore


class MemoryBrowsing(Browsing):
    """``Browsing`` on the memory store's dictionaries."""

    def __init__(self, store: MemoryStore) -> None:
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
        entries: list[EpisodeEntry] = []
        if status == "forgotten":
            for uuid, (group, at) in self.store._forgotten.items():
                if group == group_id:
                    entries.append(
                        EpisodeEntry(uuid, "", "", "", at, None, "forgotten", forgotten_at=at)
                    )
        else:
            for e in self.store._episodes.values():
                state: EpisodeState = "written" if e.not_extracted is None else "not_extracted"
                if e.group_id != group_id or status not in (None, state):
                    continue
                entries.append(
                    EpisodeEntry(
                        e.uuid, e.producer_id, e.name, e.source, utc(e.valid_at), e.created_at,
                        state, e.not_extracted, e.content,
                    )
                )  # fmt: skip
        return page_of(entries, since, until, after, limit)

    async def episode_detail(self, group_id: str, episode_uuid: str) -> EpisodeDetail | None:
        if self.store._forgotten.get(episode_uuid, ("", None))[0] == group_id:
            at = self.store._forgotten[episode_uuid][1]
            entry = EpisodeEntry(episode_uuid, "", "", "", at, None, "forgotten", forgotten_at=at)
            return EpisodeDetail(entry)
        e = self.store._episodes.get(episode_uuid)
        if e is None or e.group_id != group_id:
            return None
        state: EpisodeState = "written" if e.not_extracted is None else "not_extracted"
        entry = EpisodeEntry(
            e.uuid, e.producer_id, e.name, e.source, utc(e.valid_at), e.created_at, state,
            e.not_extracted, e.content,
        )  # fmt: skip
        mentions = sorted(entity for ep, entity in self.store._mentions if ep == episode_uuid)
        return EpisodeDetail(entry, mentions)

    async def counts(self, group_id: str) -> dict[str, int]:
        episodes = {u for u, e in self.store._episodes.items() if e.group_id == group_id}
        return {
            "episodes": len(episodes),
            "entities": len(self.store._entities.by_group.get(group_id, ())),
            "facts": sum(1 for _ in self.store._group_facts(group_id)),
            "mentions": sum(1 for episode, _ in self.store._mentions if episode in episodes),
        }

    async def facts_as_of(self, group_id: str, asof: AsOf) -> list[FactView]:
        producers = {
            u: e.producer_id for u, e in self.store._episodes.items() if e.group_id == group_id
        }
        views = []
        for fact in self.store._believed(group_id, asof):
            subject = self.store._entities[fact.source_uuid].name
            obj = self.store._entities[fact.target_uuid].name
            views.append((fact_view(fact, subject, obj, producers, asof), fact))
        return sort_views(views)

    async def list_entities(self, group_id: str) -> list[EntityRecord]:
        return self.store._group_entities(group_id)
