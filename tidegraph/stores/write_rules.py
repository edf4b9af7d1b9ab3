"""The write rules, on records: what a stored entity or fact becomes when an upsert, a fact
write or a closure is applied to it (``GraphStore.upsert_entities`` and ``write_episode``
state them).

This is the one definition in Python. The batch view (``tidegraph.pipelines.batch_view``)
applies a unit's writes in memory with it, and so does the in-memory test store; the Neo4j and
SQLite stores say the same in their query text, and the store contract suite
(tests/integration/test_store_contract.py) checks every store against these rules.

- An entity keeps its name, creation time and name embedding; gains labels and aliases (set
  union, in order); takes a non-empty summary; keeps a key once set.
- A fact takes the written state but keeps its ``created_at`` and its first ``expired_at``;
  a write without an embedding or without a history keeps the stored one (a history only
  grows).
- A closure sets ``invalid_at``, the end history it carries, and ``expired_at`` only while
  it is unset.
"""

from __future__ import annotations

from datetime import datetime

from tidegraph.records.graph import EntityRecord, FactClosure, FactRecord
from tidegraph.records.times import utc
from tidegraph.stores.rows import clean_labels, unique

# A fact's end and start history: a write that carries none keeps what is stored.
HISTORIES = ("end", "start")


def merged_entity(
    stored: EntityRecord | None, written: EntityRecord, now: datetime
) -> EntityRecord:
    """``stored`` (None: not stored yet) after an upsert of ``written``."""
    labels = clean_labels(written.labels)
    aliases = unique(written.aliases)
    summary = written.summary if written.summary.strip() else None
    if stored is None:
        return EntityRecord(
            uuid=written.uuid,
            group_id=written.group_id,
            name=written.name,
            labels=labels,
            summary=summary or "",
            key=written.key,
            aliases=aliases,
            name_embedding=written.name_embedding,
            created_at=utc(written.created_at) if written.created_at else now,
        )
    return stored.model_copy(
        update={
            "labels": unique([*stored.labels, *labels]),
            "aliases": unique([*stored.aliases, *aliases]),
            "summary": summary if summary is not None else stored.summary,
            "key": stored.key if stored.key is not None else written.key,
        }
    )


def merged_fact(stored: FactRecord | None, written: FactRecord, now: datetime) -> FactRecord:
    """``stored`` (None: not stored yet) after a write of ``written``."""
    state = written.model_copy(
        update={
            "episodes": list(written.episodes),
            "valid_at": _opt_utc(written.valid_at),
            "invalid_at": _opt_utc(written.invalid_at),
            "fact_embedding": written.fact_embedding
            or (stored.fact_embedding if stored is not None else None),
        }
    )
    if stored is None:
        state.created_at = utc(written.created_at) if written.created_at else now
        state.expired_at = _opt_utc(written.expired_at)
    else:
        state.group_id = stored.group_id
        state.created_at = stored.created_at
        state.expired_at = stored.expired_at or _opt_utc(written.expired_at)
    for kind in HISTORIES:
        _history(state, written, stored, kind)
    return state


def closed_fact(stored: FactRecord, closure: FactClosure) -> FactRecord:
    """``stored`` after ``closure``."""
    closed = stored.model_copy(update={"invalid_at": utc(closure.invalid_at)})
    if closure.prior_ends:
        closed.prior_ends = [utc(t) for t in closure.prior_ends]
    if closure.prior_ends_learned_at:
        closed.prior_ends_learned_at = [utc(t) for t in closure.prior_ends_learned_at]
    if closure.end_learned_at is not None:
        closed.end_learned_at = utc(closure.end_learned_at)
    if closed.expired_at is None:
        closed.expired_at = utc(closure.expired_at)
    return closed


def _history(state: FactRecord, written: FactRecord, stored: FactRecord | None, kind: str) -> None:
    """The written ``kind`` history (start or end) where it has one, else the stored one."""
    for name in (f"prior_{kind}s", f"prior_{kind}s_learned_at"):
        value = getattr(written, name)
        if value:
            setattr(state, name, [utc(t) for t in value])
        else:
            setattr(state, name, list(getattr(stored, name)) if stored is not None else [])
    current = f"{kind}_learned_at"
    value = getattr(written, current)
    if value is not None:
        setattr(state, current, utc(value))
    else:
        setattr(state, current, getattr(stored, current) if stored is not None else None)


def _opt_utc(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value)
