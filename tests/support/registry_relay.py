"""A relay on loopback in front of a real schema registry (this checkout's, the
``schema_registry_url`` fixture): it forwards every request as it came and the registry's
answer as it went, counts the fetches of schemas by id, and cuts the registry off on cue (an
outage: HTTP 503 for the next requests), which the registry itself cannot be made to do for a
few requests without stopping it for every other test.

    with RegistryRelay(schema_registry_url) as relay:
        decoder = RegistryDecoder(RegistrySpec(url=relay.url))
        relay.outage(times=3, paths="/schemas/ids/")   # the next 3 fetches by id get 503
        relay.fetches                                   # {schema id: fetches that reached it}
"""

from __future__ import annotations

import http.server
import re
import threading
import urllib.error
import urllib.request
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

_SCHEMA_BY_ID = re.compile(r"^/schemas/ids/(\d+)(/schema)?$")
FORWARD_TIMEOUT_SECONDS = 30.0


class RegistryRelay:
    """Forwards to ``upstream`` (a registry's Confluent-compatible API, base path included);
    ``url`` is the same API through the relay."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.base_path = urlsplit(self.upstream).path
        self.fetches: dict[int, int] = {}
        self._lock = threading.Lock()
        self._outage = 0
        self._outage_paths = "/"
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.relay = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{self.base_path}"

    def outage(self, times: int, paths: str = "/") -> None:
        """The next ``times`` requests whose path (below the API's base path) starts with
        ``paths`` are answered 503 without reaching the registry; ``times=0`` ends it."""
        with self._lock:
            self._outage = times
            self._outage_paths = paths

    def __enter__(self) -> RegistryRelay:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()

    def cut_off(self, path: str) -> bool:
        """Whether this request falls in an injected outage (and counts it)."""
        with self._lock:
            if self._outage > 0 and path.startswith(self._outage_paths):
                self._outage -= 1
                return True
            return False

    def forward(
        self, method: str, path_and_query: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes, str]:
        """The registry's answer to the request: status, body, content type."""
        request = urllib.request.Request(
            f"{self.upstream}{path_and_query}", data=body, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=FORWARD_TIMEOUT_SECONDS) as answer:
                status, data = answer.status, answer.read()
                content_type = answer.headers.get("content-type", "application/json")
        except urllib.error.HTTPError as refused:
            status, data = refused.code, refused.read()
            content_type = refused.headers.get("content-type", "application/json")
        path = path_and_query.split("?", 1)[0]
        if status == 200 and (m := _SCHEMA_BY_ID.match(path)):
            with self._lock:
                schema_id = int(m.group(1))
                self.fetches[schema_id] = self.fetches.get(schema_id, 0) + 1
        return status, data, content_type


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    relay: RegistryRelay


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _serve(self, method: str) -> None:
        relay = self.server.relay
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else None
        below = self.path.removeprefix(relay.base_path)
        if relay.cut_off(below.split("?", 1)[0]):
            status, data = 503, b'{"error_code": 50301, "message": "registry unavailable"}'
            content_type = "application/json"
        else:
            headers = {k: v for k, v in self.headers.items() if k.lower() in _FORWARDED_HEADERS}
            status, data, content_type = relay.forward(method, below, body, headers)
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


_FORWARDED_HEADERS = {"content-type", "accept", "authorization"}
