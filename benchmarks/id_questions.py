"""Business records asked by their ids over a long history (docs/retrieval.md "Identifiers",
"Long histories").

A generated incident log (tests/support/incident_log.py: ``--subjects`` tickets with ids like
``1-732025285``, ``--changes`` updates each of their status, owner and team, so
``3 * subjects * changes`` facts of which all but ``3 * subjects`` are closed) is written
through the in-process path with its declared mapping into one group. Then ``--questions``
questions "What is the status of ticket <id>?" are searched (the default recipe, hashing
embeddings), half now and half as of a random moment between two of the ticket's updates:

* **first fact right**: the first fact about that ticket among the hits is its status then,
  now and as of;
* **latency** of the as-of searches (p50 / p95 / p99, in-process) and the errors (any
  exception, e.g. Neo4j's MemoryPoolOutOfMemoryError) among all searches.

    python -m benchmarks.id_questions --subjects 1667 --changes 20 --questions 1000 \\
        --store neo4j --neo4j-uri bolt://127.0.0.1:17687 --keep   # 100,000 facts
    python -m benchmarks.id_questions --subjects 200 --questions 100 --store embedded
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.incident_log import Question, incident_log, incident_mappings
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.ingest import ingest
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.recall.search import Searcher
from tidegraph.records.graph import FactRecord
from tidegraph.records.search import SearchRequest
from tidegraph.stores.base import GraphStore

DIM = 384


def _percentiles(values: list[float]) -> dict[str, float]:
    if len(values) < 2:
        return {"p50": round(values[0], 1) if values else 0.0, "p95": 0.0, "p99": 0.0}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(cuts[49], 1), "p95": round(cuts[94], 1), "p99": round(cuts[98], 1)}


def first_fact_right(results_facts: list[Any], question: Question) -> bool:
    about = [
        h.record.fact
        for h in results_facts
        if isinstance(h.record, FactRecord) and f"Ticket {question.ticket} " in h.record.fact
    ]
    return bool(about) and about[0] == f"Ticket {question.ticket} status is {question.status}"


async def _open(args: argparse.Namespace, folder: Path) -> GraphStore:
    if args.store == "neo4j":
        from tidegraph.stores.neo4j.store import Neo4jStore

        store: GraphStore = Neo4jStore(args.neo4j_uri)
    else:
        from tidegraph.stores.sqlite.store import SqliteStore

        store = SqliteStore(folder / "graph")
    await store.setup(DIM)
    return store


async def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    group_id = f"bench-ids-{args.subjects}-{args.changes}-{args.seed}"
    log = incident_log(group_id, args.subjects, args.changes, args.seed)
    embedder = HashingEmbedder(dim=DIM)
    store = await _open(args, folder)
    result: dict[str, Any] = {"facts": 3 * args.subjects * args.changes}
    try:
        counts = await store.browse.counts(group_id)
        started = time.perf_counter()
        if not counts.get("episodes"):
            runner = GroupRunner.of(
                store=store, embedder=embedder, llm=None, mappings=incident_mappings()
            )
            report = await ingest(runner, log.episodes)
            assert not report.failures, report.failures[:3]
        result["build_seconds"] = round(time.perf_counter() - started, 1)
        searcher = Searcher(store.search, embedder)
        right = {"now": 0, "as of": 0}
        asked = {"now": 0, "as of": 0}
        as_of_ms: list[float] = []
        errors: list[str] = []
        for question in log.questions(args.questions, seed=args.seed):
            when = "now" if question.valid_at is None else "as of"
            request = SearchRequest(
                query=question.query, group_ids=[group_id], valid_at=question.valid_at
            )
            began = time.perf_counter()
            try:
                results = await searcher.search(request)
            except Exception as exc:  # noqa: BLE001 - an error is a figure here
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            if when == "as of":
                as_of_ms.append((time.perf_counter() - began) * 1000)
            asked[when] += 1
            right[when] += first_fact_right(results.facts, question)
        result |= {
            "first_fact_right": {k: round(right[k] / max(asked[k], 1), 3) for k in right},
            "as_of_ms": _percentiles(as_of_ms),
            "searches": args.questions,
            "errors": len(errors),
            "first_errors": errors[:3],
        }
    finally:
        if not args.keep:
            await store.forget.delete_group(group_id)
        await store.close()
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subjects", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--store", choices=("embedded", "neo4j"), default="neo4j")
    parser.add_argument("--neo4j-uri", default="bolt://127.0.0.1:17687")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the group (named by --subjects, --changes and --seed; embedded: in "
        "benchmarks/results/) and reuse it on the next run",
    )
    args = parser.parse_args(argv)
    if args.keep:
        kept = Path("benchmarks/results/id-questions-embedded")
        kept.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(measure(args, kept))
    else:
        with tempfile.TemporaryDirectory(prefix="tidegraph-ids-") as tmp:
            result = asyncio.run(measure(args, Path(tmp)))
    right, ms = result["first_fact_right"], result["as_of_ms"]
    print(
        f"{args.store}, {result['facts']} facts in one group (built in "
        f"{result['build_seconds']} s): first fact right now {right['now']}, as of "
        f"{right['as of']}; as-of search p50/p95/p99 {ms['p50']}/{ms['p95']}/{ms['p99']} ms; "
        f"{result['errors']} errors in {result['searches']} searches"
    )
    for error in result["first_errors"]:
        print(f"  {error}")
    return result


if __name__ == "__main__":
    main()
