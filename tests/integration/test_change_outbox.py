"""The outbox as the relay reads and moves it, on every store: each group's changes after its
cursor, a bounded number per group, in commit order; cursors that move only to changes the
relay published, never back; a relay round interleaved with a purge and new writes loses no
change; each deployment relays only the groups it writes."""

from __future__ import annotations

import dataclasses
import uuid as uuidlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_delivery_order_stores import DIM, Record
from tests.integration.test_forget import T0, clock_of, feed, runner
from tests.support import crm_feed as crm
from tests.unit.test_change_relay import Producer
from tidegraph.pipelines.forget import forget_episodes
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.pipelines.streaming.relay import relay_changes
from tidegraph.settings import Settings
from tidegraph.stores import open_store
from tidegraph.stores.base import GraphStore
from tidegraph.stores.memory.store import MemoryStore
from tidegraph.stores.neo4j.store import Neo4jStore
from tidegraph.stores.roles import Outbox
from tidegraph.stores.rows import joined_body
from tidegraph.stores.sqlite.db import DB_FILE, Transaction
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.store import SqliteStore

pytestmark = pytest.mark.integration

EVERY_PARTITION = ({0}, 1)  # a relay that owns every group: partition 0 of 1


def plan_records(account: tuple[int, str], plans: list[str]) -> list[Record]:
    at = [crm.START + timedelta(days=d) for d in range(len(plans))]
    return [
        Record(f"rec-{account[0]}-{i}", at[i], crm.plan_record(account, plan, at[i]))
        for i, plan in enumerate(plans)
    ]


async def relay_all(store: GraphStore, producer: Producer) -> None:
    """Relay rounds until one publishes nothing."""
    while await relay_changes(store.outbox, producer.send, *EVERY_PARTITION):
        pass


class DuringRound:
    """A store's outbox whose relay round is interleaved with other work, as another worker's writes
    or a forget are: ``after_logs`` runs right after the round's read of the outbox's state,
    ``after_read`` right after its read of the changes (before the cursors move)."""

    def __init__(self, outbox: Outbox, after_logs: Any = None, after_read: Any = None):
        self.outbox, self.after_logs, self.after_read = outbox, after_logs, after_read

    def __getattr__(self, name: str) -> Any:
        return getattr(self.outbox, name)

    async def change_logs(self, *args: Any, **kwargs: Any) -> Any:
        logs = await self.outbox.change_logs(*args, **kwargs)
        if self.after_logs is not None:
            await self.after_logs()
        return logs

    async def unpublished_changes(self, *args: Any, **kwargs: Any) -> Any:
        changes = await self.outbox.unpublished_changes(*args, **kwargs)
        if self.after_read is not None:
            await self.after_read()
        return changes


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
        logs = {log.group_id: log for log in await any_store.outbox.change_logs(groups)}
        assert all(log.seq > 3 and log.published == 0 for log in logs.values())
        first = await any_store.outbox.unpublished_changes(groups, 2)
        assert [(c.group_id, c.seq) for c in first] == [(g, s) for g in groups for s in (1, 2)]
        # What the relay publishes is each change's JSON as a reader gets it, byte for byte.
        read = [c for g in groups for c in await any_store.outbox.changes(g, 0, 2)]
        assert [c.value for c in first] == [c.model_dump_json().encode() for c in read]
        a, b, c = groups
        [b_last] = (await any_store.outbox.unpublished_changes([b], 1000))[-1:]
        await any_store.outbox.mark_published([first[1], b_last])  # a's second change, b's last
        await any_store.outbox.mark_published([first[0]])  # never back
        # A change that is not the one stored at its seq (another group's, a made-up one)
        # moves nothing.
        c_seq_2 = dataclasses.replace(first[1], group_id=c)
        await any_store.outbox.mark_published(
            [c_seq_2, dataclasses.replace(b_last, seq=b_last.seq + 1)]
        )
        after = {log.group_id: log for log in await any_store.outbox.change_logs(groups)}
        assert after[a].published == 2
        assert after[b].published == logs[b].seq == b_last.seq
        assert after[c].published == 0
        unpublished = {log.group_id for log in await any_store.outbox.change_logs(unpublished=True)}
        assert {a, c} <= unpublished and b not in unpublished
        rest = await any_store.outbox.unpublished_changes(groups, 1000)
        assert [(x.group_id, x.seq) for x in rest] == [
            *((a, s) for s in range(3, logs[a].seq + 1)),
            *((c, s) for s in range(1, logs[c].seq + 1)),
        ]
        assert await any_store.outbox.unpublished_changes([b], 1000) == []
    finally:
        for group in groups:
            await any_store.forget.delete_group(group)


