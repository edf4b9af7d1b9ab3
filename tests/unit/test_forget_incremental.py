"""The incremental forget is exact: on random mapped CRM feeds (late records, the same
episode twice, the same record under another id, contradicting plans and statuses, closing
records, notes naming an account without its key) and random forgets of episodes, of a
subject's episodes and of both, the difference it computes from the part of the group the
forget reaches equals the one the whole group's replay gives, on the in-memory and the
embedded store (Neo4j: ``tests/integration/test_forget_incremental_neo4j.py``)."""

from __future__ import annotations

import tempfile
import uuid as uuidlib
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.integration.test_delivery_order_stores import DIM, Record, deliveries
from tests.support import crm_feed as crm
from tests.support.forget_oracle import forget_both_ways
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.forget_reach import MOST, Reach, Whole, reach, read_reach
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.processors.steps import Components
from tidegraph.records.graph import EpisodeRecord, GroupHistory, GroupProfile
from tidegraph.stores.base import GraphStore
from tidegraph.stores.memory.store import MemoryStore
from tidegraph.stores.sqlite.store import SqliteStore

T0 = crm.START


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[GraphStore]:
    opened: GraphStore
    if request.param == "memory":
        opened = MemoryStore()
    else:
        folder = Path(tempfile.mkdtemp(prefix="forget-incremental-"))
        opened = SqliteStore(folder / "graph")
    await opened.setup(DIM)
    yield opened
    await opened.close()


def generated(records: int, seed: int) -> list[Record]:
    """A generated CRM feed of one tenant (accounts, owners, contacts, tickets, notes)."""
    feed = crm.generate(records, 1, prefix=f"fi{seed}", seed=seed)
    return [
        Record(e["id"], datetime.fromisoformat(e["reference_time"]), e["content"])
        for e in feed.episodes
    ]


async def fed(store: GraphStore, group: str, records: list[Record]) -> GroupRunner:
    """``records`` written one at a time, each at an ingestion time of its own."""
    times = {r.id: T0 + timedelta(minutes=n) for n, r in reversed(list(enumerate(records)))}
    components = Components.of(
        store=store, embedder=HashingEmbedder(dim=DIM), llm=None, mappings=crm.crm_mappings()
    )
    components.clock = lambda episode: times[episode.id]
    runner = GroupRunner(components, unit_episodes=3)
    outcomes = await runner.run([r.episode(group) for r in records])
    assert all(o.failure is None for o in outcomes), outcomes
    return runner


def by_name(history: GroupHistory) -> list[str]:
    """The group's entity uuids in the order of their keys and names."""
    ordered = sorted(history.entities.values(), key=lambda e: (e.key or "", e.name, e.uuid))
    return [e.uuid for e in ordered]


feeds = st.one_of(
    deliveries(),
    st.builds(generated, st.integers(20, 60), st.integers(0, 10_000)),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(records=feeds, data=st.data())
async def test_the_incremental_forget_equals_the_whole_replay(
    store: GraphStore, records: list[Record], data: st.DataObject
) -> None:
    group = f"inc-{uuidlib.uuid4().hex[:10]}"
    runner = await fed(store, group, records)
    for _ in range(data.draw(st.integers(1, 2), label="forgets")):
        history = await store.forget.group_history(group)
        if not history.episodes:
            break
        # Drawn by producer id and name: the uuids derive from the (random) group id.
        episodes = [e.uuid for e in sorted(history.episodes, key=lambda e: e.producer_id)]
        named = set(data.draw(st.lists(st.sampled_from(episodes), max_size=3, unique=True)))
        if history.entities and data.draw(st.booleans(), label="a subject"):
            subject = data.draw(st.sampled_from(by_name(history)))
            named |= {e for e in episodes if subject in history.mentions.get(e, [])}
        if not named:
            continue
        event(await forget_both_ways(store, runner, group, named))
    await store.forget.delete_group(group)


async def test_one_record_of_a_large_group_reaches_only_its_slots(store: GraphStore) -> None:
    """Forgetting one plan change of a 400-record feed reads and replays a few records of that
    account (not the group), and does not fold the plan entity every account shares."""
    group = f"inc-{uuidlib.uuid4().hex[:10]}"
    records = generated(400, 3)
    runner = await fed(store, group, records)
    history = await store.forget.group_history(group)
    plans = [e for e in history.episodes if e.name == "account.plan"]
    plan = plans[len(plans) // 2]
    first = await store.forget.history_part(group, [plan.uuid], [])
    found, part = await read_reach(store, group, first, {plan.uuid}, MOST)
    assert isinstance(found, Reach), found
    assert 0 < len(found.replay) < len(history.episodes) / 20
    assert len(part.episodes) < len(history.episodes) / 10
    shared = {u for u, e in history.entities.items() if "Plan" in e.labels}
    assert not found.entities & shared
    assert await forget_both_ways(store, runner, group, {plan.uuid}) == "incremental"


def test_a_group_with_llm_extracted_episodes_is_replayed_whole() -> None:
    """Text episodes are judged against searches of the whole group."""
    text = EpisodeRecord(
        uuid="e1",
        group_id="g",
        producer_id="chat-1",
        name="chat",
        source="text",
        source_description="",
        content="Ana moved to Globex",
        valid_at=crm.START,
        extraction='{"entities": [{"name": "Ana"}], "facts": [], "mapped": false}',
    )
    assert reach("g", GroupHistory(episodes=[text]), {"e1"}) == Whole("episodes the LLM extracted")


async def test_a_mapped_groups_profile_and_bounded_count(store: GraphStore) -> None:
    """A mapped group holds no LLM-extracted episode and none without an extraction; its
    live extracted episodes are counted up to the bound asked for, forgotten ones not."""
    group = f"inc-{uuidlib.uuid4().hex[:10]}"
    records = generated(30, 5)
    runner = await fed(store, group, records)
    history = await store.forget.group_history(group)
    live = len(history.episodes)
    assert await store.forget.group_profile(group) == GroupProfile()
    assert await store.forget.extracted_episodes(group, 5) == 5
    assert await store.forget.extracted_episodes(group, live + 10) == live
    gone = sorted(history.episodes, key=lambda e: e.producer_id)[0].uuid
    await forget_both_ways(store, runner, group, {gone})
    assert await store.forget.extracted_episodes(group, live + 10) == live - 1
    assert await store.forget.extracted_episodes(f"{group}-other", 5) == 0
