"""Forgetting gives exactly the graph of the remaining episodes, on every store (property test),
and a forgotten episode stays forgotten.

Random small feeds of mapped CRM records (those of ``test_delivery_order_stores``: late ones,
the same episode twice, the same record under another id, contradicting plans and statuses)
go into a group one episode at a time, each written at an ingestion time of its own (a
deterministic clock, so that both timelines can be compared exactly); then a random set of
them is forgotten. Another group gets the same feed without those episodes, at the same
times. The two must agree fact by fact on both timelines (every fact with its interval, its
created_at and expired_at, its end and start histories and its episodes), entity by entity,
in their counts and in what a search finds.
"""

from __future__ import annotations

import uuid as uuidlib
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.test_delivery_order_stores import DIM, Record, deliveries
from tests.support import crm_feed as crm
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.forget import forget_episodes, forget_subject
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.processors.steps import Components
from tidegraph.records.asof import AsOf
from tidegraph.records.episode import Episode
from tidegraph.records.search import SearchScope
from tidegraph.stores.base import GraphStore

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=crm.START.tzinfo)


def runner(store: GraphStore, times: dict[str, datetime]) -> GroupRunner:
    """A runner whose writes are stamped with each episode's time in ``times`` (by producer
    id), as if they had arrived then."""
    components = Components.of(
        store=store, embedder=HashingEmbedder(dim=DIM), llm=None, mappings=crm.crm_mappings()
    )
    components.clock = lambda episode: times[episode.id]
    return GroupRunner(components, unit_episodes=1)


def clock_of(records: list[Record]) -> dict[str, datetime]:
    times: dict[str, datetime] = {}
    for n, record in enumerate(records):
        times.setdefault(record.id, T0 + timedelta(minutes=n))
    return times


async def feed(store: GraphStore, group: str, records: list[Record], times: dict[str, datetime]):
    pipeline = runner(store, times)
    for record in records:
        [outcome] = await pipeline.run([record.episode(group)])
        assert outcome.failure is None, outcome.failure
    return pipeline


async def graph(store: GraphStore, group: str) -> dict[str, Any]:
    """Everything the group's graph says, by names (uuids derive from the group)."""
    names = {e.uuid: e.name for e in await store.list_entities(group)}
    facts = await store.query_facts(group, include_invalid=True)
    scope = SearchScope((group,), AsOf.resolve(None, None, True, None))
    found = await store.fulltext_search(scope, "fact", "plan Acme status ticket", 20)
    return {
        "counts": await store.counts(group),
        "facts": sorted(
            (
                f.subject,
                f.relation,
                f.object,
                f.fact,
                f.valid_at,
                f.invalid_at,
                f.created_at,
                f.expired_at,
                tuple(e.replace(group, "<g>") for e in f.episodes),
            )
            for f in facts
        ),
        "entities": sorted(
            (e.name, tuple(sorted(e.labels)), e.summary, e.key or "", tuple(sorted(e.aliases)))
            for e in await store.list_entities(group)
        ),
        "search": sorted(h.text for h in found),
        "names": sorted(names.values()),
    }


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(delivered=deliveries(), data=st.data())
async def test_forgetting_gives_the_graph_of_the_remaining_episodes(
    any_store: GraphStore, delivered: list[Record], data: st.DataObject
) -> None:
    ids = sorted({r.id for r in delivered})
    forgotten = set(data.draw(st.lists(st.sampled_from(ids), max_size=3, unique=True)))
    times = clock_of(delivered)
    group, expected_group = (f"forget-{uuidlib.uuid4().hex[:12]}" for _ in range(2))
    try:
        pipeline = await feed(any_store, group, delivered, times)
        report = await forget_episodes(pipeline, group, forgotten)
        assert sorted(report.episodes) == sorted(forgotten)
        remaining = [r for r in delivered if r.id not in forgotten]
        await feed(any_store, expected_group, remaining, times)
        assert await graph(any_store, group) == await graph(any_store, expected_group)
        # Forgotten stays forgotten: delivering the whole feed again changes nothing.
        before = await graph(any_store, group)
        for record in delivered:
            [outcome] = await pipeline.run([record.episode(group)])
            assert outcome.status == "processed", (record.id, outcome)
        assert await graph(any_store, group) == before
        for record in delivered:
            if record.id in forgotten:
                status = await any_store.episode_status(group, record.episode(group).uuid)
                assert status == "forgotten"
    finally:
        await any_store.delete_group(group)
        await any_store.delete_group(expected_group)


async def test_a_forgotten_subjects_episodes_go_and_the_changes_say_what_changed(
    any_store: GraphStore,
) -> None:
    """A contact who joins Acme then Globex asks to be erased: every episode mentioning them
    goes, their facts and entity go, the accounts stay; the outbox says what changed and
    keeps nothing of what was erased."""
    at = [crm.START + timedelta(days=d) for d in range(4)]
    contents = [
        crm.plan_record((1, "Acme Corp"), "Basic", at[0]),
        crm.contact_record("joined", (7, "Dana Reyes"), (1, "Acme Corp"), at[1]),
        crm.contact_record("joined", (7, "Dana Reyes"), (2, "Globex"), at[2]),
        crm.plan_record((2, "Globex"), "Pro", at[3]),
    ]
    records = [Record(f"rec-{i}", at[i], c) for i, c in enumerate(contents)]
    group = f"forget-{uuidlib.uuid4().hex[:12]}"
    try:
        pipeline = await feed(any_store, group, records, clock_of(records))
        [dana] = [e for e in await any_store.list_entities(group) if e.name == "Dana Reyes"]
        seq = (await any_store.change_logs([group]))[0].seq
        dry = await forget_subject(pipeline, group, dana.uuid, dry_run=True)
        assert dry.dry_run and sorted(dry.episodes) == ["rec-1", "rec-2"]
        assert (await any_store.change_logs([group]))[0].seq == seq  # a dry run writes nothing
        report = await forget_subject(pipeline, group, dana.uuid)
        assert sorted(report.episodes) == ["rec-1", "rec-2"] and report.entities_removed >= 1
        names = {e.name for e in await any_store.list_entities(group)}
        assert "Dana Reyes" not in names and {"Acme Corp", "Globex"} <= names
        assert all("Dana" not in f.fact for f in await any_store.query_facts(group, include_invalid=True))
        outbox = await any_store.changes(group, 0, 1000)
        assert [c.seq for c in outbox] == sorted(c.seq for c in outbox)
        kinds = {c.kind for c in outbox if c.seq > seq}
        assert {"episode.forgotten", "entity.forgotten", "fact.forgotten"} <= kinds
        assert all("Dana" not in c.model_dump_json() for c in outbox)  # erased everywhere
        episode = Episode(
            id="rec-1", group_id=group, source="json", content=contents[1], reference_time=at[1]
        )
        assert await any_store.episode_status(group, episode.uuid) == "forgotten"
    finally:
        await any_store.delete_group(group)
