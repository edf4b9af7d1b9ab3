"""The part of a group a forget reaches (docs/architecture.md "Forgetting"), worked out from
the group's history (``reach``: pure) as read around the forgotten episodes (``read_reach``: a
few reads, none of the whole group: its count stops at what the decision needs).

A forget's result is the graph of the group's remaining episodes. Most of that graph does not
depend on the forgotten episodes, and an incremental forget recomputes only what does:

- **names**: a mapped entity draft resolves by its stable key or normalised name
  (``tidegraph.processors.resolution.match``). A draft is *settled* when the only entity that
  holds its key or name (as name, alias or key) is the one the draft would create itself
  (``new_entity_uuid``): whichever episodes are replayed, it resolves to that uuid. Every draft
  of every episode the forget replays or folds must be settled, and no unsettled draft of a
  remaining episode may name an entity the forget touches; else the whole group is replayed.
- **entities**: the records of the entities the forgotten episodes mention are folded again
  from the drafts of their remaining episodes, in order (``_fold`` in the forget), an entity
  no remaining episode mentions is gone; one a forgotten episode only restated keeps its record
  (``unchanged_entities``), as does every other entity.
- **fact slots**: a mapped fact interacts only with the facts of its subject and relation
  (``tidegraph.processors.timeline.plan_facts``). The slots the forgotten episodes wrote are
  rebuilt by replaying every remaining episode that writes to them (into an empty scratch
  store, their settled drafts resolve as they would in the whole group); the facts of every
  other slot stay as they are.

Episodes the LLM extracted are judged against searches over the whole group (entity
candidates, facts sharing an endpoint): a group holding any is replayed whole, as is a group
where the reached part is most of it (``most``).
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

import orjson

from tidegraph.processors.resolution import new_entity_uuid
from tidegraph.records.graph import EntityRecord, EpisodeRecord, FactRecord, GroupHistory
from tidegraph.records.ids import normalize_name
from tidegraph.records.times import utc
from tidegraph.stores.roles import Forgetting

# The reached part, as a share of the group's extracted episodes, above which a forget
# replays the whole group instead.
MOST = 0.5

Slot = tuple[str, str]  # (subject entity uuid, relation)


@dataclass(frozen=True)
class Draft:
    """An entity draft as the reach sees it: what resolution looks it up by."""

    name: str
    norm: str
    key: str | None
    labels: list[str]
    summary: str
    uuid: str  # the entity it creates (or resolves to, when settled)
    settled: bool


@dataclass
class Reach:
    """What an incremental forget recomputes: the remaining episodes it replays (in the
    group's order) for the fact slots it rebuilds, the entities it folds again, and each
    folded entity's drafts per episode."""

    replay: list[EpisodeRecord] = field(default_factory=list)
    slots: set[Slot] = field(default_factory=set)
    entities: set[str] = field(default_factory=set)
    drafts: dict[str, list[Draft]] = field(default_factory=dict)  # episode uuid -> drafts


@dataclass(frozen=True)
class Whole:
    """The forget replays the whole group; ``reason`` says why (a log line, a metric)."""

    reason: str


def reach(
    group_id: str,
    history: GroupHistory,
    forgotten: set[str],
    *,
    most: float = MOST,
    entities: Iterable[EntityRecord] | None = None,
    size: int | None = None,
    touched: set[str] | None = None,
    parsed: dict[str, dict] | None = None,
) -> Reach | Whole:
    """The part of ``group_id`` forgetting ``forgotten`` (episode uuids) reaches, or why the
    whole group is replayed (see the module docstring). ``history`` is the group's, or the
    part of it ``read_reach`` read; ``entities``: every entity holding a key or name of its
    drafts (default: the history's); ``size``: the group's extracted episodes (default: the
    history's); ``touched``: the entities whose records may change (default: every entity the
    forgotten episodes mention); ``parsed``: extractions already parsed, by episode uuid."""
    extracted = [e for e in history.episodes if e.not_extracted is None]
    cache = {} if parsed is None else parsed
    for record in extracted:
        if record.extraction is None:
            return Whole("an episode without a stored extraction")
        if not _data(record, cache).get("mapped"):
            return Whole("episodes the LLM extracted")
    holders = _holders(history.entities.values() if entities is None else entities)
    drafts = {e.uuid: _drafts(group_id, cache[e.uuid], holders) for e in extracted}
    gone = [e for e in extracted if e.uuid in forgotten]
    remaining = [e for e in extracted if e.uuid not in forgotten]
    if touched is None:
        touched = {u for e in gone for u in history.mentions.get(e.uuid, [])}
    # An unsettled draft of a remaining episode naming a touched entity may resolve otherwise.
    for record in remaining:
        for draft in drafts[record.uuid]:
            if not draft.settled and _holding(draft, holders) & touched:
                return Whole("a name several entities share")
    slots: set[Slot] = set()
    for record in gone:
        slots |= _slots(cache[record.uuid], drafts[record.uuid], holders)
    replay = [e for e in remaining if _slots(cache[e.uuid], drafts[e.uuid], holders) & slots]
    writers = [e for e in remaining if any(d.uuid in touched for d in drafts[e.uuid])]
    for record in [*replay, *writers]:
        if not all(d.settled for d in drafts[record.uuid]):
            return Whole("a name several entities share")
    left = len(remaining) if size is None else size - len(gone)
    if most <= 0 or len(replay) > most * max(1, left):
        return Whole("most of the group")
    return Reach(
        replay=replay,
        slots=slots,
        entities=touched,
        drafts={e.uuid: drafts[e.uuid] for e in writers},
    )


def written_slots(
    group_id: str,
    episodes: Iterable[EpisodeRecord],
    entities: Iterable[EntityRecord],
    parsed: dict[str, dict],
) -> set[Slot]:
    """The fact slots ``episodes`` (mapped, with their extractions) write to; ``entities``:
    every entity holding a key or name of their drafts."""
    holders = _holders(entities)
    slots: set[Slot] = set()
    for record in episodes:
        data = _data(record, parsed)
        slots |= _slots(data, _drafts(group_id, data, holders), holders)
    return slots


def unchanged_entities(
    group_id: str,
    gone: list[EpisodeRecord],
    mentions: dict[str, list[str]],
    creators: GroupHistory,
    entities: Iterable[EntityRecord],
    parsed: dict[str, dict],
) -> set[str]:
    """The entities the forgotten episodes (``gone``) mention whose records stay as they are:
    created by an episode that remains, and every forgotten draft of them (settled) brings
    nothing its creator's draft did not (no label, name or key it lacked, no summary), so
    that its write changed nothing (``resolution.update_for``). ``creators``: the episodes
    that created them."""
    holders = _holders(entities)
    forgotten = {e.uuid for e in gone}
    creator: dict[str, Draft | None] = {}
    for record in creators.episodes:
        drafts = _drafts(group_id, _data(record, parsed), holders)
        for uuid in creators.created.get(record.uuid, []):
            first = next((d for d in drafts if d.settled and d.uuid == uuid), None)
            creator[uuid] = None if record.uuid in forgotten or uuid in creator else first
    unchanged = {u for e in gone for u in mentions.get(e.uuid, [])}
    for record in gone:
        drafts = _drafts(group_id, _data(record, parsed), holders)
        for uuid in mentions.get(record.uuid, []):
            made = creator.get(uuid)
            named = [d for d in drafts if d.uuid == uuid or uuid in _holding(d, holders)]
            if made is None or not named or not all(_adds_nothing(d, made) for d in named):
                unchanged.discard(uuid)
    return unchanged


def _adds_nothing(draft: Draft, creator: Draft) -> bool:
    return (
        draft.settled
        and draft.uuid == creator.uuid
        and set(draft.labels) <= set(creator.labels)
        and draft.norm in {_norm(creator.name) or creator.name, creator.norm}
        and (draft.key is None or creator.key is not None)
        and not draft.summary
    )


def _data(record: EpisodeRecord, parsed: dict[str, dict]) -> dict:
    """The episode's stored extraction, parsed once."""
    data = parsed.get(record.uuid)
    if data is None:
        data = parsed[record.uuid] = orjson.loads(record.extraction or "{}")
    return data


# Names and the uuids they give recur across a group's drafts: each worked out once.
_norm = lru_cache(maxsize=1 << 16)(normalize_name)
_new_uuid = lru_cache(maxsize=1 << 16)(new_entity_uuid)


def _holders(entities: Iterable[EntityRecord]) -> dict[str, set[str]]:
    """Each key and normalised name -> the entities holding it (as key, name or alias)."""
    holders: dict[str, set[str]] = {}
    for entity in entities:
        tokens = {_name_token(_norm(entity.name) or entity.name)}
        tokens.update(_name_token(a) for a in entity.aliases)
        if entity.key:
            tokens.add(_key_token(entity.key))
        for token in tokens:
            holders.setdefault(token, set()).add(entity.uuid)
    return holders


_NOBODY: frozenset[str] = frozenset()


def _name_token(norm: str) -> str:
    return "n\x1f" + norm


def _key_token(key: str) -> str:
    return "k\x1f" + key


def _holding(draft: Draft, holders: dict[str, set[str]]) -> AbstractSet[str]:
    """The entities holding the draft's name or key: read only (without a key, the holders'
    own set, not a copy: a common name is held by many entities, and this runs for every
    draft of every episode a forget reads)."""
    named = holders.get(_name_token(draft.norm), _NOBODY)
    if not draft.key:
        return named
    return named | holders.get(_key_token(draft.key), _NOBODY)


def _drafts(group_id: str, data: dict, holders: dict[str, set[str]]) -> list[Draft]:
    out: list[Draft] = []
    for entity in data.get("entities") or []:
        name = entity["name"]
        key = entity.get("key")
        norm = _norm(name) or name
        uuid = _new_uuid(group_id, name, key)
        draft = Draft(
            name=name,
            norm=norm,
            key=key,
            labels=list(entity.get("labels") or []),
            summary=entity.get("summary") or "",
            uuid=uuid,
            settled=True,
        )
        if not _holding(draft, holders) <= {uuid}:
            draft = Draft(name, norm, key, draft.labels, draft.summary, uuid, settled=False)
        out.append(draft)
    return out


def _slots(data: dict, drafts: list[Draft], holders: dict[str, set[str]]) -> set[Slot]:
    """The (subject, relation) slots an episode's facts write to (for an unsettled subject,
    every entity holding its name or key)."""
    slots: set[Slot] = set()
    for fact in data.get("facts") or []:
        subject = drafts[fact["subject"]]
        relation = fact["relation"]
        ends = {subject.uuid} if subject.settled else _holding(subject, holders)
        slots.update((u, relation) for u in ends)
    return slots


class ReachStore(Protocol):
    """What ``read_reach`` reads: the forget role's parts of the history, and entities and
    facts through the write path's own lookups."""

    @property
    def forget(self) -> Forgetting: ...

    async def entities_by_uuids(self, group_id: str, uuids: list[str]) -> list[EntityRecord]: ...

    async def entities_by_keys(self, group_id: str, keys: list[str]) -> list[EntityRecord]: ...

    async def entities_by_names(self, group_id: str, names: list[str]) -> list[EntityRecord]: ...

    async def fact_candidates(
        self,
        group_id: str,
        pairs: list[tuple[str, str]],
        ends: list[str],
        *,
        embeddings: bool = True,
    ) -> list[FactRecord]: ...


async def read_reach(
    store: ReachStore, group_id: str, first: GroupHistory, forgotten: set[str], most: float
) -> tuple[Reach | Whole, GroupHistory]:
    """``reach`` from reads of the part of the group around the forgotten episodes only
    (``first``: the forgotten episodes and the group's version, read before anything else):
    the entities they mention, the subjects of the fact slots they wrote and every entity
    sharing a key or name with those, the episodes mentioning any of them, every entity
    holding a key or name of those episodes' drafts, and the slots' facts. Returns the reach
    and that part of the history (its entities: the touched ones; its facts: the slots')."""
    profile = await store.forget.group_profile(group_id)
    if profile.judged:
        return Whole("episodes the LLM extracted"), first
    if profile.without_extraction:
        return Whole("an episode without a stored extraction"), first
    known: dict[str, EntityRecord] = {}
    parsed: dict[str, dict] = {}

    async def holding(
        episodes: Iterable[EpisodeRecord], records: Iterable[EntityRecord]
    ) -> set[str]:
        """Every entity holding a key or name of these episodes' drafts or of these entities
        (kept in ``known``): their uuids."""
        keys: set[str] = set()
        names: set[str] = set()
        for record in episodes:
            for entity in _data(record, parsed).get("entities") or []:
                names.add(_norm(entity["name"]) or entity["name"])
                if entity.get("key"):
                    keys.add(entity["key"])
        for entity in records:
            names.add(_norm(entity.name) or entity.name)
            names.update(entity.aliases)
            if entity.key:
                keys.add(entity.key)
        found: set[str] = set()
        for entities in (
            await store.entities_by_keys(group_id, sorted(keys)),
            await store.entities_by_names(group_id, sorted(names)),
        ):
            known.update((e.uuid, e) for e in entities)
            found.update(e.uuid for e in entities)
        return found

    gone = [e for e in first.episodes if e.uuid in forgotten]
    mentioned = sorted({u for e in gone for u in first.mentions.get(e.uuid, [])})
    creators = await store.forget.history_part(group_id, [], [], mentioned)
    await holding([*gone, *creators.episodes], [])
    unchanged = unchanged_entities(group_id, gone, first.mentions, creators, known.values(), parsed)
    touched = {u for u in mentioned if u not in unchanged}
    touched_records = await store.entities_by_uuids(group_id, sorted(touched))
    # The slots the forgotten episodes wrote, and every entity sharing a name with their
    # subjects or with the touched entities.
    slots = written_slots(group_id, gone, known.values(), parsed)
    subjects = [known[s] for s, _ in slots if s in known]
    sharing = await holding([], [*touched_records, *subjects])
    around = sorted(touched | {s for s, _ in slots} | sharing)
    second = await store.forget.history_part(group_id, [], around)
    await holding(second.episodes, [])
    episodes = {e.uuid: e for e in [*first.episodes, *second.episodes]}
    ordered = sorted(
        episodes.values(), key=lambda e: (utc(e.extracted_at or e.created_at or e.valid_at), e.uuid)
    )
    facts = await store.fact_candidates(group_id, sorted(slots), [], embeddings=True)
    part = GroupHistory(
        episodes=ordered,
        entities={e.uuid: e for e in touched_records},
        facts={f.uuid: f for f in facts},
        mentions={**second.mentions, **first.mentions},
        created={**second.created, **first.created},
        version=first.version,
    )
    # ``reach`` replays the whole group when it would replay more than ``most`` of what
    # remains; the replay is a part of ``part``, so counting the group up to here decides it.
    enough = len(forgotten) + int(len(part.episodes) / most) + 1 if most > 0 else 0
    size = await store.forget.extracted_episodes(group_id, enough)
    found = reach(
        group_id,
        part,
        forgotten,
        most=most,
        entities=known.values(),
        size=size,
        touched=touched,
        parsed=parsed,
    )
    return found, part