async def outbox_rows(store: GraphStore, group: str) -> int:
    """How many rows the group's outbox holds, as the store keeps it."""
    if isinstance(store, Neo4jStore):
        query = "MATCH (c:Change) WHERE c.group_id = $group RETURN count(c) AS n"
        return int((await store.ex.rows(query, {"group": group}))[0]["n"])
    if isinstance(store, SqliteStore):

        def count(conn: sqlite3.Connection) -> int:
            return int(
                conn.execute("SELECT count(*) FROM change WHERE group_id = ?", (group,)).fetchone()[
                    0
                ]
            )

        return await store.db.run(count)
    assert isinstance(store, MemoryStore)
    return len(store._changes.get(group, []))


async def test_a_unit_of_episodes_is_one_outbox_row_its_readers_split(
    any_store: GraphStore,
) -> None:
    """The episodes of a unit are written in one transaction: their changes are one row of the
    outbox (a row per write without transactions), which readers and the relay get as the
    changes, numbered in order, each as if it were stored alone; a forget of one of those
    episodes takes its records' changes out of the row and leaves the others where they were."""
    at = [crm.START + timedelta(days=d) for d in range(4)]
    records = [
        Record("rec-0", at[0], crm.plan_record((1, "Acme Corp"), "Basic", at[0])),
        Record("rec-1", at[1], crm.plan_record((2, "Globex"), "Pro", at[1])),
        Record("rec-2", at[2], crm.plan_record((1, "Acme Corp"), "Pro", at[2])),
        Record("rec-3", at[3], crm.plan_record((3, "Initech"), "Basic", at[3])),
    ]
    group = f"outbox-{uuidlib.uuid4().hex[:12]}"
    single = runner(any_store, clock_of(records))
    unit = GroupRunner(single.components, unit_episodes=len(records))
    try:
        outcomes = await unit.run([r.episode(group) for r in records])
        assert [o.status for o in outcomes] == ["written"] * len(records)
        # (the in-memory store has no transactions: each write commits alone, a row each)
        one_per_write = isinstance(any_store, MemoryStore)
        assert await outbox_rows(any_store, group) == (len(records) if one_per_write else 1)
        changes = await any_store.outbox.changes(group, 0, 1000)
        assert [c.seq for c in changes] == list(range(1, len(changes) + 1))
        assert [c.episode_id for c in changes] == sorted(c.episode_id or "" for c in changes)
        assert {"fact.created", "fact.invalidated", "fact.expired"} <= {c.kind for c in changes}
        # Pages of it, the relay's batches and the JSON it publishes: the same changes.
        pages = [c for after in range(0, len(changes), 3) for c in
                 await any_store.outbox.changes(group, after, 3) if c.seq <= after + 3]  # fmt: skip
        assert pages == changes
        published = await any_store.outbox.unpublished_changes([group], 5)
        assert [c.value for c in published] == [c.model_dump_json().encode() for c in changes[:5]]
        # Forgetting Globex's record: the changes of the records it removes leave the row,
        # the others stay as they were.
        await forget_episodes(unit, group, ["rec-1"])
        after = await any_store.outbox.changes(group, 0, 1000)
        forget = [c for c in after if c.seq > changes[-1].seq]
        gone = {c.uuid for c in forget if c.kind in ("fact.forgotten", "entity.forgotten")}
        assert gone and gone <= {c.uuid for c in changes if c.episode_id == "rec-1"}
        assert after == [c for c in changes if c.uuid not in gone] + forget
        assert await outbox_rows(any_store, group) == (len(records) if one_per_write else 1) + 1
    finally:
        await any_store.forget.delete_group(group)


