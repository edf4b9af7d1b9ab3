"""Nothing lost when Neo4j restarts: the fault probe at full size (docs/performance.md "Store
outages"; the small version runs in CI as tests/integration/test_store_outage.py).

    python -m benchmarks.fault_probe --bootstrap 127.0.0.1:19092            # 3 seeds
    python -m benchmarks.fault_probe --episodes 5000 --groups 16 --kills 12 --outage-seconds 120

Per seed: a Neo4j of the probe's own (started by the project's script, so that it can be
frozen and killed), the uninterrupted in-process run of the generated CRM feed as reference,
then the same feed through ``--workers`` workers on the broker, produced at a pace. During the
run, ``--kills`` workers are SIGKILLed at random moments (each replaced at once) and one
outage of ``--outage-seconds`` hits Neo4j: SIGSTOP for the first half (its connections hang),
then SIGKILL, down for the second half, and a restart on the same port. Afterwards it counts
dead letters, facts differing from the reference (both timelines' shape), episodes written
out of their group's order, committed changes missing from ``{prefix}.changes``, and
tracebacks in the workers' logs: every one should be 0. Prints them per seed and writes JSON
to ``benchmarks/results/fault_probe-<UTC timestamp>.json`` with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from tests.integration.fault_harness import (
    WORKER_ENV,
    FaultReport,
    OwnNeo4j,
    check_run,
    reference_graph,
)
from tests.integration.topology_harness import Topology
from tests.support.crm_feed import crm_feed
from tidegraph.connections import KafkaConnection
from tidegraph.topics.admin import delete_topics

RESULTS = Path(__file__).parent / "results"


async def one_seed(args: argparse.Namespace, seed: int, work: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    neo4j = OwnNeo4j(work / "neo4j")
    await neo4j.up()
    started = time.monotonic()
    try:
        run = f"ref{uuid.uuid4().hex[:8]}"
        reference = await reference_graph(
            neo4j.uri, work, run, args.episodes, args.groups, seed=seed
        )
        topology = Topology(args.bootstrap, neo4j.uri, f"fp{uuid.uuid4().hex[:10]}", work)
        topology.extra_env.update(WORKER_ENV)
        try:
            found = await faults(args, rng, seed, topology, neo4j, reference)
        finally:
            for worker in topology.workers:
                if worker.alive():
                    worker.process.kill()
                    worker.process.wait(10)
            await delete_topics(KafkaConnection.from_settings(topology.settings()),
                                topology.names.all())  # fmt: skip
    finally:
        await neo4j.down()
    return {"seed": seed, "seconds": round(time.monotonic() - started, 1), **asdict(found)}


async def faults(
    args: argparse.Namespace,
    rng: random.Random,
    seed: int,
    topology: Topology,
    neo4j: OwnNeo4j,
    reference: dict[int, Any],
) -> FaultReport:
    workers = [topology.start_worker() for _ in range(args.workers)]
    await topology.wait_assigned(workers)
    feed = crm_feed(args.episodes, args.groups, run=topology.run, seed=seed)
    run_seconds = args.episodes / args.rate
    producing = asyncio.create_task(topology.produce(feed, rate=args.rate))
    # The moments of the faults, within the production's time: kills, and one outage.
    kills = sorted(rng.uniform(0.05, 0.9) * run_seconds for _ in range(args.kills))
    outage_at = rng.uniform(0.2, 0.6) * run_seconds
    events = [(at, "kill") for at in kills] + [(outage_at, "outage")]
    begun = time.monotonic()
    outage: asyncio.Task[None] | None = None
    for at, what in sorted(events):
        await asyncio.sleep(max(0.0, at - (time.monotonic() - begun)))  # the fault schedule
        if what == "outage":
            outage = asyncio.create_task(store_outage(neo4j, args.outage_seconds))
            continue
        alive = [w for w in topology.workers if w.alive()]
        victim = rng.choice(alive)
        victim.kill()
        topology.start_worker()
    if outage is not None:
        await outage
    return await check_run(
        topology,
        neo4j,
        reference,
        args.groups,
        report_timeout=max(600.0, 4 * run_seconds),
        episodes_report=await producing,
    )


async def store_outage(neo4j: OwnNeo4j, seconds: float) -> None:
    """Frozen for the first half, then killed, down for the second half, restarted."""
    neo4j.signal(signal.SIGSTOP)
    await asyncio.sleep(seconds / 2)  # the outage's length
    await neo4j.kill()
    await asyncio.sleep(seconds / 2)
    await neo4j.up()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=5000)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--outage-seconds", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=20.0, help="episodes/s produced")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.groups < 1 or args.episodes < args.groups or args.workers < 1:
        parser.error("need at least one worker and one episode per group")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or RESULTS / f"fault_probe-{stamp}.json"
    load_before = os.getloadavg()
    seeds = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="tidegraph-fault-") as work:
            result = asyncio.run(one_seed(args, seed, Path(work)))
        seeds.append(result)
        print(
            f"seed {seed}: processed {result['processed']}/{args.episodes}, dead letters "
            f"{result['dead_letters']}, facts differing {result['differing_facts']}, order "
            f"violations {len(result['order_problems'])}, changes missing "
            f"{result['changes_missing']}/{result['changes_committed']}, tracebacks "
            f"{result['tracebacks']} ({result['seconds']} s)",
            flush=True,
        )
    document = {
        "argv": list(sys.argv[1:] if argv is None else argv),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "seeds": seeds,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"-> {out}")
    bad = any(
        s["dead_letters"] or s["differing_facts"] or s["order_problems"] or s["changes_missing"]
        or s["processed"] != args.episodes
        for s in seeds
    )  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
