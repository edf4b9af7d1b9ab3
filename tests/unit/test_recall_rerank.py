"""The rerankers (tidegraph/recall/rerank.py): each ranking shown on small hand-built lists."""

from __future__ import annotations

import math

import pytest

from tests.unit.recall_fixtures import LengthEncoder, community, day, embed, entity, episode, fact
from tidegraph.recall.rerank import (
    by_cross_encoder,
    by_distance,
    by_mentions,
    mmr,
    rrf,
)
from tidegraph.records.search import Hit


def fh(uuid: str, score: float = 0.0, text: str | None = None, **kw) -> Hit:
    """A fact hit from a to b (``source``/``target`` override the ends)."""
    record = fact(uuid, kw.pop("source", "a"), kw.pop("target", "b"), text or f"fact {uuid}")
    if kw.pop("no_embedding", False):
        record.fact_embedding = None
    return Hit("fact", uuid, score, record, "g", **kw)


def eh(uuid: str, mentions: int = 0) -> Hit:
    return Hit("entity", uuid, 0.0, entity(uuid, uuid.title()), "g", mentions=mentions)


def uuids(hits: list[Hit]) -> list[str]:
    return [h.uuid for h in hits]


# ---- reciprocal rank fusion ------------------------------------------------------------------
def test_rrf_sums_reciprocal_ranks_and_merges_duplicates():
    bm25 = [fh("x"), fh("y"), fh("z")]
    vector = [fh("y"), fh("w"), fh("x")]
    fused = rrf([bm25, vector])
    # y: 1/62 + 1/61, x: 1/61 + 1/63, w: 1/62, z: 1/63
    assert uuids(fused) == ["y", "x", "w", "z"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert fused[3].score == pytest.approx(1 / 63)


def test_rrf_breaks_ties_by_uuid_and_honours_k():
    fused = rrf([[fh("b")], [fh("a")]], k=1)
    assert uuids(fused) == ["a", "b"]
    assert fused[0].score == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least 1"):
        rrf([[fh("a")]], k=0)


def test_rrf_weighs_each_list():
    direct = [fh("match"), fh("other")]
    walk = [fh("near"), fh("match")]
    # equal weights: near (1/61) beats other (1/62); the walk at half weight: near 0.5/61
    assert uuids(rrf([direct, walk])) == ["match", "near", "other"]
    fused = rrf([direct, walk], weights=[1.0, 0.5])
    assert uuids(fused) == ["match", "other", "near"]
    assert fused[0].score == pytest.approx(1 / 61 + 0.5 / 62)
    for bad in ([1.0], [1.0, 0.0]):
        with pytest.raises(ValueError, match="one positive weight per ranked list"):
            rrf([direct, walk], weights=bad)


def test_rrf_keeps_the_best_record_and_what_each_method_knew():
    from_bm25 = fh("x", no_embedding=True, episodes=["p1"])  # fulltext: no embedding read
    from_bfs = fh("x", distance=2)
    from_vector = fh("x", subject="Alice")
    fused = rrf([[from_bm25], [fh("y"), from_bfs], [fh("y"), fh("z"), from_vector]])
    x = fused[0]
    assert x.uuid == "x" and x.embedding is not None
    assert (x.distance, x.episodes, x.subject) == (2, ["p1"], "Alice")
    assert from_bm25.score == 0.0 and from_bm25.embedding is None  # the input is untouched


def test_rrf_with_a_limit_builds_only_the_best_and_answers_the_same_first_ones():
    bm25 = [fh(f"b{i}") for i in range(30)] + [fh("both")]
    vector = [fh("both"), *(fh(f"v{i}") for i in range(30))]
    every = rrf([bm25, vector], weights=[1.0, 0.4])
    for limit in (0, 1, 5, 61, 100):
        best = rrf([bm25, vector], weights=[1.0, 0.4], limit=limit)
        assert [(h.uuid, h.score) for h in best] == [(h.uuid, h.score) for h in every[:limit]]


def test_rrf_keeps_kinds_apart():
    fused = rrf([[fh("same")], [eh("same")]])
    assert sorted((h.kind, h.uuid) for h in fused) == [("entity", "same"), ("fact", "same")]


# ---- maximal marginal relevance --------------------------------------------------------------
def vec_hit(uuid: str, vector: list[float] | None) -> Hit:
    hit = fh(uuid)
    hit.record.fact_embedding = vector
    return hit


def test_mmr_trades_relevance_for_diversity():
    query = [1.0, 0.0, 0.0]
    near = vec_hit("near", [0.9, 0.1, 0.0])
    twin = vec_hit("twin", [0.9, 0.11, 0.0])  # almost the same as near
    other = vec_hit("other", [0.6, 0.0, 0.8])  # less relevant, but different
    hits = [near, twin, other]
    assert uuids(mmr(hits, query, lambda_=1.0)) == ["near", "twin", "other"]
    diverse = mmr(hits, query, lambda_=0.5)
    assert uuids(diverse) == ["near", "other", "twin"]
    assert diverse[0].score == pytest.approx(0.5 * 0.9 / math.hypot(0.9, 0.1))


def test_mmr_puts_hits_without_embedding_last_in_prior_order():
    hits = [vec_hit("n1", None), vec_hit("v", [1.0, 0.0]), vec_hit("n2", None)]
    ranked = mmr(hits, [1.0, 0.0])
    assert uuids(ranked) == ["v", "n1", "n2"]
    assert ranked[1].score < ranked[0].score
    assert uuids(mmr([vec_hit("n", None)], [1.0, 0.0])) == ["n"]


def test_mmr_ties_go_to_the_smaller_uuid_and_bad_input_is_explained():
    same = [0.0, 1.0]
    assert uuids(mmr([vec_hit("b", same), vec_hit("a", same)], [0.0, 1.0], 1.0)) == ["a", "b"]
    with pytest.raises(ValueError, match="embedder the graph was built with"):
        mmr([vec_hit("a", [1.0, 0.0])], [1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        mmr([], [1.0], lambda_=1.5)


# ---- episode mentions ------------------------------------------------------------------------
def test_mentions_ranks_more_mentioned_first_and_keeps_prior_order_on_ties():
    ranked = by_mentions([eh("a", 1), eh("b", 3), eh("c", 1), eh("d", 3)])
    assert uuids(ranked) == ["b", "d", "a", "c"]
    assert [h.score for h in ranked] == [3.0, 3.0, 1.0, 1.0]


# ---- node distance ---------------------------------------------------------------------------
def test_distance_ranks_nearest_first_facts_by_their_nearer_end():
    distances = {"alice": 1, "acme": 2, "bob": 3}
    hits = [
        fh("far", source="bob", target="zed"),  # 3
        fh("near", source="zed", target="alice"),  # min(-, 1) = 1
        fh("centre", source="me", target="bob"),  # the centre: 0
        fh("lost", source="x", target="y"),  # unreached: last
        eh("acme"),  # 2
        Hit("episode", "ep", 0.0, episode("ep", "hello", day(1)), "g"),
        Hit("community", "c", 0.0, community("c", "Team", "", ["bob", "acme"]), "g"),  # 2
    ]
    ranked = by_distance(hits, distances, centre="me")
    assert uuids(ranked) == ["centre", "near", "acme", "c", "far", "lost", "ep"]
    assert [h.distance for h in ranked] == [0, 1, 2, 2, 3, None, None]
    assert ranked[1].score == pytest.approx(0.5) and ranked[-1].score == 0.0


# ---- cross-encoder ---------------------------------------------------------------------------
async def test_cross_encoder_orders_by_the_encoder_scores():
    encoder = LengthEncoder()
    hits = [fh("s", text="short"), fh("l", text="a much longer fact"), fh("m", text="medium!")]
    ranked = await by_cross_encoder(hits, "q", encoder)
    assert uuids(ranked) == ["l", "m", "s"]
    assert ranked[0].score == 18.0
    assert encoder.calls == [("q", ["short", "a much longer fact", "medium!"])]
    assert await by_cross_encoder([], "q", encoder) == []
    assert len(encoder.calls) == 1  # nothing to score: no call


async def test_cross_encoder_with_a_wrong_number_of_scores_is_an_error():
    with pytest.raises(ValueError, match="2 scores for 1 texts"):
        await by_cross_encoder([fh("a")], "q", LengthEncoder([1.0, 2.0]))


def test_the_fixture_embedder_is_normalised():
    assert math.isclose(sum(x * x for x in embed("hello world")), 1.0)


def test_the_walks_facts_at_one_hop_share_their_rank_so_the_other_lists_decide():
    # the walk lists a before b only by uuid: both are one hop away
    walk = [fh("a", 1.0, distance=1), fh("b", 1.0, distance=1), fh("c", 0.5, distance=2)]
    bm25 = [fh("b", 3.0), fh("a", 2.9)]
    fused = rrf([bm25, walk], weights=[1.0, 0.5])
    assert uuids(fused) == ["b", "a", "c"]
    # b: 1/61 + 0.5/61, a: 1/62 + 0.5/61, c: 0.5/63
    assert [round(h.score, 6) for h in fused] == [
        round(1 / 61 + 0.5 / 61, 6),
        round(1 / 62 + 0.5 / 61, 6),
        round(0.5 / 63, 6),
    ]
