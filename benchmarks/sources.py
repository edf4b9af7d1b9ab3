"""Declared sources (docs/sources.md): what reading a feed as it already runs costs.

    python -m benchmarks.sources --records 5000 --groups 16 --partitions 8 --runs 3 [--latency]

1. **rate** (one worker per round): the same CRM changes (accounts changing plan and owner,
   over ``--groups`` tenants) sent three ways, each round on fresh topics to a fresh worker,
   all produced at once: ``envelope`` (tidegraph's own envelopes on ``{prefix}.episodes``,
   one mapped record per change), ``debezium-json`` (Debezium change events as Connect's JSON
   converter writes them, schemas on, through a declared source and a ``change_events``
   rule), ``debezium-avro`` (the same events in Avro, the schema registry's wire format).

   What is measured is each variant's steady rate under the same conditions:

   - one unmeasured warm-up round of every variant first (the first rounds of a sitting ran
     at a third of the later ones' rate: Neo4j's query plans and JIT, Kafka's and the
     worker's first requests), then ``--runs`` rounds, the variants interleaved and rotated
     round by round (A B C, B C A, C A B, ...) so that none always runs first or last;
   - before each round, Neo4j has finished with the previous round's writes and deletes
     (``settle``: idle for a second);
   - the worker joins its consumer group and writes one change before the clock starts;
     the clock runs from the first record the worker's first hop handled (its first
     extraction produced to ``{prefix}.extracted``) to the last episode written, both read
     from the worker's own counters every 0.1 s (``tidegraph_records_produced_total``,
     ``tidegraph_stage_events_total``), and the store is then checked to hold them all;
   - the worker's CPU seconds (``/proc``) over the same window, per 1,000 changes, so that
     Avro's decoding cost shows against JSON's.

   Each round's breakdown is in ``runs``: the settle, the group join, the warm-up, the
   produce, the window, and the CPU seconds of the worker, Neo4j, Kafka, the registry, this
   process and the machine's other processes over the window (another program's load shows
   there), and how the worker batched (``batching``: records per take of each hop, episodes
   per write unit and per store transaction). The median of the rounds is reported, and the
   rounds' spread.
2. **latency** (``--latency``; needs this checkout's PostgreSQL and Kafka Connect, started
   here if need be): rows committed in PostgreSQL at ``--rate`` per second (default: half the
   ``debezium-json`` rate just measured) through Debezium, Kafka and a worker; per row, its
   commit time (Debezium's ``source.ts_ms``, the episode's reference time) to its episode's
   ``created_at`` in the graph: p50, p99.

The ``debezium-avro`` variant's registry is this checkout's schema registry (Apicurio
Registry, Confluent's API; tests/support/local_services.py), started here if need be.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from benchmarks.kafka_throughput import (
    percentile,
    settle,
    start_worker,
    stop_worker,
    wait_assigned,
    worker_env,
)
from tests.support.metrics import free_port, metric_value, scrape
from tidegraph.settings import Settings

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("envelope", "debezium-json", "debezium-avro")
PLANS = ("Starter", "Pro", "Business", "Enterprise")
OWNERS = ("Alice", "Bob", "Carol", "Dana", "Erin")
T0_MS = 1_735_689_600_000  # 2025-01-01

ENVELOPE_MAPPING = """\
mappings:
  - name: plan
    match: {type: account.plan}
    entities:
      account: {name: "Account {id}", label: Account, key: "crm:account:{id}"}
      plan: {name: "{plan}", label: Plan}
    facts:
      - {relation: HAS_PLAN, subject: account, object: plan, cardinality: one}
  - name: owner
    match: {type: account.owner}
    entities:
      account: {name: "Account {id}", label: Account, key: "crm:account:{id}"}
      owner: {name: "{owner}", label: User}
    facts:
      - {relation: OWNED_BY, subject: account, object: owner, cardinality: one}
"""
CHANGE_MAPPING = """\
mappings:
  - name: account_row
    match: {source.table: accounts}
    change_events: true
    entities:
      account: {name: "Account {row.id}", label: Account, key: "crm:account:{row.id}"}
      plan: {name: "{row.plan}", label: Plan}
      owner: {name: "{row.owner}", label: User}
    facts:
      - {relation: HAS_PLAN, subject: account, object: plan, cardinality: one}
      - {relation: OWNED_BY, subject: account, object: owner, cardinality: one}
