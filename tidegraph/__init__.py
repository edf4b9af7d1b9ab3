"""tidegraph: event feeds into a bi-temporal knowledge graph that AI agents use as memory.

The public API, in one import (docs/retrieval.md "Memory retrieval")::

    from tidegraph import Memory, SearchRequest

    async with await Memory.open() as memory:
        await memory.add_episode(group_id="acme", content="Dana: we moved to the Pro plan",
                                 reference_time=datetime.now(UTC))
        results = await memory.search(SearchRequest(query="Acme's plan", group_ids=["acme"]))

Names are imported when first used, so ``import tidegraph`` stays instant and loads nothing of
the pipeline, the stores or the servers. The stores are not public: ``Memory`` reads and
writes them (docs/architecture.md "Store roles").
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidegraph.app.memory import AddResult, Memory, NoStore, ReadOnlyMemory
    from tidegraph.recall.search import SearchResults
    from tidegraph.records.episode import Episode, parse_episode
    from tidegraph.records.errors import InvalidEpisode
    from tidegraph.records.graph import EntityRecord, FactView
    from tidegraph.records.search import Hit, SearchRequest
    from tidegraph.settings import Settings

# name -> the module that defines it
_PUBLIC = {
    "Memory": "tidegraph.app.memory",
    "AddResult": "tidegraph.app.memory",
    "NoStore": "tidegraph.app.memory",
    "ReadOnlyMemory": "tidegraph.app.memory",
    "SearchRequest": "tidegraph.records.search",
    "SearchResults": "tidegraph.recall.search",
    "Hit": "tidegraph.records.search",
    "Episode": "tidegraph.records.episode",
    "parse_episode": "tidegraph.records.episode",
    "InvalidEpisode": "tidegraph.records.errors",
    "FactView": "tidegraph.records.graph",
    "EntityRecord": "tidegraph.records.graph",
    "Settings": "tidegraph.settings",
}

__all__ = [
    "AddResult",
    "EntityRecord",
    "Episode",
    "FactView",
    "Hit",
    "InvalidEpisode",
    "Memory",
    "NoStore",
    "ReadOnlyMemory",
    "SearchRequest",
    "SearchResults",
    "Settings",
    "parse_episode",
]
assert set(__all__) == set(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'tidegraph' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
