"""The full replay as the oracle of the incremental forget (docs/architecture.md
"Forgetting"): both strategies compute the difference of one forget from the same stored
history, and must agree on every part of it (facts on both timelines, entities with their
summaries, mentions, created entities, what leaves the outbox, the changes); the incremental
one is then written, as a forget writes it. Communities and index entries follow from the
difference (``Forgetting.apply_rebuild`` drops the communities of the entities it changes and
rewrites the changed records' index entries), so one difference gives one graph."""

from __future__ import annotations

from typing import Any

from tidegraph.pipelines.forget import _rebuild
from tidegraph.pipelines.forget_reach import Reach, read_reach
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.records.graph import Rebuild
from tidegraph.stores.base import GraphStore


def comparable(rebuild: Rebuild) -> dict[str, Any]:
    """Everything a difference writes, but the times of the forget itself."""
    return {
        "version": rebuild.version,
        "forgotten": rebuild.forgotten,
        "delete_entities": rebuild.delete_entities,
        "delete_facts": rebuild.delete_facts,
        "entities": [e.model_dump() for e in rebuild.entities],
        "facts": [f.model_dump() for f in rebuild.facts],
        "mentions": rebuild.mentions,
        "created": rebuild.created,
        "purged": rebuild.purged,
        "changes": [c.model_dump(exclude={"committed_at", "change_id"}) for c in rebuild.changes],
    }


async def forget_both_ways(
    store: GraphStore, runner: GroupRunner, group_id: str, forgotten: set[str]
) -> str:
    """Forget ``forgotten`` (episode uuids) from ``group_id``: the incremental difference
    checked against the whole group's replay, then written. Returns the path the forget
    takes on its own: incremental or whole."""
    first = await store.forget.history_part(group_id, sorted(forgotten), [])
    found, _ = await read_reach(store, group_id, first, forgotten, 1.0)
    path = "incremental" if isinstance(found, Reach) else "whole"
    part, _ = await _rebuild(runner, group_id, first, forgotten, most=1.0)
    whole, _ = await _rebuild(runner, group_id, first, forgotten, most=0.0)
    assert comparable(part) == comparable(whole)
    await store.forget.apply_rebuild(group_id, part)
    after = await store.forget.group_history(group_id)
    assert not {e.uuid for e in after.episodes} & forgotten
    return path
