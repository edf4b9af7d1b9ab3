"""Rerankers: reorder the candidates the search methods found (docs/retrieval.md "Memory
retrieval").

Each is pure and deterministic: it never changes the hits it is given (it answers copies with
the reranker's own ``score``), and equal scores are ordered by (kind, uuid), except where a
reranker says it keeps the prior order (mentions, distance: they refine an earlier ranking).

- ``rrf``: reciprocal rank fusion of several ranked lists, ``score = sum 1 / (k + rank)``
  (rank from 1), duplicates (same kind and uuid) merged;
- ``mmr``: maximal marginal relevance, relevant to the query yet unlike what is already
  chosen (embeddings);
- ``by_mentions``: the entities more episodes mention first;
- ``by_distance``: nearest to a centre entity first (hops over valid facts);
- ``by_cross_encoder``: a cross-encoder's relevance of each hit's text to the query;
- ``carrying_first``: where a query names identifiers, the hits that carry one of them first
  (docs/retrieval.md "Identifiers"), each part in its order.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from tidegraph.records.graph import CommunityRecord, EntityRecord, FactRecord
from tidegraph.records.search import Hit
from tidegraph.stores.search_text import identifiers

RRF_K = 60
MMR_LAMBDA = 0.5


def _order(hit: Hit) -> tuple[float, str, str]:
    return (-hit.score, hit.kind, hit.uuid)


def rrf(
    ranked: Sequence[Sequence[Hit]],
    k: int = RRF_K,
    weights: Sequence[float] | None = None,
    limit: int | None = None,
) -> list[Hit]:
    """Fuse ranked lists (each best first): a hit scores ``sum w / (k + rank)`` over the lists
    it is in, ``w`` the list's weight (``weights``, default 1 each). A walk's facts (hits
    with a ``distance``) at the same hop share their rank, that of the first of them: the walk
    ranks by hops only, and their order in its list (by uuid) says nothing, so it must not
    decide between two facts another list finds almost alike. A hit found by several
    methods is kept as found at its best rank (the earlier list on a tie), with a record that
    has an embedding when any occurrence has one (MMR needs it), the smallest distance, the
    most mentions and the first non-empty episodes and names. With ``limit``, only the best
    ``limit`` (the same as the first of all of them; the others are never built)."""
    if k < 1:
        raise ValueError(f"the RRF constant k must be at least 1, got {k}")
    weights = [1.0] * len(ranked) if weights is None else list(weights)
    if len(weights) != len(ranked) or any(w <= 0 for w in weights):
        raise ValueError("give RRF one positive weight per ranked list")
    found: dict[tuple[str, str], list[tuple[int, float, Hit]]] = {}
    scores: dict[tuple[str, str], float] = {}
    for hits, weight in zip(ranked, weights, strict=True):
        rank, hop = 0, None
        for position, hit in enumerate(hits, start=1):
            if hit.distance is None or hit.distance != hop:
                rank, hop = position, hit.distance
            key = (hit.kind, hit.uuid)
            found.setdefault(key, []).append((rank, weight, hit))
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
    best = sorted(scores.items(), key=lambda item: (-item[1], *item[0]))  # ``_order``
    if limit is not None:
        best = best[: max(limit, 0)]
    return [_fuse(found[key], score) for key, score in best]


def _fuse(occurrences: list[tuple[int, float, Hit]], score: float) -> Hit:
    """One hit from its occurrences in the fused lists (see ``rrf``), scored ``score``."""
    if len(occurrences) == 1:  # found by one method (most hits): nothing to merge
        return occurrences[0][2].with_score(score)
    hits = [hit for _, _, hit in sorted(occurrences, key=lambda o: o[0])]  # stable: list order
    best = hits[0]
    with_embedding = [h for h in hits if h.embedding is not None]
    distances = [h.distance for h in hits if h.distance is not None]
    return dataclasses.replace(
        best,
        score=score,
        record=(with_embedding[0] if with_embedding else best).record,
        distance=min(distances) if distances else None,
        mentions=max(h.mentions for h in hits),
        episodes=list(next((h.episodes for h in hits if h.episodes), [])),
        subject=next((h.subject for h in hits if h.subject), ""),
        object=next((h.object for h in hits if h.object), ""),
    )


def mmr(
    hits: Sequence[Hit], query_embedding: Sequence[float], lambda_: float = MMR_LAMBDA
) -> list[Hit]:
    """Maximal marginal relevance: repeatedly take the hit with the highest
    ``lambda * cos(query, hit) - (1 - lambda) * max cos(hit, chosen)``; its score is that
    value. ``lambda_`` 1 is pure relevance, 0 pure diversity. Hits without an embedding
    cannot be judged: they follow, in their prior order, scored below every judged hit."""
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"the MMR lambda must be in [0, 1], got {lambda_}")
    judged = [h for h in hits if h.embedding is not None]
    unjudged = [h for h in hits if h.embedding is None]
    if not judged:
        return [h.with_score(-2.0) for h in unjudged]
    query = _unit(np.asarray(query_embedding, dtype=np.float64)[np.newaxis, :])[0]
    try:
        vectors = _unit(np.asarray([h.embedding for h in judged], dtype=np.float64))
    except ValueError as exc:
        raise ValueError("the hits' embeddings differ in dimension; re-embed the graph") from exc
    if vectors.shape[1] != query.shape[0]:
        raise ValueError(
            f"the hits' embeddings have {vectors.shape[1]} dimensions but the query's has "
            f"{query.shape[0]}: search with the embedder the graph was built with"
        )
    relevance = vectors @ query
    similarity = vectors @ vectors.T
    closest = np.full(len(judged), -np.inf)  # max cos to a chosen hit
    # In (kind, uuid) order: max() answers the first of equal values, so ties go to the
    # smallest, as in the other rerankers.
    left = sorted(range(len(judged)), key=lambda i: (judged[i].kind, judged[i].uuid))
    chosen: list[Hit] = []
    while left:
        values = {
            i: lambda_ * relevance[i] - (1.0 - lambda_) * (closest[i] if chosen else 0.0)
            for i in left
        }
        pick = max(left, key=values.__getitem__)
        chosen.append(judged[pick].with_score(float(values[pick])))
        left.remove(pick)
        closest = np.maximum(closest, similarity[pick])
    return chosen + [h.with_score(-2.0) for h in unjudged]


def _unit(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0.0, 1.0, norms)


def by_mentions(hits: Sequence[Hit]) -> list[Hit]:
    """More mentions (episodes that mention the hit) first; ties keep the prior order. The
    score is the number of mentions."""
    ranked = sorted(hits, key=lambda h: -h.mentions)  # stable
    return [h.with_score(float(h.mentions)) for h in ranked]


def by_distance(
    hits: Sequence[Hit], distances: Mapping[str, int], centre: str | None = None
) -> list[Hit]:
    """Nearest to the centre first: an entity by its own distance (hops in ``distances``;
    the centre is 0), a fact by the nearer of its two ends, a community by its nearest
    member; what is not reached (an episode, a hit far away) comes last. Ties keep the prior
    order. The score is ``1 / (1 + distance)``, 0 when unreached; ``Hit.distance`` is set."""
    known = dict(distances)
    if centre is not None:
        known[centre] = 0
    placed = [(_distance(h, known), h) for h in hits]
    ranked = sorted(placed, key=lambda p: (p[0] is None, p[0] or 0))  # stable
    return [
        dataclasses.replace(h, distance=d, score=0.0 if d is None else 1.0 / (1.0 + d))
        for d, h in ranked
    ]


def _distance(hit: Hit, distances: Mapping[str, int]) -> int | None:
    record = hit.record
    ends: tuple[str, ...]
    if isinstance(record, FactRecord):
        ends = (record.source_uuid, record.target_uuid)
    elif isinstance(record, CommunityRecord):
        ends = tuple(record.members)
    elif hit.kind == "entity":
        ends = (hit.uuid,)
    else:
        ends = ()
    reached = [distances[u] for u in ends if u in distances]
    return min(reached) if reached else None


class CrossEncoder(abc.ABC):
    """Scores how relevant each text is to the query (higher is more relevant)."""

    @abc.abstractmethod
    async def scores(self, query: str, texts: list[str]) -> list[float]:
        """One score per text, in the order given; ``[]`` for no texts."""

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release the client the encoder holds."""


