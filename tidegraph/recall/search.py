"""``Searcher``: one memory search, ``rerank(search(query))`` (docs/retrieval.md "Memory
retrieval").

A search runs a recipe (tidegraph/recall/recipes.py) over a ``SearchSource`` (a graph store):

1. the scope: the caller's groups, valid at ``valid_at`` as believed at ``known_at``; with no
   ``valid_at``, a time phrase in the query ("in March 2023", see timewords.py) gives it
   (episodes: those said by then);
2. every BM25 and vector search of the recipe at once (``asyncio.gather``), the query
   embedded once, plus, when the recipe walks the graph, the seed entities: those BM25 and
   vector search find for the query, and those the most recent episodes mention; and where
   the question is about a state and names a subject, the episodes that state what it asks
   (its words less the subject's, one BM25 list more: in the same read, or in one of its own
   as known by the known-at when a valid-at is earlier; recency.py);
3. breadth-first search over valid facts from the seeds (and the ends of the best facts
   found, and the centre entity);
4. each kind reranked as the recipe says and cut to its limit; where the question is about a
   state (now, or at a valid-at), a later episode restating an earlier one comes first
   (recency.py), once the episodes that carry the values its statements carry are read (one
   BM25 list more, as known by the known-at: ``recency.value_words``);
5. the hits kept completed with their details (a fact's end names and episodes, an entity's
   mentioning episodes) and whole records: candidates are read without them (a store may
   read their records in part), unless a reranker counts mentions or reads their text;
6. where the query names an identifier (``NW-1002``), the hits of each kind that carry it
   come first (``rerank.carrying_first``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from tidegraph.embed.base import Embedder
from tidegraph.metrics import SEARCH_LATENCY, SEARCHES
from tidegraph.recall.recency import asked_words, asks_current, supersede, value_words
from tidegraph.recall.recipes import (
    KindSearch,
    Recipe,
    recipe_named,
    recipe_problem,
)
from tidegraph.recall.rerank import (
    CrossEncoder,
    by_cross_encoder,
    by_distance,
    by_mentions,
    carrying_first,
    mmr,
    rrf,
)
from tidegraph.recall.source import SearchSource
from tidegraph.recall.timewords import TimeWords, find_time, reads_a_written_day
from tidegraph.records.asof import AsOf
from tidegraph.records.graph import CommunityRecord, FactRecord
from tidegraph.records.search import (
    KINDS,
    Hit,
    Kind,
    MethodSearch,
    SearchRequest,
    SearchScope,
)
from tidegraph.records.times import utc, utcnow
from tidegraph.stores.search_text import identifiers

SEED_ENTITIES = 5  # best entities of the query that seed the walk
SEED_FACTS = 3  # best facts of the query whose ends seed the walk
RECENT_EPISODES = 3  # most recent episodes whose entities seed the walk
DISTANCE_HOPS = 3  # beyond this a hit counts as unreached by the distance reranker
# The episodes that state what a question asks of a subject, whatever their subject
# (recency.py): one BM25 list of the question's words less the subject's, in the first read.
STATING = ("episode", "stating")
STATING_CANDIDATES = 20
# The episodes that carry the values those statements carry (recency.value_words), read when
# they are known: their templates tell which words of the subject's statements are values.
LEXICON_CANDIDATES = 40
# The lists that seed a walk, the only ones it waits for (``Searcher._first_round``).
WALK_SEEDS: set[tuple[Kind, str]] = {("fact", "bm25"), ("entity", "bm25"), ("entity", "vector")}


@dataclass
class SearchResults:
    """What one search found, each kind best first."""

    query: str
    recipe: str
    scope: SearchScope
    facts: list[Hit] = field(default_factory=list)
    entities: list[Hit] = field(default_factory=list)
    episodes: list[Hit] = field(default_factory=list)
    communities: list[Hit] = field(default_factory=list)
    time_words: TimeWords | None = None  # the time phrase that set valid_at, if one did

    def of(self, kind: Kind) -> list[Hit]:
        return {
            "fact": self.facts,
            "entity": self.entities,
            "episode": self.episodes,
            "community": self.communities,
        }[kind]

    def all(self) -> list[Hit]:
        """Every hit, best first: the facts and the episodes (what holds and what was said:
        the answers) interleaved by rank, the best fact, the best episode, the second fact
        and so on; then the entities (who and what they name, each traced to every episode
        that mentions it) and the communities. On the support-chat benchmark this order
        answers far better than any one kind alone (docs/retrieval.md "Retrieval figures")."""
        answers = [self.facts, self.episodes]
        depth = max(len(hits) for hits in answers)
        first = [hits[i] for i in range(depth) for hits in answers if i < len(hits)]
        return first + self.entities + self.communities

    def __len__(self) -> int:
        return sum(len(self.of(kind)) for kind in KINDS)


class Searcher:
    """Runs search recipes over a store (see the module docstring)."""

    def __init__(
        self,
        source: SearchSource,
        embedder: Embedder,
        cross_encoder: CrossEncoder | None = None,
        *,
        time_words: bool = True,
    ) -> None:
        self.source = source
        self.embedder = embedder
        self.cross_encoder = cross_encoder
        self.time_words = time_words

    async def search(self, request: SearchRequest) -> SearchResults:
        """Search the memory of ``request.group_ids`` for ``request.query``: valid at
        ``valid_at`` (default: the moment a time phrase in the query names, relative to
        ``known_at``, else now) as believed at ``known_at`` (default now).
        ``limit`` replaces every kind's limit of the recipe; ``centre`` (an entity uuid)
        seeds the walk, and the distance recipes rank by hops from it."""
        query, group_ids, recipe = request.query, request.group_ids, request.recipe
        valid_at, known_at, include_invalid = (
            request.valid_at,
            request.known_at,
            request.include_invalid,
        )
        limit, centre = request.limit, request.centre
        problem = recipe_problem(
            recipe, centre=centre, cross_encoder=self.cross_encoder is not None
        )
        if problem is not None:
            raise ValueError(problem)
        chosen = recipe_named(recipe)
        text = query.strip()
        if not text:
            raise ValueError("the query is empty: ask a question or name what to recall")
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        groups = tuple(dict.fromkeys(group_ids))
        found_time = None
        if valid_at is None and self.time_words:
            # A written day goes through dateparser (a few words only): off the event loop.
            # Every other phrase is read by a pattern, at once (a thread's hand-off costs more).
            reference = utc(known_at) if known_at else utcnow()
            if reads_a_written_day(text):
                found_time = await asyncio.to_thread(find_time, text, reference)
            else:
                found_time = find_time(text, reference)
            valid_at = found_time.valid_at if found_time else None
        mmr = any(s.reranker == "mmr" for s in chosen.searches)
        asof = AsOf.resolve(valid_at, known_at, include_invalid, None)
        # Candidates are read without their details (a store may then read their records in
        # part: ``SearchScope.details``) unless a reranker counts mentions or reads their text;
        # the hits kept are completed at the end (``_run``).
        details = any(s.reranker in ("mentions", "cross_encoder") for s in chosen.searches)
        scope = SearchScope(groups, asof, embeddings=mmr, details=details)
        # Episodes are those said by the valid-at (given, or named by the query's time words:
        # the state then is what was said by then), and where the question is about a state
        # (now or then) the newest restatement comes first (recency.py).
        current = valid_at is not None or asks_current(text)
        started = time.perf_counter()
        try:
            said_when = found_time.phrase if found_time else ""
            results = await self._run(chosen, text, scope, limit, centre, current, said_when)
        except BaseException:
            SEARCHES.labels(chosen.name, "error").inc()
            raise
        SEARCH_LATENCY.labels(chosen.name).observe(time.perf_counter() - started)
        SEARCHES.labels(chosen.name, "ok").inc()
        results.time_words = found_time
        return results

    async def _run(
        self,
        recipe: Recipe,
        text: str,
        scope: SearchScope,
        limit: int | None,
        centre: str | None,
        current: bool,
        said_when: str = "",
    ) -> SearchResults:
        """``current``: the question asks about a state (``search``): episodes superseded;
        ``said_when``: the query's time phrase, if one set the valid-at."""
        # What is asked of a named subject, searched alone among the episodes (recency.py):
        # the statements of it, whatever their subject, carry the values it takes.
        asked = (
            asked_words(text, said_when)
            if current and recipe.search_for("episode") is not None
            else ""
        )
        found, unseeding = await self._first_round(recipe, text, scope, limit, asked)
        query_embedding: list[float] | None = found.get(("query", "embedding"))
        fact_search = recipe.search_for("fact")
        if fact_search is not None and "bfs" in fact_search.methods:
            seeds = _seeds(found, centre)
            depth = _candidates(fact_search, limit)
            walked = (
                self.source.expand_facts(scope, seeds, fact_search.hops, depth)
                if seeds
                else _nothing()
            )
            # the walk runs beside the lists that do not seed it (``_first_round``)
            walk, lists = await _all([walked, unseeding])
            found |= lists
            found["fact", "bfs"] = walk
        else:
            found |= await unseeding

        ranked = await _all(
            [
                self._rerank(
                    search,
                    found,
                    text,
                    scope,
                    query_embedding,
                    centre,
                    # the best ``limit`` are all RRF needs build, unless restatements further
                    # down may come first (episodes, where the question is about a state)
                    None if search.kind == "episode" and current else limit or search.limit,
                )
                for search in recipe.searches
            ]
        )
        kept: list[Hit] = []
        for search, hits in zip(recipe.searches, ranked, strict=True):
            if search.kind == "episode" and current:
                # The statements that carry the values the statements of what is asked
                # carry, said by the known-at: the templates they fill show which words of
                # the subject's statements are values (recency.py).
                stating = found.get(STATING, [])
                lexicon: list[Hit] = []
                values = value_words(hits, text, said_when, stating) if asked else ""
                if values:
                    known = _lexicon_scope(scope) or scope
                    asked_values = [MethodSearch("episode", LEXICON_CANDIDATES, text=values)]
                    lexicon = (await self.source.search_lists(known, asked_values))[0]
                hits = supersede(hits, text, ignore=said_when, stating=stating, lexicon=lexicon)
            kept += hits[: limit or search.limit]
        # The kept hits with their details, read once for all (candidates were read without).
        results = SearchResults(text, recipe.name, scope)
        for hit in await self.source.complete_hits(scope, kept):
            results.of(hit.kind).append(hit)
        # A question that names an id is about what carries it (read on whole records).
        named = identifiers(text)
        for kind in KINDS if named else ():
            results.of(kind)[:] = carrying_first(results.of(kind), named)
        return results

    async def _first_round(
        self, recipe: Recipe, text: str, scope: SearchScope, limit: int | None, stating: str = ""
    ) -> tuple[dict[tuple[str, str], Any], Awaitable[dict[tuple[str, str], list[Hit]]]]:
        """Every first-round search at once, by (kind, method): the BM25 lists in one read, the
        vector lists in another once the query is embedded; with a walk, its seeds (the
        query's best entities by both methods, the recent episodes' entities), the query's
        embedding as ("query", "embedding") when it was embedded, and the episodes found for
        ``stating`` (what a question about a state asks of its subject) as ``STATING``.

        With a walk, only the lists that seed it (``WALK_SEEDS``, the recent episodes'
        entities) are waited for: the others (the fact vector list, the episodes' and the
        communities' lists, ``STATING``) start at the same time and are the second value,
        still running, for the walk to run beside (docs/retrieval.md "Long histories")."""
        needs_embedding = recipe.uses("vector") or any(s.reranker == "mmr" for s in recipe.searches)
        embedding = (
            asyncio.ensure_future(self.embedder.embed_query(text)) if needs_embedding else None
        )
        walk = recipe.uses("bfs")
        texts: dict[tuple[Kind, str], int] = {}
        nearest: dict[tuple[Kind, str], int] = {}
        for search in recipe.searches:
            for method in search.methods:
                if method in ("bm25", "vector"):
                    wanted = texts if method == "bm25" else nearest
                    wanted[search.kind, method] = _candidates(search, limit)
        if walk:  # the walk's seeds: the query's best entities by both methods
            texts.setdefault(("entity", "bm25"), SEED_ENTITIES)
            nearest.setdefault(("entity", "vector"), SEED_ENTITIES)

        async def read(in_scope: SearchScope, asked: list[MethodSearch]) -> list[list[Hit]]:
            return await self.source.search_lists(in_scope, asked) if asked else []

        async def vectors(wanted: dict[tuple[Kind, str], int]) -> list[list[Hit]]:
            if embedding is None:  # seeds of a walk in a recipe without vector search
                return [[] for _ in wanted]
            if not wanted:
                return []
            vector = await embedding
            asked = [MethodSearch(k, n, embedding=vector) for (k, _), n in wanted.items()]
            return await read(scope, asked)

        async def lists(part: set[tuple[Kind, str]], states: bool) -> dict[tuple[str, str], Any]:
            """The lists of ``part``, the BM25 ones in one read and the vector ones in
            another; ``states``: with the episodes found for ``stating``, as ``STATING``."""
            bm25 = {key: n for key, n in texts.items() if key in part}
            near = {key: n for key, n in nearest.items() if key in part}
            asked = [MethodSearch(k, n, text=text) for (k, _), n in bm25.items()]
            # What the statements of it say, said at any time known by then: which words
            # are values is learned from all of them (a value first said after the valid-at
            # is still a value); the episodes searched are only those said by the valid-at.
            lexicon = _lexicon_scope(scope) if states else None
            stated = [MethodSearch("episode", STATING_CANDIDATES, text=stating)] if states else []
            jobs: list[Awaitable[Any]] = [
                read(scope, asked + (stated if lexicon is None else [])),
                vectors(near),
            ]
            if lexicon is not None:
                jobs.append(read(lexicon, stated))
            done = await _all(jobs)
            found: dict[tuple[str, str], Any] = dict(zip(bm25, done[0][: len(bm25)], strict=True))
            found |= dict(zip(near, done[1], strict=True))
            if states:
                found[STATING] = done[0][-1] if lexicon is None else done[2][0]
            return found

        everything = set(texts) | set(nearest)
        seeding = WALK_SEEDS & everything if walk else everything
        states = bool(stating)
        later = asyncio.ensure_future(lists(everything - seeding, states and walk))
        jobs: list[Awaitable[Any]] = [lists(seeding, states and not walk)]
        if walk:
            jobs.append(self.source.recent_episode_entities(scope, RECENT_EPISODES))
        if embedding is not None:
            jobs.append(embedding)
        try:
            done = await _all(jobs)
        except BaseException:
            later.cancel()
            raise
        found: dict[tuple[str, str], Any] = done[0]
        if walk:
            found["seed", "recent"] = done[1]
        if embedding is not None:
            found["query", "embedding"] = done[-1]
        return found, later

    async def _rerank(
        self,
        search: KindSearch,
        found: dict[tuple[str, str], Any],
        text: str,
        scope: SearchScope,
        query_embedding: list[float] | None,
        centre: str | None,
        kept: int | None,
    ) -> list[Hit]:
        """``kept``: how many the caller keeps, when it keeps only the best."""
        lists: list[list[Hit]] = [found[search.kind, m] for m in search.methods]
        if search.reranker == "none":
            return list(lists[0])
        weights = [search.weight(m) for m in search.methods]
        if search.reranker == "rrf":
            return rrf(lists, k=search.rrf_k, weights=weights, limit=kept)
        fused = rrf(lists, k=search.rrf_k, weights=weights)
        if search.reranker == "mmr":
            assert query_embedding is not None  # embedded for every recipe that uses MMR
            return mmr(fused, query_embedding, search.mmr_lambda)
        if search.reranker == "mentions":
            return by_mentions(fused)
        if search.reranker == "distance":
            assert centre is not None  # checked by search()
            ends = list(dict.fromkeys(u for hit in fused for u in _entities_of(hit)))
            distances = await self.source.entity_distances(scope, centre, ends, DISTANCE_HOPS)
            return by_distance(fused, distances, centre)
        if search.reranker == "cross_encoder":
            assert self.cross_encoder is not None  # checked by search()
            return await by_cross_encoder(fused, text, self.cross_encoder)
        return fused


