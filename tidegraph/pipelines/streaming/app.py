"""The Faust app: one agent per hop, each a thin loop around its handler
(``tidegraph.pipelines.streaming.handlers``): the extraction hop on ``{prefix}.episodes``, the
write hop on ``{prefix}.extracted`` (and the community agent on ``{prefix}.entities.new``). The
extraction hop writes a group's mapped records itself, in the write hop's lane of the group,
when nothing of the group is on its way there (``tidegraph.pipelines.streaming.fusing``).

Per agent: micro-batches from ``stream.noack_take(batch_size, within)``; each record goes to the
lane of its key (= group_id, ``tidegraph.pipelines.streaming.lanes``): groups run concurrently, each
group's records strictly in order, with no barrier between batches. A record is acked only once its
handler finished and Kafka acknowledged every record it produced (downstream hop, new-entity events
or its dead letter), so offsets are committed only for finished work (Faust commits the contiguous
acked prefix of each partition). ``noack_take`` rather than ``take``: ``take`` acks the whole batch
when its body ends, also when it ends by cancellation at shutdown, which would commit records never
processed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from functools import partial
from typing import Any, cast

import faust
from faust.types import TP

from tidegraph.connections import KafkaConnection
from tidegraph.metrics import (
    ASSIGNED_PARTITIONS,
    BATCH_SIZE,
    PARTITIONS_PAUSED,
    RECORDS_PRODUCED,
)
from tidegraph.pipelines.outage import StoreOutage
from tidegraph.pipelines.outbox import PRUNE_EVERY_SECONDS, prune_outbox
from tidegraph.pipelines.pending import partition_of, pending_envelopes
from tidegraph.pipelines.runtime import Runtime
from tidegraph.pipelines.streaming.commits import guard_commits
from tidegraph.pipelines.streaming.community_agent import install_community_agent
from tidegraph.pipelines.streaming.config import WorkerSettings
from tidegraph.pipelines.streaming.fetching import bound_fetch
from tidegraph.pipelines.streaming.fusing import WriteHere
from tidegraph.pipelines.streaming.handlers import (
    Consumed,
    Emit,
    ExtractionHandler,
    RecordHandler,
    WriteHandler,
    handled,
)
from tidegraph.pipelines.streaming.health import HealthState
from tidegraph.pipelines.streaming.lanes import KeyedBacklog, KeyedLanes
from tidegraph.pipelines.streaming.relay import relay_changes
from tidegraph.pipelines.streaming.sources import (
    DeclaredSources,
    SourceHandler,
    install_sources,
)
from tidegraph.processors.failures import STORE_MAY_BE_DOWN, classify
from tidegraph.settings import Settings
from tidegraph.stores.errors import StoreUnreachable
from tidegraph.topics.names import TopicNames
from tidegraph.topics.partitioning import KeyPartitioner
from tidegraph.topics.sealing import sealer_for

log = logging.getLogger(__name__)

# Exit status when Kafka does not take a record after the producer's own retries: nothing
# more is acked or committed, and the restarted worker gets the unfinished records again.
EXIT_PRODUCE_FAILED = 75

# Changes the relay reads per group and round (tidegraph/pipelines/streaming/relay.py).
RELAY_BATCH = 500


class TidegraphApp(faust.App):
    """faust.App that keeps its commits safe across rebalances, sets its consumer's fetch
    wait and size (``fetch_max_wait_seconds``, ``fetch_min_bytes``: ``WorkerSettings``) and
    closes tidegraph's resources after everything else has stopped."""

    def __init__(
        self, *args: Any, fetch_max_wait_seconds: float, fetch_min_bytes: int, **kwargs: Any
    ) -> None:
        self.fetch_max_wait_seconds = fetch_max_wait_seconds
        self.fetch_min_bytes = fetch_min_bytes
        super().__init__(*args, **kwargs)
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self._committed_before_rebalance: dict[Any, int | None] = {}
        # Run when partitions are revoked, before Faust waits for the records in flight.
        self.before_revoke: list[Callable[[], Awaitable[None]]] = []

    def _new_consumer(self) -> Any:
        consumer = super()._new_consumer()
        guard_commits(consumer)  # never commit past a record still in flight
        # Faust fixes the wait at 1.5 s and leaves the size at aiokafka's 1 byte
        bound_fetch(consumer, self.fetch_max_wait_seconds, self.fetch_min_bytes)
        return consumer

    def on_rebalance_start(self) -> None:
        super().on_rebalance_start()
        consumer = self._consumer
        committed = getattr(consumer, "_committed_offset", None) if consumer else None
        self._committed_before_rebalance = dict(committed or {})

    async def _on_partitions_revoked(self, revoked: set[Any]) -> None:
        # faust-streaming 0.15 forgets the committed offset of revoked partitions *before* it
        # waits for the records in flight; its periodic commit then takes the first records
        # acked afterwards as the start of the contiguous range and may commit past records
        # still in flight (lost if the worker dies then, or if they are handed back). Put the
        # last committed offsets back so that a commit only ever covers finished records.
        consumer = self._consumer
        committed = getattr(consumer, "_committed_offset", None) if consumer else None
        if committed is not None:
            for tp in revoked:
                before = self._committed_before_rebalance.get(tp)
                if before is not None and committed.get(tp) is None:
                    committed[tp] = before
        for hook in self.before_revoke:
            await hook()
        await super()._on_partitions_revoked(revoked)

    def add_closer(self, closer: Callable[[], Awaitable[None]]) -> None:
        self._closers.append(closer)

    async def on_shutdown(self) -> None:
        await super().on_shutdown()
        for closer in reversed(self._closers):
            try:
                await closer()
            except Exception:
                log.exception("closing %r failed", closer)


