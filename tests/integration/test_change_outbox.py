"""The outbox as the relay reads and moves it, on every store: each group's changes after its
cursor, a bounded number per group, in commit order; cursors that never move back nor past
the group's last change."""

from __future__ import annotations

import sqlite3
import uuid as uuidlib
from datetime import timedelta
from pathlib import Path

import pytest

from tests.integration.test_delivery_order_stores import DIM, Record
from tests.integration.test_forget import T0, clock_of, feed
from tests.support import crm_feed as crm
from tidegraph.stores.base import GraphStore
from tidegraph.stores.sqlite.db import DB_FILE
from tidegraph.stores.sqlite.store import SqliteStore

pytestmark = pytest.mark.integration


async def test_the_relay_reads_each_groups_changes_after_its_cursor(any_store: GraphStore) -> None:
    at = [crm.START + timedelta(days=d) for d in range(3)]
    records = [
        Record(f"rec-{i}", at[i], crm.plan_record((1, "Acme Corp"), plan, at[i]))
        for i, plan in enumerate(["Basic", "Pro", "Enterprise"])
    ]
    groups = sorted(f"outbox-{uuidlib.uuid4().hex[:12]}" for _ in range(3))
    try:
        for group in groups:
            await feed(any_store, group, records, clock_of(records))
        logs = {log.group_id: log for log in await any_store.change_logs(groups)}
        assert all(log.seq > 3 and log.published == 0 for log in logs.values())
        first = await any_store.unpublished_changes(groups, 2)
        assert [(c.group_id, c.seq) for c in first] == [(g, s) for g in groups for s in (1, 2)]
        # What the relay publishes is each change's JSON as a reader gets it, byte for byte.
        read = [c for g in groups for c in await any_store.changes(g, 0, 2)]
        assert [c.value for c in first] == [c.model_dump_json().encode() for c in read]
        a, b, c = groups
        await any_store.mark_published({a: 2, b: 10_000})
        await any_store.mark_published({a: 1})  # never back
        after = {log.group_id: log for log in await any_store.change_logs(groups)}
        assert after[a].published == 2
        assert after[b].published == logs[b].seq  # never past the last change
        assert after[c].published == 0
        unpublished = {log.group_id for log in await any_store.change_logs(unpublished=True)}
        assert {a, c} <= unpublished and b not in unpublished
        rest = await any_store.unpublished_changes(groups, 1000)
        assert [(x.group_id, x.seq) for x in rest] == [
            *((a, s) for s in range(3, logs[a].seq + 1)),
            *((c, s) for s in range(1, logs[c].seq + 1)),
        ]
        assert await any_store.unpublished_changes([b], 1000) == []
    finally:
        for group in groups:
            await any_store.delete_group(group)


async def test_the_outbox_keeps_a_change_for_its_retention(any_store: GraphStore) -> None:
    """Changes committed before the cutoff go; through a relay only the published ones."""
    at = [crm.START + timedelta(days=d) for d in range(4)]
    records = [
        Record(f"rec-{i}", at[i], crm.plan_record((1, "Acme Corp"), plan, at[i]))
        for i, plan in enumerate(["Basic", "Pro", "Enterprise", "Basic"])
    ]
    times = {r.id: T0 + timedelta(days=10 * i) for i, r in enumerate(records)}
    group = f"outbox-{uuidlib.uuid4().hex[:12]}"
    try:
        await feed(any_store, group, records, times)
        outbox = await any_store.changes(group, 0, 1000)
        cutoff = times["rec-2"]  # the changes of rec-0 and rec-1 are older
        older = [c for c in outbox if c.committed_at is not None and c.committed_at < cutoff]
        assert older and len(older) < len(outbox)
        # Through a relay: nothing unpublished goes.
        assert await any_store.prune_changes(group, cutoff, published_only=True) == 0
        await any_store.mark_published({group: older[0].seq})
        assert await any_store.prune_changes(group, cutoff, published_only=True) == 1
        # Without one (the embedded store served in-process): every older change goes.
        assert await any_store.prune_changes(group, cutoff, published_only=False) == len(older) - 1
        kept = await any_store.changes(group, 0, 1000)
        assert [c.seq for c in kept] == [c.seq for c in outbox if c not in older]
        [log] = await any_store.change_logs([group])
        assert log.seq == outbox[-1].seq  # the cursor's numbering goes on
    finally:
        await any_store.delete_group(group)


async def test_an_embedded_store_from_before_the_rowid_outbox_keeps_its_changes(
    tmp_path: Path,
) -> None:
    """A file whose outbox is the earlier WITHOUT ROWID table: opening it moves the changes
    into the current table, the same changes, and the numbering goes on from there."""
    at = [crm.START + timedelta(days=d) for d in range(3)]
    records = [
        Record(f"rec-{i}", at[i], crm.plan_record((1, "Acme Corp"), plan, at[i]))
        for i, plan in enumerate(["Basic", "Pro", "Enterprise"])
    ]
    store = SqliteStore(tmp_path)
    await store.setup(DIM)
    await feed(store, "old", records[:2], clock_of(records))
    before = await store.changes("old", 0, 1000)
    await store.close()
    with sqlite3.connect(tmp_path / DB_FILE) as conn:  # the outbox as earlier files have it
        conn.executescript(
            """
            CREATE TABLE change_earlier (
                group_id TEXT NOT NULL, seq INTEGER NOT NULL, change_id TEXT NOT NULL,
                kind TEXT NOT NULL, uuid TEXT NOT NULL, body TEXT NOT NULL,
                committed_at INTEGER, PRIMARY KEY (group_id, seq)) WITHOUT ROWID;
            INSERT INTO change_earlier SELECT group_id, seq, change_id, kind, uuid, body,
                committed_at FROM change;
            DROP TABLE change;
            ALTER TABLE change_earlier RENAME TO change;
            CREATE INDEX change_uuid ON change (uuid);
            """
        )
    reopened = SqliteStore(tmp_path)
    try:
        await reopened.setup(DIM)
        assert await reopened.changes("old", 0, 1000) == before
        await feed(reopened, "old", records[2:], clock_of(records))
        after = await reopened.changes("old", 0, 1000)
        assert after[: len(before)] == before
        assert [c.seq for c in after] == list(range(1, len(after) + 1)) and len(after) > len(before)

        def schema(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE tbl_name = 'change'")
            return sorted(f"{name}: {sql}" for name, sql in rows)

        tables = await reopened.db.run(schema)
        assert [t.split(":")[0] for t in tables] == ["change", "change_group_seq", "change_uuid"]
        assert "WITHOUT ROWID" not in tables[0]
    finally:
        await reopened.close()
