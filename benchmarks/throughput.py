"""Mapped JSON throughput and latency: one generated CRM feed through every path, against Neo4j's
own batched write rate for the same rows.

    python -m benchmarks.throughput                          # 50,000 records over 16 groups
    python -m benchmarks.throughput --records 2000 --paths raw,neo4j
    python -m benchmarks.throughput --records 10000 --paths raw,neo4j --repeat 3   # medians

The feed is ``tests.support.crm_feed`` (deterministic ``--seed``; accounts changing plan
and owner, contacts joining and leaving, tickets opening, closing and reopening; a share of
the records delivered late). Paths (``--paths``, comma-separated, in this order):

``raw``       the feed's rows as the mapping yields them (episodes, entities, facts) written
              with batched ``UNWIND ... MERGE`` straight through the neo4j driver (batches of
              ``--raw-batch``, one throwaway group, parameters only; embeddings computed
              outside the timing): rows/s and events/s, the limit the others are compared to;
``embedded``  in-process (``tidegraph.pipelines.ingest.ingest``, ``--concurrency`` groups at
once)
              into the embedded SQLite store;
``neo4j``     the same into Neo4j;
``kafka-1w``  Kafka -> Faust workers -> Neo4j with one ``tidegraph worker`` process, then
``kafka-2w``  with two: events/s with the whole feed produced at once, then p50/p99
              produce->queryable latency at a fixed offered load (``--rate``, default half
              the measured maximum) for ``--latency-seconds`` (see benchmarks.kafka_throughput).

The change stream is on in every path but raw, as deployed (``--stream on``); ``--stream off``
runs them with ``TIDEGRAPH_CHANGES_ENABLED=false`` (no outbox written, no relay), and
``--stream both`` runs each of them both ways in every round, side by side in the table (a
path's row with the stream off is named ``<path>/off``), every share against the raw run of
its own round.

Every path runs the same feed under its own group ids, is checked against the feed's truth
and deleted afterwards. The in-process paths each run in a fresh child process, so that their
peak RSS is their own; the workers' peak RSS is their ``VmHWM``. Prints a table and writes
JSON to ``benchmarks/results/throughput-<UTC timestamp>.json`` (or ``--out``).

Size: about 600 lines, one script on purpose: the five paths share the feed, the graph
check and the report, and reading them side by side is the point of the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from benchmarks.kafka_throughput import KafkaPath, peak_rss_mb, run_kafka_path, settle
from tests.support.crm_feed import CRM_MAPPING, CrmFeed, check_graph, crm_mappings, generate
from tidegraph.records.episode import Episode
from tidegraph.records.ids import normalize_name, stable_uuid
from tidegraph.records.stages import Extraction

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PATHS = ("raw", "embedded", "neo4j", "kafka-1w", "kafka-2w")
STREAM_OFF = "/off"  # the suffix of a path's name when it runs with the change stream off
DESCRIPTIONS = {
    "raw": "Neo4j raw: batched UNWIND ... MERGE",
    "embedded": "in-process -> embedded SQLite",
    "neo4j": "in-process -> Neo4j",
    "kafka-1w": "Kafka -> 1 worker -> Neo4j",
    "kafka-2w": "Kafka -> 2 workers -> Neo4j",
}


@dataclass(frozen=True)
class FeedSpec:
    records: int
    groups: int
    seed: int
    late_fraction: float

    def build(self, prefix: str, records: int | None = None) -> CrmFeed:
        return generate(
            records or self.records,
            self.groups,
            prefix=prefix,
            seed=self.seed,
            late_fraction=self.late_fraction,
        )


# ----------------------------------------------------------------------------- in-process
@dataclass(frozen=True)
class InProcessJob:
    store: str  # embedded | neo4j
    feed: FeedSpec
    prefix: str
    embedder: str
    concurrency: int
    neo4j_uri: str
    profile: Path | None = None
    keep: bool = False  # leave the groups in Neo4j
    changes: bool = True  # the change stream (the outbox written with each write)


def run_in_process(job: InProcessJob) -> dict[str, Any]:
    """Entry point of the child process of an in-process path."""
    return asyncio.run(_in_process(job))


async def _in_process(job: InProcessJob) -> dict[str, Any]:
    from tidegraph.pipelines.collector import settle_collector
    from tidegraph.pipelines.ingest import ingest
    from tidegraph.pipelines.runtime import open_runtime
    from tidegraph.settings import Settings

    feed = job.feed.build(job.prefix)
    episodes = feed.as_episodes()
    with tempfile.TemporaryDirectory(prefix="tidegraph-throughput-") as tmp:
        mapping = Path(tmp) / "mapping.yaml"
        mapping.write_text(CRM_MAPPING)
        settings = Settings(
            store=job.store,
            neo4j_uri=job.neo4j_uri,
            embedder=job.embedder,
            data_dir=Path(tmp),
            changes_enabled=job.changes,
        )
        runtime = await open_runtime(settings, mapping_path=mapping, use_llm=False)
        settle_collector()  # as `tidegraph ingest` does
        try:
            profiler = _start_profiler(job.profile)
            started, cpu_started = time.perf_counter(), time.process_time()
            report = await ingest(runtime.runner(), episodes, concurrency=job.concurrency)
            seconds = time.perf_counter() - started
            cpu_seconds = time.process_time() - cpu_started
            _stop_profiler(profiler, job.profile)
            checked = await check_graph(runtime.store, feed)
            counts = await _counts(runtime.store, feed.groups)
            logs = await runtime.store.outbox.change_logs(feed.groups)
        finally:
            if job.store == "neo4j" and not job.keep:
                for group in feed.groups:
                    await runtime.store.forget.delete_group(group)
            await runtime.close()
    return {
        "seconds": round(seconds, 3),
        "events_per_s": round(len(episodes) / seconds, 1),
        # the client's CPU (every thread of it: the embedded store's too), which a shared
        # machine's load moves far less than the rate
        "client_cpu_ms_per_record": round(1000 * cpu_seconds / len(episodes), 3),
        "failures": len(report.failures),
        "first_failure": report.failures[0].failure.message if report.failures else None,
        "facts_new": report.facts_new,
        "facts_merged": report.facts_merged,
        "facts_closed": report.facts_closed,
        "facts_born_closed": report.facts_born_closed,
        "llm_calls": report.llm_calls,
        "check": checked,
        "graph": counts,
        "changes": sum(log.seq for log in logs),  # in the outbox: none with the stream off
        # VmHWM, not rusage: a spawned child's ru_maxrss starts at its parent's peak (Linux
        # keeps it across exec), and the parent may have built the raw path's rows
        "peak_rss_mb": peak_rss_mb(),
    }


async def _counts(store: Any, groups: list[str]) -> dict[str, int]:
    totals = {"episodes": 0, "entities": 0, "facts": 0, "mentions": 0}
    for group in groups:
        got = await store.browse.counts(group)
        for key in totals:
            totals[key] += got[key]
    return totals


def _start_profiler(target: Path | None) -> Any:
    if target is None:
        return None
    from pyinstrument import Profiler  # not a dependency of tidegraph: pip install pyinstrument

    profiler = Profiler(async_mode="enabled")
    profiler.start()
    return profiler


def _stop_profiler(profiler: Any, target: Path | None) -> None:
    if profiler is not None and target is not None:
        profiler.stop()
        target.write_text(profiler.output_html())


def in_child(job: InProcessJob) -> dict[str, Any]:
    """Run an in-process path in a fresh (spawned) process: its peak RSS is its own."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_in_process, job).result()


