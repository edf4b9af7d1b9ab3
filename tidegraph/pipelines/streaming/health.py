"""The worker's health state and the small HTTP server beside its metrics.

One port (``TIDEGRAPH_METRICS_PORT``) serves three paths:

- ``/metrics``: the Prometheus text exposition of the registry (every ``tidegraph_*`` metric).
- ``/healthz``: liveness. 200 while the process is alive and, when an event loop is watched,
  the loop has run its heartbeat recently; 503 when the loop is blocked (restart the pod).
- ``/readyz``: readiness. 200 when Kafka is connected, Neo4j is reachable and no stage is
  stuck (work in flight but no progress for ``stuck_after_seconds``); else 503. The JSON body
  names every check and which failed.

The worker owns a :class:`HealthState`: it sets ``kafka_connected`` / ``neo4j_reachable``
(flags, or cheap callables read on each request) and calls :meth:`HealthState.watch_loop`
once its loop runs. Stuck detection needs no further wiring: in-flight work per stage is read
from the ``tidegraph_in_flight_episodes`` gauge and progress from the
``tidegraph_stage_events_total`` counter the stages already keep (a stage whose counter moved
between two checks progressed); :meth:`HealthState.mark_progress` marks progress explicitly.
Serve it standalone with :func:`start_http_server`, or add :func:`health_routes` to the
worker's existing ``/metrics`` server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from tidegraph import metrics

log = logging.getLogger(__name__)

R = TypeVar("R")

Check = bool | Callable[[], bool] | None
"""A readiness input: a flag, a cheap callable, or ``None`` (not applicable, always passes)."""


def _in_flight_from_gauge() -> dict[str, float]:
    """Current value of ``tidegraph_in_flight_episodes`` per stage label."""
    out: dict[str, float] = {}
    for family in metrics.IN_FLIGHT.collect():
        for sample in family.samples:
            stage = sample.labels.get("stage")
            if stage is not None:
                out[stage] = out.get(stage, 0.0) + sample.value
    return out


def _stage_events_from_counter() -> dict[str, float]:
    """Records handled so far per stage (any outcome), from ``tidegraph_stage_events_total``."""
    out: dict[str, float] = {}
    for family in metrics.STAGE_EVENTS.collect():
        for sample in family.samples:
            stage = sample.labels.get("stage")
            if stage is not None and sample.name.endswith("_total"):
                out[stage] = out.get(stage, 0.0) + sample.value
    return out


@dataclass
class HealthState:
    kafka_connected: Check = False
    neo4j_reachable: Check = None
    stuck_after_seconds: float = 300.0
    loop_stall_seconds: float = 30.0
    in_flight: Callable[[], Mapping[str, float]] = _in_flight_from_gauge
    handled: Callable[[], Mapping[str, float]] = _stage_events_from_counter
    clock: Callable[[], float] = time.monotonic
    last_progress: dict[str, float] = field(default_factory=dict)
    started_at: float = field(default=-1.0)
    _last_heartbeat: float | None = field(default=None, repr=False)
    _watching: bool = field(default=False, repr=False)
    _handled_seen: dict[str, float] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.started_at < 0:
            self.started_at = self.clock()

    # ---- inputs from the worker -----------------------------------------------------------
    def mark_progress(self, stage: str) -> None:
        """A stage finished (or dead-lettered) a record: it is not stuck."""
        now = self.clock()
        with self._lock:
            self.last_progress[stage] = now

    def heartbeat(self) -> None:
        """The watched event loop ran; called by :meth:`watch_loop`'s callback."""
        self._last_heartbeat = self.clock()

    def watch_loop(self, loop: asyncio.AbstractEventLoop, interval: float = 1.0) -> None:
        """Beat from inside ``loop`` every ``interval`` s; ``/healthz`` fails if beats stop.
        How late each beat ran is the loop's lag (``tidegraph_event_loop_lag_seconds``)."""

        self._watching = True
        due: float | None = None  # when the next beat was scheduled for (the loop's clock)

        def beat() -> None:
            nonlocal due
            if self._watching:
                now = loop.time()
                if due is not None:
                    metrics.EVENT_LOOP_LAG.observe(max(0.0, now - due))
                self.heartbeat()
                due = now + interval
                loop.call_at(due, beat)

        self.heartbeat()
        loop.call_soon_threadsafe(beat)

    def unwatch_loop(self) -> None:
        """Stop the heartbeat (on shutdown); liveness no longer looks at the loop."""
        self._watching = False
        self._last_heartbeat = None

    # ---- checks -------------------------------------------------------------------------
    @staticmethod
    def _evaluate(check: Check) -> tuple[bool, str]:
        if check is None:
            return True, "not applicable"
        if callable(check):
            try:
                ok = bool(check())
            except Exception as exc:  # a failing probe means "not ready", never a 500
                return False, f"check raised {type(exc).__name__}: {exc}"
            return ok, "ok" if ok else "check returned false"
        return bool(check), "ok" if check else "flag is false"

    def stuck_stages(self) -> dict[str, dict[str, float]]:
        """Stages with work in flight and no progress for ``stuck_after_seconds``."""
        now = self.clock()
        stuck: dict[str, dict[str, float]] = {}
        handled = self.handled()
        with self._lock:
            for stage, count in handled.items():  # a stage whose counter moved progressed
                if self._handled_seen.get(stage) != count:  # first sight counts as progress
                    self.last_progress[stage] = now
                    self._handled_seen[stage] = count
            progress = dict(self.last_progress)
        for stage, n in self.in_flight().items():
            if n <= 0:
                continue
            idle = now - progress.get(stage, self.started_at)
            if idle > self.stuck_after_seconds:
                stuck[stage] = {"in_flight": n, "seconds_since_progress": round(idle, 1)}
        return stuck

    def liveness(self) -> tuple[bool, dict[str, object]]:
        if self._last_heartbeat is None:
            return True, {"status": "alive", "event_loop": "not watched"}
        lag = self.clock() - self._last_heartbeat
        ok = lag <= self.loop_stall_seconds
        return ok, {
            "status": "alive" if ok else "event loop blocked",
            "seconds_since_loop_heartbeat": round(lag, 1),
        }

    def readiness(self) -> tuple[bool, dict[str, object]]:
        checks: dict[str, dict[str, object]] = {}
        for name, check in (("kafka", self.kafka_connected), ("neo4j", self.neo4j_reachable)):
            ok, detail = self._evaluate(check)
            checks[name] = {"ok": ok, "detail": detail}
        stuck = self.stuck_stages()
        checks["stuck"] = {
            "ok": not stuck,
            "detail": (
                "no stage stuck"
                if not stuck
                else f"in-flight work without progress for > {self.stuck_after_seconds:g}s"
            ),
            "stages": stuck,
        }
        failed = [name for name, c in checks.items() if not c["ok"]]
        body: dict[str, object] = {
            "status": "ready" if not failed else "not ready",
            "failed": failed,
            "checks": checks,
        }
        return not failed, body