async def test_an_embedded_forget_blanks_its_records_lines_in_place(tmp_path: Path) -> None:
    """On the embedded store a forget blanks the lines of the records it removes in their
    outbox row, each column keeping its size in bytes: SQLite then overwrites the row in place,
    only the pages those lines were on (a row is a whole write unit's changes), and no byte
    of the removed lines stays in the row."""
    at = [crm.START + timedelta(days=d) for d in range(4)]
    records = [
        Record("rec-0", at[0], crm.plan_record((1, "Acme Corp"), "Basic", at[0])),
        Record("rec-1", at[1], crm.plan_record((2, "Zürich Globex"), "Pro", at[1])),
        Record("rec-2", at[2], crm.plan_record((1, "Acme Corp"), "Pro", at[2])),
        Record("rec-3", at[3], crm.plan_record((3, "Initech"), "Basic", at[3])),
    ]
    store = SqliteStore(tmp_path / "graph")
    await store.setup(DIM)
    group = f"outbox-{uuidlib.uuid4().hex[:12]}"
    single = runner(store, clock_of(records))
    unit = GroupRunner(single.components, unit_episodes=len(records))
    columns = "change_id, kind, uuid, body"

    def first_row(conn: sqlite3.Connection) -> dict[str, Any]:
        names = columns.split(", ")
        row = conn.execute(
            f"SELECT {columns} FROM change WHERE group_id = ? ORDER BY last LIMIT 1", (group,)
        ).fetchone()
        return dict(zip(names, row, strict=True))

    try:
        await unit.run([r.episode(group) for r in records])
        before = await store.db.run(first_row)
        changes = await store.outbox.changes(group, 0, 1000)
        await forget_episodes(unit, group, ["rec-1"])
        after = await store.db.run(first_row)
        gone = {c.uuid for c in await store.outbox.changes(group, changes[-1].seq, 1000)}
        gone_lines = [c for c in changes if c.uuid in gone]
        assert gone_lines and len(gone_lines) < len(changes)
        for column in columns.split(", "):
            assert len(after[column].encode()) == len(before[column].encode()), column
            lines = after[column].split("\n")
            assert len(lines) == len(changes)
            for change, line in zip(changes, lines, strict=True):
                if change.uuid in gone:
                    assert line.isspace(), (column, line)
                else:
                    assert line == before[column].split("\n")[change.seq - 1]
        assert "Zürich" not in after["body"] and "Zürich" in before["body"]
    finally:
        await store.close()


