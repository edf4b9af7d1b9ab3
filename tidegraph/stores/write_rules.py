"""The write rules: what a stored record becomes when a write is applied to it, stated once,
as data: one ``Rule`` per field of each kind of write (``ENTITY``, ``FACT``, ``CLOSURE``,
``EPISODE``, ``COMMUNITY``).

Every store applies these tables and no other statement of them:

- the batch view (``tidegraph.pipelines.batch_view``) and the in-memory store apply them to
  records with ``merged_entity``, ``merged_fact``, ``closed_fact`` and ``merged_episode``;
- the embedded store folds its entity upserts with ``merged_values`` and builds the SET
  clauses of its fact, closure, episode and community upserts from the tables
  (``tidegraph.stores.sqlite.write_sql``); the in-memory store's community upserts use
  ``merged_values`` too;
- the Neo4j store builds the SET clauses of its statements from them
  (``tidegraph.stores.neo4j.write_queries``).

Field names in query text come from these tables only, never from a write. The property test
(tests/unit/test_write_rules_property.py, and tests/integration/test_write_rules_neo4j.py for
Neo4j) folds random sequences of writes through every store and through these functions and
compares the records field by field; tests/unit/test_write_rules.py checks each rule and the
statements built from the tables.

In words: an entity keeps its name, creation time and name embedding; gains labels and
aliases (set union, in order); takes a non-empty summary; keeps a key once set. A fact takes
the written state but keeps its ``created_at`` and its first ``expired_at``; a write without an
embedding or without a history keeps the stored one (a history only grows). A closure sets
``invalid_at``, the end history it carries, and ``expired_at`` only while it is unset. An
episode's marker takes the written state but keeps its group and ``created_at``. A community
takes its written name and summary and keeps its name embedding when none is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Final, TypeVar

from tidegraph.records.graph import (
    EntityRecord,
    EpisodeRecord,
    FactClosure,
    FactRecord,
    updated,
)
from tidegraph.records.times import utc
from tidegraph.stores.rows import TIME_FIELDS, TIME_LIST_FIELDS, clean_labels, unique


class Rule(StrEnum):
    """What a write does to one field of a stored record (on a create, every rule takes the
    written value)."""

    # Names the record: a write finds the stored record by it (a write naming it with other
    # ends or in another group is refused before anything changes: ``errors.check_write``).
    KEY = "key"
    # Set when the record is created; a later write never changes it.
    ON_CREATE = "set on create"
    # Every write replaces it, with its value or its absence.
    TAKE_WRITTEN = "take written"
    # A write with a value replaces it; a write without one (None, a blank text, an empty
    # list) keeps the stored value.
    WRITTEN_OR_KEEP = "written, else keep stored"
    # Set while unset; once set, never changed.
    FIRST_SET = "first set wins"
    # A list: the stored items, then the written ones it lacks, in order.
    UNION = "union"


Rules = Mapping[str, Rule]

# A fact's end and start history: a write that carries none keeps what is stored.
_END_HISTORY: Final[dict[str, Rule]] = {
    "prior_ends": Rule.WRITTEN_OR_KEEP,
    "prior_ends_learned_at": Rule.WRITTEN_OR_KEEP,
    "end_learned_at": Rule.WRITTEN_OR_KEEP,
}
_START_HISTORY: Final[dict[str, Rule]] = {
    "prior_starts": Rule.WRITTEN_OR_KEEP,
    "prior_starts_learned_at": Rule.WRITTEN_OR_KEEP,
    "start_learned_at": Rule.WRITTEN_OR_KEEP,
}

# An entity upsert (``EntityRecord``).
ENTITY: Final[dict[str, Rule]] = {
    "uuid": Rule.KEY,
    "group_id": Rule.ON_CREATE,
    "name": Rule.ON_CREATE,
    "name_embedding": Rule.ON_CREATE,
    "created_at": Rule.ON_CREATE,
    "labels": Rule.UNION,
    "aliases": Rule.UNION,
    "summary": Rule.WRITTEN_OR_KEEP,
    "key": Rule.FIRST_SET,
}

# A fact write (``FactRecord``: the fact's full state).
FACT: Final[dict[str, Rule]] = {
    "uuid": Rule.KEY,
    "source_uuid": Rule.KEY,
    "target_uuid": Rule.KEY,
    "group_id": Rule.ON_CREATE,
    "created_at": Rule.ON_CREATE,
    "name": Rule.TAKE_WRITTEN,
    "fact": Rule.TAKE_WRITTEN,
    "episodes": Rule.TAKE_WRITTEN,
    "valid_at": Rule.TAKE_WRITTEN,
    "invalid_at": Rule.TAKE_WRITTEN,
    "cardinality": Rule.TAKE_WRITTEN,
    "fact_embedding": Rule.WRITTEN_OR_KEEP,
    **_END_HISTORY,
    **_START_HISTORY,
    "expired_at": Rule.FIRST_SET,
}

# A fact's closure (``FactClosure``), applied to a stored fact.
CLOSURE: Final[dict[str, Rule]] = {
    "uuid": Rule.KEY,
    "invalid_at": Rule.TAKE_WRITTEN,
    **_END_HISTORY,
    "expired_at": Rule.FIRST_SET,
}

# An episode's marker (``EpisodeRecord``, and the entities it created).
EPISODE: Final[dict[str, Rule]] = {
    "uuid": Rule.KEY,
    "group_id": Rule.ON_CREATE,
    "created_at": Rule.ON_CREATE,
    "name": Rule.TAKE_WRITTEN,
    "source": Rule.TAKE_WRITTEN,
    "source_description": Rule.TAKE_WRITTEN,
    "content": Rule.TAKE_WRITTEN,
    "valid_at": Rule.TAKE_WRITTEN,
    "producer_id": Rule.TAKE_WRITTEN,
    "content_hash": Rule.TAKE_WRITTEN,
    "created_entities": Rule.TAKE_WRITTEN,
    "not_extracted": Rule.TAKE_WRITTEN,
    "content_embedding": Rule.TAKE_WRITTEN,
    "extraction": Rule.TAKE_WRITTEN,
    "extracted_at": Rule.TAKE_WRITTEN,
}

# A community upsert (``write_communities``; its members are not a field: they are replaced).
COMMUNITY: Final[dict[str, Rule]] = {
    "uuid": Rule.KEY,
    "group_id": Rule.ON_CREATE,
    "created_at": Rule.ON_CREATE,
    "name": Rule.TAKE_WRITTEN,
    "summary": Rule.TAKE_WRITTEN,
    "name_embedding": Rule.WRITTEN_OR_KEEP,
}

RULES: Final[dict[str, dict[str, Rule]]] = {
    "entity": ENTITY,
    "fact": FACT,
    "closure": CLOSURE,
    "episode": EPISODE,
    "community": COMMUNITY,
}


def updated_fields(rules: Rules) -> list[str]:
    """The fields a write to a stored record may change (not its key, not what is set on
    create), in the table's order."""
    return [name for name, rule in rules.items() if rule not in (Rule.KEY, Rule.ON_CREATE)]


