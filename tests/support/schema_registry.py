"""A schema registry with Confluent's REST API, in memory, on loopback: the part of the API a
producer's serializer and tidegraph's decoder use (register a subject's schema, fetch a schema
by id, list subjects), with outages to inject.

Why a stand-in: no registry with this API runs here from the package sources the project may
use (Apicurio Registry's application is published on Maven Central without the modules it
needs to build and run; Confluent's registry is not on Maven Central; Karapace is not on PyPI),
while the wire format and the client (confluent-kafka's ``SchemaRegistryClient``, fastavro)
are the real ones. Like ``tests.support.fake_llm``, it replaces one remote service only.

    with LoopbackSchemaRegistry() as registry:
        serializer = AvroSerializer(SchemaRegistryClient({"url": registry.url}), schema_text)
        registry.outage(times=3)          # the next 3 requests get HTTP 503
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from types import TracebackType
from typing import Any

_SCHEMA_BY_ID = re.compile(r"^/schemas/ids/(\d+)(/schema)?$")
_SUBJECT_VERSIONS = re.compile(r"^/subjects/([^/]+)/versions$")
_SUBJECT = re.compile(r"^/subjects/([^/]+)$")


class LoopbackSchemaRegistry:
    """Schemas by id and by subject, in memory; ``requests`` counts the fetches by id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.schemas: dict[int, dict[str, Any]] = {}
        self.subjects: dict[str, list[int]] = {}
        self.fetches: dict[int, int] = {}
        self._outage = 0
        self._outage_paths = "/"
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.registry = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def outage(self, times: int, paths: str = "/") -> None:
        """The next ``times`` requests whose path starts with ``paths`` are answered 503 (the
        registry is down); ``paths="/schemas/ids/"``: only the fetches of schemas."""
        with self._lock:
            self._outage = times
            self._outage_paths = paths

    def __enter__(self) -> LoopbackSchemaRegistry:
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

    # ---- the API's logic (called by the handler) ------------------------------------------
    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        with self._lock:
            if self._outage > 0 and path.startswith(self._outage_paths):
                self._outage -= 1
                return 503, {"error_code": 50301, "message": "registry unavailable"}
            if method == "GET" and (m := _SCHEMA_BY_ID.match(path)):
                schema_id = int(m.group(1))
                if schema_id not in self.schemas:
                    return 404, {"error_code": 40403, "message": "Schema not found"}
                self.fetches[schema_id] = self.fetches.get(schema_id, 0) + 1
                return 200, self.schemas[schema_id]
            if method == "POST" and (m := _SUBJECT_VERSIONS.match(path)):
                return 200, {"id": self._register(m.group(1), body)}
            if method == "POST" and (m := _SUBJECT.match(path)):
                found = self._find(m.group(1), body)
                if found is None:
                    return 404, {"error_code": 40403, "message": "Schema not found"}
                return 200, found
            if method == "GET" and path == "/subjects":
                return 200, sorted(self.subjects)
        return 404, {"error_code": 404, "message": f"{method} {path} is not served here"}

    def _register(self, subject: str, body: dict[str, Any]) -> int:
        schema = {"schema": body["schema"], "schemaType": body.get("schemaType", "AVRO")}
        known = [i for i, stored in self.schemas.items() if stored == schema]
        schema_id = known[0] if known else len(self.schemas) + 1
        self.schemas[schema_id] = schema
        versions = self.subjects.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return schema_id

    def _find(self, subject: str, body: dict[str, Any]) -> dict[str, Any] | None:
        for version, schema_id in enumerate(self.subjects.get(subject, []), start=1):
            if self.schemas[schema_id]["schema"] == body.get("schema"):
                return {"subject": subject, "id": schema_id, "version": version,
                        **self.schemas[schema_id]}  # fmt: skip
        return None


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    registry: LoopbackSchemaRegistry


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        path = self.path.split("?", 1)[0]
        status, answer = self.server.registry.answer(method, path, body)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("content-type", "application/vnd.schemaregistry.v1+json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")