def create_app(
    settings: Settings,
    worker: WorkerSettings,
    runtime: Runtime,
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    health: HealthState | None = None,
    sources: DeclaredSources | None = None,
) -> TidegraphApp:
    """The worker's Faust app: one agent per hop over one group runner (docs: "Streaming
    topology"), the community agent, the rebalance handlers and the timers."""
    names = TopicNames(settings.topic_prefix)
    app = _faust_app(settings, worker, loop)
    topics = {
        name: app.topic(
            name,
            key_serializer="raw",
            value_serializer="raw",
            partitions=settings.partitions,
            replicas=settings.replication_factor,
        )
        for name in names.all()
    }
    write_here = _write_here(app, names)
    sender = Sender(app, names, write_here)
    runner = runtime.runner(worker.retry_policy())
    budget = settings.record_timeout_seconds
    lanes: list[KeyedLanes] = []
    extraction = ExtractionHandler(runner, names, worker, budget)
    extraction.write_here = write_here
    hops: list[tuple[str, RecordHandler]] = [
        (names.episodes, extraction),
        (names.extracted, WriteHandler(runner, names, worker, budget)),
    ]
    for topic, handler in hops:
        agent = stage_agent(
            handler, sender, worker, lanes, lambda: app.consumer_generation_id,
            write_here=write_here if topic == names.extracted else None,
        )  # fmt: skip
        app.agent(topics[topic], name=f"tidegraph.{handler.stage}")(agent)
    if sources is not None:  # source topics -> extracted, episodes (streaming/sources.py)
        install_sources(
            app, sources, SourceHandler(sources.sources, names, worker, budget, runner.map_now),
            run_agent=partial(stage_agent, sender=sender, worker=worker, registry=lanes,
                              generation=lambda: app.consumer_generation_id),
        )  # fmt: skip
    if worker.communities_enabled:  # entities.new -> communities (community_agent.py)
        install_community_agent(
            app, runtime, names, worker, source=topics[names.entities_new],
            run_agent=partial(stage_agent, sender=sender, worker=worker, registry=lanes,
                              generation=lambda: app.consumer_generation_id),
        )  # fmt: skip
    owned = _on_rebalance(
        app, runtime, names, [topic for topic, _ in hops], lanes, health, write_here
    )
    app.before_revoke.append(partial(_let_go_while_store_down, runtime.outage, lanes))
    _timers(app, runtime, worker, names, topics, owned, settings.partitions, health)
    if settings.changes_enabled:
        _change_stream(
            app, runtime, worker, sender, topics[names.changes], owned, settings.partitions
        )
    app.add_closer(runtime.close)
    return app


