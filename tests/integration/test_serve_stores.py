"""``tidegraph serve`` as a subprocess over the real stores: the embedded default (in-process
writes) and Neo4j with Kafka workers (``--via kafka``: read-your-writes through the token).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import orjson
import pytest

from tests.integration.serve_harness import ProcessServer, serve_env
from tests.integration.topology_harness import Topology
from tests.support.crm_feed import plan_record
from tests.support.metrics import free_port

pytestmark = pytest.mark.integration

KEY = "store-key-" + uuid.uuid4().hex
OTHER_KEY = "other-key-" + uuid.uuid4().hex
JAN = datetime(2025, 1, 10, tzinfo=UTC)
MAR = datetime(2025, 3, 1, tzinfo=UTC)


def plan_body(plan: str, at: datetime, **extra: object) -> dict[str, object]:
    return {
        "content": plan_record((1, "Acme Corp"), plan, at),
        "source": "json",
        "reference_time": at.isoformat(),
        **extra,
    }


def has_plans(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [f["fact"] for f in response.json()["facts"] if f["relation"] == "HAS_PLAN"]


# ----------------------------------------------------------------------------- embedded
@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[ProcessServer]:
    server = ProcessServer(serve_env(tmp_path), tmp_path / "serve.log").start()
    yield server
    server.stop()


def test_embedded_default_serves_what_it_writes(embedded: ProcessServer):
    group = f"emb-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=embedded.url, timeout=60) as http:
        ready = http.get("/readyz").json()
        assert ready == {"status": "ready", "store": "sqlite"}
        first = http.post("/v1/episodes", json=plan_body("Pro", JAN, group_id=group))
        assert first.status_code == 201, first.text
        second = http.post(
            "/v1/episodes", json=plan_body("Enterprise", MAR, group_id=group, episode_id="e2")
        )
        token = second.json()["token"]
        now = http.get("/v1/facts", params={"group_id": group, "wait_for": token})
        assert has_plans(now) == ["Acme Corp is on the Enterprise plan"]
        then = http.get("/v1/facts", params={"group_id": group, "valid_at": "2025-02-01"})
        assert has_plans(then) == ["Acme Corp is on the Pro plan"]
        status = http.get("/v1/episodes/e2/status", params={"group_id": group}).json()
        assert status["status"] == "written"
        unnamed = http.get("/v1/facts")  # no keys: the caller names the group
        assert unnamed.status_code == 422 and unnamed.json()["field"] == "group_id"
    log = embedded.log.read_text()
    assert "NO API KEYS configured" in log and "loopback only" in log


def test_embedded_search_and_context_read_your_writes(embedded: ProcessServer):
    group = f"emb-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=embedded.url, timeout=60) as http:
        token = http.post("/v1/episodes", json=plan_body("Enterprise", MAR, group_id=group)).json()[
            "token"
        ]
        found = http.post(
            "/v1/search",
            json={"query": "Acme Corp plan", "group_ids": [group], "wait_for": [token]},
        )
        assert found.status_code == 200, found.text
        facts = [r["text"] for r in found.json()["results"] if r["kind"] == "fact"]
        assert "Acme Corp is on the Enterprise plan" in facts
        context = http.post("/v1/context", json={"query": "Acme plan", "group_ids": [group]})
        assert "Acme Corp is on the Enterprise plan" in context.json()["context"]


def test_without_keys_the_server_refuses_to_bind_beyond_loopback(tmp_path: Path):
    server = ProcessServer(serve_env(tmp_path), tmp_path / "serve.log", ("--host", "0.0.0.0"))
    with pytest.raises(AssertionError, match="exited"):
        server.start()
    assert server.process.returncode == 2
    assert "no API keys are configured" in server.log.read_text()


# ----------------------------------------------------------------------------- neo4j + kafka
@pytest.fixture
def kafka_server(topology: Topology, tmp_path: Path) -> Iterator[tuple[ProcessServer, str]]:
    group = f"{topology.run}-serve"
    keys = orjson.dumps({KEY: [group], OTHER_KEY: [f"{topology.run}-other"]}).decode()
    env = topology.env(free_port(), tmp_path / "serve-data", TIDEGRAPH_API_KEYS=keys)
    server = ProcessServer(env, tmp_path / "serve.log", ("--via", "kafka")).start()
    yield server, group
    server.stop()


async def test_via_kafka_a_read_waits_for_its_write(
    topology: Topology, kafka_server: tuple[ProcessServer, str]
):
    server, group = kafka_server
    auth = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=server.url, headers=auth, timeout=90) as http:
        queued = await http.post("/v1/episodes", json=plan_body("Pro", JAN, episode_id="k1"))
        assert queued.status_code == 202, queued.text
        body = queued.json()
        assert body["status"] == "queued" and body["topic"] == topology.names.episodes
        assert body["partition"] >= 0 and body["offset"] >= 0

        # no worker yet: the read says the episode is still pending, never answers stale
        early = await http.get(
            "/v1/facts", params={"wait_for": body["token"], "wait_timeout_seconds": 1}
        )
        assert early.status_code == 409, early.text
        assert early.json()["error"] == "episode_pending"
        assert early.json()["episodes"][0]["state"] == "queued"
        status = (await http.get("/v1/episodes/k1/status")).json()
        assert status["status"] == "queued"

        topology.start_worker()
        later = await http.get(
            "/v1/facts", params={"wait_for": body["token"], "wait_timeout_seconds": 60}
        )
        assert has_plans(later) == ["Acme Corp is on the Pro plan"]
        assert (await http.get("/v1/episodes/k1/status")).json()["status"] == "written"

        # a record the mapping cannot turn into facts is dead-lettered by the worker
        broken = await http.post(
            "/v1/episodes",
            json={"content": {"type": "account.plan", "account": {"id": 1, "name": "Acme"}},
                  "source": "json", "reference_time": "2025-04-01T00:00:00Z",
                  "episode_id": "k-bad"},
        )  # fmt: skip
        assert broken.status_code == 202
        refused = await http.get(
            "/v1/facts", params={"wait_for": broken.json()["token"], "wait_timeout_seconds": 60}
        )
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == "episode_dead_lettered"
        reason = refused.json()["episodes"][0]["reason"]
        assert reason and reason in refused.json()["message"]
        status = (await http.get("/v1/episodes/k-bad/status")).json()
        assert status["status"] == "dead_lettered" and status["reason"] == reason
        dlq = (await http.get("/v1/dlq")).json()
        assert dlq["total"] == 1 and dlq["counts"][0]["reason"] == reason

    other = {"X-API-Key": OTHER_KEY}
    async with httpx.AsyncClient(base_url=server.url, headers=other, timeout=30) as http:
        for response in (
            await http.get("/v1/facts", params={"group_id": group}),
            await http.get("/v1/facts", params={"wait_for": body["token"]}),
            await http.get("/v1/episodes/k1/status", params={"group_id": group}),
            await http.get("/v1/dlq", params={"group_ids": group}),
        ):
            assert response.status_code == 403 and response.json()["group_id"] == group
        assert (await http.get("/v1/facts")).json()["facts"] == []
        assert (await http.get("/v1/dlq")).json()["total"] == 0


async def test_via_kafka_search_waits_for_its_write(
    topology: Topology, kafka_server: tuple[ProcessServer, str]
):
    server, _ = kafka_server
    topology.start_worker()
    auth = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=server.url, headers=auth, timeout=90) as http:
        token = (await http.post("/v1/episodes", json=plan_body("Pro", JAN))).json()["token"]
        found = await http.post(
            "/v1/search",
            json={"query": "Acme Corp plan", "wait_for": [token], "wait_timeout_seconds": 60},
        )
        assert found.status_code == 200, found.text
        facts = [r["text"] for r in found.json()["results"] if r["kind"] == "fact"]
        assert "Acme Corp is on the Pro plan" in facts