# ----------------------------------------------------------------------------- raw Neo4j
RAW_EPISODES = """
UNWIND $rows AS row
MERGE (ep:Episodic {uuid: row.uuid})
ON CREATE SET ep.group_id = $group_id, ep.created_at = row.created_at
SET ep.name = row.name, ep.source = row.source, ep.source_description = row.description,
    ep.content = row.content, ep.valid_at = row.valid_at
"""
RAW_ENTITIES = """
UNWIND $rows AS row
MERGE (e:Entity {uuid: row.uuid})
ON CREATE SET e.group_id = $group_id, e.name = row.name, e.name_norm = row.name_norm,
              e.name_embedding = row.name_embedding, e.created_at = row.created_at
SET e.key = row.key, e.summary = row.summary, e.labels = row.labels
SET e:$(row.labels)
"""
RAW_FACTS = """
UNWIND $rows AS row
MATCH (s:Entity {uuid: row.source_uuid}), (t:Entity {uuid: row.target_uuid})
MERGE (s)-[r:RELATES_TO {uuid: row.uuid}]->(t)
ON CREATE SET r.group_id = $group_id, r.created_at = row.created_at
SET r.name = row.name, r.fact = row.fact, r.fact_embedding = row.fact_embedding,
    r.episodes = row.episodes, r.valid_at = row.valid_at, r.cardinality = row.cardinality
"""
RAW_COUNTS = """
CALL () { MATCH (n:Episodic) WHERE n.group_id = $group_id RETURN count(n) AS episodes }
CALL () { MATCH (n:Entity) WHERE n.group_id = $group_id RETURN count(n) AS entities }
CALL () { MATCH ()-[r:RELATES_TO]->() WHERE r.group_id = $group_id RETURN count(r) AS facts }
RETURN episodes, entities, facts
"""


