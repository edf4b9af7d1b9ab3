"""Recall quality: does search find the episodes that answer a question?

Two feeds, each ingested into a fresh store, then every question asked with every recipe
(docs/retrieval.md "Memory retrieval"), so the gain of fusion and reranking over one method shows:

* ``support``: the generated support-chat feed (benchmarks/text_feed.py) through the real
  chain with the scripted LLM answering from the feed's ground truth (benchmarks/
  graphiti_answers.py). Questions come from the truth: for each subject and one-valued
  relation ("Which plan is Bluebird Bakery on?") asked now and at a past moment between two
  values (``valid_at``), and for each subject of a many-valued relation. Evidence: the
  messages that stated the answer. Also the **as-of accuracy**: the first fact of that subject
  and relation in the ranking names the object valid at the asked time.
* ``locomo``: LoCoMo conversations (benchmarks/locomo.py; pass the dataset's path) as message
  episodes with **no LLM** (stored and searchable, not extracted): evidence recall by the
  dataset's question category (1-4 by default: 5, adversarial, asks about what was never
  said);
* ``realtalk``: the REALTALK conversations (benchmarks/realtalk.py; pass the folder of its
  ``Chat_*.json``), the same way: the held-out set, never tuned on.

Evidence recall@k: the share of a question's evidence episodes among the producer ids the
top k results trace back to (an episode's own id, a fact's or entity's source episodes),
averaged over questions.

    python -m benchmarks.recall_quality support --episodes 400 --groups 4
    python -m benchmarks.recall_quality locomo /path/to/locomo10.json --conversations 10
    python -m benchmarks.recall_quality realtalk /path/to/realtalk/data --limit 5
    (--store neo4j --neo4j-uri bolt://127.0.0.1:17687 to use Neo4j; default embedded)
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from benchmarks.text_feed import ONE_VALUED, FeedEpisode, text_feed
from tidegraph.records.search import Hit, SearchRequest

KS = (5, 10, 20)

QUESTION_TEMPLATES = {
    "HAS_PLAN": "Which plan is {s} on?",
    "WORKS_AT": "Where does {s} work?",
    "HAS_STATUS": "What is the status of {s}?",
    "MANAGED_BY": "Who is the account manager for {s}?",
    "REPORTS_TO": "Who does {s} report to?",
    "USES": "Which products does {s} use?",
    "CONCERNS": "Which product does {s} concern?",
}


@dataclass(frozen=True)
class Probe:
    """One question: where to ask it, when, what answers it."""

    id: str
    group_id: str
    query: str
    evidence: frozenset[str]
    category: str
    valid_at: datetime | None = None
    subject: str | None = None  # as-of accuracy: the first fact of (subject, relation) ...
    relation: str | None = None
    expected: str | None = None  # ... must name this object


@dataclass
class Tally:
    questions: int = 0
    recall: dict[int, float] = field(default_factory=lambda: dict.fromkeys(KS, 0.0))
    asof_questions: int = 0
    asof_right: int = 0
    seconds: float = 0.0

    def row(self) -> dict[str, Any]:
        n = self.questions or 1
        row: dict[str, Any] = {"questions": self.questions}
        row.update({f"recall@{k}": round(self.recall[k] / n, 3) for k in KS})
        if self.asof_questions:
            row["asof_accuracy"] = round(self.asof_right / self.asof_questions, 3)
        row["ms_per_query"] = round(1000 * self.seconds / n, 1)
        return row


# ----------------------------------------------------------------------------- probes
def support_probes(feed: list[FeedEpisode], group_of: dict[str, str]) -> list[Probe]:
    """Questions from the feed's truth (see the module docstring)."""
    # (tenant, subject, relation) -> [(start, object, episode id)] in feed order
    history: dict[tuple[str, str, str], list[tuple[datetime, str, str]]] = defaultdict(list)
    for episode in feed:
        for fact in episode.truth.facts:
            if fact.relation not in QUESTION_TEMPLATES:
                continue
            start = (
                datetime.fromisoformat(fact.valid_at).replace(tzinfo=episode.reference_time.tzinfo)
                if fact.valid_at
                else episode.reference_time
            )
            history[(episode.group, fact.subject, fact.relation)].append(
                (start, fact.object, episode.id)
            )
    probes: list[Probe] = []
    for (tenant, subject, relation), statements in sorted(history.items()):
        group_id = group_of[tenant]
        query = QUESTION_TEMPLATES[relation].format(s=subject)
        base = f"{group_id}:{subject}:{relation}"
        if relation not in ONE_VALUED:
            ids = frozenset(e for _, _, e in statements)
            probes.append(Probe(f"{base}:now", group_id, query, ids, "many-valued"))
            continue
        ordered = sorted(statements, key=lambda s: s[0])
        runs = _value_runs(ordered)
        start, value, ids = runs[-1]
        probes.append(
            Probe(f"{base}:now", group_id, query, ids, "now", None, subject, relation, value)
        )
        for (start, value, ids), (nxt, _, _) in zip(runs, runs[1:], strict=False):
            if nxt - start < timedelta(days=2):
                continue  # too close to tell the two apart by date
            when = start + (nxt - start) / 2
            probes.append(
                Probe(
                    f"{base}:{when.date()}",
                    group_id,
                    query,
                    ids,
                    "past",
                    when,
                    subject,
                    relation,
                    value,
                )
            )
    return probes


