"""The embedded store's memory lifecycle (``store.SqliteStore``): what a forget reads of a
group (``group_history``) and the difference it writes (``apply_rebuild``), inside the
caller's transaction (docs/architecture.md "Forgetting").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tidegraph.records.changes import group_forgotten
from tidegraph.records.conversation import CONTEXT_TURNS, CONTEXT_WITHIN, split_speaker
from tidegraph.records.graph import (
    EpisodeDetail,
    EpisodeEntry,
    EpisodeState,
    GroupHistory,
    GroupProfile,
    Rebuild,
)
from tidegraph.stores import errors
from tidegraph.stores.episode_search import speaker_words
from tidegraph.stores.rows import to_utc, unique
from tidegraph.stores.sqlite.db import (
    EPISODE_LIVE,
    EPISODE_UNMAPPED,
    FULLTEXT,
    json_list,
    json_text,
    micros,
    vector_blob,
)
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.rows import (
    ENTITY_FULL,
    EPISODE,
    FACT_FULL,
    IN_LIST,
    entity_of,
    episode_of,
    fact_of,
)
from tidegraph.stores.sqlite.writes import (
    delete_communities,
    entity_text,
    index_episode,
    index_text,
    insert_id,
    merge_fact,
    purge_changes,
    record_changes,
    stored_owners,
)


def group_history(conn: sqlite3.Connection, group_id: str) -> GroupHistory:
    """``Forgetting.group_history`` in one read transaction."""
    episodes = [
        episode_of(row)
        for row in conn.execute(
            f"SELECT {EPISODE}, ep.content_embedding, ep.extraction, ep.extracted_at "
            "FROM episode ep WHERE ep.group_id = ? AND ep.forgotten_at IS NULL "
            "ORDER BY coalesce(ep.extracted_at, ep.created_at), ep.uuid",
            (group_id,),
        )
    ]
    entities = {
        e.uuid: e
        for e in map(
            entity_of,
            conn.execute(f"SELECT {ENTITY_FULL} FROM entity e WHERE e.group_id = ?", (group_id,)),
        )
    }
    facts = {
        f.uuid: f
        for f in map(
            fact_of,
            conn.execute(f"SELECT {FACT_FULL} FROM fact f WHERE f.group_id = ?", (group_id,)),
        )
    }
    mentions: dict[str, list[str]] = {}
    for episode, entity in conn.execute(
        "SELECT episode_uuid, entity_uuid FROM mention WHERE group_id = ? ORDER BY 1, 2",
        (group_id,),
    ):
        mentions.setdefault(episode, []).append(entity)
    created = {
        uuid: json_list(text)
        for uuid, text in conn.execute(
            "SELECT uuid, created_entities FROM episode "
            "WHERE group_id = ? AND forgotten_at IS NULL",
            (group_id,),
        )
    }
    row = conn.execute("SELECT version FROM change_log WHERE group_id = ?", (group_id,)).fetchone()
    return GroupHistory(episodes, entities, facts, mentions, created, row[0] if row else 0)


def history_part(
    conn: sqlite3.Connection,
    group_id: str,
    episodes: list[str],
    mentioning: list[str],
    creating: list[str],
) -> GroupHistory:
    """``Forgetting.history_part`` in one read transaction: each episode found through its
    uuid or its mentions' index."""
    row = conn.execute("SELECT version FROM change_log WHERE group_id = ?", (group_id,)).fetchone()
    rows = conn.execute(
        "WITH wanted(uuid) AS ("
        " SELECT value FROM json_each(:episodes)"
        " UNION SELECT m.episode_uuid FROM mention m"
        "  WHERE m.entity_uuid IN (SELECT value FROM json_each(:mentioning))"
        "  AND m.group_id = :group_id"
        " UNION SELECT m.episode_uuid FROM mention m"
        "  JOIN episode c INDEXED BY episode_created ON c.uuid = m.episode_uuid"
        "  WHERE m.entity_uuid IN (SELECT value FROM json_each(:creating))"
        "  AND m.group_id = :group_id AND instr(c.created_entities, m.entity_uuid) > 0"
        "  AND EXISTS (SELECT 1 FROM json_each(c.created_entities) WHERE value = m.entity_uuid)) "
        f"SELECT {EPISODE}, ep.extraction, ep.extracted_at, ep.created_entities "
        "FROM wanted w CROSS JOIN episode ep ON ep.uuid = w.uuid "
        "WHERE +ep.group_id = :group_id AND ep.forgotten_at IS NULL "
        "ORDER BY coalesce(ep.extracted_at, ep.created_at), ep.uuid",
        {
            "group_id": group_id,
            "episodes": json_text(episodes),
            "mentioning": json_text(mentioning),
            "creating": json_text(creating),
        },
    ).fetchall()
    part = [episode_of(r) for r in rows]
    mentions: dict[str, list[str]] = {}
    for episode, entity in conn.execute(
        "SELECT episode_uuid, entity_uuid FROM mention "
        "WHERE episode_uuid IN (SELECT value FROM json_each(?)) AND group_id = ? ORDER BY 1, 2",
        (json_text([e.uuid for e in part]), group_id),
    ):
        mentions.setdefault(episode, []).append(entity)
    created = {r["uuid"]: json_list(r["created_entities"]) for r in rows}
    return GroupHistory(
        episodes=part, mentions=mentions, created=created, version=row[0] if row else 0
    )


