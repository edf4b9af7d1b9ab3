"""What a forget reads and writes on Neo4j (``roles.Forgetting``, docs/architecture.md
"Forgetting"); the queries are in ``lifecycle_queries``."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from tidegraph.records.changes import group_forgotten
from tidegraph.records.graph import (
    MAPPED,
    GroupHistory,
    GroupProfile,
    Rebuild,
)
from tidegraph.stores import errors
from tidegraph.stores.executor import Tx
from tidegraph.stores.neo4j import lifecycle_queries as lq
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j.plans import NO_RECORD, PLANS_AHEAD_GROUP, stand_ins
from tidegraph.stores.roles import Forgetting
from tidegraph.stores.rows import (
    by_record,
    entity_record,
    entity_row,
    episode_record,
    fact_record,
    fact_row,
    now_utc,
    outbox_row,
    with_epoch_times,
)

if TYPE_CHECKING:
    from tidegraph.stores.neo4j.store import Neo4jStore

# Rows deleted per transaction by a forget and by ``delete_group``.
PRUNE_BATCH = 5_000
DELETE_BATCH = 2000


class Neo4jForgetting(Forgetting):
    """``Forgetting`` on the Neo4j store's executor."""

    def __init__(self, store: Neo4jStore) -> None:
        self.store = store

    async def group_history(self, group_id: str) -> GroupHistory:
        params = {"group_id": group_id}
        [version] = await self.store.ex.rows(lq.GROUP_VERSION, params)
        episodes = await self.store.ex.rows(lq.HISTORY_EPISODES, params)
        entities = await self.store.ex.rows(lq.HISTORY_ENTITIES, params)
        facts = await self.store.ex.rows(lq.HISTORY_FACTS, params)
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

    async def history_part(
        self,
        group_id: str,
        episodes: list[str],
        mentioning: list[str],
        creating: list[str] | None = None,
    ) -> GroupHistory:
        params = {"group_id": group_id}
        [version] = await self.store.ex.rows(lq.GROUP_VERSION, params)
        rows = await self.store.ex.rows(
            lq.HISTORY_PART,
            {
                **params,
                "episodes": episodes,
                "mentioning": mentioning,
                "creating": list(creating or ()),
            },
        )
        return GroupHistory(
            episodes=[episode_record(r["ep"]) for r in rows],
            mentions={r["ep"]["uuid"]: sorted(r["mentions"]) for r in rows},
            created={r["ep"]["uuid"]: list(r["ep"].get("created_entities") or []) for r in rows},
            version=int(version["version"]),
        )

    async def group_profile(self, group_id: str) -> GroupProfile:
        [row] = await self.store.ex.rows(lq.GROUP_PROFILE, {"group_id": group_id, "mapped": MAPPED})
        return GroupProfile(
            judged=bool(row["judged"]), without_extraction=bool(row["without_extraction"])
        )

    async def extracted_episodes(self, group_id: str, up_to: int) -> int:
        [row] = await self.store.ex.rows(
            lq.EXTRACTED_EPISODES, {"group_id": group_id, "up_to": up_to}
        )
        return int(row["extracted"])

    async def apply_rebuild(self, group_id: str, rebuild: Rebuild) -> None:
        dim = await self.store._embedding_dim()
        now = now_utc()
        entities = [with_epoch_times(entity_row(group_id, e, dim, now)) for e in rebuild.entities]
        facts = [with_epoch_times(fact_row(group_id, f, dim, now)) for f in rebuild.facts]

        async def work(tx: Tx) -> None:
            await self._write_rebuild(tx, group_id, rebuild, entities, facts)

        size = len(entities) + len(facts) + len(rebuild.forgotten)
        await self.store.ex.write("apply_rebuild", size, work)

    async def plan_ahead(self) -> None:
        """Has Neo4j plan every statement a forget runs now, when the store starts, so that a
        forget does not pay it: each keeps its plan (``queries.kept_plan``: one plan whatever
        the statistics and the sizes of its lists). They run for real, on a group no one has
        and records that do not exist, in a transaction that is rolled back; the statements
        of the rebuild run twice, before and after the transaction has written, as a
        rebuild runs some of them (Neo4j plans those apart)."""
        group_id, nothing = PLANS_AHEAD_GROUP, NO_RECORD
        g = {"group_id": group_id}
        when = now_utc()
        dim = await self.store._embedding_dim()
        entity, fact, _ = stand_ins(when)
        entities = [with_epoch_times(entity_row(group_id, entity, dim, when))]
        facts = [with_epoch_times(fact_row(group_id, fact, dim, when))]
        part = {**g, "episodes": [nothing], "mentioning": [nothing], "creating": [nothing]}

        # the reads of the part a forget reaches (``forget_reach.read_reach``)
        await self.store.entities_by_keys(group_id, [nothing])
        await self.store.entities_by_names(group_id, [nothing])
        await self.store.entities_by_uuids(group_id, [nothing])
        for embeddings in (True, False):
            await self.store.fact_candidates(
                group_id, [(nothing, "PLANS_AHEAD")], [], embeddings=embeddings
            )

        async def work(tx: Tx) -> None:
            await tx.rows(lq.HISTORY_PART, part)
            await tx.rows(lq.GROUP_PROFILE, {**g, "mapped": MAPPED})
            await tx.rows(lq.EXTRACTED_EPISODES, {**g, "up_to": 1})
            # Neo4j keeps a plan apart for a transaction that has written (a real rebuild
            # has after its tombstones): each write statement is planned both ways, the
            # second time after the first rehearsal's own writes (its outbox log).
            for _ in range(2):
                [version] = await tx.rows(lq.GROUP_VERSION, g)
                rebuild = Rebuild(
                    version=int(version["version"]),
                    forgotten=[nothing],
                    forgotten_at=when,
                    delete_entities=[nothing],
                    delete_facts=[nothing],
                    entities=[entity],
                    facts=[fact],
                    mentions={nothing: [nothing]},
                    created={nothing: [nothing]},
                    purged=[nothing],
                )
                await self._write_rebuild(tx, group_id, rebuild, entities, facts)
                # what the outbox purge runs once it has purged rows
                await tx.rows(lq.SKIP_DROPPED, {**g, "dropped": 1})

        await self.store.ex.rehearse(work)

    async def _write_rebuild(
        self,
        tx: Tx,
        group_id: str,
        rebuild: Rebuild,
        entities: list[dict[str, Any]],
        facts: list[dict[str, Any]],
    ) -> None:
        """What ``apply_rebuild`` writes, in the caller's transaction."""
        outbox = [by_record(outbox_row(group_id, rebuild.changes))]
        g = {"group_id": group_id}
        stamped = {**g, "deployment": self.store.deployment}
        [row] = await tx.rows(lq.REBUILD_VERSION, g)
        if int(row["version"]) != rebuild.version:
            raise errors.RebuildConflict(group_id)
        owners = await tx.rows(lq.REBUILD_OWNERS, {"uuids": [e["uuid"] for e in entities]})
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
        await self._purge_changes(tx, group_id, rebuild.purged)
        await tx.rows(lq.REBUILD_CHANGES, {**stamped, "outbox": outbox})

    @staticmethod
    async def _purge_changes(tx: Tx, group_id: str, uuids: list[str]) -> None:
        """Take the changes of records ``uuids`` out of the group's outbox, on the server
        (``PURGE_ROWS``): their lines in the rows holding them blanked, a row left with none
        deleted; then their entries in the index of records."""
        if not uuids:
            return
        g = {"group_id": group_id}
        [purged] = await tx.rows(lq.PURGE_ROWS, {**g, "uuids": uuids})
        await tx.rows(lq.UNINDEX_PURGED, {**g, "uuids": uuids})
        if purged["rows"]:
            await tx.rows(lq.SKIP_DROPPED, {**g, "dropped": int(purged["dropped"])})

    async def forget_group(self, group_id: str, at: datetime, *, purge: bool = False) -> int:
        g = {"group_id": group_id}
        [live] = await self.store.ex.rows(lq.GROUP_LIVE_EPISODES, g)
        stamp = with_epoch_times({"created_at": at})["created_at"]
        batch = {
            **g,
            "batch": PRUNE_BATCH,
            "row_batch": q.OUTBOX_ROW_BATCH,
            "forgotten_at": stamp,
        }
        for query in lq.PURGE_GROUP if purge else lq.FORGET_GROUP:

            async def step(tx: Tx, query: str = query) -> int:
                rows = await tx.rows(query, batch)
                return int(rows[0]["deleted"]) if rows else 0

            while await self.store.ex.write("forget_group", PRUNE_BATCH, step) > 0:
                pass
        if not purge:

            async def record(tx: Tx) -> None:
                forgotten = [by_record(outbox_row(group_id, [group_forgotten(group_id, at)]))]
                await tx.rows(
                    q.RECORD_CHANGES, {"deployment": self.store.deployment, "outbox": forgotten}
                )

            await self.store.ex.write("forget_group", 1, record)
        return int(live["episodes"])

    async def delete_group(self, group_id: str) -> None:
        params = {"group_id": group_id, "batch": DELETE_BATCH, "row_batch": q.OUTBOX_ROW_BATCH}
        for query in q.DELETE_GROUP:

            async def batch(tx: Tx, query: str = query) -> int:
                return int((await tx.rows(query, params))[0]["deleted"])

            while await self.store.ex.write("delete_group", DELETE_BATCH, batch) > 0:
                pass