"""


# ----------------------------------------------------------------------------- the feed
def changes(records: int, groups: int, accounts: int = 20) -> list[dict[str, Any]]:
    """``records`` changes of ``groups`` tenants' accounts: the first of each account is its
    insert, every later one moves its plan or its owner. Each: tenant, op, before, after,
    the changed column, the time (ms)."""
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    out = []
    for i in range(records):
        tenant, account = i % groups, (i // groups) % accounts
        key = (tenant, account)
        at = T0_MS + i * 1000
        before = rows.get(key)
        if before is None:
            after = {
                "id": tenant * 1000 + account,
                "tenant": f"t{tenant}",
                "plan": PLANS[0],
                "owner": OWNERS[0],
            }
            column = "insert"
        else:
            column = "plan" if i % 2 else "owner"
            values = PLANS if column == "plan" else OWNERS
            after = {**before, column: values[(values.index(before[column]) + 1) % len(values)]}
        rows[key] = after
        out.append(
            {
                "tenant": after["tenant"],
                "op": "c" if before is None else "u",
                "before": before,
                "after": after,
                "column": column,
                "at": at,
            }
        )
    return out


def envelope(change: dict[str, Any], run: str) -> list[bytes]:
    """The same change as tidegraph's own mapped records (an insert: its plan and owner)."""
    row, group = change["after"], f"{run}-{change['after']['tenant']}"
    kinds = ("plan", "owner") if change["column"] == "insert" else (change["column"],)
    return [
        orjson.dumps(
            {
                "id": f"{row['id']}:{change['at']}:{kind}",
                "group_id": group,
                "source": "json",
                "reference_time": change["at"] / 1000,
                "content": {"type": f"account.{kind}", "id": row["id"], kind: row[kind]},
            }
        )
        for kind in kinds
    ]


def debezium_value(change: dict[str, Any], lsn: int) -> dict[str, Any]:
    return {
        "before": change["before"],
        "after": change["after"],
        "op": change["op"],
        "ts_ms": change["at"],
        "source": {"table": "accounts", "lsn": lsn, "txId": lsn, "ts_ms": change["at"]},
    }


_FIELD = [{"type": "int32", "optional": False, "field": "id"}] + [
    {"type": "string", "optional": False, "field": f} for f in ("tenant", "plan", "owner")
]
_VALUE_SCHEMA = {
    "type": "struct",
    "optional": True,
    "name": "crm.public.accounts.Value",
    "fields": _FIELD,
}
JSON_SCHEMA = {  # Connect's JSON converter with schemas on, as Debezium's default
    "type": "struct",
    "name": "crm.public.accounts.Envelope",
    "optional": False,
    "fields": [
        {**_VALUE_SCHEMA, "field": "before"},
        {**_VALUE_SCHEMA, "field": "after"},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
        {
            "type": "struct",
            "optional": False,
            "field": "source",
            "fields": [
                {"type": "string", "optional": False, "field": "table"},
                {"type": "int64", "optional": True, "field": "lsn"},
                {"type": "int64", "optional": True, "field": "txId"},
                {"type": "int64", "optional": False, "field": "ts_ms"},
            ],
        },
    ],
}


def avro_schema() -> str:
    value = {
        "type": "record",
        "name": "Value",
        "namespace": "crm.public.accounts",
        "fields": [{"name": "id", "type": "int"}]
        + [{"name": f, "type": "string"} for f in ("tenant", "plan", "owner")],
    }
    source = {
        "type": "record",
        "name": "Source",
        "fields": [
            {"name": "table", "type": "string"},
            {"name": "lsn", "type": ["null", "long"]},
            {"name": "txId", "type": ["null", "long"]},
            {"name": "ts_ms", "type": "long"},
        ],
    }
    return orjson.dumps(
        {
            "type": "record",
            "name": "Envelope",
            "namespace": "crm.public.accounts",
            "fields": [
                {"name": "before", "type": ["null", value], "default": None},
                {"name": "after", "type": ["null", "Value"], "default": None},
                {"name": "op", "type": "string"},
                {"name": "ts_ms", "type": ["null", "long"], "default": None},
                {"name": "source", "type": source},
            ],
        }
    ).decode()


