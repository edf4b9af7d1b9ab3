"""LLM request schemas and prompts for the stages that need an LLM.

The schema class name is the request's name on the wire (``json_schema.name``): servers and
the scripted test server recognise a stage's request by it. Every field is required (OpenAI
strict mode); optional values are ``X | None``. LLM output is untrusted: the stages validate
every index and name it returns and treat names and relation types as data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from tidegraph.records.episode import Episode
from tidegraph.records.graph import EntityRecord, EpisodeRecord, FactRecord
from tidegraph.records.times import iso


class StructuredLLM(Protocol):
    """What the steps need of an LLM client (``tidegraph.llm.LLMClient``): one structured call
    whose answer fits ``schema``."""

    async def structured(self, *, stage: str, system: str, user: str, schema: type): ...


@dataclass(frozen=True)
class LLMRequest:
    """One structured call, as a value: what a step would ask (so that a call can be started
    before the step asks it, ``tidegraph.pipelines.speculation``)."""

    stage: str
    system: str
    user: str
    schema: type

    async def ask(self, llm: StructuredLLM) -> Any:
        return await llm.structured(
            stage=self.stage, system=self.system, user=self.user, schema=self.schema
        )


# ----------------------------------------------------------------------------- extraction
class LLMEntity(BaseModel):
    name: str
    type: str | None
    summary: str | None


class LLMFact(BaseModel):
    subject: str
    relation: str
    object: str
    fact: str
    valid_at: str | None
    invalid_at: str | None


class ExtractionOutput(BaseModel):
    entities: list[LLMEntity]
    facts: list[LLMFact]


EXTRACTION_SYSTEM = """You extract a knowledge graph from one episode of a conversation or \
document. Return every entity (people, organisations, products, plans, places, tickets, \
concepts) that the CURRENT episode mentions, with a short type (PascalCase, e.g. Person, \
Organization, Product) and a one-sentence summary of what the episode says about it. Return \
every fact the CURRENT episode states between two of those entities: subject and object are \
entity names exactly as in your entity list, relation is a short verb phrase in \
UPPER_SNAKE_CASE (WORKS_AT, HAS_PLAN, REPORTED_ISSUE), fact is one self-contained sentence. \
valid_at / invalid_at: when the fact became / stopped being true, as an ISO 8601 date resolved \
against the episode's reference time ("since last March" -> the date), or null when not \
stated. Use the previous episodes only to resolve references; do not extract facts from them."""


def extraction_user(episode: Episode, context: list[EpisodeRecord]) -> str:
    lines = [f"Reference time: {iso(episode.reference_time)}"]
    if context:
        lines.append("Previous episodes (context only):")
        lines += [f"- [{iso(c.valid_at)}] {c.content[:1000]}" for c in context]
    lines.append(f"Current episode ({episode.source}, {episode.source_description or 'n/a'}):")
    lines.append(episode.content_text())
    return "\n".join(lines)


class EpisodeExtraction(BaseModel):
    episode: int  # index of the current episode in the request
    entities: list[LLMEntity]
    facts: list[LLMFact]


class EpisodesExtractionOutput(BaseModel):
    episodes: list[EpisodeExtraction]


EPISODES_EXTRACTION_SYSTEM = """You extract a knowledge graph from several consecutive \
episodes of one conversation or document, each on its own. For EACH current episode, answer \
its index and every entity (people, organisations, products, plans, places, tickets, \
concepts) that THAT episode mentions, with a short type (PascalCase, e.g. Person, \
Organization, Product) and a one-sentence summary of what that episode says about it; and \
every fact THAT episode states between two of its entities: subject and object are entity \
names exactly as in that episode's entity list, relation is a short verb phrase in \
UPPER_SNAKE_CASE (WORKS_AT, HAS_PLAN, REPORTED_ISSUE), fact is one self-contained sentence. \
valid_at / invalid_at: when the fact became / stopped being true, as an ISO 8601 date resolved \
against that episode's reference time ("since last March" -> the date), or null when not \
stated. Use the previous episodes, and the current episodes before an episode, only to \
resolve references; never give an episode a fact that only another episode states."""