def group_profile(conn: sqlite3.Connection, group_id: str) -> GroupProfile:
    """``Forgetting.group_profile``: from the index of the live extracted episodes no
    mapping made (``db.EPISODE_UNMAPPED``), which holds none of a mapped group's."""
    judged, without = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM episode INDEXED BY episode_unmapped "
        f"WHERE group_id = ?1 AND {EPISODE_UNMAPPED} AND extraction IS NOT NULL), "
        "EXISTS (SELECT 1 FROM episode INDEXED BY episode_unmapped "
        f"WHERE group_id = ?1 AND {EPISODE_UNMAPPED} AND extraction IS NULL)",
        (group_id,),
    ).fetchone()
    return GroupProfile(judged=bool(judged), without_extraction=bool(without))


def extracted_episodes(conn: sqlite3.Connection, group_id: str, up_to: int) -> int:
    """``Forgetting.extracted_episodes``: up to ``up_to`` entries of the group in the index
    of its live extracted episodes (``db.EPISODE_LIVE``)."""
    [count] = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM episode INDEXED BY episode_live "
        f"WHERE group_id = ? AND {EPISODE_LIVE} LIMIT ?)",
        (group_id, up_to),
    ).fetchone()
    return int(count)


def apply_rebuild(
    conn: sqlite3.Connection,
    group_id: str,
    rebuild: Rebuild,
    entities: list[dict[str, Any]],
    facts: list[dict[str, Any]],
    deployment: str,
) -> None:
    """``Forgetting.apply_rebuild`` inside the caller's transaction."""
    row = conn.execute("SELECT version FROM change_log WHERE group_id = ?", (group_id,)).fetchone()
    if (row[0] if row else 0) != rebuild.version:
        raise errors.RebuildConflict(group_id)
    errors.check_entity_owners(group_id, stored_owners(conn, [r["uuid"] for r in entities]))
    _tombstone(conn, group_id, rebuild)
    _drop_removed(conn, group_id, rebuild, entities)
    for entity in entities:
        _overwrite_entity(conn, group_id, entity)
    texts = dict(
        conn.execute(
            f"SELECT uuid, fact FROM fact WHERE +group_id = ? AND uuid {IN_LIST}",
            (group_id, json_text(r["uuid"] for r in facts)),
        ).fetchall()
    )
    for fact in facts:
        _overwrite_fact(conn, group_id, fact, texts.get(fact["uuid"]))
    for episode, mentioned in rebuild.mentions.items():
        conn.execute(
            "DELETE FROM mention WHERE group_id = ? AND episode_uuid = ?", (group_id, episode)
        )
        conn.executemany(
            "INSERT OR IGNORE INTO mention (episode_uuid, entity_uuid, group_id) VALUES (?, ?, ?)",
            [(episode, entity, group_id) for entity in mentioned],
        )
    conn.executemany(
        "UPDATE episode SET created_entities = ? WHERE group_id = ? AND uuid = ?",
        [(json_text(created), group_id, uuid) for uuid, created in rebuild.created.items()],
    )
    purge_changes(conn, group_id, rebuild.purged)
    record_changes(conn, group_id, rebuild.changes, deployment)


