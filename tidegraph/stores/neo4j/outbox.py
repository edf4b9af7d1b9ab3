"""The Neo4j store's change outbox (``roles.Outbox``): a ``Change`` node per write of a group
(``tidegraph.stores.rows.outbox_row``); the queries are in ``lifecycle_queries``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tidegraph.records.changes import Change, PublishedChange
from tidegraph.records.graph import ChangeLog
from tidegraph.stores.executor import Tx
from tidegraph.stores.neo4j import lifecycle_queries as lq
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j.plans import NO_RECORD, PLANS_AHEAD_GROUP
from tidegraph.stores.roles import Outbox
from tidegraph.stores.rows import epoch_micros, joined_body, row_changes, row_published

if TYPE_CHECKING:
    from tidegraph.stores.neo4j.store import Neo4jStore

ROWS_PER_READ = 64  # outbox rows read at a time while a page of changes is not full


class Neo4jOutbox(Outbox):
    """``Outbox`` on the Neo4j store's executor."""

    def __init__(self, store: Neo4jStore) -> None:
        self.store = store

    async def changes(self, group_id: str, after: int, limit: int) -> list[Change]:
        found: list[Change] = []
        past = after
        while len(found) < limit:
            params = {"group_id": group_id, "after": past, "rows": ROWS_PER_READ}
            rows = await self.store.ex.rows(lq.CHANGES, params)
            for r in rows:
                found += row_changes(int(r["seq"]), r["change_ids"], _body(r), after)
                past = int(r["last"])
                if len(found) >= limit:
                    break
            if len(rows) < ROWS_PER_READ:
                break
        return found[: max(limit, 0)]

    async def change_logs(
        self, group_ids: list[str] | None = None, *, unpublished: bool = False, own: bool = False
    ) -> list[ChangeLog]:
        params = {
            "groups": group_ids,
            "unpublished": unpublished,
            "own": own,
            "deployment": self.store.deployment,
        }
        rows = await self.store.ex.rows(lq.CHANGE_LOGS, params)
        return [
            ChangeLog(
                r["group_id"],
                int(r["seq"]),
                int(r["published"]),
                int(r["version"]),
                r["deployment"],
            )  # fmt: skip
            for r in rows
        ]

    async def unpublished_changes(
        self, group_ids: list[str], per_group: int
    ) -> list[PublishedChange]:
        params = {
            "groups": sorted(set(group_ids)),
            "limit": max(per_group, 0),
            "deployment": self.store.deployment,
        }
        rows = await self.store.ex.rows(lq.UNPUBLISHED_CHANGES, params)
        found: dict[str, list[PublishedChange]] = {}
        for r in rows:
            found.setdefault(r["group_id"], []).extend(
                row_published(
                    r["group_id"], int(r["seq"]), r["change_ids"], _body(r), int(r["published"])
                )
            )
        return [c for group in found.values() for c in group[: max(per_group, 0)]]

    async def mark_published(self, acknowledged: Sequence[PublishedChange]) -> None:
        rows = [
            {"group_id": c.group_id, "seq": c.seq, "change_id": c.change_id} for c in acknowledged
        ]

        async def work(tx: Tx) -> None:
            await tx.rows(lq.MARK_PUBLISHED, {"cursors": rows, "deployment": self.store.deployment})

        if rows:
            await self.store.ex.write("mark_published", len(rows), work)

    async def plan_ahead(self) -> None:
        """Has Neo4j plan the relay's statements (``plans``), which run every relay round:
        its reads on a group no one has, moving a cursor in a transaction that is rolled
        back."""
        group_id = PLANS_AHEAD_GROUP
        await self.change_logs([group_id], unpublished=True, own=True)
        await self.unpublished_changes([group_id], 1)
        cursor = {"group_id": group_id, "seq": 1, "change_id": NO_RECORD}
        params = {"cursors": [cursor], "deployment": self.store.deployment}

        async def work(tx: Tx) -> None:
            await tx.rows(lq.MARK_PUBLISHED, params)

        await self.store.ex.rehearse(work)

    async def prune_changes(
        self, group_id: str, before: datetime, *, published_only: bool = True
    ) -> int:
        params = {
            "group_id": group_id,
            "before": epoch_micros(before),
            "published_only": published_only,
            "batch": q.OUTBOX_ROW_BATCH,
        }
        pruned = 0
        while True:

            async def work(tx: Tx) -> tuple[int, int]:
                [row] = await tx.rows(lq.PRUNE_CHANGES, params)
                await tx.rows(
                    lq.SKIP_DROPPED,
                    {"group_id": group_id, "dropped": row["dropped"]},
                )
                return int(row["deleted"]), int(row["changes"])

            deleted, changes = await self.store.ex.write("prune_changes", q.OUTBOX_ROW_BATCH, work)
            pruned += changes
            if deleted < q.OUTBOX_ROW_BATCH:
                return pruned


def _body(row: dict[str, Any]) -> str:
    """An outbox row's body column: its records' bodies joined in its order
    (``rows.by_record``), or the column itself in a row written before."""
    body = row["body"]
    return str(body) if body is not None else joined_body(row["uuids"], row["parts"])