def _faust_app(
    settings: Settings, worker: WorkerSettings, loop: asyncio.AbstractEventLoop | None
) -> TidegraphApp:
    kafka = KafkaConnection.from_settings(settings)
    return TidegraphApp(
        worker.group_id(settings.topic_prefix),
        fetch_max_wait_seconds=worker.fetch_max_wait_seconds,
        fetch_min_bytes=worker.fetch_min_bytes,
        broker=kafka.faust_brokers(),
        broker_credentials=kafka.faust_credentials(),
        store="memory://",
        web_enabled=False,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        topic_allow_declare=False,  # ensure_topics creates them, with checks
        topic_disable_leader=True,
        # Kafka's default placement, each group's hash kept (tidegraph/topics/partitioning.py)
        producer_partitioner=KeyPartitioner(),
        consumer_auto_offset_reset="earliest",
        processing_guarantee="at_least_once",
        broker_commit_every=worker.commit_every,
        broker_commit_interval=worker.commit_interval_seconds,
        broker_session_timeout=worker.session_timeout_seconds,
        broker_heartbeat_interval=worker.heartbeat_interval_seconds,
        # On rebalance and shutdown, finish every record already taken before letting go of
        # the partitions. Handing them back unprocessed is not safe with this Faust: it drops
        # its committed offsets at revocation, and its periodic commit can then pass records
        # that were never acked (we saw records lost that way).
        stream_wait_empty=True,
        broker_rebalance_timeout=worker.rebalance_timeout_seconds,
        datadir=str(settings.data_dir / "faust"),
        loop=loop,
    )


def _write_here(app: TidegraphApp, names: TopicNames) -> WriteHere:
    """The extraction hop's writes of mapped records (``fusing.py``), over the write hop's
    consumer: its committed offsets (Faust's, kept by ``TidegraphApp``) and the end offsets of
    ``{prefix}.extracted``."""

    def committed(partition: int) -> int | None:
        consumer = app._consumer
        offsets = getattr(consumer, "_committed_offset", None) if consumer else None
        return offsets.get(TP(names.extracted, partition)) if offsets is not None else None

    async def end_offset(partition: int) -> int:
        tp = TP(names.extracted, partition)
        return (await app.consumer.highwaters(tp))[tp]

    return WriteHere(committed, end_offset)


def _on_rebalance(
    app: TidegraphApp,
    runtime: Runtime,
    names: TopicNames,
    consumed: list[str],
    lanes: list[KeyedLanes],
    health: HealthState | None,
    write_here: WriteHere,
) -> set[int]:
    """Finish every job admitted before partitions move or the worker stops; returns the
    partitions of the input topic this worker owns (kept current), for the pending sweep."""
    owned: set[int] = set()

    async def quiesce() -> None:
        # Faust has waited for the records it tracks; also finish every job admitted to a
        # lane, and start nothing new until the next assignment: nothing of this worker runs
        # on a group once its partition may start elsewhere.
        await asyncio.gather(*(stage.quiesce() for stage in list(lanes)))

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # Faust awaits async receivers
    async def on_revoked(sender: Any, revoked: Any, **_: Any) -> None:
        await quiesce()
        write_here.reassigned()
        for topic in consumed:
            ASSIGNED_PARTITIONS.labels(_short(names, topic)).set(0)
        runtime.components.context.forget_all()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]  # Faust awaits async receivers
    async def on_assigned(sender: Any, assigned: Any, **_: Any) -> None:
        owned.clear()
        owned.update(tp.partition for tp in assigned if tp.topic == names.episodes)
        write_here.reassigned()
        for stage_lanes in lanes:
            stage_lanes.reopen()  # records taken before the rebalance are still dropped
        for topic in consumed:
            count = sum(1 for tp in assigned if tp.topic == topic)
            ASSIGNED_PARTITIONS.labels(_short(names, topic)).set(count)
        log.info(
            "assigned partitions: %s",
            ", ".join(sorted(f"{tp.topic}:{tp.partition}" for tp in assigned)) or "none",
        )
        if health is not None:
            health.kafka_connected = True  # joined the group (possibly with no partitions)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]  # Faust awaits async receivers
    async def on_shutdown(sender: Any, **_: Any) -> None:
        await quiesce()  # before the consumer's last commit

    return owned


