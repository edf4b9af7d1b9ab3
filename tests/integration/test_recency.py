"""Now and as of, LLM-free, on both real stores (docs/retrieval.md "Now and as of"): a feed
restates one attribute (plan, owner, address, status) of many subjects as it changes over a
year; asked "now" and "as of" each change, the first episode about the subject in the default
context is the statement valid then in at least 95 % of the questions."""

from __future__ import annotations

from tests.support.restatements import first_episode_about, restatement_feed
from tidegraph.embed.minilm import MiniLMEmbedder
from tidegraph.pipelines.ingest import ingest
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.recall.context import build_context
from tidegraph.recall.search import Searcher
from tidegraph.records.episode import Episode
from tidegraph.stores.base import GraphStore


async def test_the_first_episode_about_a_subject_is_its_latest_statement_then(
    store: GraphStore, group_id: str
) -> None:
    said, questions = restatement_feed(subjects=10, changes=3, seed=7)
    embedder = MiniLMEmbedder()  # the default embedder: the default context as a user gets it
    chain = GroupRunner.of(store=store, embedder=embedder, llm=None, mappings=None)
    feed = [
        Episode(
            id=s.id,
            group_id=group_id,
            source="message",
            source_description="account chat",
            content=s.content,
            reference_time=s.at,
        )
        for s in said
    ]
    report = await ingest(chain, feed)
    assert report.failures == []
    searcher = Searcher(store, embedder)

    wrong = []
    for q in questions:
        results = await searcher.search(q.query, [group_id], valid_at=q.valid_at)
        line = first_episode_about(build_context(results), q.subject)
        if line is None or q.answer.text not in line:
            wrong.append((q.query, q.valid_at, q.answer.text, line))
    asked_now = sum(q.valid_at is None for q in questions)
    assert asked_now and len(questions) - asked_now  # both kinds are asked
    assert len(wrong) <= 0.05 * len(questions), wrong
