"""LLM calls started ahead on a guess, used only for exactly the same request.

In a unit of text episodes (``tidegraph.pipelines.batches``), an episode whose resolution needs the
store's entity search first waits for the episodes before it in the unit to be judged and
written (the search must see their entities). Meanwhile its resolution is tried against the
store as it stands (``Peek``), and the entity judging call that try makes is started
(``Starting``, ``SharedCalls.start``). When the episode's real resolution asks the LLM, a
started call with exactly the same request (stage, system prompt, user prompt, schema)
answers it (``SharedCalls.structured``); any other request is made as usual. So a started
call changes nothing but when the answer arrives, and a wrong guess costs one call
(``tidegraph_llm_calls_ahead_total``). README "Batch-native stages".
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tidegraph.metrics import LLM_CALLS_AHEAD
from tidegraph.processors.prompts import StructuredLLM
from tidegraph.stores.base import GraphStore

log = logging.getLogger(__name__)

_Request = tuple[str, str, str, type]


class Speculated(Exception):
    """A tried step stopped at its LLM call, which is started ahead (``Starting``)."""


class SharedCalls:
    """An LLM client whose answers may come from calls started ahead for the same request."""

    def __init__(self, llm: StructuredLLM) -> None:
        self.llm = llm
        self._started: dict[_Request, asyncio.Task[Any]] = {}

    async def structured(self, *, stage: str, system: str, user: str, schema: type) -> Any:
        task = self._started.pop((stage, system, user, schema), None)
        if task is not None:
            try:
                answer = await task
            except Exception as exc:  # asked again, with the client's usual handling
                LLM_CALLS_AHEAD.labels("failed").inc()
                log.info("an LLM call started ahead failed, asking again: %s", exc)
            else:
                LLM_CALLS_AHEAD.labels("used").inc()
                return answer
        return await self.llm.structured(stage=stage, system=system, user=user, schema=schema)

    def start(self, *, stage: str, system: str, user: str, schema: type) -> None:
        """Start the call for this request (once), for a later ``structured`` to use."""
        request = (stage, system, user, schema)
        if request not in self._started:
            self._started[request] = asyncio.create_task(
                self.llm.structured(stage=stage, system=system, user=user, schema=schema)
            )

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


class Starting:
    """The LLM of a tried step: starts its call on ``shared`` and stops the step there."""

    def __init__(self, shared: SharedCalls) -> None:
        self.shared = shared

    async def structured(self, *, stage: str, system: str, user: str, schema: type) -> Any:
        self.shared.start(stage=stage, system=system, user=user, schema=schema)
        raise Speculated(stage)


class Peek:
    """A ``tidegraph.pipelines.batch_view.BatchView`` for a tried resolution: the view's answers,
    but an entity search asked of the store as it stands (the view's held writes not
    written, nothing kept in the view)."""

    def __init__(self, view: Any, store: GraphStore) -> None:
        self._view = view
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)

    async def entity_candidates(
        self, group_id: str, searches: list[tuple[str, list[float]]], limit: int
    ) -> Any:
        return await self._store.entity_candidates(group_id, searches, limit)


async def try_ahead(step: Any, item: Any) -> None:
    """Run a tried step for its LLM call's sake: whatever it ends with is dropped."""
    try:
        await step.run(item)
    except Exception as exc:
        if not isinstance(exc, Speculated):
            log.debug("a step tried ahead stopped: %s", exc)
