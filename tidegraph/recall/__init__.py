"""Memory retrieval (README "Memory retrieval"): ``f = builder(rerank(search(query)))`` as in
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
