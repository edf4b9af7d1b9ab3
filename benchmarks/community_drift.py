"""Community drift along a temporal stream: incremental assignment vs fresh label propagation.

    python -m benchmarks.community_drift [--facts N] [--schedule on|off|both] [--threshold 0.1]

Streams YAGO11k facts (``/work/shared/data/yago11k/``, read in place, never copied) in
order of start year. The graph at year y holds the facts valid then (start <= y < end; end
3000 = open). Each year's facts are added, facts that ended are removed, and every entity
seen for the first time joins the weighted-majority community of its neighbours
(``assign_by_majority``, the same logic as the service; in memory for speed). Both modes
bootstrap with one full refresh at the first checkpoint; with ``--schedule on`` a full
refresh (label propagation, seeds 1000, 1001, ... so that it never reuses the reference
seeds) also runs whenever assignments since the last refresh pass ``threshold`` x the graph's
size, or when the last one is ``--max-age-years`` old in stream time (the service's
``max_age``: fact expiries among known entities are no assignments). At each checkpoint it
prints ARI, AMI and NMI of the live partition against a fresh run (seed 0), the same for a
second fresh run (seed 1: the noise floor), the modularity of each,
and the time of a fresh refresh (propagation + diff). JSON goes to
``benchmarks/results/community_drift.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from tidegraph.processors.communities import (
    adjusted_mutual_info,
    adjusted_rand_index,
    assign_by_majority,
    drift_ratio,
    groups,
    label_propagation,
    modularity,
    normalized_mutual_info,
    plan_refresh,
    to_networkx,
)
from tidegraph.records.graph import CommunityRecord, WeightedEdge

DATA = Path("/work/shared/data/yago11k/yago11k_facts.tsv")
RESULTS = Path(__file__).parent / "results" / "community_drift.json"
OPEN_END = 3000
CHECKPOINTS = 10


@dataclass(frozen=True)
class Fact:
    subject: str
    obj: str
    start: int
    end: int


@dataclass
class Checkpoint:
    facts: int
    year: int
    nodes: int
    edges: int
    refreshes: int
    ari_live: float
    ami_live: float
    nmi_live: float
    ari_floor: float
    ami_floor: float
    nmi_floor: float
    modularity_live: float
    modularity_fresh: float
    modularity_fresh_seed1: float
    refresh_seconds: float


def load(limit: int | None, data: Path = DATA) -> list[Fact]:
    with data.open(newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    facts = [
        Fact(r["subject"], r["object"], int(r["start_year"]), int(r["end_year"]))
        for r in rows
        if r["subject"] != r["object"]
    ]
    facts.sort(key=lambda f: f.start)  # stable: file order within a year
    return facts[:limit] if limit else facts


class Stream:
    """The valid-fact graph at the current year, and the live partition."""

    def __init__(self) -> None:
        self.weights: dict[tuple[str, str], int] = defaultdict(int)
        self.adj: dict[str, dict[str, int]] = defaultdict(dict)
        self.seen: set[str] = set()
        self.live: dict[str, str] = {}
        self.assigned_since = 0
        self.refreshes = 0

    def _bump(self, a: str, b: str, delta: int) -> None:
        pair = (a, b) if a < b else (b, a)
        self.weights[pair] += delta
        for x, y in ((a, b), (b, a)):
            w = self.adj[x].get(y, 0) + delta
            if w:
                self.adj[x][y] = w
            else:
                del self.adj[x][y]
        if not self.weights[pair]:
            del self.weights[pair]

    def add(self, fact: Fact) -> list[str]:
        self._bump(fact.subject, fact.obj, 1)
        new = [e for e in (fact.subject, fact.obj) if e not in self.seen]
        self.seen.update(new)
        return new

    def remove(self, fact: Fact) -> None:
        self._bump(fact.subject, fact.obj, -1)

    def assign(self, entity: str) -> None:
        choice = assign_by_majority(self.adj[entity], self.live)
        if choice is not None:
            self.live[entity] = choice
        self.assigned_since += 1

    def graph(self) -> tuple[list[str], list[WeightedEdge]]:
        nodes = sorted(n for n, nb in self.adj.items() if nb)
        return nodes, [WeightedEdge(a, b, w) for (a, b), w in sorted(self.weights.items())]

    def refresh(self, seed: int) -> float:
        started = time.perf_counter()
        nodes, edges = self.graph()
        fresh = label_propagation(nodes, edges, seed=seed).labels
        stored = [
            CommunityRecord(members[0], "", "", members)
            for members in groups(self.live)
            if len(members) > 1
        ]
        plan = plan_refresh("bench", stored, fresh)
        self.live = {m: c.uuid for c in [*plan.unchanged, *plan.rewrites] for m in c.members}
        self.assigned_since = 0
        self.refreshes += 1
        return time.perf_counter() - started


def checkpoint(stream: Stream, facts: int, year: int) -> Checkpoint:
    nodes, edges = stream.graph()
    started = time.perf_counter()
    fresh = label_propagation(nodes, edges, seed=0).labels
    plan_refresh("bench", [], fresh)
    seconds = time.perf_counter() - started
    other = label_propagation(nodes, edges, seed=1).labels
    live = {n: stream.live[n] for n in nodes if n in stream.live}
    graph = to_networkx(nodes, edges)
    return Checkpoint(
        facts=facts,
        year=year,
        nodes=len(nodes),
        edges=len(edges),
        refreshes=stream.refreshes,
        ari_live=adjusted_rand_index(live, fresh),
        ami_live=adjusted_mutual_info(live, fresh),
        nmi_live=normalized_mutual_info(live, fresh),
        ari_floor=adjusted_rand_index(other, fresh),
        ami_floor=adjusted_mutual_info(other, fresh),
        nmi_floor=normalized_mutual_info(other, fresh),
        modularity_live=modularity(graph, live),
        modularity_fresh=modularity(graph, fresh),
        modularity_fresh_seed1=modularity(graph, other),
        refresh_seconds=seconds,
    )


def run(
    facts: list[Fact], schedule: bool, threshold: float, max_age_years: int
) -> list[Checkpoint]:
    stream = Stream()
    ending: dict[int, list[Fact]] = defaultdict(list)
    step = max(1, len(facts) // CHECKPOINTS)
    next_mark, done, points, last_refresh = step, 0, [], 0
    by_year: dict[int, list[Fact]] = defaultdict(list)
    for f in facts:
        by_year[f.start].append(f)
    for year in sorted(by_year):
        for ended_year in sorted(y for y in ending if y <= year):
            for f in ending.pop(ended_year):
                stream.remove(f)
        for f in by_year[year]:
            new = stream.add(f)
            if f.end != OPEN_END and f.end > f.start:
                ending[f.end].append(f)
            elif f.end <= f.start:
                ending[year + 1].append(f)  # a one-year (or malformed) interval
            for entity in new:
                stream.assign(entity)
        done += len(by_year[year])
        if stream.refreshes and schedule:
            nodes, _ = stream.graph()
            drifted = drift_ratio(stream.assigned_since, len(nodes)) > threshold
            if drifted or year - last_refresh >= max_age_years:
                stream.refresh(seed=1000 + stream.refreshes)
                last_refresh = year
        if done >= next_mark or year == max(by_year):
            if not stream.refreshes:
                stream.refresh(seed=1000)  # the bootstrap, in both modes
                last_refresh = year
            points.append(checkpoint(stream, done, year))
            while next_mark <= done:
                next_mark += step
    return points


COLUMNS = (
    ("facts", "{:>6}"),
    ("year", "{:>5}"),
    ("nodes", "{:>6}"),
    ("refreshes", "{:>4}"),
    ("ari_live", "{:>6.3f}"),
    ("ari_floor", "{:>6.3f}"),
    ("ami_live", "{:>6.3f}"),
    ("ami_floor", "{:>6.3f}"),
    ("nmi_live", "{:>6.3f}"),
    ("nmi_floor", "{:>6.3f}"),
    ("modularity_live", "{:>6.3f}"),
    ("modularity_fresh", "{:>6.3f}"),
    ("modularity_fresh_seed1", "{:>6.3f}"),
    ("refresh_seconds", "{:>6.3f}"),
)
HEADERS = (
    "facts  year  nodes refr ARIliv ARIflr AMIliv AMIflr NMIliv NMIflr Q_live Q_frsh Q_frs1 refr_s"
)


def table(points: list[Checkpoint]) -> str:
    lines = [HEADERS]
    for p in points:
        lines.append(" ".join(fmt.format(getattr(p, name)) for name, fmt in COLUMNS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=None, help="Stream only the first N facts.")
    parser.add_argument("--schedule", choices=["on", "off", "both"], default="both")
    parser.add_argument("--threshold", type=float, default=0.1, help="Drift that triggers.")
    parser.add_argument(
        "--max-age-years", type=int, default=5, help="Refresh at least this often (stream time)."
    )
    parser.add_argument("--data", type=Path, default=DATA, help="facts TSV (YAGO11k columns)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON file to write")
    args = parser.parse_args(argv)
    facts = load(args.facts, args.data)
    modes = ["on", "off"] if args.schedule == "both" else [args.schedule]
    out: dict[str, object] = {
        "command": "python -m benchmarks.community_drift "
        + f"--schedule {args.schedule} --threshold {args.threshold} "
        + f"--max-age-years {args.max_age_years}"
        + (f" --facts {args.facts}" if args.facts else ""),
        "facts": len(facts),
        "threshold": args.threshold,
        "max_age_years": args.max_age_years,
        "python": platform.python_version(),
        "runs": {},
    }
    for mode in modes:
        started = time.perf_counter()
        points = run(facts, mode == "on", args.threshold, args.max_age_years)
        print(f"\nschedule {mode} ({len(facts)} facts, {time.perf_counter() - started:.1f} s)")
        print(table(points))
        out["runs"][mode] = [asdict(p) for p in points]  # type: ignore[index]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
