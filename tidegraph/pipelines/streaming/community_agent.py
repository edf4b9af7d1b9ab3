"""The community processor in the worker (docs/communities.md "Communities"): an agent on
``{prefix}.entities.new`` and a refresh timer, both over one ``CommunityService``.

- The agent reads ``NewEntityRecord``s exactly as the stage agents read their inputs
  (``tidegraph.pipelines.streaming.app.stage_agent``: micro-batches, one lane per group so each
  group's records run in order, each record acked once it is done). Each record puts its entity into
  its neighbours' majority community (``CommunityService.assign``, idempotent, so a redelivered
  record changes nothing). A record that cannot be decoded is dead-lettered (``bad_hop_record``); an
  assignment that still fails after the retries is logged and counted
  (``tidegraph_community_assignments_total{outcome="error"}``) and left to the group's next refresh,
  which places every entity.
- The timer, every ``TIDEGRAPH_COMMUNITY_CHECK_SECONDS``, looks at each group this worker
  has seen on the topic and starts a refresh in the background for those that need one
  (``initial``: never refreshed by this process; ``drift``; ``age``). It never waits for a
  refresh: a slow group does not hold up the others' checks. At most one refresh per group
  runs (the task table here, and the service's per-group lock), and at most
  ``TIDEGRAPH_COMMUNITY_MAX_CONCURRENT_REFRESHES`` in all. The refreshes a check starts are
  spread evenly over the time to the next check, not run back to back: a refresh reads and
  rewrites its whole group in the store, and every group that grows needs one at every
  check, so all of them at once took the store from the writes of every group for seconds
  (docs/performance.md, the write path's stall).
- On a rebalance the refreshes of the worker are cancelled (the group may start elsewhere;
  a refresh writes in one transaction, so a cancelled one wrote all or nothing), and groups
  whose partition is no longer assigned are forgotten.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import timedelta
from functools import partial
from typing import Any

import faust

from tidegraph.metrics import ASSIGNED_PARTITIONS, COMMUNITY_ASSIGNMENTS
from tidegraph.pipelines.community_service import CommunityService
from tidegraph.pipelines.outage import StoreOutage
from tidegraph.pipelines.retry import with_retries
from tidegraph.pipelines.runtime import Runtime
from tidegraph.pipelines.step_runner import timed
from tidegraph.pipelines.streaming.config import WorkerSettings
from tidegraph.pipelines.streaming.handlers import Consumed, Emit, RecordHandler
from tidegraph.processors.failures import STORE_MAY_BE_DOWN, classify
from tidegraph.topics.names import TopicNames
from tidegraph.topics.records import NewEntityRecord

log = logging.getLogger(__name__)

STAGE = "communities"


class CommunityHandler(RecordHandler):
    """entities.new -> community membership (no records out, except dead letters)."""

    stage = STAGE

    def __init__(
        self,
        runtime: Runtime,
        names: TopicNames,
        worker: WorkerSettings,
        service: CommunityService,
        on_group: Callable[[str, int], None],
    ) -> None:
        super().__init__(names, worker, runtime.settings.record_timeout_seconds)
        self.service = service
        self.on_group = on_group
        self.outage = self.store_outage = runtime.outage

    async def handle_group(self, records: Sequence[Consumed]) -> list[list[Emit]]:
        """A group's new entities of a micro-batch placed as one unit, in order
        (``CommunityService.assign_many``: one read of their neighbours' communities, one
        write); a record that cannot be read is dead-lettered alone."""
        outputs: list[list[Emit]] = []
        entities: dict[str, list[str]] = {}  # group -> entity uuids, in record order
        for record in records:
            hop = self.decode_hop(NewEntityRecord, record)
            if isinstance(hop, Emit):
                outputs.append([hop])
                continue
            outputs.append([])
            self.on_group(hop.group_id, record.partition)
            entities.setdefault(hop.group_id, []).append(hop.entity_uuid)
        for group, uuids in entities.items():
            await self._assign(group, uuids)
        return outputs

    async def _assign(self, group: str, entities: list[str]) -> None:
        """Place ``entities`` with retries, within the record budget; while the store does
        not answer they wait for it (``StoreOutage.held``); on another failure they are
        logged and counted, and the group's next refresh places them."""
        while not await self._assigned(group, entities):
            pass

    async def _assigned(self, group: str, entities: list[str]) -> bool:
        """One try of ``_assign``: False when it is to be tried again (the store was down)."""

        def attempt() -> Awaitable[list[str | None]]:
            return timed(
                self.stage, lambda: self.service.assign_many(group, entities), len(entities)
            )

        attempts, reason, error = 0, "timeout", "out of time (TIDEGRAPH_RECORD_TIMEOUT_SECONDS)"
        since = self.store_outage.outages
        try:
            async with self.store_outage.budget(self.record_timeout):
                outcome = await with_retries(
                    self.stage,
                    attempt,
                    self.policy,
                    what=f"group={group} entities={len(entities)}",
                    outage=self.store_outage,
                )
            if outcome.ok:
                return True
            attempts, error = outcome.attempts, str(outcome.error)
            reason = outcome.verdict.reason if outcome.verdict else "?"
        except TimeoutError:
            pass
        if reason in STORE_MAY_BE_DOWN and await self.store_outage.held(since):
            return False
        COMMUNITY_ASSIGNMENTS.labels("error").inc(len(entities))
        log.warning(
            "community_assignment_failed group=%s entities=%s attempts=%d reason=%s error=%s; "
            "the group's next refresh places them",
            group, ",".join(entities), attempts, reason, error,
        )  # fmt: skip
        return True