@dataclass
class RawRows:
    """The rows the mapping yields for a feed: one per episode, per entity it names (the
    same entity again is a MERGE of the same uuid) and per fact it states."""

    episodes: list[dict[str, Any]]
    entities: list[dict[str, Any]]
    facts: list[dict[str, Any]]


def _entity_uuid(group: str, name: str, key: str | None) -> str:
    return stable_uuid("raw-entity", group, key or normalize_name(name))


def _rows_of(episode: Episode, extraction: Extraction, rows: RawRows) -> None:
    uuids = [_entity_uuid(episode.group_id, e.name, e.key) for e in extraction.entities]
    rows.episodes.append(
        {
            "uuid": episode.uuid,
            "name": episode.name,
            "source": episode.source,
            "description": episode.source_description,
            "content": episode.content_text(),
            "valid_at": episode.reference_time,
        }
    )
    for entity, entity_uuid in zip(extraction.entities, uuids, strict=True):
        rows.entities.append(
            {
                "uuid": entity_uuid,
                "name": entity.name,
                "name_norm": normalize_name(entity.name),
                "key": entity.key,
                "summary": entity.summary,
                "labels": ["Entity", *entity.labels],
            }
        )
    for n, fact in enumerate(extraction.facts):
        if fact.closes or fact.object < 0:
            continue  # a closing record adds no fact
        valid_at = datetime.fromisoformat(fact.valid_at) if fact.valid_at else None
        rows.facts.append(
            {
                "uuid": stable_uuid("raw-fact", episode.uuid, str(n)),
                "source_uuid": uuids[fact.subject],
                "target_uuid": uuids[fact.object],
                "name": fact.relation,
                "fact": fact.fact,
                "episodes": [episode.uuid],
                "valid_at": valid_at or episode.reference_time,
                "cardinality": fact.cardinality,
            }
        )


def raw_rows(feed: CrmFeed) -> RawRows:
    mappings = crm_mappings()
    rows = RawRows([], [], [])
    for episode in feed.as_episodes():
        extraction = mappings.extract(episode)
        assert extraction is not None, f"no mapping rule for {episode.content}"
        _rows_of(episode, extraction, rows)
    return rows


