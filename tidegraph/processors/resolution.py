"""Resolution stage: each extracted entity -> one entity of the group's graph.

Order of evidence: stable key, then exact normalised name or alias, then (for LLM-extracted episodes
only) fulltext + vector candidates judged by ONE batched LLM call for all the episode's undecided
entities. The upserts are not written here: they travel with the episode to its write
(``PendingWrite``), one transaction with everything else the episode changes. Resolution runs in the
same ordered hop as that write (``tidegraph.pipelines.runner``), so the next episode of the group is
resolved only once this one is committed and sees its entities.

The lookup is one store round trip: the episode's processed marker, the stored entities the
drafts' keys and names match, and for a mapped episode the facts its relations can merge with
or close (read here so that the write need not read them again). A truncate's episode first
reads the table's entities (by their keys' fixed beginning: ``with_table_closes``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from tidegraph.embed.base import Embedder
from tidegraph.metrics import ENTITIES_RESOLVED, labelled
from tidegraph.processors.prompts import (
    ENTITY_RESOLUTION_SYSTEM,
    EntityResolutionOutput,
    LLMRequest,
    StructuredLLM,
    entity_resolution_user,
)
from tidegraph.processors.steps import EntitySearch, UnitStore
from tidegraph.records.episode import Episode
from tidegraph.records.graph import EntityLookup, EntityRecord
from tidegraph.records.ids import normalize_name, stable_uuid
from tidegraph.records.stages import (
    EntityDraft,
    Extraction,
    FactDraft,
    PendingWrite,
    Processed,
    ResolvedEpisode,
)
from tidegraph.records.times import now_for

log = logging.getLogger(__name__)

CANDIDATES_PER_ENTITY = 5


def lookup_terms(extraction: Extraction) -> tuple[list[str], list[str], list[str] | None]:
    """What resolution looks up for ``extraction``: its drafts' keys, their normalised
    names, and (mapped episodes) its relations."""
    drafts = extraction.entities
    keys = sorted({d.key for d in drafts if d.key})
    names = sorted({normalize_name(d.name) or d.name for d in drafts})
    relations = None
    if extraction.mapped:
        closes = extraction.table_closes
        relations = sorted({*(f.relation for f in extraction.facts), *(c.relation for c in closes)})
    return keys, names, relations


def with_table_closes(extraction: Extraction, lookup: EntityLookup) -> Extraction:
    """A truncate's extraction (``Extraction.table_closes``) as the closing facts it makes:
    one per found entity of the table (its key starts with the close's prefix) with an open
    fact of the close's relation, its subject that entity, of no object (every object), as a
    delete of its row would close it. Pure; ``lookup`` read those entities and their facts."""
    if not extraction.table_closes:
        return extraction
    open_pairs = {(f.source_uuid, f.name) for f in lookup.facts or [] if f.invalid_at is None}
    entities = list(extraction.entities)
    facts = list(extraction.facts)
    index: dict[str, int] = {}
    for record in sorted(lookup.by_key, key=lambda e: (e.key or "", e.uuid)):
        for close in extraction.table_closes:
            if not (record.key or "").startswith(close.key_prefix):
                continue
            if (record.uuid, close.relation) not in open_pairs:
                continue
            if record.uuid not in index:
                index[record.uuid] = len(entities)
                entities.append(EntityDraft(name=record.name, key=record.key))
            facts.append(
                FactDraft(
                    subject=index[record.uuid],
                    object=-1,
                    relation=close.relation,
                    fact=f"{record.name} {close.fact}",
                    cardinality=close.cardinality,
                    closes=True,
                )
            )
    return extraction.model_copy(update={"entities": entities, "facts": facts, "table_closes": []})


def new_entity_uuid(group_id: str, name: str, key: str | None) -> str:
    if key:
        return stable_uuid("entity", group_id, "key", key)
    return stable_uuid("entity", group_id, "name", normalize_name(name))


@dataclass
class Resolution:
    """A resolved episode and the entity upserts it needs, not yet written."""

    resolved: ResolvedEpisode
    writes: list[EntityRecord] = field(default_factory=list)
    at: datetime | None = None  # the ingestion time the new entities carry


@dataclass
class Matches:
    """What a lookup decides about an extraction's drafts, before any search or LLM call
    (``match``): the stored entity of each matched draft and how it was found, the drafts that
    repeat an earlier one of the episode, and the undecided ones."""

    norms: list[str]
    matched: dict[int, EntityRecord] = field(default_factory=dict)
    methods: dict[int, str] = field(default_factory=dict)
    alias_of: dict[int, int] = field(default_factory=dict)
    undecided: list[int] = field(default_factory=list)


def match(extraction: Extraction, lookup: EntityLookup) -> Matches:
    """Each draft against the lookup: stable key first, then exact normalised name or alias;
    within the episode, one entity per key or normalised name. Pure."""
    drafts = extraction.entities
    found = Matches(norms=[normalize_name(d.name) or d.name for d in drafts])
    by_key = {e.key: e for e in lookup.by_key}
    by_norm: dict[str, list[EntityRecord]] = {}
    for record in lookup.by_name:
        for n in {normalize_name(record.name), *record.aliases}:
            by_norm.setdefault(n, []).append(record)
    for i, draft in enumerate(drafts):
        if draft.key and draft.key in by_key:
            found.matched[i], found.methods[i] = by_key[draft.key], "key"
            continue
        # A name match never merges two different stable keys (two "John Smith" contacts).
        named = by_norm.get(found.norms[i], [])
        same_name = [r for r in named if r.key in (None, draft.key)]
        if not same_name and draft.key is None and len({r.uuid for r in named}) == 1:
            # A mention without a key ("Acme Corp" in a ticket) is the one keyed entity
            # of that name (the CRM account); with two or more, the LLM decides.
            same_name = named[:1]
        if same_name:
            same_name.sort(key=lambda r: (r.key is not None, r.uuid))
            found.matched[i], found.methods[i] = same_name[0], "exact"
    first_of: dict[str, int] = {}
    for i, draft in enumerate(drafts):
        ident = f"key:{draft.key}" if draft.key else f"name:{found.norms[i]}"
        if ident in first_of and i not in found.matched:
            found.alias_of[i] = first_of[ident]
        first_of.setdefault(ident, i)
    found.undecided = [
        i for i in range(len(drafts)) if i not in found.matched and i not in found.alias_of
    ]
    return found


class ResolutionStep:
    """``run(extraction) -> ResolvedEpisode``, or ``Processed`` for an episode already
    processed (nothing resolved, nothing written)."""

    stage = "resolution"

    def __init__(
        self,
        *,
        store: UnitStore,
        embedder: Embedder,
        llm: StructuredLLM | None,
        clock: Callable[[Episode], datetime] = now_for,
    ) -> None:
        """``clock``: the ingestion time of an episode's new entities (now)."""
        self.store = store
        self.embedder = embedder
        self.llm = llm
        self.clock = clock

    async def run(self, extraction: Extraction) -> ResolvedEpisode | Processed:
        return await self.resolved_from(extraction, await self.lookup(extraction))

    async def lookup(self, extraction: Extraction) -> EntityLookup:
        """One round trip (``GraphStore.lookup_entities``): the processed marker
        (EpisodeConflictError when stored with other content), the stored entities the
        drafts' keys and names match, and for a mapped episode the found entities' facts of
        its relations."""
        keys, names, relations = lookup_terms(extraction)
        episode = extraction.episode
        prefixes = sorted({c.key_prefix for c in extraction.table_closes})
        for prefix in prefixes:  # a truncate: the table's entities, by their keys
            found = await self.store.entities_by_key_prefix(episode.group_id, prefix)
            keys = sorted({*keys, *(e.key for e in found if e.key is not None)})
        return await self.store.lookup_entities(
            episode.group_id, keys, names, episode.uuid, relations, episode.content_hash
        )

    def searches(self, extraction: Extraction, lookup: EntityLookup) -> bool:
        """Whether resolving ``extraction`` from ``lookup`` searches the store (fulltext and
        vector candidates for the LLM to judge): an LLM-extracted episode with a draft that no
        key or name finds."""
        return (
            self.llm is not None
            and not extraction.mapped
            and not lookup.processed
            and bool(match(extraction, lookup).undecided)
        )

    async def resolved_from(
        self, extraction: Extraction, lookup: EntityLookup
    ) -> ResolvedEpisode | Processed:
        """``run`` from a lookup already made."""
        if lookup.processed:
            # Its new-entity events go out again (a crash may have come between the write and
            # the send; docs/streaming.md "At-least-once with idempotent effects").
            return Processed(episode=extraction.episode, created_entities=lookup.created_entities)
        extraction = with_table_closes(extraction, lookup)
        resolution = await self.resolve(extraction, lookup)
        resolved, writes = resolution.resolved, resolution.writes
        found = {e.uuid for e in [*lookup.by_key, *lookup.by_name]}
        written = {e.uuid for e in writes}
        resolved.pending = PendingWrite(
            entities=writes,
            created=[u for u in dict.fromkeys(resolved.entity_uuids) if u in written - found],
            known_facts=lookup.facts,
            known_sources=sorted(found | written),
            ingested_at=resolution.at,
        )
        return resolved

    async def resolve(self, extraction: Extraction, lookup: EntityLookup) -> Resolution:
        """Each draft -> an entity uuid, from ``lookup`` (and, for LLM-extracted episodes,
        the LLM); the upserts are returned, not written."""
        group = extraction.episode.group_id
        drafts = extraction.entities
        found = match(extraction, lookup)
        embeddings = await self._embed_undecided(extraction, found)
        llm_calls = 0
        if self.llm is not None and not extraction.mapped:
            request = await self.judging_request(extraction, found, embeddings, self.store)
            if request is not None:
                output = await request.ask(self.llm)
                decided = self._decided(request, found, output)
                llm_calls = 1
                for i, record in decided.items():
                    found.matched[i], found.methods[i] = record, "llm"

        now = self.clock(extraction.episode)
        uuids: list[str] = [""] * len(drafts)
        writes: dict[str, EntityRecord] = {}
        for i, draft in enumerate(drafts):
            if i in found.alias_of:
                continue
            if i in found.matched:
                record = found.matched[i]
                uuids[i] = record.uuid
                update = update_for(record, draft.labels, draft.summary, draft.key, found.norms[i])
                if update is not None:
                    writes[record.uuid] = merged_write(writes.get(record.uuid), update)
            else:
                found.methods[i] = "new"
                uuid = new_entity_uuid(group, draft.name, draft.key)
                uuids[i] = uuid
                writes[uuid] = merged_write(
                    writes.get(uuid),
                    EntityRecord(
                        uuid=uuid,
                        group_id=group,
                        name=draft.name,
                        labels=list(draft.labels),
                        summary=draft.summary,
                        key=draft.key,
                        aliases=[found.norms[i]],
                        name_embedding=embeddings.get(i),
                        created_at=now,
                    ),
                )
            labelled(ENTITIES_RESOLVED, found.methods[i]).inc()
        for i, first in found.alias_of.items():
            uuids[i] = uuids[first]
        resolved = ResolvedEpisode(
            extraction=extraction,
            entity_uuids=uuids,
            llm_calls=extraction.llm_calls + llm_calls,
            entities_new=sum(1 for method in found.methods.values() if method == "new"),
        )
        return Resolution(resolved, list(writes.values()), now)

    async def _embed_undecided(
        self, extraction: Extraction, found: Matches
    ) -> dict[int, list[float]]:
        if not found.undecided:
            return {}
        names = [extraction.entities[i].name for i in found.undecided]
        return dict(zip(found.undecided, await self.embedder.embed(names), strict=True))

    async def judging_request(
        self,
        extraction: Extraction,
        found: Matches,
        embeddings: dict[int, list[float]],
        store: EntitySearch,
    ) -> JudgingRequest | None:
        """The one LLM call that judges the undecided drafts against their candidates from
        ``store``'s fulltext + vector search (every draft's searches at once,
        ``entity_candidates``; candidates listed by uuid, so their order does not matter), or
        None when there is nothing to judge."""
        if not found.undecided:
            return None
        drafts = extraction.entities
        threshold = self.embedder.thresholds.entity_candidate
        searches = await store.entity_candidates(
            extraction.episode.group_id,
            [(drafts[i].name, embeddings[i]) for i in found.undecided],
            CANDIDATES_PER_ENTITY,
        )
        candidates: dict[str, EntityRecord] = {}
        for by_vector, _ in searches:
            for record, score in by_vector:
                if 2 * score - 1 >= threshold:  # stores score (1 + cos) / 2
                    candidates.setdefault(record.uuid, record)
        for _, by_text in searches:
            for record, _ in by_text:
                candidates.setdefault(record.uuid, record)
        if not candidates:
            return None
        listed = sorted(candidates.values(), key=lambda r: r.uuid)
        user = entity_resolution_user(
            [(i, drafts[i].name, drafts[i].summary) for i in found.undecided], listed
        )
        request = LLMRequest(self.stage, ENTITY_RESOLUTION_SYSTEM, user, EntityResolutionOutput)
        return JudgingRequest(request, listed)

    async def speculate(
        self, extraction: Extraction, lookup: EntityLookup, store: EntitySearch
    ) -> LLMRequest | None:
        """The judging call resolving ``extraction`` from ``lookup`` would make if ``store``
        answered its search (``None``: it makes none), worked out without asking it."""
        if not self.searches(extraction, lookup):
            return None
        found = match(extraction, lookup)
        embeddings = await self._embed_undecided(extraction, found)
        judging = await self.judging_request(extraction, found, embeddings, store)
        return None if judging is None else judging.request

    @staticmethod
    def _decided(
        judging: JudgingRequest, found: Matches, output: EntityResolutionOutput
    ) -> dict[int, EntityRecord]:
        listed = judging.candidates
        decided: dict[int, EntityRecord] = {}
        for answer in output.matches:
            if answer.entity in found.undecided and answer.duplicate_of is not None:
                if 0 <= answer.duplicate_of < len(listed):
                    decided.setdefault(answer.entity, listed[answer.duplicate_of])
        return decided


@dataclass(frozen=True)
class JudgingRequest:
    """Entity judging as a value: the call, and the candidates its answer's indexes name."""

    request: LLMRequest
    candidates: list[EntityRecord]

    async def ask(self, llm: StructuredLLM) -> EntityResolutionOutput:
        output: EntityResolutionOutput = await self.request.ask(llm)
        return output


def update_for(
    record: EntityRecord, labels: list[str], summary: str, key: str | None, norm: str
) -> EntityRecord | None:
    """The upsert that adds what a matched draft brings, or None when it brings nothing."""
    new_labels = [lab for lab in labels if lab not in record.labels]
    new_alias = norm not in record.aliases and norm != normalize_name(record.name)
    new_summary = bool(summary) and summary != record.summary
    new_key = key is not None and record.key is None
    if not (new_labels or new_alias or new_summary or new_key):
        return None
    return EntityRecord(
        uuid=record.uuid,
        group_id=record.group_id,
        name=record.name,
        labels=new_labels,
        summary=summary if new_summary else "",
        key=key if new_key else None,
        aliases=[norm] if new_alias else [],
        created_at=record.created_at,
    )


def merged_write(previous: EntityRecord | None, update: EntityRecord) -> EntityRecord:
    if previous is None:
        return update
    return previous.model_copy(
        update={
            "labels": sorted(set(previous.labels) | set(update.labels)),
            "aliases": sorted(set(previous.aliases) | set(update.aliases)),
            "summary": update.summary or previous.summary,
            "key": previous.key or update.key,
        }
    )
