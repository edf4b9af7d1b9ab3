"""Fixtures of the integration tests (the session's services come from tests/conftest.py).
Every test under tests/integration/ carries the ``integration`` marker (added here, once), so
that ``pytest -m "not integration"`` runs exactly the tests that need no service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.topology_harness import Topology
from tidegraph.stores.base import GraphStore
from tidegraph.stores.memory.store import MemoryStore
from tidegraph.stores.neo4j.store import Neo4jStore
from tidegraph.stores.sqlite.store import SqliteStore

# The dimension every tidegraph embedder uses by default; the Neo4j test server is shared by
# the whole suite, whose vector indexes must all agree on it.
STORE_DIM = 384


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture
async def topology(
    kafka_bootstrap: str, neo4j_uri: str, neo4j_driver: Any, topic_prefix: str, tmp_path: Path
) -> AsyncIterator[Topology]:
    """This test's topics, workers and groups on the real broker and server; workers killed,
    groups deleted and topics removed afterwards."""
    topo = Topology(kafka_bootstrap, neo4j_uri, topic_prefix, tmp_path)
    yield topo
    await topo.close(neo4j_driver)


@pytest.fixture
def _neo4j_uri_if_needed(request: pytest.FixtureRequest) -> str | None:
    """Resolves (and if need be starts) Neo4j only for the neo4j runs, outside the loop."""
    if "neo4j" in request.node.callspec.params.values():
        return str(request.getfixturevalue("neo4j_uri"))
    return None


async def _opened(kind: str, neo4j_uri: str | None, folder: Path) -> AsyncIterator[GraphStore]:
    """A store of ``kind`` set up for ``STORE_DIM``, closed afterwards."""
    opened: GraphStore
    if kind == "neo4j":
        assert neo4j_uri is not None
        opened = Neo4jStore(neo4j_uri)
    elif kind == "sqlite":
        opened = SqliteStore(folder / "graph", cache_mb=16)
    else:
        opened = MemoryStore()
    await opened.setup(STORE_DIM)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture(params=["neo4j", "sqlite"])
async def store(
    request: pytest.FixtureRequest, _neo4j_uri_if_needed: str | None, tmp_path: Path
) -> AsyncIterator[GraphStore]:
    """Each real store in turn, set up for ``STORE_DIM``: the shared Neo4j server, or a new
    embedded SQLite store in the test's folder (no server)."""
    async for opened in _opened(request.param, _neo4j_uri_if_needed, tmp_path):
        yield opened


@pytest.fixture(params=["neo4j", "sqlite", "memory"])
async def any_store(
    request: pytest.FixtureRequest, _neo4j_uri_if_needed: str | None, tmp_path: Path
) -> AsyncIterator[GraphStore]:
    """The real stores and the in-memory one of the unit tests (which must answer alike)."""
    async for opened in _opened(request.param, _neo4j_uri_if_needed, tmp_path):
        yield opened