def _value_runs(
    statements: list[tuple[datetime, str, str]],
) -> list[tuple[datetime, str, frozenset[str]]]:
    """Consecutive statements of one value folded: (first start, value, episode ids)."""
    runs: list[tuple[datetime, str, frozenset[str]]] = []
    for start, value, episode_id in statements:
        if runs and runs[-1][1] == value:
            first, _, ids = runs[-1]
            runs[-1] = (first, value, ids | {episode_id})
        else:
            runs.append((start, value, frozenset({episode_id})))
    return runs


# ----------------------------------------------------------------------------- scoring
def traced_ids(hits: Iterable[Hit]) -> list[str]:
    """The producer ids the results trace back to, in rank order, each once."""
    seen: dict[str, None] = {}
    for hit in hits:
        ids = [hit.record.producer_id] if hit.kind == "episode" else hit.episodes  # type: ignore[union-attr]
        for episode_id in ids:
            seen.setdefault(episode_id, None)
    return list(seen)


def asof_right(probe: Probe, hits: list[Hit]) -> bool:
    for hit in hits:
        if hit.kind == "fact" and hit.subject == probe.subject:
            if hit.record.name == probe.relation:  # type: ignore[union-attr]
                return hit.object == probe.expected
    return False


async def score(
    memory: Any, probes: list[Probe], recipes: list[str], limit: int = max(KS)
) -> dict[str, Any]:
    """Every probe asked with every recipe, ``limit`` results per kind (recall at k beyond
    the limit counts only what the limit returns)."""
    tallies: dict[tuple[str, str], Tally] = defaultdict(Tally)
    for recipe in recipes:
        for probe in probes:
            started = time.perf_counter()
            results = await memory.search(
                SearchRequest(
                    query=probe.query,
                    group_ids=[probe.group_id],
                    valid_at=probe.valid_at,
                    recipe=recipe,
                    limit=limit,
                )
            )
            elapsed = time.perf_counter() - started
            hits = results.all()
            traced = traced_ids(hits)
            for key in ((recipe, probe.category), (recipe, "all")):
                tally = tallies[key]
                tally.questions += 1
                tally.seconds += elapsed
                for k in KS:
                    found = len(probe.evidence.intersection(traced[:k]))
                    tally.recall[k] += found / len(probe.evidence)
                if probe.expected is not None and any(h.kind == "fact" for h in hits):
                    tally.asof_questions += 1
                    tally.asof_right += asof_right(probe, hits)
    return {f"{recipe} / {category}": t.row() for (recipe, category), t in tallies.items()}


# ----------------------------------------------------------------------------- runs
def _settings(args: argparse.Namespace, data_dir: Path, llm_base_url: str | None) -> Any:
    from tidegraph.settings import Settings

    return Settings(
        store=args.store,
        data_dir=data_dir,
        neo4j_uri=args.neo4j_uri,
        llm_base_url=llm_base_url,
        embedder=args.embedder,
    )


async def _ingest(memory: Any, envelopes: list[dict[str, Any]]) -> dict[str, Any]:
    from tidegraph.pipelines.ingest import ingest
    from tidegraph.records.episode import Episode

    episodes = [Episode.model_validate(e) for e in envelopes]
    started = time.perf_counter()
    report = await ingest(memory.runtime.runner(), episodes, concurrency=8)
    return {"ingest": report.line(), "ingest_seconds": round(time.perf_counter() - started, 1)}


