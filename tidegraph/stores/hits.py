"""Search answers, the same for every store (``GraphStore.fulltext_search`` and the others;
the records: ``tidegraph.records.search``): which records a scope sees, the ``Hit`` each one
becomes, the order of hits, and the breadth-first walk over facts.

A fact hit carries the fact as believed at the scope's known-at time, exactly as
``query_facts`` shows it (``fact_view``): an end learned later is unknown, a moved end or
start is the one believed then. Entities and communities are seen once created by then;
episodes once created by then and happened by the scope's valid-at time."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime

from tidegraph.records.asof import AsOf, start_known_at
from tidegraph.records.graph import CommunityRecord, EntityRecord, EpisodeRecord, FactRecord
from tidegraph.records.search import KINDS, Hit, Kind

# Frontier entities a walk reads at once at first (``walk``), by default: a store whose reads
# cost little more than their rows (the embedded store) reads fewer.
FIRST_CHUNK = 8


def check_kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    return kind


def known_by(created_at: datetime | None, asof: AsOf) -> bool:
    """Stored by the scope's known-at time (a record without a creation time always is)."""
    return created_at is None or created_at <= asof.known_at


def episode_seen(episode: EpisodeRecord, asof: AsOf) -> bool:
    return known_by(episode.created_at, asof) and episode.valid_at <= asof.valid_at


def believed_fact(fact: FactRecord, asof: AsOf) -> FactRecord:
    """The fact as believed at ``asof.known_at`` (what ``rows.fact_view`` shows)."""
    invalid_at, expired_at = asof.known_end(fact)
    start = start_known_at(fact, asof.known_at)
    if (start, invalid_at, expired_at) == (fact.valid_at, fact.invalid_at, fact.expired_at):
        return fact  # believed as stored (most facts): no copy
    return fact.model_copy(
        update={"valid_at": start, "invalid_at": invalid_at, "expired_at": expired_at}
    )


def fact_hit(
    fact: FactRecord,
    score: float,
    asof: AsOf,
    names: dict[str, str] | None,
    producers: dict[str, str] | None,
    distance: int | None = None,
) -> Hit:
    """``names``: entity names by uuid; ``producers``: producer ids by episode uuid (both
    None: a hit without its details, ``SearchScope.details``)."""
    episodes, subject, object_ = (
        _fact_details(fact, names, producers)
        if names is not None and producers is not None
        else ([], "", "")
    )
    return Hit(
        kind="fact",
        uuid=fact.uuid,
        score=score,
        record=believed_fact(fact, asof),
        group_id=fact.group_id,
        episodes=episodes,
        mentions=len(fact.episodes),
        distance=distance,
        subject=subject,
        object=object_,
    )


def with_fact_details(
    hit: Hit, fact: FactRecord, names: dict[str, str], producers: dict[str, str]
) -> Hit:
    """The fact's hit with its details (``fact_hit``)."""
    episodes, subject, object_ = _fact_details(fact, names, producers)
    return dataclasses.replace(hit, episodes=episodes, subject=subject, object=object_)


def _fact_details(
    fact: FactRecord, names: dict[str, str], producers: dict[str, str]
) -> tuple[list[str], str, str]:
    """(its episodes' producer ids (an episode without one: its uuid), subject, object)."""
    episodes = [producers.get(u) or u for u in fact.episodes]
    return episodes, names.get(fact.source_uuid, ""), names.get(fact.target_uuid, "")


def entity_hit(entity: EntityRecord, score: float, producers: list[str] | None) -> Hit:
    """``producers``: the producer ids of the episodes that mention it, the latest first
    (``latest_first``): what was said of it most recently leads (None: a hit without its
    details, ``SearchScope.details``)."""
    return Hit(
        kind="entity",
        uuid=entity.uuid,
        score=score,
        record=entity,
        group_id=entity.group_id,
        episodes=list(producers or []),
        mentions=len(producers or []),
    )


def with_mentions(hit: Hit, producers: list[str]) -> Hit:
    """The entity's hit with the producer ids of the episodes that mention it."""
    return dataclasses.replace(hit, episodes=list(producers), mentions=len(producers))


def latest_first(mentions: Iterable[tuple[datetime, str]]) -> list[str]:
    """Producer ids of (episode valid-at, producer id) pairs, the latest episode first (ties:
    by producer id)."""
    return [p for _, p in sorted(mentions, key=lambda m: (-m[0].timestamp(), m[1]))]


def episode_hit(episode: EpisodeRecord, score: float) -> Hit:
    return Hit(
        kind="episode",
        uuid=episode.uuid,
        score=score,
        record=episode,
        group_id=episode.group_id,
        episodes=[episode.producer_id or episode.uuid],
    )


