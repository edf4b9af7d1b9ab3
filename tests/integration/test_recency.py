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
from tidegraph.records.search import SearchRequest
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
    searcher = Searcher(store.search, embedder)

    wrong = []
    for q in questions:
        results = await searcher.search(
            SearchRequest(query=q.query, group_ids=[group_id], valid_at=q.valid_at)
        )
        line = first_episode_about(build_context(results), q.subject)
        if line is None or q.answer.text not in line:
            wrong.append((q.query, q.valid_at, q.answer.text, line))
    asked_now = sum(q.valid_at is None for q in questions)
    assert asked_now and len(questions) - asked_now  # both kinds are asked
    assert len(wrong) <= 0.05 * len(questions), wrong


async def test_a_forgotten_message_leaves_no_trace_in_the_context_of_its_replies(
    store: GraphStore, group_id: str
) -> None:
    # A reply is found by the turn it answers (its context); once that turn is forgotten, the
    # reply is no longer found by the forgotten words (docs/retrieval.md "Conversation-aware
    # episode search").
    from datetime import UTC, datetime, timedelta

    from tidegraph.embed.hashing import HashingEmbedder
    from tidegraph.pipelines.forget import forget_episodes
    from tidegraph.records.asof import AsOf
    from tidegraph.records.search import SearchScope

    at = datetime(2025, 3, 3, 10, 0, tzinfo=UTC)
    turns = [("q", "Zora: my secret project is called Bluefinch"), ("a", "Dana: sounds great")]
    runner = GroupRunner.of(store=store, embedder=HashingEmbedder(dim=384), llm=None, mappings=None)
    feed = [
        Episode(id=i, group_id=group_id, source="message", source_description="chat",
                content=text, reference_time=at + timedelta(minutes=n))
        for n, (i, text) in enumerate(turns)
    ]  # fmt: skip
    assert (await ingest(runner, feed)).failures == []
    scope = SearchScope((group_id,), AsOf.resolve(None, None, False, None))

    async def found(text: str) -> set[str]:
        hits = await store.search.fulltext_search(scope, "episode", text, 10)
        return {h.record.producer_id for h in hits}

    assert await found("Bluefinch") == {"q", "a"}  # the reply through its context
    await forget_episodes(runner, group_id, ["q"])
    assert await found("Bluefinch") == set()
    assert await found("sounds great") == {"a"}
