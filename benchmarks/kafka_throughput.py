"""Throughput of the streaming topology: a mapped CRM feed through Kafka into Neo4j.

    python -m benchmarks.kafka_throughput --episodes 2000 --workers 1
    python -m benchmarks.kafka_throughput --episodes 2000 --workers 2
    python -m benchmarks.kafka_throughput --episodes 1000 --workers 1 --rate 5

Generates a CRM feed (accounts changing plan and owner, tickets changing status, over
``--groups`` tenants; declared mappings, so no LLM), starts ``--workers`` worker processes
(``tidegraph worker``) on fresh topics, waits until every worker owns its partitions, produces
the feed (all at once, or ``--rate`` episodes/s), and waits until every episode's processed
marker is in Neo4j. Prints events/s (first produce to last write) and the p50/p99
produce->written latency, exactly per episode (its record's Kafka timestamp to its Episodic
node's created_at); the JSON in benchmarks/results/ also has the quantiles of the workers'
``tidegraph_end_to_end_latency_seconds`` histograms. With everything produced at once the
latency is mostly queueing; ``--rate`` below the throughput measures the pipeline itself.
The feed and mapping are also the integration tests' (tests/integration/test_topology.py).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

CRM_MAPPING = """\
mappings:
  - name: plan_changed
    match: {type: account.plan_changed}
    entities:
      account: {name: "{account.name}", label: Account, key: "crm:account:{account.id}"}
      plan: {name: "{plan}", label: Plan}
    facts:
      - relation: HAS_PLAN
        subject: account
        object: plan
        fact: "{account.name} is on the {plan} plan"
        valid_at: changed_at
        cardinality: one
  - name: owner_changed
    match: {type: account.owner_changed}
    entities:
      account: {name: "{account.name}", label: Account, key: "crm:account:{account.id}"}
      owner: {name: "{owner.name}", label: Person, key: "crm:user:{owner.id}"}
    facts:
      - relation: OWNED_BY
        subject: account
        object: owner
        fact: "{account.name} is owned by {owner.name}"
        valid_at: changed_at
        cardinality: one
  - name: ticket_status_changed
    match: {type: ticket.status_changed}
    entities:
      ticket: {name: "{ticket.title}", label: Ticket, key: "crm:ticket:{ticket.id}"}
      status: {name: "{status}", label: TicketStatus}
      account: {name: "{account.name}", label: Account, key: "crm:account:{account.id}"}
    facts:
      - relation: HAS_STATUS
        subject: ticket
        object: status
        fact: "Ticket {ticket.id} ({ticket.title}) is {status}"
        valid_at: changed_at
        cardinality: one
      - relation: RAISED_BY
        subject: ticket
        object: account
        fact: "Ticket {ticket.id} was raised by {account.name}"
        cardinality: many
  - name: company_note
    match: {type: company.note}
    entities:
      company: {name: "{company}", label: Organization}
      topic: {name: "{topic}", label: Topic}
    facts:
      - relation: DISCUSSED
        subject: company
        object: topic
        fact: "{company} discussed {topic}"
        cardinality: many
"""

PLANS = ["Free", "Starter", "Pro", "Business", "Enterprise"]
STATUSES = ["open", "pending", "in_progress", "solved", "closed"]
OWNERS = ["Dana Reyes", "Lee Okafor", "Sam Novak", "Ivy Chen", "Ravi Patel", "Noor Haddad"]
TITLES = ["Printer jams", "Invoice overdue", "SSO login fails", "Export is slow", "API 500s"]


def crm_feed(
    episodes: int,
    groups: int,
    *,
    run: str = "bench",
    seed: int = 7,
    start: datetime = datetime(2025, 1, 6, 9, 0, tzinfo=UTC),
) -> list[dict[str, Any]]:
    """``episodes`` CRM json episodes over ``groups`` tenants, interleaved as a live feed
    would be; each tenant's reference times increase in feed order."""
    rng = random.Random(seed)
    clocks = [start] * groups
    counters = [0] * groups
    accounts = [[(f"A{g}-{a}", f"Account {g}-{a}") for a in range(4)] for g in range(groups)]
    tickets: list[dict[str, tuple[str, str, int]]] = [{} for _ in range(groups)]
    feed = []
    for i in range(episodes):
        g = rng.randrange(groups) if i >= groups else i
        counters[g] += 1
        clocks[g] += timedelta(minutes=rng.randint(5, 240))
        when = clocks[g].isoformat().replace("+00:00", "Z")
        account_id, account_name = rng.choice(accounts[g])
        account = {"id": account_id, "name": account_name}
        kind = rng.random()
        if kind < 0.35:
            content = {"type": "account.plan_changed", "account": account,
                       "plan": rng.choice(PLANS), "changed_at": when}  # fmt: skip
        elif kind < 0.55:
            owner = rng.randrange(len(OWNERS))
            content = {"type": "account.owner_changed", "account": account,
                       "owner": {"id": f"U{owner}", "name": OWNERS[owner]},
                       "changed_at": when}  # fmt: skip
        else:
            open_tickets = tickets[g]
            if open_tickets and rng.random() < 0.7:
                ticket_id = rng.choice(sorted(open_tickets))
            else:
                ticket_id = f"T{g}-{len(open_tickets)}"
                open_tickets[ticket_id] = (account_id, account_name, rng.randrange(len(TITLES)))
            owner_id, owner_name, title = open_tickets[ticket_id]
            content = {"type": "ticket.status_changed",
                       "ticket": {"id": ticket_id, "title": TITLES[title]},
                       "account": {"id": owner_id, "name": owner_name},
                       "status": rng.choice(STATUSES), "changed_at": when}  # fmt: skip
        group_id = f"{run}-tenant-{g:02d}"
        feed.append(
            {
                "id": f"crm:{group_id}:{counters[g]:05d}",
                "group_id": group_id,
                "source": "json",
                "name": content["type"],
                "source_description": "CRM webhook",
                "content": content,
                "reference_time": when,
            }
        )
    return feed


