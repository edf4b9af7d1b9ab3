"""What a forget reads and writes on the memory store (``roles.Forgetting``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from itertools import islice
from typing import TYPE_CHECKING

from tidegraph.records.changes import group_forgotten
from tidegraph.records.graph import (
    MAPPED,
    ChangeLog,
    EpisodeRecord,
    GroupHistory,
    GroupProfile,
    Rebuild,
)
from tidegraph.records.times import utc
from tidegraph.stores import errors
from tidegraph.stores.roles import Forgetting
from tidegraph.stores.rows import copied, entity_row, fact_row, now_utc

if TYPE_CHECKING:
    from tidegraph.stores.memory.store import MemoryStore


class MemoryForgetting(Forgetting):
    """``Forgetting`` on the memory store's dictionaries."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def group_history(self, group_id: str) -> GroupHistory:
        history = self._episodes_history(group_id, lambda _: True)
        history.entities = {
            u: copied(self.store._entities[u], community_uuid=None)
            for u in self.store._entities.by_group.get(group_id, ())
        }
        history.facts = {f.uuid: copied(f) for f in self.store._group_facts(group_id)}
        return history

    def _episodes_history(self, group_id: str, wanted: Callable[[str], bool]) -> GroupHistory:
        """The group's episodes ``wanted`` takes (by uuid), in the order their effects were
        written, with their mentions and created entities and the group's version."""
        episodes = sorted(
            (e for e in self.store._episodes.values() if e.group_id == group_id and wanted(e.uuid)),
            key=lambda e: (utc(e.extracted_at or e.created_at or e.valid_at), e.uuid),
        )
        uuids = {e.uuid for e in episodes}
        mentions: dict[str, list[str]] = {}
        for episode, entity in sorted(self.store._mentions):
            if episode in uuids:
                mentions.setdefault(episode, []).append(entity)
        log = self.store._logs.get(group_id)
        return GroupHistory(
            episodes=[e.model_copy(deep=True) for e in episodes],
            mentions=mentions,
            created={u: list(self.store._created.get(u, [])) for u in uuids},
            version=log.version if log is not None else 0,
        )

    async def history_part(
        self,
        group_id: str,
        episodes: list[str],
        mentioning: list[str],
        creating: list[str] | None = None,
    ) -> GroupHistory:
        wanted = set(episodes)
        entities = set(mentioning)
        wanted |= {p for p, e in self.store._mentions if e in entities}
        made = set(creating or ())
        wanted |= {p for p, created in self.store._created.items() if made & set(created)}
        return self._episodes_history(group_id, wanted.__contains__)

    def _extracted(self, group_id: str) -> Iterator[EpisodeRecord]:
        """The group's live extracted episodes (tombstones are no longer stored here)."""
        for episode in self.store._episodes.values():
            if episode.group_id == group_id and episode.not_extracted is None:
                yield episode

    async def group_profile(self, group_id: str) -> GroupProfile:
        extracted = list(self._extracted(group_id))
        return GroupProfile(
            judged=any(e.extraction and MAPPED not in e.extraction for e in extracted),
            without_extraction=any(e.extraction is None for e in extracted),
        )

    async def extracted_episodes(self, group_id: str, up_to: int) -> int:
        return sum(1 for _ in islice(self._extracted(group_id), up_to))

    async def apply_rebuild(self, group_id: str, rebuild: Rebuild) -> None:
        log = self.store._logs.get(group_id)
        if (log.version if log is not None else 0) != rebuild.version:
            raise errors.RebuildConflict(group_id)
        dim = self.store._dimension()
        now = now_utc()
        for entity in rebuild.entities:
            entity_row(group_id, entity, dim, now)  # checked: group, embedding
        for fact in rebuild.facts:
            fact_row(group_id, fact, dim, now)
        errors.check_entity_owners(group_id, self.store._owners(e.uuid for e in rebuild.entities))
        gone_episodes = set(rebuild.forgotten)
        gone_entities = set(rebuild.delete_entities)
        for uuid in gone_episodes:
            if (
                self.store._episodes.get(uuid) is not None
                and self.store._episodes[uuid].group_id == group_id
            ):
                del self.store._episodes[uuid]
                self.store._created.pop(uuid, None)
            self.store._forgotten[uuid] = (group_id, rebuild.forgotten_at)
        for uuid in rebuild.delete_facts:
            gone = self.store._facts.get(uuid)
            if gone is not None and gone.group_id == group_id:
                del self.store._facts[uuid]
        for uuid in gone_entities:
            if uuid in self.store._entities and self.store._entities[uuid].group_id == group_id:
                del self.store._entities[uuid]
        self.store._mentions = {
            (p, e)
            for p, e in self.store._mentions
            if p not in gone_episodes and e not in gone_entities and p not in rebuild.mentions
        }
        # Communities with a member removed or changed go (see the SQLite store's).
        touched = gone_entities | {e.uuid for e in rebuild.entities}
        stale = {
            c
            for c, e in self.store._members
            if e in touched and self.store._communities[c].group_id == group_id
        }
        for uuid in stale:
            del self.store._communities[uuid]
        self.store._members = {
            (c, e) for c, e in self.store._members if e not in gone_entities and c not in stale
        }
        for entity in rebuild.entities:
            self.store._entities[entity.uuid] = entity.model_copy(
                deep=True, update={"group_id": group_id, "community_uuid": None}
            )
        for fact in rebuild.facts:
            self.store._facts[fact.uuid] = fact.model_copy(deep=True, update={"group_id": group_id})
        for episode, entities in rebuild.mentions.items():
            self.store._mentions.update((episode, e) for e in entities)
        for episode, created in rebuild.created.items():
            self.store._created[episode] = list(created)
        self.store._purge_changes(group_id, rebuild.purged)
        self.store._record(group_id, rebuild.changes)

    async def forget_group(self, group_id: str, at: datetime, *, purge: bool = False) -> int:
        episodes = [u for u, e in self.store._episodes.items() if e.group_id == group_id]
        tombstones = {u: f for u, f in self.store._forgotten.items() if f[0] == group_id}
        log = self.store._logs.get(group_id)
        await self.delete_group(group_id)
        if not purge:
            self.store._forgotten.update(tombstones)
            self.store._forgotten.update((u, (group_id, at)) for u in episodes)
            self.store._logs[group_id] = log or ChangeLog(group_id)
            self.store._record(group_id, [group_forgotten(group_id, at)])
        return len(episodes)

    async def delete_group(self, group_id: str) -> None:
        episodes = {u for u, e in self.store._episodes.items() if e.group_id == group_id}
        entities = set(self.store._entities.by_group.get(group_id, ()))
        communities = {u for u, c in self.store._communities.items() if c.group_id == group_id}
        for uuid in [
            u
            for u, f in self.store._facts.items()
            if f.group_id == group_id or {f.source_uuid, f.target_uuid} & entities
        ]:
            del self.store._facts[uuid]
        # DETACH DELETE: the relationships of every node removed go with it.
        self.store._mentions = {
            (p, e) for p, e in self.store._mentions if p not in episodes and e not in entities
        }
        self.store._members = {
            (c, e) for c, e in self.store._members if c not in communities and e not in entities
        }
        for uuid in episodes:
            del self.store._episodes[uuid]
            self.store._created.pop(uuid, None)
        self.store._forgotten = {u: f for u, f in self.store._forgotten.items() if f[0] != group_id}
        self.store._logs.pop(group_id, None)
        self.store._changes.pop(group_id, None)
        for uuid in entities:
            del self.store._entities[uuid]
        for uuid in communities:
            del self.store._communities[uuid]
