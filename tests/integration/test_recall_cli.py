"""``tidegraph search`` and ``tidegraph extract --pending`` as a user runs them, on the
embedded default (docs/retrieval.md "Memory retrieval"): episodes ingested with no LLM are found at
once, every JSON result traces back to its records, a batch answers each query, another
tenant's search finds nothing, and ``extract --pending`` extracts them later."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from tests.integration.test_pending import MESSAGES, episodes, extract
from tests.support.extraction_requests import on_extraction
from tests.support.fake_llm import ScriptedLLMServer

TIDEGRAPH = Path(sys.executable).parent / "tidegraph"
GROUP = "acme-support"


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGRAPH_")}
    base.update(
        {
            "COLUMNS": "200",
            "NO_COLOR": "1",
            "NO_PROXY": "127.0.0.1",
            "TIDEGRAPH_DATA_DIR": str(tmp_path / "data"),
            "TIDEGRAPH_EMBEDDER": "hashing",
            **extra,
        }
    )
    return base


def run(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TIDEGRAPH), *args],
        cwd=tmp_path,
        env=env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def lines(out: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in out.splitlines() if line.strip()]


def test_search_finds_unextracted_episodes_and_extract_pending_extracts_them(
    tmp_path: Path,
) -> None:
    feed = tmp_path / "chat.jsonl"
    feed.write_bytes(b"\n".join(orjson.dumps(e.model_dump(mode="json")) for e in episodes(GROUP)))
    ingested = run(tmp_path, "ingest", str(feed))
    assert ingested.returncode == 0, ingested.stderr

    found = run(tmp_path, "search", "--group", GROUP, "--json", "invoices shown twice")
    assert found.returncode == 0, found.stderr
    results = lines(found.stdout)
    episodes_found = [r for r in results if r["kind"] == "episode"]
    assert episodes_found[0]["episode_id"] == "chat-1"
    assert episodes_found[0]["text"] == MESSAGES[1] and episodes_found[0]["group_id"] == GROUP
    assert [r["rank"] for r in results] == list(range(1, len(results) + 1))

    other = run(tmp_path, "search", "--group", "another-tenant", "--json", "invoices twice")
    assert other.returncode == 0 and lines(other.stdout) == []

    context = run(tmp_path, "search", "--group", GROUP, "--context", "Business plan")
    assert context.returncode == 0, context.stderr
    assert "EPISODES:" in context.stdout and "Business plan" in context.stdout

    batch = tmp_path / "questions.jsonl"
    batch.write_text(
        '{"id": "q1", "query": "invoices shown twice"}\n'
        '{"id": "q2", "query": "cancelled the Business plan", "valid_at": "2025-02-03T12:00Z"}\n'
    )
    answered = run(tmp_path, "search", "--group", GROUP, "--queries", str(batch))
    assert answered.returncode == 0, answered.stderr
    by_query: dict[str, list[dict[str, Any]]] = {}
    for row in lines(answered.stdout):
        by_query.setdefault(row["query_id"], []).append(row)
    assert [r["episode_id"] for r in by_query["q1"] if r["kind"] == "episode"][0] == "chat-1"
    assert [r["episode_id"] for r in by_query["q2"] if r["kind"] == "episode"][0] == "chat-2"

    with ScriptedLLMServer() as server:
        on_extraction(server, extract)
        server.on("EntityResolutionOutput", lambda _: {"matches": []})
        server.on("FactResolutionOutput", lambda _: {"judgements": []})
        llm = {
            "TIDEGRAPH_LLM_BASE_URL": server.base_url,
            "TIDEGRAPH_LLM_API_KEY": "test",
            "TIDEGRAPH_LLM_MODEL": "fake",
        }
        extracted = run(tmp_path, "extract", "--pending", **llm)
    assert extracted.returncode == 0, extracted.stderr
    assert "3 episodes extracted" in extracted.stdout

    facts = run(tmp_path, "facts", "--group", GROUP, "--history", "--json")
    assert sorted(row["episodes"][0] for row in lines(facts.stdout)) == [
        "chat-0",
        "chat-1",
        "chat-2",
    ]
    again = run(tmp_path, "extract", "--pending")
    assert again.returncode == 0 and "0 episodes extracted" in again.stdout
