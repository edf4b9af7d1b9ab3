"""TLS and SASL settings, end to end: a worker that talks to Kafka over SASL_SSL and to Neo4j
over TLS processes a feed; wrong credentials or a wrong CA stop the worker at startup with a
message naming the settings to fix.

The local services (``tests.support.local_services``) serve a SASL_SSL listener (PLAIN user, a
self-signed certificate) beside the plaintext one, and Bolt accepts TLS with the same
certificate, so the same settings an operator sets for a secured cluster are exercised here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.topology_harness import Topology
from tests.support.crm_feed import crm_feed
from tests.support.local_services import (
    LOCAL_SASL_PASSWORD,
    LOCAL_SASL_USERNAME,
    LocalServices,
    LocalSettings,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def local(kafka_bootstrap: str, neo4j_uri: str) -> LocalServices:
    """The local services started for the tests (their TLS listener and certificate)."""
    services = LocalServices()
    if kafka_bootstrap != services.kafka_address or neo4j_uri != services.neo4j_address:
        pytest.fail(
            "the TLS/SASL tests need the local services (make services-up): unset "
            "TIDEGRAPH_TEST_KAFKA_BOOTSTRAP / TIDEGRAPH_TEST_NEO4J_URI",
            pytrace=False,
        )
    if not services.ca_file.exists():
        pytest.fail(
            "the running local services predate their TLS listeners: restart them with "
            "`make services-down services-up`",
            pytrace=False,
        )
    return services


def secured(local: LocalServices, *, password: str = LOCAL_SASL_PASSWORD, ca: Path | None = None):
    """Settings fields for SASL_SSL to the local broker and TLS to the local Neo4j."""
    return {
        "kafka_security_protocol": "SASL_SSL",
        "kafka_sasl_mechanism": "PLAIN",
        "kafka_sasl_username": LOCAL_SASL_USERNAME,
        "kafka_sasl_password": password,
        "kafka_ssl_cafile": local.ca_file,
        "neo4j_ca_file": ca or local.ca_file,
    }


def as_env(fields: dict[str, Any]) -> dict[str, str]:
    return {f"TIDEGRAPH_{k.upper()}": str(v) for k, v in fields.items()}


@pytest.fixture
async def secure_topology(
    local: LocalServices, neo4j_uri: str, neo4j_driver: Any, topic_prefix: str, tmp_path: Path
) -> Any:
    fields = secured(local)
    topo = Topology(
        local.kafka_secure_address,
        neo4j_uri,
        topic_prefix,
        tmp_path,
        extra_env=as_env(fields),
        extra_settings=fields,
    )
    yield topo
    await topo.close(neo4j_driver)


async def test_worker_over_sasl_ssl_and_neo4j_tls_processes_the_feed(
    secure_topology: Topology,
) -> None:
    topo = secure_topology
    worker = topo.start_worker()
    feed = crm_feed(24, 3, run=topo.run)
    report = await topo.produce(feed)  # this process's producer: SASL_SSL as well
    assert len(report.sent) == len(feed) and not report.refused and not report.invalid
    await topo.wait_reflected(report)
    groups = sorted({e["group_id"] for e in feed})
    assert await topo.episodes_written(groups) == len(feed)
    assert worker.alive()


def start_and_wait_exit(topo: Topology, **env: str) -> tuple[int, str]:
    worker = topo.start_worker(**env)
    try:
        code = worker.process.wait(90)
    except subprocess.TimeoutExpired:
        worker.kill()
        raise AssertionError(f"the worker kept running:\n{worker.log_tail()}") from None
    return code, " ".join(worker.log.read_text(errors="replace").split())  # unwrapped


async def test_wrong_sasl_password_stops_the_worker_naming_the_settings(
    secure_topology: Topology,
) -> None:
    code, log = start_and_wait_exit(secure_topology, TIDEGRAPH_KAFKA_SASL_PASSWORD="wrong")
    assert code == 1, log
    assert "TIDEGRAPH_KAFKA_SASL_" in log and "SASL_SSL" in log, log


async def test_neo4j_certificate_from_another_ca_is_refused(
    secure_topology: Topology, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca"
    other.mkdir()
    stranger = LocalServices(LocalSettings(services_dir=other))
    stranger.ensure_certificate()  # a different self-signed certificate
    code, log = start_and_wait_exit(secure_topology, TIDEGRAPH_NEO4J_CA_FILE=str(stranger.ca_file))
    assert code == 1, log
    assert "TIDEGRAPH_NEO4J_URI" in log, log


async def test_inconsistent_security_settings_fail_before_connecting(
    secure_topology: Topology,
) -> None:
    code, log = start_and_wait_exit(
        secure_topology,
        TIDEGRAPH_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        TIDEGRAPH_KAFKA_SASL_USERNAME="",
    )
    assert code == 1, log
    assert "needs TIDEGRAPH_KAFKA_SASL_USERNAME" in log, log
