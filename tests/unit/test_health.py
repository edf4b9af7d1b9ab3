"""The worker's health server: /healthz, /readyz and /metrics over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import REGISTRY

from tidegraph import metrics
from tidegraph.pipelines.streaming.health import HealthState, health_routes, start_http_server


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def get(port: int, path: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read(), resp.headers["Content-Type"]
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers["Content-Type"]


@pytest.fixture
def served():
    clock = FakeClock()
    in_flight: dict[str, float] = {}
    state = HealthState(
        kafka_connected=True,
        neo4j_reachable=lambda: True,
        stuck_after_seconds=60,
        in_flight=lambda: in_flight,
        handled=dict,
        clock=clock,
    )
    server = start_http_server(0, state, addr="127.0.0.1")
    try:
        yield server.port, state, clock, in_flight
    finally:
        server.close()


def test_healthz_is_200_while_alive(served):
    port, _, _, _ = served
    status, body, ctype = get(port, "/healthz")
    assert status == 200
    assert ctype == "application/json"
    assert json.loads(body)["status"] == "alive"


def test_readyz_200_then_503_naming_the_failed_check(served):
    port, state, _, _ = served
    status, body, _ = get(port, "/readyz")
    assert status == 200, body
    assert json.loads(body)["failed"] == []

    state.kafka_connected = False
    status, body, _ = get(port, "/readyz")
    doc = json.loads(body)
    assert status == 503
    assert doc["status"] == "not ready"
    assert doc["failed"] == ["kafka"]
    assert doc["checks"]["kafka"]["ok"] is False
    assert doc["checks"]["neo4j"]["ok"] is True

    state.kafka_connected = True
    assert get(port, "/readyz")[0] == 200


def test_readyz_reports_a_raising_probe_as_not_ready(served):
    port, state, _, _ = served

    def boom() -> bool:
        raise ConnectionError("bolt refused")

    state.neo4j_reachable = boom
    status, body, _ = get(port, "/readyz")
    doc = json.loads(body)
    assert status == 503
    assert doc["failed"] == ["neo4j"]
    assert "ConnectionError" in doc["checks"]["neo4j"]["detail"]


def test_stuck_stage_fails_readiness_until_it_progresses(served):
    port, state, clock, in_flight = served
    in_flight["extract"] = 3
    in_flight["write"] = 0
    clock.now += 30
    assert get(port, "/readyz")[0] == 200  # in flight, but not for long yet

    clock.now += 31  # 61 s since start without progress on "extract"
    status, body, _ = get(port, "/readyz")
    doc = json.loads(body)
    assert status == 503
    assert doc["failed"] == ["stuck"]
    assert list(doc["checks"]["stuck"]["stages"]) == ["extract"]
    assert doc["checks"]["stuck"]["stages"]["extract"]["in_flight"] == 3

    state.mark_progress("extract")
    assert get(port, "/readyz")[0] == 200
    clock.now += 61
    assert get(port, "/readyz")[0] == 503
    in_flight["extract"] = 0  # idle without work is not stuck
    assert get(port, "/readyz")[0] == 200


def test_stuck_reads_the_stage_metrics_by_default():
    """In flight from the gauge, progress from the events counter: no wiring needed."""
    clock = FakeClock()
    state = HealthState(kafka_connected=True, stuck_after_seconds=10, clock=clock)
    stage = "test_health_gauge"
    gauge = metrics.IN_FLIGHT.labels(stage=stage)
    gauge.set(2)
    try:
        clock.now += 11
        assert stage in state.stuck_stages()  # in flight since start, never handled one
        metrics.STAGE_EVENTS.labels(stage=stage, outcome="ok").inc()
        assert stage not in state.stuck_stages()  # the counter moved: progress
        clock.now += 5
        assert stage not in state.stuck_stages()
        clock.now += 6
        assert state.stuck_stages()[stage] == {"in_flight": 2, "seconds_since_progress": 11}
        metrics.STAGE_EVENTS.labels(stage=stage, outcome="dead_lettered").inc()
        assert stage not in state.stuck_stages()
        clock.now += 11
        assert stage in state.stuck_stages()
    finally:
        gauge.set(0)
    assert stage not in state.stuck_stages()  # nothing in flight: idle, not stuck


def test_metrics_serves_the_tidegraph_registry(served):
    port, _, _, _ = served
    metrics.STAGE_EVENTS.labels(stage="test_health", outcome="ok").inc()
    status, body, ctype = get(port, "/metrics")
    assert status == 200
    assert ctype.startswith("text/plain")
    text = body.decode()
    assert "# TYPE tidegraph_stage_events_total counter" in text
    assert 'tidegraph_stage_events_total{outcome="ok",stage="test_health"}' in text
    assert "# TYPE tidegraph_end_to_end_latency_seconds histogram" in text
    assert get(port, "/nope")[0] == 404


async def test_healthz_fails_when_the_watched_loop_is_blocked():
    state = HealthState(kafka_connected=True, loop_stall_seconds=0.3)
    server = start_http_server(0, state, addr="127.0.0.1")
    try:
        state.watch_loop(asyncio.get_running_loop(), interval=0.05)
        await asyncio.sleep(0.2)
        status, _, _ = await asyncio.to_thread(get, server.port, "/healthz")
        assert status == 200
        time.sleep(0.5)  # noqa: ASYNC251 (blocks the event loop on purpose: no heartbeats)
        status, body, _ = get(server.port, "/healthz")
        assert status == 503
        assert json.loads(body)["status"] == "event loop blocked"
        await asyncio.sleep(0.1)  # the loop runs again and beats
        status, _, _ = await asyncio.to_thread(get, server.port, "/healthz")
        assert status == 200
    finally:
        state.unwatch_loop()
        server.close()


def _lag_beats(over: str) -> float:
    """Beats of the watched loop counted in ``tidegraph_event_loop_lag_seconds``, all or (with
    ``over``, a bucket bound) only those later than that."""
    name = "tidegraph_event_loop_lag_seconds"
    count = REGISTRY.get_sample_value(f"{name}_count") or 0.0
    within = REGISTRY.get_sample_value(f"{name}_bucket", {"le": over}) or 0.0
    return count - within


async def test_the_event_loop_lag_metric_reports_a_blocked_loop():
    state = HealthState(kafka_connected=True)
    before = _lag_beats("0.25")
    try:
        state.watch_loop(asyncio.get_running_loop(), interval=0.05)
        await asyncio.sleep(0.2)
        time.sleep(0.4)  # noqa: ASYNC251 (blocks the event loop on purpose: a late beat)
        await asyncio.sleep(0.1)  # the loop runs again and beats, late
        assert _lag_beats("0.25") >= before + 1
    finally:
        state.unwatch_loop()


def test_health_routes_mount_on_the_workers_observability_server():
    from tidegraph.pipelines.streaming.observability import ObservabilityServer, Response

    state = HealthState(kafka_connected=True, neo4j_reachable=False)
    server = ObservabilityServer(0, "127.0.0.1")
    for path, route in health_routes(state, Response).items():
        server.add_route(path, route)
    server.start()
    try:
        assert get(server.port, "/healthz")[0] == 200
        status, body, ctype = get(server.port, "/readyz")
        assert (status, ctype) == (503, "application/json")
        assert json.loads(body)["failed"] == ["neo4j"]
        state.neo4j_reachable = True
        assert get(server.port, "/readyz")[0] == 200
        assert b"tidegraph_stage_events_total" in get(server.port, "/metrics")[1]
    finally:
        server.stop()
