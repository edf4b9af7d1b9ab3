"""Forgetting and the change stream through real workers on the real broker and Neo4j.

- A forget request on the input topic runs in its group's order; replaying the input topic
  from offset 0 into fresh workers (a new consumer group) never brings the forgotten episodes
  back, and a replayed dead letter of one is dropped.
- A forget interrupted by a killed worker is finished by the next one; the other groups stay
  as they were.
- Every change the writes commit reaches ``{prefix}.changes``: none lost when a worker is
  killed mid-stream, none published twice beyond what ``change_id`` lets a consumer drop, in
  the group's commit order (``seq``).
- A worker publishes only its own deployment's changes: not those of groups another
  deployment (another topic prefix) writes in-process into the same Neo4j.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.integration.topology_harness import Topology, eventually
from tests.support.crm_feed import crm_feed
from tidegraph.app.memory import Memory
from tidegraph.records.changes import Change
from tidegraph.records.episode import parse_episode
from tidegraph.topics.client import read_changes

pytestmark = pytest.mark.integration

EPISODES = 60
GROUPS = 3


def forget_record(group_id: str, episode_ids: list[str]) -> dict[str, Any]:
    return {"forget": {"group_id": group_id, "episode_ids": episode_ids}}


async def outbox(topology: Topology, groups: list[str]) -> dict[str, list[Change]]:
    store = topology.store()
    try:
        return {g: await store.outbox.changes(g, 0, 100_000) for g in groups}
    finally:
        await store.close()


async def published_all(topology: Topology, groups: list[str]) -> list[Change]:
    """The changes topic once it holds every change of the groups' outboxes."""
    want = {c.change_id for changes in (await outbox(topology, groups)).values() for c in changes}

    async def read() -> list[Change]:
        return await read_changes(topology.settings(), groups)

    return await eventually(
        read,
        lambda got: want <= {c.change_id for c in got},
        timeout=90,
        what="every committed change on the changes topic",
    )


def check_stream(topic: list[Change], committed: dict[str, list[Change]]) -> None:
    """Deduplicated by change_id, the topic holds every committed change, each with the same
    content, each group's in commit order; and nothing else but the changes, published
    before a forget, of records that forget took out of the outbox (a later ``*.forgotten``
    change names each)."""
    seen: dict[str, Change] = {}
    for change in topic:
        if change.change_id in seen:
            assert seen[change.change_id] == change  # a duplicate is the same change
            continue
        seen[change.change_id] = change
    every = {c.change_id: c for changes in committed.values() for c in changes}
    assert set(every) <= set(seen)
    assert all(seen[k] == every[k] for k in every)
    forgotten = {c.uuid for c in every.values() if c.kind.endswith(".forgotten")}
    assert all(seen[k].uuid in forgotten for k in set(seen) - set(every))
    for group in committed:
        seqs = [c.seq for c in topic if c.group_id == group]
        first_seen = list(dict.fromkeys(seqs))
        assert first_seen == sorted(first_seen), f"group {group} out of commit order"


async def test_a_forget_on_the_input_topic_stays_forgotten_through_a_replay(
    topology: Topology,
) -> None:
    feed = crm_feed(EPISODES, GROUPS, run=topology.run)
    groups = sorted({e["group_id"] for e in feed})
    target = groups[0]
    doomed = [e["id"] for e in feed if e["group_id"] == target][:3]
    worker = topology.start_worker(TIDEGRAPH_COMMUNITIES_ENABLED="false")
    await topology.wait_assigned([worker])
    report = await topology.produce(feed)
    await topology.wait_reflected(report)
    await topology.produce([forget_record(target, doomed)])
    store = topology.store()
    try:
        uuids = [parse_episode(orjson.dumps(e)).uuid for e in feed if e["id"] in doomed]

        async def statuses() -> dict[str, str]:
            return await store.episode_statuses(target, uuids)

        await eventually(
            statuses,
            lambda got: set(got.values()) == {"forgotten"},
            timeout=90,
            what="the forget request to run",
        )
        facts = await store.browse.query_facts(target, include_invalid=True)
        assert not any(set(f.episodes) & set(doomed) for f in facts)
        kept = await store.browse.counts(target)
        # The whole input topic again, into fresh workers of another consumer group.
        worker.stop()
        replayer = topology.start_worker(
            TIDEGRAPH_COMMUNITIES_ENABLED="false", TIDEGRAPH_CONSUMER_GROUP=f"{topology.run}-again"
        )
        await topology.wait_assigned([replayer])
        again = await topology.produce(feed[:1])  # something to wait for behind the replay
        await topology.wait_reflected(again)
        assert set((await statuses()).values()) == {"forgotten"}
        assert await store.browse.counts(target) == kept
        changes = await published_all(topology, groups)
        check_stream(changes, await outbox(topology, groups))
        assert any(c.kind == "episode.forgotten" for c in changes)
    finally:
        await store.close()