async def _let_go_while_store_down(outage: StoreOutage, lanes: list[KeyedLanes]) -> None:
    """Partitions revoked while the store does not answer: the jobs waiting for it are let go
    with their partitions (their records, unacknowledged, come again to the partitions' next
    owner from the committed offset) instead of holding the rebalance until the store answers
    and then writing a group its next owner writes too."""
    if not outage.down:
        return
    held = sum(stage.in_flight for stage in lanes)
    log.warning(
        "partitions revoked while the store does not answer: %d jobs waiting for it let go "
        "with them (their records come again to the partitions' next owner)", held,
    )  # fmt: skip
    await asyncio.gather(*(stage.cancel() for stage in list(lanes)))


def _timers(
    app: TidegraphApp,
    runtime: Runtime,
    worker: WorkerSettings,
    names: TopicNames,
    topics: dict[str, faust.TopicT],
    owned: set[int],
    partitions: int,
    health: HealthState | None,
) -> None:
    """The store probe behind /readyz and the outage rule (``tidegraph.pipelines.outage``:
    the records held, the partitions paused while the store does not answer), and the sweep
    of episodes stored without extraction."""
    outage = runtime.outage
    paused: set[Any] = set()

    def on_outage(down: bool) -> None:
        # Fetch nothing more while the store does not answer; what was taken waits, in order.
        consumer = app.consumer
        if down:
            paused.update(consumer.assignment())
            consumer.pause_partitions(paused)
        else:
            consumer.resume_partitions(paused & set(consumer.assignment()))
            paused.clear()
        PARTITIONS_PAUSED.set(len(paused))
        if health is not None:
            health.neo4j_reachable = not down

    outage.listen(on_outage)

    @app.timer(interval=worker.health_probe_seconds, name="tidegraph.store_probe")
    async def probe_store() -> None:
        # An outage found here stops the budgets of records stuck on a frozen store at once.
        reachable = await outage.check()
        if health is not None and not outage.down:
            health.neo4j_reachable = reachable

    if runtime.llm is not None:

        @app.timer(interval=worker.pending_sweep_seconds, name="tidegraph.pending_sweep")
        async def sweep_pending() -> None:
            # Episodes stored without extraction go through the chain again, on their group's
            # partition so the group's order holds (docs: "Episodes without an LLM").
            try:
                envelopes = await pending_envelopes(
                    runtime.store, set(owned), partitions, worker.pending_sweep_limit
                )
                sealer = sealer_for(runtime.settings, runtime.store)
                for key, value in envelopes:
                    if sealer is not None:  # docs/streaming.md "Sealed episodes"
                        value = await sealer.seal(value, key)
                    await topics[names.episodes].send(key=key.encode(), value=value)
            except Exception as exc:
                await quietly(outage, "pending sweep", exc)
                return
            if envelopes:
                log.info("pending_sweep resent=%d", len(envelopes))


def _change_stream(
    app: TidegraphApp,
    runtime: Runtime,
    worker: WorkerSettings,
    sender: Sender,
    changes_topic: faust.TopicT,
    owned: set[int],
    partitions: int,
) -> None:
    """The relay of the owned groups' outboxes to {prefix}.changes, and their retention."""

    topic = changes_topic.get_topic_name()

    async def send_change(key: bytes, value: bytes) -> Awaitable[object]:
        return await sender.send(Emit(topic, key, value))

    @app.task
    async def relay() -> None:
        # The outbox's committed changes to {prefix}.changes (docs/streaming.md "Change
        # stream"), round after round: a round that found a full batch goes on at once, the
        # others wait changes_relay_seconds; a failed round is tried again by the next one.
        failing = False  # logged once until a round succeeds again
        while not app.should_stop:
            try:
                published = await relay_changes(
                    runtime.store.outbox, send_change, set(owned), partitions, RELAY_BATCH
                )
                failing = False
            except Exception as exc:
                if not failing:
                    await quietly(runtime.outage, "change relay", exc)
                failing = True
                published = 0
                await runtime.outage.wait_up()
            if published < RELAY_BATCH:
                await app.sleep(worker.changes_relay_seconds)

    @app.timer(interval=PRUNE_EVERY_SECONDS, name="tidegraph.outbox_retention")
    async def prune() -> None:
        # The outbox's published changes past their retention go (tidegraph/pipelines/outbox.py).
        try:
            groups = [
                log_.group_id
                for log_ in await runtime.store.outbox.change_logs(own=True)
                if partition_of(log_.group_id, partitions) in owned
            ]
            await prune_outbox(
                runtime.store.outbox,
                groups,
                runtime.settings.changes_retention_hours,
                published_only=True,
            )
        except Exception as exc:
            await quietly(runtime.outage, "outbox retention", exc)


