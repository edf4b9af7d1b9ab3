"""The memory store's change outbox (``roles.Outbox``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from tidegraph.records.changes import Change, PublishedChange, published_form, stored_form
from tidegraph.records.graph import ChangeLog
from tidegraph.records.times import utc
from tidegraph.stores.roles import Outbox

if TYPE_CHECKING:
    from tidegraph.stores.memory.store import MemoryStore


class MemoryOutbox(Outbox):
    """``Outbox`` on the memory store's dictionaries."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def changes(self, group_id: str, after: int, limit: int) -> list[Change]:
        found = [c for c in self.store._changes.get(group_id, []) if c.seq > after]
        return [c.model_copy(deep=True) for c in found[: max(limit, 0)]]

    async def change_logs(
        self, group_ids: list[str] | None = None, *, unpublished: bool = False, own: bool = False
    ) -> list[ChangeLog]:
        wanted = {
            g: log
            for g, log in self.store._logs.items()
            if (group_ids is None or g in group_ids)
            and (not unpublished or log.seq > log.published)
            and (not own or log.deployment == self.store.deployment)
        }
        return [ChangeLog(**vars(log)) for _, log in sorted(wanted.items())]

    async def unpublished_changes(
        self, group_ids: list[str], per_group: int
    ) -> list[PublishedChange]:
        found: list[PublishedChange] = []
        for group_id in sorted(set(group_ids)):
            log = self.store._logs.get(group_id)
            if log is not None and log.deployment == self.store.deployment:
                found += [
                    PublishedChange(
                        c.group_id, c.seq, published_form(stored_form(c), c.seq), c.change_id
                    )
                    for c in await self.changes(group_id, log.published, per_group)
                ]
        return found

    async def mark_published(self, acknowledged: Sequence[PublishedChange]) -> None:
        for change in acknowledged:
            log = self.store._logs.get(change.group_id)
            stored = {c.seq: c.change_id for c in self.store._changes.get(change.group_id, [])}
            if (
                log is not None
                and log.deployment == self.store.deployment
                and stored.get(change.seq) == change.change_id
            ):
                log.published = max(log.published, change.seq)

    async def prune_changes(
        self, group_id: str, before: datetime, *, published_only: bool = True
    ) -> int:
        log = self.store._logs.get(group_id)
        published = log.published if log is not None else 0
        outbox = self.store._changes.get(group_id, [])
        gone = [
            (not published_only or c.seq <= published)
            and (c.committed_at is None or utc(c.committed_at) < utc(before))
            for c in outbox
        ]
        self.store._changes[group_id] = [c for c, out in zip(outbox, gone, strict=True) if not out]
        dropped = [c.seq for c, out in zip(outbox, gone, strict=True) if out]
        self.store._skip_dropped(group_id, dropped)
        return len(dropped)
