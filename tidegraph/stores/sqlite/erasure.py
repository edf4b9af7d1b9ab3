"""What the embedded store does so that a forget leaves no byte of what it erased in its files
(docs/operations.md "What a forget leaves behind").

A deleted row's bytes survive a plain ``DELETE`` in three places:

- the pages the row was on (its cell becomes free space, a page it emptied goes to the free
  list): ``PRAGMA secure_delete``, set on every connection (``db.SqliteDatabase``), makes
  SQLite overwrite both with zeros;
- the full-text indexes: FTS5 records a deletion as a new index entry and keeps the deleted
  row's words (the stemmed tokens) in its older index segments until they are merged, unless
  the table's ``secure-delete`` option is on (SQLite 3.44, the reason the store runs on
  ``driver``'s build): a delete then removes the row's entries from the segments that hold
  them, whose old pages ``secure_delete`` zeroes. ``secure_fulltext`` turns it on for every
  fulltext table when the store is set up (a store written before merges its indexes once
  then, so no word a delete left in a segment before stays);
  A secure delete looks each of the row's words up in every segment of the index, so it
  costs what is deleted times how many segments there are: ``merge_fulltext`` keeps them
  few as writes go (docs/performance.md "Forgetting");
- the write-ahead log: every page a transaction wrote is in ``graph.sqlite-wal`` until a
  checkpoint copies it back and the log is started again. ``truncate_log`` checkpoints and
  truncates the log to zero bytes after the forget commits.
"""

from __future__ import annotations

import logging

from tidegraph.stores.sqlite.db import FULLTEXT
from tidegraph.stores.sqlite.driver import sqlite3

log = logging.getLogger(__name__)

FULLTEXT_TABLES = tuple(table for table, _ in FULLTEXT.values())
# FTS5 writes each transaction's entries as a new segment and merges the segments of a size
# (a level) once a level holds 4 (``automerge``), but only a bounded step every 64 pages
# written: small segments pile up in between (an ingest left an episode index of 8.6 on
# average, up to 19). A merge step of at most MERGE_PAGES pages per table after each write
# transaction (``merge_fulltext``, FTS5's 'merge') merges a level as soon as it holds 4:
# 5.3 on average, up to 10.
MERGE_PAGES = 16


def secure_fulltext(conn: sqlite3.Connection) -> list[str]:
    """Every fulltext table's ``secure-delete`` option on (inside the caller's transaction);
    a table that did not have it is first merged into one segment of the rows it holds (the
    words of rows deleted before are gone from it). Returns the tables it turned it on for."""
    turned = []
    for table in FULLTEXT_TABLES:
        row = conn.execute(f"SELECT v FROM {table}_config WHERE k = 'secure-delete'").fetchone()
        if row is not None and row[0]:
            continue
        conn.execute(f"INSERT INTO {table} ({table}) VALUES ('optimize')")
        conn.execute(f"INSERT INTO {table} ({table}, rank) VALUES ('secure-delete', 1)")
        turned.append(table)
    return turned


def merge_fulltext(conn: sqlite3.Connection) -> None:
    """One bounded merge step on every fulltext table (inside a write's transaction, after its
    writes): at most MERGE_PAGES pages written per table, nothing when no level holds four
    segments. What it costs the write path and saves a forget: docs/performance.md."""
    for table in FULLTEXT_TABLES:
        conn.execute(f"INSERT INTO {table} ({table}, rank) VALUES ('merge', {MERGE_PAGES})")


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
