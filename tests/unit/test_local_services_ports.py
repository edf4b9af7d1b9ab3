"""The test fixtures never use another checkout's Kafka or Neo4j (issue 31 item 15): a port
held by a listener this checkout did not start is refused by name when the ports are the
configured ones, avoided with ``free_ports``, and never reported as ours."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.local_services import LocalServices, LocalSettings, ServiceError


@pytest.fixture
def foreign_listener() -> Iterator[int]:
    """A plain socket listening on a loopback port: someone else's service."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def services(tmp_path: Path, port: int, **kw: bool) -> LocalServices:
    settings = LocalSettings(
        services_dir=tmp_path / "services",
        cache_dir=tmp_path / "cache",
        local_neo4j_bolt_port=port,
        local_kafka_port=port,
        local_postgres_port=port,
        local_connect_port=port,
        local_registry_port=port,
    )
    return LocalServices(settings, **kw)


def test_a_foreign_listener_on_the_configured_port_is_refused_naming_the_setting(
    tmp_path: Path, foreign_listener: int
):
    local = services(tmp_path, foreign_listener)
    with pytest.raises(ServiceError) as refused:
        local.up(("neo4j",))
    message = str(refused.value)
    assert str(foreign_listener) in message and "TIDEGRAPH_LOCAL_NEO4J_BOLT_PORT" in message
    with pytest.raises(ServiceError, match="TIDEGRAPH_LOCAL_KAFKA_PORT"):
        local.up(("kafka",))
    with pytest.raises(ServiceError, match="TIDEGRAPH_LOCAL_POSTGRES_PORT"):
        local._choose_ports("postgres")
    with pytest.raises(ServiceError, match="TIDEGRAPH_LOCAL_CONNECT_PORT"):
        local._choose_ports("connect")
    with pytest.raises(ServiceError, match="TIDEGRAPH_LOCAL_REGISTRY_PORT"):
        local._choose_ports("registry")


def test_with_free_ports_a_service_starts_elsewhere(tmp_path: Path, foreign_listener: int):
    local = services(tmp_path, foreign_listener, free_ports=True)
    for name in ("kafka", "neo4j", "postgres", "connect", "registry"):
        chosen = local._choose_ports(name)
        assert foreign_listener not in chosen.values(), chosen
        assert len(set(chosen.values())) == len(chosen)


def test_status_never_reports_a_foreign_service_as_ours(tmp_path: Path, foreign_listener: int):
    local = services(tmp_path, foreign_listener)
    for status in local.status():
        assert (status.running, status.ready, status.pid) == (False, False, None), status
    assert local.down() == []  # and nothing of it is stopped
