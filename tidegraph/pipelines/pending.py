"""Extracting the episodes stored without extraction (docs/architecture.md "Episodes without an
LLM").

An episode nothing could extract when it arrived (no LLM configured, no mapping rule, or the
LLM failed on it after every retry) is stored with its content and ``not_extracted`` set.
``extract_pending`` runs each such episode through the whole chain again, in event order per
group, groups in parallel: with an LLM (or a new mapping rule) now, its entities and facts are
written and the mark is cleared in the same transaction. An episode that still cannot be
extracted stops its group (later ones wait, so the group's order holds) and stays stored, so
a run cut off midway loses nothing: run it again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from tidegraph.pipelines.runner import GroupRunner
from tidegraph.records import jsontext
from tidegraph.records.episode import Episode
from tidegraph.records.graph import EpisodeRecord
from tidegraph.stores.base import GraphStore
from tidegraph.topics.partitioning import key_hash

log = logging.getLogger(__name__)

PAGE = 200


@dataclass
class PendingReport:
    extracted: int = 0
    still_pending: dict[str, str] = field(default_factory=dict)  # group -> why it stopped
    failed: dict[str, str] = field(default_factory=dict)  # group -> the failure that stopped it

    def line(self) -> str:
        return (
            f"{self.extracted} episodes extracted; {len(self.still_pending)} groups stopped "
            f"at an episode still not extractable; {len(self.failed)} groups stopped by a "
            "failure"
        )


def rebuild_episode(record: EpisodeRecord) -> Episode:
    """The envelope a stored episode came from, exactly (its content hash must match, or the
    write would take it for another episode with the same id)."""
    content: str | dict = record.content
    if record.source == "json":
        content = jsontext.loads(record.content)
    names = [record.name] if record.name != record.producer_id else ["", record.name]
    for name in names:
        episode = Episode(
            id=record.producer_id,
            group_id=record.group_id,
            source=record.source,
            name=name,
            source_description=record.source_description,
            content=content,
            reference_time=record.valid_at,
        )
        if not record.content_hash or episode.content_hash == record.content_hash:
            return episode
    raise ValueError(f"stored episode {record.producer_id!r} cannot be rebuilt exactly")


async def extract_pending(
    runner: GroupRunner,
    store: GraphStore,
    group_ids: list[str],
    *,
    concurrency: int = 8,
) -> PendingReport:
    """Extract the not-yet-extracted episodes of ``group_ids`` (see the module docstring)."""
    report = PendingReport()
    gate = asyncio.Semaphore(concurrency)

    async def run_group(group_id: str) -> None:
        async with gate:
            done: set[str] = set()
            while True:
                page = await store.pending_episodes(group_id, PAGE)
                if not page:
                    return
                for record in page:
                    if record.uuid in done:  # extracted, yet still listed: never loop on it
                        raise RuntimeError(f"episode {record.uuid} stays pending once extracted")
                    done.add(record.uuid)
                    [outcome] = await runner.run([rebuild_episode(record)])
                    if outcome.failure is not None:
                        report.failed[group_id] = f"{record.producer_id}: {outcome.failure.line()}"
                        return
                    if outcome.not_extracted is not None:
                        report.still_pending[group_id] = (
                            f"{record.producer_id}: {outcome.not_extracted}"
                        )
                        return
                    report.extracted += 1

    await asyncio.gather(*(run_group(g) for g in group_ids))
    return report


def partition_of(group_id: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives the key ``group_id`` (murmur2, as the
    producers of the input topic use)."""
    return key_hash(group_id.encode()) % partitions


async def pending_envelopes(
    store: GraphStore, owned: set[int], partitions: int, limit: int
) -> list[tuple[str, bytes]]:
    """(key, envelope) of the not-yet-extracted episodes of the groups on ``owned``
    partitions, oldest first per group, at most ``limit`` in all: the worker's sweep sends
    them to the input topic again (docs/architecture.md "Episodes without an LLM")."""
    out: list[tuple[str, bytes]] = []
    for group_id in await store.pending_groups():
        if partition_of(group_id, partitions) not in owned:
            continue
        for record in await store.pending_episodes(group_id, limit - len(out)):
            episode = rebuild_episode(record)
            out.append((group_id, jsontext.dumps(episode.model_dump(mode="json"))))
        if len(out) >= limit:
            break
    return out
