"""Search recipes: which kinds a search returns, found how, reranked how, how many
(docs/retrieval.md "Memory retrieval").

A ``Recipe`` is one ``KindSearch`` per kind it returns. For each kind, every method finds at
most ``candidates`` hits:

- ``bm25``: the store's fulltext (BM25) index;
- ``vector``: cosine to the query's embedding;
- ``bfs``: facts only, breadth-first over valid facts (``hops``) from seed entities: the
  entities BM25 and vector search find for the query, the ends of the best facts found so
  far, the entities of the most recent episodes, and the centre entity when one is given.

then ``reranker`` orders them and the best ``limit`` are kept:

- ``none``: the single method's own order;
- ``rrf``: reciprocal rank fusion of the methods' lists, the walk's weighted ``walk_weight``;
- ``mmr``: the fused candidates by maximal marginal relevance (``mmr_lambda``);
- ``mentions``: the fused candidates, more mentioned first (entities);
- ``distance``: the fused candidates, nearest to the centre entity first (needs ``centre``);
- ``cross_encoder``: the fused candidates by a cross-encoder (needs one configured).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from tidegraph.records.search import DEFAULT_RECIPE, Kind

Method = Literal["bm25", "vector", "bfs"]
Reranker = Literal["none", "rrf", "mmr", "mentions", "distance", "cross_encoder"]
METHODS: tuple[Method, ...] = get_args(Method)
RERANKERS: tuple[Reranker, ...] = get_args(Reranker)

DEFAULT_CANDIDATES = 20
DEFAULT_HOPS = 2
# The weight of the walk's list when fused with RRF (BM25 and vector weigh 1): its facts are
# near what the query names, not matches of the query, so they rank below direct matches.
DEFAULT_WALK_WEIGHT = 0.5


@dataclass(frozen=True)
class KindSearch:
    """How one kind is searched (see the module docstring)."""

    kind: Kind
    methods: tuple[Method, ...]
    reranker: Reranker
    limit: int
    candidates: int = DEFAULT_CANDIDATES
    hops: int = DEFAULT_HOPS
    mmr_lambda: float = 0.5
    walk_weight: float = DEFAULT_WALK_WEIGHT

    def weight(self, method: Method) -> float:
        """The weight of ``method``'s list in the fusion."""
        return self.walk_weight if method == "bfs" else 1.0

    def __post_init__(self) -> None:
        if not self.methods or len(set(self.methods)) != len(self.methods):
            raise ValueError(f"{self.kind}: name each method once, at least one")
        if "bfs" in self.methods and self.kind != "fact":
            raise ValueError(f"{self.kind}: breadth-first search finds facts only")
        if self.reranker == "none" and len(self.methods) != 1:
            raise ValueError(f"{self.kind}: reranker 'none' keeps one method's order only")
        if self.limit < 1 or self.candidates < 1 or self.hops < 1:
            raise ValueError(f"{self.kind}: limit, candidates and hops must be at least 1")
        if not 0.0 <= self.mmr_lambda <= 1.0:
            raise ValueError(f"{self.kind}: mmr_lambda must be in [0, 1]")
        if self.walk_weight <= 0:
            raise ValueError(f"{self.kind}: walk_weight must be positive")


@dataclass(frozen=True)
class Recipe:
    """A named search: one ``KindSearch`` per kind, in the order they are printed."""

    name: str
    description: str
    searches: tuple[KindSearch, ...]

    def __post_init__(self) -> None:
        kinds = [s.kind for s in self.searches]
        if not kinds or len(set(kinds)) != len(kinds):
            raise ValueError(f"recipe {self.name!r}: name each kind once, at least one")

    @property
    def kinds(self) -> tuple[Kind, ...]:
        return tuple(s.kind for s in self.searches)

    @property
    def needs_centre(self) -> bool:
        return any(s.reranker == "distance" for s in self.searches)

    @property
    def needs_cross_encoder(self) -> bool:
        return any(s.reranker == "cross_encoder" for s in self.searches)

    def uses(self, method: Method) -> bool:
        return any(method in s.methods for s in self.searches)

    def search_for(self, kind: Kind) -> KindSearch | None:
        return next((s for s in self.searches if s.kind == kind), None)


