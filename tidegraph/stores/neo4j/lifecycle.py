"""The Neo4j store's memory lifecycle (``store.Neo4jStore``): the change stream's outbox and
what a forget reads and writes (docs/architecture.md "Forgetting"); the queries are in
``lifecycle_queries``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tidegraph.records.changes import Change, PublishedChange, group_forgotten
from tidegraph.records.graph import (
    ChangeLog,
    EpisodeDetail,
    EpisodeEntry,
    EpisodeState,
    GroupHistory,
    Rebuild,
)
from tidegraph.records.times import utc
from tidegraph.stores import errors
from tidegraph.stores.executor import Tx
from tidegraph.stores.neo4j import lifecycle_queries as lq
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.rows import (
    change_of,
    change_row,
    entity_record,
    entity_row,
    episode_record,
    epoch_micros,
    fact_record,
    fact_row,
    now_utc,
    published_change,
    to_utc,
    with_epoch_times,
)

if TYPE_CHECKING:
    from tidegraph.stores.neo4j.executor import Neo4jExecutor

PRUNE_BATCH = 5_000


class Lifecycle:
    """The lifecycle methods of ``GraphStore`` on Neo4j (mixed into ``Neo4jStore``)."""

    ex: Neo4jExecutor
    deployment: str

    if TYPE_CHECKING:

        async def _embedding_dim(self) -> int: ...  # the store core's

    # ------------------------------------------------------------------ the change stream
    async def changes(self, group_id: str, after: int, limit: int) -> list[Change]:
        rows = await self.ex.rows(
            lq.CHANGES, {"group_id": group_id, "after": after, "limit": max(limit, 0)}
        )
        return [change_of(r["body"], int(r["seq"])) for r in rows]

    async def change_logs(
        self, group_ids: list[str] | None = None, *, unpublished: bool = False, own: bool = False
    ) -> list[ChangeLog]:
        params = {
            "groups": group_ids,
            "unpublished": unpublished,
            "own": own,
            "deployment": self.deployment,
        }
        rows = await self.ex.rows(lq.CHANGE_LOGS, params)
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
            "deployment": self.deployment,
        }
        rows = await self.ex.rows(lq.UNPUBLISHED_CHANGES, params)
        return [
            published_change(r["group_id"], r["body"], int(r["seq"]), r["change_id"]) for r in rows
        ]

    async def mark_published(self, acknowledged: Sequence[PublishedChange]) -> None:
        rows = [
            {"group_id": c.group_id, "seq": c.seq, "change_id": c.change_id} for c in acknowledged
        ]

        async def work(tx: Tx) -> None:
            await tx.rows(lq.MARK_PUBLISHED, {"cursors": rows, "deployment": self.deployment})

        if rows:
            await self.ex.write("mark_published", len(rows), work)

    async def prune_changes(
        self, group_id: str, before: datetime, *, published_only: bool = True
    ) -> int:
        params = {
            "group_id": group_id,
            "before": epoch_micros(before),
            "published_only": published_only,
            "batch": PRUNE_BATCH,
        }
        pruned = 0
        while True:

            async def work(tx: Tx) -> int:
                [row] = await tx.rows(lq.PRUNE_CHANGES, params)
                await tx.rows(lq.SKIP_DROPPED, {"group_id": group_id, "dropped": row["dropped"]})
                return int(row["deleted"])

            deleted = await self.ex.write("prune_changes", PRUNE_BATCH, work)
            pruned += deleted
            if deleted < PRUNE_BATCH:
                return pruned

    # ------------------------------------------------------------------ forgetting
    async def group_history(self, group_id: str) -> GroupHistory:
        params = {"group_id": group_id}
        [version] = await self.ex.rows(lq.GROUP_VERSION, params)
        episodes = await self.ex.rows(lq.HISTORY_EPISODES, params)
        entities = await self.ex.rows(lq.HISTORY_ENTITIES, params)
        facts = await self.ex.rows(lq.HISTORY_FACTS, params)
        return GroupHistory(
            episodes=[episode_record(r["ep"]) for r in episodes],
            entities={(e := entity_record(r["e"])).uuid: e for r in entities},
            facts={
                (f := fact_record(r["r"], r["source_uuid"], r["target_uuid"])).uuid: f
                for r in facts
            },
            mentions={r["ep"]["uuid"]: sorted(r["mentions"]) for r in episodes},
            created={
                r["ep"]["uuid"]: list(r["ep"].get("created_entities") or []) for r in episodes
            },
            version=int(version["version"]),
        )

    async def apply_rebuild(self, group_id: str, rebuild: Rebuild) -> None:
        dim = await self._embedding_dim()
        now = now_utc()
        entities = [with_epoch_times(entity_row(group_id, e, dim, now)) for e in rebuild.entities]
        facts = [with_epoch_times(fact_row(group_id, f, dim, now)) for f in rebuild.facts]
        changes = [change_row(c) for c in rebuild.changes]
        g = {"group_id": group_id}
        stamped = {**g, "deployment": self.deployment}

        async def work(tx: Tx) -> None:
            [row] = await tx.rows(lq.REBUILD_VERSION, g)
            if int(row["version"]) != rebuild.version:
                raise errors.RebuildConflict(group_id)
            owners = await tx.rows(
                "UNWIND $uuids AS uuid MATCH (e:Entity {uuid: uuid}) "
                "RETURN e.uuid AS uuid, e.group_id AS group_id",
                {"uuids": [e["uuid"] for e in entities]},
            )
            errors.check_entity_owners(group_id, {r["uuid"]: r["group_id"] for r in owners})
            forgotten_at: Any = with_epoch_times({"created_at": rebuild.forgotten_at})
            thread = {**g, "uuids": rebuild.forgotten, **q.thread_params()}
            [threads] = await tx.rows(lq.FORGOTTEN_THREADS, thread)
            await tx.rows(
                lq.TOMBSTONES,
                {**g, "uuids": rebuild.forgotten, "forgotten_at": forgotten_at["created_at"]},
            )
            followers = [u for u in threads["followers"] if u not in set(rebuild.forgotten)]
            await tx.rows(lq.REINDEX_THREADS, {**g, "followers": followers, **q.thread_params()})
            words = sorted({w for ws in threads["words"] for w in ws or []})
            await tx.rows(lq.DROP_SPEAKER_WORDS, {**g, "words": words})
            touched = [*rebuild.delete_entities, *(e["uuid"] for e in entities)]
            await tx.rows(lq.DELETE_STALE_COMMUNITIES, {**g, "uuids": touched})
            await tx.rows(lq.DELETE_FACTS, {**g, "uuids": rebuild.delete_facts})
            await tx.rows(lq.DELETE_ENTITIES, {**g, "uuids": rebuild.delete_entities})
            await tx.rows(lq.OVERWRITE_ENTITIES, {**g, "rows": entities})
            await tx.rows(lq.OVERWRITE_FACTS, {**g, "rows": facts})
            mentions = [{"episode": u, "entities": m} for u, m in rebuild.mentions.items()]
            await tx.rows(lq.REPLACE_MENTIONS, {**g, "rows": mentions})
            created = [{"episode": u, "created": c} for u, c in rebuild.created.items()]
            await tx.rows(lq.SET_CREATED, {**g, "rows": created})
            [purged] = await tx.rows(lq.PURGE_CHANGES, {**g, "uuids": rebuild.purged})
            await tx.rows(lq.SKIP_DROPPED, {**g, "dropped": purged["dropped"]})
            await tx.rows(q.RECORD_CHANGES, {**stamped, "changes": changes})

        size = len(entities) + len(facts) + len(rebuild.forgotten)
        await self.ex.write("apply_rebuild", size, work)

    # ------------------------------------------------------------------ a whole group
    async def forget_group(self, group_id: str, at: datetime, *, purge: bool = False) -> int:
        g = {"group_id": group_id}
        [live] = await self.ex.rows(lq.GROUP_LIVE_EPISODES, g)
        stamp = with_epoch_times({"created_at": at})["created_at"]
        batch = {**g, "batch": PRUNE_BATCH, "forgotten_at": stamp}
        for query in lq.PURGE_GROUP if purge else lq.FORGET_GROUP:

            async def step(tx: Tx, query: str = query) -> int:
                rows = await tx.rows(query, batch)
                return int(rows[0]["deleted"]) if rows else 0

            while await self.ex.write("forget_group", PRUNE_BATCH, step) >= PRUNE_BATCH:
                pass
        if not purge:

            async def record(tx: Tx) -> None:
                forgotten = [change_row(group_forgotten(group_id, at))]
                await tx.rows(
                    q.RECORD_CHANGES, {**g, "deployment": self.deployment, "changes": forgotten}
                )

            await self.ex.write("forget_group", 1, record)
        return int(live["episodes"])

    # ------------------------------------------------------------------ browsing
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
        return [_entry(r) for r in await self.ex.rows(query, params)]

    async def episode_detail(self, group_id: str, episode_uuid: str) -> EpisodeDetail | None:
        params = {"group_id": group_id, "uuid": episode_uuid}
        rows = await self.ex.rows(lq.EPISODE_DETAIL, params)
        if not rows:
            return None
        return EpisodeDetail(_entry(rows[0]), sorted(rows[0]["mentions"]))


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
