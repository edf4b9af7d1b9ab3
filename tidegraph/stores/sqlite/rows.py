"""The embedded store's reads shared by its methods (``store``) and its search (``search``):
the columns each record is read with, the records built from rows (by
``store.rows``, as for Neo4j) and the as-of read of facts."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from tidegraph.records.asof import AsOf
from tidegraph.records.graph import EntityRecord, EpisodeRecord, FactRecord
from tidegraph.stores.rows import entity_record, episode_record, fact_record, unique
from tidegraph.stores.sqlite.db import json_list, json_text, micros, vector_of

# A JSON array parameter as a set of values: ``IN (SELECT value FROM json_each(?))``.
IN_LIST = "IN (SELECT value FROM json_each(?))"
COMMUNITY_OF = (
    "(SELECT min(m.community_uuid) FROM member m "
    "WHERE m.entity_uuid = e.uuid AND m.group_id = e.group_id) AS community_uuid"
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
EPISODE = (
    "ep.uuid, ep.group_id, ep.name, ep.source, ep.source_description, ep.content, ep.valid_at, "
    "ep.created_at, ep.producer_id, ep.content_hash, ep.not_extracted"
)
_TIME_LISTS = ("prior_ends", "prior_ends_learned_at", "prior_starts", "prior_starts_learned_at")


# ----------------------------------------------------------------------------- rows -> records
def entity_of(row: sqlite3.Row) -> EntityRecord:
    props = dict(row)
    props["labels"] = json_list(props["labels"])
    props["aliases"] = json_list(props["aliases"])
    if "name_embedding" in props:
        props["name_embedding"] = vector_of(props["name_embedding"])
    return entity_record(props, props.get("community_uuid"))


def fact_of(row: sqlite3.Row) -> FactRecord:
    props = dict(row)
    props["episodes"] = json_list(props["episodes"])
    for name in _TIME_LISTS:
        props[name] = json_list(props[name])
    if "fact_embedding" in props:
        props["fact_embedding"] = vector_of(props["fact_embedding"])
    return fact_record(props, props["source_uuid"], props["target_uuid"])


def episode_of(row: sqlite3.Row) -> EpisodeRecord:
    props = dict(row)
    if "content_embedding" in props:
        props["content_embedding"] = vector_of(props["content_embedding"])
    return episode_record(props)


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


def believed_facts(
    conn: sqlite3.Connection, group_id: str, asof: AsOf, touching: Sequence[str] | None
) -> list[FactRecord]:
    """The group's facts ``asof`` believes (without embeddings); with ``touching``, only
    those with an end among these entities."""
    where, params = believed_sql(asof)
    if touching is None:
        query = f"SELECT {FACT} FROM fact f WHERE f.group_id = ? AND {where}"
        rows = conn.execute(query, [group_id, *params])
    else:
        ends = json_text(touching)
        query = (
            f"SELECT {FACT} FROM fact f WHERE f.group_id = ? AND f.source_uuid {IN_LIST} "
            f"AND {where} UNION "
            f"SELECT {FACT} FROM fact f WHERE f.group_id = ? AND f.target_uuid {IN_LIST} "
            f"AND {where}"
        )
        rows = conn.execute(query, [group_id, ends, *params, group_id, ends, *params])
    return [fact for fact in map(fact_of, rows) if asof.believed(fact)]


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
