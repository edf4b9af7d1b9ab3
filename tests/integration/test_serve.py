"""``tidegraph serve`` through a real HTTP client against a real uvicorn server on loopback.

Most tests run the server in a thread over an in-memory store with exact search methods
(``SearchableMemoryStore``); the last ones run the ``tidegraph serve`` command over the real
stores: the embedded default, and Neo4j with Kafka workers (via=kafka read-your-writes).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.integration.serve_harness import ThreadServer, thread_server
from tests.support.crm_feed import plan_record
from tidegraph.app.serving.models import SearchOut

KEY_A = "key-a-" + uuid.uuid4().hex
KEY_B = "key-b-" + uuid.uuid4().hex
JAN = datetime(2025, 1, 10, tzinfo=UTC)
MAR = datetime(2025, 3, 1, tzinfo=UTC)


@pytest.fixture
def groups() -> tuple[str, str]:
    run = uuid.uuid4().hex[:8]
    return f"serve-a-{run}", f"serve-b-{run}"


@pytest.fixture
def server(tmp_path: Path, groups: tuple[str, str]) -> Iterator[ThreadServer]:
    a, b = groups
    srv = thread_server(tmp_path, {KEY_A: [a], KEY_B: [b]})
    yield srv
    srv.stop()


def client(server: ThreadServer, key: str | None = KEY_A) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def add_plan(http: httpx.Client, plan: str, at: datetime, **extra: object) -> httpx.Response:
    return http.post(
        "/v1/episodes",
        json={
            "content": plan_record((1, "Acme Corp"), plan, at),
            "source": "json",
            "reference_time": at.isoformat(),
            **extra,
        },
    )


# ----------------------------------------------------------------------------- memory
def test_an_agent_adds_a_memory_then_recalls_it_with_its_token(server: ThreadServer, groups):
    a, _ = groups
    with client(server) as http:
        added = http.post(
            "/v1/episodes",
            json={
                "content": "Dana: we moved the Harbor account to quarterly invoicing",
                "reference_time": "2025-02-03T10:00:00Z",
                "episode_id": "chat-1",
            },
        )
        assert added.status_code == 201, added.text
        body = added.json()
        assert body["status"] == "written" and body["group_id"] == a  # the key's only group
        assert body["episode_id"] == "chat-1" and body["token"].startswith("rw1.")

        found = http.post(
            "/v1/search",
            json={"query": "quarterly invoicing", "wait_for": [body["token"]]},
        )
        assert found.status_code == 200, found.text
        results = found.json()["results"]
        episodes = [r for r in results if r["kind"] == "episode"]
        assert episodes and episodes[0]["episode_id"] == "chat-1"
        assert "quarterly invoicing" in episodes[0]["text"]

        again = http.post(
            "/v1/episodes",
            json={"content": "Dana: we moved the Harbor account to quarterly invoicing",
                  "reference_time": "2025-02-03T10:00:00Z", "episode_id": "chat-1"},
        )  # fmt: skip
        assert again.status_code == 200 and again.json()["status"] == "skipped"


def test_facts_as_of_and_context(server: ThreadServer, groups):
    with client(server) as http:
        assert add_plan(http, "Pro", JAN).status_code == 201
        token = add_plan(http, "Enterprise", MAR).json()["token"]

        now = http.get("/v1/facts", params={"wait_for": token}).json()["facts"]
        assert [f["fact"] for f in now if f["relation"] == "HAS_PLAN"] == [
            "Acme Corp is on the Enterprise plan"
        ]
        then = http.get("/v1/facts", params={"valid_at": "2025-02-01"}).json()["facts"]
        assert [f["fact"] for f in then if f["relation"] == "HAS_PLAN"] == [
            "Acme Corp is on the Pro plan"
        ]
        names = {e["name"] for e in http.get("/v1/entities").json()["entities"]}
        assert {"Acme Corp", "Pro", "Enterprise"} <= names

        context = http.post("/v1/context", json={"query": "which plan is Acme Corp on?"})
        assert context.status_code == 200, context.text
        assert "Acme Corp is on the Enterprise plan" in context.json()["context"]

        by_get = http.get("/v1/search", params={"query": "Acme Corp plan", "limit": 3})
        by_post = http.post("/v1/search", json={"query": "Acme Corp plan", "limit": 3})
        assert by_get.status_code == 200, by_get.text
        assert by_get.json()["results"] == by_post.json()["results"]
        # the answer is exactly the documented model (sent as built, not validated again)
        for answer in (by_get.json(), by_post.json()):
            assert SearchOut.model_validate(answer).model_dump() == answer
        facts = [r for r in by_get.json()["results"] if r["kind"] == "fact"]
        assert facts[0]["text"] == "Acme Corp is on the Enterprise plan"


def test_episode_status_and_failures(server: ThreadServer, groups):
    a, _ = groups
    with client(server) as http:
        ok = add_plan(http, "Pro", JAN, episode_id="crm-1")
        status = http.get("/v1/episodes/crm-1/status").json()
        assert status["status"] == "written" and status["episode_uuid"] == ok.json()["episode_uuid"]

        broken = http.post(
            "/v1/episodes",
            json={
                "content": {"type": "account.plan", "account": {"id": 1, "name": "Acme"}},
                "source": "json",
                "reference_time": "2025-01-01T00:00:00Z",
                "episode_id": "crm-bad",
            },
        )  # fmt: skip  (a matched rule, no plan: the mapping cannot make its facts)
        assert broken.status_code == 422, broken.text
        assert broken.json()["status"] == "failed" and broken.json()["reason"]
        status = http.get("/v1/episodes/crm-bad/status").json()
        assert status["status"] == "failed" and status["reason"] == broken.json()["reason"]

        refused = http.post(
            "/v1/search", json={"query": "Acme", "wait_for": [broken.json()["token"]]}
        )
        assert refused.status_code == 409
        assert refused.json()["error"] == "episode_dead_lettered"
        assert refused.json()["episodes"][0]["reason"] == broken.json()["reason"]

        dlq = http.get("/v1/dlq").json()
        assert dlq["total"] == 1 and dlq["counts"][0]["group_id"] == a

        missing = http.get("/v1/episodes/never-added/status")
        assert missing.status_code == 404 and "never-added" in missing.json()["message"]


# ----------------------------------------------------------------------------- tenancy
def test_another_tenants_key_gets_nothing_through_any_endpoint(
    server: ThreadServer, groups, caplog: pytest.LogCaptureFixture
):
    a, b = groups
    caplog.set_level(logging.DEBUG)
    with client(server, KEY_A) as http_a:
        added = add_plan(http_a, "Pro", JAN, episode_id="secret-1")
        token = added.json()["token"]
    with client(server, KEY_B) as http_b:
        attempts = [
            http_b.post("/v1/episodes", json={"group_id": a, "content": "x",
                                              "reference_time": "2025-01-01"}),
            http_b.post("/v1/search", json={"query": "Acme", "group_ids": [a]}),
            http_b.post("/v1/search", json={"query": "Acme", "group_ids": [b, a]}),
            http_b.get("/v1/search", params={"query": "Acme", "group_ids": a}),
            http_b.post("/v1/context", json={"query": "Acme", "group_ids": [a]}),
            http_b.post("/v1/search", json={"query": "Acme", "wait_for": [token]}),
            http_b.get("/v1/facts", params={"group_id": a}),
            http_b.get("/v1/entities", params={"group_id": a}),
            http_b.get("/v1/episodes/secret-1/status", params={"group_id": a}),
            http_b.get("/v1/dlq", params={"group_ids": a}),
        ]  # fmt: skip
        for response in attempts:
            assert response.status_code == 403, (response.request.url, response.text)
            assert response.json()["group_id"] == a
            assert a in response.json()["message"]
            assert KEY_A not in response.text and KEY_B not in response.text
        # its own memory holds none of A's
        own = http_b.post("/v1/search", json={"query": "Acme Corp Pro plan"}).json()
        assert own["group_ids"] == [b] and own["results"] == []
        assert http_b.get("/v1/facts").json()["facts"] == []
        assert http_b.get("/v1/entities").json()["entities"] == []
    for key in (None, "not-a-key-at-all"):
        with client(server, key) as anonymous:
            for response in (
                anonymous.post("/v1/search", json={"query": "Acme"}),
                anonymous.get("/v1/facts"),
                anonymous.post("/v1/episodes", json={"content": "x", "reference_time": "now"}),
            ):
                assert response.status_code == 401, response.text
                assert response.headers["www-authenticate"] == "Bearer"
    with httpx.Client(base_url=server.url, headers={"X-API-Key": KEY_A}) as by_header:
        assert by_header.get("/v1/facts").status_code == 200
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "key=key-" in logged  # requests are logged with the key's fingerprint...
    assert KEY_A not in logged and KEY_B not in logged  # ...never the key


# ----------------------------------------------------------------------------- bad requests
def test_bad_requests_get_clear_4xx_json(server: ThreadServer):
    with client(server) as http:
        missing = http.post("/v1/episodes", json={"content": "Dana called"})
        assert missing.status_code == 422
        assert missing.json()["field"] == "reference_time"
        assert "required" in missing.json()["message"].lower()

        bad_time = http.post(
            "/v1/episodes", json={"content": "Dana called", "reference_time": "the other day-ish"}
        )
        assert bad_time.status_code == 400 and bad_time.json()["field"] == "reference_time"
        assert "ISO 8601" in bad_time.json()["message"]

        bad_valid = http.get("/v1/facts", params={"valid_at": "not a date at all"})
        assert bad_valid.status_code == 400 and bad_valid.json()["field"] == "valid_at"

        recipe = http.post("/v1/search", json={"query": "x", "recipe": "nope"})
        assert recipe.status_code == 422 and recipe.json()["field"] == "recipe"
        assert "combined" in recipe.json()["message"]  # lists the valid names

        limit = http.get("/v1/search", params={"query": "x", "limit": 0})
        assert limit.status_code == 422 and limit.json()["field"] == "limit"

        token = http.post("/v1/search", json={"query": "x", "wait_for": ["abc"]})
        assert token.status_code == 400 and token.json()["field"] == "wait_for"

        not_json = http.post(
            "/v1/search", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert not_json.status_code == 422

        unknown_field = http.post("/v1/search", json={"query": "x", "grup_ids": ["a"]})
        assert unknown_field.status_code == 422 and unknown_field.json()["field"] == "grup_ids"

        huge = http.post(
            "/v1/episodes",
            json={"content": "x" * 100_000, "reference_time": "2025-01-01T00:00:00Z"},
        )
        assert huge.status_code == 413 and huge.json()["error"] == "too_large"


# ----------------------------------------------------------------------------- operations
def test_health_readiness_docs_and_metrics(server: ThreadServer):
    with client(server) as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        ready = http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        assert http.get("/docs").status_code == 200
        paths = http.get("/openapi.json").json()["paths"]
        assert {"/v1/episodes", "/v1/search", "/v1/context", "/v1/facts", "/v1/entities",
                "/v1/episodes/{episode_id}/status", "/v1/dlq"} <= set(paths)  # fmt: skip
        http.post("/v1/search", json={"query": "anything"})
        http.post("/v1/search", json={"query": "x", "recipe": "nope"})
        text = http.get("/metrics").text
    assert 'tidegraph_http_requests_total{method="POST",route="/v1/search",status="200"}' in text
    assert (
        'tidegraph_http_request_seconds_bucket{le="0.001",method="POST",route="/v1/search"}' in text
    )
    assert 'tidegraph_http_errors_total{error="invalid",route="/v1/search"}' in text
