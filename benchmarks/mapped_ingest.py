"""One in-process path of ``benchmarks.throughput``, alone and in this process (quick runs,
profiling).

``python -m benchmarks.mapped_ingest --records 5000 --store neo4j`` ingests the generated CRM
feed (``tests.support.crm_feed``) in-process through the real pipeline into one store,
prints events/s, checks every subject's current value against the feed's truth and writes
``benchmarks/results/mapped_ingest-<store>-<embedder>-<records>.json``. ``--keep`` leaves the
groups in Neo4j; ``--profile`` writes a pyinstrument HTML profile next to the JSON. For every
path side by side, and the comparison with Neo4j's raw write rate, run
``python -m benchmarks.throughput``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import uuid
from pathlib import Path

import orjson

from benchmarks.throughput import RESULTS, FeedSpec, InProcessJob, run_in_process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--store", choices=["neo4j", "embedded"], default="neo4j")
    parser.add_argument("--embedder", choices=["hashing", "minilm"], default="hashing")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16, help="groups processed at once")
    parser.add_argument("--late-fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--neo4j-uri", default="bolt://127.0.0.1:17687")
    parser.add_argument("--keep", action="store_true", help="keep the groups in Neo4j")
    parser.add_argument("--profile", action="store_true", help="pyinstrument profile")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args(argv)
    if args.groups < 1 or args.records < args.groups:
        parser.error("need at least one record per group")
    name = f"mapped_ingest-{args.store}-{args.embedder}-{args.records}"
    out: Path = args.out or RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    job = InProcessJob(
        store=args.store,
        feed=FeedSpec(args.records, args.groups, args.seed, args.late_fraction),
        prefix=f"bench{uuid.uuid4().hex[:8]}",
        embedder=args.embedder,
        concurrency=args.concurrency,
        neo4j_uri=args.neo4j_uri,
        profile=out.with_suffix(".profile.html") if args.profile else None,
        keep=args.keep,
    )
    load_before = os.getloadavg()[0]
    result = run_in_process(job)
    result |= {
        "command": "python -m benchmarks.mapped_ingest " + " ".join(sys.argv[1:]),
        "store": args.store,
        "embedder": args.embedder,
        "records": args.records,
        "groups": args.groups,
        "concurrency": args.concurrency,
        "late_fraction": args.late_fraction,
        "cpus": os.cpu_count(),
        # The machine may be shared: the 1-minute load average before and after the ingest.
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "python": platform.python_version(),
        "profile": str(job.profile) if job.profile else None,
    }
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    check = result["check"]
    print(
        f"{args.records} records, {args.groups} groups, {args.store} + {args.embedder}: "
        f"{result['seconds']:.1f} s, {result['events_per_s']:.0f} events/s "
        f"({result['facts_new']} facts, {result['facts_closed']} closed, "
        f"{result['facts_born_closed']} born closed, {result['failures']} failed; "
        f"{check['subjects_wrong']}/{check['subjects_checked']} subjects wrong; "
        f"peak RSS {result['peak_rss_mb']:.0f} MiB) -> {out}"
    )
    return 0 if result["failures"] == 0 and check["subjects_wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
