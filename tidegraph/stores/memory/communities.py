"""The memory store's communities (``roles.Communities``)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import CommunityRecord, WeightedEdge
from tidegraph.stores import errors, write_rules
from tidegraph.stores.memory.search import StoredCommunity
from tidegraph.stores.roles import Communities
from tidegraph.stores.rows import (
    community_rows,
    fold_communities,
    fold_edges,
    neighbour_weights_of,
    now_utc,
    unique,
)

if TYPE_CHECKING:
    from tidegraph.stores.memory.store import MemoryStore


class MemoryCommunities(Communities):
    """``Communities`` on the memory store's dictionaries."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def entity_graph(
        self, group_id: str, at: datetime | None = None
    ) -> tuple[list[str], list[WeightedEdge]]:
        asof = AsOf.resolve(at, None, False, None)
        nodes = sorted(u for u, e in self.store._entities.items() if e.group_id == group_id)
        rows = ((f.source_uuid, f.target_uuid, 1) for f in self.store._believed(group_id, asof))
        return nodes, [WeightedEdge(a, b, w) for a, b, w in fold_edges(rows)]

    async def neighbour_weights_many(
        self, group_id: str, entity_uuids: list[str], at: datetime | None = None
    ) -> list[dict[str, int]]:
        weights = []
        for entity_uuid in entity_uuids:
            asof = AsOf.resolve(at, None, False, entity_uuid)
            rows = ((f.source_uuid, f.target_uuid, 1) for f in self.store._believed(group_id, asof))
            weights.append(neighbour_weights_of(entity_uuid, rows))
        return weights

    async def communities_of(self, group_id: str, entity_uuids: list[str]) -> dict[str, str | None]:
        found = await self.store.entities_by_uuids(group_id, entity_uuids)
        return {e.uuid: e.community_uuid for e in found}

    async def list_communities(self, group_id: str) -> list[CommunityRecord]:
        heads = [
            (u, c.name, c.summary)
            for u, c in self.store._communities.items()
            if c.group_id == group_id
        ]
        mine = {u for u, _, _ in heads}
        members = [(c, e) for c, e in self.store._members if c in mine]
        return [CommunityRecord(u, n, s, m) for u, n, s, m in fold_communities(heads, members)]

    async def write_communities(
        self, group_id: str, upserts: list[CommunityRecord], deletes: list[str]
    ) -> None:
        if not upserts and not deletes:
            return
        rows, memberships, members = community_rows(upserts, self.store._dimension(), now_utc())
        uuids = [r["uuid"] for r in rows]
        named = unique([*uuids, *deletes])
        errors.check_community_owners(
            group_id,
            {u: self.store._communities[u].group_id for u in named if u in self.store._communities},
        )
        gone = set(deletes)
        self.store._communities = {
            u: c for u, c in self.store._communities.items() if u not in gone
        }
        self.store._members = {(c, e) for c, e in self.store._members if c not in gone}
        for row in rows:  # by ``write_rules.COMMUNITY``
            stored = self.store._communities.get(row["uuid"])
            state = write_rules.merged_values(
                write_rules.COMMUNITY,
                None if stored is None else vars(stored),
                {**row, "group_id": group_id},
            )
            del state["uuid"]
            self.store._communities[row["uuid"]] = StoredCommunity(**state)
        if rows:  # the upserted communities' members are replaced, and leave other ones
            moved, replaced = set(members), set(uuids)
            self.store._members = {
                (c, e)
                for c, e in self.store._members
                if self.store._communities[c].group_id != group_id
                or (c not in replaced and e not in moved)
            }
        for m in memberships:
            if self.store._owners([m["entity"]]).get(m["entity"]) == group_id:
                self.store._members.add((m["community"], m["entity"]))

    async def assign_members(self, group_id: str, assignments: list[tuple[str, str]]) -> None:
        for community_uuid, entity_uuid in assignments:
            community = self.store._communities.get(community_uuid)
            if community is None or community.group_id != group_id:
                continue
            if self.store._owners([entity_uuid]).get(entity_uuid) != group_id:
                continue
            self.store._members = {
                (c, e)
                for c, e in self.store._members
                if e != entity_uuid or self.store._communities[c].group_id != group_id
            }
            self.store._members.add((community_uuid, entity_uuid))
