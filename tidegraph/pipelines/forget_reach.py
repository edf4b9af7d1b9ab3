"""The part of a group a forget reaches (docs/architecture.md "Forgetting"), worked out from
the group's history alone (pure: no store, no LLM).

A forget's result is the graph of the group's remaining episodes. Most of that graph does not
depend on the forgotten episodes, and an incremental forget recomputes only what does:

- **names**: a mapped entity draft resolves by its stable key or normalised name
  (``tidegraph.processors.resolution.match``). A draft is *settled* when the only entity that
  holds its key or name (as name, alias or key) is the one the draft would create itself
  (``new_entity_uuid``): whichever episodes are replayed, it resolves to that uuid. Every draft
  of every episode the forget replays or folds must be settled, and no unsettled draft of a
  remaining episode may name an entity the forget touches; else the whole group is replayed.
- **entities**: the records of the entities the forgotten episodes mention are folded again
  from the drafts of their remaining episodes, in order (``fold_entities`` in the forget), an
  entity no remaining episode mentions is gone; every other entity keeps its record.
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

from dataclasses import dataclass, field

import orjson

from tidegraph.processors.resolution import new_entity_uuid
from tidegraph.records.graph import EpisodeRecord, GroupHistory
from tidegraph.records.ids import normalize_name

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
    group_id: str, history: GroupHistory, forgotten: set[str], *, most: float = MOST
) -> Reach | Whole:
    """The part of ``group_id`` forgetting ``forgotten`` (episode uuids) reaches, or why the
    whole group is replayed (see the module docstring)."""
    extracted = [e for e in history.episodes if e.not_extracted is None]
    parsed: dict[str, dict] = {}
    for record in extracted:
        if record.extraction is None:
            return Whole("an episode without a stored extraction")
        data = orjson.loads(record.extraction)
        if not data.get("mapped"):
            return Whole("episodes the LLM extracted")
        parsed[record.uuid] = data
    holders = _holders(history)
    drafts = {u: _drafts(group_id, data, holders) for u, data in parsed.items()}
    gone = [e for e in extracted if e.uuid in forgotten]
    remaining = [e for e in extracted if e.uuid not in forgotten]
    touched = {u for e in gone for u in history.mentions.get(e.uuid, [])}
    # An unsettled draft of a remaining episode naming a touched entity may resolve otherwise.
    for record in remaining:
        for draft in drafts[record.uuid]:
            if not draft.settled and _holding(draft, holders) & touched:
                return Whole("a name several entities share")
    slots: set[Slot] = set()
    for record in gone:
        slots |= _slots(parsed[record.uuid], drafts[record.uuid], holders)
    replay = [e for e in remaining if _slots(parsed[e.uuid], drafts[e.uuid], holders) & slots]
    writers = [e for e in remaining if any(d.uuid in touched for d in drafts[e.uuid])]
    for record in [*replay, *writers]:
        if not all(d.settled for d in drafts[record.uuid]):
            return Whole("a name several entities share")
    if len(replay) > most * max(1, len(remaining)):
        return Whole("most of the group")
    return Reach(
        replay=replay,
        slots=slots,
        entities=touched,
        drafts={e.uuid: drafts[e.uuid] for e in writers},
    )


def _holders(history: GroupHistory) -> dict[str, set[str]]:
    """Each key and normalised name -> the entities holding it (as key, name or alias)."""
    holders: dict[str, set[str]] = {}
    for entity in history.entities.values():
        tokens = {_name_token(normalize_name(entity.name) or entity.name)}
        tokens.update(_name_token(a) for a in entity.aliases)
        if entity.key:
            tokens.add(_key_token(entity.key))
        for token in tokens:
            holders.setdefault(token, set()).add(entity.uuid)
    return holders


def _name_token(norm: str) -> str:
    return "n\x1f" + norm


def _key_token(key: str) -> str:
    return "k\x1f" + key


def _holding(draft: Draft, holders: dict[str, set[str]]) -> set[str]:
    found = set(holders.get(_name_token(draft.norm), ()))
    if draft.key:
        found |= holders.get(_key_token(draft.key), set())
    return found


def _drafts(group_id: str, data: dict, holders: dict[str, set[str]]) -> list[Draft]:
    out: list[Draft] = []
    for entity in data.get("entities") or []:
        name = entity["name"]
        key = entity.get("key")
        norm = normalize_name(name) or name
        uuid = new_entity_uuid(group_id, name, key)
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