class RefreshScheduler:
    """Which groups this worker refreshes, and their refresh tasks."""

    def __init__(
        self,
        service: CommunityService,
        outage: StoreOutage,
        *,
        threshold: float,
        max_age: timedelta,
        max_concurrent: int,
        spread_seconds: float = 0.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``spread_seconds``: the refreshes one tick starts begin evenly over that time (the
        interval of the ticks), the first at once; ``sleep`` waits out a refresh's turn."""
        self.service = service
        self.outage = outage
        self.threshold = threshold
        self.max_age = max_age
        self.spread_seconds = spread_seconds
        self._sleep = sleep
        self._partition_of: dict[str, int] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(max_concurrent)
        self._closed = False

    @property
    def groups(self) -> list[str]:
        return sorted(self._partition_of)

    @property
    def running(self) -> list[str]:
        return sorted(self._running)

    def seen(self, group_id: str, partition: int) -> None:
        self._partition_of[group_id] = partition

    def tick(self) -> list[str]:
        """Start a refresh for every known group that needs one and has none running;
        returns those groups. Never waits for a refresh."""
        due: list[tuple[str, str]] = []
        if self.outage.down:  # the store does not answer: the next check after it does
            return []
        for group in self.groups:
            if self._closed:
                break
            if group in self._running or self.service.is_refreshing(group):
                continue
            trigger = self.service.refresh_trigger(group, self.threshold, self.max_age)
            if trigger is not None:
                due.append((group, trigger))
        for turn, (group, trigger) in enumerate(due):
            after = turn * self.spread_seconds / len(due)
            task = asyncio.create_task(
                self._refresh(group, trigger, after), name=f"refresh:{group}"
            )
            self._running[group] = task
            task.add_done_callback(partial(self._done, group))
        return [group for group, _ in due]

    def _done(self, group: str, task: asyncio.Task[None]) -> None:
        if self._running.get(group) is task:
            del self._running[group]

    async def _refresh(self, group: str, trigger: str, after: float = 0.0) -> None:
        if after > 0:
            await self._sleep(after)  # its turn in the check's spread (cancelled on rebalance)
        async with self._slots:
            try:
                result = await self.service.refresh(group, trigger=trigger)
            except asyncio.CancelledError:
                log.info("community_refresh_cancelled group=%s trigger=%s", group, trigger)
                raise
            except Exception as exc:
                if classify(exc).reason in STORE_MAY_BE_DOWN and not await self.outage.check():
                    return  # the store does not answer (logged once): the next check retries
                log.warning(
                    "community_refresh_failed group=%s trigger=%s error=%s: %s; retried at "
                    "the next check",
                    group, trigger, type(exc).__name__, exc, exc_info=exc,
                )  # fmt: skip
                return
        log.info(
            "community_refresh group=%s trigger=%s changed=%d created=%d deleted=%d "
            "unchanged=%d llm_calls=%d drift_ari=%.3f seconds=%.3f",
            group, trigger, result.changed, result.created, result.deleted, result.unchanged,
            result.llm_calls, result.drift_ari, result.seconds,
        )  # fmt: skip

    async def cancel(self, partitions: Iterable[int] | None = None) -> None:
        """Cancel the refreshes of groups on ``partitions`` (None: all) and wait for them."""
        keep = None if partitions is None else set(partitions)
        tasks = [
            task
            for group, task in self._running.items()
            if keep is None or self._partition_of.get(group) in keep
        ]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def retain(self, partitions: Iterable[int]) -> list[str]:
        """Forget the groups whose partition is not in ``partitions``; returns them."""
        kept = set(partitions)
        gone = [g for g, p in self._partition_of.items() if p not in kept]
        for group in gone:
            del self._partition_of[group]
            self.service.forget(group)
        return sorted(gone)

    async def close(self) -> None:
        self._closed = True
        await self.cancel()


def install_community_agent(
    app: faust.App,
    runtime: Runtime,
    names: TopicNames,
    worker: WorkerSettings,
    *,
    source: faust.TopicT,
    run_agent: Callable[[RecordHandler], Callable[[faust.StreamT], Any]],
) -> RefreshScheduler:
    """Add the assignment agent on ``source`` (the entities.new topic) and the refresh timer
    to ``app``. ``run_agent`` turns a handler into the stage agent function (the same loop
    and ack discipline as the stages, with the app's lanes bookkeeping)."""
    service = CommunityService(runtime.store, runtime.llm, runtime.embedder)
    scheduler = RefreshScheduler(
        service,
        runtime.outage,
        threshold=worker.community_drift_threshold,
        max_age=timedelta(seconds=worker.community_max_age_seconds),
        max_concurrent=worker.community_max_concurrent_refreshes,
        spread_seconds=worker.community_check_seconds,
    )
    handler = CommunityHandler(runtime, names, worker, service, scheduler.seen)
    app.agent(source, name=f"tidegraph.{STAGE}")(run_agent(handler))
    topic = names.entities_new
    metric_topic = topic[len(names.prefix) + 1 :]

    @app.timer(interval=worker.community_check_seconds, name="tidegraph.community_refresh")
    async def check_communities() -> None:
        try:
            started = scheduler.tick()
        except Exception:  # a bug here must not stop the timer for good
            log.exception("community refresh check failed")
            return
        if started:
            log.info("community_refresh_started groups=%s", ",".join(started))

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # Faust awaits async receivers
    async def on_revoked(sender: Any, revoked: Any, **_: Any) -> None:
        await scheduler.cancel(tp.partition for tp in revoked if tp.topic == topic)
        ASSIGNED_PARTITIONS.labels(metric_topic).set(0)

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]  # Faust awaits async receivers
    async def on_assigned(sender: Any, assigned: Any, **_: Any) -> None:
        mine = [tp.partition for tp in assigned if tp.topic == topic]
        ASSIGNED_PARTITIONS.labels(metric_topic).set(len(mine))
        gone = scheduler.retain(mine)
        if gone:
            log.info("community groups forgotten (partition moved): %s", ",".join(gone))

    @app.on_before_shutdown.connect  # type: ignore[arg-type]  # Faust awaits async receivers
    async def on_shutdown(sender: Any, **_: Any) -> None:
        await scheduler.close()

    return scheduler
