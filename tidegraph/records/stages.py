"""The records that flow between the stages (``tidegraph.pipelines.runner``): an episode's
extraction, its
resolution, its stamped facts, and what its write changed."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tidegraph.records import jsontext
from tidegraph.records.episode import MAX_NAME_CHARS, Episode, json_too_deep
from tidegraph.records.graph import EntityRecord, FactRecord
from tidegraph.records.ids import to_relation_name

# ----------------------------------------------------------------------------- extraction
# What one episode's extraction may carry (docs/streaming.md "Retries and dead letters":
# extraction_too_large). A group's records are written in order, so one record's write holds
# the group's next: 2,000 entities and 2,000 facts took a minute on Neo4j, 256 and 512 under
# three seconds. A declared mapping gives a handful; an LLM answer of one call holds far fewer.
MAX_EXTRACTED_ENTITIES = 256
MAX_EXTRACTED_FACTS = 512
MAX_ATTRIBUTES_CHARS = 4096  # an entity's attributes as JSON
MAX_ATTRIBUTES_DEPTH = 8
TOO_LARGE = "extraction_too_large"  # the error type (and dead-letter reason) of the bounds


class EntityDraft(BaseModel):
    """An entity as extraction saw it, before resolution."""

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    labels: list[str] = Field(default_factory=list)  # type labels, already to_label()-safe
    summary: str = ""
    key: str | None = None  # stable external id (e.g. a CRM id) from a mapping
    attributes: dict[str, Any] = Field(default_factory=dict)

    @field_validator("attributes", mode="before")
    @classmethod
    def _small_attributes(cls, v: Any) -> Any:
        if isinstance(v, dict) and v:
            deep = json_too_deep(v, MAX_ATTRIBUTES_DEPTH)
            try:
                size = len(jsontext.dumps(v)) if not deep else 0
            except (TypeError, ValueError):  # no JSON at all: the field's own check says so
                return v
            if deep or size > MAX_ATTRIBUTES_CHARS:
                raise PydanticCustomError(
                    TOO_LARGE,
                    "an entity's attributes nest more than {depth} levels or are over "
                    "{chars} characters as JSON",
                    {"depth": MAX_ATTRIBUTES_DEPTH, "chars": MAX_ATTRIBUTES_CHARS},
                )
        return v


class FactDraft(BaseModel):
    """A fact as extraction saw it. subject/object index into Extraction.entities."""

    subject: int
    object: int  # -1: no object (only for closing facts: close whatever the subject has)
    relation: str  # UPPER_SNAKE_CASE (to_relation_name)
    fact: str
    valid_at: str | None = None  # as stated: ISO date/time or a phrase ("since last March")
    invalid_at: str | None = None
    cardinality: Literal["one", "many"] | None = None  # one: a new object closes the previous
    closes: bool = False  # a record that only ends the fact (no new fact stored)

    @field_validator("relation")
    @classmethod
    def _relation_name(cls, v: str) -> str:
        return to_relation_name(v)


class TableClose(BaseModel):
    """A table's facts that a truncate closes (``truncate: close``, docs/sources.md): every
    open ``relation`` fact of the group's entities whose key starts with ``key_prefix`` (the
    rows of the table, as its mapping keys them). Resolution turns it into one closing fact
    per such entity (``tidegraph.processors.resolution.with_table_closes``)."""

    key_prefix: str = Field(min_length=1)
    relation: str
    cardinality: Literal["one", "many"] | None = None
    fact: str  # the closing facts' text, after the entity's name

    @field_validator("relation")
    @classmethod
    def _relation_name(cls, v: str) -> str:
        return to_relation_name(v)


class Extraction(BaseModel):
    episode: Episode
    entities: list[EntityDraft] = Field(default_factory=list)
    facts: list[FactDraft] = Field(default_factory=list)
    # A truncate's closes, expanded at resolution (its entities are the stored ones).
    table_closes: list[TableClose] = Field(default_factory=list)
    mapped: bool = False  # produced by a declared mapping (no LLM)
    llm_calls: int = 0
    # Why nothing was extracted yet (docs/architecture.md "Episodes without an LLM"): the episode is
    # stored with its content, searchable, and `tidegraph extract --pending` extracts it later.
    # None: extracted (possibly into nothing).
    not_extracted: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _within_bounds(cls, data: Any) -> Any:
        # Before the drafts are read: a record far over the bounds costs nothing more.
        if isinstance(data, dict):
            entities, facts = data.get("entities") or [], data.get("facts") or []
            if len(entities) > MAX_EXTRACTED_ENTITIES or len(facts) > MAX_EXTRACTED_FACTS:
                raise PydanticCustomError(
                    TOO_LARGE,
                    "the extraction has {entities} entities and {facts} facts; one episode's "
                    "may have at most {max_entities} and {max_facts}",
                    {"entities": len(entities), "facts": len(facts),
                     "max_entities": MAX_EXTRACTED_ENTITIES, "max_facts": MAX_EXTRACTED_FACTS},
                )  # fmt: skip
        return data

    @model_validator(mode="after")
    def _facts_name_its_entities(self) -> Extraction:
        # Checked here so that a hop record breaking it is unreadable (bad_hop_record) rather
        # than an IndexError in a later stage.
        count = len(self.entities)
        for fact in self.facts:
            lowest = -1 if fact.closes else 0
            if not (0 <= fact.subject < count and lowest <= fact.object < count):
                raise ValueError(
                    f"fact {fact.relation} names entities {fact.subject} and {fact.object}; "
                    f"the extraction has {count}"
                )
        return self


class PendingWrite(BaseModel):
    """What resolution leaves to the episode's write, one transaction later in the same
    ordered hop (``tidegraph.pipelines.runner``): the entity upserts, which of them are new, and the
    stored
    facts its lookup already read (so that the write need not read them again)."""

    entities: list[EntityRecord] = Field(default_factory=list)
    created: list[str] = Field(default_factory=list)  # uuids of entities this episode creates
    # The stored facts of the found entities for the episode's relations, read with the
    # lookup (mapped episodes); None: the write reads its candidates itself.
    known_facts: list[FactRecord] | None = None
    known_sources: list[str] = Field(default_factory=list)  # entities known_facts covers
    # The episode's ingestion time (T'), taken once by resolution: its new entities and its
    # facts carry the same instant, so a forget's replay (which writes each episode at its
    # stored time) gives them back exactly. None: the write takes its own.
    ingested_at: datetime | None = None


class ResolvedEpisode(BaseModel):
    extraction: Extraction
    entity_uuids: list[str]  # one per extraction.entities index
    llm_calls: int = 0
    entities_new: int = 0  # entities this episode created
    pending: PendingWrite = Field(default_factory=PendingWrite)


class Processed(BaseModel):
    """A step's answer for an episode that is already processed (a redelivery or a replay):
    the chain stops here. ``created_entities``: the entities its write created, when known,
    so that their new-entity events can be sent again (consumers treat them idempotently).
    ``not_extracted``: the episode is stored without extraction and still is (a re-sent
    episode nothing could extract again), and why."""

    episode: Episode
    created_entities: list[str] = Field(default_factory=list)
    not_extracted: str | None = None


class StampedFact(BaseModel):
    """A resolved fact with its interval on T, ready for invalidation and writing."""

    source_uuid: str
    target_uuid: str | None  # None only for a closing fact without an object
    relation: str
    fact: str
    valid_at: datetime
    invalid_at: datetime | None = None
    cardinality: str | None = None
    closes: bool = False
    notes: list[str] = Field(default_factory=list)  # e.g. an unparseable date that was ignored


class StampedEpisode(BaseModel):
    """The temporal stage's output: what the writer needs for one episode."""

    episode: Episode
    mentions: list[str]  # entity uuids, episode order, unique
    facts: list[StampedFact]
    llm_calls: int = 0
    mapped: bool = False
    entities_new: int = 0
    pending: PendingWrite = Field(default_factory=PendingWrite)
    not_extracted: str | None = None  # Extraction.not_extracted
    extraction: Extraction | None = None  # what was extracted, stored with the episode


class WriteSummary(BaseModel):
    group_id: str
    episode_uuid: str
    episode_id: str
    facts_new: int = 0
    facts_merged: int = 0
    facts_closed: int = 0
    facts_born_closed: int = 0
    entities: int = 0  # entities the episode mentions
    entities_new: int = 0  # of which it created
    created_entities: list[str] = Field(default_factory=list)  # their uuids (entities.new)
    llm_calls: int = 0
    not_extracted: str | None = None  # stored without extraction, and why (Extraction)


def stored_extraction(extraction: Extraction) -> str:
    """An extraction as the episode keeps it (JSON: its drafts and whether a mapping made
    them), so that the group can be replayed without extracting again."""
    return extraction.model_dump_json(include={"entities", "facts", "mapped"})


def extraction_of(episode: Episode, stored: str) -> Extraction:
    """The extraction ``stored_extraction`` kept, for ``episode``."""
    data = orjson.loads(stored)
    return Extraction.model_validate({**data, "episode": episode})
