"""Records to query parameters and back, the same for every store: the parameters of a write
(checked: its group, labels, embeddings), the records built from a query's rows, their order,
and the folds of the community graph. What a write does to a stored record is
stated in ``tidegraph.stores.write_rules``.

Every datetime goes in and comes out aware UTC (``to_utc`` reads what either engine returns).
Scores of vector searches are ``(1 + cos) / 2`` in [0, 1], the measure Neo4j's cosine vector
index reports: 1.0 the same direction, 0.5 orthogonal, 0.0 opposite.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from tidegraph.records.asof import AsOf, start_known_at
from tidegraph.records.changes import Change, PublishedChange, published_form, stored_form
from tidegraph.records.graph import (
    EntityRecord,
    EpisodeEntry,
    EpisodeRecord,
    FactClosure,
    FactRecord,
    FactView,
    updated,
)
from tidegraph.records.ids import LABEL_RE, normalize_name
from tidegraph.records.times import iso, utc
from tidegraph.stores.search_text import identifier_words

# Labels an entity may never get: they would make it look like another kind of node.
RESERVED_LABELS = frozenset({"Entity", "Episodic", "Community"})


def vector_candidates(limit: int) -> int:
    """How many neighbours to ask a global vector index for first, before filtering by group
    (more are asked for while too few are of the group:
    ``tidegraph.stores.neo4j.search.Neo4jSearch._nearest``)."""
    return max(limit * 4, 80)


# ----------------------------------------------------------------------------- small helpers
def unique(items: Iterable[str]) -> list[str]:
    """Items in first-seen order without duplicates."""
    return list(dict.fromkeys(items))


def clean_labels(labels: Iterable[str]) -> list[str]:
    """Labels that may become real node labels: ``LABEL_RE``-valid and not reserved.
    Anything else is dropped (never escaped into query text)."""
    return unique(
        label
        for label in labels
        if isinstance(label, str) and LABEL_RE.match(label) and label not in RESERVED_LABELS
    )


class Vector(list[float]):
    """An embedding in a statement's parameters; it prints as its size. The neo4j driver
    formats every statement's parameters for its debug log even when that log is off (neo4j
    6.4, ``AsyncBolt5x5.run``): printing 384 numbers costs about 0.1 ms, for each embedding
    of each write. Both drivers send it as the plain list it is."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<vector of {len(self)} numbers>"


def check_embedding(embedding: Sequence[float] | None, dim: int, what: str) -> Vector | None:
    """The embedding as a list of floats, after checking its size and that it has a
    direction (cosine is undefined for the zero vector). None stays None."""
    if embedding is None:
        return None
    values = Vector(map(float, embedding))
    if len(values) != dim:
        raise ValueError(f"{what} has {len(values)} dimensions; the store was set up with {dim}")
    # A finite sum means finite values (an infinity or a NaN makes the sum infinite or NaN);
    # only a sum that overflows is checked value by value. 1.7 µs instead of 5.4 for 384.
    finite = math.isfinite(sum(values)) or all(map(math.isfinite, values))
    if not finite or not any(values):
        raise ValueError(f"{what} must be finite and non-zero")
    return values


def cosine_score(cos: float) -> float:
    """``(1 + cos) / 2`` clamped to [0, 1]."""
    return min(1.0, max(0.0, (1.0 + cos) / 2.0))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_utc(value: Any) -> datetime | None:
    """A datetime from either store as an aware UTC datetime (the Neo4j driver returns its
    own DateTime; an int is microseconds since the epoch, as ``epoch_micros`` projects it and
    the embedded store keeps times)."""
    if value is None:
        return None
    if isinstance(value, int):
        return _EPOCH + timedelta(microseconds=value)
    if hasattr(value, "to_native"):
        value = value.to_native()
    if not isinstance(value, datetime):
        raise TypeError(f"expected a datetime, got {type(value).__name__}")
    return utc(value)


def now_utc() -> datetime:
    return datetime.now(UTC)


# ----------------------------------------------------------------------------- rows out
def same_group(group_id: str, record_group: str, what: str) -> None:
    """A record handed to a write of ``group_id`` must say it belongs there."""
    if record_group != group_id:
        raise ValueError(f"{what} belongs to group {record_group!r}, not {group_id!r}")


