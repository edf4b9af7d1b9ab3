"""Random sequences of episode writes, and what they leave in a store and in the write rules
alone (the property test of ``tidegraph.stores.write_rules``: tests/unit/
test_write_rules_property.py, tests/integration/test_write_rules_neo4j.py).

A sequence writes a few entities, facts and episode markers of one group again and again:
the same uuids with other or missing values (names, labels valid and not, aliases, blank and
set summaries, keys, embeddings, histories), times in any order and time zone, closures of
facts written before, an episode stored unextracted then written again (or skipped: a
processed episode is never written again). It is written in batches (``write_episodes``: on
Neo4j one statement per batch, in SQLite one transaction), so later writes of a batch see the
earlier ones as they would see them committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import strategies as st

from tidegraph.records.graph import (
    EntityRecord,
    EpisodeRecord,
    EpisodeWrite,
    FactClosure,
    FactRecord,
)
from tidegraph.stores.base import GraphStore
from tidegraph.stores.errors import skips_write
from tidegraph.stores.write_rules import (
    ENTITY,
    EPISODE,
    FACT,
    closed_fact,
    merged_entity,
    merged_episode,
    merged_fact,
)

DIM = 384  # the shared Neo4j test server's vector indexes are 384-dimensional
T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
ENTITIES = ("e0", "e1", "e2")
FACTS = {"f0": ("e0", "e1"), "f1": ("e1", "e2"), "f2": ("e0", "e2")}
EPISODES = ("p0", "p1", "p2", "p3")
CONTENT = "the same content for every write of an episode"


def vec(n: int) -> list[float]:
    return [1.0 if i in (0, n + 1) else 0.0 for i in range(DIM)]


times = st.builds(
    lambda days, micros, tz: (T0 + timedelta(days=days, microseconds=micros)).astimezone(tz),
    st.integers(-30, 30),
    st.sampled_from([0, 1, 999_999]),
    st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-7))]),
)
optional_times = st.none() | times
embeddings = st.none() | st.integers(0, 3).map(vec)
texts = st.sampled_from(["", "  ", "Acme", "Acme Corp. (ACME-1)", "ünïcødé 東京 '\" $x"])


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[datetime], list[datetime], datetime | None]:
    """A history (prior times and when each was learned, when the current one was): none,
    or as long as it is."""
    size = draw(st.integers(0, 2))
    return (
        draw(st.lists(times, min_size=size, max_size=size)),
        draw(st.lists(times, min_size=size, max_size=size)),
        draw(optional_times),
    )


def entity_writes(group: str) -> st.SearchStrategy[EntityRecord]:
    return st.builds(
        EntityRecord,
        uuid=st.sampled_from(ENTITIES).map(lambda u: f"{group}-{u}"),
        group_id=st.just(group),
        name=st.sampled_from(["Acme", "Acme Corp", "Globex"]),
        labels=st.lists(st.sampled_from(["Company", "Person", "Entity", "bad label"])),
        summary=texts,
        key=st.sampled_from([None, "", "crm:1", "crm:2"]),
        aliases=st.lists(st.sampled_from(["acme", "acme corp", "globex"])),
        name_embedding=embeddings,
        created_at=times,
    )


@st.composite
def fact_writes(draw: st.DrawFn, group: str) -> FactRecord:
    uuid = draw(st.sampled_from(sorted(FACTS)))
    source, target = FACTS[uuid]
    ends, starts = draw(histories()), draw(histories())
    return FactRecord(
        uuid=f"{group}-{uuid}",
        group_id=group,
        source_uuid=f"{group}-{source}",
        target_uuid=f"{group}-{target}",
        name=draw(st.sampled_from(["WORKS_AT", "OWNS"])),
        fact=draw(texts),
        fact_embedding=draw(embeddings),
        episodes=draw(st.lists(st.sampled_from(EPISODES), max_size=3)),
        valid_at=draw(optional_times),
        invalid_at=draw(optional_times),
        created_at=draw(times),
        expired_at=draw(optional_times),
        cardinality=draw(st.sampled_from([None, "one", "many"])),
        prior_ends=ends[0],
        prior_ends_learned_at=ends[1],
        end_learned_at=ends[2],
        prior_starts=starts[0],
        prior_starts_learned_at=starts[1],
        start_learned_at=starts[2],
    )


@st.composite
def closures(draw: st.DrawFn, group: str) -> FactClosure:
    ends = draw(histories())
    return FactClosure(
        uuid=f"{group}-{draw(st.sampled_from(sorted(FACTS)))}",
        invalid_at=draw(times),
        expired_at=draw(times),
        prior_ends=tuple(ends[0]),
        prior_ends_learned_at=tuple(ends[1]),
        end_learned_at=ends[2],
    )


@st.composite
def episode_writes(draw: st.DrawFn, group: str) -> EpisodeWrite:
    uuid = draw(st.sampled_from(EPISODES))
    episode = EpisodeRecord(
        uuid=f"{group}-{uuid}",
        group_id=group,
        name=draw(st.sampled_from(["first", "second"])),
        source="text",
        source_description=draw(st.sampled_from(["crm", "mail"])),
        content=CONTENT,
        valid_at=draw(times),
        created_at=draw(times),
        producer_id=f"producer:{uuid}",
        content_hash=f"hash:{uuid}",
        content_embedding=draw(embeddings),
        not_extracted=draw(st.sampled_from([None, None, "the LLM was down"])),
        extraction=draw(st.sampled_from([None, "llm", "mapped"])),
        extracted_at=draw(optional_times),
    )
    return EpisodeWrite(
        episode=episode,
        entities=draw(st.lists(entity_writes(group), max_size=4)),
        facts=draw(st.lists(fact_writes(group), max_size=3)),
        closures=draw(st.lists(closures(group), max_size=2)),
        created=draw(st.lists(st.sampled_from(ENTITIES).map(lambda u: f"{group}-{u}"))),
    )


@st.composite
def write_sequences(draw: st.DrawFn, group: str) -> list[list[EpisodeWrite]]:
    """Batches of writes, every one of them valid when it comes (its facts' ends are stored,
    its closures' facts too): the first write stores every entity."""
    first = draw(episode_writes(group))
    first.entities += [
        draw(entity_writes(group)).model_copy(update={"uuid": f"{group}-{u}"}) for u in ENTITIES
    ]
    writes = [first, *draw(st.lists(episode_writes(group), max_size=7))]
    reference = Reference()
    for write in writes:  # closures only of facts stored when they come
        known = set(reference.facts) | {f.uuid for f in write.facts}
        write.closures = [c for c in write.closures if c.uuid in known]
        reference.write(group, write)
    cuts = sorted(set(draw(st.lists(st.integers(1, len(writes)), max_size=3))))
    bounds = [0, *cuts, len(writes)]
    return [writes[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if a < b]


# ----------------------------------------------------------------------------- the folds
@dataclass
class Reference:
    """The writes applied by ``write_rules`` alone (and the skip rule every store follows)."""

    entities: dict[str, EntityRecord] = field(default_factory=dict)
    facts: dict[str, FactRecord] = field(default_factory=dict)
    episodes: dict[str, EpisodeRecord] = field(default_factory=dict)
    created: dict[str, list[str]] = field(default_factory=dict)

    def write(self, group: str, write: EpisodeWrite) -> bool:
        episode = write.episode
        stored = self.episodes.get(episode.uuid)
        if stored is not None and skips_write(
            group, write, stored.group_id, stored.content_hash, stored.not_extracted
        ):
            return False
        now = datetime.now(UTC)
        for entity in write.entities:
            self.entities[entity.uuid] = merged_entity(self.entities.get(entity.uuid), entity, now)
        self.episodes[episode.uuid] = merged_episode(stored, episode, now)
        self.created[episode.uuid] = list(dict.fromkeys(write.created))
        for fact in write.facts:
            self.facts[fact.uuid] = merged_fact(self.facts.get(fact.uuid), fact, now)
        for closure in write.closures:
            self.facts[closure.uuid] = closed_fact(self.facts[closure.uuid], closure)
        return True


def _fields(record: Any, rules: dict[str, Any]) -> dict[str, Any]:
    return {name: getattr(record, name) for name in rules if hasattr(record, name)}


@dataclass
class Snapshot:
    """What a group holds after a sequence, field by field, and what each write answered."""

    written: list[bool]
    entities: dict[str, dict[str, Any]]
    facts: dict[str, dict[str, Any]]
    episodes: dict[str, dict[str, Any]]
    created: dict[str, list[str]]


def reference_snapshot(group: str, batches: list[list[EpisodeWrite]]) -> Snapshot:
    reference = Reference()
    written = [reference.write(group, w) for batch in batches for w in batch]
    return Snapshot(
        written,
        {u: _fields(e, ENTITY) for u, e in sorted(reference.entities.items())},
        {u: _fields(f, FACT) for u, f in sorted(reference.facts.items())},
        {u: _fields(e, EPISODE) for u, e in sorted(reference.episodes.items())},
        dict(sorted(reference.created.items())),
    )


async def store_snapshot(
    store: GraphStore, group: str, batches: list[list[EpisodeWrite]]
) -> Snapshot:
    """The sequence written to ``store`` (each batch one ``write_episodes`` call) and what
    the group holds then."""
    written: list[bool] = []
    for batch in batches:
        written += await store.write_episodes(group, batch)
    held = await store.forget.group_history(group)  # the whole group, as a forget reads it
    return Snapshot(
        written,
        {u: _fields(e, ENTITY) for u, e in sorted(held.entities.items())},
        {u: _fields(f, FACT) for u, f in sorted(held.facts.items())},
        {e.uuid: _fields(e, EPISODE) for e in sorted(held.episodes, key=lambda e: e.uuid)},
        dict(sorted(held.created.items())),
    )


def differences(expected: Snapshot, found: Snapshot) -> list[str]:
    """Every field of every record where ``found`` differs from ``expected``."""
    out = []
    if found.written != expected.written:
        out.append(f"written: {found.written} != {expected.written}")
    for kind in ("entities", "facts", "episodes", "created"):
        mine, theirs = getattr(expected, kind), getattr(found, kind)
        if set(mine) != set(theirs):
            out.append(f"{kind}: {sorted(theirs)} != {sorted(mine)}")
            continue
        for uuid, record in mine.items():
            other = theirs[uuid]
            if not isinstance(record, dict):
                if record != other:
                    out.append(f"{kind} {uuid}: {other!r} != {record!r}")
                continue
            for name, value in record.items():
                if other.get(name) != value:
                    out.append(f"{kind} {uuid}.{name}: {other.get(name)!r} != {value!r}")
    return out
