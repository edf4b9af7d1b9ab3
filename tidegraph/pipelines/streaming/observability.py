"""The worker's HTTP endpoint: ``GET /metrics`` (Prometheus text format) on one port.

A small route table on the standard library's threading HTTP server, so that health routes
(``/healthz``, ``/readyz``) can be added with :meth:`ObservabilityServer.add_route` on the
same port. It runs in a daemon thread: scraping never waits for the event loop.
"""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Route = Callable[[], Response]


def metrics_route() -> Response:
    return Response(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)


class ObservabilityServer:
    def __init__(self, port: int, host: str = "0.0.0.0") -> None:
        self.host = host
        self.port = port
        self.routes: dict[str, Route] = {"/metrics": metrics_route}
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def add_route(self, path: str, route: Route) -> None:
        self.routes[path] = route

    def start(self) -> None:
        routes = self.routes

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - stdlib naming
                route = routes.get(self.path.split("?", 1)[0])
                try:
                    response = route() if route else Response(404, b"not found\n")
                except Exception:  # a broken route must not kill the server
                    log.exception("route %s failed", self.path)
                    response = Response(500, b"internal error\n")
                self.send_response(response.status)
                self.send_header("Content-Type", response.content_type)
                self.send_header("Content-Length", str(len(response.body)))
                self.end_headers()
                self.wfile.write(response.body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                log.debug("http: " + format, *args)

        self._httpd = http.server.ThreadingHTTPServer((self.host, self.port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="tidegraph-http", daemon=True
        )
        self._thread.start()
        log.info("serving %s on http://%s:%d", ", ".join(sorted(self.routes)), self.host, self.port)

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
