"""Forgetting: taking episodes out of a group's memory so that the graph is exactly the one its
remaining episodes give (docs/architecture.md "Forgetting").

A forget recomputes the part of the group the forgotten episodes reach (``forget_reach``: the
fact slots they wrote, rebuilt by replaying the remaining episodes that write to them, and the
entities whose records change, folded again from their remaining drafts), or, when that cannot
be told or is most of the group, replays the group's remaining episodes whole. Either way
episodes are replayed in the order their effects were first written and each at its original
ingestion time (so both timelines of everything else stay as they were), from their stored
extractions (no extraction call), into an empty in-memory store, through the group runner's
own write path: the same units, steps and write rules as ingestion. The difference between
that and the stored graph is written in one transaction (``Forgetting.apply_rebuild``): the
forgotten episodes become tombstones (kept so that a replay of the input topic, ``extract
--pending`` or a dead letter replayed never brings them back: their writes are skipped as a
processed episode's are), facts only they supported are gone, facts they closed are open again
(or closed by whatever else closes them), entities no remaining episode mentions are gone, and
the changes go to the change stream. When a write of the group came in while it was computed,
the store refuses the difference and the forget starts again from the group as it now is.

A text episode's entity and fact judgements are made again over the remaining episodes (the
LLM client's response cache answers a prompt it has seen); so a group with LLM-extracted
episodes needs the LLM configured to be forgotten from, and is replayed whole.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

import orjson

from tidegraph.embed.base import Embedder
from tidegraph.metrics import FORGET_PATHS, FORGET_SECONDS, FORGOTTEN
from tidegraph.pipelines.forget_reach import MOST, Reach, Whole, read_reach
from tidegraph.pipelines.pending import rebuild_episode
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.processors.resolution import merged_write, update_for
from tidegraph.processors.steps import Components
from tidegraph.records.changes import (
    Change,
    entity_changes,
    episode_forgotten,
    fact_changes,
)
from tidegraph.records.episode import Episode
from tidegraph.records.forget import ForgetRequest
from tidegraph.records.graph import (
    EntityRecord,
    EpisodeRecord,
    FactRecord,
    GroupHistory,
    Rebuild,
)
from tidegraph.records.ids import stable_uuid
from tidegraph.records.stages import Extraction, extraction_of
from tidegraph.records.times import utc, utcnow
from tidegraph.stores import write_rules
from tidegraph.stores.errors import RebuildConflict
from tidegraph.stores.memory.store import MemoryStore

log = logging.getLogger(__name__)

# A forget computed again when writes keep coming in meanwhile, at most this many times.
MAX_ATTEMPTS = 5


class ForgetError(RuntimeError):
    """A forget that cannot be done as asked; the message says why and what to do."""


@dataclass
class ForgetReport:
    """What a forget did (or, as a dry run, would do)."""

    group_id: str
    episodes: list[str] = field(default_factory=list)  # producer ids forgotten (when named)
    forgotten: int = 0  # episodes forgotten
    facts_removed: int = 0
    facts_changed: int = 0
    entities_removed: int = 0
    entities_changed: int = 0
    changes: int = 0
    keys_erased: int = 0  # the group's data keys (a purge: tidegraph/stores/keys.py)
    dry_run: bool = False

    def line(self) -> str:
        verb = "would forget" if self.dry_run else "forgot"
        return (
            f"{verb} {self.forgotten} episode(s) of group {self.group_id}: "
            f"{self.facts_removed} facts and {self.entities_removed} entities removed, "
            f"{self.facts_changed} facts and {self.entities_changed} entities changed"
        )


async def forget(
    runner: GroupRunner, request: ForgetRequest, *, dry_run: bool = False
) -> ForgetReport:
    """What ``request`` asks: episodes, a subject's episodes, or the whole group (a dry run
    of a whole group only counts its episodes)."""
    group = request.group_id
    if request.episode_ids:
        return await forget_episodes(runner, group, request.episode_ids, dry_run=dry_run)
    if request.subject is not None:
        return await forget_subject(runner, group, request.subject, dry_run=dry_run)
    store = runner.components.store
    report = ForgetReport(group, dry_run=dry_run)
    if dry_run:
        history = await store.forget.group_history(group)
        report.episodes = [e.producer_id for e in history.episodes]
        report.forgotten = len(report.episodes)
        return report
    forgotten = await store.forget.forget_group(group, utcnow(), purge=request.purge)
    if request.purge:
        # The group's sealed records on the input topic can no longer be read
        # (docs/streaming.md "Sealed episodes").
        report.keys_erased = await store.keys.erase_group_keys(group)
    FORGOTTEN.labels("group").inc(forgotten)
    report.forgotten = forgotten
    purged = f" (purged, {report.keys_erased} data keys erased)" if request.purge else ""
    log.info("forget group=%s whole group: %d episodes%s", group, forgotten, purged)
    return report


async def forget_episodes(
    runner: GroupRunner,
    group_id: str,
    episode_ids: Iterable[str],
    *,
    dry_run: bool = False,
    most: float = MOST,
    read: GroupHistory | None = None,
) -> ForgetReport:
    """Forget the episodes of ``group_id`` with these producer ids (see the module
    docstring). Ids the group does not hold are left out of the report; a dry run computes
    everything and writes nothing. ``most``: the share of the group above which the whole
    group is replayed (``forget_reach``; 0 always replays it whole). ``read``: these
    episodes and the group's version as just read (``Forgetting.history_part``), used by the
    first attempt instead of reading them again."""
    store = runner.components.store
    wanted = set(episode_ids)
    uuids = sorted({stable_uuid("episode", group_id, producer) for producer in wanted})
    for attempt in range(1, MAX_ATTEMPTS + 1):
        # The forgotten episodes and the group's version, before anything else is read.
        first = read if read is not None and attempt == 1 else None
        if first is None:
            first = await store.forget.history_part(group_id, uuids, [])
        targets = [e for e in first.episodes if e.producer_id in wanted]
        report = ForgetReport(
            group_id, [e.producer_id for e in targets], len(targets), dry_run=dry_run
        )
        if not targets:
            return report
        with FORGET_SECONDS.time():
            rebuild, history = await _rebuild(
                runner, group_id, first, {e.uuid for e in targets}, most
            )
        _tally(report, rebuild, history)
        if dry_run:
            return report
        try:
            await store.forget.apply_rebuild(group_id, rebuild)
        except RebuildConflict:
            log.info(
                "group %s was written during its forget (attempt %d); again", group_id, attempt
            )
            continue
        FORGOTTEN.labels("episode").inc(len(targets))
        log.info("forget group=%s %s", group_id, report.line())
        return report
    raise ForgetError(
        f"group {group_id!r} kept being written while the forget was computed "
        f"({MAX_ATTEMPTS} attempts): forget through the worker that owns the group (a forget "
        "record on the input topic), or pause its producers"
    )


async def forget_subject(
    runner: GroupRunner,
    group_id: str,
    entity_uuid: str,
    *,
    dry_run: bool = False,
    most: float = MOST,
) -> ForgetReport:
    """Forget every episode of ``group_id`` that mentions the entity (a person asking to be
    erased); a dry run lists them and what would go."""
    store = runner.components.store
    if not await store.entities_by_uuids(group_id, [entity_uuid]):
        raise ForgetError(f"group {group_id!r} has no entity {entity_uuid}")
    # The subject's episodes and the group's version: the forget's first read.
    mentioning = await store.forget.history_part(group_id, [], [entity_uuid])
    ids = [e.producer_id for e in mentioning.episodes]
    return await forget_episodes(runner, group_id, ids, dry_run=dry_run, most=most, read=mentioning)


async def _rebuild(
    runner: GroupRunner,
    group_id: str,
    first: GroupHistory,
    forgotten: set[str],
    most: float = MOST,
) -> tuple[Rebuild, GroupHistory]:
    """The group's graph without ``forgotten`` (episode uuids; ``first``: their part of the
    history, read first), as the difference to write, and the history it was computed from:
    the part of the group the forget reaches (``forget_reach``), or, when that cannot be told
    or is most of the group, the whole group replayed."""
    components = runner.components
    store = components.store
    found, history = await read_reach(store, group_id, first, forgotten, most)
    if isinstance(found, Whole):
        FORGET_PATHS.labels("whole").inc()
        log.info("forget group=%s replays the whole group: %s", group_id, found.reason)
        history = await store.forget.group_history(group_id)
    remaining = [e for e in history.episodes if e.uuid not in forgotten]
    # An incremental forget reaches mapped episodes only (``forget_reach``).
    whole = isinstance(found, Whole)
    if (
        whole
        and components.llm is None
        and any(not _mapped(e) for e in remaining if e.not_extracted is None)
    ):
        raise ForgetError(
            f"group {group_id!r} holds episodes the LLM extracted: forgetting replays their "
            "judgements, which needs the LLM configured (TIDEGRAPH_LLM_BASE_URL, ...)"
        )
    await _prime(components.embedder, history)
    times = {
        e.uuid: utc(e.extracted_at or e.created_at or e.valid_at)
        for e in history.episodes
        if e.not_extracted is None
    }
    if isinstance(found, Whole):
        replay = [e for e in remaining if e.not_extracted is None]
        after = await _replayed(runner, group_id, replay, times)
        rebuild = _difference(group_id, history, after, forgotten, remaining)
    else:
        FORGET_PATHS.labels("incremental").inc()
        log.info(
            "forget group=%s replays %d episodes (%d fact slots), folds %d entities",
            group_id, len(found.replay), len(found.slots), len(found.entities),
        )  # fmt: skip
        scratch = await _replayed(runner, group_id, found.replay, times)
        after, scope = await _reached_after(group_id, history, scratch, found, components, times)
        rebuild = _difference(group_id, history, after, forgotten, remaining, scope)
    if not components.record_changes:
        rebuild.changes = []
    return rebuild, history


async def _replayed(
    runner: GroupRunner, group_id: str, replay: list[EpisodeRecord], times: dict[str, datetime]
) -> GroupHistory:
    """``replay`` (in order, each at its original ingestion time) written from their stored
    extractions through the group runner's own write path into an empty in-memory store: its
    graph."""
    components = runner.components
    scratch = MemoryStore()
    await scratch.setup(components.embedder.dim)
    replayer = GroupRunner(
        dataclasses.replace(
            components,
            store=scratch,
            clock=lambda episode: times.get(episode.uuid, utcnow()),
            record_changes=False,  # the difference's changes are the ones that count
        ),
        policy=runner.policy,
        record_timeout=runner.record_timeout,
        unit_episodes=runner.unit_episodes,
    )
    outcomes = await replayer.write([_extraction(record) for record in replay])
    failed = [o for o in outcomes if o.failure is not None]
    if failed:
        first = failed[0]
        raise ForgetError(
            f"replaying episode {first.episode.id} of group {group_id!r} failed "
            f"({first.failure.line() if first.failure else ''}); nothing was forgotten: "
            "try again once that is fixed"
        )
    return await scratch.forget.group_history(group_id)


@dataclass
class _Scope:
    """What an incremental forget recomputed: only these can differ from the stored graph."""

    entities: set[str]
    facts: set[str]
    episodes: set[str]  # remaining episodes whose created entities changed


async def _reached_after(
    group_id: str,
    before: GroupHistory,
    scratch: GroupHistory,
    found: Reach,
    components: Components,
    times: dict[str, datetime],
) -> tuple[GroupHistory, _Scope]:
    """The group's graph after the forget, from the stored one and what the reach
    recomputed: the reached slots' facts from the scratch replay, the touched entities
    folded again (gone when no remaining episode mentions them)."""
    folded, creators = await _fold(group_id, before, found, components.embedder, times)
    entities = dict(before.entities)
    for uuid in found.entities:
        if uuid in folded:
            entities[uuid] = folded[uuid]
        else:
            entities.pop(uuid, None)
    old = {u for u, f in before.facts.items() if (f.source_uuid, f.name) in found.slots}
    new = {u: f for u, f in scratch.facts.items() if (f.source_uuid, f.name) in found.slots}
    facts = {u: f for u, f in before.facts.items() if u not in old}
    facts.update(new)
    created = dict(before.created)
    changed: set[str] = set()
    for episode, uuids in creators.items():
        had = set(before.created.get(episode, []))
        if not uuids <= had:
            order = dict.fromkeys(d.uuid for d in found.drafts[episode])
            created[episode] = [u for u in order if u in had or u in uuids]
            changed.add(episode)
    after = GroupHistory(
        episodes=before.episodes,
        entities=entities,
        facts=facts,
        mentions=before.mentions,
        created=created,
        version=before.version,
    )
    return after, _Scope(set(found.entities), old | set(new), changed)


async def _fold(
    group_id: str,
    before: GroupHistory,
    found: Reach,
    embedder: Embedder,
    times: dict[str, datetime],
) -> tuple[dict[str, EntityRecord], dict[str, set[str]]]:
    """The touched entities' records from the drafts of their remaining episodes, in the
    group's order, as resolution writes them (a draft's first episode creates the entity,
    each later one adds what it brings: ``resolution.update_for``, ``write_rules``); and the
    entities each episode now creates."""
    current: dict[str, EntityRecord] = {}
    creators: dict[str, set[str]] = {}
    for record in before.episodes:
        drafts = found.drafts.get(record.uuid)
        if drafts is None:
            continue
        now = times[record.uuid]
        writes: dict[str, EntityRecord] = {}
        for draft in drafts:
            if draft.uuid not in found.entities:
                continue
            stored = current.get(draft.uuid)
            if stored is None:
                if draft.uuid in writes:
                    continue  # the episode named it before: one entity
                [vector] = await embedder.embed([draft.name])
                writes[draft.uuid] = EntityRecord(
                    uuid=draft.uuid,
                    group_id=group_id,
                    name=draft.name,
                    labels=list(draft.labels),
                    summary=draft.summary,
                    key=draft.key,
                    aliases=[draft.norm],
                    name_embedding=vector,
                    created_at=now,
                )
                creators.setdefault(record.uuid, set()).add(draft.uuid)
                continue
            update = update_for(stored, draft.labels, draft.summary, draft.key, draft.norm)
            if update is not None:
                writes[draft.uuid] = merged_write(writes.get(draft.uuid), update)
        for uuid, write in writes.items():
            current[uuid] = write_rules.merged_entity(current.get(uuid), write, now)
    return current, creators


def _mapped(record: EpisodeRecord) -> bool:
    return record.extraction is not None and bool(orjson.loads(record.extraction).get("mapped"))


def _extraction(record: EpisodeRecord) -> Extraction:
    episode: Episode = rebuild_episode(record)
    if record.extraction is None:
        raise ForgetError(
            f"episode {record.producer_id!r} was stored before extractions were kept with "
            "episodes: forgetting in its group needs the group ingested again"
        )
    return extraction_of(episode, record.extraction)


async def _prime(embedder: object, history: GroupHistory) -> None:
    """The stored embeddings in the embedder's cache, so that the replay embeds nothing the
    group already has (a text's embedding does not depend on anything else)."""
    prime = getattr(embedder, "prime", None)
    if prime is None:
        return
    pairs: dict[str, list[float]] = {}
    for fact in history.facts.values():
        if fact.fact_embedding is not None:
            pairs[fact.fact] = fact.fact_embedding
    for entity in history.entities.values():
        if entity.name_embedding is not None:
            pairs[entity.name] = entity.name_embedding
    prime(pairs)


def _difference(
    group_id: str,
    before: GroupHistory,
    after: GroupHistory,
    forgotten: set[str],
    remaining: list[EpisodeRecord],
    scope: _Scope | None = None,
) -> Rebuild:
    """What changes from ``before`` to ``after`` (within ``scope`` when the forget
    recomputed only part of the group), with its changes for the change stream."""
    now = utcnow()
    cause = stable_uuid("forget", group_id, *sorted(forgotten))
    rebuild = Rebuild(version=before.version, forgotten=sorted(forgotten), forgotten_at=now)
    changes: list[Change] = []
    entity_uuids = set(before.entities) | set(after.entities) if scope is None else scope.entities
    for uuid in sorted(entity_uuids):
        old, new = before.entities.get(uuid), after.entities.get(uuid)
        if new is None:
            rebuild.delete_entities.append(uuid)
        elif old is None or _entity_differs(old, new):
            rebuild.entities.append(new)
        changes += entity_changes(group_id, cause, None, old, new, now)
    fact_uuids = set(before.facts) | set(after.facts) if scope is None else scope.facts
    for uuid in sorted(fact_uuids):
        old_fact, new_fact = before.facts.get(uuid), after.facts.get(uuid)
        if new_fact is None:
            rebuild.delete_facts.append(uuid)
        elif old_fact is None or _fact_differs(old_fact, new_fact):
            rebuild.facts.append(new_fact)
        changes += fact_changes(group_id, cause, None, old_fact, new_fact, now)
    for record in remaining:
        if scope is not None and record.uuid not in scope.episodes:
            continue
        mentions = after.mentions.get(record.uuid, []) if record.not_extracted is None else None
        if mentions is not None and sorted(mentions) != sorted(
            before.mentions.get(record.uuid, [])
        ):
            rebuild.mentions[record.uuid] = sorted(mentions)
        created = after.created.get(record.uuid, []) if record.not_extracted is None else None
        if created is not None and sorted(created) != sorted(before.created.get(record.uuid, [])):
            rebuild.created[record.uuid] = list(created)
    producers = {e.uuid: e.producer_id for e in before.episodes}
    for uuid in sorted(forgotten):
        changes.append(episode_forgotten(group_id, cause, uuid, producers.get(uuid, ""), now))
    rebuild.changes = changes
    rebuild.purged = sorted({*forgotten, *rebuild.delete_facts, *rebuild.delete_entities})
    return rebuild


def _tally(report: ForgetReport, rebuild: Rebuild, before: GroupHistory) -> None:
    report.facts_removed = len(rebuild.delete_facts)
    report.facts_changed = sum(1 for f in rebuild.facts if f.uuid in before.facts)
    report.entities_removed = len(rebuild.delete_entities)
    report.entities_changed = sum(1 for e in rebuild.entities if e.uuid in before.entities)
    report.changes = len(rebuild.changes)


def _entity_differs(old: EntityRecord, new: EntityRecord) -> bool:
    fields = ("name", "labels", "summary", "key", "aliases", "created_at")
    return any(getattr(old, f) != getattr(new, f) for f in fields)


def _fact_differs(old: FactRecord, new: FactRecord) -> bool:
    fields = (
        "source_uuid", "target_uuid", "name", "fact", "episodes", "valid_at", "invalid_at",
        "created_at", "expired_at", "cardinality", "prior_ends", "prior_ends_learned_at",
        "end_learned_at", "prior_starts", "prior_starts_learned_at", "start_learned_at",
    )  # fmt: skip
    return any(getattr(old, f) != getattr(new, f) for f in fields)
