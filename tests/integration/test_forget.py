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

import re
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.graph_compare import timelines
from tests.integration.test_delivery_order_stores import DIM, Record, deliveries
from tests.support import crm_feed as crm
from tests.support.extraction_requests import on_extraction
from tests.support.fake_llm import FakeRequest, ScriptedLLMServer
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.llm import LLMClient
from tidegraph.pipelines.community_service import CommunityService
from tidegraph.pipelines.forget import forget_episodes, forget_subject
from tidegraph.pipelines.pending import extract_pending
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
    """Everything the group's graph says, by names (uuids derive from the group), both
    timelines exact, and what a search finds."""
    names = {e.uuid: e.name for e in await store.browse.list_entities(group)}
    scope = SearchScope((group,), AsOf.resolve(None, None, True, None))
    found = await store.search.fulltext_search(scope, "fact", "plan Acme status ticket", 20)
    return {
        **await timelines(store, group),
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
        await any_store.forget.delete_group(group)
        await any_store.forget.delete_group(expected_group)


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
        await CommunityService(any_store, None, HashingEmbedder(dim=DIM)).refresh(group)
        grouped = await any_store.communities.list_communities(group)
        assert any("Dana" in c.name + c.summary for c in grouped), grouped
        [dana] = [e for e in await any_store.browse.list_entities(group) if e.name == "Dana Reyes"]
        seq = (await any_store.outbox.change_logs([group]))[0].seq
        dry = await forget_subject(pipeline, group, dana.uuid, dry_run=True)
        assert dry.dry_run and sorted(dry.episodes) == ["rec-1", "rec-2"]
        assert (await any_store.outbox.change_logs([group]))[
            0
        ].seq == seq  # a dry run writes nothing
        report = await forget_subject(pipeline, group, dana.uuid)
        assert sorted(report.episodes) == ["rec-1", "rec-2"] and report.entities_removed >= 1
        names = {e.name for e in await any_store.browse.list_entities(group)}
        assert "Dana Reyes" not in names and {"Acme Corp", "Globex"} <= names
        # The community she was in goes at once (its name and summary carried her name).
        assert all(
            "Dana" not in c.name + c.summary
            for c in await any_store.communities.list_communities(group)
        )
        assert all(
            "Dana" not in f.fact
            for f in await any_store.browse.query_facts(group, include_invalid=True)
        )
        outbox = await any_store.outbox.changes(group, 0, 1000)
        assert [c.seq for c in outbox] == sorted(c.seq for c in outbox)
        kinds = {c.kind for c in outbox if c.seq > seq}
        assert {"episode.forgotten", "entity.forgotten", "fact.forgotten"} <= kinds
        assert all("Dana" not in c.model_dump_json() for c in outbox)  # erased everywhere
        episode = Episode(
            id="rec-1", group_id=group, source="json", content=contents[1], reference_time=at[1]
        )
        assert await any_store.episode_status(group, episode.uuid) == "forgotten"
    finally:
        await any_store.forget.delete_group(group)


async def test_forgetting_a_group_leaves_the_other_groups_as_they_were(
    any_store: GraphStore,
) -> None:
    """A tenant leaves: every record of its group goes (its episodes stay tombstones, so a
    replay never restores them; with purge not even those), and the other group is counted,
    read and searched exactly as before."""
    at = [crm.START + timedelta(days=d) for d in range(3)]
    records = [
        Record("rec-0", at[0], crm.plan_record((1, "Acme Corp"), "Basic", at[0])),
        Record("rec-1", at[1], crm.contact_record("joined", (7, "Dana"), (1, "Acme Corp"), at[1])),
        Record("rec-2", at[2], crm.plan_record((1, "Acme Corp"), "Pro", at[2])),
    ]
    leaving, staying = (f"forget-{uuidlib.uuid4().hex[:12]}" for _ in range(2))
    try:
        times = clock_of(records)
        pipeline = await feed(any_store, leaving, records, times)
        await feed(any_store, staying, records, times)
        kept = await graph(any_store, staying)
        kept_changes = await any_store.outbox.changes(staying, 0, 1000)
        assert await any_store.forget.forget_group(leaving, T0) == 3
        assert await any_store.browse.counts(leaving) == {
            "episodes": 0, "entities": 0, "facts": 0, "mentions": 0
        }  # fmt: skip
        assert await any_store.browse.list_entities(leaving) == []
        assert [c.kind for c in await any_store.outbox.changes(leaving, 0, 1000)] == [
            "group.forgotten"
        ]
        assert len(await any_store.browse.list_episodes(leaving, status="forgotten")) == 3
        for record in records:  # replayed: skipped, as forgotten
            [outcome] = await pipeline.run([record.episode(leaving)])
            assert outcome.status == "processed"
        assert await any_store.browse.counts(leaving) == {
            "episodes": 0, "entities": 0, "facts": 0, "mentions": 0
        }  # fmt: skip
        assert await any_store.forget.forget_group(leaving, T0, purge=True) == 0
        assert await any_store.browse.list_episodes(leaving, status="forgotten") == []
        assert await any_store.outbox.change_logs([leaving]) == []
        assert await graph(any_store, staying) == kept
        assert await any_store.outbox.changes(staying, 0, 1000) == kept_changes
    finally:
        await any_store.forget.delete_group(leaving)
        await any_store.forget.delete_group(staying)


async def test_a_groups_episodes_are_listed_by_time_in_pages(any_store: GraphStore) -> None:
    at = [crm.START + timedelta(days=d) for d in range(5)]
    records = [
        Record(f"rec-{i}", at[i], crm.plan_record((1, "Acme Corp"), plan, at[i]))
        for i, plan in enumerate(["Basic", "Pro", "Basic", "Enterprise", "Pro"])
    ]
    group = f"browse-{uuidlib.uuid4().hex[:12]}"
    try:
        pipeline = await feed(any_store, group, records, clock_of(records))
        first = await any_store.browse.list_episodes(group, limit=2)
        assert [e.producer_id for e in first] == ["rec-0", "rec-1"]
        last = first[-1]
        assert last.valid_at is not None
        rest = await any_store.browse.list_episodes(
            group, after=(last.valid_at, last.uuid), limit=10
        )
        assert [e.producer_id for e in rest] == ["rec-2", "rec-3", "rec-4"]
        ranged = await any_store.browse.list_episodes(group, since=at[1], until=at[3])
        assert [e.producer_id for e in ranged] == ["rec-1", "rec-2"]
        assert all(e.status == "written" and e.content for e in ranged)
        await forget_episodes(pipeline, group, ["rec-2"])
        assert [e.producer_id for e in await any_store.browse.list_episodes(group)] == [
            "rec-0", "rec-1", "rec-3", "rec-4"
        ]  # fmt: skip
        [tombstone] = await any_store.browse.list_episodes(group, status="forgotten")
        assert tombstone.status == "forgotten" and tombstone.content == ""
        assert tombstone.producer_id == "" and tombstone.forgotten_at is not None
    finally:
        await any_store.forget.delete_group(group)


async def test_a_forgotten_unextracted_episode_is_not_extracted_later(
    any_store: GraphStore,
) -> None:
    """A text episode stored without extraction (no LLM) and then forgotten is no longer
    pending: ``extract --pending`` does not bring it back."""
    at = crm.START + timedelta(days=1)
    records = [Record("rec-0", crm.START, crm.plan_record((1, "Acme Corp"), "Basic", crm.START))]
    note = Episode(
        id="note-1",
        group_id=f"forget-{uuidlib.uuid4().hex[:12]}",
        source="text",
        content="Dana from Acme Corp asked about the renewal.",
        reference_time=at,
    )
    group = note.group_id
    times = {**clock_of(records), note.id: T0 + timedelta(hours=1)}
    try:
        pipeline = await feed(any_store, group, records, times)
        [outcome] = await pipeline.run([note])
        assert outcome.not_extracted == "no_llm"
        assert [e.producer_id for e in await any_store.pending_episodes(group, 10)] == ["note-1"]
        await forget_episodes(pipeline, group, ["note-1"])
        assert group not in await any_store.pending_groups()
        assert await any_store.pending_episodes(group, 10) == []
        report = await extract_pending(pipeline, any_store, [group])
        assert (report.extracted, report.still_pending, report.failed) == (0, {}, {})
        assert await any_store.episode_status(group, note.uuid) == "forgotten"
    finally:
        await any_store.forget.delete_group(group)


# ---- text feeds: the LLM extracts and judges (a scripted server on loopback)
SPEAKERS = ["Ana Lima", "Ben Okafor", "Chen Wu"]
COMPANIES = ["Harbor Freight", "Acme", "Globex"]
CLAIMS = ["moved to the Starter plan", "reports invoices shown twice", "renewed its contract"]


@dataclass(frozen=True)
class Message:
    id: str
    speaker: str
    company: str
    claim: str

    def episode(self, group: str, at: datetime) -> Episode:
        return Episode(
            id=self.id,
            group_id=group,
            source="message",
            content=f"{self.speaker}: {self.company} {self.claim}.",
            reference_time=at,
        )


messages = st.lists(
    st.builds(
        Message,
        st.just(""),
        st.sampled_from(SPEAKERS),
        st.sampled_from(COMPANIES),
        st.sampled_from(CLAIMS),
    ),
    min_size=2,
    max_size=8,
).map(lambda drawn: [replace(m, id=f"chat-{n}") for n, m in enumerate(drawn)])

_SAID = re.compile(
    r"^(?P<speaker>[^:\n]+): (?P<company>.+?) (?P<claim>(?:{})).$".format(
        "|".join(map(re.escape, CLAIMS))
    ),
    re.MULTILINE,
)


def extract_message(request: FakeRequest) -> dict[str, Any]:
    """The speaker, the company and what the speaker says of it, from the message alone."""
    current = request.user.split("Current episode", 1)[1].split("\n", 1)[1]
    said = _SAID.search(current)
    assert said, current
    return {
        "entities": [
            {"name": said["speaker"], "type": "Person", "summary": None},
            {"name": said["company"], "type": "Organization", "summary": None},
        ],
        "facts": [
            {
                "subject": said["company"],
                "relation": "STATUS",
                "object": said["speaker"],
                "fact": f"{said['company']} {said['claim']} (as {said['speaker']} says)",
                "valid_at": None,
                "invalid_at": None,
            }
        ],
    }


@pytest.fixture(scope="module")
def text_llm() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as server:
        on_extraction(server, extract_message)
        server.on("EntityResolutionOutput", lambda _: {"matches": []})
        server.on("FactResolutionOutput", lambda _: {"judgements": []})
        yield server


async def feed_text(
    store: GraphStore, server: ScriptedLLMServer, group: str, feed: list[Message]
) -> GroupRunner:
    """``feed`` written one message at a time, each at an ingestion time of its own (by its
    place in the whole feed, as its reference time: the same in a feed without some)."""
    llm = LLMClient(base_url=server.base_url, api_key="test", model="fake", cache=None)
    components = Components.of(
        store=store, embedder=HashingEmbedder(dim=DIM), llm=llm, mappings=None
    )
    components.clock = lambda episode: T0 + timedelta(minutes=int(episode.id.split("-")[1]))
    pipeline = GroupRunner(components, unit_episodes=1)
    for message in feed:
        at = T0 + timedelta(hours=int(message.id.split("-")[1]))
        [outcome] = await pipeline.run([message.episode(group, at)])
        assert outcome.failure is None, outcome.failure
    return pipeline


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(feed=messages, data=st.data())
async def test_forgetting_in_a_text_group_gives_the_graph_of_the_remaining_episodes(
    any_store: GraphStore, text_llm: ScriptedLLMServer, feed: list[Message], data: st.DataObject
) -> None:
    """A group the LLM extracted (its judgements search the whole group) is replayed whole,
    and the result is the graph its remaining messages give, by episodes and by subject."""
    group, expected_group = (f"forget-{uuidlib.uuid4().hex[:12]}" for _ in range(2))
    ids = [m.id for m in feed]
    named = set(data.draw(st.lists(st.sampled_from(ids), max_size=2, unique=True)))
    by_subject = data.draw(st.sampled_from(["", *COMPANIES]), label="subject")
    try:
        pipeline = await feed_text(any_store, text_llm, group, feed)
        forgotten = {m.id for m in feed if m.id in named}
        if forgotten:
            await forget_episodes(pipeline, group, forgotten)
        if by_subject and by_subject in [m.company for m in feed if m.id not in forgotten]:
            [entity] = [
                e for e in await any_store.browse.list_entities(group) if e.name == by_subject
            ]
            report = await forget_subject(pipeline, group, entity.uuid)
            assert report.forgotten == len(
                [m for m in feed if m.company == by_subject and m.id not in forgotten]
            )
            forgotten |= {m.id for m in feed if m.company == by_subject}
        remaining = [m for m in feed if m.id not in forgotten]
        await feed_text(any_store, text_llm, expected_group, remaining)
        assert await graph(any_store, group) == await graph(any_store, expected_group)
    finally:
        await any_store.forget.delete_group(group)
        await any_store.forget.delete_group(expected_group)