async def run_support(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    from benchmarks.graphiti_answers import FairAnswers
    from benchmarks.text_feed import FeedIndex
    from tests.support.fake_llm import ScriptedLLMServer
    from tidegraph.app.memory import Memory

    feed = text_feed(args.episodes, args.groups, seed=args.seed)
    run = f"rq{int(time.time())}"
    group_of = {e.group: f"{run}-{e.group}" for e in feed}
    with ScriptedLLMServer() as server:
        FairAnswers(FeedIndex(feed)).install(server)
        memory = await Memory.open(_settings(args, data_dir, server.base_url))
        try:
            ingest = await _ingest(memory, [e.envelope(group_of[e.group]) for e in feed])
            probes = support_probes(feed, group_of)
            scores = await score(memory, probes, args.recipes, args.limit)
        finally:
            await _cleanup(memory, set(group_of.values()), args)
            await memory.close()
    return {"feed": "support", "episodes": len(feed), **ingest, "scores": scores}


async def run_conversations(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    """LoCoMo or REALTALK: conversations as message episodes, no LLM."""
    from benchmarks import locomo, realtalk
    from tidegraph.app.memory import Memory

    dataset = locomo if args.feed == "locomo" else realtalk
    envelopes, questions = dataset.load(Path(args.path), args.conversations)
    run = f"rq{int(time.time())}"
    for e in envelopes:
        e["group_id"] = f"{run}-{e['group_id']}"
    asked = [q for q in questions if q.category in args.categories]
    probes = [
        Probe(
            q.id,
            f"{run}-{q.group_id}",
            q.question,
            frozenset(q.evidence),
            f"{q.category} {dataset.CATEGORIES.get(q.category, '?')}",
        )
        for q in asked[: args.questions or None]
    ]
    memory = await Memory.open(_settings(args, data_dir, None))
    try:
        ingest = await _ingest(memory, envelopes)
        scores = await score(memory, probes, args.recipes, args.limit)
    finally:
        await _cleanup(memory, {e["group_id"] for e in envelopes}, args)
        await memory.close()
    return {
        "feed": args.feed,
        "episodes": len(envelopes),
        "limit": args.limit,
        "categories": sorted(args.categories),
        **ingest,
        "scores": scores,
    }


async def _cleanup(memory: Any, groups: set[str], args: argparse.Namespace) -> None:
    if args.store == "neo4j":
        for group in groups:
            await memory.runtime.store.forget.delete_group(group)


def print_table(result: dict[str, Any]) -> None:
    print(f"{result['feed']}: {result['episodes']} episodes; {result['ingest']}")
    if "limit" in result:
        print(f"limit {result['limit']} per kind; question categories {result['categories']}")
    header = ["recipe / questions", "n", *[f"R@{k}" for k in KS], "as-of", "ms/q"]
    print(" | ".join(header))
    for name, row in sorted(result["scores"].items()):
        cells = [name, str(row["questions"])]
        cells += [f"{row[f'recall@{k}']:.3f}" for k in KS]
        cells += [str(row.get("asof_accuracy", "")), str(row["ms_per_query"])]
        print(" | ".join(cells))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from tidegraph.recall.recipes import RECIPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("feed", choices=("support", "locomo", "realtalk"))
    parser.add_argument(
        "path", nargs="?", help="locomo10.json (locomo), the folder of Chat_*.json (realtalk)"
    )
    parser.add_argument("--episodes", type=int, default=400)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--conversations", type=int, default=None)
    parser.add_argument("--questions", type=int, default=None, help="at most this many")
    parser.add_argument("--limit", type=int, default=max(KS), help="results per kind")
    parser.add_argument(
        "--categories",
        default="1,2,3,4",
        help="question categories asked (locomo, realtalk; comma-separated)",
    )
    parser.add_argument("--store", choices=("embedded", "neo4j"), default="embedded")
    parser.add_argument("--neo4j-uri", default="bolt://127.0.0.1:17687")
    parser.add_argument("--embedder", choices=("minilm", "e5", "hashing"), default="minilm")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated")
    parser.add_argument("--json", dest="json_out", help="also write the result here")
    args = parser.parse_args(argv)
    args.recipes = [r for r in args.recipes.split(",") if r]
    unknown = [r for r in args.recipes if r not in RECIPES]
    if unknown:
        parser.error(f"unknown recipes {unknown}; known: {sorted(RECIPES)}")
    args.categories = {int(c) for c in args.categories.split(",") if c}
    if args.feed != "support" and not args.path:
        parser.error(f"{args.feed} needs the path of its data (see --help)")
    with tempfile.TemporaryDirectory(prefix="tidegraph-recall-") as tmp:
        runner = run_support if args.feed == "support" else run_conversations
        result = asyncio.run(runner(args, Path(tmp)))
    print_table(result)
    if args.json_out:
        Path(args.json_out).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return result


if __name__ == "__main__":
    main()