async def test_a_neo4j_forget_empties_its_records_lines_on_the_server(neo4j_uri: str) -> None:
    """On Neo4j a forget empties the lines of the records it removes in their outbox row on
    the server (the row is not read to the client and written back): every other line of
    every column stays byte for byte where it was, lines after text beyond the Basic
    Multilingual Plane included (Cypher's offsets count characters), the relay publishes the
    same bytes for them as before, and a row left with no change is deleted."""
    at = [crm.START + timedelta(days=d) for d in range(5)]
    records = [
        Record("rec-0", at[0], crm.plan_record((1, "Acme 😀 Corp"), "Basic", at[0])),
        Record("rec-1", at[1], crm.plan_record((2, "Zürich Globex"), "Pro", at[1])),
        Record("rec-2", at[2], crm.plan_record((1, "Acme 😀 Corp"), "Pro", at[2])),
        Record("rec-3", at[3], crm.plan_record((3, "Initech 𝔉"), "Basic", at[3])),
    ]
    alone = Record("rec-4", at[4], crm.plan_record((4, "Umbrella Ünited"), "Pro", at[4]))
    store = Neo4jStore(neo4j_uri)
    await store.setup(DIM)
    group = f"outbox-{uuidlib.uuid4().hex[:12]}"
    single = runner(store, clock_of([*records, alone]))
    unit = GroupRunner(single.components, unit_episodes=len(records))
    columns = ("change_id", "kind", "uuid", "body")
    first_row = (
        "MATCH (c:Change) WHERE c.group_id = $group WITH c ORDER BY c.last LIMIT 1 "
        "OPTIONAL MATCH (r:ChangeRecord {group_id: c.group_id, last: c.last}) "
        "RETURN c.change_id AS change_id, c.kind AS kind, c.uuid AS uuid, "
        "collect([r.uuid, r.body]) AS parts"
    )
    stored = (
        "MATCH (n) WHERE (n:Change OR n:ChangeRecord) AND n.group_id = $group "
        "RETURN collect(n.body) + collect(n.uuid) AS texts"
    )

    async def row() -> dict[str, str]:
        [found] = await store.ex.rows(first_row, {"group": group})
        return {**found, "body": joined_body(found["uuid"], found["parts"])}

    try:
        await unit.run([r.episode(group) for r in records])
        await single.run([alone.episode(group)])
        before = await row()
        changes = await store.outbox.changes(group, 0, 1000)
        published = await store.outbox.unpublished_changes([group], 1000)
        assert await outbox_rows(store, group) == 2
        await forget_episodes(unit, group, ["rec-1", "rec-4"])
        after = await row()
        last = changes[-1].seq
        kept = [c for c in await store.outbox.changes(group, 0, 1000) if c.seq <= last]
        gone = {c.uuid for c in changes} - {c.uuid for c in kept}
        in_row = [c for c in changes if c.seq <= len(before["uuid"].split("\n"))]
        assert gone & {c.uuid for c in in_row} and len(kept) < len(in_row)
        for column in columns:
            lines = after[column].split("\n")
            assert len(lines) == len(in_row), column
            for change, line in zip(in_row, lines, strict=True):
                was = before[column].split("\n")[change.seq - 1]
                assert line == ("" if change.uuid in gone else was), (column, change.seq)
        assert "Zürich" in before["body"]
        [texts] = await store.ex.rows(stored, {"group": group})
        assert not [t for t in texts["texts"] if "Zürich" in t or "Umbrella" in t]
        # rec-4's row held only its own records' changes: it is gone, its changes with it
        assert await outbox_rows(store, group) == 2  # the first row and the forget's own
        assert all("Umbrella" not in c.model_dump_json() for c in kept)
        still = await store.outbox.unpublished_changes([group], 1000)
        assert [c.value for c in still if c.seq <= last] == [
            c.value for c in published if c.seq in {k.seq for k in kept}
        ]
    finally:
        await store.forget.delete_group(group)
        await store.close()


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
        outbox = await any_store.outbox.changes(group, 0, 1000)
        cutoff = times["rec-2"]  # the changes of rec-0 and rec-1 are older
        older = [c for c in outbox if c.committed_at is not None and c.committed_at < cutoff]
        assert older and len(older) < len(outbox)
        # Through a relay: nothing unpublished goes, and a write's changes go together (the
        # outbox keeps a row per write): once the last of them is published.
        assert await any_store.outbox.prune_changes(group, cutoff, published_only=True) == 0
        first_write = [c for c in outbox if c.episode_id == older[0].episode_id]
        assert len(first_write) > 1 and first_write == older[: len(first_write)]
        [first] = await any_store.outbox.unpublished_changes([group], 1)
        assert first.seq == older[0].seq
        await any_store.outbox.mark_published([first])
        assert await any_store.outbox.prune_changes(group, cutoff, published_only=True) == 0
        published = await any_store.outbox.unpublished_changes([group], len(first_write))
        await any_store.outbox.mark_published(published[-1:])
        assert await any_store.outbox.prune_changes(group, cutoff, published_only=True) == len(
            first_write
        )
        # Without one (the embedded store served in-process): every older change goes.
        assert await any_store.outbox.prune_changes(group, cutoff, published_only=False) == len(
            older
        ) - len(first_write)
        kept = await any_store.outbox.changes(group, 0, 1000)
        assert [c.seq for c in kept] == [c.seq for c in outbox if c not in older]
        [log] = await any_store.outbox.change_logs([group])
        assert log.seq == outbox[-1].seq  # the cursor's numbering goes on
        # The relay's cursor moved past the unpublished changes that went, in the same write:
        # it never waits for a change that is gone.
        assert log.published == older[-1].seq
    finally:
        await any_store.forget.delete_group(group)


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
    before = await store.outbox.changes("old", 0, 1000)
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
        assert await reopened.outbox.changes("old", 0, 1000) == before
        await feed(reopened, "old", records[2:], clock_of(records))
        after = await reopened.outbox.changes("old", 0, 1000)
        assert after[: len(before)] == before
        assert [c.seq for c in after] == list(range(1, len(after) + 1)) and len(after) > len(before)

        def schema(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE tbl_name = 'change'")
            return sorted(f"{name}: {sql}" for name, sql in rows)

        tables = await reopened.db.run(schema)
        assert [t.split(":")[0] for t in tables] == ["change", "change_group_last"]
        assert "WITHOUT ROWID" not in tables[0]
    finally:
        await reopened.close()


@pytest.mark.parametrize("when", ["between the relay's reads", "after its reads"])
async def test_a_group_purged_and_written_anew_during_a_relay_round_loses_no_change(
    any_store: GraphStore, when: str
) -> None:
    """A round reads the outbox's state, then the changes, then moves the cursors: a group
    purged (its log and changes gone) and written anew meanwhile keeps its cursor where the
    new changes start, whatever the round read, and the next rounds publish them all."""
    any_store.deployment = f"outbox-{uuidlib.uuid4().hex[:12]}"  # this test's groups alone
    group = f"outbox-{uuidlib.uuid4().hex[:12]}"
    before = plan_records((1, "Acme Corp"), ["Basic", "Pro", "Enterprise"])
    anew = plan_records((2, "Globex"), ["Basic", "Pro"])

    async def purge() -> None:
        await any_store.forget.forget_group(group, T0, purge=True)

    async def rewrite() -> None:
        await feed(any_store, group, anew, clock_of(anew))

    async def purge_and_rewrite() -> None:
        await purge()
        await rewrite()

    try:
        await feed(any_store, group, before, clock_of(before))
        [log] = await any_store.outbox.change_logs([group])
        assert log.seq > 3 and log.published == 0
        round_ = (
            DuringRound(any_store.outbox, after_logs=purge, after_read=rewrite)
            if when == "between the relay's reads"
            else DuringRound(any_store.outbox, after_read=purge_and_rewrite)
        )
        producer = Producer()
        await relay_changes(round_, producer.send, *EVERY_PARTITION)  # type: ignore[arg-type]
        await relay_all(any_store, producer)
        written = await any_store.outbox.changes(group, 0, 1000)
        assert written and all(c.episode_id in {r.id for r in anew} for c in written)
        published = {value["change_id"] for key, value in producer.sent if key == group.encode()}
        assert {c.change_id for c in written} <= published
        [log] = await any_store.outbox.change_logs([group])
        assert log.published == log.seq == written[-1].seq
    finally:
        await any_store.forget.delete_group(group)


@pytest.mark.parametrize("kind", ["neo4j", "sqlite"])
async def test_each_deployment_relays_only_the_groups_it_writes(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Two deployments (topic prefixes) share one store: each one's relay publishes and
    marks only the groups it writes (those its in-process writers write too, as their
    stores are opened with its settings). A group belongs to its first writer; a log from
    before deployments were recorded is relayed once a deployment writes the group again."""
    run = uuidlib.uuid4().hex[:12]

    def settings(prefix: str) -> Settings:
        if kind == "neo4j":
            uri = str(request.getfixturevalue("neo4j_uri"))
            return Settings(store="neo4j", neo4j_uri=uri, topic_prefix=prefix)
        return Settings(store="embedded", data_dir=tmp_path, topic_prefix=prefix)

    a, b = open_store(settings(f"a{run}")), open_store(settings(f"b{run}"))
    ga, gb, shared, legacy = (f"outbox-{run}-{name}" for name in ("a", "b", "shared", "legacy"))
    acme, globex = (
        plan_records((1, "Acme Corp"), ["Basic", "Pro"]),
        plan_records((2, "Globex"), ["Basic", "Enterprise"]),
    )
    try:
        for store in (a, b):
            await store.setup(DIM)
        await feed(a, ga, acme, clock_of(acme))
        await feed(b, gb, acme, clock_of(acme))
        await feed(b, shared, acme[:1], clock_of(acme))  # b's first: b's group
        await feed(a, shared, acme[1:], clock_of(acme))
        await feed(a, legacy, acme[:1], clock_of(acme))
        await _forget_deployment(a, legacy)  # as written before deployments were recorded
        assert {log.group_id for log in await a.outbox.change_logs(own=True)} == {ga}
        assert {log.group_id for log in await b.outbox.change_logs(own=True)} == {gb, shared}
        # a's relay never marks b's groups, even given b's changes.
        await a.outbox.mark_published(await b.outbox.unpublished_changes([gb], 1))
        assert [log.published for log in await b.outbox.change_logs([gb])] == [0]
        from_a, from_b = Producer(), Producer()
        await relay_all(a, from_a)
        assert {key.decode() for key, _ in from_a.sent} == {ga}
        assert [log.published for log in await a.outbox.change_logs([gb, shared, legacy])] == [
            0,
            0,
            0,
        ]
        await feed(b, legacy, globex[:1], clock_of(globex))  # its next writer takes it
        await relay_all(b, from_b)
        assert {key.decode() for key, _ in from_b.sent} == {gb, shared, legacy}
        for store, producer, groups in ((a, from_a, [ga]), (b, from_b, [gb, shared, legacy])):
            for group in groups:
                sent = [v["change_id"] for k, v in producer.sent if k == group.encode()]
                assert sent == [c.change_id for c in await store.outbox.changes(group, 0, 1000)]
    finally:
        for group in (ga, gb, shared, legacy):
            await a.forget.delete_group(group)
        await a.close()
        await b.close()


async def _forget_deployment(store: GraphStore, group: str) -> None:
    """Take the deployment off the group's log, as logs written before it was recorded are."""
    if isinstance(store, Neo4jStore):
        await store.ex.execute(
            "MATCH (log:ChangeLog {group_id: $group}) REMOVE log.deployment", {"group": group}
        )
        return
    assert isinstance(store, SqliteStore)

    def clear(conn: sqlite3.Connection) -> None:
        with Transaction(conn):
            conn.execute("UPDATE change_log SET deployment = NULL WHERE group_id = ?", (group,))

    await store.db.run(clear)


async def _without_index_of_records(store: GraphStore, group: str) -> None:
    """The store as one written before its outbox was indexed by record (on Neo4j, shared by
    the suite's tests, only ``group``'s entries are taken away, their bodies back in their
    rows' ``body`` as such a store kept them: the migration indexes the rows that have
    none)."""
    if isinstance(store, SqliteStore):

        def drop(conn: sqlite3.Connection) -> None:
            conn.execute("DROP TABLE change_record")

        await store.db.run(drop)
    else:
        assert isinstance(store, Neo4jStore)
        rows = await store.ex.rows(
            "MATCH (c:Change {group_id: $g}) "
            "OPTIONAL MATCH (r:ChangeRecord {group_id: $g, last: c.last}) "
            "RETURN elementId(c) AS id, c.uuid AS uuids, collect([r.uuid, r.body]) AS parts",
            {"g": group},
        )
        bodies = [{"id": r["id"], "body": joined_body(r["uuids"], r["parts"])} for r in rows]
        await store.ex.execute(
            "UNWIND $rows AS row MATCH (c:Change) WHERE elementId(c) = row.id "
            "SET c.body = row.body",
            {"rows": bodies},
        )
        await store.ex.execute("MATCH (r:ChangeRecord {group_id: $g}) DELETE r", {"g": group})
        await store.ex.execute("DROP INDEX change_record_group IF EXISTS", {}, schema=True)


async def test_a_forget_purges_the_changes_of_an_outbox_written_before_its_index(
    store: GraphStore,
) -> None:
    """A store whose outbox rows were written before they were indexed by record: set up
    again, it indexes them, and a forget then takes the erased person's changes out of those
    rows (the purge finds rows only through that index)."""
    at = [crm.START + timedelta(days=d) for d in range(3)]
    contents = [
        crm.plan_record((1, "Acme Corp"), "Basic", at[0]),
        crm.contact_record("joined", (7, "Dana Reyes"), (1, "Acme Corp"), at[1]),
        crm.plan_record((1, "Acme Corp"), "Pro", at[2]),
    ]
    records = [Record(f"rec-{i}", at[i], c) for i, c in enumerate(contents)]
    group = f"index-{uuidlib.uuid4().hex[:12]}"
    try:
        pipeline = await feed(store, group, records, clock_of(records))
        assert any("Dana" in c.model_dump_json() for c in await store.outbox.changes(group, 0, 99))
        await _without_index_of_records(store, group)
        await store.setup(DIM)
        await forget_episodes(pipeline, group, ["rec-1"])
        outbox = await store.outbox.changes(group, 0, 1000)
        assert {c.kind for c in outbox} >= {"episode.forgotten", "fact.created"}
        assert all("Dana" not in c.model_dump_json() for c in outbox)
    finally:
        await store.forget.delete_group(group)