# ----------------------------------------------------------------------------- one run
async def run_variant(
    args: argparse.Namespace, variant: str, registry_url: str | None
) -> dict[str, Any]:
    from aiokafka import AIOKafkaProducer

    from tidegraph.stores import open_store
    from tidegraph.topics.admin import delete_topics, ensure_topics
    from tidegraph.topics.names import TopicNames

    run = f"bs{uuid.uuid4().hex[:8]}"
    names = TopicNames(run)
    work = args.work_dir / run
    work.mkdir(parents=True, exist_ok=True)
    feed = changes(args.records, args.groups)
    groups = sorted({f"{run}-{c['tenant']}" for c in feed})
    source_topic = f"{run}.crm.public.accounts"
    await ensure_topics(args.bootstrap, names, partitions=args.partitions, replication_factor=1)
    if variant == "envelope":
        (work / "mapping.yaml").write_text(ENVELOPE_MAPPING)
        records = [(c["after"]["tenant"].encode(), v) for c in feed for v in envelope(c, run)]
        records = [(f"{run}-".encode() + k, v) for k, v in records]
        topic = names.episodes
    else:
        (work / "mapping.yaml").write_text(CHANGE_MAPPING)
        await ensure_topics(
            args.bootstrap, [source_topic], partitions=args.partitions, replication_factor=1
        )
        records = _debezium_records(feed, variant, source_topic, registry_url)
        topic = source_topic
        registry = (
            f", format: avro, registry: {{url: '{registry_url}'}}"
            if variant == "debezium-avro"
            else ""
        )
        (work / "sources.yaml").write_text(
            f"sources:\n  - {{name: crm, topics: [{source_topic}], envelope: debezium{registry},"
            f" group: '{run}-{{row.tenant}}'}}\n"
        )
    port = free_port()
    env = _worker_env(args, run, work, port, sources=variant != "envelope")
    settled = await asyncio.to_thread(settle)
    began = time.monotonic()
    worker = start_worker(env, work / "worker.log")
    cpu = CpuProbe.of_services(worker=worker.pid)
    store = open_store(_client_settings(args, run, work))
    try:
        await wait_assigned([port], "episodes", args.partitions, timeout=120)
        joined = time.monotonic()
        # The first change warms the path up (the source's partitions, the store's first
        # writes); the rest is timed.
        warm = len(envelope(feed[0], run)) if variant == "envelope" else 1
        episodes = len(records) if variant == "envelope" else len(feed)
        producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, linger_ms=20)
        await producer.start()
        try:
            for key, value in records[:warm]:
                await producer.send_and_wait(topic, value, key=key)
            await _until_written(store, groups, warm, worker, args.timeout)
            warmed = time.monotonic()
            window = Window(port, cpu, wanted=episodes - warm)
            watching = asyncio.create_task(window.watch(worker, args.timeout))
            sent = time.monotonic()
            for key, value in records[warm:]:
                await producer.send(topic, value, key=key)
            await producer.flush()
            produced = time.monotonic()
        finally:
            await producer.stop()
        await watching
        await _until_written(store, groups, episodes, worker, args.timeout)  # all are there
    finally:
        stop_worker(worker)
        for group in groups:
            await store.forget.delete_group(group)
        await store.close()
        await delete_topics(args.bootstrap, [*names.all(), source_topic])
    timed = len(feed) - 1
    seconds = window.seconds
    return {
        "changes": len(feed),
        "records": len(records),
        "episodes": episodes,
        "seconds": round(seconds, 2),
        "changes_per_s": round(timed / seconds, 1),
        "worker_cpu_ms_per_change": round(1000 * window.cpu["worker"] / timed, 3),
        "breakdown_s": {
            "settle": settled,
            "join": round(joined - began, 2),
            "warm_up": round(warmed - joined, 2),
            "produce": round(produced - sent, 2),
            "to_first_record": round(window.first - sent, 2),
            "window": round(seconds, 2),
        },
        "cpu_s": {k: round(v, 2) for k, v in window.cpu.items()},
        "batching": _batching(window.batches, seconds, episodes - warm),
    }


