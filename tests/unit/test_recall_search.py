"""``Searcher`` (tidegraph/recall/search.py) over the exact in-memory source of
tests/unit/recall_fixtures.py, and the recipes (tidegraph/recall/recipes.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from tests.unit.recall_fixtures import (
    EMBEDDER,
    LengthEncoder,
    RecallGraph,
    day,
    episode,
    people_graph,
)
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.recall.recipes import (
    RECIPES,
    KindSearch,
    Recipe,
    recipe_named,
    recipe_problem,
    recipes_help,
)
from tidegraph.recall.search import Searcher, SearchResults
from tidegraph.records.search import Hit, SearchRequest

NOW = datetime(2024, 6, 1, tzinfo=UTC)  # day 152: Alice at Globex since day 100


class CountingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(dim=EMBEDDER.dim)
        self.texts: list[str] = []

    async def embed(self, texts: list[str]) -> list[list[float]]:
        self.texts += texts
        return await super().embed(texts)


def searcher(graph: RecallGraph | None = None, **kw) -> Searcher:
    return Searcher(graph or people_graph(), CountingEmbedder(), **kw)


def uuids(hits: list[Hit]) -> list[str]:
    return [h.uuid for h in hits]


# ---- recipes ---------------------------------------------------------------------------------
def test_the_recipes_the_brief_names_exist_and_unknown_ones_are_listed():
    for name in ("facts_rrf", "facts_mmr", "facts_distance", "entities_rrf", "episodes_rrf",
                 "communities_rrf", "combined", "facts_bm25", "facts_vector", "episodes_bm25",
                 "episodes_vector"):  # fmt: skip
        assert recipe_named(name) is RECIPES[name]
    assert RECIPES["combined"].kinds == ("fact", "entity", "episode", "community")
    assert RECIPES["facts_distance"].needs_centre
    with pytest.raises(ValueError, match="unknown search recipe 'nope'; choose one of: combined"):
        recipe_named("nope")


def test_recipes_refuse_what_cannot_run():
    with pytest.raises(ValueError, match="finds facts only"):
        KindSearch("entity", ("bm25", "bfs"), "rrf", limit=5)
    with pytest.raises(ValueError, match="one method's order"):
        KindSearch("fact", ("bm25", "vector"), "none", limit=5)
    with pytest.raises(ValueError, match="at least 1"):
        KindSearch("fact", ("bm25",), "none", limit=0)
    one = KindSearch("fact", ("bm25",), "none", limit=5)
    with pytest.raises(ValueError, match="each kind once"):
        Recipe("twice", "", (one, one))


# ---- the combined search ---------------------------------------------------------------------
async def test_combined_finds_every_kind_valid_now_and_only_in_the_group():
    found = await searcher().search(
        SearchRequest(query="Where does Alice Smith work?", group_ids=["g"], known_at=NOW)
    )
    assert found.recipe == "combined" and found.time_words is None
    assert uuids(found.facts)[0] == "f_globex"  # found by BM25, vector and the walk
    assert "f_acme" not in uuids(found.facts)  # ended on day 100
    assert uuids(found.entities)[0] == "alice"
    assert set(uuids(found.episodes)) == {"e1", "e2", "e3"}
    assert uuids(found.communities) == ["c_acme"]
    everything = {h.uuid for h in found.all()}
    assert not everything & {"f_other", "initech"}  # the other group's memory
    assert len(found) == len(found.all()) <= 10 + 5 + 3 + 2


async def test_candidates_are_read_without_details_and_the_kept_hits_completed():
    graph = people_graph()
    scopes = []
    search_lists = graph.search_lists

    async def watched(scope, searches):
        scopes.append(scope)
        return await search_lists(scope, searches)

    graph.search_lists = watched  # type: ignore[method-assign]
    found = await searcher(graph).search(
        SearchRequest(query="Where does Alice Smith work?", group_ids=["g"], known_at=NOW)
    )
    assert scopes and not any(scope.details for scope in scopes)
    assert graph.calls.count(("complete", None)) == 1  # every kind's kept hits at once
    # Each hit as a search with details would have found it.
    detailed = dataclasses.replace(scopes[0], details=True)
    for hit in found.facts + found.entities:
        full = graph.hit(hit.kind, hit.record, hit.score, detailed)
        assert (hit.episodes, hit.mentions, hit.subject, hit.object) == (
            full.episodes, full.mentions, full.subject, full.object
        )  # fmt: skip
    assert found.facts[0].subject == "Alice Smith" and found.facts[0].episodes
    assert found.entities[0].mentions == 3
    # The mentions reranker counts them: its candidates are read with them.
    scopes.clear()
    await searcher(graph).search(
        SearchRequest(query="Alice Bob", group_ids=["g"], recipe="entities_mentions", known_at=NOW)
    )
    assert scopes and all(scope.details for scope in scopes)


async def test_valid_at_and_include_invalid_choose_the_facts():
    s = searcher()
    then = await s.search(
        SearchRequest(query="Alice Smith works at", group_ids=["g"], valid_at=day(50), known_at=NOW)
    )
    assert "f_acme" in uuids(then.facts) and "f_globex" not in uuids(then.facts)
    assert [h.uuid for h in then.episodes] == ["e1"]  # e2, e3 happened later
    ever = await s.search(
        SearchRequest(
            query="Alice Smith works at", group_ids=["g"], include_invalid=True, known_at=NOW
        )
    )
    assert {"f_acme", "f_globex"} <= set(uuids(ever.facts))


async def test_a_time_phrase_sets_valid_at_unless_one_is_given():
    s = searcher()
    found = await s.search(
        SearchRequest(
            query="Where did Alice Smith work in February 2024?", group_ids=["g"], known_at=NOW
        )
    )
    assert found.time_words is not None and found.time_words.phrase == "in February 2024"
    assert found.scope.asof.valid_at == datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC)
    assert "f_acme" in uuids(found.facts) and "f_globex" not in uuids(found.facts)
    assert found.query == "Where did Alice Smith work in February 2024?"  # the words are kept
    given = await s.search(
        SearchRequest(
            query="Alice Smith in February 2024", group_ids=["g"], valid_at=NOW, known_at=NOW
        )
    )
    assert given.time_words is None and given.scope.asof.valid_at == NOW
    off = searcher(time_words=False)
    plain = await off.search(
        SearchRequest(query="Alice Smith in February 2024", group_ids=["g"], known_at=NOW)
    )
    assert plain.time_words is None and "f_globex" in uuids(plain.facts)


async def test_a_time_phrase_limits_facts_and_episodes_to_what_held_and_was_said_by_then():
    # "in February 2024" asks about the state then: e3 (day 120, said in May) is not of it,
    # exactly as with a valid-at the caller gives (docs/retrieval.md "Now and as of").
    s = searcher()
    found = await s.search(
        SearchRequest(query="Alice's new job in February 2024", group_ids=["g"], known_at=NOW)
    )
    assert found.time_words is not None
    assert "e3" not in uuids(found.episodes)
    later = await s.search(
        SearchRequest(query="Alice's new job in June 2024", group_ids=["g"], known_at=NOW)
    )
    assert "e3" in uuids(later.episodes)
    given = await s.search(
        SearchRequest(query="Alice's new job", group_ids=["g"], valid_at=day(50), known_at=NOW)
    )
    assert "e3" not in uuids(given.episodes) and "e2" not in uuids(given.episodes)


async def test_the_fusion_depth_does_not_follow_the_limit():
    # Each method finds the recipe's candidates whatever the limit (up to them): asking for
    # more results never reorders the first ones.
    s = searcher()
    ask = SearchRequest(query="Alice Smith job", group_ids=["g"], recipe="combined", known_at=NOW)
    few = await s.search(ask.model_copy(update={"limit": 2}))
    many = await s.search(ask.model_copy(update={"limit": 20}))
    for kind in ("fact", "entity", "episode"):
        assert uuids(few.of(kind)) == uuids(many.of(kind))[: len(few.of(kind))]


def test_the_fusion_weighs_each_method_as_the_recipe_says():
    episodes = RECIPES["episodes_rrf"].search_for("episode")
    assert episodes is not None
    assert (episodes.weight("bm25"), episodes.weight("vector")) == (1.0, 0.4)
    assert episodes.rrf_k == 20
    facts = RECIPES["facts_rrf"].search_for("fact")
    assert facts is not None and (facts.weight("vector"), facts.weight("bfs")) == (1.0, 0.5)
    with pytest.raises(ValueError, match="weights must be positive"):
        KindSearch("episode", ("bm25", "vector"), "rrf", limit=5, weights={"vector": 0.0})


def test_each_recipe_has_one_help_line_and_says_what_it_needs_before_running():
    lines = recipes_help().splitlines()
    assert len(lines) == len(RECIPES) and lines[0].startswith("combined ")
    assert all(len(line) <= 76 for line in lines)  # one line each in an 80-column terminal
    assert "needs --centre" in next(x for x in lines if x.startswith("facts_distance "))
    assert recipe_problem("combined") is None
    assert "centre" in (recipe_problem("entities_distance") or "")
    assert recipe_problem("entities_distance", centre="e1") is None
    assert "cross-encoder" in (recipe_problem("facts_cross_encoder") or "")
    assert "unknown search recipe" in (recipe_problem("nope") or "")


async def test_the_query_is_embedded_once_and_the_searches_are_asked_together():
    graph = people_graph()
    running, most = 0, 0
    batches: list[list[tuple[str, str]]] = []
    search_lists = graph.search_lists

    async def slow(scope, searches):
        nonlocal running, most
        batches.append([(s.kind, "bm25" if s.text is not None else "vector") for s in searches])
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.02)
        running -= 1
        return await search_lists(scope, searches)

    graph.search_lists = slow  # type: ignore[method-assign]
    s = searcher(graph)
    await s.search(SearchRequest(query="Alice Smith", group_ids=["g"], known_at=NOW))
    assert s.embedder.texts == ["Alice Smith"]  # type: ignore[attr-defined]
    # The lists that seed the walk (BM25 of facts and entities, entities by vector), and
    # those it runs beside (the other kinds' BM25 lists, the other vector lists): a read of
    # each method for each, all at once.
    assert sorted(batches) == sorted(
        [
            [("fact", "bm25"), ("entity", "bm25")],
            [("entity", "vector")],
            [("episode", "bm25"), ("community", "bm25")],
            [("fact", "vector"), ("episode", "vector"), ("community", "vector")],
        ]
    )
    assert most == 4


async def test_the_walk_does_not_wait_for_the_fact_vector_list():
    graph = people_graph()
    walking = asyncio.Event()
    search_lists, expand_facts = graph.search_lists, graph.expand_facts

    async def fact_vectors_end_after_the_walk_starts(scope, searches):
        if any(s.kind == "fact" and s.embedding is not None for s in searches):
            await walking.wait()
        return await search_lists(scope, searches)

    async def walk(scope, seeds, hops, limit):
        walking.set()
        return await expand_facts(scope, seeds, hops, limit)

    graph.search_lists = fact_vectors_end_after_the_walk_starts  # type: ignore[method-assign]
    graph.expand_facts = walk  # type: ignore[method-assign]
    request = SearchRequest(query="Alice Smith", group_ids=["g"], known_at=NOW)
    results = await asyncio.wait_for(searcher(graph).search(request), timeout=10)
    assert walking.is_set() and results.facts


async def test_a_question_about_a_subject_now_finds_what_it_asks_in_the_same_read():
    # What is asked of Acme ("plan") is searched alone beside the query's own lists: the
    # statements of any subject's plan carry the values a plan takes ("Enterprise", "Pro");
    # then the statements that carry those values, in a read of their own: "Cobalt upgraded
    # to Pro" shows that what follows "upgraded to" is a plan, so Acme's newest statement,
    # which does not say "plan", comes first.
    graph = RecallGraph().add(
        episode("pro", "Dana: the Acme team moved to the Pro plan", day(10)),
        episode("note", "Omar: the Acme team sent a thank-you note", day(150)),
        episode("upgrade", "Lena: the Acme team upgraded to Enterprise", day(120)),
        episode("bb", "Priya: the Bluebird team is on the Enterprise plan", day(5)),
        episode("cb", "Priya: the Cobalt team is on the Pro plan", day(6)),
        episode("cu", "Omar: the Cobalt team upgraded to Pro", day(7)),
    )
    batches: list[list[str | None]] = []
    search_lists = graph.search_lists

    async def recorded(scope, searches):
        batches.append([s.text for s in searches])
        return await search_lists(scope, searches)

    graph.search_lists = recorded  # type: ignore[method-assign]

    def ask(query: str) -> SearchRequest:
        return SearchRequest(query=query, group_ids=["g"], recipe="episodes_rrf", known_at=NOW)

    found = await searcher(graph).search(ask("Which plan is Acme on?"))
    first, values = [b for b in batches if None not in b]
    assert first == ["Which plan is Acme on?", "plan"]
    assert {"pro", "enterprise"} <= set(str(values[0]).split())
    assert uuids(found.episodes)[:2] == ["upgrade", "pro"]
    # A question about the past asks nothing more.
    batches.clear()
    await searcher(graph).search(ask("Which plan was Acme on?"))
    assert [b for b in batches if None not in b] == [["Which plan was Acme on?"]]


async def test_the_walk_starts_at_the_query_entities_recent_ones_and_the_centre():
    graph = people_graph()
    found = await searcher(graph).search(
        SearchRequest(
            query="Globex", group_ids=["g"], recipe="facts_rrf", known_at=NOW, centre="paris"
        )
    )
    seeds = graph.seeds[0]
    assert seeds[:2] == ["paris", "globex"]  # the centre, then the best entity found
    assert {"bob", "alice", "tea"} <= set(seeds)  # e3, the latest episode, mentions them
    bfs = [c for c in graph.calls if c[0] == "bfs"]
    assert bfs == [("bfs", "fact")]
    assert {"f_globex", "f_friend", "f_tea", "f_paris"} <= set(uuids(found.facts))
    assert "f_other" not in uuids(found.facts)


async def test_a_walk_without_anything_to_start_from_is_skipped():
    graph = RecallGraph()
    found = await searcher(graph).search(
        SearchRequest(query="anything", group_ids=["g"], recipe="facts_rrf", known_at=NOW)
    )
    assert found.facts == [] and graph.seeds == []


# ---- other recipes ---------------------------------------------------------------------------
async def test_facts_distance_ranks_by_hops_from_the_centre():
    s = searcher()
    with pytest.raises(ValueError, match="give its uuid as the centre"):
        await s.search(SearchRequest(query="Bob Jones", group_ids=["g"], recipe="facts_distance"))
    found = await s.search(
        SearchRequest(
            query="Bob Jones", group_ids=["g"], recipe="facts_distance", centre="tea", known_at=NOW
        )
    )
    # tea -bob- alice -globex; Acme is only reached through the ended f_acme: unreached
    assert [(h.uuid, h.distance) for h in found.facts] == [
        ("f_tea", 0),
        ("f_friend", 1),
        ("f_globex", 2),
        ("f_paris", None),
    ]


async def test_entities_distance_ranks_entities_by_hops_from_the_centre():
    found = await searcher().search(
        SearchRequest(
            query="Alice Smith Bob Jones Globex",
            group_ids=["g"],
            recipe="entities_distance",
            centre="bob",
            known_at=NOW,
        )
    )
    # Acme and Paris are reached only through the ended f_acme: unreached, last
    assert [(h.uuid, h.distance) for h in found.entities] == [
        ("bob", 0),
        ("alice", 1),
        ("tea", 1),  # the same distance: the fused order (alice matched the query better)
        ("globex", 2),
        ("acme", None),
        ("paris", None),
    ]


async def test_single_method_recipes_keep_their_method_order_and_limit_cuts():
    s = searcher()
    bm25 = await s.search(
        SearchRequest(query="green tea", group_ids=["g"], recipe="facts_bm25", known_at=NOW)
    )
    assert uuids(bm25.facts) == ["f_tea"]  # BM25 finds only the words
    vector = await s.search(
        SearchRequest(
            query="green tea", group_ids=["g"], recipe="facts_vector", known_at=NOW, limit=2
        )
    )
    assert len(vector.facts) == 2 and vector.facts[0].uuid == "f_tea"
    assert vector.facts[0].score >= vector.facts[1].score
    episodes = await s.search(
        SearchRequest(query="green tea", group_ids=["g"], recipe="episodes_bm25", known_at=NOW)
    )
    assert uuids(episodes.episodes) == ["e3"] and episodes.facts == []


async def test_mmr_and_mentions_recipes():
    s = searcher()
    # The closest facts to the query (hashing cosines): f_friend 0.60, f_globex 0.55,
    # f_paris 0.21. f_globex says much what f_friend says ("Alice Smith"), so MMR puts the
    # different f_paris before it.
    diverse = await s.search(
        SearchRequest(query="Alice Smith works", group_ids=["g"], recipe="facts_mmr", known_at=NOW)
    )
    assert uuids(diverse.facts)[:3] == ["f_friend", "f_paris", "f_globex"]
    mentioned = await s.search(
        SearchRequest(query="Alice Bob", group_ids=["g"], recipe="entities_mentions", known_at=NOW)
    )
    assert uuids(mentioned.entities)[:2] == ["alice", "bob"]  # 3 episodes, then 1
    assert mentioned.entities[0].score == 3.0


async def test_the_cross_encoder_recipe_needs_an_encoder():
    with pytest.raises(ValueError, match="TIDEGRAPH_RERANK_BASE_URL"):
        await searcher().search(
            SearchRequest(query="tea", group_ids=["g"], recipe="facts_cross_encoder")
        )
    s = searcher(cross_encoder=LengthEncoder())
    found = await s.search(
        SearchRequest(query="Alice", group_ids=["g"], recipe="facts_cross_encoder", known_at=NOW)
    )
    texts = [h.text for h in found.facts]
    assert texts == sorted(texts, key=len, reverse=True)


async def test_bad_questions_are_explained():
    s = searcher()
    with pytest.raises(ValueError, match="the query is empty"):
        await s.search(SearchRequest(query="  ", group_ids=["g"]))
    with pytest.raises(ValueError, match="group_ids\n.*at least 1 item"):
        SearchRequest(query="tea", group_ids=[])  # the request itself refuses it
    with pytest.raises(ValueError, match="limit\n.*greater than or equal to 1"):
        SearchRequest(query="tea", group_ids=["g"], limit=0)
    with pytest.raises(ValueError, match="unknown search recipe"):
        await s.search(SearchRequest(query="tea", group_ids=["g"], recipe="best"))


async def test_a_failing_store_is_counted_and_raised():
    graph = people_graph()

    async def broken(*args):
        raise ConnectionError("store down")

    graph.vector_search = broken  # type: ignore[method-assign]
    labels = {"recipe": "episodes_rrf", "outcome": "error"}
    before = REGISTRY.get_sample_value("tidegraph_searches_total", labels) or 0.0
    with pytest.raises(ConnectionError):
        await searcher(graph).search(
            SearchRequest(query="tea", group_ids=["g"], recipe="episodes_rrf")
        )
    assert REGISTRY.get_sample_value("tidegraph_searches_total", labels) == before + 1


async def test_searches_are_timed_per_recipe():
    labels = {"recipe": "communities_rrf"}
    before = REGISTRY.get_sample_value("tidegraph_search_latency_seconds_count", labels) or 0.0
    found = await searcher().search(
        SearchRequest(query="Acme people", group_ids=["g"], recipe="communities_rrf")
    )
    assert uuids(found.communities) == ["c_acme"]
    after = REGISTRY.get_sample_value("tidegraph_search_latency_seconds_count", labels)
    assert after == before + 1


def test_all_puts_facts_and_episodes_interleaved_first_then_entities_and_communities():
    from tidegraph.records.asof import AsOf
    from tidegraph.records.search import SearchScope

    graph = people_graph()
    scope = SearchScope(("g",), AsOf.resolve(None, None, False, None))

    def hit(kind, uuid):
        record = {"fact": graph.facts, "entity": graph.entities, "episode": graph.episodes}
        return Hit(kind, uuid, 0.0, record[kind][uuid], "g")

    results = SearchResults("q", "combined", scope)
    results.facts = [hit("fact", "f_tea"), hit("fact", "f_friend"), hit("fact", "f_paris")]
    results.entities = [hit("entity", "bob")]
    results.episodes = [hit("episode", "e3"), hit("episode", "e1")]
    assert uuids(results.all()) == ["f_tea", "e3", "f_friend", "e1", "f_paris", "bob"]
    assert len(SearchResults("q", "combined", scope).all()) == 0
