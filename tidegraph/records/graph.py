"""The graph's records as the store reads and writes them (docs/architecture.md "Data
model"), and what one episode changes in one transaction."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from tidegraph.records.changes import Change
    from tidegraph.records.episode import Episode


# ----------------------------------------------------------------------------- graph records
_Model = TypeVar("_Model", bound=BaseModel)


def updated(record: _Model, update: dict[str, Any]) -> _Model:
    """``record.model_copy(update=update)``, built directly: the same fields, the same fields
    set and equal, its values shared with ``record`` and ``update``'s taken as they are (not
    validated). The write rules, the batch view and the fact planner copy records many times
    per episode, and pydantic's generic copy (three ``copy.copy`` calls) was most of it. A
    model with extra or private attributes (none of the graph's records) takes pydantic's."""
    if record.__pydantic_extra__ is not None or record.__pydantic_private__ is not None:
        return record.model_copy(update=update)
    cls = type(record)
    copy = cls.__new__(cls)
    fields = record.__dict__.copy()
    fields.update(update)
    object.__setattr__(copy, "__dict__", fields)
    object.__setattr__(
        copy, "__pydantic_fields_set__", record.__pydantic_fields_set__ | update.keys()
    )
    object.__setattr__(copy, "__pydantic_extra__", None)
    object.__setattr__(copy, "__pydantic_private__", None)
    return copy


def constructed(kind: type[_Model], values: dict[str, Any]) -> _Model:
    """``kind.model_construct(**values)`` for ``values`` naming every field of ``kind``
    (trusted, not validated), built directly: pydantic's walks the fields and their aliases,
    about twice the time of a validation. Anything else (a field left to its default, a model
    with private attributes) takes pydantic's."""
    fields = kind.model_fields
    if values.keys() != fields.keys() or kind.__private_attributes__:
        return kind.model_construct(**values)
    record = kind.__new__(kind)
    object.__setattr__(record, "__dict__", {name: values[name] for name in fields})
    object.__setattr__(record, "__pydantic_fields_set__", set(fields))
    object.__setattr__(record, "__pydantic_extra__", None)
    object.__setattr__(record, "__pydantic_private__", None)
    return record


class EntityRecord(BaseModel):
    uuid: str
    group_id: str
    name: str
    labels: list[str] = Field(default_factory=list)
    summary: str = ""
    key: str | None = None
    aliases: list[str] = Field(default_factory=list)  # normalised names that resolved here
    name_embedding: list[float] | None = None
    created_at: datetime | None = None
    community_uuid: str | None = None


class FactRecord(BaseModel):
    uuid: str
    group_id: str
    source_uuid: str
    target_uuid: str
    name: str  # relation type, UPPER_SNAKE_CASE
    fact: str
    fact_embedding: list[float] | None = None
    episodes: list[str] = Field(default_factory=list)  # episode uuids
    valid_at: datetime | None = None
    invalid_at: datetime | None = None
    created_at: datetime | None = None
    expired_at: datetime | None = None
    cardinality: Literal["one", "many"] | None = None
    # What was believed before the end moved (a late fact tightened an already-closed
    # interval): the earlier invalid_at values, oldest first, and when tidegraph learned each
    # (T'); end_learned_at is when it learned the current invalid_at (None: at expired_at).
    # Empty and None while the end has never moved, which is nearly always.
    prior_ends: list[datetime] = Field(default_factory=list)
    prior_ends_learned_at: list[datetime] = Field(default_factory=list)
    end_learned_at: datetime | None = None
    # The same for the start (an earlier restatement, delivered late, moved valid_at
    # earlier): the earlier valid_at values, oldest first, when each was learned (T'), and
    # when the current one was learned (None: at created_at).
    prior_starts: list[datetime] = Field(default_factory=list)
    prior_starts_learned_at: list[datetime] = Field(default_factory=list)
    start_learned_at: datetime | None = None

    def move_end(self, at: datetime, now: datetime) -> None:
        """Set ``invalid_at`` to ``at`` as learned ``now``: the first end sets ``expired_at``
        (once); moving an end already stored keeps the one it replaces in the history, so
        that questions about an earlier belief (known-at) still see it."""
        learned = self.end_learned_at or self.expired_at
        if self.invalid_at is not None and learned is not None and learned < now:
            self.prior_ends = [*self.prior_ends, self.invalid_at]
            self.prior_ends_learned_at = [*self.prior_ends_learned_at, learned]
            self.end_learned_at = now
        self.invalid_at = at
        if self.expired_at is None:
            self.expired_at = now

    def ended_before(self, moment: datetime) -> bool:
        """It stopped being valid before ``moment``. Such a fact cannot change the plan of a
        new fact that starts at or after ``moment`` (``tidegraph.processors.timeline``), so
        the batch read of a unit leaves it out (``GraphStore.read_batch``)."""
        return self.invalid_at is not None and self.invalid_at < moment

    def move_start(self, at: datetime, now: datetime) -> None:
        """Set ``valid_at`` to ``at`` (earlier) as learned ``now``: the start it replaces is
        kept in the history when it had been stored before ``now`` (see ``move_end``)."""
        learned = self.start_learned_at or self.created_at
        if self.valid_at is not None and learned is not None and learned < now:
            self.prior_starts = [*self.prior_starts, self.valid_at]
            self.prior_starts_learned_at = [*self.prior_starts_learned_at, learned]
            self.start_learned_at = now
        self.valid_at = at


class EpisodeRecord(BaseModel):
    uuid: str
    group_id: str
    name: str
    source: str
    source_description: str
    content: str
    valid_at: datetime
    created_at: datetime | None = None
    producer_id: str = ""
    content_hash: str = ""  # Episode.content_hash; "" on episodes stored before it existed
    content_embedding: list[float] | None = None  # for episode search (docs/retrieval.md)
    # Why the episode is stored without extraction (Extraction.not_extracted); None: extracted.
    not_extracted: str | None = None
    # What its extraction gave (entities and facts as drafts, JSON), and when its effects were
    # written (T'): a forget replays the group's remaining episodes from these
    # (docs/architecture.md "Forgetting").
    extraction: str | None = None
    extracted_at: datetime | None = None

    @classmethod
    def of(
        cls,
        episode: Episode,
        *,
        created_at: datetime | None = None,
        content_embedding: list[float] | None = None,
        not_extracted: str | None = None,
        extraction: str | None = None,
        extracted_at: datetime | None = None,
    ) -> EpisodeRecord:
        """``episode``'s node: its own fields, and those a write sets (none for an episode
        not yet written, as the extraction context shows one)."""
        return cls(
            uuid=episode.uuid,
            group_id=episode.group_id,
            name=episode.name or episode.id,
            source=episode.source,
            source_description=episode.source_description,
            content=episode.content_text(),
            valid_at=episode.reference_time,
            producer_id=episode.id,
            content_hash=episode.content_hash,
            created_at=created_at,
            content_embedding=content_embedding,
            not_extracted=not_extracted,
            extraction=extraction,
            extracted_at=extracted_at,
        )


class FactView(BaseModel):
    """A fact as the query commands print it (`tidegraph facts --json`)."""

    uuid: str
    subject: str
    relation: str
    object: str
    fact: str
    valid_at: str | None
    invalid_at: str | None
    created_at: str | None
    expired_at: str | None
    episodes: list[str]  # producer ids of the episodes


@dataclass(frozen=True)
class FactClosure:
    """Close a stored fact: set ``invalid_at`` (event time) and, once, ``expired_at``; when
    the end moved, also its history (``FactRecord.prior_ends``: the full lists, so that
    writing a closure twice is harmless). The start and its history stay as stored: a fact
    whose start moves is written in full (``EpisodeWrite.facts``)."""

    uuid: str
    invalid_at: datetime
    expired_at: datetime
    prior_ends: tuple[datetime, ...] = ()
    prior_ends_learned_at: tuple[datetime, ...] = ()
    end_learned_at: datetime | None = None

    @classmethod
    def of(cls, fact: FactRecord) -> FactClosure:
        """The closure that brings a stored fact to ``fact``'s end (which must be set)."""
        if fact.invalid_at is None or fact.expired_at is None:
            raise ValueError(f"fact {fact.uuid} has no end to write")
        return cls(
            fact.uuid,
            fact.invalid_at,
            fact.expired_at,
            tuple(fact.prior_ends),
            tuple(fact.prior_ends_learned_at),
            fact.end_learned_at,
        )


@dataclass
class EpisodeWrite:
    """Everything one episode changes, written in one transaction."""

    episode: EpisodeRecord
    mentions: list[str] = field(default_factory=list)  # entity uuids the episode mentions
    facts: list[FactRecord] = field(default_factory=list)  # upserted by uuid (full state)
    closures: list[FactClosure] = field(default_factory=list)
    # Entity upserts (MERGE by uuid: ``tidegraph.stores.write_rules.merged_entity``) written
    # first, in the same transaction.
    entities: list[EntityRecord] = field(default_factory=list)
    # The uuids of the entities this episode creates (``PendingWrite.created``), kept on its
    # marker so that a redelivery of the processed episode can send their events again.
    created: list[str] = field(default_factory=list)
    # What the write changes, for the change stream (``tidegraph.records.changes``): recorded
    # in the same transaction when the write is admitted, numbered in the group's order.
    changes: list[Change] = field(default_factory=list)


@dataclass
class EntityLookup:
    """What resolution reads for one episode, in one round trip (``lookup_entities``).

    Records carry neither ``name_embedding`` nor ``community_uuid`` (resolution uses
    neither), facts no ``fact_embedding``."""

    processed: bool = False  # the episode asked about is already processed (nothing else read)
    created_entities: list[str] = field(default_factory=list)  # when processed: what it created
    by_key: list[EntityRecord] = field(default_factory=list)
    by_name: list[EntityRecord] = field(default_factory=list)
    # When relations were given: the stored facts whose source is an entity found above and
    # whose relation is one of them (ordered like facts_touching).
    facts: list[FactRecord] | None = None


@dataclass
class CommunityRecord:
    """A stored community: ``members`` are entity uuids (an entity is in at most one).

    ``name_embedding`` is written when given; ``communities()`` does not read it back, the
    search methods do."""

    uuid: str
    name: str
    summary: str
    members: list[str] = field(default_factory=list)
    name_embedding: list[float] | None = None
    created_at: datetime | None = None  # set when first written; None on older stores


@dataclass(frozen=True)
class WeightedEdge:
    """Two entities and the number of currently valid facts between them (either way)."""

    source: str
    target: str
    weight: int


@dataclass
class ChangeLog:
    """A group's change outbox: its last change's ``seq``, the last one the relay
    published, the group's write version (moved by every committed write) and the deployment
    whose relay publishes it (the topic prefix of its first writer; None: a log written
    before deployments were recorded, until its next write)."""

    group_id: str
    seq: int = 0
    published: int = 0
    version: int = 0
    deployment: str | None = None


@dataclass
class GroupHistory:
    """What a rebuild of a group starts from (``Forgetting.group_history``): its episodes
    that are not forgotten, in the order their effects were written, with their stored
    extractions; its entities and facts with their embeddings; each episode's mentions and
    the entities it created; the group's write version."""

    episodes: list[EpisodeRecord] = field(default_factory=list)
    entities: dict[str, EntityRecord] = field(default_factory=dict)
    facts: dict[str, FactRecord] = field(default_factory=dict)
    mentions: dict[str, list[str]] = field(default_factory=dict)
    created: dict[str, list[str]] = field(default_factory=dict)
    version: int = 0


# How a stored extraction says a mapping made it (``records.stages.stored_extraction``: pydantic's
# compact JSON), for the stores to count the others.
MAPPED = '"mapped":true'


@dataclass(frozen=True)
class GroupProfile:
    """What decides whether a forget may work out its reach (``Forgetting.group_profile``):
    whether one of the group's live extracted episodes was extracted by the LLM (not a
    mapping), and whether one keeps no extraction (stored before extractions were kept)."""

    judged: bool = False
    without_extraction: bool = False


@dataclass
class Rebuild:
    """What a forget changes, written in one transaction (``Forgetting.apply_rebuild``): the
    difference between the group's graph and the one its remaining episodes give.

    The store refuses it (``RebuildConflict``) when the group's write version is no longer
    ``version`` (a write came in meanwhile: compute again)."""

    version: int
    forgotten: list[str]  # episode uuids: become tombstones (no content, no mentions)
    forgotten_at: datetime
    delete_entities: list[str] = field(default_factory=list)
    delete_facts: list[str] = field(default_factory=list)
    entities: list[EntityRecord] = field(default_factory=list)  # full state, created or not
    facts: list[FactRecord] = field(default_factory=list)  # full state, created or not
    mentions: dict[str, list[str]] = field(default_factory=dict)  # episode -> all its mentions
    created: dict[str, list[str]] = field(default_factory=dict)  # episode -> created entities
    changes: list[Change] = field(default_factory=list)
    # Records whose earlier changes leave the outbox (they carry erased content).
    purged: list[str] = field(default_factory=list)


EpisodeState = Literal["written", "not_extracted", "forgotten"]


@dataclass(frozen=True)
class EpisodeEntry:
    """One stored episode as a listing shows it (``Browsing.list_episodes``); a forgotten
    one is its tombstone: uuid and when, nothing else."""

    uuid: str
    producer_id: str
    name: str
    source: str
    valid_at: datetime | None
    created_at: datetime | None
    status: EpisodeState
    not_extracted: str | None = None
    content: str = ""
    forgotten_at: datetime | None = None


@dataclass(frozen=True)
class EpisodeDetail:
    """One episode and the entities it mentions (``Browsing.episode_detail``); a
    tombstone's mentions are gone with it."""

    entry: EpisodeEntry
    mentions: list[str] = field(default_factory=list)  # entity uuids
