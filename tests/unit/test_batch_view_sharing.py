"""The batch view answers the steps with the records it holds, not with copies
(tidegraph/pipelines/batch_view.py), so nothing may change a record it hands out: the fact
planner changes only its own copies, and the view replaces a record it holds instead of
changing it. A feed with late records (facts closed, restated, moved back in time) runs
through the embedded store, and every record the view handed out must be, field for field,
what it was when handed out."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support import crm_feed as crm
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.batch_view import BatchView
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.processors.steps import Components
from tidegraph.records.episode import Episode
from tidegraph.records.graph import EntityLookup, FactRecord
from tidegraph.stores.sqlite.store import SqliteStore

DIM = 64


def handed_out(answer: Any) -> list[BaseModel]:
    if isinstance(answer, EntityLookup):
        return [*answer.by_key, *answer.by_name, *(answer.facts or [])]
    return list(answer)


@pytest.mark.asyncio
async def test_the_steps_never_change_what_the_batch_view_hands_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[tuple[BaseModel, dict[str, Any]]] = []

    def spied(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def answer(self: BatchView, *args: Any, **kwargs: Any) -> Any:
            given = await method(self, *args, **kwargs)
            handed.extend((record, record.model_dump()) for record in handed_out(given))
            return given

        return answer

    for name in ("lookup_entities", "fact_candidates", "entities_by_key_prefix"):
        monkeypatch.setattr(BatchView, name, spied(getattr(BatchView, name)))
    store = SqliteStore(tmp_path / "graph")
    await store.setup(DIM)
    components = Components.of(
        store=store, embedder=HashingEmbedder(dim=DIM), llm=None, mappings=crm.crm_mappings()
    )
    runner = GroupRunner(components)
    by_group: dict[str, list[Episode]] = defaultdict(list)
    for episode in crm.generate(400, 2, seed=11, late_fraction=0.3).as_episodes():
        by_group[episode.group_id].append(episode)
    try:
        for episodes in by_group.values():
            outcomes = await runner.run(episodes)
            assert [o.failure for o in outcomes if o.failure is not None] == []
    finally:
        await store.close()

    facts = [record for record, _ in handed if isinstance(record, FactRecord)]
    assert len(facts) > 400  # the view answered the planner with stored facts
    assert any(f.invalid_at is not None for f in facts)  # closed ones among them
    changed = [(record, before) for record, before in handed if record.model_dump() != before]
    assert changed == []
