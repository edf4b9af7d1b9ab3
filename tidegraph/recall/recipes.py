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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from tidegraph.records.search import DEFAULT_RECIPE, Kind

Method = Literal["bm25", "vector", "bfs"]
Reranker = Literal["none", "rrf", "mmr", "mentions", "distance", "cross_encoder"]
METHODS: tuple[Method, ...] = get_args(Method)
RERANKERS: tuple[Reranker, ...] = get_args(Reranker)

# Hits each method finds (the depth of the fusion), whatever the caller's limit: for limits up
# to it, the order of the results never depends on the limit.
DEFAULT_CANDIDATES = 20
DEFAULT_HOPS = 2
# The weight of the walk's list when fused with RRF (BM25 and vector weigh 1): its facts are
# near what the query names, not matches of the query, so they rank below direct matches.
DEFAULT_WALK_WEIGHT = 0.5
DEFAULT_RRF_K = 60
# Episodes (turns of a conversation, notes): BM25 over their conversation fields finds the
# answering turn far more often than a small embedding model does (LoCoMo, no LLM: R@10 0.74
# against 0.52), so the vector list weighs less and adds what BM25 misses further down; the
# RRF constant is smaller, so that a method's first hits count more than its twentieth
# (docs/retrieval.md "Retrieval figures").
EPISODE_WEIGHTS: Mapping[str, float] = {"bm25": 1.0, "vector": 0.4}
EPISODE_RRF_K = 20


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
    # Each method's weight in the fusion where it is not 1 (the walk's: walk_weight).
    weights: Mapping[str, float] = field(default_factory=dict)
    rrf_k: int = DEFAULT_RRF_K

    def weight(self, method: Method) -> float:
        """The weight of ``method``'s list in the fusion."""
        default = self.walk_weight if method == "bfs" else 1.0
        return self.weights.get(method, default)

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
        if self.walk_weight <= 0 or any(w <= 0 for w in self.weights.values()):
            raise ValueError(f"{self.kind}: the fusion weights must be positive")
        if self.rrf_k < 1:
            raise ValueError(f"{self.kind}: rrf_k must be at least 1")


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


def _episodes(limit: int) -> KindSearch:
    """Episodes by BM25 and vector, fused with the episode weights."""
    return KindSearch(
        "episode", HYBRID, "rrf", limit=limit, weights=EPISODE_WEIGHTS, rrf_k=EPISODE_RRF_K
    )


def _one(name: str, description: str, search: KindSearch) -> Recipe:
    return Recipe(name, description, (search,))


_ALL = (
    # Agent memory: the facts carry the answer, entities name who and what, a few episodes
    # give the words as said, a community or two the big picture.
    Recipe(
        "combined",
        "facts, entities, episodes, communities, each fused",
        (
            KindSearch("fact", FACT_HYBRID, "rrf", limit=10),
            KindSearch("entity", HYBRID, "rrf", limit=5),
            _episodes(limit=3),
            KindSearch("community", HYBRID, "rrf", limit=2),
        ),
    ),
    _one(
        "facts_rrf",
        "facts by BM25, vector and walk from the entities; RRF",
        KindSearch("fact", FACT_HYBRID, "rrf", limit=10),
    ),
    _one(
        "facts_mmr",
        "facts by BM25 and vector, diversified by MMR",
        KindSearch("fact", HYBRID, "mmr", limit=10),
    ),
    _one(
        "facts_distance",
        "facts nearest the centre entity first (needs --centre)",
        KindSearch("fact", FACT_HYBRID, "distance", limit=10),
    ),
    _one(
        "facts_cross_encoder",
        "facts by a cross-encoder (needs TIDEGRAPH_RERANK_*)",
        KindSearch("fact", FACT_HYBRID, "cross_encoder", limit=10),
    ),
    _one(
        "entities_distance",
        "entities nearest the centre first (needs --centre)",
        KindSearch("entity", HYBRID, "distance", limit=10),
    ),
    _one("facts_bm25", "facts by BM25 only", KindSearch("fact", ("bm25",), "none", limit=10)),
    _one("facts_vector", "facts by vector only", KindSearch("fact", ("vector",), "none", limit=10)),
    _one(
        "entities_rrf",
        "entities by BM25 and vector (name, summary); RRF",
        KindSearch("entity", HYBRID, "rrf", limit=10),
    ),
    _one(
        "entities_mentions",
        "entities by BM25 and vector, most mentioned first",
        KindSearch("entity", HYBRID, "mentions", limit=10),
    ),
    _one(
        "episodes_rrf",
        "episodes by BM25 (conversation fields), vector; RRF",
        _episodes(limit=5),
    ),
    _one(
        "episodes_bm25",
        "episodes by BM25 only",
        KindSearch("episode", ("bm25",), "none", limit=5),
    ),
    _one(
        "episodes_vector",
        "episodes by vector only",
        KindSearch("episode", ("vector",), "none", limit=5),
    ),
    _one(
        "communities_rrf",
        "communities by BM25 and vector (name, summary); RRF",
        KindSearch("community", HYBRID, "rrf", limit=5),
    ),
)

RECIPES: dict[str, Recipe] = {r.name: r for r in _ALL}
assert DEFAULT_RECIPE in RECIPES  # the default of SearchRequest


def recipe_problem(
    name: str, *, centre: str | None = None, cross_encoder: bool = False
) -> str | None:
    """Why a search with recipe ``name`` cannot run (None: it can): an unknown name, a
    recipe that ranks by distance without a centre entity, one that needs a cross-encoder
    none is configured for. Asked before anything is opened (``Searcher.search``, the CLI)."""
    chosen = RECIPES.get(name)
    if chosen is None:
        return f"unknown search recipe {name!r}; choose one of: {', '.join(sorted(RECIPES))}"
    if chosen.needs_centre and not centre:
        return (
            f"recipe {name!r} ranks by distance from an entity: give its uuid as the centre "
            "(--centre, or centre= in the API)"
        )
    if chosen.needs_cross_encoder and not cross_encoder:
        return (
            f"recipe {name!r} needs a cross-encoder: set TIDEGRAPH_RERANK_BASE_URL and "
            "TIDEGRAPH_RERANK_MODEL, or choose another recipe"
        )
    return None


def recipes_help() -> str:
    """One line per recipe, the default first (``tidegraph search --help``)."""
    names = [DEFAULT_RECIPE, *(n for n in RECIPES if n != DEFAULT_RECIPE)]
    width = max(map(len, names))
    return "\n".join(f"{n:<{width}}  {RECIPES[n].description}" for n in names)


def recipe_named(name: str) -> Recipe:
    """The recipe called ``name``; a ValueError listing the valid names otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(
            f"unknown search recipe {name!r}; choose one of: {', '.join(sorted(RECIPES))}"
        ) from None
