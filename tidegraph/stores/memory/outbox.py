"""The memory store's change outbox (``roles.Outbox``): per group its rows, one per write
(``tidegraph.stores.rows.outbox_row``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from tidegraph.records.changes import Change, PublishedChange
from tidegraph.records.graph import ChangeLog
from tidegraph.stores.roles import Outbox
from tidegraph.stores.rows import epoch_micros, row_changes, row_published, stored_changes

if TYPE_CHECKING:
    from tidegraph.stores.memory.store import MemoryStore


class MemoryOutbox(Outbox):
    """``Outbox`` on the memory store's dictionaries."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def changes(self, group_id: str, after: int, limit: int) -> list[Change]:
        found: list[Change] = []
        for row in self.store._changes.get(group_id, []):
            if len(found) >= limit:
                break
            if row["last"] > after:
                found += row_changes(row["seq"], row["change_id"], row["body"], after)
        return found[: max(limit, 0)]

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
            if log is None or log.deployment != self.store.deployment:
                continue
            group: list[PublishedChange] = []
            for row in self.store._changes.get(group_id, []):
                if len(group) >= per_group:
                    break
                if row["last"] > log.published:
                    group += row_published(
                        group_id, row["seq"], row["change_id"], row["body"], log.published
                    )
            found += group[: max(per_group, 0)]
        return found

    async def mark_published(self, acknowledged: Sequence[PublishedChange]) -> None:
        for change in acknowledged:
            log = self.store._logs.get(change.group_id)
            stored = {
                seq: change_id
                for row in self.store._changes.get(change.group_id, [])
                if row["seq"] <= change.seq <= row["last"]
                for seq, change_id, _ in stored_changes(row["seq"], row["change_id"], row["body"])
            }
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
        cutoff = epoch_micros(before)
        outbox = self.store._changes.get(group_id, [])
        gone = [
            (not published_only or row["last"] <= published) and row["committed_at"] < cutoff
            for row in outbox
        ]
        self.store._changes[group_id] = [r for r, out in zip(outbox, gone, strict=True) if not out]
        dropped = [r for r, out in zip(outbox, gone, strict=True) if out]
        self.store._skip_dropped(group_id, [r["last"] for r in dropped])
        return sum(len(stored_changes(r["seq"], r["change_id"], r["body"])) for r in dropped)
