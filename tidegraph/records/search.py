"""What memory retrieval reads and answers (docs/retrieval.md "Memory retrieval"): the request
(``SearchRequest``, the one value a search travels as from the CLI, HTTP and MCP through the
service and ``Memory`` to ``tidegraph.recall.search.Searcher``), the question the stores answer
(``SearchScope``), one scored candidate (``Hit``) and the JSON line a result prints as.

Search methods (the stores) return hits; rerankers reorder them; the context builder turns
them into text. A hit keeps the record it was found as, so every result traces back to the
episodes (their producer ids) it came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tidegraph.records.asof import AsOf
from tidegraph.records.episode import GroupId
from tidegraph.records.graph import CommunityRecord, EntityRecord, EpisodeRecord, FactRecord

Kind = Literal["fact", "entity", "episode", "community"]
KINDS: tuple[Kind, ...] = ("fact", "entity", "episode", "community")

Record = FactRecord | EntityRecord | EpisodeRecord | CommunityRecord

DEFAULT_RECIPE = "combined"  # the recipes are tidegraph/recall/recipes.py
MAX_QUERY_CHARS = 2000
MAX_LIMIT = 100
MAX_GROUPS = 64


class SearchQuery(BaseModel):
    """What to recall and how to rank it: the part of a search every caller spells the same
    way (the HTTP and MCP bodies extend it with their own scope and times)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="What to recall.")
    recipe: str = Field(DEFAULT_RECIPE, description="Search recipe (docs/retrieval.md: Recipes).")
    limit: int | None = Field(
        None, ge=1, le=MAX_LIMIT, description="Results per kind (default: the recipe's)."
    )
    include_invalid: bool = Field(False, description="Also facts that have ended.")
    centre: str | None = Field(
        None, max_length=256, description="Entity uuid the distance recipes rank from."
    )


class SearchRequest(SearchQuery):
    """One memory search: ``query`` in the memory of ``group_ids``, valid at ``valid_at`` as
    believed at ``known_at`` (both default to now; with no ``valid_at`` a time phrase in the
    query sets it)."""

    group_ids: tuple[GroupId, ...] = Field(
        min_length=1, max_length=MAX_GROUPS, description="Whose memory (tenants) to search."
    )
    valid_at: datetime | None = Field(None, description="Valid at this time (default: now).")
    known_at: datetime | None = Field(None, description="As known at this time (default: now).")


@dataclass(frozen=True)
class SearchScope:
    """Whose memory and which moment: every read is limited to ``group_ids`` (the caller's
    tenants); facts are those of ``asof`` (valid at T, believed at K, exactly as ``facts``);
    entities, episodes and communities those stored by ``asof.known_at``, episodes also those
    that happened by ``asof.valid_at``."""

    group_ids: tuple[str, ...]
    asof: AsOf
    # Whether hits carry their records' embeddings (only MMR compares them; reading and
    # decoding a 384-number vector per hit is most of what a hit costs otherwise).
    embeddings: bool = True
    # Whether hits carry their details: a fact's end names and its episodes' producer ids, an
    # entity's mentioning episodes (``Hit.episodes``, ``mentions``, ``subject``, ``object``).
    # A search reads its candidates without and completes only the hits it keeps
    # (``SearchSource.complete_hits``): an entity's mentions are most of what its hit costs.
    # Without details and embeddings, a store may also read a fact's or an entity's record in
    # part (the embedded store: a fact's ends, an entity's uuid), made whole by completion.
    details: bool = True

    def __post_init__(self) -> None:
        if not self.group_ids:
            raise ValueError("a search needs at least one group id")


@dataclass(frozen=True)
class MethodSearch:
    """One search of one kind: BM25 for ``text`` or nearest to ``embedding`` (exactly one of
    them), at most ``limit`` hits (``SearchSource.search_lists``)."""

    kind: Kind
    limit: int
    text: str | None = None
    embedding: list[float] | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.embedding is None):
            raise ValueError("a method search has a text (BM25) or an embedding, not both")


@dataclass
class Hit:
    """One candidate: its kind, uuid, score (higher is better; each method's own scale
    until a reranker replaces it) and the record it was found as.

    ``episodes`` are the producer ids of the source episodes (a fact's or an entity's; an
    episode's own is ``record.producer_id``); ``mentions`` how many episodes mention it (the
    mentions reranker); ``distance`` hops from a centre entity (the distance reranker)."""

    kind: Kind
    uuid: str
    score: float
    record: Record
    group_id: str
    episodes: list[str] = field(default_factory=list)
    mentions: int = 0
    distance: int | None = None
    # Entity names of a fact's ends (subject, object), for the context and the JSON line.
    subject: str = ""
    object: str = ""

    def with_score(self, score: float) -> Hit:
        """A copy with another score (what a reranker answers; the hits it was given stay as
        they were). Built field by field: ``dataclasses.replace`` cost a fusion a tenth of a
        search's CPU."""
        return Hit(
            kind=self.kind,
            uuid=self.uuid,
            score=score,
            record=self.record,
            group_id=self.group_id,
            episodes=list(self.episodes),
            mentions=self.mentions,
            distance=self.distance,
            subject=self.subject,
            object=self.object,
        )

    @property
    def text(self) -> str:
        """The text a person reads for this hit (and a cross-encoder scores)."""
        record = self.record
        if isinstance(record, FactRecord):
            return record.fact
        if isinstance(record, EntityRecord):
            return f"{record.name}: {record.summary}" if record.summary else record.name
        if isinstance(record, EpisodeRecord):
            return record.content
        return f"{record.name}: {record.summary}" if record.summary else record.name

    @property
    def embedding(self) -> list[float] | None:
        record = self.record
        if isinstance(record, FactRecord):
            return record.fact_embedding
        if isinstance(record, EpisodeRecord):
            return record.content_embedding
        return record.name_embedding

    def as_json(self, rank: int, query_id: str | None = None) -> dict[str, Any]:
        """The JSON line of ``tidegraph search --json`` (docs/retrieval.md "Memory retrieval")."""
        line: dict[str, Any] = {}
        if query_id is not None:
            line["query_id"] = query_id
        line.update(
            rank=rank, kind=self.kind, uuid=self.uuid, score=round(self.score, 6), text=self.text
        )
        line["group_id"] = self.group_id
        record = self.record
        if isinstance(record, FactRecord):
            line.update(
                subject=self.subject,
                relation=record.name,
                object=self.object,
                valid_at=_iso(record.valid_at),
                invalid_at=_iso(record.invalid_at),
                created_at=_iso(record.created_at),
                expired_at=_iso(record.expired_at),
                episodes=self.episodes,
            )
        elif isinstance(record, EntityRecord):
            line.update(name=record.name, labels=record.labels, episodes=self.episodes)
        elif isinstance(record, EpisodeRecord):
            line.update(
                episode_id=record.producer_id,
                name=record.name,
                valid_at=_iso(record.valid_at),
            )
        else:
            line.update(name=record.name)
        return line


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
