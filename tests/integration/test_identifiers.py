"""Business records asked by their ids, over a long history, on both real stores
(docs/retrieval.md "Identifiers"): a generated incident log (1,000 tickets with ids shaped
like ``1-732025285``, 20 updates each of their status, owner and team, 60,000 facts of which
57,000 are closed) asked "What is the status of ticket <id>?" now and as of a moment between
two updates: the first fact about that ticket among the hits is its status then in at least
99 % of the questions, and every recipe answers on the long history (Neo4j ran out of
transaction memory on it: docs/retrieval.md "Long histories")."""

from __future__ import annotations

import pytest

from tests.support.incident_log import Question, incident_log, incident_mappings
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.ingest import ingest
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.recall.recipes import RECIPES
from tidegraph.recall.search import Searcher
from tidegraph.records.graph import FactRecord
from tidegraph.records.search import SearchRequest
from tidegraph.stores.base import GraphStore

QUESTIONS = 100


# Writing the 20,000 records through the chain is most of the test's time (minutes on a busy
# machine): more than the suite's default per-test timeout.
@pytest.mark.timeout(1800)
async def test_the_first_fact_about_a_ticket_named_by_its_id_is_its_status_then(
    store: GraphStore, group_id: str
) -> None:
    log = incident_log(group_id, subjects=1000, changes=20)
    embedder = HashingEmbedder(dim=384)  # the store's work is what is tested, not a model's
    runner = GroupRunner.of(store=store, embedder=embedder, llm=None, mappings=incident_mappings())
    try:
        report = await ingest(runner, log.episodes)
        assert report.failures == []
        await _ask(Searcher(store.search, embedder), log.questions(QUESTIONS), group_id)
    finally:
        await store.forget.delete_group(group_id)  # in batches: a long history is large


async def _ask(searcher: Searcher, questions: list[Question], group_id: str) -> None:
    wrong = []
    for q in questions:
        results = await searcher.search(
            SearchRequest(query=q.query, group_ids=[group_id], valid_at=q.valid_at)
        )
        about = [
            h.record.fact
            for h in results.facts
            if isinstance(h.record, FactRecord) and f"Ticket {q.ticket} " in h.record.fact
        ]
        if not about or about[0] != f"Ticket {q.ticket} status is {q.status}":
            wrong.append((q.query, q.valid_at, q.status, about[:1]))
    assert sum(q.valid_at is None for q in questions) == QUESTIONS // 2
    assert len(wrong) <= 0.01 * QUESTIONS, wrong

    # every recipe answers on the long history, now and as of (those that need a centre
    # entity or a cross-encoder are asked with a centre, without the cross-encoder)
    asked = questions[1]
    centre = [h.uuid for h in (await searcher.search(
        SearchRequest(query=asked.query, group_ids=[group_id], recipe="entities_rrf")
    )).entities][0]  # fmt: skip
    for recipe in RECIPES:
        if recipe == "facts_cross_encoder":
            continue
        for valid_at in (None, asked.valid_at):
            request = SearchRequest(
                query=asked.query,
                group_ids=[group_id],
                valid_at=valid_at,
                recipe=recipe,
                centre=centre if "distance" in recipe else None,
            )
            assert await searcher.search(request) is not None
