"""The test harness fails loudly, naming the service, when Kafka or Neo4j is unreachable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("variable", "value", "test", "service"),
    [
        ("TIDEGRAPH_TEST_KAFKA_BOOTSTRAP", "127.0.0.1:9",
         "tests/integration/test_smoke.py::test_kafka_produce_consume_round_trip", "Kafka"),
        ("TIDEGRAPH_TEST_NEO4J_URI", "bolt://127.0.0.1:9",
         "tests/integration/test_smoke.py::test_neo4j_write_read", "Neo4j"),
    ],
)  # fmt: skip
def test_unreachable_service_fails_and_names_it(
    variable: str, value: str, test: str, service: str
) -> None:
    env = dict(os.environ, **{variable: value})
    result = subprocess.run(
        [sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider", "-rA"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"{service} is not reachable at {value}" in output
    assert "skipped" not in output.splitlines()[-1]
    assert "1 error" in output.splitlines()[-1] or "1 failed" in output.splitlines()[-1]


def test_kafka_cluster_ids_never_start_with_a_dash() -> None:
    from tests.support.local_services import _kafka_cluster_id

    ids = [_kafka_cluster_id() for _ in range(5000)]  # ~1 in 64 would start with '-'
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    "service", ["kafka", "neo4j", "connect", "debezium", "converter", "registry"]
)
def test_the_services_poms_are_found_in_the_checkout(service: str) -> None:
    """`tidegraph services up` on a machine with no cached jars fetches them with these poms."""
    from tests.support.local_services import POM_DIR

    assert (POM_DIR / service / "pom.xml").is_file()
    assert POM_DIR == REPO / "deploy" / "local"