def _tombstone(conn: sqlite3.Connection, group_id: str, rebuild: Rebuild) -> None:
    """The forgotten episodes become tombstones: their index entries, mentions and content go
    (and the replies whose context one was are indexed again)."""
    forgotten = json_text(rebuild.forgotten)
    # The messages whose context a forgotten one was (re-indexed once it is gone).
    said = conn.execute(
        f"SELECT source, source_description, valid_at FROM episode WHERE group_id = ? "
        f"AND source = 'message' AND forgotten_at IS NULL AND uuid {IN_LIST}",
        (group_id, forgotten),
    ).fetchall()
    # The forgotten episodes: their index entries, mentions and content go; a tombstone stays.
    conn.execute(
        f"DELETE FROM episode_search WHERE rowid IN (SELECT id FROM episode WHERE group_id = ? "
        f"AND uuid {IN_LIST})",
        (group_id, forgotten),
    )
    conn.execute(
        f"DELETE FROM mention WHERE group_id = ? AND episode_uuid {IN_LIST}", (group_id, forgotten)
    )
    conn.execute(
        "UPDATE episode SET name = '', source_description = '', content = '', valid_at = 0, "
        "producer_id = NULL, content_hash = NULL, created_entities = '[]', not_extracted = NULL, "
        "content_embedding = NULL, extraction = NULL, extracted_at = NULL, forgotten_at = ? "
        f"WHERE group_id = ? AND uuid {IN_LIST}",
        (micros(rebuild.forgotten_at), group_id, forgotten),
    )
    _forget_in_threads(conn, group_id, said)


def _drop_removed(
    conn: sqlite3.Connection, group_id: str, rebuild: Rebuild, entities: list[dict[str, Any]]
) -> None:
    """The facts and entities no remaining episode gives, and the communities whose members
    the rebuild removes or changes."""
    # Each statement finds its rows by uuid: ``+group_id`` keeps SQLite from reading the
    # group's rows through a group index instead (a cost that grows with the group).
    gone_facts = json_text(rebuild.delete_facts)
    conn.execute(
        f"DELETE FROM fact_text WHERE rowid IN (SELECT id FROM fact WHERE +group_id = ? "
        f"AND uuid {IN_LIST})",
        (group_id, gone_facts),
    )
    conn.execute(f"DELETE FROM fact WHERE +group_id = ? AND uuid {IN_LIST}", (group_id, gone_facts))
    # Communities with a member removed or changed go (their names and summaries may carry
    # what was forgotten); the next refresh groups the remaining members again.
    touched = json_text([*rebuild.delete_entities, *(e["uuid"] for e in entities)])
    stale = conn.execute(
        f"SELECT DISTINCT community_uuid FROM member WHERE +group_id = ? AND entity_uuid {IN_LIST}",
        (group_id, touched),
    ).fetchall()
    delete_communities(conn, group_id, sorted(c for (c,) in stale))
    gone = json_text(rebuild.delete_entities)
    conn.execute(
        f"DELETE FROM entity_text WHERE rowid IN (SELECT id FROM entity WHERE +group_id = ? "
        f"AND uuid {IN_LIST})",
        (group_id, gone),
    )
    for table, column in (
        ("mention", "entity_uuid"),
        ("member", "entity_uuid"),
        ("entity_name", "uuid"),
        ("entity", "uuid"),
    ):
        conn.execute(
            f"DELETE FROM {table} WHERE +group_id = ? AND {column} {IN_LIST}", (group_id, gone)
        )


