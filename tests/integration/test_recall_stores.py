"""Memory retrieval through the Searcher on both real stores (docs/retrieval.md "Memory retrieval"):
the
current plan ranks first, the old one only with history or a past valid-at; a known-at
before the change answers the belief of then; another tenant's search finds nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from tests.integration.conftest import STORE_DIM
from tests.support.crm_feed import crm_mappings, plan_record
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.ingest import ingest
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.recall.context import build_context
from tidegraph.recall.search import Searcher
from tidegraph.records.episode import Episode
from tidegraph.records.graph import FactRecord
from tidegraph.records.search import SearchRequest
from tidegraph.stores.base import GraphStore

JAN, MAR = datetime(2025, 1, 10, tzinfo=UTC), datetime(2025, 3, 5, tzinfo=UTC)
ACME = (7, "Acme Corp")
QUERY = "Which plan is Acme Corp on?"


def plan_objects(hits: list) -> list[str]:
    """The plans the fact hits name, in rank order (the plan entity's name)."""
    return [h.object for h in hits if isinstance(h.record, FactRecord) and h.subject == ACME[1]]


async def test_the_current_plan_ranks_first_and_the_old_one_only_when_asked(
    store: GraphStore, group_id: str
) -> None:
    embedder = HashingEmbedder(dim=STORE_DIM)
    chain = GroupRunner.of(store=store, embedder=embedder, llm=None, mappings=crm_mappings())
    feed = [
        Episode(id=f"plan-{n}", group_id=group_id, source="json",
                content=plan_record(ACME, plan, at), reference_time=at)
        for n, (plan, at) in enumerate([("Basic", JAN), ("Pro", MAR)])
    ]  # fmt: skip
    first = await ingest(chain, feed[:1])
    between = datetime.now(UTC)  # known-at: after Basic was stored, before Pro was
    second = await ingest(chain, feed[1:])
    assert first.failures == second.failures == []
    searcher = Searcher(store.search, embedder)

    now = await searcher.search(
        SearchRequest(query=QUERY, group_ids=[group_id], recipe="facts_rrf")
    )
    assert plan_objects(now.facts)[:1] == ["Pro"] and "Basic" not in plan_objects(now.facts)
    assert now.facts[0].episodes == ["plan-1"]  # traced to the record that stated it

    history = await searcher.search(
        SearchRequest(query=QUERY, group_ids=[group_id], recipe="facts_rrf", include_invalid=True)
    )
    assert {"Pro", "Basic"} <= set(plan_objects(history.facts))
    february = await searcher.search(
        SearchRequest(
            query=QUERY, group_ids=[group_id], recipe="facts_rrf", valid_at=MAR - timedelta(days=20)
        )
    )
    assert plan_objects(february.facts)[:1] == ["Basic"]
    believed = await searcher.search(
        SearchRequest(query=QUERY, group_ids=[group_id], recipe="facts_rrf", known_at=between)
    )
    assert plan_objects(believed.facts)[:1] == ["Basic"]

    context = build_context(
        await searcher.search(SearchRequest(query=QUERY, group_ids=[group_id])), max_chars=1500
    )
    assert "FACTS (when each was true):" in context and "Pro" in context

    other = f"test-{uuid.uuid4().hex[:12]}"
    for recipe in ("combined", "facts_rrf", "episodes_rrf", "entities_rrf"):
        crossed = await searcher.search(
            SearchRequest(query=QUERY, group_ids=[other], recipe=recipe, include_invalid=True)
        )
        assert len(crossed) == 0, recipe