def _batching(counts: dict[str, float], seconds: float, episodes: int) -> dict[str, float]:
    """From the round's batch counters over its window of ``seconds`` and ``episodes``: how
    often each hop took records from Kafka and how many at once, the write units and store
    transactions per episode and the episodes each held (means), and how many there were."""
    out: dict[str, float] = {}
    for stage in ("source", "extraction", "resolution"):
        takes = counts[f"{stage}_take_count"]
        if takes:
            out[f"{stage}_takes_per_s"] = round(takes / seconds, 1) if seconds else 0.0
            out[f"{stage}_records_per_take"] = round(counts[f"{stage}_take_sum"] / takes, 1)
    for what in ("unit", "transaction"):
        out[f"{what}s"] = counts[f"{what}_count"]
        if episodes:
            out[f"{what}s_per_episode"] = round(counts[f"{what}_count"] / episodes, 4)
        if counts[f"{what}_count"]:
            out[f"episodes_per_{what}"] = round(counts[f"{what}_sum"] / counts[f"{what}_count"], 1)
    return out


class CpuProbe:
    """CPU seconds (``/proc``) of the processes in play: the worker, this checkout's local
    services, this process, and the machine's other processes."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    @classmethod
    def of_services(cls, worker: int) -> CpuProbe:
        from tests.support.local_services import LocalServices

        pids = {s.name: s.pid for s in LocalServices().status() if s.running and s.pid}
        return cls({"worker": worker, **pids, "benchmark": os.getpid()})

    def read(self) -> dict[str, float]:
        used = {name: _cpu_seconds(pid) for name, pid in self.pids.items()}
        # the machine's busy time: user, nice, system, irq, softirq, steal (not idle, iowait)
        ticks = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
        used["others"] = busy - sum(used.values())
        return used


class Window:
    """The timed window of a round, read from the worker's counters every 0.1 s: from its
    first extraction produced to ``{prefix}.extracted`` (the first record its first hop
    handled) to its ``wanted``-th episode written; the CPU of each process over it."""

    def __init__(self, port: int, probe: CpuProbe, wanted: int) -> None:
        self.port, self.probe, self.wanted = port, probe, wanted
        self.extracted, self.written = self.counters()
        self.first = self.last = 0.0
        self.cpu: dict[str, float] = {}
        self.batches: dict[str, float] = {}

    def counters(self) -> tuple[float, float]:
        text = scrape(self.port)
        return (
            metric_value(text, "tidegraph_records_produced_total", topic="extracted"),
            metric_value(text, "tidegraph_stage_events_total", stage="invalidation", outcome="ok"),
        )

    def batching(self) -> dict[str, float]:
        """The worker's batch counters (how many records each hop took at once, how many
        episodes a write unit and a store transaction held): their sums and counts."""
        text = scrape(self.port)
        counts: dict[str, float] = {}
        for stage in ("source", "extraction", "resolution"):
            for part in ("sum", "count"):
                counts[f"{stage}_take_{part}"] = metric_value(
                    text, f"tidegraph_batch_records_{part}", stage=stage
                )
        for part in ("sum", "count"):
            counts[f"unit_{part}"] = metric_value(text, f"tidegraph_batch_episodes_{part}")
            counts[f"transaction_{part}"] = metric_value(
                text, f"tidegraph_store_batch_rows_{part}", operation="episodes_per_transaction"
            )
        return counts

    @property
    def seconds(self) -> float:
        return self.last - self.first

    async def watch(self, worker: Any, timeout: float) -> None:
        start = self.probe.read()
        batches = await asyncio.to_thread(self.batching)
        deadline = time.monotonic() + timeout
        while True:
            extracted, written = await asyncio.to_thread(self.counters)
            now = time.monotonic()
            if not self.first and extracted > self.extracted:
                self.first, start = now, self.probe.read()
            if written - self.written >= self.wanted:
                self.last, end = now, self.probe.read()
                self.cpu = {k: end[k] - start[k] for k in end}
                ended = await asyncio.to_thread(self.batching)
                self.batches = {k: ended[k] - batches[k] for k in ended}
                return
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited {worker.returncode}; see its worker.log")
            if now > deadline:
                raise TimeoutError(f"{written - self.written} of {self.wanted} written")
            await asyncio.sleep(0.1)  # a sampling period, not a synchronisation


async def _until_written(
    store: Any, groups: list[str], episodes: int, worker: Any, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited {worker.returncode}; see its worker.log")
        written = sum([(await store.browse.counts(g))["episodes"] for g in groups])
        if written >= episodes:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{written} of {episodes} episodes in {timeout}s")
        await asyncio.sleep(0.5)  # a light poll: the counts are read from the store


def _debezium_records(
    feed: list[dict[str, Any]], variant: str, topic: str, registry_url: str | None
) -> list[tuple[bytes, bytes]]:
    out = []
    serializer = None
    if variant == "debezium-avro":
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        client = SchemaRegistryClient({"url": registry_url})
        serializer = AvroSerializer(client, avro_schema())
        context = SerializationContext(topic, MessageField.VALUE)
    for lsn, change in enumerate(feed, start=1):
        key = orjson.dumps({"id": change["after"]["id"]})
        value = debezium_value(change, lsn)
        if serializer is not None:
            data = serializer(value, context)
            assert data is not None
            out.append((key, data))
        else:
            out.append((key, orjson.dumps({"schema": JSON_SCHEMA, "payload": value})))
    return out


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- latency
async def run_latency(args: argparse.Namespace, rate: float) -> dict[str, Any]:
    """Rows committed at ``rate``/s through PostgreSQL -> Debezium -> Kafka -> a worker."""
    from tests.support.debezium import CapturedDatabase
    from tests.support.local_services import LocalServices
    from tidegraph.stores import open_store

    local = LocalServices()
    await asyncio.to_thread(local.up, ("postgres", "connect"))
    run = f"bl{uuid.uuid4().hex[:8]}"
    work = args.work_dir / run
    work.mkdir(parents=True, exist_ok=True)
    (work / "mapping.yaml").write_text(CHANGE_MAPPING)
    async with CapturedDatabase(
        local.postgres_dsn,
        local.connect_url,
        run,
        extra={"key.converter.schemas.enable": "false", "value.converter.schemas.enable": "false"},
    ) as db:
        db.execute(
            "CREATE TABLE accounts (id int PRIMARY KEY, tenant text, plan text, owner text);"
            "ALTER TABLE accounts REPLICA IDENTITY FULL;"
            "INSERT INTO accounts VALUES (0, 't0', 'Starter', 'Alice')"
        )
        await db.capture(["public.accounts"])
        topic = db.topic("accounts")
        from tidegraph.topics.admin import ensure_topics

        await ensure_topics(args.bootstrap, [topic], partitions=1, replication_factor=1)
        (work / "sources.yaml").write_text(
            f"sources:\n  - {{name: crm, topics: [{topic}], envelope: debezium,"
            f" group: '{run}-{{row.tenant}}'}}\n"
        )
        port = free_port()
        env = _worker_env(args, run, work, port, sources=True)
        worker = start_worker(env, work / "worker.log")
        store = open_store(_client_settings(args, run, work))
        groups = [f"{run}-t{g}" for g in range(args.groups)]
        try:
            await wait_assigned([port], "episodes", args.partitions, timeout=120)
            # the snapshot's row through first: the path is warm before the paced rows
            await _until_written(store, groups, 1, worker, args.timeout)
            started = time.monotonic()
            for i in range(1, args.latency_rows + 1):
                tenant, plan = i % args.groups, PLANS[i % len(PLANS)]
                db.execute(
                    "INSERT INTO accounts VALUES (%s, %s, %s, 'Alice')", (i, f"t{tenant}", plan)
                )
                await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
            latencies = await _latencies(store, groups, args.latency_rows + 1, args.timeout)
        finally:
            stop_worker(worker)
            for group in groups:
                await store.forget.delete_group(group)
            await store.close()
    return {
        "rows": args.latency_rows,
        "rate": round(rate, 1),
        "latency_s": {
            "p50": round(percentile(latencies, 0.5), 3),
            "p99": round(percentile(latencies, 0.99), 3),
            "max": round(max(latencies), 3),
        },
    }


async def _latencies(store: Any, groups: list[str], rows: int, timeout: float) -> list[float]:
    """Each episode's reference time (the commit) to its created_at, once all are written."""
    far = datetime.now(UTC) + timedelta(days=36500)
    deadline = time.monotonic() + timeout
    while True:
        episodes = [e for g in groups for e in await store.recent_episodes(g, far, 10 * rows)]
        if len(episodes) >= rows - 1 or time.monotonic() > deadline:  # the snapshot row too
            break
        await asyncio.sleep(0.5)
    return [
        (e.created_at - e.valid_at).total_seconds()
        for e in episodes
        if e.created_at is not None and e.valid_at is not None
    ]