def _overwrite_entity(conn: sqlite3.Connection, group_id: str, row: dict[str, Any]) -> None:
    """An entity written in full (created, or its stored state replaced)."""
    stored = conn.execute("SELECT id FROM entity WHERE uuid = ?", (row["uuid"],)).fetchone()
    values = (
        row["name"],
        json_text(row["labels"]),
        row["summary"],
        row["key"],
        json_text(row["aliases"]),
        vector_blob(row["name_embedding"]),
        micros(row["created_at"]),
    )
    if stored is None:
        row_id = insert_id(
            conn,
            "INSERT INTO entity (name, labels, summary, key, aliases, name_embedding, created_at, "
            "uuid, group_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*values, row["uuid"], group_id),
        )
    else:
        row_id = stored[0]
        conn.execute(
            "UPDATE entity SET name = ?, labels = ?, summary = ?, key = ?, aliases = ?, "
            "name_embedding = coalesce(?, name_embedding), created_at = ? WHERE id = ?",
            (*values, row_id),
        )
        conn.execute("DELETE FROM entity_name WHERE uuid = ?", (row["uuid"],))
    index_text(
        conn, "entity_text", row_id, group_id, entity_text(row["name"], row["summary"], row["key"])
    )
    conn.executemany(
        "INSERT OR IGNORE INTO entity_name (group_id, name, uuid) VALUES (?, ?, ?)",
        [(group_id, name, row["uuid"]) for name in unique([row["name_norm"], *row["aliases"]])],
    )


def _overwrite_fact(
    conn: sqlite3.Connection, group_id: str, row: dict[str, Any], text: str | None
) -> None:
    """A fact written in full (created, or its stored state replaced: ends and histories set
    back to what the row says, null included)."""
    stored = conn.execute(
        "SELECT id FROM fact WHERE uuid = ? AND group_id = ?", (row["uuid"], group_id)
    ).fetchone()
    if stored is not None:
        conn.execute("DELETE FROM fact_text WHERE rowid = ?", (stored[0],))
        conn.execute("DELETE FROM fact WHERE id = ?", (stored[0],))
    merge_fact(conn, group_id, row, None)


# ----------------------------------------------------------------------------- a whole group
def _forget_in_threads(
    conn: sqlite3.Connection, group_id: str, said: list[tuple[str, str, int]]
) -> None:
    """After messages were forgotten: the messages whose context they were are indexed again
    (without them), and the group's speaker words are those of the messages that remain
    (docs/retrieval.md "Conversation-aware episode search")."""
    for source, thread, valid_at in said:
        at = to_utc(valid_at)
        assert at is not None  # valid_at is NOT NULL
        after = conn.execute(
            "SELECT id, content, valid_at FROM episode WHERE group_id = ? AND source = ? "
            "AND source_description = ? AND valid_at > ? AND valid_at <= ? "
            "AND forgotten_at IS NULL ORDER BY valid_at, uuid LIMIT ?",
            (group_id, source, thread, valid_at, micros(at + CONTEXT_WITHIN), CONTEXT_TURNS),
        ).fetchall()
        for row_id, content, later_at in after:
            later = to_utc(later_at)
            assert later is not None
            index_episode(conn, group_id, row_id, source, thread, content, later)
    if said:
        conn.execute("DELETE FROM speaker_word WHERE group_id = ?", (group_id,))
        words = {
            word
            for (content,) in conn.execute(
                "SELECT content FROM episode WHERE group_id = ? AND source = 'message' "
                "AND forgotten_at IS NULL",
                (group_id,),
            )
            for word in speaker_words(split_speaker("message", content)[0])
        }
        conn.executemany(
            "INSERT OR IGNORE INTO speaker_word (group_id, word) VALUES (?, ?)",
            [(group_id, w) for w in sorted(words)],
        )


