"""LLM calls started ahead on a guess (tidegraph.pipelines.speculation): a started call answers only
exactly the same request, and nothing started is left behind; the guess's search includes the
entities held ahead of their write."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.speculation import SearchWithHeld, SharedCalls, with_held
from tidegraph.processors.prompts import LLMRequest
from tidegraph.records.graph import EntityRecord


class Recorded:
    """An LLM that answers each request with its user prompt, after ``gate`` opens."""

    def __init__(self, *, fail_first: bool = False) -> None:
        self.asked: list[str] = []
        self.arrived = asyncio.Event()  # a request was made
        self.gate = asyncio.Event()
        self.fail_first = fail_first

    async def structured(self, *, stage: str, system: str, user: str, schema: type) -> Any:
        self.asked.append(user)
        self.arrived.set()
        await self.gate.wait()
        if self.fail_first and len(self.asked) == 1:
            raise RuntimeError("the first call fails")
        return f"answer to {user}"


def ahead(outcome: str) -> float:
    return REGISTRY.get_sample_value("tidegraph_llm_calls_ahead_total", {"outcome": outcome}) or 0.0


def request(user: str) -> dict[str, Any]:
    return {"stage": "resolution", "system": "s", "user": user, "schema": dict}


async def test_a_call_started_ahead_answers_the_same_request_once() -> None:
    llm = Recorded()
    shared = SharedCalls(llm)
    shared.start(LLMRequest(**request("q1")))
    await llm.arrived.wait()  # the started call is made
    assert llm.asked == ["q1"]
    used = ahead("used")
    llm.gate.set()
    assert await shared.structured(**request("q1")) == "answer to q1"
    assert llm.asked == ["q1"] and ahead("used") == used + 1
    # used once: the same request again is a call of its own
    assert await shared.structured(**request("q1")) == "answer to q1"
    assert llm.asked == ["q1", "q1"]


async def test_another_request_is_asked_and_an_unused_call_is_cancelled() -> None:
    llm = Recorded()
    shared = SharedCalls(llm)
    shared.start(LLMRequest(**request("guess")))
    shared.start(LLMRequest(**request("guess")))  # started once
    await llm.arrived.wait()
    llm.gate.set()
    assert await shared.structured(**request("real")) == "answer to real"
    assert llm.asked == ["guess", "real"]
    unused = ahead("unused")
    shared.close()
    assert ahead("unused") == unused + 1
    assert await shared.structured(**request("guess")) == "answer to guess"  # not kept


async def test_a_failed_call_started_ahead_is_asked_again() -> None:
    llm = Recorded(fail_first=True)
    shared = SharedCalls(llm)
    shared.start(LLMRequest(**request("q")))
    await llm.arrived.wait()
    failed = ahead("failed")
    llm.gate.set()
    assert await shared.structured(**request("q")) == "answer to q"
    assert llm.asked == ["q", "q"] and ahead("failed") == failed + 1


async def test_closing_cancels_a_call_still_running() -> None:
    llm = Recorded()
    shared = SharedCalls(llm)
    shared.start(LLMRequest(**request("slow")))
    await llm.arrived.wait()
    [task] = shared._started.values()
    shared.close()
    with pytest.raises(asyncio.CancelledError):
        await task


# ----------------------------------------------------------------------------- the guess's search
def entity(uuid: str, name: str, summary: str = "") -> EntityRecord:
    return EntityRecord(uuid=uuid, group_id="g", name=name, summary=summary)


def test_held_entities_join_a_search_as_the_store_would_rank_them_once_written() -> None:
    """An entity held ahead of its write is a vector hit by its exact cosine (the best
    ``limit`` kept), a text hit when a word of the searched name is in its name or summary,
    and an entity the store answered with is shown as the unit holds it."""
    stored_close = entity("s1", "Acme Corp")
    stored_far = entity("s2", "Printer")
    answer = ([(stored_close, 0.9), (stored_far, 0.55)], [(stored_close, 3.0)])
    held_new = entity("h1", "Acme Holdings")
    held_stored = entity("s1", "Acme Corp", summary="now on the Pro plan")
    unrelated = entity("h2", "Zebra")
    query = [1.0, 0.0]
    held = [(held_new, [0.6, 0.8]), (held_stored, [1.0, 0.0]), (unrelated, [-1.0, 0.0])]
    by_vector, by_text = with_held(answer, "Acme", query, held, limit=3)
    assert [(e.uuid, round(s, 3)) for e, s in by_vector] == [
        ("s1", 0.9),  # the store's score, the unit's version of the record
        ("h1", 0.8),  # (1 + 0.6) / 2
        ("s2", 0.55),
    ]
    assert by_vector[0][0].summary == "now on the Pro plan"
    assert [e.uuid for e, _ in by_text] == ["h1", "s1"]  # "Zebra" shares no word
    by_vector, by_text = with_held(answer, "Acme", query, held, limit=1)
    assert [e.uuid for e, _ in by_vector] == ["s1"] and [e.uuid for e, _ in by_text] == ["h1"]


async def test_the_guess_searches_the_store_then_adds_the_held_entities() -> None:
    class Store:
        async def entity_candidates(
            self, group_id: str, searches: list[tuple[str, list[float]]], limit: int
        ) -> list[tuple[list[tuple[EntityRecord, float]], list[tuple[EntityRecord, float]]]]:
            return [([], []) for _ in searches]

    held = [entity("h1", "Acme Holdings")]
    embedder = HashingEmbedder(dim=16)
    [vector] = await embedder.embed(["Acme Holdings"])
    search = SearchWithHeld(Store(), held, embedder)
    [(by_vector, by_text)] = await search.entity_candidates("g", [("Acme", vector)], 5)
    assert [(e.uuid, round(s, 6)) for e, s in by_vector] == [("h1", 1.0)]
    assert [e.uuid for e, _ in by_text] == ["h1"]
    assert await SearchWithHeld(Store(), [], embedder).entity_candidates(
        "g", [("Acme", vector)], 5
    ) == [([], [])]