def _batches(rows: list[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


async def _embed_batch(embedder: Any, batch: list[dict[str, Any]], text: str, to: str) -> None:
    texts = sorted({row[text] for row in batch})
    vectors = dict(zip(texts, await embedder.embed(texts), strict=True))
    for row in batch:
        row[to] = vectors[row[text]]


async def raw_baseline(feed: CrmFeed, uri: str, embedder_name: str, size: int) -> dict[str, Any]:
    """Write the feed's rows through the driver; only the write calls are timed."""
    from neo4j import AsyncGraphDatabase, basic_auth

    from tidegraph.embed import make_embedder
    from tidegraph.settings import Settings
    from tidegraph.stores import open_store

    settings = Settings(store="neo4j", neo4j_uri=uri, embedder=embedder_name)
    embedder = make_embedder(settings)
    store = open_store(settings)
    await store.setup(embedder.dim)  # the same schema (constraints, indexes) as tidegraph's
    group = f"{feed.groups[0].rsplit('-tenant-', 1)[0]}-raw"
    rows = raw_rows(feed)
    auth = basic_auth(settings.neo4j_user, settings.neo4j_password.get_secret_value())
    driver = AsyncGraphDatabase.driver(uri, auth=auth)
    by_kind = {"episodes": 0.0, "entities": 0.0, "facts": 0.0}
    batches = 0
    try:
        steps = ((RAW_EPISODES, "episodes"), (RAW_ENTITIES, "entities"), (RAW_FACTS, "facts"))
        for query, kind in steps:
            for batch in _batches(getattr(rows, kind), size):
                if kind == "entities":
                    await _embed_batch(embedder, batch, "name", "name_embedding")
                elif kind == "facts":
                    await _embed_batch(embedder, batch, "fact", "fact_embedding")
                now = datetime.now(UTC)
                batch = [row | {"created_at": now} for row in batch]
                started = time.perf_counter()
                await driver.execute_query(
                    query, {"rows": batch, "group_id": group}, database_=settings.neo4j_database
                )
                by_kind[kind] += time.perf_counter() - started
                batches += 1
        found = await driver.execute_query(RAW_COUNTS, {"group_id": group})
        written = dict(found.records[0])
    finally:
        await driver.close()
        await store.forget.delete_group(group)
        await store.close()
        await embedder.close()
    total = len(rows.episodes) + len(rows.entities) + len(rows.facts)
    timed = sum(by_kind.values())
    return {
        "seconds": round(timed, 3),
        "seconds_by_kind": {k: round(v, 3) for k, v in by_kind.items()},
        "events_per_s": round(len(rows.episodes) / timed, 1),
        "rows_per_s": round(total / timed, 1),
        "rows": {
            "episodes": len(rows.episodes),
            "entities": len(rows.entities),
            "facts": len(rows.facts),
        },
        "batch_size": size,
        "batches": batches,
        "graph": written,
        # Every episode and fact row is its own node/relationship; entity rows MERGE.
        "written_ok": written["episodes"] == len(rows.episodes)
        and written["facts"] == len(rows.facts)
        and written["entities"] == len({row["uuid"] for row in rows.entities}),
    }


# ----------------------------------------------------------------------------- the run
def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        pages = 0
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(pages / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


async def neo4j_version(uri: str) -> str | None:
    from neo4j import AsyncGraphDatabase

    try:  # one try, no retries: informational only
        async with AsyncGraphDatabase.driver(
            uri, auth=None, max_transaction_retry_time=0, connection_timeout=5
        ) as driver:
            found = await driver.execute_query(
                "CALL dbms.components() YIELD versions RETURN versions[0] AS v"
            )
            return str(found.records[0]["v"])
    except Exception:  # noqa: BLE001 - informational only
        return None


def described(name: str) -> str:
    """A run's row name in the table: its path's description, and whether the stream is off."""
    path, off = _stream_of(name)
    return DESCRIPTIONS[path] + (", change stream off" if off else "")


def _stream_of(name: str) -> tuple[str, bool]:
    """A run's path and whether it runs with the change stream off (``<path>/off``)."""
    if name.endswith(STREAM_OFF):
        return name[: -len(STREAM_OFF)], True
    return name, False


def runs_of(paths: list[str], stream: str) -> list[str]:
    """The runs of one round, in order: each path with the stream on, off, or both (raw has
    no stream: it runs once)."""
    runs: list[str] = []
    for path in paths:
        if path == "raw" or stream == "on":
            runs.append(path)
        elif stream == "off":
            runs.append(path + STREAM_OFF)
        else:
            runs += [path, path + STREAM_OFF]
    return runs


def run_path(run: str, args: argparse.Namespace, spec: FeedSpec, run_id: str) -> dict[str, Any]:
    name, off = _stream_of(run)
    prefix = f"{run_id}-{name}{'-off' if off else ''}"
    if name == "raw":
        return asyncio.run(
            raw_baseline(spec.build(prefix), args.neo4j_uri, args.embedder, args.raw_batch)
        )
    if name in ("embedded", "neo4j"):
        profile = None
        if args.profile:
            profile = args.out.with_name(f"{args.out.stem}-{prefix}.profile.html")
        job = InProcessJob(
            name,
            spec,
            prefix,
            args.embedder,
            args.concurrency,
            args.neo4j_uri,
            profile,
            changes=not off,
        )
        return in_child(job)
    path = KafkaPath(
        workers=int(name[len("kafka-")]),
        bootstrap=args.bootstrap,
        neo4j_uri=args.neo4j_uri,
        embedder=args.embedder,
        partitions=args.partitions,
        batch_size=args.batch_size,
        rate=args.rate,
        latency_seconds=args.latency_seconds,
        work=(args.work_dir or REPO / ".tidegraph" / "bench") / run_id,
        communities=not args.no_communities,
        changes=not off,
        worker_settings=args.worker_settings,
    )

    def make(records: int, group_prefix: str) -> CrmFeed:
        return spec.build(group_prefix + ("-off" if off else ""), records)

    result = asyncio.run(run_kafka_path(path, make, spec.records, spec.groups))
    maximum, paced = result["maximum"], result["paced"]
    rss = [r for r in result["workers_peak_rss_mb"] if r is not None]
    return result | {
        "dead_lettered": maximum["dead_lettered"] + paced["dead_lettered"],
        "seconds": maximum["seconds"],
        "events_per_s": maximum["events_per_s"],
        "peak_rss_mb": max(rss) if rss else None,
        "latency_s": paced["latency_s"],
        "offered_rate": paced["offered_rate"],
        "check": _merged_check(maximum["check"], paced["check"]),
    }


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A path's result over its runs: the run of the median rate, with every run's rate and
    share of raw (each against the raw run of its own round) and the median share."""
    ordered = sorted(runs, key=lambda r: r["events_per_s"])
    median = dict(ordered[(len(ordered) - 1) // 2])
    if len(runs) > 1:
        median["runs_events_per_s"] = [r["events_per_s"] for r in runs]
        shares = [r["fraction_of_raw"] for r in runs if r.get("fraction_of_raw") is not None]
        median["runs_fraction_of_raw"] = shares
        if any(r.get("client_cpu_ms_per_record") for r in runs):
            median["runs_client_cpu_ms_per_record"] = [
                r.get("client_cpu_ms_per_record") for r in runs
            ]
        if any(r.get("latency_s") for r in runs):
            median["runs_latency_p99_s"] = [(r.get("latency_s") or {}).get("p99") for r in runs]
        median["fraction_of_raw"] = statistics.median(shares) if shares else None
    return median


def _merged_check(*checks: dict[str, Any]) -> dict[str, Any]:
    return {
        "subjects_checked": sum(c["subjects_checked"] for c in checks),
        "subjects_wrong": sum(c["subjects_wrong"] for c in checks),
        "wrong": [w for c in checks for w in c["wrong"]][:10],
    }


def run(args: argparse.Namespace, paths: list[str]) -> dict[str, Any]:
    spec = FeedSpec(args.records, args.groups, args.seed, args.late_fraction)
    run_id = f"tp{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    rounds: list[dict[str, dict[str, Any]]] = []
    runs = runs_of(paths, args.stream)
    for round_no in range(args.repeat):
        # Alternate the order, so that no path always runs on a server the previous one
        # just loaded (Neo4j checkpoints, log rotation).
        done: dict[str, dict[str, Any]] = {}
        for name in runs if round_no % 2 == 0 else runs[::-1]:
            print(f"{name}: {described(name)} ...", flush=True)
            began = time.perf_counter()
            if _stream_of(name)[0] != "embedded":
                print(f"{name}: waited {settle()} s for Neo4j to be idle", flush=True)
            done[name] = run_path(name, args, spec, f"{run_id}r{round_no}")
            done[name]["wall_seconds"] = round(time.perf_counter() - began, 1)
            print(f"{name}: {done[name]['events_per_s']} events/s", flush=True)
        raw = done.get("raw", {}).get("events_per_s")
        for result in done.values():
            rate = result.get("events_per_s")
            result["fraction_of_raw"] = round(rate / raw, 4) if raw and rate else None
        rounds.append(done)
    results = {name: _median_run([r[name] for r in rounds]) for name in runs}
    return {
        "benchmark": "throughput",
        "when": datetime.now(UTC).isoformat(),
        "command": "python -m benchmarks.throughput " + " ".join(args.argv),
        "machine": machine()
        | {
            "neo4j": (
                asyncio.run(neo4j_version(args.neo4j_uri)) if set(paths) - {"embedded"} else None
            ),
            "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        },
        "feed": {
            "records": args.records,
            "groups": args.groups,
            "seed": args.seed,
            "late_fraction": args.late_fraction,
            "embedder": args.embedder,
            "concurrency": args.concurrency,
            "stream": args.stream,
            "worker_settings": args.worker_settings,
        },
        "paths": results,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


# ----------------------------------------------------------------------------- output
def _cell(value: Any, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


def table(document: dict[str, Any]) -> str:
    head = ("path", "events/s", "x raw", "seconds", "peak RSS MiB", "p50/p99 @ load", "check")
    rows = [head]
    for name, r in document["paths"].items():
        latency = r.get("latency_s")
        if latency:
            latency = f"{latency['p50']:.2f}/{latency['p99']:.2f} s @ {r['offered_rate']:g}/s"
        check = r.get("check")
        verdict = "-" if check is None else f"{check['subjects_wrong']} wrong"
        if name == "raw":
            verdict = f"{r['rows_per_s']:.0f} rows/s"
        spread = r.get("runs_events_per_s")
        rate = _cell(r["events_per_s"], "{:.1f}")
        share = _cell(r["fraction_of_raw"], "{:.3f}")
        if spread:  # the median of the runs, and their range
            rate += f" ({min(spread):.0f}-{max(spread):.0f})"
            shares = r.get("runs_fraction_of_raw") or []
            if shares and name != "raw":
                share += f" ({min(shares):.2f}-{max(shares):.2f})"
        rows.append(
            (
                described(name),
                rate,
                share,
                _cell(r["seconds"], "{:.1f}"),
                _cell(r.get("peak_rss_mb"), "{:.0f}"),
                _cell(latency),
                verdict,
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join(lines)


def cpu_line(cpu: dict[str, Any]) -> str:
    """Where the CPU went in a phase of a Kafka path (``kafka_throughput.CpuWindow``)."""
    used = ", ".join(f"{name} {ms:.2f}" for name, ms in cpu["cpu_ms_per_record"].items())
    idle = cpu["idle_share"]
    return f"CPU ms per record: {used}; idle {_cell(idle, '{:.0%}')} of {cpu['cores']} cores"


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of every path, the order alternating; the median run is reported",
    )
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument(
        "--paths", default=",".join(PATHS), help="comma-separated: " + ",".join(PATHS)
    )
    parser.add_argument("--embedder", choices=("hashing", "minilm"), default="hashing")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--late-fraction", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=16, help="in-process: groups at once")
    parser.add_argument("--raw-batch", type=int, default=1000, help="rows per UNWIND batch")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256, help="workers' micro-batch size")
    parser.add_argument(
        "--rate", type=float, default=None, help="paced offered load, episodes/s (default: max/2)"
    )
    parser.add_argument(
        "--latency-seconds", type=float, default=60.0, help="length of the paced phase"
    )
    parser.add_argument(
        "--stream",
        choices=("on", "off", "both"),
        default="on",
        help="the change stream in the paths but raw: on (as deployed), off, or both ways in "
        "every round, side by side",
    )
    parser.add_argument("--neo4j-uri", default="bolt://127.0.0.1:17687")
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="worker logs (default .tidegraph/bench)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="pyinstrument HTML profile of in-process paths"
    )
    parser.add_argument(
        "--no-communities",
        action="store_true",
        help="Kafka paths: workers without the community processor (it runs by default)",
    )
    parser.add_argument(
        "--worker-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="Kafka paths: a worker setting, as TIDEGRAPH_NAME (docs/configuration.md), e.g. "
        "FETCH_MIN_BYTES=16384; repeatable",
    )
    args = parser.parse_args(argv)
    settings = [s.partition("=") for s in args.worker_setting]
    if any(not name or not eq for name, eq, _ in settings):
        parser.error("--worker-setting: NAME=VALUE, e.g. FETCH_MIN_BYTES=16384")
    args.worker_settings = {
        f"TIDEGRAPH_{name.upper().removeprefix('TIDEGRAPH_')}": value for name, _, value in settings
    }
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown or not paths:
        parser.error(f"--paths: unknown {unknown}; choose from {','.join(PATHS)}")
    if args.groups < 1 or args.records < args.groups:
        parser.error("need at least one record per group")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.out = args.out or RESULTS / f"throughput-{stamp}.json"
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args, [p for p in PATHS if p in paths]


def main(argv: list[str] | None = None) -> int:
    args, paths = parse(argv)
    document = run(args, paths)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
    print()
    print(table(document))
    for name, r in document["paths"].items():
        for phase in ("maximum", "paced"):
            if (r.get(phase) or {}).get("cpu"):
                print(f"{name}, {phase} phase: {cpu_line(r[phase]['cpu'])}")
    print(f"\n{args.records} records over {args.groups} groups -> {args.out}")
    bad = [
        name
        for name, r in document["paths"].items()
        if r.get("failures")
        or r.get("dead_lettered")
        or r.get("written_ok") is False
        or (r.get("check") or {}).get("subjects_wrong")
    ]
    if bad:
        print(f"graph check FAILED for: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
