"""The worker's community refresh scheduler
(``tidegraph.pipelines.streaming.community_agent.RefreshScheduler``)
over a scripted service: ticks never wait, one refresh per group, a concurrency cap,
cancellation and forgetting on rebalance."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, cast

import pytest

from tidegraph.pipelines.community_service import CommunityService
from tidegraph.pipelines.outage import StoreOutage
from tidegraph.pipelines.streaming.community_agent import RefreshScheduler


class ScriptedService:
    """Every group needs a refresh until one finished; refreshes end when released."""

    def __init__(self) -> None:
        self.release: dict[str, asyncio.Event] = {}
        self.started: list[tuple[str, str]] = []
        self.finished: list[str] = []
        self.forgotten: list[str] = []
        self.active: set[str] = set()

    def refresh_trigger(self, group: str, threshold: float, max_age: timedelta) -> str | None:
        return None if group in self.finished else "initial"

    def is_refreshing(self, group: str) -> bool:
        return group in self.active

    async def refresh(self, group: str, *, trigger: str) -> Any:
        self.started.append((group, trigger))
        self.active.add(group)
        try:
            await self.release.setdefault(group, asyncio.Event()).wait()
        finally:
            self.active.discard(group)
        self.finished.append(group)
        return _Result()

    def forget(self, group: str) -> None:
        self.forgotten.append(group)


async def answer() -> None:  # the store's probe: it answers
    return None


class _Result:
    changed = created = deleted = unchanged = llm_calls = 0
    drift_ari = 1.0
    seconds = 0.0


def scheduler(service: ScriptedService, max_concurrent: int = 2) -> RefreshScheduler:
    return RefreshScheduler(
        cast(CommunityService, service),
        StoreOutage(answer, hold_seconds=0.0),
        threshold=0.1,
        max_age=timedelta(hours=6),
        max_concurrent=max_concurrent,
    )


async def until(condition: Any, steps: int = 1000) -> None:
    """Let the event loop run until ``condition()`` holds (at most ``steps`` turns)."""
    for _ in range(steps):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def test_ticks_start_refreshes_without_waiting_and_never_twice_per_group() -> None:
    service = ScriptedService()
    sched = scheduler(service, max_concurrent=2)
    for group, partition in (("g1", 0), ("g2", 1), ("g3", 2)):
        sched.seen(group, partition)
    assert sched.tick() == ["g1", "g2", "g3"]  # returns at once: nothing awaited
    await until(lambda: len(service.started) == 2)
    assert service.started == [("g1", "initial"), ("g2", "initial")]  # the cap holds g3
    assert sched.tick() == []  # all three have a refresh under way
    service.release["g1"].set()
    await until(lambda: ("g3", "initial") in service.started)
    assert sched.running == ["g2", "g3"]
    assert sched.tick() == []  # g1 is done and needs nothing
    await sched.close()
    assert sched.running == [] and service.finished == ["g1"]


class Turns:
    """A scheduler's waits for the turns of its refreshes: each recorded, over when let go."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.go = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        await self.go.wait()


async def test_the_refreshes_of_a_tick_are_spread_over_the_interval() -> None:
    """Four groups due at once over a 30 s check: the first refreshes at once, the others
    wait 7.5, 15 and 22.5 s for their turn (with slots free for all of them), so a worker's
    refreshes never take the store all at once."""
    service = ScriptedService()
    turns = Turns()
    sched = RefreshScheduler(
        cast(CommunityService, service),
        StoreOutage(answer, hold_seconds=0.0),
        threshold=0.1,
        max_age=timedelta(hours=6),
        max_concurrent=4,
        spread_seconds=30.0,
        sleep=turns.sleep,
    )
    for partition, group in enumerate(("g1", "g2", "g3", "g4")):
        sched.seen(group, partition)
    assert sched.tick() == ["g1", "g2", "g3", "g4"]
    await until(lambda: len(turns.waits) == 3)
    assert turns.waits == [7.5, 15.0, 22.5]
    assert service.started == [("g1", "initial")]  # the others wait for their turn
    assert sched.tick() == []  # waiting for its turn is under way: not started twice
    turns.go.set()
    await until(lambda: len(service.started) == 4)
    assert [group for group, _ in service.started] == ["g1", "g2", "g3", "g4"]
    await sched.close()
    assert sched.running == []


async def test_rebalance_cancels_refreshes_of_lost_partitions_and_forgets_their_groups() -> None:
    service = ScriptedService()
    sched = scheduler(service)
    sched.seen("kept", 0)
    sched.seen("lost", 1)
    sched.tick()
    await until(lambda: len(service.started) == 2)
    await sched.cancel([1])
    assert sched.running == ["kept"] and service.active == {"kept"}
    assert sched.retain([0]) == ["lost"]
    assert sched.groups == ["kept"] and service.forgotten == ["lost"]
    await sched.close()
    assert sched.running == [] and service.finished == []
    sched.seen("late", 0)
    assert sched.tick() == []  # closed: nothing new starts


async def test_a_failed_refresh_is_logged_and_tried_again_at_the_next_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = ScriptedService()
    calls = 0

    async def failing(group: str, *, trigger: str) -> Any:
        nonlocal calls
        calls += 1
        raise RuntimeError("neo4j went away")

    service.refresh = failing  # type: ignore[method-assign]
    sched = scheduler(service)
    sched.seen("g", 0)
    assert sched.tick() == ["g"]
    await until(lambda: not sched.running)
    assert "community_refresh_failed group=g" in caplog.text
    assert sched.tick() == ["g"]
    await until(lambda: calls == 2)
    await sched.close()
