"""Shared fixtures.

Integration tests get the real Kafka broker and Neo4j server through ``kafka_bootstrap`` and
``neo4j_uri``. By default the fixtures start this checkout's local services
(``tests.support.local_services``, on free ports) unless this checkout already runs them, and
stop at the end of the session only what they started; a Kafka or Neo4j that only answers on a
port (another checkout's) is never used.
Point at other servers with TIDEGRAPH_TEST_KAFKA_BOOTSTRAP / TIDEGRAPH_TEST_NEO4J_URI (then
nothing is started). The tests of declared sources also take ``postgres_dsn``,
``connect_url`` and ``schema_registry_url``: this checkout's PostgreSQL, Kafka Connect (with
Debezium) and schema registry (Apicurio Registry), started only when such a test runs. A
service that cannot be reached FAILS the tests that need it, naming the service; nothing is
ever skipped for a missing service.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.local_services import LocalServices, ServiceError, probe_kafka_sync, probe_neo4j

KEEP = os.environ.get("TIDEGRAPH_KEEP_SERVICES") == "1"


class _Services:
    """Starts the local services at most once per session, on first need."""

    def __init__(self) -> None:
        self.local = LocalServices(free_ports=True)
        self.started: list[str] = []
        self.errors: dict[str, str] = {}
        self.ready: set[str] = set()

    def ensure(self, name: str, external: str | None) -> None:
        if name in self.ready:
            return
        if name in self.errors:
            pytest.fail(self.errors[name], pytrace=False)
        if external:
            ok = probe_kafka_sync(external, 5.0) if name == "kafka" else probe_neo4j(external, 5.0)
            if not ok:
                self.errors[name] = (
                    f"{_title(name)} is not reachable at {external} (set by "
                    f"TIDEGRAPH_TEST_{'KAFKA_BOOTSTRAP' if name == 'kafka' else 'NEO4J_URI'}). "
                    f"Start it, or unset the variable to let the tests start a local one."
                )
                pytest.fail(self.errors[name], pytrace=False)
            self.ready.add(name)
            return
        try:
            started = self.local.up((name,))
        except ServiceError as exc:
            self.errors[name] = f"{_title(name)} could not be started for the tests: {exc}"
            pytest.fail(self.errors[name], pytrace=False)
        self.started += [n for n, s in started.items() if s]
        self.ready.update(started)

    def stop_started(self) -> None:
        if self.started and not KEEP:
            self.local.down(tuple(self.started))


def _title(name: str) -> str:
    titles = {
        "kafka": "Kafka",
        "neo4j": "Neo4j",
        "postgres": "PostgreSQL",
        "registry": "The schema registry",
    }
    return titles.get(name, "Kafka Connect")


@pytest.fixture(scope="session")
def _services() -> Iterator[_Services]:
    services = _Services()
    yield services
    services.stop_started()


@pytest.fixture(scope="session")
def kafka_bootstrap(_services: _Services) -> str:
    external = os.environ.get("TIDEGRAPH_TEST_KAFKA_BOOTSTRAP")
    _services.ensure("kafka", external)
    return external or _services.local.kafka_address


@pytest.fixture(scope="session")
def neo4j_uri(_services: _Services) -> str:
    external = os.environ.get("TIDEGRAPH_TEST_NEO4J_URI")
    _services.ensure("neo4j", external)
    return external or _services.local.neo4j_address


@pytest.fixture(scope="session")
def postgres_dsn(_services: _Services) -> str:
    """This checkout's PostgreSQL (logical replication on), started on first need."""
    _services.ensure("postgres", None)
    return _services.local.postgres_dsn


@pytest.fixture(scope="session")
def connect_url(_services: _Services, kafka_bootstrap: str) -> str:
    """This checkout's Kafka Connect worker with Debezium's PostgreSQL connector, on this
    checkout's Kafka, started on first need."""
    _services.ensure("connect", None)
    return _services.local.connect_url


@pytest.fixture(scope="session")
def schema_registry_url(_services: _Services) -> str:
    """This checkout's schema registry (Apicurio Registry): the URL of its Confluent-compatible
    API, started on first need. It keeps every schema for the session: a test that counts
    schema ids registers schemas of its own."""
    _services.ensure("registry", None)
    return _services.local.registry_url


@pytest.fixture
def topic_prefix() -> str:
    """A unique topic prefix: each test gets its own topics."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def unique_id() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture
async def neo4j_driver(neo4j_uri: str) -> AsyncIterator[object]:
    from neo4j import AsyncGraphDatabase

    driver = AsyncGraphDatabase.driver(neo4j_uri, auth=None)
    try:
        yield driver
    finally:
        await driver.close()


@pytest.fixture
async def group_id(neo4j_driver: object) -> AsyncIterator[str]:
    """A group id of this test's own; every node of it is deleted afterwards."""
    gid = f"test-{uuid.uuid4().hex[:12]}"
    yield gid
    await neo4j_driver.execute_query(  # type: ignore[attr-defined]
        "MATCH (n {group_id: $g}) DETACH DELETE n", g=gid
    )
