"""Forgetting: taking episodes out of a group's memory so that the graph is exactly the one its
remaining episodes give (docs/architecture.md "Forgetting").

A forget replays the group's remaining episodes, in the order their effects were first
written and each at its original ingestion time (so both timelines of everything else stay
as they were), from their stored extractions (no extraction call) into an empty in-memory
store, through the group runner's own write path: the same units, steps and write rules as
ingestion. The difference between that graph and the stored one is written in one
transaction (``Forgetting.apply_rebuild``): the forgotten episodes become tombstones (kept
so that a replay of the input topic, ``extract --pending`` or a dead letter replayed never
brings them back: their writes are skipped as a processed episode's are), facts only they
supported are gone, facts they closed are open again (or closed by whatever else closes
them), entities no remaining episode mentions are gone, and the changes go to the change
stream. When a write of the group came in while the replay ran, the store refuses the
difference and the forget starts again from the group as it now is.

A text episode's entity and fact judgements are made again over the remaining episodes (the
LLM client's response cache answers a prompt it has seen); so a group with LLM-extracted
episodes needs the LLM configured to be forgotten from.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from tidegraph.metrics import FORGET_SECONDS, FORGOTTEN
from tidegraph.pipelines.pending import rebuild_episode
from tidegraph.pipelines.runner import GroupRunner
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
    runner: GroupRunner, group_id: str, episode_ids: Iterable[str], *, dry_run: bool = False
) -> ForgetReport:
    """Forget the episodes of ``group_id`` with these producer ids (see the module
    docstring). Ids the group does not hold are left out of the report; a dry run computes
    everything and writes nothing."""
    store = runner.components.store
    wanted = set(episode_ids)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        history = await store.forget.group_history(group_id)
        targets = [e for e in history.episodes if e.producer_id in wanted]
        report = ForgetReport(
            group_id, [e.producer_id for e in targets], len(targets), dry_run=dry_run
        )
        if not targets:
            return report
        with FORGET_SECONDS.time():
            rebuild = await _rebuild(runner, group_id, history, {e.uuid for e in targets})
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
    runner: GroupRunner, group_id: str, entity_uuid: str, *, dry_run: bool = False
) -> ForgetReport:
    """Forget every episode of ``group_id`` that mentions the entity (a person asking to be
    erased); a dry run lists them and what would go."""
    history = await runner.components.store.forget.group_history(group_id)
    if entity_uuid not in history.entities:
        raise ForgetError(f"group {group_id!r} has no entity {entity_uuid}")
    ids = [
        e.producer_id for e in history.episodes if entity_uuid in history.mentions.get(e.uuid, [])
    ]
    return await forget_episodes(runner, group_id, ids, dry_run=dry_run)


async def _rebuild(
    runner: GroupRunner, group_id: str, history: GroupHistory, forgotten: set[str]
) -> Rebuild:
    """The group's graph without ``forgotten`` (episode uuids), as the difference to
    write."""
    remaining = [e for e in history.episodes if e.uuid not in forgotten]
    replay = [e for e in remaining if e.not_extracted is None]
    components = runner.components
    if components.llm is None and any(not _mapped(e) for e in replay):
        raise ForgetError(
            f"group {group_id!r} holds episodes the LLM extracted: forgetting replays their "
            "judgements, which needs the LLM configured (TIDEGRAPH_LLM_BASE_URL, ...)"
        )
    scratch = MemoryStore()
    await scratch.setup(components.embedder.dim)
    await _prime(components.embedder, history)
    times = {e.uuid: utc(e.extracted_at or e.created_at or e.valid_at) for e in replay}
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
    after = await scratch.forget.group_history(group_id)
    rebuild = _difference(group_id, history, after, forgotten, remaining)
    if not components.record_changes:
        rebuild.changes = []
    return rebuild


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
) -> Rebuild:
    now = utcnow()
    cause = stable_uuid("forget", group_id, *sorted(forgotten))
    rebuild = Rebuild(version=before.version, forgotten=sorted(forgotten), forgotten_at=now)
    changes: list[Change] = []
    for uuid in sorted(set(before.entities) | set(after.entities)):
        old, new = before.entities.get(uuid), after.entities.get(uuid)
        if new is None:
            rebuild.delete_entities.append(uuid)
        elif old is None or _entity_differs(old, new):
            rebuild.entities.append(new)
        changes += entity_changes(group_id, cause, None, old, new, now)
    for uuid in sorted(set(before.facts) | set(after.facts)):
        old_fact, new_fact = before.facts.get(uuid), after.facts.get(uuid)
        if new_fact is None:
            rebuild.delete_facts.append(uuid)
        elif old_fact is None or _fact_differs(old_fact, new_fact):
            rebuild.facts.append(new_fact)
        changes += fact_changes(group_id, cause, None, old_fact, new_fact, now)
    for record in remaining:
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
