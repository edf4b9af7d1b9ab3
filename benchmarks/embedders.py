"""Speed and calibration of the offline embedders.

``python -m benchmarks.embedders`` prints, per embedder, the load time and the throughput on
short entity names and on ~20-word fact sentences, and writes them to
``benchmarks/results/embedders.json``.

``python -m benchmarks.embedders --calibrate`` prints the cosines of the calibration pairs below
(the numbers quoted next to each model's thresholds come from it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tidegraph.embed.base import Embedder
from tidegraph.embed.e5 import E5Embedder
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.embed.minilm import MiniLMEmbedder
from tidegraph.records.vectors import cosine

RESULTS = Path(__file__).parent / "results" / "embedders.json"

# --- calibration pairs ----------------------------------------------------------------------

SAME_ENTITY = [
    ("Acme Corp", "ACME Corporation"),
    ("Bob Smith", "Robert Smith"),
    ("IBM", "International Business Machines"),
    ("J. P. Morgan", "JP Morgan"),
    ("Acme Corp", "Acme Corp."),
    ("New York City", "NYC"),
    ("Microsoft Corporation", "Microsoft"),
    ("Dr. Alice Johnson", "Alice Johnson"),
    ("United States of America", "USA"),
    ("Katherine Lee", "Kate Lee"),
]
RELATED_ENTITY = [
    ("Acme Corp", "Acme Labs"),
    ("printer", "scanner"),
    ("Bob Smith", "Alice Smith"),
    ("Paris", "London"),
    ("Google", "Microsoft"),
    ("Apple Inc.", "Apple Records"),
    ("2023 annual report", "2022 annual report"),
]
_NAMES = [
    "Acme Corp",
    "Bob Smith",
    "printer",
    "Berlin",
    "quarterly revenue report",
    "Kubernetes cluster",
    "Maria Garcia",
    "coffee machine",
    "International Business Machines",
    "the Eiffel Tower",
]
UNRELATED_ENTITY = list(itertools.combinations(_NAMES, 2))
SAME_FACT = [
    ("Alice Johnson works at Acme Corp as a software engineer.", "Alice is employed by Acme Corp."),
    (
        "Bob Smith moved from London to Berlin in March 2021.",
        "In March 2021 Bob Smith relocated to Berlin, leaving London.",
    ),
    ("The printer on the third floor is out of toner.", "The third-floor printer has no toner."),
    ("Acme Corp acquired Widget Inc for $2 billion.", "Widget Inc was bought by Acme Corp."),
    ("Maria is the manager of the sales team.", "Maria manages the sales team."),
    (
        "Bob Smith started a new job at Globex on Monday.",
        "Since Monday, Bob has been working for Globex.",
    ),
    (
        "The server crashed because it ran out of disk space.",
        "A full disk caused the server crash.",
    ),
]
DIFFERENT_FACT = [
    ("Alice Johnson works at Acme Corp as a software engineer.", "Alice Johnson left Acme Corp."),
    ("Bob Smith moved from London to Berlin in March 2021.", "Bob Smith likes coffee."),
    ("The printer on the third floor is out of toner.", "The scanner on the third floor works."),
    ("Acme Corp acquired Widget Inc for $2 billion.", "Maria is the manager of the sales team."),
    ("Maria is the manager of the sales team.", "The Kubernetes cluster ran out of memory."),
    ("Alice is employed by Acme Corp.", "Bob Smith moved from London to Berlin in March 2021."),
    ("Bob Smith started a new job at Globex on Monday.", "Bob Smith quit Globex on Friday."),
    (
        "The server crashed because it ran out of disk space.",
        "The server was upgraded to a larger disk.",
    ),
]
CALIBRATION = {
    "same entity": SAME_ENTITY,
    "related entity": RELATED_ENTITY,
    "unrelated entity": UNRELATED_ENTITY,
    "same fact": SAME_FACT,
    "different fact": DIFFERENT_FACT,
}


def calibrate(embedder: Embedder, embed: Callable[[list[str]], list[list[float]]]) -> dict:
    """Cosine of every calibration pair, by group, with min/mean/max."""
    report: dict[str, dict] = {}
    for group, pairs in CALIBRATION.items():
        scores = [cosine(*embed([a, b])) for a, b in pairs]
        report[group] = {
            "min": min(scores),
            "mean": statistics.fmean(scores),
            "max": max(scores),
            "pairs": [[a, b, round(s, 3)] for (a, b), s in zip(pairs, scores, strict=True)],
        }
    return report


def print_calibration(name: str, report: dict) -> None:
    print(f"\n== {name}")
    for group, stats in report.items():
        print(
            f"  {group:17} min {stats['min']:.3f}  mean {stats['mean']:.3f}  max {stats['max']:.3f}"
        )
        pairs = stats["pairs"]
        if group == "unrelated entity":  # many pairs: only the closest ones
            pairs = sorted(pairs, key=lambda p: -p[2])[:3]
        for a, b, score in pairs:
            print(f"      {score:6.3f}  {a!r} / {b!r}")


# --- speed ----------------------------------------------------------------------------------

_FIRST = ["Alice", "Bob", "Maria", "Chen", "Olga", "Ahmed", "Priya", "Lucas", "Yuki", "Ines"]
_LAST = ["Smith", "Garcia", "Novak", "Tanaka", "Okafor", "Muller", "Rossi", "Kim", "Silva"]
_ORGS = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Stark", "Wayne", "Tyrell"]
_KINDS = ["Corp", "Labs", "Bank", "Logistics", "Energy", "Health", "Foods", "Systems"]
_VERBS = ["joined", "left", "met", "called", "emailed", "visited", "hired", "reviewed"]
_PLACES = ["Berlin", "Lisbon", "Osaka", "Nairobi", "Toronto", "Lyon", "Seoul", "Austin"]


def short_texts(n: int) -> list[str]:
    """Entity names of one to three words."""
    people = [f"{f} {last}" for f in _FIRST for last in _LAST]
    orgs = [f"{o} {k}" for o in _ORGS for k in _KINDS]
    pool = people + orgs + _FIRST + _PLACES
    return [pool[i % len(pool)] + ("" if i < len(pool) else f" {i}") for i in range(n)]


def long_texts(n: int) -> list[str]:
    """Fact sentences of about twenty words."""
    texts = []
    for i in range(n):
        person = f"{_FIRST[i % 10]} {_LAST[(i // 10) % 9]}"
        org = f"{_ORGS[i % 8]} {_KINDS[(i // 8) % 8]}"
        texts.append(
            f"On {1 + i % 28} March 202{i % 5}, {person} {_VERBS[i % 8]} the {org} team in "
            f"{_PLACES[(i // 3) % 8]} to discuss the delayed shipment of order number {1000 + i}."
        )
    return texts


@dataclass
class SpeedResult:
    model: str
    load_s: float
    short_per_s: float
    long_per_s: float
    short_n: int
    long_n: int
    mean_words_short: float
    mean_words_long: float


def _throughput(embed: Callable[[list[str]], list[list[float]]], texts: list[str]) -> float:
    embed(texts[:64])  # warm caches and allocator
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        embed(texts)
        timings.append(time.perf_counter() - started)
    return len(texts) / statistics.median(timings)


def measure(name: str, load: Callable[[], object], embed: Callable, n: int) -> SpeedResult:
    started = time.perf_counter()
    load()
    load_s = time.perf_counter() - started
    short, long = short_texts(n), long_texts(n)
    return SpeedResult(
        model=name,
        load_s=load_s,
        short_per_s=_throughput(embed, short),
        long_per_s=_throughput(embed, long),
        short_n=len(short),
        long_n=len(long),
        mean_words_short=statistics.fmean(len(t.split()) for t in short),
        mean_words_long=statistics.fmean(len(t.split()) for t in long),
    )


def _hashing_embed(embedder: HashingEmbedder) -> Callable[[list[str]], list[list[float]]]:
    return lambda texts: [embedder.embed_sync(t) for t in texts]


def run_speed(n: int, threads: int | None, batch_size: int) -> list[SpeedResult]:
    minilm = MiniLMEmbedder(threads=threads, batch_size=batch_size)
    hashing = HashingEmbedder(dim=384)
    return [
        measure(f"{minilm.model_name} (batch {batch_size})", minilm.load, minilm.embed_sync, n),
        measure(hashing.model_name, lambda: None, _hashing_embed(hashing), n),
    ]


def print_table(results: list[SpeedResult]) -> None:
    header = f"{'model':34} {'load s':>7} {'sent/s short':>13} {'sent/s long':>12}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r.model:34} {r.load_s:7.3f} {r.short_per_s:13.0f} {r.long_per_s:12.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibrate", action="store_true", help="print calibration cosines")
    parser.add_argument("-n", type=int, default=1000, help="texts per throughput run")
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime threads")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON file to write")
    args = parser.parse_args(argv)

    if args.calibrate:
        minilm, hashing = MiniLMEmbedder(), HashingEmbedder()
        print_calibration(minilm.model_name, calibrate(minilm, minilm.embed_sync))
        e5 = E5Embedder()  # stored texts, names and facts alike, are embedded as passages
        print_calibration(e5.model_name, calibrate(e5, e5.embed_sync))
        print_calibration(hashing.model_name, calibrate(hashing, _hashing_embed(hashing)))
        return 0

    results = run_speed(args.n, args.threads, args.batch_size)
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "threads": args.threads,
        "results": [asdict(r) for r in results],
    }
    args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
