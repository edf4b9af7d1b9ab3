"""The embedded store's reads shared by its methods (``store``) and its search (``search``):
the columns each record is read with, the records built from rows (by
``store.rows``, as for Neo4j) and the as-of read of facts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import EntityRecord, EpisodeRecord, FactRecord
from tidegraph.stores.rows import unique
from tidegraph.stores.sqlite.db import json_list, json_text, micros, time_of, times_of, vector_of
from tidegraph.stores.sqlite.driver import sqlite3

# A JSON array parameter as a set of values: ``IN (SELECT value FROM json_each(?))``.
IN_LIST = "IN (SELECT value FROM json_each(?))"
COMMUNITY_OF = (
    "(SELECT min(m.community_uuid) FROM member m "
    "WHERE m.entity_uuid = e.uuid AND +m.group_id = e.group_id) AS community_uuid"
)
ENTITY = "e.uuid, e.group_id, e.name, e.labels, e.summary, e.key, e.aliases, e.created_at"
ENTITY_FULL = f"{ENTITY}, e.name_embedding, {COMMUNITY_OF}"
ENTITY_HIT = f"{ENTITY}, NULL AS name_embedding, {COMMUNITY_OF}"  # ENTITY_FULL without it
FACT = (
    "f.uuid, f.group_id, f.source_uuid, f.target_uuid, f.name, f.fact, f.episodes, f.valid_at, "
    "f.invalid_at, f.created_at, f.expired_at, f.cardinality, f.prior_ends, "
    "f.prior_ends_learned_at, f.end_learned_at, f.prior_starts, f.prior_starts_learned_at, "
    "f.start_learned_at"
)
FACT_FULL = f"{FACT}, f.fact_embedding"
FACT_ENDS = "f.uuid, f.group_id, f.source_uuid, f.target_uuid"  # ``ends_of``
EPISODE = (
    "ep.uuid, ep.group_id, ep.name, ep.source, ep.source_description, ep.content, ep.valid_at, "
    "ep.created_at, ep.producer_id, ep.content_hash, ep.not_extracted"
)


# ----------------------------------------------------------------------------- rows -> records
# Each builds its record field by field from the row's columns (times are microseconds since
# the epoch, lists JSON, vectors blobs): a search builds a few hundred, and the generic
# ``stores.rows`` builders (for either store's values) cost a quarter more. An optional column
# not read (an embedding, the extraction) is left at its default.
def entity_of(row: sqlite3.Row) -> EntityRecord:
    return EntityRecord(
        uuid=row["uuid"],
        group_id=row["group_id"],
        name=row["name"],
        labels=json_list(row["labels"]),
        summary=row["summary"] or "",
        key=row["key"],
        aliases=json_list(row["aliases"]),
        name_embedding=vector_of(_optional(row, "name_embedding")),
        created_at=time_of(row["created_at"]),
        community_uuid=_optional(row, "community_uuid"),
    )


def fact_of(row: sqlite3.Row) -> FactRecord:
    return FactRecord(
        uuid=row["uuid"],
        group_id=row["group_id"],
        source_uuid=row["source_uuid"],
        target_uuid=row["target_uuid"],
        name=row["name"],
        fact=row["fact"],
        fact_embedding=vector_of(_optional(row, "fact_embedding")),
        episodes=json_list(row["episodes"]),
        valid_at=time_of(row["valid_at"]),
        invalid_at=time_of(row["invalid_at"]),
        created_at=time_of(row["created_at"]),
        expired_at=time_of(row["expired_at"]),
        cardinality=row["cardinality"],
        prior_ends=times_of(row["prior_ends"]),
        prior_ends_learned_at=times_of(row["prior_ends_learned_at"]),
        end_learned_at=time_of(row["end_learned_at"]),
        prior_starts=times_of(row["prior_starts"]),
        prior_starts_learned_at=times_of(row["prior_starts_learned_at"]),
        start_learned_at=time_of(row["start_learned_at"]),
    )


def episode_of(row: sqlite3.Row) -> EpisodeRecord:
    return EpisodeRecord(
        uuid=row["uuid"],
        group_id=row["group_id"],
        name=row["name"],
        source=row["source"],
        source_description=row["source_description"],
        content=row["content"],
        valid_at=time_of(row["valid_at"]),
        created_at=time_of(row["created_at"]),
        producer_id=row["producer_id"] or "",
        content_hash=row["content_hash"] or "",
        content_embedding=vector_of(_optional(row, "content_embedding")),
        not_extracted=row["not_extracted"],
        extraction=_optional(row, "extraction"),
        extracted_at=time_of(_optional(row, "extracted_at")),
    )


def _optional(row: sqlite3.Row, column: str) -> Any:
    """An optional column's value (None when the query did not read it)."""
    return row[column] if column in row.keys() else None


