"""The hostile-request corpus (tests/corpus/hostile_requests.py) against the real ``tidegraph
serve`` on both stores, the embedded default and Neo4j: one server per store for the whole
corpus. Every answer is below 500 (and what the case expects), every error is the one JSON
shape (``ErrorOut``), no answer shows the other tenant's memory, and the server's log holds
no traceback and no 500.
"""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.corpus.hostile_requests import Case, hostile_requests, iter_names
from tests.integration.serve_harness import ProcessServer, serve_env
from tests.support.crm_feed import plan_record

pytestmark = pytest.mark.integration

OWN_KEY = "own-key-" + uuid.uuid4().hex
OTHER_KEY = "other-key-" + uuid.uuid4().hex
SECRET = "Zanzibar7731"  # in the other tenant's memory only
SECRET_ACCOUNT = "Quillmark Holdings"


@pytest.fixture(scope="module", params=["embedded", "neo4j"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ProcessServer, str, str, str]]:
    """(server, own group, other group, a token of the other group's episode)."""
    run = uuid.uuid4().hex[:8]
    own, other = f"hostile-own-{run}", f"hostile-other-{run}"
    tmp = tmp_path_factory.mktemp(f"hostile-{request.param}")
    keys = orjson.dumps({OWN_KEY: [own], OTHER_KEY: [other]}).decode()
    values = {"TIDEGRAPH_API_KEYS": keys}
    if request.param == "neo4j":
        uri = request.getfixturevalue("neo4j_uri")
        values |= {"TIDEGRAPH_STORE": "neo4j", "TIDEGRAPH_NEO4J_URI": uri}
    server = ProcessServer(serve_env(tmp, **values), tmp / "serve.log").start()
    try:
        other_token = _seed(server, own, other)
        yield server, own, other, other_token
    finally:
        server.stop()
        if request.param == "neo4j":
            _delete_groups(request.getfixturevalue("neo4j_uri"), [own, other])


def _seed(server: ProcessServer, own: str, other: str) -> str:
    def add(key: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = httpx.post(
            f"{server.url}/v1/episodes", json=body, headers={"X-API-Key": key}, timeout=60
        )
        assert answer.status_code == 201, answer.text
        return dict(answer.json())

    at = "2025-01-10T00:00:00+00:00"
    from datetime import datetime

    when = datetime.fromisoformat(at)
    add(OWN_KEY, {"content": "Dana: Acme Corp asked about the plan renewal", "reference_time": at})
    add(OWN_KEY, {"content": plan_record((1, "Acme Corp"), "Pro", when), "reference_time": at})
    add(OTHER_KEY, {"content": plan_record((2, SECRET_ACCOUNT), "Pro", when), "reference_time": at})
    secret = {"content": f"Acme Corp plan renewal code {SECRET}", "reference_time": at}
    return str(add(OTHER_KEY, secret)["token"])


def _delete_groups(uri: str, groups: list[str]) -> None:
    from neo4j import GraphDatabase

    with GraphDatabase.driver(uri, auth=None) as driver:
        driver.execute_query("MATCH (n) WHERE n.group_id IN $g DETACH DELETE n", g=groups)


def _send_raw(url: str, raw: bytes) -> httpx.Response:
    """``raw`` over a socket; the answer read until the server closes (or 10 s)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw.replace(b"{key}", OWN_KEY.encode()))
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
                head, _, body = received.partition(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                if length and len(body) >= int(length.group(1)):
                    break
        except TimeoutError:
            pass
    head, _, body = received.partition(b"\r\n\r\n")
    status = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    if status is None:
        raise httpx.RemoteProtocolError(f"no HTTP answer: {received[:100]!r}")
    lines = [line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line]
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    if length:
        body = body[: int(length.group(1))]  # a second answer may follow (a pipelined request)
    return httpx.Response(int(status.group(1)), headers=[(k, v) for k, v in lines], content=body)


def _send(http: httpx.Client, case: Case) -> httpx.Response:
    if case.raw is not None:
        return _send_raw(str(http.base_url).rstrip("/"), case.raw)
    headers = {"X-API-Key": OWN_KEY}
    if any(k.lower() in ("authorization", "x-api-key") for k in case.headers):
        headers = {}
    headers.update(case.headers)
    return http.request(
        case.method,
        case.path,
        params=case.params,
        json=case.json if case.content is None and case.json is not None else None,
        content=case.content,
        headers=headers,
    )


def _problem(case: Case, answer: httpx.Response) -> str | None:
    """What is wrong with ``answer`` to ``case``, if anything."""
    if answer.status_code >= 500:
        return f"{answer.status_code}: {answer.text[:200]}"
    if 300 <= answer.status_code < 400 or "location" in answer.headers:
        return f"{answer.status_code} to {answer.headers.get('location')!r}: a redirect"
    if case.expect is not None and answer.status_code not in case.expect:
        return f"status {answer.status_code}, expected {sorted(case.expect)}: {answer.text[:200]}"
    if SECRET in answer.text or SECRET_ACCOUNT in answer.text:
        return f"shows the other tenant's memory: {answer.text[:200]}"
    if answer.status_code >= 400:
        try:
            body = answer.json()
        except ValueError:
            return f"{answer.status_code} is not JSON: {answer.text[:200]!r}"
        if not (isinstance(body.get("error"), str) and isinstance(body.get("message"), str)):
            return f"{answer.status_code} is not the error shape: {body}"
    return None


def test_the_hostile_corpus_gets_4xx_never_5xx_and_no_leak(served):
    server, own, other, other_token = served
    cases = hostile_requests(own, other, other_token)
    assert len(list(iter_names(cases))) >= 150  # names unique, and enough of them
    problems = []
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for case in cases:
            try:
                answer = _send(http, case)
            except httpx.TransportError as exc:  # the server hung up without an answer
                problems.append(f"{case.name}: no answer ({type(exc).__name__}: {exc})")
                continue
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            if (problem := _problem(case, answer)) is not None:
                problems.append(f"{case.name}: {problem}")
        # the other tenant's memory is there: its own key reads it
        mine = http.post("/v1/search", json={"query": SECRET}, headers={"X-API-Key": OTHER_KEY})
        assert SECRET in mine.text, mine.text
    assert problems == [], "\n".join(problems)
    assert statuses.get(200, 0) > 30 and statuses.get(422, 0) > 30, statuses  # both kinds ran
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log, server.log_tail(80)
    assert "status=500" not in log, server.log_tail(80)


def test_searches_with_any_bytes_answer_on_this_store(served):
    """A NUL byte or query syntax in a search is searched, not an error (item 5)."""
    server, own, _, _ = served
    with httpx.Client(base_url=server.url, headers={"X-API-Key": OWN_KEY}, timeout=60) as http:
        for recipe in ("combined", "facts_rrf", "entities_rrf", "episodes_bm25", "communities_rrf"):
            for text in ("Acme\x00Corp", 'Acme" OR "x', "Acme*:* NEAR(", "plan renewal \x01\x7f"):
                found = http.post("/v1/search", json={"query": text, "recipe": recipe})
                assert found.status_code == 200, (recipe, text, found.text)
        found = http.post(
            "/v1/search", json={"query": "Acme\x00 renewal", "recipe": "episodes_bm25"}
        )
        texts = [r["text"] for r in found.json()["results"]]
        assert any("renewal" in t for t in texts), texts  # the words around the NUL still match
        context = http.post("/v1/context", json={"query": "Acme\x00plan"})
        assert context.status_code == 200, context.text
