"""Fixtures of the integration tests (the session's services come from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.topology_harness import Topology


@pytest.fixture
async def topology(
    kafka_bootstrap: str, neo4j_uri: str, neo4j_driver: Any, topic_prefix: str, tmp_path: Path
) -> AsyncIterator[Topology]:
    """This test's topics, workers and groups on the real broker and server; workers killed,
    groups deleted and topics removed afterwards."""
    topo = Topology(kafka_bootstrap, neo4j_uri, topic_prefix, tmp_path)
    yield topo
    await topo.close(neo4j_driver)
