"""Extraction stage: an episode -> entities and facts (with dates as stated).

JSON records that a declared mapping matches skip the LLM entirely. Everything else takes one
structured LLM call, with the group's previous episodes as context.
"""

from __future__ import annotations

import logging
from typing import Protocol

from processors.mapping import MappingSet
from processors.prompts import EXTRACTION_SYSTEM, ExtractionOutput, extraction_user
from tidegraph.records.episode import Episode
from tidegraph.records.errors import NoExtractorError
from tidegraph.records.graph import EpisodeRecord
from tidegraph.records.ids import to_label
from tidegraph.records.stages import EntityDraft, Extraction, FactDraft

log = logging.getLogger(__name__)


class StructuredLLM(Protocol):
    async def structured(self, *, stage: str, system: str, user: str, schema: type): ...


class ContextSource(Protocol):
    async def recent_episodes(
        self, group_id: str, before: object, limit: int
    ) -> list[EpisodeRecord]: ...


class Extractor:
    """``run(episode) -> Extraction``."""

    stage = "extraction"

    def __init__(
        self,
        *,
        mappings: MappingSet | None,
        llm: StructuredLLM | None,
        context: ContextSource | None = None,
        context_episodes: int = 4,
    ) -> None:
        self.mappings = mappings
        self.llm = llm
        self.context = context
        self.context_episodes = context_episodes

    def mapped(self, episode: Episode) -> Extraction | None:
        """The extraction a declared mapping gives (no I/O, no LLM); None when no mapping
        applies or the record cannot be mapped (``run`` then says why)."""
        if episode.source != "json" or self.mappings is None:
            return None
        try:
            return self.mappings.extract(episode)
        except ValueError:
            return None

    async def run(self, episode: Episode) -> Extraction:
        if episode.source == "json" and self.mappings is not None:
            mapped = self.mappings.extract(episode)
            if mapped is not None:
                return mapped
        if self.llm is None:
            what = (
                "no declared mapping matches this json record"
                if episode.source == "json"
                else (f"{episode.source} episodes need an LLM")
            )
            raise NoExtractorError(
                f"{what} and no LLM is configured: set TIDEGRAPH_LLM_BASE_URL (and "
                f"TIDEGRAPH_LLM_API_KEY, TIDEGRAPH_LLM_MODEL) or add a mapping rule"
            )
        context: list[EpisodeRecord] = []
        if self.context is not None and self.context_episodes > 0:
            context = await self.context.recent_episodes(
                episode.group_id, episode.reference_time, self.context_episodes
            )
        output: ExtractionOutput = await self.llm.structured(
            stage=self.stage,
            system=EXTRACTION_SYSTEM,
            user=extraction_user(episode, context),
            schema=ExtractionOutput,
        )
        return from_llm_output(episode, output)


def from_llm_output(episode: Episode, output: ExtractionOutput) -> Extraction:
    """Validate untrusted LLM output into an Extraction (names are data, never code)."""
    entities: list[EntityDraft] = []
    index: dict[str, int] = {}

    def entity_index(name: str, type_: str | None = None, summary: str | None = None) -> int:
        clean = " ".join(name.split())[:512]
        key = clean.casefold()
        if key not in index:
            label = to_label(type_) if type_ else None
            entities.append(
                EntityDraft(name=clean, labels=[label] if label else [], summary=summary or "")
            )
            index[key] = len(entities) - 1
        return index[key]

    for e in output.entities:
        if e.name.strip():
            entity_index(e.name, e.type, e.summary)
    facts: list[FactDraft] = []
    for f in output.facts:
        if not (f.subject.strip() and f.object.strip() and f.fact.strip()):
            continue
        facts.append(
            FactDraft(
                subject=entity_index(f.subject),
                object=entity_index(f.object),
                relation=f.relation,
                fact=f.fact.strip()[:2000],
                valid_at=f.valid_at,
                invalid_at=f.invalid_at,
            )
        )
    return Extraction(episode=episode, entities=entities, facts=facts, llm_calls=1)
