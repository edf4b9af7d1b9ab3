"""Graph snapshots through the store API, for comparing runs.

``comparable`` ignores what legitimately differs between two runs of the same feed: uuids
(they derive from the group id), the group id inside producer ids, and the created_at /
expired_at values. It keeps the shape of T': whether a fact is expired, and whether it was
born closed (expired_at == created_at), which is what an out-of-order write would change.
``exact`` keeps everything (for replays into the same groups, which must change nothing).
``timelines`` is ``comparable`` with both timelines exact (for runs with the same clock into
two groups, e.g. a forget against the feed without the forgotten episodes).
"""

from __future__ import annotations

from typing import Any

from tidegraph.stores.base import GraphStore


async def comparable(store: GraphStore, group: str, *, exact_times: bool = False) -> dict[str, Any]:
    facts = await store.browse.query_facts(group, include_invalid=True)
    entities = await store.browse.list_entities(group)
    return {
        "counts": await store.browse.counts(group),
        "facts": sorted(
            (
                f.subject,
                f.relation,
                f.object,
                f.fact,
                f.valid_at,
                f.invalid_at,
                tuple(e.replace(group, "<group>") for e in f.episodes),
                *(
                    (f.created_at, f.expired_at)
                    if exact_times
                    else (
                        f.expired_at is not None,
                        f.expired_at is not None and f.expired_at == f.created_at,
                    )
                ),
            )
            for f in facts
        ),
        "entities": sorted(
            (e.name, tuple(sorted(e.labels)), e.summary, e.key or "", tuple(sorted(e.aliases)))
            for e in entities
        ),
    }


async def timelines(store: GraphStore, group: str) -> dict[str, Any]:
    return await comparable(store, group, exact_times=True)


async def exact(store: GraphStore, group: str) -> dict[str, Any]:
    facts = await store.browse.query_facts(group, include_invalid=True)
    entities = await store.browse.list_entities(group)
    return {
        "counts": await store.browse.counts(group),
        "facts": [f.model_dump() for f in facts],
        "entities": [e.model_dump() for e in entities],
    }


def episode_index(producer_id: str) -> int:
    """The feed position of a CRM episode id (``crm:<group>:<n>``)."""
    return int(producer_id.rsplit(":", 1)[1])


async def creation_order_problems(store: GraphStore, group: str) -> list[str]:
    """Facts must be created (T') in the order of the episodes that stated them: sorted by
    created_at, the index of a fact's first episode never goes down."""
    facts = await store.browse.query_facts(group, include_invalid=True)
    ordered = sorted(facts, key=lambda f: (f.created_at or "", episode_index(f.episodes[0])))
    problems = []
    for earlier, later in zip(ordered, ordered[1:], strict=False):
        if episode_index(later.episodes[0]) < episode_index(earlier.episodes[0]):
            problems.append(
                f"{later.fact!r} (episode {later.episodes[0]}) was created after "
                f"{earlier.fact!r} (episode {earlier.episodes[0]})"
            )
    return problems
