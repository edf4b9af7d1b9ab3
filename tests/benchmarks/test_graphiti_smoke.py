"""CI smoke run of the tidegraph-vs-Graphiti benchmark (issue 8, parts 2 and 3).

End to end on a tiny input: builds (or reuses) the Graphiti venv, runs both systems against
the test Neo4j server and the fake LLM, and checks the JSON. No timing thresholds: only that
it completes, both systems wrote the same graph from the same answers, and nothing is left
behind (the benchmark's groups and Graphiti's extra indexes).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from neo4j import AsyncGraphDatabase

from benchmarks import graphiti_compare
from benchmarks.graphiti_answers import FairAnswers
from benchmarks.text_feed import FeedIndex, feed_stats, text_feed

# The first test also builds the Graphiti venv when it is missing: about a minute from PyPI on
# an idle machine, several under heavy load; hence the long timeouts.

RUN_KEYS = {
    "system", "group_prefix", "latency_ms", "groups", "episodes", "seconds", "episodes_per_s",
    "cpu_seconds", "failures", "llm", "extraction_answers", "graph", "load_before",
    "load_after", "peak_rss_mb", "cpu_ms_per_episode", "neo4j_queries_per_episode",
}  # fmt: skip
LLM_KEYS = {
    "calls", "calls_per_episode", "prompt_chars", "prompt_chars_per_episode", "calls_by_schema",
    "calls_per_episode_by_schema", "calls_per_episode_by_stage",
    "prompt_chars_per_episode_by_stage", "failed_requests",
}  # fmt: skip


async def _leftovers(uri: str, prefixes: list[str], indexes: list[str]) -> tuple[int, list[str]]:
    driver = AsyncGraphDatabase.driver(uri, auth=None)
    try:
        records, _, _ = await driver.execute_query(
            "MATCH (n) WHERE any(p IN $prefixes WHERE n.group_id STARTS WITH p) "
            "RETURN count(n) AS n",
            prefixes=prefixes,
        )
        names, _, _ = await driver.execute_query("SHOW INDEXES YIELD name RETURN name")
    finally:
        await driver.close()
    return records[0]["n"], sorted({r["name"] for r in names} & set(indexes))


def _check(result: dict[str, Any], key: str, uri: str) -> None:
    assert result["fairness"] and result["machine"]["cpus"]
    runs = result["runs"]
    assert sorted(r["system"] for r in runs) == sorted(["tidegraph", "graphiti"] * len(
        result["summary"]
    ))  # fmt: skip
    for run in runs:
        assert RUN_KEYS <= set(run), run.keys()
        assert LLM_KEYS <= set(run["llm"])
        assert run["failures"] == [], run["failures"]
        assert run["llm"]["failed_requests"] == {}
        assert run["episodes_per_s"] > 0
        assert run["llm"]["calls_by_schema"]
    for row in result["summary"]:
        assert {key, "tidegraph_episodes_per_s", "graphiti_episodes_per_s", "ratio"} <= set(row)
        assert {"tidegraph_calls_per_episode", "graphiti_calls_per_episode"} <= set(row)
        pair = [r for r in runs if r[key] == row[key]]
        tg, gr = sorted(pair, key=lambda r: r["system"], reverse=True)
        # Fair answers: both were told the same entities and facts, and wrote the same graph.
        assert tg["extraction_answers"] == gr["extraction_answers"]
        assert tg["extraction_answers"]["entities"] > 0
        for field in ("entities", "episodes", "facts", "facts_expired"):
            assert tg["graph"][field] == gr["graph"][field], field
        # ...fact by fact, with both timelines (valid/invalid and whether it was expired).
        assert gr["same_facts_as_tidegraph"], (
            gr["facts_only_in_tidegraph"],
            gr["facts_only_in_graphiti"],
        )
    prefixes = [r["group_prefix"] for r in runs]
    left, indexes = asyncio.run(
        _leftovers(uri, prefixes, result["graphiti_indexes_added_and_dropped"])
    )
    assert left == 0 and indexes == []


def test_the_feed_is_deterministic_and_fits_the_issue() -> None:
    feed = text_feed(200, 16)
    assert [e.as_json() for e in feed] == [e.as_json() for e in text_feed(200, 16)]
    stats = feed_stats(feed)
    assert stats["episodes"] == 200 and stats["groups"] == 16
    assert stats["contradicting_facts"] > 0 and stats["facts_per_episode"] >= 1
    index = FeedIndex(feed)  # refuses two messages with one content, or one wording for two facts
    old = feed[0].truth.facts[0]
    assert FairAnswers(index).judge(old, old.key) == "duplicate"


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_text_episodes_side_by_side_with_graphiti(neo4j_uri: str, tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    graphiti_compare.main(
        ["--latency-ms", "0", "--groups", "4", "--episodes", "8", "--neo4j-uri", neo4j_uri,
         "--out", str(out)]
    )  # fmt: skip
    result = orjson.loads(out.read_bytes())
    assert result["benchmark"] == "graphiti_compare"
    assert result["feed"]["feed"]["episodes"] == 8 and result["feed"]["feed"]["groups"] == 4
    _check(result, "latency_ms", neo4j_uri)


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_scaling_curve(neo4j_uri: str, tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    graphiti_compare.main(
        ["--scaling", "--scaling-groups", "1", "3", "--scaling-episodes-per-group", "2",
         "--scaling-latency-ms", "0", "--neo4j-uri", neo4j_uri, "--out", str(out)]
    )  # fmt: skip
    result = orjson.loads(out.read_bytes())
    assert result["benchmark"] == "graphiti_scaling"
    assert [row["groups"] for row in result["summary"]] == [1, 3]
    _check(result, "groups", neo4j_uri)


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_the_trace_says_where_tidegraphs_group_time_goes(neo4j_uri: str, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    graphiti_compare.main(
        ["--latency-ms", "0", "--groups", "2", "--episodes", "6", "--systems", "tidegraph",
         "--trace", "--neo4j-uri", neo4j_uri, "--out", str(out)]
    )  # fmt: skip
    [run] = orjson.loads(out.read_bytes())["runs"]
    chain = run["chain"]
    assert chain["group_seconds"] > 0
    assert sum(chain["share"].values()) == pytest.approx(1, abs=0.02)
    assert chain["share"]["store:write_episodes"] > 0  # every episode was written
    transactions = chain["transactions"]
    assert transactions["count"] >= 1 and 0 < transactions["busy_share"] <= 1
    assert transactions["episodes_each"] * transactions["count"] == pytest.approx(6)
