"""Declared sources end to end: a CRM's tables in PostgreSQL, captured by Debezium's connector
in Kafka Connect, read by a worker through a sources file and one declared mapping per table,
into the graph. The facts valid at any time of the script are the tables' rows at that time;
the same with Connect's JSON converter and with Avro through the schema registry."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.topology_harness import Topology, eventually
from tests.support.crm_tables import MAPPING, SCHEMA, TABLES, Tables, initial, script, sources_file
from tests.support.debezium import CapturedDatabase, avro_converter
from tidegraph.stores.base import GraphStore
from tidegraph.topics.admin import admin_client

TENANTS = ("north", "south")


async def valid_facts(
    store: GraphStore, group: str, at: datetime | None = None, known_at: datetime | None = None
) -> set[tuple[str, str, str]]:
    facts = await store.browse.query_facts(group, valid_at=at, known_at=known_at)
    return {(f.subject, f.relation, f.object) for f in facts}


async def wait_topics(bootstrap: str, topics: list[str]) -> None:
    async def listed() -> set[str]:
        admin = admin_client(bootstrap)
        await admin.start()
        try:
            return set(await admin.list_topics())
        finally:
            await admin.close()

    await eventually(listed, lambda have: set(topics) <= have, timeout=60, what="change topics")


def db_clock(dsn: str) -> datetime:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


@pytest.mark.parametrize("value_format", ["json", "avro"])
async def test_the_graph_follows_the_tables_history(
    topology: Topology,
    postgres_dsn: str,
    connect_url: str,
    kafka_bootstrap: str,
    unique_id: str,
    tmp_path: Path,
    value_format: str,
    request: pytest.FixtureRequest,
) -> None:
    """``json``: Connect's JSON converter with schemas (the worker's default); ``avro``:
    Apicurio Registry's Avro converter, Confluent's wire format, this checkout's registry."""
    topology.mapping.write_text(MAPPING)
    group = f"{topology.run}-"
    tables = Tables()
    converter: dict[str, str] = {}
    source_format: dict[str, str] = {}
    if value_format == "avro":
        registry_url = request.getfixturevalue("schema_registry_url")
        converter = avro_converter(registry_url)
        source_format = {"format": "avro", "registry": f"{{url: '{registry_url}'}}"}
    name = f"crm{unique_id}"
    async with CapturedDatabase(postgres_dsn, connect_url, name, converter=converter) as db:
        db.execute(SCHEMA)
        for step in initial():
            db.execute(step.sql)
            step.apply(tables)
        await db.capture([f"public.{t}" for t in TABLES])
        await wait_topics(kafka_bootstrap, [db.topic(t) for t in TABLES])
        sources = tmp_path / "sources.yaml"
        sources.write_text(sources_file("crm", db.topic_prefix, group, **source_format))
        worker = topology.start_worker(
            TIDEGRAPH_SOURCES=str(sources), TIDEGRAPH_COMMUNITIES_ENABLED="false"
        )
        store = topology.store()
        try:
            # The snapshot (op r) gives the rows as they were when capture started.
            await _until_graph_is(store, group, tables)
            events = Counter(row["tenant"] for rows in (tables.accounts, tables.contacts,
                             tables.tickets) for row in rows.values())  # fmt: skip
            probes: list[tuple[datetime, Tables]] = [(db_clock(db.dsn), tables.copy())]
            steps = script()
            for i, step in enumerate(steps):
                if i == len(steps) // 2:
                    # Mid-stream: the worker dies without a word, Connect restarts the
                    # connector; a new worker takes over. Nothing is lost or doubled.
                    worker.kill()
                    await db.restart()
                    worker = topology.start_worker(
                        TIDEGRAPH_SOURCES=str(sources), TIDEGRAPH_COMMUNITIES_ENABLED="false"
                    )
                await asyncio.sleep(0.002)  # the next commit's millisecond follows the probe's
                before = tables.copy()
                db.execute(step.sql)
                step.apply(tables)
                events.update(step.tenants(before, tables))
                probes.append((db_clock(db.dsn), tables.copy()))
            await _until_graph_is(store, group, tables)
            for tenant in TENANTS:  # one episode per change event, none twice
                assert (await store.browse.counts(group + tenant))["episodes"] == events[tenant]
            far = datetime.now(UTC) + timedelta(days=1)
            for tenant in TENANTS:
                episodes = await store.recent_episodes(group + tenant, far, 1000)
                first = min(e.created_at for e in episodes if e.created_at is not None)
                before = first - timedelta(microseconds=1)
                assert await valid_facts(store, group + tenant, known_at=before) == set()
                for at, state in probes:
                    assert await valid_facts(store, group + tenant, at) == state.facts(tenant)
                    # As known once every change up to ``at`` was captured, the facts valid
                    # at ``at`` are already the rows of that moment (what was captured later
                    # starts later).
                    captured = max(e.created_at for e in episodes
                                   if e.valid_at <= at and e.created_at is not None)  # fmt: skip
                    known = await valid_facts(store, group + tenant, at, known_at=captured)
                    assert known == state.facts(tenant), (at, tenant)
            # A deleted row's entity and its history stay: Globex (account 2) had two owners.
            history = await store.browse.query_facts(group + "north", include_invalid=True)
            owners = [f.object for f in history if f.subject == "Account 2" and
                      f.relation == "OWNED_BY" and f.valid_at != f.invalid_at]  # fmt: skip
            assert sorted(owners) == ["Bob", "Dana"]
            # The update that rewrote an unchanged plan left the plan's fact untouched.
            plans = [f for f in history if f.subject == "Account 1" and f.relation == "HAS_PLAN"
                     and f.object == "Enterprise"]  # fmt: skip
            assert len(plans) == 1 and plans[0].invalid_at is None
            metrics = worker.metrics()
            assert "tidegraph_source_skipped_total" in metrics
            assert (
                worker.value("tidegraph_source_skipped_total", source="crm", kind="tombstone") == 2
            )
            assert await topology.dead_letters() == []
        finally:
            await store.close()


