"""LLM calls started ahead on a guess, used only for exactly the same request.

In a unit of text episodes (``tidegraph.pipelines.units``), an episode whose resolution
searches the store waits for the episodes before it in the unit to be judged and written (the
search must see their entities). Meanwhile the entity judging call its resolution would make
against the store as it stands is worked out (``ResolutionStep.speculate``) and started here
(``SharedCalls.start``). When the episode's real resolution asks the LLM, a started call with
exactly the same request (stage, system prompt, user prompt, schema) answers it
(``SharedCalls.structured``); any other request is made as usual. So a started call changes
nothing but when the answer arrives, and a wrong guess costs one call
(``tidegraph_llm_calls_ahead_total``). Docs: "Batch-native stages".
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tidegraph.metrics import LLM_CALLS_AHEAD
from tidegraph.processors.prompts import LLMRequest, StructuredLLM

log = logging.getLogger(__name__)


class SharedCalls:
    """An LLM client whose answers may come from calls started ahead for the same request."""

    def __init__(self, llm: StructuredLLM) -> None:
        self.llm = llm
        self._started: dict[LLMRequest, asyncio.Task[Any]] = {}

    async def structured(self, *, stage: str, system: str, user: str, schema: type) -> Any:
        request = LLMRequest(stage, system, user, schema)
        task = self._started.pop(request, None)
        if task is not None:
            try:
                answer = await task
            except Exception as exc:  # asked again, with the client's usual handling
                LLM_CALLS_AHEAD.labels("failed").inc()
                log.info("an LLM call started ahead failed, asking again: %s", exc)
            else:
                LLM_CALLS_AHEAD.labels("used").inc()
                return answer
        return await request.ask(self.llm)

    def start(self, request: LLMRequest) -> None:
        """Start the call for this request (once), for a later ``structured`` to use."""
        if request not in self._started:
            self._started[request] = asyncio.create_task(request.ask(self.llm))

    def close(self) -> None:
        """Drop the calls started and never used (cancelled when still running)."""
        for task in self._started.values():
            LLM_CALLS_AHEAD.labels("unused").inc()
            if task.done():
                if not task.cancelled():
                    task.exception()  # retrieved: an unused failure is nobody's
            else:
                task.cancel()
        self._started.clear()