def believed_sql(asof: AsOf) -> tuple[str, list[Any]]:
    """A filter on ``fact f`` letting through a superset of the facts ``asof`` believes
    (``AsOf.believed`` decides each): created by the known-at time and, unless the question
    takes every fact, not started after the valid-at time nor ended by it, where the start
    or end could have moved (a history) or is not yet known then."""
    known, at = micros(asof.known_at), micros(asof.valid_at)
    if asof.include_invalid:
        return "f.created_at <= ?", [known]
    return (
        "f.created_at <= ?"
        " AND (f.valid_at IS NULL OR f.valid_at <= ? OR f.start_learned_at IS NOT NULL)"
        " AND (f.invalid_at IS NULL OR f.invalid_at > ? OR f.expired_at IS NULL"
        " OR f.expired_at > ? OR f.prior_ends IS NOT NULL)",
        [known, at, at, known],
    )


# A fact that ever had its start or end moved: only for those does ``believed_sql`` let
# through more than ``AsOf.believed`` (see there).
HISTORY = (
    "(f.prior_ends IS NOT NULL OR f.prior_starts IS NOT NULL OR f.end_learned_at IS NOT NULL "
    "OR f.start_learned_at IS NOT NULL)"
)


def believed_facts(
    conn: sqlite3.Connection,
    group_id: str,
    asof: AsOf,
    touching: Sequence[str] | None,
    ends_only: bool = False,
) -> list[FactRecord]:
    """The group's facts ``asof`` believes (without embeddings); with ``touching``, only
    those with an end among these entities; ``ends_only``: partial records (``ends_of``)."""
    ends = json_text(touching or [])
    matches = (
        [("f.group_id = ?", [group_id])]
        if touching is None
        else [
            (f"f.group_id = ? AND f.source_uuid {IN_LIST}", [group_id, ends]),
            (f"f.group_id = ? AND f.target_uuid {IN_LIST}", [group_id, ends]),
        ]
    )
    return believed_where(conn, asof, matches, ends_only)


def believed_where(
    conn: sqlite3.Connection,
    asof: AsOf,
    matches: Sequence[tuple[str, Sequence[Any]]],
    ends_only: bool = False,
) -> list[FactRecord]:
    """The facts matching any of ``matches`` (a condition on ``fact f`` and its parameters)
    that ``asof`` believes, without embeddings. ``ends_only``: partial records of the facts
    without a history (``ends_of``), which ``believed_sql`` decides exactly, so that their
    times are never converted; those with one are read whole and decided by ``AsOf``."""
    where, params = believed_sql(asof)
    columns = f"{FACT_ENDS}, {HISTORY}" if ends_only else FACT
    selects = (f"SELECT {columns} FROM fact f WHERE {match} AND {where}" for match, _ in matches)
    query = " UNION ".join(selects)
    rows = conn.execute(query, [p for _, given in matches for p in (*given, *params)])
    if not ends_only:
        return [fact for fact in map(fact_of, rows) if asof.believed(fact)]
    plain: list[FactRecord] = []
    moved: list[str] = []
    for uuid, group_id, source, target, history in rows:
        if history:
            moved.append(uuid)
        else:
            plain.append(ends_of(uuid, group_id, source, target))
    if moved:
        plain += believed_where(conn, asof, [(f"f.uuid {IN_LIST}", [json_text(moved)])])
    return plain


def ends_of(uuid: str, group_id: str, source_uuid: str, target_uuid: str) -> FactRecord:
    """A partial fact record: its ends only (what a walk and a fusion use; a search's
    candidates are read so, ``SearchScope.details``, and the hits kept read whole)."""
    return FactRecord(
        uuid=uuid,
        group_id=group_id,
        source_uuid=source_uuid,
        target_uuid=target_uuid,
        name="",
        fact="",
    )


def names_of(conn: sqlite3.Connection, uuids: Iterable[str]) -> dict[str, str]:
    query = f"SELECT uuid, name FROM entity WHERE uuid {IN_LIST}"
    return dict(conn.execute(query, (json_text(unique(uuids)),)).fetchall())


def producers_of(conn: sqlite3.Connection, group_id: str, uuids: Iterable[str]) -> dict[str, str]:
    """Producer ids of the group's episodes among ``uuids``."""
    query = (
        "SELECT uuid, producer_id FROM episode INDEXED BY episode_said "
        f"WHERE group_id = ? AND uuid {IN_LIST}"
    )
    rows = conn.execute(query, (group_id, json_text(unique(uuids))))
    return {uuid: producer or "" for uuid, producer in rows}
