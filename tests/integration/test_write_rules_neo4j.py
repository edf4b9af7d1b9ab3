"""The write rules hold in Neo4j (property test): random sequences of writes of the same few
records (``tests.support.write_folds``) folded through the Neo4j store and through
``tidegraph.stores.write_rules`` alone leave the same records, field by field, and the writes
answer alike. The embedded and in-memory stores: tests/unit/test_write_rules_property.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.write_folds import (
    DIM,
    differences,
    reference_snapshot,
    store_snapshot,
    write_sequences,
)
from tidegraph.records.graph import EpisodeWrite
from tidegraph.stores.neo4j.store import Neo4jStore

pytestmark = pytest.mark.integration

GROUP = "write-rules-property"


@pytest.fixture
async def neo4j_store(neo4j_uri: str) -> AsyncIterator[Neo4jStore]:
    store = Neo4jStore(neo4j_uri)
    await store.setup(DIM)
    try:
        yield store
    finally:
        await store.forget.delete_group(GROUP)
        await store.close()


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_neo4j_folds_writes_as_the_write_rules_do(
    neo4j_store: Neo4jStore, data: st.DataObject
) -> None:
    batches: list[list[EpisodeWrite]] = data.draw(write_sequences(GROUP))
    expected = reference_snapshot(GROUP, batches)
    await neo4j_store.forget.delete_group(GROUP)  # each example starts from an empty group
    found = await store_snapshot(neo4j_store, GROUP, batches)
    assert differences(expected, found) == []
