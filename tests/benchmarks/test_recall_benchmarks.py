"""The memory-retrieval benchmarks on a tiny input (docs/retrieval.md "Memory retrieval"): each
finishes
and reports the figures docs/retrieval.md quotes. No thresholds on speed; on quality only what the
tiny feeds make certain (the evidence of an exact-wording question is found)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from benchmarks import id_questions, recall_latency, recall_quality
from benchmarks.locomo import load

pytestmark = pytest.mark.integration


def locomo_fixture(path: Path) -> Path:
    """Two short conversations in the dataset's own shape, with evidence-annotated questions."""

    def turns(session: int, lines: list[tuple[str, str]]) -> list[dict[str, Any]]:
        return [
            {"speaker": who, "dia_id": f"D{session}:{n}", "text": text}
            for n, (who, text) in enumerate(lines, 1)
        ]

    samples = [
        {
            "sample_id": "conv-a",
            "conversation": {
                "speaker_a": "Ana",
                "speaker_b": "Ben",
                "session_1_date_time": "1:56 pm on 8 May, 2023",
                "session_1": turns(
                    1,
                    [
                        ("Ana", "I adopted a grey kitten called Pixel."),
                        ("Ben", "Lovely! I started pottery classes in town."),
                    ],
                ),
                "session_2_date_time": "10:05 am on 20 June, 2023",
                "session_2": turns(
                    2,
                    [
                        ("Ana", "Pixel broke my favourite vase yesterday."),
                        ("Ben", "My pottery teacher is moving to Lisbon."),
                    ],
                ),
            },
            "qa": [
                {
                    "question": "What is the name of Ana's kitten?",
                    "answer": "Pixel",
                    "evidence": ["D1:1"],
                    "category": 4,
                },
                {
                    "question": "Where is Ben's pottery teacher moving?",
                    "answer": "Lisbon",
                    "evidence": ["D2:2"],
                    "category": 4,
                },
                {
                    "question": "What did Pixel break and when did Ana adopt it?",
                    "answer": "x",
                    "evidence": ["D2:1; D1:1"],
                    "category": 1,
                },
            ],
        },
        {
            "sample_id": "conv-b",
            "conversation": {
                "speaker_a": "Cleo",
                "speaker_b": "Dev",
                "session_1_date_time": "9:00 pm on 1 March, 2024",
                "session_1": turns(
                    1,
                    [
                        ("Cleo", "I ran my first marathon in Rotterdam."),
                        ("Dev", "I am learning to play the cello."),
                    ],
                ),
            },
            "qa": [
                {
                    "question": "Which city was Cleo's first marathon in?",
                    "answer": "Rotterdam",
                    "evidence": ["D1:1"],
                    "category": 2,
                },
            ],
        },
    ]
    path.write_bytes(orjson.dumps(samples))
    return path


def test_locomo_loader_reads_sessions_turns_and_evidence(tmp_path: Path) -> None:
    episodes, questions = load(locomo_fixture(tmp_path / "locomo.json"))
    assert [e["id"] for e in episodes if e["group_id"] == "locomo-conv-a"] == [
        "D1:1",
        "D1:2",
        "D2:1",
        "D2:2",
    ]
    assert episodes[0]["reference_time"] == "2023-05-08T13:56:00+00:00"
    assert episodes[2]["reference_time"] == "2023-06-20T10:05:00+00:00"
    assert questions[2].evidence == ("D2:1", "D1:1")  # "D2:1; D1:1" as the file writes it


def test_locomo_recall_on_the_embedded_store(tmp_path: Path) -> None:
    out = tmp_path / "locomo.json.out"
    recipes = "episodes_bm25,episodes_vector,episodes_rrf"
    argv = ["locomo", str(locomo_fixture(tmp_path / "locomo.json")), "--embedder", "minilm",
            "--recipes", recipes, "--json", str(out)]  # fmt: skip
    result = recall_quality.main(argv)
    assert orjson.loads(out.read_bytes())["scores"] == result["scores"]
    scores = result["scores"]
    for recipe in ("episodes_bm25", "episodes_vector", "episodes_rrf"):
        row = scores[f"{recipe} / all"]
        assert row["questions"] == 4 and 0 < row["recall@5"] <= row["recall@20"] <= 1
    assert scores["episodes_rrf / 4 single-hop"]["recall@5"] == 1.0


def test_support_recall_and_as_of_accuracy_on_neo4j(neo4j_uri: str) -> None:
    argv = ["support", "--episodes", "40", "--groups", "2", "--store", "neo4j",
            "--neo4j-uri", neo4j_uri, "--embedder", "hashing",
            "--recipes", "combined,facts_bm25"]  # fmt: skip
    result = recall_quality.main(argv)
    scores = result["scores"]
    assert "0 failed" in result["ingest"]
    combined = scores["combined / all"]
    assert combined["questions"] > 10 and combined["recall@20"] > 0
    assert "asof_accuracy" in scores["combined / now"]


@pytest.mark.parametrize("store", ["neo4j", "embedded"])
def test_latency_on_a_small_group(store: str, neo4j_uri: str) -> None:
    argv = ["--facts", "300", "--queries", "10", "--store", store, "--neo4j-uri", neo4j_uri]
    result = recall_latency.main(argv)
    assert result["facts"] == 300
    for recipe in ("facts_rrf", "combined"):
        search = result[recipe]["search_ms"]
        assert 0 < search["p50"] <= search["p95"] <= search["p99"]


def test_id_questions_reports_accuracy_latency_and_errors() -> None:
    result = id_questions.main(
        ["--subjects", "20", "--changes", "5", "--questions", "20", "--store", "embedded"]
    )
    assert result["facts"] == 300 and result["errors"] == 0
    assert result["first_fact_right"] == {"now": 1.0, "as of": 1.0}  # 20 tickets: each found
    assert set(result["as_of_ms"]) == {"p50", "p95", "p99"}