JSON = "application/json"


def _json_response(ok: bool, body: dict[str, object]) -> tuple[int, bytes, str]:
    status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
    return int(status), json.dumps(body).encode() + b"\n", JSON


def health_routes(
    state: HealthState, make_response: Callable[[int, bytes, str], R]
) -> dict[str, Callable[[], R]]:
    """``/healthz`` and ``/readyz`` as routes for another server's route table.

    ``make_response(status, body, content_type)`` builds that server's response, e.g. for the
    worker's ``tidegraph.pipelines.streaming.observability.ObservabilityServer``::

        for path, route in health_routes(state, Response).items():
            server.add_route(path, route)
    """
    return {
        "/healthz": lambda: make_response(*_json_response(*state.liveness())),
        "/readyz": lambda: make_response(*_json_response(*state.readiness())),
    }


class _Handler(BaseHTTPRequestHandler):
    routes: dict[str, Callable[[], tuple[int, bytes, str]]]

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        route = self.routes.get(self.path.split("?", 1)[0])
        if route is None:
            status, payload, ctype = 404, b"not found\n", "text/plain; charset=utf-8"
        else:
            status, payload, ctype = route()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("health http: " + format, *args)


class HealthServer:
    """A running health/metrics server; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, httpd: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def start_http_server(
    port: int,
    state: HealthState,
    *,
    addr: str = "0.0.0.0",
    registry: CollectorRegistry = REGISTRY,
) -> HealthServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` from a daemon thread.

    Standalone; a worker that already serves ``/metrics`` adds :func:`health_routes` instead.
    """
    routes: dict[str, Callable[[], tuple[int, bytes, str]]] = {
        "/metrics": lambda: (200, generate_latest(registry), CONTENT_TYPE_LATEST),
        **health_routes(state, lambda status, body, ctype: (status, body, ctype)),
    }
    handler = type("HealthHandler", (_Handler,), {"routes": routes})
    httpd = ThreadingHTTPServer((addr, port), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="tidegraph-health-http", daemon=True)
    thread.start()
    server = HealthServer(httpd, thread)
    log.info("metrics and health on http://%s:%d (/metrics /healthz /readyz)", addr, server.port)
    return server