def forget_group(
    conn: sqlite3.Connection, group_id: str, at: datetime, purge: bool, deployment: str
) -> int:
    """``Forgetting.forget_group`` inside the caller's transaction."""
    [forgotten] = conn.execute(
        "SELECT count(*) FROM episode WHERE group_id = ? AND forgotten_at IS NULL", (group_id,)
    ).fetchone()
    for table, kind in FULLTEXT.values():
        conn.execute(
            f"DELETE FROM {table} WHERE rowid IN (SELECT id FROM {kind} WHERE group_id = ?)",
            (group_id,),
        )
    for table in (
        "fact",
        "mention",
        "member",
        "entity_name",
        "entity",
        "community",
        "change",
        "change_record",
        "speaker_word",
    ):
        conn.execute(f"DELETE FROM {table} WHERE group_id = ?", (group_id,))
    if purge:
        conn.execute("DELETE FROM episode WHERE group_id = ?", (group_id,))
        conn.execute("DELETE FROM change_log WHERE group_id = ?", (group_id,))
        return int(forgotten)
    conn.execute(
        "UPDATE episode SET name = '', source_description = '', content = '', valid_at = 0, "
        "producer_id = NULL, content_hash = NULL, created_entities = '[]', not_extracted = NULL, "
        "content_embedding = NULL, extraction = NULL, extracted_at = NULL, forgotten_at = ? "
        "WHERE group_id = ? AND forgotten_at IS NULL",
        (micros(at), group_id),
    )
    record_changes(conn, group_id, [group_forgotten(group_id, at)], deployment)
    return int(forgotten)


def list_episodes(
    conn: sqlite3.Connection,
    group_id: str,
    since: datetime | None,
    until: datetime | None,
    status: str | None,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[EpisodeEntry]:
    """``Browsing.list_episodes`` in one read."""
    forgotten = status == "forgotten"
    at = "forgotten_at" if forgotten else "valid_at"
    where = ["group_id = ?", "forgotten_at IS NOT NULL" if forgotten else "forgotten_at IS NULL"]
    params: list[Any] = [group_id]
    if status == "written":
        where.append("not_extracted IS NULL")
    elif status == "not_extracted":
        where.append("not_extracted IS NOT NULL")
    if since is not None:
        where.append(f"{at} >= ?")
        params.append(micros(since))
    if until is not None:
        where.append(f"{at} < ?")
        params.append(micros(until))
    if after is not None:
        where.append(f"({at}, uuid) > (?, ?)")
        params += [micros(after[0]), after[1]]
    rows = conn.execute(
        "SELECT uuid, producer_id, name, source, valid_at, created_at, not_extracted, content, "
        f"forgotten_at FROM episode WHERE {' AND '.join(where)} ORDER BY {at}, uuid LIMIT ?",
        (*params, limit),
    )
    entries = []
    for uuid, producer, name, source, valid, created, pending, content, gone in rows:
        gone_at = to_utc(gone)
        state: EpisodeState = (
            "forgotten" if forgotten else "written" if pending is None else "not_extracted"
        )
        entries.append(
            EpisodeEntry(
                uuid=uuid,
                producer_id=producer or "",
                name=name,
                source=source,
                valid_at=gone_at if forgotten else to_utc(valid),
                created_at=to_utc(created),
                status=state,
                not_extracted=pending,
                content=content,
                forgotten_at=gone_at,
            )
        )
    return entries


def episode_detail(
    conn: sqlite3.Connection, group_id: str, episode_uuid: str
) -> EpisodeDetail | None:
    """``Browsing.episode_detail`` in one read."""
    row = conn.execute(
        "SELECT uuid, producer_id, name, source, valid_at, created_at, not_extracted, content, "
        "forgotten_at FROM episode WHERE uuid = ? AND +group_id = ?",
        (episode_uuid, group_id),
    ).fetchone()
    if row is None:
        return None
    uuid, producer, name, source, valid, created, pending, content, gone = row
    gone_at = to_utc(gone)
    state: EpisodeState = (
        "forgotten" if gone_at else "written" if pending is None else "not_extracted"
    )
    entry = EpisodeEntry(
        uuid=uuid,
        producer_id=producer or "",
        name=name,
        source=source,
        valid_at=gone_at or to_utc(valid),
        created_at=to_utc(created),
        status=state,
        not_extracted=pending,
        content=content,
        forgotten_at=gone_at,
    )
    mentions = [
        entity
        for (entity,) in conn.execute(
            "SELECT entity_uuid FROM mention WHERE episode_uuid = ? AND group_id = ? "
            "ORDER BY entity_uuid",
            (episode_uuid, group_id),
        )
    ]
    return EpisodeDetail(entry, mentions)
