"""The embedded store's upserts of facts, closures, episodes and communities, built from the
write rules (``tidegraph.stores.write_rules``): the columns are the fields of the rules'
tables, the ON CONFLICT and UPDATE assignments are ``write_rules.set_clause``. Each statement
takes its values by name (``params``) from a row of ``tidegraph.stores.rows``.
"""

from __future__ import annotations

from typing import Any

from tidegraph.stores.rows import TIME_FIELDS, TIME_LIST_FIELDS
from tidegraph.stores.sqlite.db import json_text, micros, micros_list, vector_blob
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.write_rules import CLOSURE, COMMUNITY, EPISODE, FACT, Rules, set_clause

# The columns that hold an embedding (a blob of doubles).
_EMBEDDINGS = frozenset({"name_embedding", "fact_embedding", "content_embedding"})


def _upsert(table: str, rules: Rules) -> str:
    """INSERT of a record of ``rules`` into ``table``, or on its uuid the rules applied."""
    columns = list(rules)
    assignments = ",\n".join(
        set_clause(
            rules,
            target=lambda name: name,
            stored=lambda name: f"{table}.{name}",
            written=lambda name: f"excluded.{name}",
        )
    )
    return (
        f"INSERT INTO {table} ({', '.join(columns)})\n"
        f"VALUES ({', '.join(f':{name}' for name in columns)})\n"
        f"ON CONFLICT (uuid) DO UPDATE SET\n{assignments}"
    )


MERGE_FACT = _upsert("fact", FACT)
MERGE_EPISODE = _upsert("episode", EPISODE)
UPSERT_COMMUNITY = _upsert("community", COMMUNITY)
CLOSE_FACT = (
    "UPDATE fact SET\n"
    + ",\n".join(
        set_clause(
            CLOSURE,
            target=lambda name: name,
            stored=lambda name: name,
            written=lambda name: f":{name}",
        )
    )
    + "\nWHERE uuid = :uuid AND group_id = :group_id"
)


def upsert(
    conn: sqlite3.Connection,
    table: str,
    statement: str,
    group_id: str,
    row: dict[str, Any],
    *,
    new: bool = False,
) -> int:
    """``statement`` (an upsert above, into ``table``, a constant) for ``row``; the row's id,
    read after it by its uuid. Not with RETURNING: a statement that returns rows runs in a
    statement savepoint, and at every savepoint FTS5 writes what each fulltext table the
    transaction touched holds pending out as a new segment, merged again later (one per
    fact and episode a unit wrote, most of the fulltext indexes' cost). ``new``: the caller
    read in this transaction that no row has the uuid, so the statement inserts and the id
    is the one it inserted (``lastrowid``; an upsert that updates leaves it unchanged),
    without the read."""
    cursor = conn.execute(statement, params(group_id, row))
    if new:
        row_id = cursor.lastrowid
        assert row_id is not None  # the statement inserted one row into a rowid table
        return row_id
    query = f"SELECT id FROM {table} WHERE uuid = ?"  # noqa: S608 - a constant table name
    [row_id] = conn.execute(query, (row["uuid"],)).fetchone()
    return int(row_id)


def params(group_id: str, row: dict[str, Any]) -> dict[str, Any]:
    """A row's values as the statements take them: times as microseconds since the epoch,
    lists of times as JSON of those, embeddings as blobs, other lists as JSON."""
    out: dict[str, Any] = {"group_id": group_id}
    for name, value in row.items():
        if name in TIME_FIELDS:
            out[name] = micros(value)
        elif name in TIME_LIST_FIELDS:
            out[name] = micros_list(value)
        elif name in _EMBEDDINGS:
            out[name] = vector_blob(value)
        elif isinstance(value, list):
            out[name] = json_text(value)
        else:
            out[name] = value
    return out