CURRENT_EPISODE = "Current episode [{index}] ({source}, {description}; reference time {time}):"
"""The heading of each current episode in a request for several (its content follows it)."""


def episodes_extraction_user(episodes: list[Episode], context: list[EpisodeRecord]) -> str:
    """A request to extract ``episodes`` (one group's, in order) in one call; ``context``: the
    episodes before the first one."""
    lines = []
    if context:
        lines.append("Previous episodes (context only):")
        lines += [f"- [{iso(c.valid_at)}] {c.content[:1000]}" for c in context]
    for index, episode in enumerate(episodes):
        heading = CURRENT_EPISODE.format(
            index=index,
            source=episode.source,
            description=episode.source_description or "n/a",
            time=iso(episode.reference_time),
        )
        lines += [heading, episode.content_text()]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- resolution
class EntityMatch(BaseModel):
    entity: int  # index of the extracted entity
    duplicate_of: int | None  # index of the candidate it is the same as, or null


class EntityResolutionOutput(BaseModel):
    matches: list[EntityMatch]


ENTITY_RESOLUTION_SYSTEM = """You decide whether newly extracted entities are the same \
real-world thing as entities already in the knowledge graph. For each new entity, answer the \
index of the candidate that denotes the same thing (same person, company, product...; \
spelling variants, abbreviations and legal suffixes do not make a different thing) or null \
when none does. Related but different things (a company and its subsidiary, two people \
sharing a surname) are NOT the same."""


def entity_resolution_user(
    drafts: list[tuple[int, str, str]], candidates: list[EntityRecord]
) -> str:
    lines = ["Existing entities (candidates):"]
    lines += [
        f"[{i}] {c.name} ({', '.join(c.labels) or 'Entity'}): {c.summary[:200]}"
        for i, c in enumerate(candidates)
    ]
    lines.append("New entities:")
    lines += [f"[{i}] {name}: {summary[:200]}" for i, name, summary in drafts]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- facts
class FactJudgement(BaseModel):
    new_fact: int  # number of the new fact
    duplicate_of: int | None  # number of a fact stating the same thing, or null
    contradicts: list[int]  # numbers of facts the new fact makes no longer true


class FactResolutionOutput(BaseModel):
    judgements: list[FactJudgement]


FACT_RESOLUTION_SYSTEM = """You compare new facts with facts already in a temporal knowledge \
graph. Every fact has its own number. For each new fact: duplicate_of = the existing fact \
that states the same thing (or null); contradicts = the existing facts that cannot both be \
true at the same time as the new fact (for example a person works at a different company \
now, an account moved to another plan, a ticket changed status). Facts that merely concern \
the same entities are NOT contradictions; when unsure, do not list it. When the new facts \
come from several messages (in order, each under its own line), a new fact may also \
duplicate or contradict a new fact of an EARLIER message: answer that fact's number."""


def fact_resolution_user(
    messages: list[tuple[str | None, list[tuple[int, str]]]],
    candidates: list[FactRecord],
    names: dict[str, str],
) -> str:
    """The stored ``candidates`` numbered from 0, then the new facts of each message (its
    label, when there are several, then its facts with their numbers, which follow the
    candidates'). ``names``: entity uuid -> name, for the candidates' endpoints."""
    lines = ["Existing facts:"]
    for i, f in enumerate(candidates):
        span = f"{iso(f.valid_at)} .. {iso(f.invalid_at) or 'now'}"
        src, tgt = names.get(f.source_uuid, "?"), names.get(f.target_uuid, "?")
        lines.append(f"[{i}] {src} -{f.name}-> {tgt}: {f.fact} ({span})")
    lines.append("New facts:")
    for label, facts in messages:
        if label is not None:
            lines.append(f"({label})")
        lines += [f"[{n}] {text}" for n, text in facts]
    return "\n".join(lines)