HYBRID: tuple[Method, ...] = ("bm25", "vector")
FACT_HYBRID: tuple[Method, ...] = ("bm25", "vector", "bfs")


def _one(name: str, description: str, search: KindSearch) -> Recipe:
    return Recipe(name, description, (search,))


_ALL = (
    # Agent memory: the facts carry the answer, entities name who and what, a few episodes
    # give the words as said, a community or two the big picture.
    Recipe(
        "combined",
        "facts, entities, episodes and communities, each hybrid and fused by RRF (default)",
        (
            KindSearch("fact", FACT_HYBRID, "rrf", limit=10),
            KindSearch("entity", HYBRID, "rrf", limit=5),
            KindSearch("episode", HYBRID, "rrf", limit=3, candidates=10),
            KindSearch("community", HYBRID, "rrf", limit=2, candidates=5),
        ),
    ),
    _one(
        "facts_rrf",
        "facts by BM25, vector and BFS from the entities found, fused by RRF",
        KindSearch("fact", FACT_HYBRID, "rrf", limit=10),
    ),
    _one(
        "facts_mmr",
        "facts by BM25 and vector, diversified by maximal marginal relevance",
        KindSearch("fact", HYBRID, "mmr", limit=10),
    ),
    _one(
        "facts_distance",
        "facts by BM25, vector and BFS, nearest to the centre entity first (needs a centre)",
        KindSearch("fact", FACT_HYBRID, "distance", limit=10),
    ),
    _one(
        "facts_cross_encoder",
        "facts by BM25, vector and BFS, ordered by the cross-encoder (needs one configured)",
        KindSearch("fact", FACT_HYBRID, "cross_encoder", limit=10),
    ),
    _one(
        "entities_distance",
        "entities by BM25 and vector, nearest to the centre entity first (needs a centre)",
        KindSearch("entity", HYBRID, "distance", limit=10),
    ),
    _one("facts_bm25", "facts by BM25 only", KindSearch("fact", ("bm25",), "none", limit=10)),
    _one("facts_vector", "facts by vector only", KindSearch("fact", ("vector",), "none", limit=10)),
    _one(
        "entities_rrf",
        "entities by BM25 and vector over name and summary, fused by RRF",
        KindSearch("entity", HYBRID, "rrf", limit=10),
    ),
    _one(
        "entities_mentions",
        "entities by BM25 and vector, the most mentioned first",
        KindSearch("entity", HYBRID, "mentions", limit=10),
    ),
    _one(
        "episodes_rrf",
        "episodes by BM25 and vector over their content, fused by RRF",
        KindSearch("episode", HYBRID, "rrf", limit=5, candidates=10),
    ),
    _one(
        "episodes_bm25",
        "episodes by BM25 only",
        KindSearch("episode", ("bm25",), "none", limit=5, candidates=10),
    ),
    _one(
        "episodes_vector",
        "episodes by vector only",
        KindSearch("episode", ("vector",), "none", limit=5, candidates=10),
    ),
    _one(
        "communities_rrf",
        "communities by BM25 and vector over name and summary, fused by RRF",
        KindSearch("community", HYBRID, "rrf", limit=5, candidates=10),
    ),
)

RECIPES: dict[str, Recipe] = {r.name: r for r in _ALL}
assert DEFAULT_RECIPE in RECIPES  # the default of SearchRequest


def recipe_named(name: str) -> Recipe:
    """The recipe called ``name``; a ValueError listing the valid names otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(
            f"unknown search recipe {name!r}; choose one of: {', '.join(sorted(RECIPES))}"
        ) from None
