"""Episodes without an LLM (docs/architecture.md "Episodes without an LLM"), on both real stores:
stored
and searchable at once, extracted later in order by ``extract --pending`` through the real
``openai`` client against the scripted server, nothing lost when that fails midway."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.integration.conftest import STORE_DIM
from tests.integration.topology_harness import Topology, eventually
from tests.support.extraction_requests import on_extraction
from tests.support.fake_llm import FakeRequest, ScriptedLLMServer
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.llm import LLMClient
from tidegraph.pipelines.ingest import ingest
from tidegraph.pipelines.pending import extract_pending
from tidegraph.pipelines.retry import RetryPolicy
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.recall.search import Searcher
from tidegraph.records.episode import Episode
from tidegraph.records.search import SearchRequest
from tidegraph.stores.base import GraphStore

T0 = datetime(2025, 2, 3, 9, 0, tzinfo=UTC)
MESSAGES = [
    "Ana Lima: Harbor Freight moved to the Business plan today.",
    "Ben Okafor: the Harbor Freight dashboard shows invoices twice since Monday.",
    "Ana Lima: Harbor Freight cancelled the Business plan and is on Starter now.",
]
_SPEAKER = re.compile(r"^(?P<speaker>[^:\n]+): (?P<body>.+)$", re.MULTILINE)


def episodes(group_id: str) -> list[Episode]:
    return [
        Episode(
            id=f"chat-{n}",
            group_id=group_id,
            source="message",
            content=text,
            reference_time=T0 + timedelta(hours=n),
        )
        for n, text in enumerate(MESSAGES)
    ]


def extract(request: FakeRequest) -> dict[str, Any]:
    """The speaker and one fact about Harbor Freight, worded from the message."""
    current = request.user.split("Current episode", 1)[1].split("\n", 1)[1]
    match = _SPEAKER.search(current)
    assert match, current
    speaker, body = match["speaker"].strip(), match["body"].strip()
    return {
        "entities": [
            {"name": speaker, "type": "Person", "summary": None},
            {"name": "Harbor Freight", "type": "Organization", "summary": None},
        ],
        "facts": [
            {
                "subject": speaker,
                "relation": "SAID_ABOUT",
                "object": "Harbor Freight",
                "fact": f"{speaker} said: {body}",
                "valid_at": None,
                "invalid_at": None,
            }
        ],
    }


def chain(store: GraphStore, llm: LLMClient | None) -> GroupRunner:
    return GroupRunner.of(
        store=store,
        embedder=HashingEmbedder(dim=STORE_DIM),
        llm=llm,
        mappings=None,
        policy=RetryPolicy(max_attempts=2, backoff=0.01, backoff_max=0.01),
    )


def client(server: ScriptedLLMServer) -> LLMClient:
    return LLMClient(
        base_url=server.base_url, api_key="test", model="fake", cache=None, max_attempts=1
    )


async def test_without_an_llm_episodes_are_stored_searchable_and_pending(
    store: GraphStore, group_id: str
) -> None:
    report = await ingest(chain(store, None), episodes(group_id))
    assert report.failures == [] and report.episodes == 3
    pending = await store.pending_episodes(group_id, 10)
    assert [r.producer_id for r in pending] == ["chat-0", "chat-1", "chat-2"]
    assert {r.not_extracted for r in pending} == {"no_llm"}
    assert group_id in await store.pending_groups()
    assert (await store.browse.counts(group_id)).get("facts", 0) == 0

    searcher = Searcher(store.search, HashingEmbedder(dim=STORE_DIM))
    for recipe in ("episodes_bm25", "episodes_vector", "combined"):
        found = await searcher.search(
            SearchRequest(query="invoices shown twice", group_ids=[group_id], recipe=recipe)
        )
        assert [h.record.producer_id for h in found.episodes][:1] == ["chat-1"], recipe  # type: ignore[union-attr]

    # Ingesting them again (a replay) changes nothing and does not extract them.
    again = await ingest(chain(store, None), episodes(group_id))
    assert again.failures == []
    assert len(await store.pending_episodes(group_id, 10)) == 3


async def test_extract_pending_extracts_in_order_and_loses_nothing_when_cut_off(
    store: GraphStore, group_id: str
) -> None:
    await ingest(chain(store, None), episodes(group_id))
    with ScriptedLLMServer() as server:
        on_extraction(server, extract)
        server.on("EntityResolutionOutput", lambda _: {"matches": []})
        server.on("FactResolutionOutput", lambda _: {"judgements": []})
        llm = client(server)
        try:
            # The second episode's extraction fails (the LLM answers 500 after every retry):
            # the first is extracted, the group stops there, the second and third stay
            # stored and pending.
            on_extraction(server, _failing_second(extract))
            first = await extract_pending(chain(store, llm), store, [group_id])
            assert first.extracted == 1 and group_id in first.still_pending
            assert "chat-1" in first.still_pending[group_id]
            left = await store.pending_episodes(group_id, 10)
            assert [r.producer_id for r in left] == ["chat-1", "chat-2"]

            on_extraction(server, extract)
            second = await extract_pending(chain(store, llm), store, [group_id])
            assert second.extracted == 2 and not second.still_pending and not second.failed
        finally:
            await llm.close()
    assert await store.pending_episodes(group_id, 10) == []
    assert group_id not in await store.pending_groups()
    facts = await store.browse.query_facts(group_id, include_invalid=True)
    assert sorted(v.episodes[0] for v in facts) == ["chat-0", "chat-1", "chat-2"]
    # In event order: each extraction was given the earlier episodes as context.
    contexts = [r.user for name, r, status in server.requests if name == "ExtractionOutput"]
    assert all(MESSAGES[0] in user for user in contexts[1:])


def _failing_second(answer: Any) -> Any:
    """``answer``, except for the second message, which fails (the server answers 500)."""

    def handler(request: FakeRequest) -> dict[str, Any]:
        current = request.user.split("Current episode", 1)[1]
        if "invoices twice" in current:
            raise _Refused()
        return answer(request)

    return handler


class _Refused(Exception):
    pass


async def test_a_worker_with_an_llm_extracts_the_pending_episodes_of_its_partitions(
    topology: Topology,
) -> None:
    """Episodes a worker stored without an LLM go through the chain again once a worker
    with an LLM runs: its sweep resends them on their group's partition."""
    group = f"{topology.run}-chat"
    no_llm = topology.start_worker()
    report = await topology.produce([e.model_dump(mode="json") for e in episodes(group)])
    await topology.wait_reflected(report)  # stored (unextracted) counts as reflected
    assert no_llm.stop() == 0
    store = topology.store()
    try:
        assert len(await store.pending_episodes(group, 10)) == 3
        with ScriptedLLMServer() as server:
            on_extraction(server, extract)
            server.on("EntityResolutionOutput", lambda _: {"matches": []})
            server.on("FactResolutionOutput", lambda _: {"judgements": []})
            topology.start_worker(
                TIDEGRAPH_LLM_BASE_URL=server.base_url,
                TIDEGRAPH_LLM_API_KEY="test",
                TIDEGRAPH_LLM_MODEL="fake",
                TIDEGRAPH_PENDING_SWEEP_SECONDS="1",
                NO_PROXY="127.0.0.1",
            )
            await eventually(
                lambda: store.pending_episodes(group, 10),
                lambda left: left == [],
                timeout=120,
                what="the worker to extract the pending episodes",
            )
        facts = await store.browse.query_facts(group, include_invalid=True)
        assert sorted(v.episodes[0] for v in facts) == ["chat-0", "chat-1", "chat-2"]
    finally:
        await store.close()
