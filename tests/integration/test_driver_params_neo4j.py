"""What the Neo4j store hands the driver: every query's values reach the server unchanged, and
the driver's debug line names them without formatting them (``executor.driver_params``: the
driver builds that line for every query, whatever the log level, and formatting a write's
embeddings cost more of the client's CPU than sending them)."""

from __future__ import annotations

import logging

import pytest

from tidegraph.stores.executor import Tx
from tidegraph.stores.neo4j.plans import kept_plan
from tidegraph.stores.neo4j.store import Neo4jStore

pytestmark = pytest.mark.integration

# A value no repr of the parameters could leave out, and a statement that reads it back.
MARK = 0.123456789
ROWS = [{"n": i, "vector": [MARK] * 384, "tags": ("a", "b")} for i in range(20)]
READ_BACK = (
    "UNWIND $rows AS r RETURN sum(r.n) AS n, sum(size(r.vector)) AS numbers, "
    "min(r.vector[0]) AS first, collect(r.tags)[0] AS tags, $meta.name AS name"
)
EXPECTED = {"n": sum(range(20)), "numbers": 20 * 384, "first": MARK, "tags": ["a", "b"]}


def _run_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "C: RUN" in r.getMessage()]


async def test_a_querys_values_reach_the_server_and_stay_out_of_the_drivers_debug_line(
    neo4j_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = Neo4jStore(neo4j_uri)
    params = {"rows": ROWS, "meta": {"name": "tidegraph"}}

    async def in_a_transaction(tx: Tx) -> list[dict[str, object]]:
        return [
            *(await tx.rows(READ_BACK, params)),
            *(await tx.rows(kept_plan(READ_BACK), params)),  # its values in one map, $p
        ]

    try:
        with caplog.at_level(logging.DEBUG, logger="neo4j"):
            read = await store.ex.rows(READ_BACK, params)
            written = await store.ex.transaction(in_a_transaction)
    finally:
        await store.close()
    assert [*read, *written] == [EXPECTED | {"name": "tidegraph"}] * 3
    lines = _run_lines(caplog)
    assert len(lines) >= 3, "the driver logged no RUN line: the test no longer sees it"
    assert not [line for line in lines if str(MARK) in line]
    assert any("<list of 20>" in line for line in lines)
    assert any("<map of rows, meta>" in line for line in lines)
