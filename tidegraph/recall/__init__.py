"""Memory retrieval (docs/retrieval.md "Memory retrieval"): ``f = builder(rerank(search(query)))``
as in
the Zep paper.

- ``source``: what the stores answer (``SearchSource``: BM25, cosine, BFS, recent mentions,
  distances);
- ``recipes``: named search configurations (which kinds, methods, reranker, limits);
- ``rerank``: reciprocal rank fusion, MMR, episode mentions, node distance, cross-encoder;
- ``crossencoder``: a cross-encoder over an HTTP ``/rerank`` endpoint;
- ``timewords``: time phrases in the query ("last March") become the valid-at moment;
- ``search``: ``Searcher``, which runs a recipe;
- ``context``: the agent's context text within a budget.

Pure logic over the store interface: no store, server or CLI is imported here.
"""

from tidegraph.recall.context import build_context
from tidegraph.recall.crossencoder import HttpCrossEncoder, RerankError, cross_encoder_from_settings
from tidegraph.recall.recipes import DEFAULT_RECIPE, RECIPES, KindSearch, Recipe, recipe_named
from tidegraph.recall.rerank import CrossEncoder
from tidegraph.recall.search import Searcher, SearchResults
from tidegraph.recall.source import SearchSource
from tidegraph.recall.timewords import TimeWords, find_time

__all__ = [
    "DEFAULT_RECIPE",
    "RECIPES",
    "CrossEncoder",
    "HttpCrossEncoder",
    "KindSearch",
    "Recipe",
    "RerankError",
    "SearchResults",
    "SearchSource",
    "Searcher",
    "TimeWords",
    "build_context",
    "cross_encoder_from_settings",
    "find_time",
    "recipe_named",
]