# ----------------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=3000, help="changes per variant")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3, help="rounds; the median is reported")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--latency", action="store_true", help="also PostgreSQL -> graph")
    parser.add_argument("--latency-rows", type=int, default=300)
    parser.add_argument("--rate", type=float, default=None, help="latency: rows/s committed")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--neo4j-uri", default="bolt://127.0.0.1:17687")
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--work-dir", type=Path, default=REPO / ".tidegraph" / "bench")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args(argv)
    args.variants = [v for v in VARIANTS if v in args.variants.split(",")]
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.local_services import LocalServices

    registry_url = None
    if "debezium-avro" in args.variants:
        local = LocalServices()
        await asyncio.to_thread(local.up, ("registry",))
        registry_url = local.registry_url
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    warm_up: dict[str, dict[str, Any]] = {}
    for variant in args.variants:  # a warm-up round of each, not counted
        warm_up[variant] = await run_variant(args, variant, registry_url)
    for round_ in range(args.runs):  # interleaved, rotated: A B C, B C A, C A B, ...
        shift = round_ % len(args.variants)
        for variant in args.variants[shift:] + args.variants[:shift]:
            results[variant].append(await run_variant(args, variant, registry_url))
    medians = {v: _median(runs) for v, runs in results.items()}
    document: dict[str, Any] = {
        "command": "python -m benchmarks.sources " + " ".join(args.argv),
        "cpus": os.cpu_count(),
        "variants": medians,
        "runs": results,
        "warm_up": warm_up,
    }
    if "envelope" in medians:
        base = medians["envelope"]["changes_per_s"]
        for v in medians:
            medians[v]["fraction_of_envelope"] = round(medians[v]["changes_per_s"] / base, 3)
    if {"debezium-json", "debezium-avro"} <= set(medians):
        # the medians of the rounds' CPU per change (the CPU is steadier than the rate)
        json_cpu = medians["debezium-json"]["worker_cpu_ms_per_change_median"]
        document["avro_cpu_overhead"] = round(
            medians["debezium-avro"]["worker_cpu_ms_per_change_median"] / json_cpu - 1, 3
        )
    if args.latency:
        measured = medians.get("debezium-json", {}).get("changes_per_s")
        rate = args.rate or (measured / 2 if measured else 20.0)
        document["latency"] = await run_latency(args, rate)
    return document


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: r["changes_per_s"])
    middle = dict(ordered[len(ordered) // 2])
    rates = [r["changes_per_s"] for r in runs]
    middle["changes_per_s_all"] = rates
    middle["spread"] = round(max(rates) / min(rates), 2)
    middle["worker_cpu_ms_per_change_median"] = statistics.median(
        r["worker_cpu_ms_per_change"] for r in runs
    )
    return middle


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("neo4j.notifications").setLevel(logging.ERROR)  # unknown-property notes
    args = parse(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    document = asyncio.run(run(args))
    text = orjson.dumps(document, option=orjson.OPT_INDENT_2).decode()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


def _worker_env(
    args: argparse.Namespace, run: str, work: Path, port: int, *, sources: bool
) -> dict[str, str]:
    """The environment of the benchmark's worker (``sources``: reading sources.yaml too)."""
    extra = {"TIDEGRAPH_SOURCES": str(work / "sources.yaml")} if sources else {}
    return worker_env(
        {
            "TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS": args.bootstrap,
            "TIDEGRAPH_TOPIC_PREFIX": run,
            "TIDEGRAPH_PARTITIONS": str(args.partitions),
            "TIDEGRAPH_STORE": "neo4j",
            "TIDEGRAPH_NEO4J_URI": args.neo4j_uri,
            "TIDEGRAPH_EMBEDDER": "hashing",
            "TIDEGRAPH_MAPPINGS": str(work / "mapping.yaml"),
            "TIDEGRAPH_METRICS_PORT": str(port),
            "TIDEGRAPH_DATA_DIR": str(work / "data"),
            "TIDEGRAPH_COMMUNITIES_ENABLED": "false",
            "TIDEGRAPH_LOG_LEVEL": "WARNING",
        },
        **extra,
    )


def _client_settings(args: argparse.Namespace, run: str, work: Path) -> Settings:
    """This process's settings for reading the worker's graph."""
    return Settings(
        neo4j_uri=args.neo4j_uri,
        store="neo4j",
        embedder="hashing",
        topic_prefix=run,
        data_dir=work / "client",
    )


if __name__ == "__main__":
    sys.exit(main())