async def quietly(outage: StoreOutage, what: str, exc: BaseException) -> None:
    """A background round (relay, sweep, retention) failed: nothing more when the store does
    not answer (``StoreOutage`` logs an outage once), else one line, with the traceback of
    what may be a bug; the next round tries again."""
    store_may_be_down = classify(exc).reason in STORE_MAY_BE_DOWN
    if store_may_be_down and not await outage.check():
        return
    log.warning(
        "%s failed (%s: %s); the next round tries again",
        what, type(exc).__name__, exc, exc_info=None if store_may_be_down else exc,
    )  # fmt: skip


def _short(names: TopicNames, topic: str) -> str:
    return topic[len(names.prefix) + 1 :]


class Sender:
    """Produces records (the hops' outputs, the relay's changes) straight through the app's
    producer; returns delivery futures. Keys and values are bytes already, so Faust's channel
    layer (a future message, its callbacks and the topic's serializers per record) is skipped;
    the app's partitioner (Kafka's placement) still puts each group's records on its key's
    partition."""

    def __init__(self, app: faust.App, names: TopicNames, write_here: WriteHere) -> None:
        self.app = app
        self.names = names
        self.write_here = write_here

    async def send(self, emit: Emit) -> Awaitable[Any]:
        delivery = await self.app.producer.send(emit.topic, emit.key, emit.value, None, None, None)
        if emit.topic == self.names.extracted:  # what the write hop has yet to take
            delivered = self.write_here.sending(emit.key)
            cast(asyncio.Future[Any], delivery).add_done_callback(
                lambda done: delivered(
                    None if done.cancelled() or done.exception() else done.result()
                )
            )
        return delivery

    def delivered(self, emits: Sequence[Emit]) -> None:
        """Counts a run's records Kafka acknowledged, one metric update per topic."""
        for topic, count in Counter(emit.topic for emit in emits).items():
            RECORDS_PRODUCED.labels(_short(self.names, topic)).inc(count)


def stage_agent(
    handler: RecordHandler,
    sender: Sender,
    worker: WorkerSettings,
    registry: list[KeyedLanes],
    generation: Callable[[], int],
    *,
    write_here: WriteHere | None = None,
) -> Callable[[faust.StreamT], Awaitable[None]]:
    """The agent of ``handler``'s hop; the write hop's also tells ``write_here`` which records
    it has taken and lends it its lanes (``fusing.py``)."""

    async def agent(stream: faust.StreamT) -> None:
        lanes = KeyedLanes(
            worker.max_in_flight,
            lambda exc: _fail_stop(handler.stage, exc),
            per_key=worker.max_in_flight_per_group,
        )
        registry.append(lanes)
        if write_here is not None:
            write_here.lanes = lanes
        backlog: KeyedBacklog[faust.EventT] = KeyedBacklog(handler.group_take)
        lanes.on_cancel(backlog.clear)  # jobs let go: the records waiting for them too
        # noack_take is faust-streaming's, missing from its StreamT stub
        batches: AsyncIterator[Sequence[faust.EventT]] = stream.noack_take(  # type: ignore[attr-defined]
            worker.batch_size, within=worker.batch_within(handler.stage)
        )

        async def submit(events: Sequence[faust.EventT]) -> None:
            # A group's waiting records in one job (docs: "Batch-native stages"); its lane
            # keeps the group's jobs in order. Records of a group whose job waits for its turn
            # join that job (``KeyedBacklog.needs_job``). Records taken while the lanes are
            # closed are dropped, unacked (Kafka hands them out again), and kept nowhere.
            for key, group_events in by_key(events, handler.lane_of).items():
                for start in range(0, len(group_events), backlog.most):
                    if lanes.closed:
                        return
                    backlog.add(key, group_events[start : start + backlog.most])
                    if backlog.needs_job(key):
                        job = partial(
                            run_waiting, handler, sender, stream, backlog, key, generation
                        )
                        if not await lanes.submit(key, job):
                            return
                        backlog.admitted(key)
            if write_here is not None:  # every record of the batch is in a job of its lane
                # (one taken before the rebalance is dropped by its job: Kafka hands it out again)
                current = generation()
                write_here.taken(
                    (e.message.partition, e.message.offset)
                    for e in events
                    if e.message.generation_id == current
                )

        try:
            async for events in batches:
                BATCH_SIZE.labels(handler.stage).observe(len(events))
                await submit(events)
                # No reference to a batch outlives it: Faust waits at a rebalance for every
                # record taken and still referenced (its unacked set is weak).
                del events
        finally:
            registry.remove(lanes)
            await lanes.cancel()

    agent.__name__ = agent.__qualname__ = f"{handler.stage}_agent"
    return agent