def entity_ids(name: str, summary: str | None, key: str | None) -> str:
    """An entity's identifier words (of its name, summary and key), as the Neo4j store
    indexes them (``index_ids``)."""
    return " ".join(identifier_words(f"{name} {summary or ''} {key or ''}"))


def entity_row(group_id: str, entity: EntityRecord, dim: int, now: datetime) -> dict[str, Any]:
    """The parameters of one entity upsert (aware UTC datetimes)."""
    same_group(group_id, entity.group_id, f"entity {entity.uuid}")
    summary = entity.summary if entity.summary.strip() else None
    return {
        "uuid": entity.uuid,
        "name": entity.name,
        "name_norm": normalize_name(entity.name),
        "labels": clean_labels(entity.labels),
        "summary": summary,
        "key": entity.key,
        "index_ids": entity_ids(entity.name, summary, entity.key),
        "aliases": unique(entity.aliases),
        "name_embedding": check_embedding(
            entity.name_embedding, dim, f"name_embedding of entity {entity.uuid}"
        ),
        "created_at": utc(entity.created_at) if entity.created_at else now,
    }


def fact_row(group_id: str, fact: FactRecord, dim: int, now: datetime) -> dict[str, Any]:
    same_group(group_id, fact.group_id, f"fact {fact.uuid}")
    return {
        "uuid": fact.uuid,
        "source_uuid": fact.source_uuid,
        "target_uuid": fact.target_uuid,
        "name": fact.name,
        "fact": fact.fact,
        "index_ids": " ".join(identifier_words(fact.fact)),
        "fact_embedding": check_embedding(
            fact.fact_embedding, dim, f"fact_embedding of fact {fact.uuid}"
        ),
        "episodes": list(fact.episodes),
        "valid_at": opt_utc(fact.valid_at),
        "invalid_at": opt_utc(fact.invalid_at),
        "created_at": utc(fact.created_at) if fact.created_at else now,
        "expired_at": opt_utc(fact.expired_at),
        "cardinality": fact.cardinality,
        **end_history_row(fact.prior_ends, fact.prior_ends_learned_at, fact.end_learned_at),
        **_history_row(
            "start", fact.prior_starts, fact.prior_starts_learned_at, fact.start_learned_at
        ),
    }


def end_history_row(
    prior_ends: Sequence[datetime],
    prior_ends_learned_at: Sequence[datetime],
    end_learned_at: datetime | None,
) -> dict[str, Any]:
    """A fact's end history as parameters: None where there is none, which the writes read
    as "leave what is stored" (a history only grows)."""
    return _history_row("end", prior_ends, prior_ends_learned_at, end_learned_at)


def _history_row(
    kind: str, prior: Sequence[datetime], learned: Sequence[datetime], current: datetime | None
) -> dict[str, Any]:
    """``prior_{kind}s``, ``prior_{kind}s_learned_at`` and ``{kind}_learned_at`` (``kind``:
    start or end) as parameters, None where there is none."""
    if not prior and not learned and current is None:  # nearly always: no history
        return {
            f"prior_{kind}s": None,
            f"prior_{kind}s_learned_at": None,
            f"{kind}_learned_at": None,
        }
    if len(prior) != len(learned):
        raise ValueError(f"prior_{kind}s and prior_{kind}s_learned_at differ in length")
    return {
        f"prior_{kind}s": [utc(t) for t in prior] or None,
        f"prior_{kind}s_learned_at": [utc(t) for t in learned] or None,
        f"{kind}_learned_at": opt_utc(current),
    }


def episode_row(
    group_id: str, episode: EpisodeRecord, dim: int, now: datetime, created: Sequence[str] = ()
) -> dict[str, Any]:
    """The parameters of an episode's marker; ``created``: the entities it creates."""
    same_group(group_id, episode.group_id, f"episode {episode.uuid}")
    return {
        "uuid": episode.uuid,
        "name": episode.name,
        "source": episode.source,
        "source_description": episode.source_description,
        "content": episode.content,
        "valid_at": utc(episode.valid_at),
        "created_at": utc(episode.created_at) if episode.created_at else now,
        "producer_id": episode.producer_id,
        "content_hash": episode.content_hash or None,
        "created_entities": unique(created),
        "not_extracted": episode.not_extracted,
        "content_embedding": check_embedding(
            episode.content_embedding, dim, f"content_embedding of episode {episode.uuid}"
        ),
        "extraction": episode.extraction,
        "extracted_at": opt_utc(episode.extracted_at),
    }


