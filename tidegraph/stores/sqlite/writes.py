"""The embedded store's write path (``store.SqliteStore``): an episode's write, with the checks
of ``tidegraph.stores.errors`` before anything changes, its fulltext index entries and its
changes appended to the group's outbox, all inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from tidegraph.records.changes import Change
from tidegraph.records.conversation import (
    CONTEXT_TURNS,
    CONTEXT_WITHIN,
    search_fields,
    split_speaker,
    thread_context,
)
from tidegraph.records.graph import EpisodeWrite
from tidegraph.stores import errors
from tidegraph.stores.base import BatchWriteError
from tidegraph.stores.episode_search import speaker_words
from tidegraph.stores.rows import (
    closure_row,
    entity_row,
    episode_row,
    fact_row,
    held_records,
    now_utc,
    outbox_row,
    purged_row,
    to_utc,
    unique,
)
from tidegraph.stores.search_text import identifier_words, indexed_text
from tidegraph.stores.sqlite import write_sql
from tidegraph.stores.sqlite.db import (
    Transaction,
    json_list,
    json_text,
    micros,
    vector_blob,
)
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.erasure import merge_fulltext
from tidegraph.stores.sqlite.rows import IN_LIST
from tidegraph.stores.write_rules import ENTITY, merged_values, updated_fields


def index_text(
    conn: sqlite3.Connection,
    table: str,
    row_id: int,
    group_id: str,
    text: str,
    *,
    new: bool = False,
) -> None:
    """(Re)index one record's text in the fulltext table ``table`` (a constant); ``new``: the
    record was inserted by this write, so it has no entry to delete (every statement that
    deletes a record deletes its entry too, so a reused rowid has none either)."""
    if not new:
        conn.execute(f"DELETE FROM {table} WHERE rowid = ?", (row_id,))
    conn.execute(
        f"INSERT INTO {table} (rowid, group_id, text) VALUES (?, ?, ?)", (row_id, group_id, text)
    )


def insert_id(conn: sqlite3.Connection, statement: str, values: Sequence[Any]) -> int:
    """A plain INSERT of one row; its id (not with RETURNING: ``write_sql.upsert``)."""
    row_id = conn.execute(statement, values).lastrowid
    assert row_id is not None  # one row inserted into a rowid table
    return row_id


def entity_text(name: str, summary: str | None, key: str | None) -> str:
    """An entity's indexed text: its name and summary, their identifier words and its key's
    (``search_text.indexed_text``)."""
    text = indexed_text(name, summary)
    key_ids = [w for w in identifier_words(key or "") if w not in text.split()]
    return " ".join([text, *key_ids])


def stored_owners(conn: sqlite3.Connection, uuids: Sequence[str]) -> dict[str, str]:
    query = f"SELECT uuid, group_id FROM entity WHERE uuid {IN_LIST}"
    return dict(conn.execute(query, (json_text(uuids),)).fetchall())


# What an entity upsert may change on a stored entity (the write rules' table).
_ENTITY_UPDATES = {name: ENTITY[name] for name in updated_fields(ENTITY)}
_UPDATE_ENTITY = (
    "UPDATE entity SET "
    + ", ".join(f"{name} = :{name}" for name in _ENTITY_UPDATES)
    + " WHERE uuid = :uuid"
)
_LIST_COLUMNS = frozenset({"labels", "aliases"})  # JSON lists


def upsert_entities(conn: sqlite3.Connection, group_id: str, rows: list[dict[str, Any]]) -> None:
    """Entity rows (``rows.entity_row``) applied in order by the write rules, as a sequence of
    MERGEs would (checked before)."""
    if not rows:
        return
    query = f"SELECT id, uuid, name, {', '.join(_ENTITY_UPDATES)} FROM entity WHERE uuid {IN_LIST}"
    stored_rows = conn.execute(query, (json_text(unique(r["uuid"] for r in rows)),)).fetchall()
    stored = {
        r["uuid"]: {
            name: json_list(r[name]) if name in _LIST_COLUMNS else r[name]
            for name in _ENTITY_UPDATES
        }
        for r in stored_rows
    }
    row_ids = {r["uuid"]: (r["id"], r["name"]) for r in stored_rows}
    created: dict[str, dict[str, Any]] = {}
    states: dict[str, dict[str, Any]] = {}
    for row in rows:
        uuid = row["uuid"]
        before = states.get(uuid, stored.get(uuid))
        if before is None:
            created[uuid] = row
            states[uuid] = merged_values(ENTITY, None, row)
        else:
            states[uuid] = {**before, **merged_values(_ENTITY_UPDATES, before, row)}
    for uuid, row in created.items():
        state = states[uuid]
        row_id = insert_id(
            conn,
            "INSERT INTO entity (uuid, group_id, name, labels, summary, key, aliases, "
            "name_embedding, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                uuid,
                group_id,
                state["name"],
                json_text(state["labels"]),
                state["summary"],
                state["key"],
                json_text(state["aliases"]),
                vector_blob(state["name_embedding"]),
                micros(state["created_at"]),
            ),
        )
        index_text(
            conn,
            "entity_text",
            row_id,
            group_id,
            entity_text(state["name"], state["summary"], state["key"]),
            new=True,
        )
        names = unique([row["name_norm"], *state["aliases"]])
        conn.executemany(
            "INSERT OR IGNORE INTO entity_name (group_id, name, uuid) VALUES (?, ?, ?)",
            [(group_id, name, uuid) for name in names],
        )
    for uuid, before in stored.items():
        state = states[uuid]
        if state == before:
            continue
        values = {
            name: json_text(state[name]) if name in _LIST_COLUMNS else state[name]
            for name in _ENTITY_UPDATES
        }
        conn.execute(_UPDATE_ENTITY, {"uuid": uuid, **values})
        if (state["summary"], state["key"]) != (before["summary"], before["key"]):
            row_id, name = row_ids[uuid]
            text = entity_text(name, state["summary"], state["key"])
            index_text(conn, "entity_text", row_id, group_id, text)
        added = [a for a in state["aliases"] if a not in before["aliases"]]
        conn.executemany(
            "INSERT OR IGNORE INTO entity_name (group_id, name, uuid) VALUES (?, ?, ?)",
            [(group_id, alias, uuid) for alias in added],
        )


def merge_fact(
    conn: sqlite3.Connection, group_id: str, row: dict[str, Any], text: str | None
) -> None:
    """MERGE one fact row (``rows.fact_row``); ``text``: its stored sentence (None: new)."""
    new = text is None
    row_id = write_sql.upsert(conn, "fact", write_sql.MERGE_FACT, group_id, row, new=new)
    if text != row["fact"]:
        index_text(conn, "fact_text", row_id, group_id, fact_text(row), new=new)


def fact_text(row: dict[str, Any]) -> str:
    """A fact row's indexed text: ``search_text.indexed_text`` of its sentence, from the
    identifier words the row holds already (``index_ids``, the Neo4j store's field)."""
    return f"{row['fact']} {row['index_ids']}" if row["index_ids"] else row["fact"]


def close_fact(conn: sqlite3.Connection, group_id: str, row: dict[str, Any]) -> None:
    """Apply one closure row (``rows.closure_row``) to a stored fact of the group."""
    conn.execute(write_sql.CLOSE_FACT, write_sql.params(group_id, row))


# The messages of a thread around one (tidegraph/records/conversation.py): those before it
# within the bound, newest first, and those after it whose context it may be.
_THREAD_BEFORE = (
    "SELECT content FROM episode WHERE group_id = ? AND source = 'message' "
    "AND source_description = ? AND valid_at < ? AND valid_at >= ? AND forgotten_at IS NULL "
    "ORDER BY valid_at DESC, uuid DESC LIMIT ?"
)
_THREAD_AFTER = (
    "SELECT id, content, valid_at FROM episode WHERE group_id = ? AND source = 'message' "
    "AND source_description = ? AND valid_at > ? AND valid_at <= ? AND forgotten_at IS NULL "
    "ORDER BY valid_at, uuid LIMIT ?"
)


def index_episode(
    conn: sqlite3.Connection,
    group_id: str,
    row_id: int,
    source: str,
    thread: str,
    content: str,
    valid_at: datetime,
    *,
    new: bool = False,
) -> None:
    """(Re)index one episode's conversation fields (``episode_search``), its context read
    from its thread as stored, and its speaker's name words (``speaker_word``); ``new``: the
    episode was inserted by this write (no entry to delete, as ``index_text``)."""
    preceding: list[str] = []
    if source == "message":
        rows = conn.execute(
            _THREAD_BEFORE,
            (group_id, thread, micros(valid_at), micros(valid_at - CONTEXT_WITHIN), CONTEXT_TURNS),
        )
        preceding = thread_context([split_speaker(source, r[0])[1] for r in rows])
    fields = search_fields(source, content, valid_at, preceding)
    if not new:
        conn.execute("DELETE FROM episode_search WHERE rowid = ?", (row_id,))
    conn.execute(
        "INSERT INTO episode_search (rowid, group_id, body, speaker, context, said_on) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (row_id, group_id, indexed_text(fields.body), fields.speaker, fields.context, fields.when),
    )
    conn.executemany(
        "INSERT OR IGNORE INTO speaker_word (group_id, word) VALUES (?, ?)",
        [(group_id, word) for word in speaker_words(fields.speaker)],
    )


def index_thread(
    conn: sqlite3.Connection,
    group_id: str,
    row_id: int,
    source: str,
    thread: str,
    content: str,
    valid_at: datetime,
    *,
    new: bool = False,
) -> None:
    """Index an episode written (``new``: inserted by this write), and the messages after it
    whose context it is now (so the index is the same whatever order a thread's messages
    arrive in)."""
    index_episode(conn, group_id, row_id, source, thread, content, valid_at, new=new)
    if source != "message":
        return
    after = conn.execute(
        _THREAD_AFTER,
        (group_id, thread, micros(valid_at), micros(valid_at + CONTEXT_WITHIN), CONTEXT_TURNS),
    ).fetchall()
    for later_id, later_content, later_at in after:
        later = to_utc(later_at)
        assert later is not None  # valid_at is NOT NULL
        index_episode(conn, group_id, later_id, source, thread, later_content, later)


def reindex_episodes(conn: sqlite3.Connection) -> int:
    """Index every stored episode's conversation fields (the migration of a store whose
    episodes were indexed by content alone); the number indexed."""
    rows = conn.execute(
        "SELECT id, group_id, source, source_description, content, valid_at FROM episode "
        "WHERE forgotten_at IS NULL"
    ).fetchall()
    for row_id, group_id, source, thread, content, valid_at in rows:
        at = to_utc(valid_at)
        assert at is not None  # valid_at is NOT NULL
        index_episode(conn, group_id, row_id, source, thread, content, at)
    return len(rows)


def reindex_texts(conn: sqlite3.Connection) -> int:
    """Index every stored fact's and entity's text again (the migration of a store whose
    texts were indexed without their identifier words); the number indexed."""
    facts = conn.execute("SELECT id, group_id, fact FROM fact").fetchall()
    for row_id, group_id, fact in facts:
        index_text(conn, "fact_text", row_id, group_id, indexed_text(fact))
    entities = conn.execute("SELECT id, group_id, name, summary, key FROM entity").fetchall()
    for row_id, group_id, name, summary, key in entities:
        index_text(conn, "entity_text", row_id, group_id, entity_text(name, summary, key))
    return len(facts) + len(entities)


def write_episode(
    conn: sqlite3.Connection,
    group_id: str,
    write: EpisodeWrite,
    dim: int,
    now: datetime,
    deployment: str,
) -> bool:
    """One episode's write inside the caller's transaction: read what it touches, check it
    (``errors``), then write it; False when its episode is processed already."""
    entities = [entity_row(group_id, e, dim, now) for e in write.entities]
    episode = episode_row(group_id, write.episode, dim, now, write.created)
    facts = [fact_row(group_id, f, dim, now) for f in write.facts]
    closures = [closure_row(c) for c in write.closures]
    stored = conn.execute(
        "SELECT id, group_id, content_hash, not_extracted, content, valid_at, "
        "source, source_description FROM episode WHERE uuid = ?",
        (episode["uuid"],),
    ).fetchone()
    if stored is not None and errors.skips_write(
        group_id, write, stored["group_id"], stored["content_hash"], stored["not_extracted"]
    ):
        return False
    owners = stored_owners(conn, errors.written_entity_uuids(write)[1])
    query = f"SELECT uuid, group_id, source_uuid, target_uuid, fact FROM fact WHERE uuid {IN_LIST}"
    fact_rows = conn.execute(query, (json_text(errors.written_fact_uuids(write)),)).fetchall()
    facts_stored = {r[0]: errors.StoredFact(r[1], r[2], r[3]) for r in fact_rows}
    errors.check_write(
        group_id, write, None if stored is None else stored["group_id"], owners, facts_stored
    )
    # Checked: what follows writes.
    upsert_entities(conn, group_id, entities)
    row_id = write_sql.upsert(
        conn, "episode", write_sql.MERGE_EPISODE, group_id, episode, new=stored is None
    )
    indexed = ("content", "valid_at", "source", "source_description")
    said = (episode["content"], micros(episode["valid_at"]), episode["source"])
    if stored is None or [*said, episode["source_description"]] != [stored[k] for k in indexed]:
        index_thread(
            conn,
            group_id,
            row_id,
            episode["source"],
            episode["source_description"],
            episode["content"],
            episode["valid_at"],
            new=stored is None,
        )
    conn.executemany(
        "INSERT OR IGNORE INTO mention (episode_uuid, entity_uuid, group_id) VALUES (?, ?, ?)",
        [(episode["uuid"], uuid, group_id) for uuid in unique(write.mentions)],
    )
    texts = {r[0]: r[4] for r in fact_rows}
    for row in facts:
        merge_fact(conn, group_id, row, texts.get(row["uuid"]))
        texts[row["uuid"]] = row["fact"]
    for row in closures:
        close_fact(conn, group_id, row)
    return True


def record_changes(
    conn: sqlite3.Connection, group_id: str, changes: Sequence[Change], deployment: str
) -> None:
    """Append one write's changes to the group's outbox (one row) in commit order and bump
    its write version (a rebuild checks that it did not move while it computed); the log
    names the writer's deployment unless it has one (its relay publishes the group)."""
    conn.execute(
        "INSERT INTO change_log (group_id, seq, published, version, deployment) "
        "VALUES (?, 0, 0, 0, ?) ON CONFLICT (group_id) DO NOTHING",
        (group_id, deployment),
    )
    conn.execute(  # no RETURNING (``write_sql.upsert``)
        "UPDATE change_log SET seq = seq + ?, version = version + 1, "
        "deployment = coalesce(deployment, ?) WHERE group_id = ?",
        (len(changes), deployment, group_id),
    )
    [seq] = conn.execute("SELECT seq FROM change_log WHERE group_id = ?", (group_id,)).fetchone()
    base = seq - len(changes)
    if changes:
        row = outbox_row(group_id, changes)
        last = base + len(changes)
        conn.execute(
            "INSERT INTO change (group_id, seq, last, change_id, kind, uuid, body, committed_at) "
            "VALUES (:group_id, :seq, :last, :change_id, :kind, :uuid, :body, :committed_at)",
            {**row, "seq": base + 1, "last": last},
        )
        index_records(conn, group_id, last, row["records"])


def index_records(
    conn: sqlite3.Connection, group_id: str, last: int, records: Sequence[str]
) -> None:
    """The records an outbox row (ending at ``last``) holds changes of (each once:
    ``rows.held_records``, or the row's ``records``), in the group's index of them
    (``db.OUTBOX_RECORDS``)."""
    conn.executemany(
        "INSERT OR IGNORE INTO change_record (group_id, uuid, last) VALUES (?, ?, ?)",
        [(group_id, uuid, last) for uuid in records],
    )


def unindex_records(
    conn: sqlite3.Connection, group_id: str, rows: Sequence[tuple[int, str]]
) -> None:
    """Outbox rows deleted (each its last and ``uuid`` column) out of the index of records."""
    conn.executemany(
        "DELETE FROM change_record WHERE group_id = ? AND uuid = ? AND last = ?",
        [(group_id, uuid, last) for last, uuids in rows for uuid in held_records(uuids)],
    )


def index_outbox_records(conn: sqlite3.Connection) -> int:
    """Every stored outbox row in the index of records (a file written before it); how many."""
    rows = conn.execute("SELECT group_id, last, uuid FROM change").fetchall()
    for group_id, last, uuids in rows:
        index_records(conn, group_id, last, held_records(uuids))
    return len(rows)


def skip_dropped(conn: sqlite3.Connection, group_id: str, dropped: list[int]) -> None:
    """After the group's changes up to ``max(dropped)`` (seqs) were deleted in this
    transaction: a relay cursor right before deleted ones moves past them, up to the first
    change still there (the relay never waits for a change that is gone, and moves a cursor
    itself only past changes Kafka acknowledged). A row holding the cursor's next change
    keeps it where it is (the first row after the cursor: a row's numbers follow the row
    before's, so it has the least)."""
    if not dropped:
        return
    conn.execute(
        "UPDATE change_log SET published = max(published, min(:dropped, coalesce("
        "(SELECT max(seq, change_log.published + 1) FROM change "
        "WHERE group_id = :group AND last > change_log.published ORDER BY last LIMIT 1) - 1, "
        ":dropped))) WHERE group_id = :group",
        {"group": group_id, "dropped": max(dropped)},
    )


def purge_changes(conn: sqlite3.Connection, group_id: str, uuids: list[str]) -> None:
    """Take the changes of records ``uuids`` out of the group's outbox (a forget): a row
    holding one of them has its lines blanked, or is deleted when nothing is left. The
    rows are found through the index of records (``db.OUTBOX_RECORDS``): what this reads
    grows with what is purged, not with the outbox."""
    if not uuids:
        return
    purged = set(uuids)
    found = conn.execute(
        "SELECT c.rowid, c.last, c.change_id, c.kind, c.uuid, c.body FROM change c "
        "WHERE c.group_id = ?1 AND c.last IN (SELECT r.last FROM change_record r "
        "WHERE r.group_id = ?1 AND r.uuid IN (SELECT value FROM json_each(?2)))",
        (group_id, json_text(sorted(purged))),
    ).fetchall()
    conn.execute(
        f"DELETE FROM change_record WHERE group_id = ? AND uuid {IN_LIST}",
        (group_id, json_text(sorted(purged))),
    )
    dropped, emptied, blanked = [], [], []
    for rowid, last, *columns in found:
        row = dict(zip(("change_id", "kind", "uuid", "body"), columns, strict=True))
        left = purged_row(row, purged)
        if left is row:
            continue  # an entry of a row that no longer holds the record
        dropped.append(last)
        if left is None:
            emptied.append((rowid,))
        else:
            blanked.append({**left, "rowid": rowid})
    conn.executemany("DELETE FROM change WHERE rowid = ?", emptied)
    # the same size as before: SQLite overwrites the row in place (``rows.purged_row``)
    conn.executemany(
        "UPDATE change SET change_id = :change_id, kind = :kind, uuid = :uuid, body = :body "
        "WHERE rowid = :rowid",
        blanked,
    )
    skip_dropped(conn, group_id, dropped)


def write_episodes(
    conn: sqlite3.Connection,
    group_id: str,
    writes: list[EpisodeWrite],
    dim: int,
    deployment: str,
) -> list[bool]:
    """The writes in order, in one transaction; on a failure the writes before it are
    committed and BatchWriteError says which they were.

    No savepoint per write: FTS5 writes its pending entries out as a segment of each
    fulltext table at every savepoint, so a unit of 64 episodes made 64 tiny segments per
    table, each merged again later (about a seventh of the write's statements). Instead a
    failure rolls the whole transaction back and the writes before it run again in a new
    one: they read what they read the first time (this connection is the only writer and
    nothing ran between), so they write the same, and only a failing batch pays twice.
    Each transaction ends with a bounded merge of the fulltext segments (``merge_fulltext``:
    a forget's secure delete costs what it deletes times the segments)."""
    now = now_utc()
    written: list[bool] = []
    try:
        with Transaction(conn):
            for write in writes:
                written.append(write_episode(conn, group_id, write, dim, now, deployment))
            _record_written(conn, group_id, writes, written, deployment)
            merge_fulltext(conn)
    except Exception as failure:
        if len(writes) == 1 or len(written) == len(writes):  # not one write's failure
            raise
        before = writes[: len(written)]
        if before:
            with Transaction(conn):
                written = [write_episode(conn, group_id, w, dim, now, deployment) for w in before]
                _record_written(conn, group_id, before, written, deployment)
                merge_fulltext(conn)
        raise BatchWriteError(written) from failure
    return written


def _record_written(
    conn: sqlite3.Connection,
    group_id: str,
    writes: list[EpisodeWrite],
    written: list[bool],
    deployment: str,
) -> None:
    """The outbox: one row for the changes of the writes that wrote (none: no row)."""
    if any(written):
        changes = [c for w, ok in zip(writes, written, strict=True) if ok for c in w.changes]
        record_changes(conn, group_id, changes, deployment)


def delete_communities(conn: sqlite3.Connection, group_id: str, uuids: list[str]) -> None:
    """The group's communities ``uuids``, their search text and memberships."""
    if not uuids:
        return
    param = (group_id, json_text(uuids))
    conn.execute(
        f"DELETE FROM community_text WHERE rowid IN "
        f"(SELECT id FROM community WHERE +group_id = ? AND uuid {IN_LIST})",
        param,
    )
    conn.execute(f"DELETE FROM member WHERE +group_id = ? AND community_uuid {IN_LIST}", param)
    conn.execute(f"DELETE FROM community WHERE +group_id = ? AND uuid {IN_LIST}", param)