def by_key(
    events: Sequence[faust.EventT], lane_of: Callable[[str, int, bytes | None], Hashable]
) -> dict[Any, list[faust.EventT]]:
    """The events of a micro-batch by lane (``RecordHandler.lane_of``: the record key, the
    group, on tidegraph's topics), each lane's in offset order."""
    groups: dict[Any, list[faust.EventT]] = {}
    for event in events:
        message = event.message
        groups.setdefault(lane_of(message.topic, message.partition, message.key), []).append(event)
    return groups


async def run_waiting(
    handler: RecordHandler,
    sender: Sender,
    stream: faust.StreamT,
    backlog: KeyedBacklog[faust.EventT],
    key: Any,
    generation: Callable[[], int],
) -> None:
    """The records of group ``key`` waiting when this job starts (``KeyedBacklog``), through
    ``run_records``. Records taken before a rebalance are left unacked (Kafka hands them
    out again)."""
    current = generation()
    stale: list[faust.EventT] = []

    def fresh(event: faust.EventT) -> bool:
        if event.message.generation_id == current:
            return True
        stale.append(event)
        return False

    events = backlog.take(key, fresh)
    if stale:
        log.warning(
            "stage=%s dropped %d records taken before the rebalance", handler.stage, len(stale)
        )
    if events:
        await run_records(handler, sender, stream, events, generation)


async def run_records(
    handler: RecordHandler,
    sender: Sender,
    stream: faust.StreamT,
    events: list[faust.EventT],
    generation: Callable[[], int],
) -> None:
    """One group's records of a micro-batch (``RecordHandler.handle_group``): handled, their
    outputs produced and acknowledged by Kafka, then each record acked, in order."""
    fresh = [e for e in events if e.message.generation_id == generation()]
    if len(fresh) < len(events):
        log.warning(
            "stage=%s dropped %d records taken before the rebalance",
            handler.stage, len(events) - len(fresh),
        )  # fmt: skip
    outputs = await handled(handler, [consumed(event) for event in fresh])
    produced = [emit for emits in outputs for emit in emits]
    deliveries = [await sender.send(emit) for emit in produced]
    for delivery in deliveries:
        await delivery
    sender.delivered(produced)
    for event in fresh:
        await stream.ack(event)


def consumed(event: faust.EventT) -> Consumed:
    message = event.message
    timestamp = message.timestamp
    return Consumed(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        timestamp_ms=None if timestamp is None else int(round(timestamp * 1000)),
        key=message.key,
        value=message.value,
        headers=tuple(
            headers.items() if isinstance(headers := message.headers, Mapping) else headers or ()
        ),
    )


def _fail_stop(stage: str, exc: BaseException) -> None:
    """A record could not be produced (Kafka unavailable beyond the producer's retries), the
    store did not answer for longer than TIDEGRAPH_STORE_OUTAGE_LIMIT_SECONDS, or a handler
    broke its contract (handlers turn record failures into dead letters): stop at once
    without committing anything more."""
    log.critical(
        "stage=%s cannot finish a batch (%s: %s); exiting with status %d without committing: "
        "the unfinished records are redelivered when a worker restarts",
        stage, type(exc).__name__, exc, EXIT_PRODUCE_FAILED,
        exc_info=None if isinstance(exc, StoreUnreachable) else exc,  # an outage: no bug
    )  # fmt: skip
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_PRODUCE_FAILED)