def _lexicon_scope(scope: SearchScope) -> SearchScope | None:
    """The scope of what was said by the known-at, when ``scope`` asks about an earlier
    valid-at (None: it is the same)."""
    asof = scope.asof
    if asof.valid_at >= asof.known_at:
        return None
    lexicon = AsOf(asof.known_at, asof.known_at, asof.include_invalid, asof.entity_uuid)
    return dataclasses.replace(scope, asof=lexicon)


def _seeds(found: dict[tuple[str, str], Any], centre: str | None) -> list[str]:
    """Where the walk starts: the centre, the query's best entities, the ends of its best
    facts by BM25 (the walk does not wait for the fact vector list: ``WALK_SEEDS``) and the
    entities of the most recent episodes, each once."""
    entities = rrf([found["entity", "bm25"], found["entity", "vector"]], limit=SEED_ENTITIES)
    facts = found.get(("fact", "bm25"), [])[:SEED_FACTS]
    seeds = [centre] if centre else []
    seeds += [hit.uuid for hit in entities]
    seeds += [u for hit in facts for u in _entities_of(hit)]
    seeds += found["seed", "recent"]
    return list(dict.fromkeys(seeds))


def _entities_of(hit: Hit) -> tuple[str, ...]:
    record = hit.record
    if isinstance(record, FactRecord):
        return (record.source_uuid, record.target_uuid)
    if isinstance(record, CommunityRecord):
        return tuple(record.members)
    return (hit.uuid,) if hit.kind == "entity" else ()


async def _nothing() -> list[Hit]:
    return []


async def _all(jobs: list[Awaitable[Any]]) -> list[Any]:
    """``asyncio.gather`` that cancels the jobs still running when one fails."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def _candidates(search: KindSearch, limit: int | None) -> int:
    """Hits each method finds: the recipe's candidates (a fixed depth: up to it, the results
    never depend on the limit), or more when the caller asks for more results than that."""
    return max(search.candidates, limit or search.limit)
