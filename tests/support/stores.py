"""Store calls only tests make, over the stores' own role methods: a store carries no method
its product callers never use (docs/architecture.md "Store roles")."""

from __future__ import annotations

from datetime import datetime

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import FactRecord
from tidegraph.records.search import SearchScope
from tidegraph.stores.base import GraphStore


async def neighbour_weights(
    store: GraphStore, group_id: str, entity_uuid: str, at: datetime | None = None
) -> dict[str, int]:
    """{neighbour uuid: number of facts valid at ``at`` between it and the entity}: one
    entity's ``neighbour_weights_many``."""
    [weights] = await store.communities.neighbour_weights_many(group_id, [entity_uuid], at)
    return weights


async def assign_member(
    store: GraphStore, group_id: str, community_uuid: str, entity_uuid: str
) -> None:
    """One ``assign_members`` assignment: the entity joins that community and leaves any
    other."""
    await store.communities.assign_members(group_id, [(community_uuid, entity_uuid)])


async def vector_facts(
    store: GraphStore, group_id: str, embedding: list[float], limit: int
) -> list[tuple[FactRecord, float]]:
    """The group's facts nearest to ``embedding`` (every fact believed now, ended or not) as a
    fact search finds them, best first, with their cosine similarity clamped to [0, 1]."""
    scope = SearchScope((group_id,), AsOf.resolve(None, None, True, None))
    hits = await store.search.vector_search(scope, "fact", embedding, limit)
    return [(hit.record, max(0.0, 2 * hit.score - 1)) for hit in hits]  # type: ignore[misc]
