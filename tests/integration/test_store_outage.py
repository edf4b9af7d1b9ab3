"""Nothing lost when Neo4j stops answering (docs/streaming.md "When the store is down").

Two workers on the real broker consume a paced CRM feed into a Neo4j of this test's own
(``fault_harness.OwnNeo4j``): it is frozen with SIGSTOP for longer than every retry while a
worker is killed and replaced (the replacement starts while the store does not answer), then
killed with SIGKILL and restarted on the same port while the feed goes on. Afterwards: no
dead letter, every group's graph equal to the uninterrupted in-process run's (both timelines'
shape), every group's episodes written in input order, every committed change of the outbox
on ``{prefix}.changes``, no traceback in the workers' logs. benchmarks/fault_probe.py runs the
same shape at full size (a 120-second outage, twelve worker kills, several seeds)."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.fault_harness import (
    WORKER_ENV,
    OwnNeo4j,
    check_run,
    group,
    reference_graph,
)
from tests.integration.serve_harness import ProcessServer, poll, serve_env
from tests.integration.topology_harness import Topology, Worker, eventually
from tests.support.crm_feed import crm_feed
from tidegraph.connections import KafkaConnection
from tidegraph.topics.admin import delete_topics

pytestmark = pytest.mark.integration

EPISODES = 240
GROUPS = 8
FREEZE_SECONDS = 16.0  # > every retry (0.3 s) and the store probe's timeout (5 s)


@pytest.fixture(scope="module")
async def own_neo4j(tmp_path_factory: pytest.TempPathFactory) -> Any:
    neo4j = OwnNeo4j(tmp_path_factory.mktemp("own-neo4j"))
    await neo4j.up()
    try:
        yield neo4j
    finally:
        await neo4j.down()


def successor_ready(worker: Worker) -> tuple[int, bytes]:
    """The worker's /readyz answer, or (0, b"") while its endpoint is not up yet."""
    try:
        return worker.get("/readyz")
    except OSError:
        return 0, b""


@pytest.mark.timeout(900)  # two Neo4j starts and a reference run on a loaded machine
async def test_neo4j_frozen_and_killed_under_two_workers_loses_and_reorders_nothing(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, own_neo4j: OwnNeo4j
) -> None:
    run = f"ref{uuid.uuid4().hex[:8]}"
    reference = await reference_graph(own_neo4j.uri, tmp_path, run, EPISODES, GROUPS)
    topology = Topology(kafka_bootstrap, own_neo4j.uri, topic_prefix, tmp_path)
    topology.extra_env.update(WORKER_ENV)
    groups = [group(topology.run, i) for i in range(GROUPS)]
    try:

        async def written_at_least(n: int) -> int:
            return await topology.written_at_least(groups, n, timeout=180)

        workers = [topology.start_worker(), topology.start_worker()]
        await topology.wait_assigned(workers)
        feed = crm_feed(EPISODES, GROUPS, run=topology.run)
        producing = asyncio.create_task(topology.produce(feed, rate=15))
        await written_at_least(40)

        # Frozen longer than every retry; a worker killed and replaced meanwhile.
        own_neo4j.signal(signal.SIGSTOP)
        await asyncio.sleep(FREEZE_SECONDS / 2)  # the outage's length: what is tested
        workers[0].kill()
        successor = topology.start_worker()
        # It waits for the store, and its readiness says so.
        status, body = await eventually(
            lambda: asyncio.to_thread(successor_ready, successor),
            lambda answer: answer[0] != 0,
            timeout=60,
            what="the successor's /readyz to answer",
        )
        assert status == 503 and b'"neo4j"' in body, body
        await asyncio.sleep(FREEZE_SECONDS / 2)
        own_neo4j.signal(signal.SIGCONT)

        frozen_at = await topology.episodes_written(groups)
        await written_at_least(frozen_at + 20)
        # Killed and restarted: down while the workers hold their records.
        await own_neo4j.kill()
        await own_neo4j.up()

        found = await check_run(
            topology,
            own_neo4j,
            reference,
            GROUPS,
            report_timeout=300,
            episodes_report=await producing,
        )
        assert found.processed == EPISODES
        assert found.dead_letters == 0
        assert found.differing_groups == [], f"{found.differing_facts} facts differ"
        assert found.order_problems == []
        assert found.changes_committed > 0 and found.changes_missing == 0
        assert found.tracebacks == 0
        assert found.outage_lines >= 1  # the outage was seen and said
    finally:
        for worker in topology.workers:
            if worker.alive():
                worker.process.kill()
                worker.process.wait(10)
        kafka = KafkaConnection.from_settings(topology.settings())
        await delete_topics(kafka, topology.names.all())


@pytest.mark.timeout(600)
async def test_a_server_answers_503_with_retry_after_while_neo4j_is_down_and_writes_after(
    tmp_path: Path, own_neo4j: OwnNeo4j
) -> None:
    env = serve_env(tmp_path, TIDEGRAPH_STORE="neo4j", TIDEGRAPH_NEO4J_URI=own_neo4j.uri)
    server = ProcessServer(env, tmp_path / "serve.log").start()
    group_id = f"g{uuid.uuid4().hex[:8]}"

    def episode(n: int) -> dict[str, Any]:
        return {
            "group_id": group_id,
            "episode_id": f"ep-{n}",
            "content": f"Dana: message {n}",
            "reference_time": f"2025-03-0{n}T10:00:00Z",
        }

    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            assert (await client.post("/v1/episodes", json=episode(1))).status_code == 201
            await own_neo4j.kill()
            for _ in range(2):  # the write that finds it down, and one while it is known down
                refused = await client.post("/v1/episodes", json=episode(2))
                assert refused.status_code == 503, refused.text
                assert int(refused.headers["retry-after"]) >= 1
                assert "nothing was written" in refused.json()["message"]
            await own_neo4j.up()
            await poll(
                lambda: client.post("/v1/episodes", json=episode(2)),
                lambda answer: answer.status_code == 201,
                "the write to be taken once Neo4j answers",
                timeout=120,
            )
            listed = await client.get("/v1/episodes", params={"group_id": group_id})
            ids = [e["episode_id"] for e in listed.json()["episodes"]]
            assert ids == ["ep-1", "ep-2"]
        assert "Traceback (most recent call last)" not in server.log.read_text()
    finally:
        server.stop()