def to_jsonl(episodes: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(e) + b"\n" for e in episodes)


# ----------------------------------------------------------------------------- workers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_env(base: dict[str, str], **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGRAPH_")}
    env.update(base)
    env.update(overrides)
    return env


def start_worker(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child process
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("tidegraph")), "worker"],
        cwd=REPO,
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_worker(process: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return int(process.returncode)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Samples of metric ``name`` (exact sample name) in Prometheus text format."""
    samples = []
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head == name:
            labels: dict[str, str] = {}
        elif head.startswith(name + "{"):
            labels = dict(
                (part.split("=", 1)[0], part.split("=", 1)[1].strip('"'))
                for part in head[len(name) + 1 : -1].split(",")
                if part
            )
        else:
            continue
        samples.append((labels, float(value)))
    return samples


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(
        value
        for got, value in metric_samples(text, name)
        if all(got.get(k) == v for k, v in labels.items())
    )


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """PromQL-style quantile from cumulative bucket counts {upper bound: count}."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total == 0:
        return float("nan")
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


def merged_buckets(texts: list[str], name: str) -> dict[float, float]:
    buckets: dict[float, float] = {}
    for text in texts:
        for labels, value in metric_samples(text, name + "_bucket"):
            le = float(labels["le"].replace("+Inf", "inf"))
            buckets[le] = buckets.get(le, 0.0) + value
    return buckets


# ----------------------------------------------------------------------------- the run
async def _wait_assigned(ports: list[int], topic: str, partitions: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            owned = [
                metric_value(scrape(p), "tidegraph_assigned_partitions", topic=topic) for p in ports
            ]
        except OSError:
            owned = []
        if len(owned) == len(ports) and sum(owned) == partitions and all(owned):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers did not get all partitions within {timeout}s: {owned}")
        await asyncio.sleep(0.5)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def run(args: argparse.Namespace, run_id: str, work: Path) -> dict[str, Any]:
    from pipelines.client import produce_lines, wait_until_reflected
    from tidegraph.settings import Settings
    from tidegraph.store import open_store
    from topics.admin import delete_topics
    from topics.names import TopicNames

    mapping = work / "crm_mapping.yaml"
    feed = crm_feed(args.episodes, args.groups, run=run_id)
    groups = sorted({e["group_id"] for e in feed})
    base = {
        "TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS": args.bootstrap,
        "TIDEGRAPH_TOPIC_PREFIX": run_id,
        "TIDEGRAPH_PARTITIONS": str(args.partitions),
        "TIDEGRAPH_STORE": "neo4j",
        "TIDEGRAPH_NEO4J_URI": args.neo4j,
        "TIDEGRAPH_EMBEDDER": args.embedder,
        "TIDEGRAPH_MAPPINGS": str(mapping),
        "TIDEGRAPH_DATA_DIR": str(work / "data"),
        "TIDEGRAPH_BATCH_SIZE": str(args.batch_size),
        "TIDEGRAPH_LOG_LEVEL": "WARNING",
    }
    settings = Settings(
        kafka_bootstrap_servers=args.bootstrap,
        topic_prefix=run_id,
        partitions=args.partitions,
        store="neo4j",
        neo4j_uri=args.neo4j,
        embedder=args.embedder,
        data_dir=work / "data",
    )
    ports = [free_port() for _ in range(args.workers)]
    workers = [
        start_worker(worker_env(base, TIDEGRAPH_METRICS_PORT=str(port)), work / f"worker{i}.log")
        for i, port in enumerate(ports)
    ]
    try:
        # The workers create the topics; producing starts once every worker owns partitions.
        await _wait_assigned(ports, "episodes", args.partitions, timeout=180)
        report = await produce_lines(settings, [orjson.dumps(e) for e in feed], rate=args.rate)
        result = await wait_until_reflected(settings, report, poll_seconds=0.2, stall_seconds=120)
        texts = [scrape(p) for p in ports]
    finally:
        codes = [stop_worker(w) for w in workers]
    store = open_store(settings)
    try:
        written: dict[str, datetime] = {}
        counts = []
        for group in groups:
            counts.append(await store.counts(group))
            far = datetime.now(UTC) + timedelta(days=36500)
            for episode in await store.recent_episodes(group, far, 10 * args.episodes):
                assert episode.created_at is not None
                written[episode.uuid] = episode.created_at
            await store.delete_group(group)
    finally:
        await store.close()
    await delete_topics(args.bootstrap, TopicNames(run_id).all())
    # Exact produce->written latency per episode: the record's Kafka timestamp to the
    # writer's created_at of its Episodic node (set just before the write transaction).
    latencies = [
        written[p.episode_uuid].timestamp() - p.timestamp_ms / 1000
        for p in report.sent
        if p.episode_uuid in written and p.timestamp_ms is not None
    ]
    first = min(p.timestamp_ms for p in report.sent if p.timestamp_ms is not None) / 1000
    elapsed = max(t.timestamp() for t in written.values()) - first
    buckets = merged_buckets(texts, "tidegraph_end_to_end_latency_seconds")
    return {
        "benchmark": "kafka_throughput",
        "when": datetime.now(UTC).isoformat(),
        "command": "python -m benchmarks.kafka_throughput " + " ".join(sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "episodes": args.episodes,
        "groups": args.groups,
        "workers": args.workers,
        "partitions": args.partitions,
        "batch_size": args.batch_size,
        "embedder": args.embedder,
        "produce_rate": args.rate,
        "produce_seconds": round(report.seconds, 3),
        "first_produce_to_last_write_seconds": round(elapsed, 3),
        "events_per_second": round(len(written) / elapsed, 1),
        "processed": result.processed,
        "dead_lettered": len(result.dead),
        "latency_seconds": {
            "p50": round(percentile(latencies, 0.50), 3),
            "p99": round(percentile(latencies, 0.99), 3),
            "max": round(max(latencies), 3),
            "episodes": len(latencies),
        },
        "latency_seconds_from_worker_histogram": {
            "p50": round(histogram_quantile(0.50, buckets), 3),
            "p99": round(histogram_quantile(0.99, buckets), 3),
        },
        "graph": {
            "episodes": sum(c["episodes"] for c in counts),
            "entities": sum(c["entities"] for c in counts),
            "facts": sum(c["facts"] for c in counts),
        },
        "worker_exit_codes": codes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=5000)
    parser.add_argument("--workers", type=int, choices=(1, 2), default=1)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--rate", type=float, default=None, help="produce at most this many episodes/s "
        "(default: all at once, which measures throughput; latency then includes queueing)"
    )  # fmt: skip
    parser.add_argument("--embedder", default="minilm", choices=("minilm", "hashing"))
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--neo4j", default="bolt://127.0.0.1:17687")
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args()
    if args.groups < 16:
        parser.error("--groups must be at least 16")
    run_id = f"bench{uuid.uuid4().hex[:8]}"
    work = Path(args.work_dir or (REPO / ".tidegraph" / "bench" / run_id))
    work.mkdir(parents=True, exist_ok=True)
    (work / "crm_mapping.yaml").write_text(CRM_MAPPING)
    result = asyncio.run(run(args, run_id, work))
    RESULTS.mkdir(parents=True, exist_ok=True)
    paced = f"_rate{args.rate:g}" if args.rate else ""
    out = RESULTS / f"kafka_throughput_{args.workers}w{paced}.json"
    out.write_text(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    lat = result["latency_seconds"]
    print(
        f"{result['episodes']} episodes, {args.workers} worker(s), {args.partitions} partitions: "
        f"{result['events_per_second']} events/s "
        f"({result['first_produce_to_last_write_seconds']}s first produce to last write); "
        f"end-to-end latency p50 {lat['p50']}s p99 {lat['p99']}s; "
        f"{result['dead_lettered']} dead-lettered -> {out.relative_to(REPO)}"
    )


if __name__ == "__main__":
    main()
