"""The write rules hold in every store (property test): random sequences of writes of the
same few records (``tests.support.write_folds``) folded through the embedded SQLite store, the
in-memory store and ``tidegraph.stores.write_rules`` alone leave the same records, field by
field, and the writes answer alike. Neo4j: tests/integration/test_write_rules_neo4j.py.
No service needed."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.write_folds import (
    DIM,
    differences,
    reference_snapshot,
    store_snapshot,
    write_sequences,
)
from tidegraph.records.graph import EpisodeWrite
from tidegraph.stores.base import GraphStore
from tidegraph.stores.memory.store import MemoryStore
from tidegraph.stores.sqlite.store import SqliteStore

GROUP = "rules"


async def _opened(kind: str, folder: Path) -> GraphStore:
    store: GraphStore = (
        SqliteStore(folder / "graph", cache_mb=16) if kind == "sqlite" else MemoryStore()
    )
    await store.setup(DIM)
    return store


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
async def test_a_store_folds_writes_as_the_write_rules_do(kind: str, data: st.DataObject) -> None:
    batches: list[list[EpisodeWrite]] = data.draw(write_sequences(GROUP))
    expected = reference_snapshot(GROUP, batches)
    with tempfile.TemporaryDirectory() as folder:  # a new store for each example
        store = await _opened(kind, Path(folder))
        try:
            found = await store_snapshot(store, GROUP, batches)
        finally:
            await store.close()
    assert differences(expected, found) == []