def given(value: Any) -> bool:
    """Whether a written value counts as one: not None, not a blank text, not an empty list."""
    if value is None:
        return False
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, list | tuple):
        return bool(value)
    return True


def applied(rule: Rule, stored: Any, written: Any, *, created: bool) -> Any:
    """One field after a write: ``stored`` (the record's value; ignored when ``created``)
    and ``written`` (the write's)."""
    if created:
        if rule is Rule.UNION:
            return unique(written or [])
        if rule is Rule.WRITTEN_OR_KEEP and not given(written):
            return None
        return written
    if rule is Rule.KEY or rule is Rule.ON_CREATE:
        return stored
    if rule is Rule.TAKE_WRITTEN:
        return written
    if rule is Rule.WRITTEN_OR_KEEP:
        return written if given(written) else stored
    if rule is Rule.FIRST_SET:
        return written if stored is None else stored
    return unique([*(stored or []), *(written or [])])  # Rule.UNION


def merged_values(
    rules: Rules, stored: Mapping[str, Any] | None, written: Mapping[str, Any]
) -> dict[str, Any]:
    """The fields of ``rules`` that ``written`` holds, after the write (``stored``: the
    stored record's fields, None when the write creates it)."""
    return {
        name: applied(
            rule,
            None if stored is None else stored.get(name),
            written[name],
            created=stored is None,
        )
        for name, rule in rules.items()
        if name in written
    }


def set_clause(
    rules: Rules,
    *,
    target: Callable[[str], str],
    stored: Callable[[str], str],
    written: Callable[[str], str],
    union: Callable[[str, str], str] | None = None,
) -> list[str]:
    """The assignments of a statement's SET clause that apply ``rules`` to a stored record,
    one per field a write may change (``updated_fields``), in SQL or Cypher alike (both have
    ``coalesce``): ``target(name)`` is what is assigned, ``stored(name)`` and
    ``written(name)`` the expressions of the stored and the written value, ``union(stored,
    written)`` that of a set union (a language without one has no UNION field). The names
    are the table's: nothing of a write reaches the text."""
    clauses = []
    for name in updated_fields(rules):
        rule, old, new = rules[name], stored(name), written(name)
        if rule is Rule.TAKE_WRITTEN:
            value = new
        elif rule is Rule.WRITTEN_OR_KEEP:
            value = f"coalesce({new}, {old})"
        elif rule is Rule.FIRST_SET:
            value = f"coalesce({old}, {new})"
        elif union is not None:
            value = union(old, new)
        else:
            raise ValueError(f"{name}: a union, which this statement's language cannot say")
        clauses.append(f"{target(name)} = {value}")
    return clauses


