"""What a store refuses, and the checks that refuse it before anything is written.

Every store (Neo4j, the embedded SQLite store, ``tidegraph.stores.memory.store``) reads what
a write touches, then runs these checks, then writes: a refused write changes nothing."""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from neo4j.exceptions import ServiceUnavailable, SessionExpired, TransientError

from tidegraph.records.graph import EpisodeWrite
from tidegraph.stores.rows import unique

# How long a client is told to wait before asking again after a transient store error.
RETRY_AFTER_SECONDS = 2


def transient_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a store's error of the moment (Neo4j out of transaction memory, a
    deadlock, a leader moving, a server that does not answer: its reads are tried twice
    before it reaches a caller), which
    a caller answers as "try again shortly" rather than as a failure of the request."""
    return isinstance(exc, TransientError | SessionExpired | ServiceUnavailable)


class StoreSchemaError(RuntimeError):
    """The store's schema does not fit this configuration (e.g. another embedding dimension)."""


class StoreUnreachable(RuntimeError):
    """The store has not answered for longer than its callers may wait
    (``tidegraph.pipelines.outage``): nothing after the last written record was written; try
    again once it answers (``retry_after``: a hint in seconds)."""

    def __init__(self, message: str, *, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreIntegrityError(ValueError):
    """A write would cross groups or reference something that does not exist; nothing was
    written (the transaction was rolled back)."""


class RebuildConflict(RuntimeError):
    """A rebuild was computed from a state of the group that moved since (a write came in):
    compute it again from the group as it is now."""

    def __init__(self, group_id: str) -> None:
        super().__init__(f"group {group_id!r} was written while its rebuild was computed")
        self.group_id = group_id


class EpisodeConflictError(StoreIntegrityError):
    """The episode's uuid is already stored in its group with other content: its producer
    reused an id for a different record. Nothing was written."""


def check_dimensions(
    declared: dict[str, int],
    wanted: int,
    where: Callable[[str], str],
    remedy: Callable[[str], str],
) -> None:
    """Refuse a store whose embeddings (``declared``: size by index or column name) are not
    of the embedder's size; ``where`` names one for the message, ``remedy`` says how to switch
    models deliberately."""
    for name, size in sorted(declared.items()):
        if size != wanted:
            raise StoreSchemaError(
                f"{where(name)} holds {size}-dimensional embeddings but the embedder produces "
                f"{wanted}. Either configure the embedder that made the stored graph "
                f"(TIDEGRAPH_EMBEDDER / TIDEGRAPH_EMBEDDING_DIM), or {remedy(name)}."
            )


def check_same_episode(uuid: str, stored_hash: str | None, content_hash: str | None) -> None:
    """Raise EpisodeConflictError when a stored episode's content hash differs from the
    record's (episodes stored before hashes existed have none and always pass)."""
    if content_hash and stored_hash and stored_hash != content_hash:
        raise EpisodeConflictError(
            f"episode {uuid} was already processed with other content (stored content hash "
            f"{stored_hash[:12]}, this record's {content_hash[:12]}): a new episode needs a "
            "new id"
        )


def check_entity_owners(group_id: str, owners: dict[str, str]) -> None:
    """``owners`` maps stored entity uuids of an upsert to their group."""
    foreign = sorted(u for u, g in owners.items() if g != group_id)
    if foreign:
        raise StoreIntegrityError(
            f"entity uuids already belong to another group: {', '.join(foreign[:5])}"
        )


def check_community_owners(group_id: str, owners: dict[str, str]) -> None:
    """``owners`` maps stored community uuids a write names to their group."""
    for uuid, owner in sorted(owners.items()):
        if owner != group_id:
            raise StoreIntegrityError(f"community {uuid} belongs to another group")


@dataclass
class StoredFact:
    """What a write needs to know of a stored fact: its group and its two ends."""

    group_id: str
    source_uuid: str
    target_uuid: str


def written_entity_uuids(write: EpisodeWrite) -> tuple[list[str], list[str]]:
    """(the entities the write upserts, every entity it names: upserts, mentions and fact
    ends) — what a store reads before ``check_episode_write``."""
    upserted = unique(e.uuid for e in write.entities)
    ends = (u for f in write.facts for u in (f.source_uuid, f.target_uuid))
    return upserted, unique([*upserted, *write.mentions, *ends])


def written_fact_uuids(write: EpisodeWrite) -> list[str]:
    """The stored facts a write may touch: those it writes and those it closes."""
    return unique([*(f.uuid for f in write.facts), *(c.uuid for c in write.closures)])


def skips_write(
    group_id: str,
    write: EpisodeWrite,
    stored_group: str | None,
    stored_hash: str | None,
    stored_not_extracted: str | None,
) -> bool:
    """Whether an episode write changes nothing because the episode is stored already: a
    processed episode is never written again (EpisodeConflictError when its id comes back
    with other content); one stored without extraction (``not_extracted``) is written again
    only by its extraction (docs/architecture.md "Episodes without an LLM")."""
    if stored_group != group_id:
        return False
    check_same_episode(write.episode.uuid, stored_hash, write.episode.content_hash)
    return stored_not_extracted is None or write.episode.not_extracted is not None


def check_write(
    group_id: str,
    write: EpisodeWrite,
    episode_group: str | None,
    owners: dict[str, str],
    facts: dict[str, StoredFact],
) -> None:
    """Every check of an episode write, from what the store read: ``owners`` (the group of
    each stored entity among ``written_entity_uuids``), ``facts`` (the stored facts among
    ``written_fact_uuids``). The write's own upserts count as the group's entities."""
    upserted, _ = written_entity_uuids(write)
    check_entity_owners(group_id, {u: owners[u] for u in upserted if u in owners})
    # A view, not a merged copy: ``owners`` holds every entity of a whole group commit.
    entity_groups = ChainMap(dict.fromkeys(upserted, group_id), owners)
    check_episode_write(group_id, write, episode_group, entity_groups, facts)


def check_episode_write(
    group_id: str,
    write: EpisodeWrite,
    episode_group: str | None,
    entity_groups: Mapping[str, str],
    facts: dict[str, StoredFact],
) -> None:
    """Refuse a write that would cross groups or point at missing entities or facts.

    ``episode_group``: the group of a stored Episodic with the episode's uuid (None if new);
    ``entity_groups``: stored entities among the mentions and fact endpoints, by uuid;
    ``facts``: stored facts among the written and closed fact uuids, by uuid."""
    if episode_group is not None and episode_group != group_id:
        raise StoreIntegrityError(f"episode {write.episode.uuid} belongs to another group")
    needed = unique(
        [*write.mentions, *(u for f in write.facts for u in (f.source_uuid, f.target_uuid))]
    )
    missing = [u for u in needed if entity_groups.get(u) != group_id]
    if missing:
        raise StoreIntegrityError(
            f"entities not in group {group_id!r} (upsert them first): {', '.join(missing[:5])}"
        )
    for fact in write.facts:
        stored = facts.get(fact.uuid)
        if stored is None:
            continue
        if stored.group_id != group_id:
            raise StoreIntegrityError(f"fact {fact.uuid} belongs to another group")
        if (stored.source_uuid, stored.target_uuid) != (fact.source_uuid, fact.target_uuid):
            raise StoreIntegrityError(f"fact {fact.uuid} is stored between other entities")
    written = {f.uuid for f in write.facts}
    unknown = [
        c.uuid
        for c in write.closures
        if c.uuid not in written and (c.uuid not in facts or facts[c.uuid].group_id != group_id)
    ]
    if unknown:
        raise StoreIntegrityError(f"closures of unknown facts: {', '.join(unknown[:5])}")


@dataclass
class StoredEpisode:
    """What a write needs to know of a stored Episodic node."""

    group_id: str
    content_hash: str | None
    not_extracted: str | None


@dataclass
class WriteChecks:
    """The checks of several episode writes committed together, in order, from one read of
    what they all touch: each write is checked against the stored state and the writes
    before it in the same transaction, exactly as if each were read and written alone."""

    episodes: dict[str, StoredEpisode]
    owners: dict[str, str]  # entity uuid -> group
    facts: dict[str, StoredFact]

    def admit(self, group_id: str, write: EpisodeWrite) -> bool:
        """False when the write is skipped (its episode is processed, maybe by an earlier
        write of the batch); raises like ``check_write``; True when it is to be written, and
        then what it writes counts as stored for the writes after it."""
        stored = self.episodes.get(write.episode.uuid)
        if stored is not None and skips_write(
            group_id, write, stored.group_id, stored.content_hash, stored.not_extracted
        ):
            return False
        check_write(
            group_id, write, None if stored is None else stored.group_id, self.owners, self.facts
        )
        episode = write.episode
        self.episodes[episode.uuid] = StoredEpisode(
            group_id, episode.content_hash, episode.not_extracted
        )
        for entity in write.entities:
            self.owners.setdefault(entity.uuid, group_id)
        for fact in write.facts:
            self.facts.setdefault(
                fact.uuid, StoredFact(group_id, fact.source_uuid, fact.target_uuid)
            )
        return True


def touched_by(writes: list[EpisodeWrite]) -> tuple[list[str], list[str], list[str]]:
    """The episode, entity and fact uuids a store reads before ``WriteChecks`` of ``writes``."""
    episodes = unique(w.episode.uuid for w in writes)
    entities = unique(u for w in writes for u in written_entity_uuids(w)[1])
    facts = unique(u for w in writes for u in written_fact_uuids(w))
    return episodes, entities, facts
