"""Issue 31's HTTP cases, one test each, through a real uvicorn server on loopback (in a thread,
over the in-memory store with exact search): forged tokens, text that is not text, chunked and
slow bodies, slow headers, group ids as the worker reads them, one spelling of the search
parameters, what an add and a search say without an LLM, waits bounded per key, and one error
shape for every 4xx.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.corpus.hostile_requests import token
from tests.integration.serve_harness import ThreadServer, thread_server
from tests.support.crm_feed import plan_record
from tidegraph.app.serving.settings import ServeSettings

KEY = "edge-key-" + uuid.uuid4().hex
OTHER = "edge-other-" + uuid.uuid4().hex
JAN = datetime(2025, 1, 10, tzinfo=UTC)


@pytest.fixture
def groups() -> tuple[str, str]:
    run = uuid.uuid4().hex[:8]
    return f"edge-{run}", f"edge-other-{run}"


@pytest.fixture
def server(tmp_path: Path, groups: tuple[str, str]) -> Iterator[ThreadServer]:
    serve = ServeSettings(
        serve_max_body_bytes=64 * 1024,
        serve_header_timeout_seconds=1.0,
        serve_body_timeout_seconds=1.0,
        serve_waits_per_key=2,
    )
    srv = thread_server(tmp_path, {KEY: [groups[0]], OTHER: [groups[1]]}, serve)
    yield srv
    srv.stop()


def client(server: ThreadServer, key: str = KEY) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"X-API-Key": key}, timeout=30)


def is_error(answer: httpx.Response, status: int, field: str | None = None) -> dict:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert isinstance(body["error"], str) and isinstance(body["message"], str), body
    if field is not None:
        assert body.get("field") == field, body
    return dict(body)


def test_forged_tokens_with_wrong_field_types_are_400(server: ThreadServer, groups):
    own = groups[0]
    with client(server) as http:
        for data in (
            {"g": own, "u": "u", "t": [1]},
            {"g": own, "u": "u", "t": {}},
            {"g": own, "u": "u", "t": "x", "p": "0", "o": 0},
            {"g": [own], "u": "u"},
        ):
            forged = token(data)
            for answer in (
                http.post("/v1/search", json={"query": "acme", "wait_for": [forged]}),
                http.post("/v1/context", json={"query": "acme", "wait_for": [forged]}),
                http.get("/v1/facts", params={"wait_for": forged}),
            ):
                assert "damaged token" in is_error(answer, 400, "wait_for")["message"]


def test_text_that_is_not_text_and_huge_integers_are_4xx_or_exact(server: ThreadServer):
    json = {"content-type": "application/json"}
    with client(server) as http:
        for raw in (
            b'{"content": "\\ud800", "reference_time": "2025-01-01"}',
            b'{"content": "x", "group_id": "\\udc00", "reference_time": "2025-01-01"}',
        ):
            is_error(http.post("/v1/episodes", content=raw, headers=json), 422, "body")
        centre = b'{"query": "acme", "recipe": "facts_distance", "centre": "\\ud800"}'
        is_error(http.post("/v1/search", content=centre, headers=json), 422, "body")
        # an integer of 10**30 is kept exactly: the account's key has every digit
        record = plan_record((10**30, "Bigint Inc"), "Pro", JAN)
        raw = (
            b'{"source": "json", "reference_time": "2025-01-10T00:00:00Z", "content": '
            + __import__("json").dumps(record).encode()
            + b"}"
        )
        added = http.post("/v1/episodes", content=raw, headers=json)
        assert added.status_code == 201, added.text
        keys = [e["key"] for e in http.get("/v1/entities").json()["entities"]]
        assert f"crm:account:{10**30}" in keys


def test_chunked_bodies_over_the_limit_are_413(server: ThreadServer):
    def chunks() -> Iterator[bytes]:
        for _ in range(100):  # 5 MB, no content-length
            yield b"x" * 50_000

    with client(server) as http:
        answer = http.post(
            "/v1/episodes", content=chunks(), headers={"content-type": "application/json"}
        )
    assert is_error(answer, 413)["error"] == "too_large"


def test_empty_or_padded_group_ids_are_422_never_another_tenant(server: ThreadServer, groups):
    own = groups[0]
    with client(server) as http:
        is_error(
            http.post("/v1/search", json={"query": "x", "group_ids": [""]}), 422, "group_ids.0"
        )
        padded = http.post(
            "/v1/episodes",
            json={"content": "x", "reference_time": "2025-01-01", "group_id": f" {own} "},
        )
        assert "spaces" in is_error(padded, 422, "group_id")["message"]
        assert http.get("/v1/facts", params={"group_id": f"{own} "}).status_code == 422
        assert http.get("/v1/entities").json()["entities"] == []  # nothing was written


def test_get_search_takes_group_ids_and_says_so_for_group_id(server: ThreadServer, groups):
    own = groups[0]
    with client(server) as http:
        found = http.get("/v1/search", params={"query": "acme", "group_ids": own})
        assert found.status_code == 200 and found.json()["group_ids"] == [own], found.text
        wrong = http.get("/v1/search", params={"query": "acme", "group_id": own})
        body = is_error(wrong, 422, "group_id")
        assert "did you mean 'group_ids'" in body["message"]
        text = http.post("/v1/context", json={"query": "acme", "episodes": 5})
        assert "valid boolean" in is_error(text, 422, "episodes")["message"]


def test_without_an_llm_an_add_and_a_search_say_no_facts_come_from_text(server: ThreadServer):
    with client(server) as http:
        added = http.post(
            "/v1/episodes", json={"content": "Dana: Acme wants SSO", "reference_time": "2025-02-01"}
        )
        assert added.status_code == 201, added.text
        assert added.json()["not_extracted"] == "no_llm"
        assert "TIDEGRAPH_LLM_BASE_URL" in added.json()["message"]
        found = http.post("/v1/search", json={"query": "Acme SSO", "recipe": "facts_rrf"})
        assert found.json()["results"] == [] and "no LLM is configured" in found.json()["note"]
        context = http.post("/v1/context", json={"query": "Acme SSO"}).json()["context"]
        assert "no LLM is configured" in context


def test_an_unknown_token_on_the_in_process_server_never_blames_workers(
    server: ThreadServer, groups
):
    unknown = token({"g": groups[0], "u": str(uuid.uuid4())})
    with client(server) as http:
        answer = http.get("/v1/facts", params={"wait_for": unknown, "wait_timeout_seconds": 0.2})
    message = is_error(answer, 409)["message"]
    assert "workers" not in message and "never added here" in message


async def test_waits_are_bounded_per_key_and_other_tenants_read_on(server: ThreadServer, groups):
    never = [token({"g": groups[0], "u": str(uuid.uuid4())}) for _ in range(3)]
    async with (
        httpx.AsyncClient(base_url=server.url, headers={"X-API-Key": KEY}, timeout=30) as http,
        httpx.AsyncClient(base_url=server.url, headers={"X-API-Key": OTHER}, timeout=30) as other,
    ):
        reads = [
            asyncio.create_task(
                http.get("/v1/facts", params={"wait_for": t, "wait_timeout_seconds": 5})
            )
            for t in never
        ]
        # two reads may wait at once (serve_waits_per_key=2): the third is refused at once,
        # while the two still wait
        done, waiting = await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
        assert [is_error(t.result(), 429)["error"] for t in done] == ["too_many_waits"]
        assert len(waiting) == 2
        assert (await other.get("/v1/facts")).status_code == 200  # another key is not held
        assert [(await t).status_code for t in waiting] == [409, 409]


def test_slow_headers_and_bodies_get_408_and_are_closed(server: ThreadServer):
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHo")  # and then nothing
        answer = b""
        while chunk := sock.recv(4096):  # the server answers, then closes
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408") and b'"header_timeout"' in answer
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        sock.sendall(
            b"POST /v1/search HTTP/1.1\r\nHost: t\r\nX-API-Key: " + KEY.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"que"
        )  # fmt: skip
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408") and b'"body_timeout"' in answer


def test_every_framework_error_has_the_one_shape(server: ThreadServer):
    json = {"content-type": "application/json"}
    with client(server) as http:
        is_error(http.get("/v1/nothing"), 404)
        is_error(http.delete("/v1/search"), 405)
        is_error(http.post("/v1/search", json={"query": {"nested": True}}), 422, "query")
        is_error(http.post("/v1/search", content=b'{"query": "\xff"}', headers=json), 422, "body")
        digits = b'{"query": "x", "limit": 1' + b"0" * 5000 + b"}"
        is_error(http.post("/v1/search", content=digits, headers=json), 422, "body")
        is_error(http.post("/v1/episodes", content=b"x" * 70_000, headers=json), 413)
        is_error(httpx.get(f"{server.url}/v1/facts"), 401)
        is_error(http.get("/v1/facts", params={"group_id": "not-mine"}), 403)
