"""Now and as of, LLM-free, on both real stores (docs/retrieval.md "Now and as of"): a feed
restates four attributes (plan, owner, address, status) of many subjects as they change over
a year; asked "now" and "as of" each change, the first episode about the subject in the
default context is the statement valid then: in at least 95 % of the questions of each kind
where every statement names its attribute and where most do not (tests/support/
restatements.py, the wide feed), and at the measured floors where values are also written
in lower case."""

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


async def _first_statement_rates(
    store: GraphStore, group_id: str, *, wide: bool, lower_case: float = 0.0
) -> tuple[float, float, list[tuple[object, ...]]]:
    """The feed ingested with no LLM, every question asked with the default recipe: the
    share of "now" and of "as of" questions whose first episode about the subject in the
    default context is the statement valid then, and the misses."""
    said, questions = restatement_feed(
        subjects=10, changes=3, seed=7, wide=wide, lower_case=lower_case
    )
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

    right = {True: 0, False: 0}  # by "now"
    wrong: list[tuple[object, ...]] = []
    for q in questions:
        results = await searcher.search(
            SearchRequest(query=q.query, group_ids=[group_id], valid_at=q.valid_at)
        )
        line = first_episode_about(build_context(results), q.subject)
        if line is not None and q.answer.text in line:
            right[q.valid_at is None] += 1
        else:
            wrong.append((q.query, q.valid_at, q.answer.text, line))
    asked_now = sum(q.valid_at is None for q in questions)
    asked_then = len(questions) - asked_now
    assert asked_now and asked_then  # both kinds are asked
    return right[True] / asked_now, right[False] / asked_then, wrong


async def test_the_first_episode_about_a_subject_is_its_latest_statement_then(
    store: GraphStore, group_id: str
) -> None:
    # Every statement names its attribute as the questions do.
    now, then, wrong = await _first_statement_rates(store, group_id, wide=False)
    assert now >= 0.95 and then >= 0.95, (now, then, wrong)


async def test_the_latest_statement_comes_first_when_most_statements_do_not_name_it(
    store: GraphStore, group_id: str
) -> None:
    # 63 % of the statements do not name the attribute; the status's values are written in
    # lower case ("marking Acme Corp as trial"): a value is known by the slot it fills.
    now, then, wrong = await _first_statement_rates(store, group_id, wide=True)
    print(f"wide feed: now {now:.3f}, as of {then:.3f}")
    assert now >= 0.95 and then >= 0.95, (now, then, wrong)


# The wide feed with a quarter of every attribute's values written in lower case ("hand-off
# done, tom becker has Acme Corp"), measured when this was written on the embedded store:
# now 0.925, as of 0.938 (this seed; another, 11: 0.850 and 0.775). A value in lower case
# that is never written with capitals is known only where other statements show its slot
# (docs/retrieval.md "Now and as of").
LOWER_NOW = 0.80
LOWER_AS_OF = 0.80


async def test_values_written_in_lower_case_are_values_still(
    store: GraphStore, group_id: str
) -> None:
    now, then, wrong = await _first_statement_rates(store, group_id, wide=True, lower_case=0.25)
    print(f"wide feed, values in lower case: now {now:.3f}, as of {then:.3f}")
    assert now >= LOWER_NOW and then >= LOWER_AS_OF, (now, then, wrong)


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