# ---- the change outbox: one row per write of a group
# A row holds the changes one write commits for one group (one transaction: a unit of
# episodes, a forget), numbered ``seq`` (its first) to ``last``: line i of its
# ``change_id``, ``kind``, ``uuid`` and ``body`` is change ``seq + i`` (a stored form has no
# newline: JSON escapes it; ids and group ids have no control characters). A change a forget
# purged is a blank line in each (``held``): its number stays unused, as a deleted row's did.
# A row written before rows held several changes is a row of one (``last`` = ``seq``).
LINE = "\n"


def outbox_row(group_id: str, changes: Sequence[Change]) -> dict[str, Any]:
    """One write's changes as the outbox keeps them (``n`` of them; the store numbers them
    when it commits), kept until the last of them is past its retention (``committed_at``:
    microseconds since the epoch, 0 unknown)."""
    return {
        "group_id": group_id,
        "n": len(changes),
        "change_id": LINE.join(c.change_id for c in changes),
        "kind": LINE.join(c.kind for c in changes),
        "uuid": LINE.join(c.uuid for c in changes),
        "body": LINE.join(stored_form(c) for c in changes),
        "committed_at": max((epoch_micros(c.committed_at) for c in changes), default=0),
        "records": sorted({c.uuid for c in changes}),  # the index of records (Neo4j)
    }


