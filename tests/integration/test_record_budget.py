"""A record that takes too long holds up neither its worker nor the other groups (docs/streaming.md
"Retries and dead letters"): a text episode whose extraction runs over the budget is stored
unextracted with reason ``timeout`` (docs/architecture.md "Episodes without an LLM"); other records
over it
are dead-lettered with that reason (tests/integration/test_bad_input.py)."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.integration.topology_harness import Topology, eventually
from tests.support.extraction_requests import on_extraction
from tests.support.fake_llm import FakeRequest, ScriptedLLMServer

pytestmark = pytest.mark.integration

USES = re.compile(r"^(?P<subject>.+?) uses (?P<object>.+?)\.?$")


async def test_a_text_record_over_its_time_budget_is_stored_unextracted_and_others_go_on(
    topology: Topology,
) -> None:
    released = threading.Event()

    def extraction(request: FakeRequest) -> dict[str, Any]:
        current = request.user.rsplit("):\n", 1)[1].strip()
        if "STUCK" in current:
            released.wait(120)  # answers only once the test is over
        match = USES.match(current)
        subject, obj = (match["subject"], match["object"]) if match else ("Someone", "Something")
        return {
            "entities": [
                {"name": subject, "type": "Organization", "summary": None},
                {"name": obj, "type": "Product", "summary": None},
            ],
            "facts": [
                {"subject": subject, "relation": "USES", "object": obj,
                 "fact": f"{subject} uses {obj}", "valid_at": None, "invalid_at": None}
            ],
        }  # fmt: skip

    start = datetime(2025, 4, 1, tzinfo=UTC)
    stuck_group, free_group = f"{topology.run}-stuck", f"{topology.run}-free"
    feed = [
        {"id": "stuck", "group_id": stuck_group, "source": "text",
         "content": "STUCK uses Patience.", "reference_time": start.isoformat()},
        {"id": "after-stuck", "group_id": stuck_group, "source": "text",
         "content": "Acme uses Slack.", "reference_time": (start + timedelta(hours=1)).isoformat()},
    ] + [
        {"id": f"free-{n}", "group_id": free_group, "source": "text",
         "content": f"Globex uses Tool{n}.",
         "reference_time": (start + timedelta(hours=n)).isoformat()}
        for n in range(4)
    ]  # fmt: skip
    with ScriptedLLMServer() as server:
        on_extraction(server, extraction)
        server.on("EntityResolutionOutput", lambda _: {"matches": []})
        server.on("FactResolutionOutput", lambda _: {"judgements": []})
        try:
            worker = topology.start_worker(
                TIDEGRAPH_LLM_BASE_URL=server.base_url,
                TIDEGRAPH_LLM_API_KEY="test",
                TIDEGRAPH_LLM_MODEL="fake-model",
                TIDEGRAPH_LLM_TIMEOUT_SECONDS="300",
                TIDEGRAPH_RECORD_TIMEOUT_SECONDS="4",
                TIDEGRAPH_COMMUNITIES_ENABLED="false",
            )
            report = await topology.produce(feed)
            # The other group is written while the stuck record still waits for its answer.
            written = await eventually(
                lambda: topology.episodes_written([free_group]),
                lambda n: n == 4,
                timeout=90,
                what="the other group's episodes",
            )
            assert written == 4 and not released.is_set()
            result = await topology.wait_reflected(report, timeout=120)
        finally:
            released.set()
    assert result.processed == 6 and result.dead == []
    assert await topology.dead_letters() == []
    assert worker.alive()
    assert worker.value("tidegraph_episodes_not_extracted_total", reason="timeout") == 1
    store = topology.store()
    try:
        [stuck] = await store.pending_episodes(stuck_group, 10)
        after = await store.browse.query_facts(stuck_group)
    finally:
        await store.close()
    assert (stuck.producer_id, stuck.not_extracted) == ("stuck", "timeout")
    # The stuck record's own group went on after it, in order.
    assert [(f.subject, f.object) for f in after] == [("Acme", "Slack")]


async def test_a_json_record_over_its_time_budget_is_dead_lettered_and_others_go_on(
    topology: Topology,
) -> None:
    """Business data is no prose: a json record the LLM holds past the budget is
    dead-lettered (``timeout``, replayable) and its group goes on."""
    released = threading.Event()

    def extraction(request: FakeRequest) -> dict[str, Any]:
        if "STUCK" in request.user.rsplit("):\n", 1)[1]:
            released.wait(120)  # answers only once the test is over
        return {"entities": [], "facts": []}

    group = f"{topology.run}-json"
    start = datetime(2025, 4, 1, tzinfo=UTC)
    feed = [
        {"id": f"rec-{n}", "group_id": group, "source": "json",
         "content": {"type": "note.added", "text": text},
         "reference_time": (start + timedelta(hours=n)).isoformat()}
        for n, text in enumerate(["STUCK", "fine"])
    ]  # fmt: skip
    with ScriptedLLMServer() as server:
        on_extraction(server, extraction)
        try:
            worker = topology.start_worker(
                TIDEGRAPH_LLM_BASE_URL=server.base_url,
                TIDEGRAPH_LLM_API_KEY="test",
                TIDEGRAPH_LLM_MODEL="fake-model",
                TIDEGRAPH_LLM_TIMEOUT_SECONDS="300",
                TIDEGRAPH_RECORD_TIMEOUT_SECONDS="4",
                TIDEGRAPH_COMMUNITIES_ENABLED="false",
            )
            result = await topology.wait_reflected(await topology.produce(feed), timeout=120)
        finally:
            released.set()
    assert result.processed == 1
    assert [(d.episode_id, d.stage, d.reason) for d in result.dead] == [
        ("rec-0", "extraction", "timeout")
    ]
    [letter] = await topology.dead_letters()
    assert "TIDEGRAPH_RECORD_TIMEOUT_SECONDS" in letter.message
    assert letter.record["id"] == "rec-0"  # the envelope itself: `dlq replay` can re-send it
    assert worker.alive()
    assert worker.value("tidegraph_dead_letters_total", stage="extraction", reason="timeout") == 1
