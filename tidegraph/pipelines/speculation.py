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

The real search runs once the episodes before are written, so it also finds the entities those
episodes create or change. The guess's search therefore adds them (``SearchWithHeld``): the
store's answer with the entities the unit holds ahead of their write put in as the store would
rank them once written (vector hits by their exact cosine; a text hit when a word of the draft's
name is in the entity's name or summary). Without them, the guess missed whenever the episode
names an entity the one before it introduced, and its judging call then ran after the write,
on the group's chain.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tidegraph.embed.base import Embedder
from tidegraph.metrics import LLM_CALLS_AHEAD
from tidegraph.processors.prompts import LLMRequest, StructuredLLM
from tidegraph.processors.steps import EntitySearch
from tidegraph.records.graph import EntityRecord
from tidegraph.records.vectors import cosine
from tidegraph.stores.search_text import search_terms, text_words

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


Hits = list[tuple[EntityRecord, float]]


class SearchWithHeld:
    """A store's entity search answered as if entities held ahead of their episodes' write
    were written (see the module docstring): for guessing a judging call only, never for a
    real resolution."""

    def __init__(self, store: EntitySearch, held: list[EntityRecord], embedder: Embedder) -> None:
        self.store = store
        self.held = held
        self.embedder = embedder

    async def entity_candidates(
        self, group_id: str, searches: list[tuple[str, list[float]]], limit: int
    ) -> list[tuple[Hits, Hits]]:
        answers = await self.store.entity_candidates(group_id, searches, limit)
        if not self.held:
            return answers
        vectors = await self.embedder.embed([entity.name for entity in self.held])
        held = list(zip(self.held, vectors, strict=True))
        return [
            with_held(answer, name, embedding, held, limit)
            for answer, (name, embedding) in zip(answers, searches, strict=True)
        ]


def with_held(
    answer: tuple[Hits, Hits],
    name: str,
    embedding: list[float],
    held: list[tuple[EntityRecord, list[float]]],
    limit: int,
) -> tuple[Hits, Hits]:
    """One search's answer (vector hits, text hits) with the ``held`` entities (each with its
    name's embedding) in it: a held entity the store answered with replaces its stored
    version in place; another is a vector hit by its cosine (scored as the stores score,
    ``(1 + cos) / 2``, the best ``limit`` kept) and a text hit, first, when a word of ``name``
    is in its name or summary (``limit`` kept). Pure."""
    by_vector, by_text = answer
    mine = {entity.uuid: entity for entity, _ in held}
    by_vector = [(mine.get(e.uuid, e), score) for e, score in by_vector]
    by_text = [(mine.get(e.uuid, e), score) for e, score in by_text]
    terms = set(search_terms(name))
    for entity, vector in held:
        if not any(e.uuid == entity.uuid for e, _ in by_vector):
            by_vector.append((entity, (1 + cosine(embedding, vector)) / 2))
        if not any(e.uuid == entity.uuid for e, _ in by_text):
            if terms & text_words(f"{entity.name} {entity.summary}"):
                by_text.insert(0, (entity, 1.0))
    by_vector.sort(key=lambda hit: (-hit[1], hit[0].uuid))
    return by_vector[:limit], by_text[:limit]
