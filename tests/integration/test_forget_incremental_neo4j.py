"""The incremental forget is exact on Neo4j: the property of
``tests/unit/test_forget_incremental.py`` (the whole group's replay as the oracle), with
fewer examples."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.integration.test_delivery_order_stores import DIM, Record, deliveries
from tests.support.forget_oracle import forget_both_ways
from tests.support.plan_keys import started_store
from tests.unit.test_forget_incremental import by_name, fed, generated
from tidegraph.pipelines.forget import forget_episodes, forget_subject
from tidegraph.stores.neo4j.plans import PLANS_AHEAD_GROUP
from tidegraph.stores.neo4j.store import Neo4jStore

pytestmark = pytest.mark.integration

# Smaller generated tenants than the unit test's: a Neo4j write costs a round trip.
feeds = st.one_of(deliveries(), st.builds(generated, st.integers(8, 15), st.integers(0, 10_000)))


@pytest.fixture
async def neo4j_store(neo4j_uri: str) -> AsyncIterator[Neo4jStore]:
    store = Neo4jStore(neo4j_uri)
    await store.setup(DIM)
    yield store
    await store.close()


@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(records=feeds, data=st.data())
async def test_the_incremental_forget_equals_the_whole_replay_on_neo4j(
    neo4j_store: Neo4jStore, records: list[Record], data: st.DataObject
) -> None:
    group = f"inc-{uuidlib.uuid4().hex[:10]}"
    runner = await fed(neo4j_store, group, records)
    try:
        history = await neo4j_store.forget.group_history(group)
        # Drawn by producer id and name: the uuids derive from the (random) group id.
        episodes = [e.uuid for e in sorted(history.episodes, key=lambda e: e.producer_id)]
        named = set(data.draw(st.lists(st.sampled_from(episodes), min_size=1, max_size=3)))
        if data.draw(st.booleans(), label="a subject"):
            subject = data.draw(st.sampled_from(by_name(history)))
            named |= {e for e in episodes if subject in history.mentions.get(e, [])}
        event(await forget_both_ways(neo4j_store, runner, group, named))
    finally:
        await neo4j_store.forget.delete_group(group)


async def test_the_store_plans_a_forgets_statements_when_it_starts(
    neo4j_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forget does not pay Cypher planning (seconds for the first forget after an ingest,
    and for each new size of its lists): each statement of a forget keeps its plan
    (``KEEP_PLAN``), takes its values in one map whatever their sizes, and was run when the
    store started as the forget runs it (before or after its transaction has written), so
    its plan is cached under the key the forget looks it up by; and that run left nothing in
    the store."""
    keys, store, planned = await started_store(neo4j_uri, monkeypatch, DIM)
    group = f"inc-{uuidlib.uuid4().hex[:10]}"
    try:
        left = await store.ex.rows(
            "MATCH (n) WHERE n.group_id = $group RETURN count(n) AS n", {"group": PLANS_AHEAD_GROUP}
        )
        assert left == [{"n": 0}]
        runner = await fed(store, group, generated(12, 3))
        history = await store.forget.group_history(group)
        keys.ran.clear()
        await forget_episodes(runner, group, [history.episodes[0].producer_id])
        await forget_subject(runner, group, by_name(history)[0])
        kept = keys.kept()
        assert len({key[0] for key in kept}) >= 19
        assert kept <= planned, sorted((k[0][:80], k[1], k[2]) for k in kept - planned)
    finally:
        await store.forget.delete_group(group)
        await store.close()
