"""What changed in the graph, as the change stream publishes it (docs: "Change stream").

A committed write records its changes in the same transaction (the store's outbox): each is
a ``Change`` with the record's state before and after, both timelines, the producer id of the
episode that caused it and a ``change_id`` that a replay gives again (derived from the group,
the cause and the record), so that a consumer can drop what it has seen. The store numbers a
group's changes in commit order (``seq``).

The kinds:

- ``fact.created``, ``fact.updated`` (a restatement merged in, a start moved earlier),
  ``fact.invalidated`` (its valid range closed, or its end moved), ``fact.expired`` (the
  ingestion timeline's end: tidegraph learned it was superseded; comes with the first
  ``fact.invalidated``), ``fact.reopened`` (its end is gone: the episode that closed it was
  forgotten), ``fact.forgotten`` (no remaining episode supports it);
- ``entity.created``, ``entity.merged`` (a name, label or key joined it),
  ``entity.summary_changed``, ``entity.forgotten`` (no remaining episode mentions it);
- ``episode.forgotten``; ``group.forgotten`` (the whole group: every record of it is gone).

A forgotten record's change carries its uuid and nothing of its content, and forgetting
drops the earlier changes of that record from the store's outbox: what was erased is not
served again (docs: "Forgetting").

Pure functions of records: ``fact_changes`` and ``entity_changes`` compare a record's state
before and after.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson
from pydantic import BaseModel

from tidegraph.records.graph import EntityRecord, FactRecord, constructed
from tidegraph.records.ids import derived_uuid

ChangeKind = Literal[
    "fact.created",
    "fact.updated",
    "fact.invalidated",
    "fact.expired",
    "fact.reopened",
    "fact.forgotten",
    "entity.created",
    "entity.merged",
    "entity.summary_changed",
    "entity.forgotten",
    "episode.forgotten",
    "group.forgotten",
]

# What a change carries of a record: its state without embeddings (they follow the text).
_FACT_FIELDS = (
    "uuid", "source_uuid", "target_uuid", "name", "fact", "episodes", "valid_at", "invalid_at",
    "created_at", "expired_at", "cardinality",
)  # fmt: skip
_ENTITY_FIELDS = ("uuid", "name", "labels", "summary", "key", "aliases", "created_at")
_FACT_INCLUDE: set[str] = set(_FACT_FIELDS)
_ENTITY_INCLUDE: set[str] = set(_ENTITY_FIELDS)


class Change(BaseModel):
    """One committed change of a group's graph (see the module docstring)."""

    change_id: str
    group_id: str
    seq: int = 0  # the group's commit order (the store numbers it when it commits)
    kind: ChangeKind
    uuid: str  # the fact, entity or episode changed
    episode_id: str | None = None  # the producer id of the episode that caused it
    committed_at: datetime | None = None  # ingestion time (T') of the write
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class PublishedChange:
    """A change as the relay produces it to ``{prefix}.changes``: its group (the record's
    key), its ``seq`` and ``value``, the JSON consumers get (``Change.model_dump_json()``),
    and its ``change_id`` (what the relay's cursor checks it moves to: the change at that
    ``seq`` is still this one)."""

    group_id: str
    seq: int
    value: bytes
    change_id: str


# Where the store's outbox form of a change takes its ``seq``: right before ``kind``, as in
# ``Change.model_dump_json()`` (the fields' order). A quote inside a JSON string is escaped,
# so the first occurrence is the key's.
_SEQ_AT = ',"kind":'


def stored_form(change: Change) -> str:
    """A change as the store's outbox keeps it: its JSON without ``seq`` (the store numbers
    it when it commits), byte for byte ``Change.model_dump_json(exclude={"seq"})`` (tested).
    orjson of its fields in the model's order: pydantic serializes the states' dicts value
    by value as ``Any``, about three times the time (12 against 4 µs a change under load),
    and every write encodes a few changes."""
    fields = {
        "change_id": change.change_id,
        "group_id": change.group_id,
        "kind": change.kind,
        "uuid": change.uuid,
        "episode_id": change.episode_id,
        "committed_at": change.committed_at,
        "before": change.before,
        "after": change.after,
    }
    return orjson.dumps(fields, option=orjson.OPT_UTC_Z).decode()


def published_form(stored: str, seq: int) -> bytes:
    """The change kept as ``stored`` (``stored_form``) numbered ``seq``, byte for byte what
    ``Change.model_dump_json()`` gives, without decoding it: the relay publishes every
    change of every write."""
    at = stored.index(_SEQ_AT)
    return f'{stored[:at]},"seq":{seq}{stored[at:]}'.encode()


