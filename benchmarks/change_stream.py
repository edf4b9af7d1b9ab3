"""What the change stream costs and how late it is (docs/performance.md "Change stream").

    python -m benchmarks.change_stream                       # 10,000 records, 1 worker, x1
    python -m benchmarks.change_stream --records 10000 --repeat 3

The same generated CRM feed (``tests.support.crm_feed``) goes through the Kafka path
(``benchmarks.kafka_throughput``: Kafka -> one ``tidegraph worker`` -> Neo4j) twice per round,
once with the change stream on (the outbox written in each write's transaction, the relay
publishing it to ``{prefix}.changes``) and once with ``TIDEGRAPH_CHANGES_ENABLED=false``; the
order alternates between rounds. Each run has the Kafka path's two phases: the whole feed at
once (the maximum events/s), then a paced phase at half that maximum, during which a
subscriber follows ``{prefix}.changes`` from another process's point of view (its own
consumer) and records when each change first arrived:

- commit -> consumer: the change's ``committed_at`` (the write's ingestion time) to its arrival;
- produce -> consumer: the Kafka timestamp of the episode that caused it to its arrival.

Prints the medians over rounds and writes JSON to ``benchmarks/results/change_stream-<UTC
timestamp>.json``. The machine's load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from benchmarks.kafka_throughput import KafkaPath, run_kafka_path
from tests.support.crm_feed import CrmFeed, generate

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"


def one_run(args: argparse.Namespace, changes: bool, run_id: str) -> dict[str, Any]:
    path = KafkaPath(
        workers=1,
        bootstrap=args.bootstrap,
        neo4j_uri=args.neo4j_uri,
        embedder="hashing",
        partitions=args.partitions,
        batch_size=args.batch_size,
        rate=args.rate,
        latency_seconds=args.latency_seconds,
        work=REPO / ".tidegraph" / "bench" / run_id,
        changes=changes,
    )

    def make(records: int, prefix: str) -> CrmFeed:
        return generate(records, args.groups, prefix=prefix, seed=args.seed)

    result = asyncio.run(run_kafka_path(path, make, args.records, args.groups))
    paced = result["paced"]
    return {
        "changes": changes,
        "events_per_s": result["maximum"]["events_per_s"],
        "dead_lettered": result["maximum"]["dead_lettered"] + paced["dead_lettered"],
        "offered_rate": paced["offered_rate"],
        "episode_latency_s": paced["latency_s"],
        "stream": paced["changes"],
        "workers_peak_rss_mb": result["workers_peak_rss_mb"],
    }


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    on = [r for r in runs if r["changes"]]
    off = [r for r in runs if not r["changes"]]
    rate_on = median([r["events_per_s"] for r in on])
    rate_off = median([r["events_per_s"] for r in off])
    streams = [r["stream"] for r in on if r["stream"]]

    def lag(key: str, q: str) -> float | None:
        return median([s[key][q] for s in streams if s.get(key)])

    return {
        "events_per_s_with_changes": rate_on,
        "events_per_s_without_changes": rate_off,
        "throughput_cost": (
            round(1 - rate_on / rate_off, 3) if rate_on is not None and rate_off else None
        ),
        "commit_to_consumer_s": {"p50": lag("commit_to_consumer_s", "p50"),
                                 "p99": lag("commit_to_consumer_s", "p99")},
        "produce_to_consumer_s": {"p50": lag("produce_to_consumer_s", "p50"),
                                  "p99": lag("produce_to_consumer_s", "p99")},
        "changes_committed": [s["committed"] for s in streams],
        "changes_received": [s["received"] for s in streams],
        "duplicates": [s["duplicates"] for s in streams],
        "offered_rate": [r["offered_rate"] for r in on],
    }  # fmt: skip


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=1, help="rounds (each: on and off)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--rate", type=float, default=None, help="paced offered load, episodes/s (default: max/2)"
    )
    parser.add_argument("--latency-seconds", type=float, default=60.0)
    parser.add_argument("--neo4j-uri", default="bolt://127.0.0.1:17687")
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.groups < 1 or args.records < args.groups or args.repeat < 1:
        parser.error("need --repeat >= 1 and at least one record per group")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or RESULTS / f"change_stream-{stamp}.json"
    load_before = os.getloadavg()
    runs = []
    for round_ in range(args.repeat):
        order = (True, False) if round_ % 2 == 0 else (False, True)
        for changes in order:
            run_id = f"changes-{stamp}-{uuid.uuid4().hex[:6]}"
            runs.append(one_run(args, changes, run_id))
            r = runs[-1]
            print(f"round {round_ + 1} changes={'on' if changes else 'off'}: "
                  f"{r['events_per_s']} events/s, stream {r['stream']}", flush=True)  # fmt: skip
    document = {
        "argv": list(sys.argv[1:] if argv is None else argv),
        "records": args.records,
        "groups": args.groups,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "summary": summary(runs),
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
    s = document["summary"]
    print(
        f"\nmax events/s: {s['events_per_s_with_changes']} with the change stream, "
        f"{s['events_per_s_without_changes']} without (cost {s['throughput_cost']})\n"
        f"lag at {s['offered_rate']} episodes/s: commit->consumer {s['commit_to_consumer_s']}, "
        f"produce->consumer {s['produce_to_consumer_s']}\n"
        f"changes committed {s['changes_committed']}, received {s['changes_received']}, "
        f"duplicates {s['duplicates']}\n-> {out}"
    )
    lost = any(r["stream"] and r["stream"]["received"] < r["stream"]["committed"] for r in runs)
    bad = lost or any(r["dead_lettered"] for r in runs)
    if bad:
        print("FAILED: dead letters, or changes committed and not received", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