def create_clause(
    rules: Rules, *, target: Callable[[str], str], written: Callable[[str], str]
) -> list[str]:
    """The assignments that set the fields of ``rules`` set only when a record is created
    (``Rule.ON_CREATE``; the fields a write may change are set by ``set_clause`` on a create
    too)."""
    return [
        f"{target(name)} = {written(name)}"
        for name, rule in rules.items()
        if rule is Rule.ON_CREATE
    ]


# ----------------------------------------------------------------------------- on records
def merged_entity(
    stored: EntityRecord | None, written: EntityRecord, now: datetime
) -> EntityRecord:
    """``stored`` (None: not stored yet) after an upsert of ``written`` (its labels cleaned:
    ``rows.clean_labels``; no creation time: ``now``)."""
    return _merged(
        EntityRecord,
        ENTITY,
        stored,
        written,
        labels=clean_labels(written.labels),
        created_at=utc(written.created_at or now),
        community_uuid=None,  # not the upsert's: the store's (``write_communities``)
    )


def merged_fact(stored: FactRecord | None, written: FactRecord, now: datetime) -> FactRecord:
    """``stored`` (None: not stored yet) after a write of ``written`` (no creation time:
    ``now``)."""
    return _merged(FactRecord, FACT, stored, written, created_at=utc(written.created_at or now))


def closed_fact(stored: FactRecord, closure: FactClosure) -> FactRecord:
    """``stored`` after ``closure``."""
    return _merged(FactRecord, CLOSURE, stored, closure)


def merged_episode(
    stored: EpisodeRecord | None, written: EpisodeRecord, now: datetime
) -> EpisodeRecord:
    """``stored`` (None: not stored yet) after its marker is written again (no creation
    time: ``now``)."""
    return _merged(
        EpisodeRecord, EPISODE, stored, written, created_at=utc(written.created_at or now)
    )


def _same(value: Any) -> Any:
    return value


def _copied(value: Any) -> Any:
    return None if value is None else list(value)


def _utc(value: Any) -> Any:
    return None if value is None else utc(value)


def _utcs(value: Any) -> Any:
    return None if value is None else [utc(t) for t in value]


def _normal(name: str) -> Callable[[Any], Any]:
    """How a written field is held: times aware UTC, sequences as fresh lists (nothing shared
    with the caller's record)."""
    if name in TIME_FIELDS:
        return _utc
    if name in TIME_LIST_FIELDS:
        return _utcs
    if name in _LIST_FIELDS:
        return _copied
    return _same


_LIST_FIELDS = frozenset(
    {"labels", "aliases", "episodes", "created_entities"}
    | {"name_embedding", "fact_embedding", "content_embedding"}
)
_MISSING = object()

# Per table, what a write to a stored record may change: (field, its rule, its normal form),
# worked out once (the batch view applies these on every write).
_UPDATES: dict[int, tuple[tuple[str, Rule, Callable[[Any], Any]], ...]] = {
    id(rules): tuple((name, rules[name], _normal(name)) for name in updated_fields(rules))
    for rules in RULES.values()
}
_CREATES: dict[int, tuple[tuple[str, Rule, Callable[[Any], Any]], ...]] = {
    id(rules): tuple((name, rule, _normal(name)) for name, rule in rules.items())
    for rules in RULES.values()
}

_Record = TypeVar("_Record", EntityRecord, FactRecord, EpisodeRecord)


def _merged(
    kind: type[_Record], rules: Rules, stored: _Record | None, written: Any, **given: Any
) -> _Record:
    """``stored`` after ``written`` (a record, or a closure), with ``given`` values taken
    instead of the written ones."""
    if stored is None:
        fields = kind.model_fields
        created: dict[str, Any] = {}
        for name, rule, normal in _CREATES[id(rules)]:
            value = given[name] if name in given else getattr(written, name, _MISSING)
            if value is _MISSING:  # a field of the write the record does not hold
                continue
            new = applied(rule, None, normal(value), created=True)
            if new is None:  # the record's default ("" for a summary, [] for a history)
                factory = fields[name].default_factory
                new = factory() if factory is not None else fields[name].default  # type: ignore[call-arg]
            created[name] = new
        extra = {name: v for name, v in given.items() if name not in rules}
        # the written record with the values created (a copy: validated already)
        created.update(extra)
        return updated(written, created)
    changed: dict[str, Any] = {}
    for name, rule, normal in _UPDATES[id(rules)]:
        value = given[name] if name in given else getattr(written, name, _MISSING)
        if value is not _MISSING:
            changed[name] = applied(rule, getattr(stored, name), normal(value), created=False)
    return updated(stored, changed)