async def test_no_change_is_lost_when_the_worker_is_killed_mid_stream(topology: Topology) -> None:
    feed = crm_feed(EPISODES * 2, GROUPS, run=topology.run)
    groups = sorted({e["group_id"] for e in feed})
    first = topology.start_worker(TIDEGRAPH_COMMUNITIES_ENABLED="false")
    await topology.wait_assigned([first])
    report = await topology.produce(feed)

    async def written() -> int:
        return await topology.episodes_written(groups)

    await eventually(written, lambda n: n >= len(feed) // 3, timeout=90, what="a third written")
    first.kill()  # between commits, produces and the relay's cursor: anywhere
    second = topology.start_worker(TIDEGRAPH_COMMUNITIES_ENABLED="false")
    await topology.wait_assigned([second])
    await topology.wait_reflected(report)
    committed = await outbox(topology, groups)
    assert all(committed.values())
    check_stream(await published_all(topology, groups), committed)


async def test_a_forget_interrupted_by_a_killed_worker_is_finished_by_the_next(
    topology: Topology,
) -> None:
    feed = crm_feed(EPISODES, GROUPS, run=topology.run)
    groups = sorted({e["group_id"] for e in feed})
    target, others = groups[0], groups[1:]
    doomed = [e["id"] for e in feed if e["group_id"] == target][:4]
    first = topology.start_worker(TIDEGRAPH_COMMUNITIES_ENABLED="false")
    await topology.wait_assigned([first])
    await topology.wait_reflected(await topology.produce(feed))
    store = topology.store()
    try:
        before = {g: await store.browse.counts(g) for g in others}
        uuids = [parse_episode(orjson.dumps(e)).uuid for e in feed if e["id"] in doomed]

        async def statuses() -> dict[str, str]:
            return await store.episode_statuses(target, uuids)

        # One forget request per episode, so the kill lands between (or inside) them.
        await topology.produce([forget_record(target, [d]) for d in doomed])
        await eventually(
            statuses,
            lambda got: "forgotten" in got.values(),
            timeout=90,
            what="the first forget to run",
        )
        first.kill()
        second = topology.start_worker(TIDEGRAPH_COMMUNITIES_ENABLED="false")
        await topology.wait_assigned([second])
        await eventually(
            statuses,
            lambda got: set(got.values()) == {"forgotten"},
            timeout=90,
            what="the next worker to finish the forgets",
        )
        facts = await store.browse.query_facts(target, include_invalid=True)
        assert not any(set(f.episodes) & set(doomed) for f in facts)
        assert {g: await store.browse.counts(g) for g in others} == before
        check_stream(await published_all(topology, groups), await outbox(topology, groups))
    finally:
        await store.close()


async def test_a_worker_publishes_only_the_changes_of_its_own_deployment(
    topology: Topology,
) -> None:
    # Another deployment sharing the Neo4j (its own topic prefix) writes in-process, as its
    # `tidegraph ingest` and `tidegraph serve` do, before this deployment's worker starts.
    other = topology.settings().model_copy(update={"topic_prefix": f"{topology.prefix}-other"})
    theirs = crm_feed(EPISODES // 3, GROUPS, run=f"{topology.run}-other")
    memory = await Memory.open(other)
    try:
        for envelope in theirs:
            added = await memory.add(parse_episode(orjson.dumps(envelope)))
            assert added.status == "written", added
    finally:
        await memory.close()
    their_groups = sorted({e["group_id"] for e in theirs})
    feed = crm_feed(EPISODES // 3, GROUPS, run=topology.run)
    groups = sorted({e["group_id"] for e in feed})
    worker = topology.start_worker(TIDEGRAPH_COMMUNITIES_ENABLED="false")
    await topology.wait_assigned([worker])
    await topology.wait_reflected(await topology.produce(feed))
    check_stream(await published_all(topology, groups), await outbox(topology, groups))
    # A subscriber of one group reads every change of it and none of the others (passed over
    # by their key).
    one = groups[0]
    alone = await read_changes(topology.settings(), [one])
    assert {c.change_id for c in alone} == {
        c.change_id for c in (await outbox(topology, [one]))[one]
    }
    assert {c.group_id for c in alone} == {one}
    # Its relay went round after round over the store: every change on its topic is of its
    # own groups, and the other deployment's outboxes are left unpublished for its relay.
    assert {c.group_id for c in await read_changes(topology.settings())} == set(groups)
    store = topology.store()
    try:
        logs = await store.outbox.change_logs(their_groups)
    finally:
        await store.close()
    assert [log.group_id for log in logs] == their_groups
    assert all(log.seq > 0 and log.published == 0 for log in logs)
    assert {log.deployment for log in logs} == {other.topic_prefix}
