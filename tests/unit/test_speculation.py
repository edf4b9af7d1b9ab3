"""LLM calls started ahead on a guess (tidegraph.pipelines.speculation): a started call answers only
exactly the same request, and nothing started is left behind."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tidegraph.pipelines.speculation import SharedCalls
from tidegraph.processors.prompts import LLMRequest


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