async def by_cross_encoder(hits: Sequence[Hit], query: str, encoder: CrossEncoder) -> list[Hit]:
    """The cross-encoder's relevance of each hit's text to the query, best first; the score
    is the encoder's."""
    if not hits:
        return []
    scores = await encoder.scores(query, [h.text for h in hits])
    if len(scores) != len(hits):
        raise ValueError(
            f"the cross-encoder gave {len(scores)} scores for {len(hits)} texts; check "
            "TIDEGRAPH_RERANK_BASE_URL points at a /rerank endpoint"
        )
    scored = [h.with_score(float(s)) for h, s in zip(hits, scores, strict=True)]
    return sorted(scored, key=_order)


def carrying_first(hits: Sequence[Hit], named: set[str]) -> list[Hit]:
    """The hits whose text (an entity's also its key) carries one of the identifiers
    ``named`` (``search_text.identifiers``: ``nw1002`` for ``NW-1002``) first, then the
    others, each part in its order: a question that names a ticket, an order or an account
    by its id is about that record before anything merely similar (``NW-1004``)."""
    if not named:
        return list(hits)
    carrying = [bool(identifiers(_id_text(hit)) & named) for hit in hits]
    return [h for h, c in zip(hits, carrying, strict=True) if c] + [
        h for h, c in zip(hits, carrying, strict=True) if not c
    ]


def _id_text(hit: Hit) -> str:
    record = hit.record
    if isinstance(record, EntityRecord) and record.key:
        return f"{hit.text} {record.key}"
    return hit.text
