"""What memory retrieval reads from a graph store (docs/retrieval.md "Memory retrieval").

The Neo4j and embedded stores implement these reads; the recall package only ever sees this
protocol, so the search logic is tested over an exact in-memory implementation.

Scope (every read): only ``scope.group_ids``; facts exactly those ``query_facts`` answers as
of ``scope.asof`` (``AsOf.believed``); entities and communities those created by
``asof.known_at``; episodes those created by ``asof.known_at`` that happened by
``asof.valid_at``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tidegraph.records.search import Hit, Kind, MethodSearch, SearchScope


class SearchSource(Protocol):
    """The store's search methods. Each answers hits best first, at most ``limit``."""

    async def fulltext_search(
        self, scope: SearchScope, kind: Kind, text: str, limit: int
    ) -> list[Hit]:
        """BM25 over a fact's text, an entity's name and summary, an episode's content or a
        community's name and summary."""
        ...

    async def vector_search(
        self, scope: SearchScope, kind: Kind, embedding: list[float], limit: int
    ) -> list[Hit]:
        """Cosine similarity to ``embedding``, scored ``(1 + cos) / 2``."""
        ...

    async def search_lists(
        self, scope: SearchScope, searches: Sequence[MethodSearch]
    ) -> list[list[Hit]]:
        """Each search's hits, in order: ``fulltext_search`` for a text, ``vector_search``
        for an embedding. A search's lists are asked for together, so that a store answers
        them in one read (the embedded store: one hand-off to its thread, not one each)."""
        ...

    async def complete_hits(self, scope: SearchScope, hits: Sequence[Hit]) -> list[Hit]:
        """The hits (read with ``scope.details`` off), in order, with their details and whole
        records: what reading them with it on would have given (``Hit.episodes``,
        ``mentions``, ``subject``, ``object``, ``record``)."""
        ...

    async def expand_facts(
        self, scope: SearchScope, seeds: list[str], hops: int, limit: int
    ) -> list[Hit]:
        """Breadth-first search over valid facts from the ``seeds`` (entity uuids), at most
        ``hops`` facts away; ``Hit.distance`` is the hop a fact was reached at (1: it touches
        a seed)."""
        ...

    async def recent_episode_entities(self, scope: SearchScope, episodes: int) -> list[str]:
        """Uuids of the entities the ``episodes`` most recent episodes mention (most recent
        first)."""
        ...

    async def entity_distances(
        self, scope: SearchScope, centre: str, uuids: list[str], max_hops: int
    ) -> dict[str, int]:
        """Hops over valid facts from ``centre`` to each of ``uuids`` reached within
        ``max_hops`` (unreached ones are absent; the centre itself is 0)."""
        ...