def change_id(group_id: str, cause: str, kind: str, uuid: str) -> str:
    """Stable across replays: the same cause changing the same record the same way."""
    return derived_uuid("change", group_id, cause, kind, uuid)


def fact_state(fact: FactRecord | None) -> dict[str, Any] | None:
    if fact is None:
        return None
    return fact.model_dump(mode="json", include=_FACT_INCLUDE)


def entity_state(entity: EntityRecord | None) -> dict[str, Any] | None:
    if entity is None:
        return None
    return entity.model_dump(mode="json", include=_ENTITY_INCLUDE)


def fact_kinds(before: FactRecord | None, after: FactRecord | None) -> list[ChangeKind]:
    """What happened to a fact between two states (empty: nothing a consumer sees)."""
    if after is None:
        return ["fact.forgotten"] if before is not None else []
    if before is None:
        born: list[ChangeKind] = ["fact.created"]
        if after.invalid_at is not None:
            born.append("fact.invalidated")
        if after.expired_at is not None:
            born.append("fact.expired")
        return born
    kinds: list[ChangeKind] = []
    if (
        before.fact != after.fact
        or before.episodes != after.episodes
        or before.valid_at != after.valid_at
        or before.name != after.name
        or before.cardinality != after.cardinality
    ):
        kinds.append("fact.updated")
    if before.invalid_at is not None and after.invalid_at is None:
        kinds.append("fact.reopened")
    elif after.invalid_at is not None and after.invalid_at != before.invalid_at:
        kinds.append("fact.invalidated")
    if before.expired_at is None and after.expired_at is not None:
        kinds.append("fact.expired")
    return kinds


def entity_kinds(before: EntityRecord | None, after: EntityRecord | None) -> list[ChangeKind]:
    if after is None:
        return ["entity.forgotten"] if before is not None else []
    if before is None:
        return ["entity.created"]
    kinds: list[ChangeKind] = []
    if (
        set(after.labels) != set(before.labels)
        or set(after.aliases) != set(before.aliases)
        or after.key != before.key
    ):
        kinds.append("entity.merged")
    if after.summary != before.summary:
        kinds.append("entity.summary_changed")
    return kinds


def fact_changes(
    group_id: str,
    cause: str,
    episode_id: str | None,
    before: FactRecord | None,
    after: FactRecord | None,
    at: datetime,
    *,
    state: Callable[[FactRecord | None], dict[str, Any] | None] = fact_state,
) -> list[Change]:
    """The changes of one fact between two states, caused by ``cause`` (an episode uuid,
    or what a forget names); ``state``: ``fact_state``, or one that remembers it."""
    kinds = fact_kinds(before, after)
    if not kinds:
        return []
    uuid = (after or before).uuid  # type: ignore[union-attr]
    # a forgotten record's content is erased: its change names it, nothing more
    states = (state(before) if after is not None else None, state(after))
    return [_change(group_id, cause, episode_id, kind, uuid, at, *states) for kind in kinds]


def entity_changes(
    group_id: str,
    cause: str,
    episode_id: str | None,
    before: EntityRecord | None,
    after: EntityRecord | None,
    at: datetime,
) -> list[Change]:
    kinds = entity_kinds(before, after)
    if not kinds:
        return []
    uuid = (after or before).uuid  # type: ignore[union-attr]
    states = (entity_state(before) if after is not None else None, entity_state(after))
    return [_change(group_id, cause, episode_id, kind, uuid, at, *states) for kind in kinds]


def _change(
    group_id: str,
    cause: str,
    episode_id: str | None,
    kind: ChangeKind,
    uuid: str,
    at: datetime,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> Change:
    """A change built from values already checked (records' states, a kind from the lists
    above): constructed without validating again, since every write makes several."""
    return constructed(
        Change,
        {
            "change_id": change_id(group_id, cause, kind, uuid),
            "group_id": group_id,
            "seq": 0,
            "kind": kind,
            "uuid": uuid,
            "episode_id": episode_id,
            "committed_at": at,
            "before": before,
            "after": after,
        },
    )


def episode_forgotten(
    group_id: str, cause: str, uuid: str, producer_id: str, at: datetime
) -> Change:
    return Change(
        change_id=change_id(group_id, cause, "episode.forgotten", uuid),
        group_id=group_id,
        kind="episode.forgotten",
        uuid=uuid,
        episode_id=producer_id,
        committed_at=at,
    )


def group_forgotten(group_id: str, at: datetime) -> Change:
    return Change(
        change_id=change_id(group_id, "forget-group", "group.forgotten", group_id),
        group_id=group_id,
        kind="group.forgotten",
        uuid=group_id,
        committed_at=at,
    )