def community_hit(community: CommunityRecord, group_id: str, score: float) -> Hit:
    return Hit(
        kind="community",
        uuid=community.uuid,
        score=score,
        record=community,
        group_id=group_id,
        mentions=len(community.members),
    )


def best(hits: Iterable[Hit], limit: int) -> list[Hit]:
    """Best first (ties: nearer, then group and uuid), at most ``limit``."""
    ordered = sorted(hits, key=lambda h: (-h.score, h.distance or 0, h.group_id, h.uuid))
    return ordered[: max(limit, 0)]


FactsOf = Callable[[list[str]], Awaitable[list[FactRecord]]]


async def walk(
    facts_of: FactsOf,
    seeds: list[str],
    hops: int,
    done: Callable[[dict[str, tuple[FactRecord, int, int]], dict[str, int]], bool] | None = None,
    first_chunk: int = FIRST_CHUNK,
) -> tuple[dict[str, tuple[FactRecord, int, int]], dict[str, int]]:
    """Breadth first from ``seeds`` (most relevant first) over the facts ``facts_of(entity
    uuids)`` gives (those touching them, already filtered by the caller's scope).

    Answers every fact reached within ``hops`` as (fact, hop, origin) and every entity reached
    with its distance (seeds: 0). A fact's hop is 1 when it touches a seed; its origin is the
    rank (0 first) of the most relevant seed it was reached from.

    Each hop reads its frontier in origin order, a chunk at a time (``first_chunk`` entities
    first, the chunks doubling), so
    a walk from a few dozen seeds reads the best seeds' facts first. ``done(reached,
    distances)`` is asked after each chunk and stops the walk once nothing further can change
    the caller's answer: what has been read then is every fact of an earlier hop, or of this
    hop from a seed of rank up to the chunk's last."""
    distances = dict.fromkeys(seeds, 0)
    origins: dict[str, int] = {}
    for rank, seed in enumerate(seeds):
        origins.setdefault(seed, rank)
    reached: dict[str, tuple[FactRecord, int, int]] = {}
    frontier = sorted(origins, key=lambda e: origins[e])
    for hop in range(1, hops + 1):
        found: set[str] = set()
        size, start = max(first_chunk, 1), 0
        while start < len(frontier):
            part = frontier[start : start + size]
            start, size = start + size, size * 2
            ranks = {e: origins[e] for e in part}
            for fact in await facts_of(part):
                ends = (fact.source_uuid, fact.target_uuid)
                origin = min(ranks[e] for e in ends if e in ranks)
                if fact.uuid not in reached:
                    reached[fact.uuid] = (fact, hop, origin)
                for end in ends:
                    if end not in distances:
                        distances[end] = hop
                        found.add(end)
                    if end in found and origin < origins.get(end, len(seeds)):
                        origins[end] = origin
            if done is not None and done(reached, distances):
                return reached, distances
        frontier = sorted(found, key=lambda e: (origins[e], e))
        if not frontier:
            break
    return reached, distances


async def expanded(
    facts_of: FactsOf, seeds: list[str], hops: int, limit: int, first_chunk: int = FIRST_CHUNK
) -> list[tuple[FactRecord, int]]:
    """``expand_facts`` of one group: the facts reached within ``hops`` of the seeds (most
    relevant first) with the hop each was reached at: nearest first, then from the more
    relevant seed, then by uuid; at most ``limit``."""
    # Once ``limit`` facts are read, no fact read later would rank among them (``walk``).
    reached, _ = await walk(
        facts_of, seeds, hops, lambda found, _: len(found) >= limit, first_chunk
    )
    ordered = sorted(reached.values(), key=lambda f: (f[1], f[2], f[0].uuid))
    return [(fact, hop) for fact, hop, _ in ordered[: max(limit, 0)]]


async def distances(
    walks: Iterable[FactsOf], centre: str, uuids: list[str], max_hops: int
) -> dict[str, int]:
    """``entity_distances`` over the groups' facts (``walks``: one ``facts_of`` a group): the
    fewest hops from ``centre`` to each of ``uuids`` within ``max_hops``."""
    wanted = set(uuids)
    nearest: dict[str, int] = {}
    for facts_of in walks:
        _, reached = await walk(
            facts_of, [centre], max(max_hops, 0), lambda _, found: wanted <= found.keys()
        )
        for uuid, hops in reached.items():
            if uuid in wanted and hops < nearest.get(uuid, max_hops + 1):
                nearest[uuid] = hops
    return dict(sorted(nearest.items()))
