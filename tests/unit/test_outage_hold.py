"""A store that does not answer stops the line, not the record (tidegraph/pipelines/outage.py):
the hops hold each group's record until the store answers again, in order, with nothing
dead-lettered and no budget run out meanwhile; a record the store refuses while it answers is
still a dead letter; past the outage limit the worker's job stops instead.

The store here is the in-memory one made to refuse every call while it is "down" (pure logic);
tests/integration/test_store_outage.py does the same against a real Neo4j that is frozen,
killed and restarted under two workers."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from neo4j.exceptions import ServiceUnavailable

from tests.unit.test_handlers import FEED, GROUP, NAMES, WORKER, envelope, handle, hop_record
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.outage import PROBE_GROUP, StoreOutage, store_outage
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.pipelines.streaming.handlers import (
    Consumed,
    ExtractionHandler,
    WriteHandler,
    handled,
)
from tidegraph.processors.steps import Components
from tidegraph.records.episode import parse_episode
from tidegraph.stores.errors import StoreUnreachable
from tidegraph.stores.memory.store import MemoryStore


class StoreThatGoesDown(MemoryStore):
    """Refuses every call (reads and writes) with ``ServiceUnavailable`` while ``down``; comes
    back after ``probes_down`` probes have failed (None: never)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.probes_down: int | None = None
        self.refused = 0
        self.written: list[str] = []  # episode uuids, in the order they were written

    async def write_episodes(self, group_id: str, writes: list[Any]) -> int:
        written = await super().write_episodes(group_id, writes)
        self.written += [write.episode.uuid for write in writes]
        return written

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if name.startswith("_") or not inspect.iscoroutinefunction(value):
            return value
        if not object.__getattribute__(self, "down"):
            return value

        async def refused(*args: Any, **kwargs: Any) -> Any:
            self.refused += 1
            if name == "episode_processed" and args and args[0] == PROBE_GROUP:
                if self.probes_down is not None:
                    self.probes_down -= 1
                    if self.probes_down < 0:
                        self.down = False
                        return await value(*args, **kwargs)
            raise ServiceUnavailable("Couldn't connect to 127.0.0.1:7687 (connection refused)")

        return refused


def quick(outage: StoreOutage) -> StoreOutage:
    outage.backoff = outage.backoff_max = 0.001
    return outage


async def hops(
    store: MemoryStore, *, record_timeout: float = 60.0, hold_seconds: float = 60.0
) -> tuple[ExtractionHandler, WriteHandler]:
    from tests.support.crm_feed import crm_mappings

    embedder = HashingEmbedder()
    await store.setup(embedder.dim)
    components = Components.of(store=store, embedder=embedder, llm=None, mappings=crm_mappings())
    outage = quick(store_outage(store, hold_seconds=hold_seconds))
    runner = GroupRunner(
        components, policy=WORKER.retry_policy(), record_timeout=record_timeout, outage=outage
    )
    return (
        ExtractionHandler(runner, NAMES, WORKER, record_timeout),
        WriteHandler(runner, NAMES, WORKER, record_timeout),
    )


def group_records() -> list[dict[str, Any]]:
    return [record for record in FEED if record["group_id"] == GROUP][:6]


async def extracted_records(extraction: ExtractionHandler) -> list[Consumed]:
    outputs = await extraction.handle_group([envelope(record) for record in group_records()])
    return [hop_record(emit) for [emit] in outputs]


async def test_an_outage_holds_the_groups_records_and_writes_them_in_order_once_it_ends() -> None:
    store = StoreThatGoesDown()
    extraction, write = await hops(store)
    records = await extracted_records(extraction)

    store.down, store.probes_down = True, 3
    outputs = await handled(write, records)

    assert store.refused > store.probes_down  # the writes were refused, then held
    assert not any(emit.topic == NAMES.dlq for emits in outputs for emit in emits)
    expected = [parse_episode(envelope(r).value or b"").uuid for r in group_records()]
    assert store.written == expected


async def test_record_budgets_stop_while_the_store_does_not_answer() -> None:
    store = StoreThatGoesDown()
    extraction, write = await hops(store, record_timeout=0.05)
    records = await extracted_records(extraction)
    outage = write.runner.outage
    outage.backoff = outage.backoff_max = 0.05  # an outage far longer than a record's budget

    store.down, store.probes_down = True, 6
    outputs = await handled(write, records)

    assert not any(emit.topic == NAMES.dlq for emits in outputs for emit in emits)
    assert len(store.written) == len(records)


async def test_the_extraction_hop_holds_too() -> None:
    store = StoreThatGoesDown()
    extraction, _ = await hops(store)
    store.down, store.probes_down = True, 2
    outputs = await extraction.handle_group([envelope(r) for r in group_records()])
    assert [emit.topic for [emit] in outputs] == [NAMES.extracted] * len(group_records())


async def test_past_the_outage_limit_the_job_stops_and_nothing_is_dead_lettered() -> None:
    store = StoreThatGoesDown()
    extraction, write = await hops(store, hold_seconds=0.2)
    records = await extracted_records(extraction)

    store.down = True  # for good
    with pytest.raises(StoreUnreachable, match="has not answered"):
        await handled(write, records)
    assert store.written == []


async def test_a_record_the_store_refuses_while_it_answers_is_still_a_dead_letter() -> None:
    class RefusesOneEpisode(MemoryStore):
        async def write_episode(self, group_id: str, write: Any) -> bool:
            raise ServiceUnavailable("this write breaks the connection")

    extraction, write = await hops(RefusesOneEpisode())
    [emit] = await handle(extraction, envelope(FEED[0]))
    [letter] = await handle(write, hop_record(emit))
    assert letter.topic == NAMES.dlq


async def test_one_outage_is_shared_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    up = asyncio.Event()
    calls = 0

    async def probe() -> None:
        nonlocal calls
        calls += 1
        if not up.is_set():
            raise ConnectionRefusedError("refused")

    outage = quick(StoreOutage(probe, hold_seconds=30.0))
    seen: list[bool] = []
    went_down = asyncio.Event()
    outage.listen(lambda down: (seen.append(down), went_down.set()))
    waiters = [asyncio.create_task(outage.held()) for _ in range(20)]
    await went_down.wait()
    assert outage.down and not any(w.done() for w in waiters)
    up.set()
    assert await asyncio.gather(*waiters) == [True] * 20
    assert seen == [True, False]
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "does not answer" in warnings[0].getMessage()
    assert await outage.held() is False  # up: a failure now is the caller's own


async def test_a_server_is_told_to_come_back_at_once() -> None:
    async def probe() -> None:
        raise ConnectionRefusedError("refused")

    outage = quick(StoreOutage(probe, hold_seconds=0.0))
    with pytest.raises(StoreUnreachable) as caught:
        await outage.held()
    assert caught.value.retry_after >= 1
    with pytest.raises(StoreUnreachable):
        outage.refuse_while_down()
    await outage.close()
