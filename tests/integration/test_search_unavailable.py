"""A store's error of the moment during a search (Neo4j out of transaction memory: the
executor has tried the read twice) is answered as "retry shortly", never as a traceback: HTTP
503 with Retry-After and the one error body, and one line from the CLI (docs/serving.md
"Errors"). The error is injected where the store would raise it: the memory's search."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
from neo4j.exceptions import Neo4jError

from tests.integration.serve_harness import (
    ThreadServer,
    in_memory_service,
    memory_settings,
)
from tidegraph.app.cli.errors import explain
from tidegraph.app.serving.http_api import create_app
from tidegraph.app.serving.service import MemoryService
from tidegraph.app.serving.settings import KeyRing, ServeSettings
from tidegraph.settings import Settings

KEY = "busy-key-" + uuid.uuid4().hex


def out_of_memory() -> Neo4jError:
    return Neo4jError._hydrate_neo4j(
        code="Neo.TransientError.General.MemoryPoolOutOfMemoryError",
        message="The allocation of an extra 2.0 MiB would use more than the limit 716.8 MiB.",
    )


def test_a_transient_store_error_is_a_503_with_retry_after(tmp_path: Path) -> None:
    group = f"busy-{uuid.uuid4().hex[:8]}"
    opened = in_memory_service(memory_settings(tmp_path))

    async def busy_service() -> MemoryService:
        service = await opened()

        async def search(*_: Any, **__: Any) -> Any:
            raise out_of_memory()

        service.memory.search = search  # type: ignore[method-assign]
        return service

    serve = ServeSettings()
    app = create_app(busy_service, KeyRing({KEY: [group]}))
    server = ThreadServer(app, settings=serve).start()
    try:
        with httpx.Client(base_url=server.url, headers={"X-API-Key": KEY}, timeout=30) as c:
            for route in ("/v1/search", "/v1/context"):
                answer = c.post(route, json={"query": "ticket NW-1002", "group_ids": [group]})
                assert answer.status_code == 503, answer.text
                assert answer.headers["retry-after"].isdigit()
                body = answer.json()
                assert body["error"] == "unavailable" and "retry" in body["message"], body
    finally:
        server.stop()


def test_the_cli_says_a_transient_store_error_in_one_line() -> None:
    line = explain(out_of_memory(), Settings())
    assert "\n" not in line and "retry shortly" in line
    assert "MemoryPoolOutOfMemoryError" in line and "TIDEGRAPH_NEO4J_URI" in line