async def _until_graph_is(store: GraphStore, group: str, tables: Tables) -> Any:
    async def now() -> dict[str, set[tuple[str, str, str]]]:
        return {t: await valid_facts(store, group + t) for t in TENANTS}

    expected = {t: tables.facts(t) for t in TENANTS}
    return await eventually(now, lambda got: got == expected, timeout=120, what="the tables")


async def test_a_truncate_closes_the_tables_facts_when_the_source_says_so(
    topology: Topology,
    postgres_dsn: str,
    connect_url: str,
    kafka_bootstrap: str,
    unique_id: str,
    tmp_path: Path,
) -> None:
    """One tenant's database (a constant group), ``truncate: close``, and the connector set to
    send truncates (``skipped.operations=none``; its default skips them)."""
    topology.mapping.write_text(MAPPING)
    group = f"{topology.run}-north"
    name = f"trunc{unique_id}"
    extra = {"skipped.operations": "none"}
    async with CapturedDatabase(postgres_dsn, connect_url, name, extra=extra) as db:
        db.execute(SCHEMA)
        db.execute(
            "INSERT INTO accounts VALUES (1, 'north', 'Acme', 'Pro', 'Alice'),"
            " (2, 'north', 'Globex', 'Free', 'Bob');"
            "INSERT INTO contacts VALUES (7, 'north', 'Carol', 1);"
        )
        await db.capture(["public.accounts", "public.contacts"])
        topics = [db.topic("accounts"), db.topic("contacts")]
        await wait_topics(kafka_bootstrap, topics)
        sources = tmp_path / "sources.yaml"
        sources.write_text(
            f"sources:\n  - name: north\n    topics: [{', '.join(topics)}]\n"
            f"    envelope: debezium\n    group: {group}\n    truncate: close\n"
        )
        topology.start_worker(TIDEGRAPH_SOURCES=str(sources), TIDEGRAPH_COMMUNITIES_ENABLED="false")
        store = topology.store()
        contact = ("Carol", "WORKS_AT", "Account 1")  # another table's: untouched
        rows = {
            ("Account 1", "HAS_PLAN", "Pro"), ("Account 1", "OWNED_BY", "Alice"),
            ("Account 2", "HAS_PLAN", "Free"), ("Account 2", "OWNED_BY", "Bob"), contact,
        }  # fmt: skip
        try:
            await _until_facts(store, group, rows)
            before = db_clock(db.dsn)
            db.execute("TRUNCATE accounts")
            truncated = db_clock(db.dsn)
            await _until_facts(store, group, {contact})
            learned = datetime.now(UTC)
            db.execute("INSERT INTO accounts VALUES (3, 'north', 'Initech', 'Team', 'Dana')")
            after = {("Account 3", "HAS_PLAN", "Team"), ("Account 3", "OWNED_BY", "Dana")}
            await _until_facts(store, group, {*after, contact})
            assert await valid_facts(store, group, before) == rows
            assert await valid_facts(store, group, truncated) == {contact}
            # Known before the truncate was read, the rows were still there.
            assert await valid_facts(store, group, truncated, known_at=before) == rows
            captured = await valid_facts(store, group, truncated, known_at=learned)
            assert captured == {contact}
            # The entities and their history stay: the facts end at the truncate's time.
            history = await store.browse.query_facts(group, include_invalid=True)
            ended = {(f.subject, f.relation, f.object) for f in history
                     if f.invalid_at is not None and f.valid_at != f.invalid_at}  # fmt: skip
            assert ended == rows - {contact}
            # One episode per change event: 3 snapshot reads, the truncate, the insert.
            assert (await store.browse.counts(group))["episodes"] == 5
            assert await topology.dead_letters() == []
        finally:
            await store.close()


async def _until_facts(store: GraphStore, group: str, expected: set[tuple[str, str, str]]) -> Any:
    async def now() -> set[tuple[str, str, str]]:
        return await valid_facts(store, group)

    return await eventually(now, lambda got: got == expected, timeout=120, what="the facts")