def joined_outbox_rows(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The outbox rows of several writes of one group (``outbox_row``, in order) as one."""
    held = [row for row in rows if row["n"]]
    joined = {
        column: LINE.join(row[column] for row in held)
        for column in ("change_id", "kind", "uuid", "body")
    }
    return {
        **rows[0],
        **joined,
        "n": sum(row["n"] for row in held),
        "records": sorted({uuid for row in held for uuid in row["records"]}),
        "committed_at": max((row["committed_at"] for row in held), default=0),
    }


def by_record(row: dict[str, Any]) -> dict[str, Any]:
    """An outbox row (``outbox_row``) as the Neo4j store keeps it: the changes' bodies not in
    one column but by record (``parts``: each record's lines, in order), on the entries of
    the index of records; so that a forget deletes its records' bodies with their entries
    instead of writing a row of a write unit's changes again whole."""
    found: dict[str, list[str]] = {}
    for uuid, body in zip(row["uuid"].split(LINE), row["body"].split(LINE), strict=True):
        if held(uuid):
            found.setdefault(uuid, []).append(body)
    kept = {k: v for k, v in row.items() if k not in ("body", "records")}
    return {**kept, "parts": [{"uuid": u, "body": LINE.join(b)} for u, b in found.items()]}


def joined_body(uuids: str, parts: Sequence[Sequence[str]]) -> str:
    """The body column of a Neo4j outbox row from its records' bodies (``by_record``;
    ``parts``: [uuid, body]): line i is the next line of the body of the record on line i of
    ``uuids``; a purged line (its record's body gone) is empty."""
    lines = {uuid: iter(body.split(LINE)) for uuid, body in parts}
    return LINE.join(next(lines[uuid], "") if uuid in lines else "" for uuid in uuids.split(LINE))


def held(line: str) -> bool:
    """Whether a line of an outbox row still holds a change: a purged one is blank (empty,
    or spaces: ``purged_row``)."""
    return not (line == "" or line.isspace())


def held_records(uuids: str) -> list[str]:
    """The records an outbox row's ``uuid`` column still holds changes of (each once)."""
    return sorted({uuid for uuid in uuids.split(LINE) if held(uuid)})


def stored_changes(seq: int, change_ids: str, bodies: str) -> list[tuple[int, str, str]]:
    """The changes an outbox row starting at ``seq`` still holds: (seq, change_id, body)."""
    lines = zip(change_ids.split(LINE), bodies.split(LINE), strict=True)
    return [(seq + i, cid, body) for i, (cid, body) in enumerate(lines) if held(body)]


def purged_row(row: dict[str, Any], purged: set[str]) -> dict[str, Any] | None:
    """An outbox row (``change_id``, ``kind``, ``uuid``, ``body``) without the changes of
    records ``purged``, None when it then holds none; ``row`` itself when it holds none of
    theirs. Their lines are blanked, not removed: each becomes as many spaces as it had bytes
    (UTF-8), so every column keeps its size. The embedded store then overwrites the row in
    place, writing only the pages those lines were on (SQLite rewrites a row of the same size
    page by page, and leaves the pages that did not change alone), not the whole row: a row is
    a write unit's changes, on the order of 150 kB, and a subject's forget purges lines of
    dozens of them."""
    uuids = row["uuid"].split(LINE)
    gone = [u in purged for u in uuids]
    if not any(gone):
        return row
    bodies = row["body"].split(LINE)
    if all(g or not held(body) for g, body in zip(gone, bodies, strict=True)):
        return None
    blanked = {
        column: LINE.join(
            " " * len(line.encode()) if g else line for g, line in zip(gone, lines, strict=True)
        )
        for column, lines in (
            ("change_id", row["change_id"].split(LINE)),
            ("kind", row["kind"].split(LINE)),
            ("uuid", uuids),
            ("body", bodies),
        )
    }
    return {**row, **blanked}


def epoch_micros(value: datetime | None) -> int:
    if value is None:
        return 0
    since = utc(value) - datetime(1970, 1, 1, tzinfo=UTC)
    return (since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds


def change_of(body: str, seq: int) -> Change:
    return Change.model_validate_json(body).model_copy(update={"seq": seq})


def row_changes(seq: int, change_ids: str, bodies: str, after: int) -> list[Change]:
    """The changes of an outbox row numbered past ``after``."""
    return [change_of(b, s) for s, _, b in stored_changes(seq, change_ids, bodies) if s > after]


def row_published(
    group_id: str, seq: int, change_ids: str, bodies: str, after: int
) -> list[PublishedChange]:
    """The changes of an outbox row numbered past ``after`` as the relay publishes them."""
    return [
        PublishedChange(group_id, s, published_form(b, s), cid)
        for s, cid, b in stored_changes(seq, change_ids, bodies)
        if s > after
    ]


def closure_row(closure: FactClosure) -> dict[str, Any]:
    return {
        "uuid": closure.uuid,
        "invalid_at": utc(closure.invalid_at),
        "expired_at": utc(closure.expired_at),
        **end_history_row(
            closure.prior_ends, closure.prior_ends_learned_at, closure.end_learned_at
        ),
    }


def opt_utc(value: datetime | None) -> datetime | None:
    """``utc`` of a time that may be missing (None stays None)."""
    return None if value is None else utc(value)


def community_rows(
    upserts: Sequence[Any], dim: int, now: datetime
) -> tuple[list[dict[str, Any]], list[dict[str, str]], list[str]]:
    """(community rows, membership rows, member uuids) for ``write_communities``; a member
    listed by two upserts stays with the last one."""
    owner: dict[str, str] = {}
    rows = []
    for c in upserts:
        embedding = check_embedding(c.name_embedding, dim, "community name embedding")
        rows.append(
            {
                "uuid": c.uuid,
                "name": c.name,
                "summary": c.summary,
                "name_embedding": embedding,
                "created_at": utc(c.created_at) if c.created_at else now,  # on create only
            }
        )
        for member in c.members:
            owner[member] = c.uuid
    members = sorted(owner)
    return rows, [{"community": owner[m], "entity": m} for m in members], members


# ----------------------------------------------------------------------------- rows back
# A fact's end and start history (``FactRecord.prior_ends`` ...): a write without it keeps
# what is stored.
HISTORY_FIELDS = (
    "prior_ends",
    "prior_ends_learned_at",
    "end_learned_at",
    "prior_starts",
    "prior_starts_learned_at",
    "start_learned_at",
)
ENTITY_FIELDS = (
    "uuid",
    "group_id",
    "name",
    "labels",
    "summary",
    "key",
    "aliases",
    "name_embedding",
    "created_at",
)
FACT_FIELDS = (
    "uuid",
    "group_id",
    "name",
    "fact",
    "fact_embedding",
    "episodes",
    "valid_at",
    "invalid_at",
    "created_at",
    "expired_at",
    "cardinality",
    *HISTORY_FIELDS,
)
EPISODE_FIELDS = (
    "uuid",
    "group_id",
    "name",
    "source",
    "source_description",
    "content",
    "valid_at",
    "created_at",
    "producer_id",
    "content_hash",
    "not_extracted",
    "content_embedding",
    "extraction",
    "extracted_at",
)
# The fields that hold a time, and those that hold a list of times (how each store encodes
# them: ``with_epoch_times``, ``sqlite.write_sql``).
TIME_FIELDS = frozenset(
    {
        "valid_at",
        "invalid_at",
        "created_at",
        "expired_at",
        "end_learned_at",
        "start_learned_at",
        "extracted_at",
    }
)
TIME_LIST_FIELDS = frozenset(
    {"prior_ends", "prior_ends_learned_at", "prior_starts", "prior_starts_learned_at"}
)


def epoch_pair(value: datetime) -> list[int]:
    """An aware datetime as [seconds since the epoch, nanoseconds] (floored: the nanoseconds
    are never negative), as ``datetime.fromepoch`` takes it in Cypher."""
    since = value - _EPOCH
    return [since.days * 86400 + since.seconds, since.microseconds * 1000]


def with_epoch_times(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its time fields (``TIME_FIELDS``, ``TIME_LIST_FIELDS``) as epoch pairs,
    for the Neo4j statements that read them back with ``datetime.fromepoch``: the neo4j driver
    packs a Python datetime in pure Python, about 15 µs each, a tenth of the client's CPU on
    the mapped path; two ints cost it nothing. Other fields are left as they are."""
    out = dict(row)
    for name, value in row.items():
        if value is None:
            continue
        if name in TIME_FIELDS:
            out[name] = epoch_pair(value)
        elif name in TIME_LIST_FIELDS:
            out[name] = [epoch_pair(v) for v in value]
    return out


def _clean(props: dict[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in fields:
        value = props.get(name)
        if name in TIME_FIELDS:
            value = to_utc(value)
        elif name in TIME_LIST_FIELDS:
            value = None if value is None else [to_utc(v) for v in value]
        elif isinstance(value, tuple):
            value = list(value)
        if value is not None:
            out[name] = value
    return out


def entity_record(props: dict[str, Any], community_uuid: str | None = None) -> EntityRecord:
    data = _clean(props, ENTITY_FIELDS)
    data.setdefault("summary", "")
    return EntityRecord(**data, community_uuid=community_uuid)


def fact_record(props: dict[str, Any], source_uuid: str, target_uuid: str) -> FactRecord:
    return FactRecord(
        **_clean(props, FACT_FIELDS), source_uuid=source_uuid, target_uuid=target_uuid
    )


def fact_of(row: dict[str, Any]) -> FactRecord:
    """The fact of a row with ``r``, ``source_uuid`` and ``target_uuid``."""
    return fact_record(row["r"], row["source_uuid"], row["target_uuid"])


def episode_record(props: dict[str, Any]) -> EpisodeRecord:
    data = _clean(props, EPISODE_FIELDS)
    data.setdefault("producer_id", "")
    return EpisodeRecord(**data)


def sort_entities(entities: Iterable[EntityRecord]) -> list[EntityRecord]:
    return sorted(entities, key=lambda e: (e.name, e.uuid))


def sort_facts(facts: Iterable[FactRecord]) -> list[FactRecord]:
    return sorted(facts, key=lambda f: (_time_key(f.valid_at), f.uuid))


def rank(hits: Iterable[tuple[Any, float]], limit: int) -> list[tuple[Any, float]]:
    """Records with scores: best first, ties by uuid, at most ``limit``."""
    return sorted(hits, key=lambda h: (-h[1], h[0].uuid))[: max(limit, 0)]


def top(hits: Iterable[tuple[str, float]], limit: int) -> list[tuple[str, float]]:
    """(uuid, score) pairs: best first, ties by uuid, at most ``limit``."""
    return sorted(hits, key=lambda h: (-h[1], h[0]))[: max(limit, 0)]


def _time_key(value: datetime | None) -> tuple[int, datetime]:
    # None (an open start) sorts first.
    return (0, datetime.min.replace(tzinfo=UTC)) if value is None else (1, value)


def fact_view(
    fact: FactRecord, subject: str, obj: str, producers: dict[str, str], asof: AsOf
) -> FactView:
    """A fact as believed at ``asof.known_at``: an end the store had not learned by then is
    shown as unknown, a start that moved since as it was then. Episodes are producer ids
    (the episode uuid when none is stored)."""
    invalid_at, expired_at = asof.known_end(fact)
    return FactView(
        uuid=fact.uuid,
        subject=subject,
        relation=fact.name,
        object=obj,
        fact=fact.fact,
        valid_at=iso(start_known_at(fact, asof.known_at)),
        invalid_at=iso(invalid_at),
        created_at=iso(fact.created_at),
        expired_at=iso(expired_at),
        episodes=[producers.get(u) or u for u in fact.episodes],
    )


def sort_views(views: Iterable[tuple[FactView, FactRecord]]) -> list[FactView]:
    """Ordered by subject, relation, valid_at (open start first), uuid."""
    ordered = sorted(
        views, key=lambda v: (v[0].subject, v[0].relation, _time_key(v[1].valid_at), v[0].uuid)
    )
    return [view for view, _ in ordered]


def fold_edges(rows: Iterable[Sequence[Any]]) -> list[tuple[str, str, int]]:
    """(source, target, count) rows → undirected (a < b) weighted pairs, sorted."""
    weights: dict[tuple[str, str], int] = {}
    for source, target, count in rows:
        if source == target:
            continue
        pair = (source, target) if source < target else (target, source)
        weights[pair] = weights.get(pair, 0) + int(count)
    return [(a, b, w) for (a, b), w in sorted(weights.items())]


def neighbour_weights_of(entity_uuid: str, rows: Iterable[Sequence[Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a, b, w in fold_edges(rows):
        other = b if a == entity_uuid else a if b == entity_uuid else None
        if other is not None:
            out[other] = out.get(other, 0) + w
    return dict(sorted(out.items()))


def fold_communities(
    heads: Iterable[Sequence[Any]], memberships: Iterable[Sequence[Any]]
) -> list[tuple[str, str, str, list[str]]]:
    members: dict[str, list[str]] = {}
    for community, entity in memberships:
        members.setdefault(community, []).append(entity)
    return sorted(
        (uuid, name or "", summary or "", sorted(set(members.get(uuid, []))))
        for uuid, name, summary in heads
    )


def page_of(
    entries: Iterable[EpisodeEntry],
    since: datetime | None,
    until: datetime | None,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[EpisodeEntry]:
    """One page of an episode listing (``GraphStore.list_episodes``), from its entries in
    any order: in the range, after the position, by (valid_at, uuid)."""
    low, high = (utc(since) if since else None), (utc(until) if until else None)
    kept = [
        e
        for e in entries
        if e.valid_at is not None
        and (low is None or e.valid_at >= low)
        and (high is None or e.valid_at < high)
        and (after is None or (e.valid_at, e.uuid) > (utc(after[0]), after[1]))
    ]
    kept.sort(key=lambda e: (e.valid_at, e.uuid))
    return kept[: max(limit, 0)]


_Record = TypeVar("_Record", EntityRecord, FactRecord)


def copied(record: _Record, **update: Any) -> _Record:
    """A copy that shares nothing a caller may change: the records' fields are immutable
    values or lists of them, so fresh lists make it as good as a deep copy (and several times
    cheaper than one, for a 384-number embedding)."""
    fields = record.__dict__
    lists = {
        k: v.copy()
        for k in _list_fields(type(record))
        if k not in update and (v := fields[k]) is not None
    }
    lists.update(update)
    return updated(record, lists)


@functools.cache
def _list_fields(kind: type[EntityRecord | FactRecord]) -> tuple[str, ...]:
    """The fields of ``kind`` that hold a list (or None)."""
    return tuple(
        name
        for name, field in kind.model_fields.items()
        if typing.get_origin(field.annotation) is list
        or (
            typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
            and any(typing.get_origin(a) is list for a in typing.get_args(field.annotation))
        )
    )
