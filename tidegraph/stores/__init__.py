"""Graph stores: Neo4j (production), the embedded SQLite store and the in-memory store, each
the write path holding one object per role (``base``, ``roles``). Not public API: ``Memory``
is."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidegraph.records.graph import EpisodeWrite, FactClosure
from tidegraph.stores.base import GraphStore
from tidegraph.stores.errors import (
    EpisodeConflictError,
    StoreIntegrityError,
    StoreSchemaError,
    StoreUnreachable,
)

if TYPE_CHECKING:
    from tidegraph.settings import Settings

__all__ = [
    "EpisodeConflictError",
    "EpisodeWrite",
    "FactClosure",
    "GraphStore",
    "StoreIntegrityError",
    "StoreSchemaError",
    "StoreUnreachable",
    "open_store",
]


def open_store(settings: Settings) -> GraphStore:
    """The store the settings choose (call ``setup(embedding_dim)`` before use), writing for
    the deployment of ``topic_prefix`` (docs/streaming.md "Change stream")."""
    if settings.store == "neo4j":
        from tidegraph.connections import neo4j_driver_options
        from tidegraph.stores.neo4j.store import Neo4jStore

        return Neo4jStore(
            settings.neo4j_uri,
            settings.neo4j_user,
            settings.neo4j_password.get_secret_value(),
            settings.neo4j_database,
            driver_options=neo4j_driver_options(settings),
            deployment=settings.topic_prefix,
        )
    if settings.store == "embedded":
        from tidegraph.stores.sqlite.store import SqliteStore

        return SqliteStore(
            settings.data_dir / "graph",
            settings.embedded_cache_mb,
            deployment=settings.topic_prefix,
        )
    raise ValueError(f"unknown store {settings.store!r} (expected 'neo4j' or 'embedded')")
