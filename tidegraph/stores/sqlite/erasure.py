"""What the embedded store does so that a forget leaves no byte of what it erased in its files
(docs/operations.md "What a forget leaves behind").

A deleted row's bytes survive a plain ``DELETE`` in three places:

- the pages the row was on (its cell becomes free space, a page it emptied goes to the free
  list): ``PRAGMA secure_delete``, set on every connection (``db.SqliteDatabase``), makes
  SQLite overwrite both with zeros;
- the full-text indexes: FTS5 records a deletion as a new index entry and keeps the deleted
  row's words (the stemmed tokens) in its older index segments until they are merged. SQLite
  3.44 added an FTS5 ``secure-delete`` option for this; the SQLite Python links may be
  older, so a forget merges every segment of each index it deleted from (``'optimize'``, in
  the forget's own transaction): the merged index holds only the words of rows that remain,
  and the old segments' pages are zeroed by ``secure_delete``. It costs a rewrite of the
  index (all groups share it);
- the write-ahead log: every page a transaction wrote is in ``graph.sqlite-wal`` until a
  checkpoint copies it back and the log is started again. ``truncate_log`` checkpoints and
  truncates the log to zero bytes after the forget commits.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable

from tidegraph.records.graph import Rebuild
from tidegraph.stores.sqlite.db import FULLTEXT

log = logging.getLogger(__name__)

FULLTEXT_TABLES = tuple(table for table, _ in FULLTEXT.values())


def merge_fulltext(conn: sqlite3.Connection, tables: Iterable[str] = FULLTEXT_TABLES) -> None:
    """Each fulltext table's index merged into one segment of the rows that remain (inside
    the caller's transaction): the words of deleted rows are gone from it."""
    for table in tables:
        if table not in FULLTEXT_TABLES:
            raise ValueError(f"{table!r} is not a fulltext table of the embedded store")
        conn.execute(f"INSERT INTO {table} ({table}) VALUES ('optimize')")


def rebuilt_fulltext(rebuild: Rebuild) -> list[str]:
    """The fulltext tables a forget's difference deletes from: the episodes' always (the
    forgotten ones' entries), the facts' and entities' when it removes or rewrites some, and
    the communities' then too (those with a member it touched are deleted)."""
    tables = ["episode_search"]
    if rebuild.delete_facts or rebuild.facts:
        tables.append("fact_text")
    if rebuild.delete_entities or rebuild.entities:
        tables += ["entity_text", "community_text"]
    return tables


def truncate_log(conn: sqlite3.Connection, path: object) -> bool:
    """Copy the write-ahead log into the file and truncate it to zero bytes (outside any
    transaction); False when a search still reading an older state kept it (it waits
    ``busy_timeout`` for them first): the log is then truncated at the next forget, or
    when the store closes."""
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        log.warning(
            "the write-ahead log of %s could not be truncated after a forget: a search was "
            "still reading. The forgotten values stay in its old pages until the next "
            "forget or until the store closes (or run: sqlite3 %s 'PRAGMA "
            "wal_checkpoint(TRUNCATE)').",
            path,
            path,
        )
    return not busy
