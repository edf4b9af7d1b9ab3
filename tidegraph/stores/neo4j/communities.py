"""The Neo4j store's communities (``roles.Communities``, docs/communities.md): the
valid-fact graph, neighbour weights, the communities and their memberships; assignments of
different groups submitted while a transaction runs share the next one (``GroupCommit``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import CommunityRecord, WeightedEdge
from tidegraph.stores.errors import check_community_owners
from tidegraph.stores.executor import Tx, observe_write
from tidegraph.stores.neo4j import common_queries as cq
from tidegraph.stores.neo4j import queries as q
from tidegraph.stores.neo4j.asof import (
    ENTITY_GRAPH_RETURN,
    WHOLE_GROUP,
    AnchorHints,
    anchored_query,
    as_of_params,
    as_of_query,
)
from tidegraph.stores.neo4j.batching import (
    MAX_WRITES_PER_TRANSACTION,
    TRANSACTIONS_IN_FLIGHT,
    GroupCommit,
)
from tidegraph.stores.neo4j.plans import NO_RECORD, PLANS_AHEAD_GROUP
from tidegraph.stores.roles import Communities
from tidegraph.stores.rows import (
    community_rows,
    fold_communities,
    fold_edges,
    neighbour_weights_of,
    now_utc,
    unique,
    with_epoch_times,
)

if TYPE_CHECKING:
    from tidegraph.stores.neo4j.store import Neo4jStore


# A refresh reads its group's whole entity graph by the facts' group index, so that the plan it
# keeps (``plans``) stays right from an empty store to a full one.
_GRAPH_HINTS: AnchorHints = {
    **q.ANCHOR_HINTS,
    WHOLE_GROUP: ("USING INDEX r:RELATES_TO(group_id)", ""),
}


def group_graph_query(asof: AsOf) -> str:
    """A refresh's read of its group's entity graph as of ``asof`` (no entity), keeping its
    plan."""
    return q.kept_plan(as_of_query(asof, ENTITY_GRAPH_RETURN, _GRAPH_HINTS))


@dataclass(frozen=True)
class _Assignments:
    """One ``assign_members`` call: its rows name its group."""

    group_id: str
    rows: list[dict[str, str]]


class Neo4jCommunities(Communities):
    """``Communities`` on the Neo4j store's executor."""

    def __init__(self, store: Neo4jStore) -> None:
        self.store = store
        self._assignments: GroupCommit[_Assignments, None] = GroupCommit(
            self._commit_assignments,
            MAX_WRITES_PER_TRANSACTION,
            key=lambda item: item.group_id,
            max_in_flight=TRANSACTIONS_IN_FLIGHT,
        )

    async def _edge_rows(self, group_id: str, asof: AsOf) -> list[tuple[str, str, int]]:
        rows = await self.store.ex.rows(group_graph_query(asof), as_of_params(group_id, asof))
        return [(r["source"], r["target"], int(r["weight"])) for r in rows]

    async def entity_graph(
        self, group_id: str, at: datetime | None = None
    ) -> tuple[list[str], list[WeightedEdge]]:
        asof = AsOf.resolve(at, None, False, None)
        nodes = await self.store.ex.rows(cq.GROUP_ENTITY_UUIDS, {"group_id": group_id})
        edges = fold_edges(await self._edge_rows(group_id, asof))
        return sorted(r["uuid"] for r in nodes), [WeightedEdge(a, b, w) for a, b, w in edges]

    async def list_communities(self, group_id: str) -> list[CommunityRecord]:
        params = {"group_id": group_id}
        heads = await self.store.ex.rows(cq.GROUP_COMMUNITIES, params)
        members = await self.store.ex.rows(cq.GROUP_COMMUNITY_MEMBERS, params)
        folded = fold_communities(
            ((r["uuid"], r["name"], r["summary"]) for r in heads),
            ((r["community"], r["entity"]) for r in members),
        )
        return [CommunityRecord(u, n, s, m) for u, n, s, m in folded]

    async def write_communities(
        self, group_id: str, upserts: list[CommunityRecord], deletes: list[str]
    ) -> None:
        if not upserts and not deletes:
            return
        dim = await self.store._embedding_dim()
        size, work = self._rewrite(group_id, upserts, deletes, dim)
        await self.store.ex.write("write_communities", size, work)

    def _rewrite(
        self, group_id: str, upserts: list[CommunityRecord], deletes: list[str], dim: int
    ) -> tuple[int, Callable[[Tx], Awaitable[None]]]:
        """``write_communities``' transaction, and the rows it writes."""
        rows, memberships, members = community_rows(upserts, dim, now_utc())
        uuids = [r["uuid"] for r in rows]
        params = {"group_id": group_id}

        async def work(tx: Tx) -> None:
            owners = await tx.rows(cq.COMMUNITY_GROUPS, {"uuids": unique([*uuids, *deletes])})
            check_community_owners(group_id, {r["uuid"]: r["group_id"] for r in owners})
            if deletes:
                await tx.rows(cq.DELETE_COMMUNITIES, {**params, "uuids": unique(deletes)})
            if rows:
                stored = {r["uuid"] for r in owners} - set(deletes)
                await self._upsert_communities(tx, group_id, rows, stored)
                await tx.rows(cq.DROP_MEMBERSHIPS, {**params, "uuids": uuids, "members": members})
            if memberships:
                await tx.rows(cq.ADD_MEMBERSHIPS, {**params, "rows": memberships})

        return len(rows) + len(memberships), work

    async def communities_of(self, group_id: str, entity_uuids: list[str]) -> dict[str, str | None]:
        if not entity_uuids:
            return {}
        params = {"group_id": group_id, "uuids": unique(entity_uuids)}
        rows = await self.store.ex.rows(q.COMMUNITIES_OF, params)
        return {row["uuid"]: row["community_uuid"] for row in rows}

    async def neighbour_weights_many(
        self, group_id: str, entity_uuids: list[str], at: datetime | None = None
    ) -> list[dict[str, int]]:
        """One statement: each entity's question, in a ``CALL``."""
        if not entity_uuids:
            return []
        asof = AsOf.resolve(at, None, False, None)
        question = anchored_query(asof, ENTITY_GRAPH_RETURN, q.ANCHOR_HINTS, "entity_uuid")
        query = q.kept_plan(
            "UNWIND $entity_uuids AS entity_uuid\nCALL (entity_uuid) {\n"
            + question
            + "}\nRETURN entity_uuid, source, target, weight"
        )
        params = {**as_of_params(group_id, asof), "entity_uuids": unique(entity_uuids)}
        edges: dict[str, list[tuple[str, str, int]]] = {}
        for row in await self.store.ex.rows(query, params):
            edge = (row["source"], row["target"], int(row["weight"]))
            edges.setdefault(row["entity_uuid"], []).append(edge)
        return [neighbour_weights_of(uuid, edges.get(uuid, [])) for uuid in entity_uuids]

    async def assign_members(self, group_id: str, assignments: list[tuple[str, str]]) -> None:
        """One statement for all of them (``q.ASSIGN_MEMBERS``), not three per assignment,
        in a transaction shared with the other groups' assignments submitted meanwhile
        (``GroupCommit``, in submission order per group)."""
        if not assignments:
            return
        rows = [
            {"group_id": group_id, "community_uuid": c, "entity_uuid": e} for c, e in assignments
        ]
        with observe_write("assign_member", len(assignments)):
            await self._assignments.submit(_Assignments(group_id, rows))

    async def _commit_assignments(self, items: list[_Assignments]) -> list[None]:
        rows = [row for item in items for row in item.rows]

        async def work(tx: Tx) -> None:
            await tx.rows(q.ASSIGN_MEMBERS, {"rows": rows})

        await self.store.ex.transaction(work)
        return [None] * len(items)

    async def plan_ahead(self) -> None:
        """Has Neo4j plan the statements of the community assignment (for every batch of new
        entities) and of a refresh (``plans``): their reads on a group no one has, their
        writes in transactions that are rolled back."""
        group_id = PLANS_AHEAD_GROUP
        await self.entity_graph(group_id)
        await self.list_communities(group_id)
        community = CommunityRecord(NO_RECORD, NO_RECORD, NO_RECORD, [NO_RECORD])
        dim = await self.store._embedding_dim()
        _, rewrite = self._rewrite(group_id, [community], [NO_RECORD], dim)
        await self.store.ex.rehearse(rewrite)
        await self.communities_of(group_id, [NO_RECORD])
        await self.neighbour_weights_many(group_id, [NO_RECORD])
        rows = [{"group_id": group_id, "community_uuid": NO_RECORD, "entity_uuid": NO_RECORD}]

        async def work(tx: Tx) -> None:
            await tx.rows(q.ASSIGN_MEMBERS, {"rows": rows})

        await self.store.ex.rehearse(work)

    async def _upsert_communities(
        self, tx: Tx, group_id: str, rows: list[dict[str, Any]], stored: set[str]
    ) -> None:
        times = [with_epoch_times(row) for row in rows]
        await tx.rows(q.UPSERT_COMMUNITIES, {"group_id": group_id, "rows": times})
