"""Each non-Graphiti benchmark on a tiny input, so that they keep working (issue 8, part 4).

They run through their ``main(argv)`` against the real broker and server of the fixtures and
write their JSON into the test's folder. No timing thresholds: only that each finishes, exits
0 and writes the keys docs/performance.md's figures are read from.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from benchmarks import community_drift, embedders, mapped_ingest, source_stages, throughput

pytestmark = pytest.mark.integration


def read(path: Path) -> dict[str, Any]:
    assert path.exists(), f"{path} was not written"
    document = orjson.loads(path.read_bytes())
    assert isinstance(document, dict)
    return document


def test_throughput_every_path_on_a_tiny_feed(
    kafka_bootstrap: str, neo4j_uri: str, tmp_path: Path
) -> None:
    out = tmp_path / "throughput.json"
    argv = ["--records", "40", "--groups", "4", "--partitions", "2", "--latency-seconds", "2",
            "--neo4j-uri", neo4j_uri, "--bootstrap", kafka_bootstrap,
            "--out", str(out), "--work-dir", str(tmp_path / "work")]  # fmt: skip
    assert throughput.main(argv) == 0
    document = read(out)
    assert {"command", "machine", "feed", "paths"} <= set(document)
    assert document["feed"]["records"] == 40 and document["machine"]["cpus"]
    paths = document["paths"]
    assert list(paths) == list(throughput.PATHS)
    for name, result in paths.items():
        assert result["events_per_s"] > 0, name
        assert result["fraction_of_raw"] > 0, name
        assert {"seconds", "wall_seconds"} <= set(result), name
    raw = paths["raw"]
    assert raw["written_ok"] and raw["rows_per_s"] > 0 and raw["rows"]["episodes"] == 40
    for name in ("embedded", "neo4j", "kafka-1w", "kafka-2w"):
        check = paths[name]["check"]
        assert check["subjects_checked"] > 0 and check["subjects_wrong"] == 0, (name, check)
        assert paths[name]["peak_rss_mb"] > 0, name
    for name in ("embedded", "neo4j"):
        assert paths[name]["client_cpu_ms_per_record"] > 0, name
    for name, workers in (("kafka-1w", 1), ("kafka-2w", 2)):
        result = paths[name]
        assert len(result["workers_peak_rss_mb"]) == workers
        assert result["worker_exit_codes"] == [0] * workers
        assert result["offered_rate"] > 0
        latency = result["latency_s"]
        assert 0 < latency["p50"] <= latency["p99"], latency
        # the tail the p99 reads, each episode with when it was produced
        slowest = latency["slowest"]
        assert slowest and min(s["latency_s"] for s in slowest) >= latency["p99"], latency
        assert max(s["latency_s"] for s in slowest) == latency["max"], latency
        assert result["maximum"]["processed"] == 40 and result["dead_lettered"] == 0
        # where the CPU went in each phase: the workers' own time, per record
        for phase in ("maximum", "paced"):
            cpu = result[phase]["cpu"]
            assert set(cpu["cpu_ms_per_record"]) <= {"neo4j", "workers", "kafka", "harness"}
            assert cpu["cpu_ms_per_record"]["workers"] > 0, (name, phase, cpu)
            assert cpu["idle_share"] >= 0, (name, phase, cpu)


def test_throughput_shows_the_change_stream_on_and_off_side_by_side(
    neo4j_uri: str, tmp_path: Path
) -> None:
    out = tmp_path / "throughput.json"
    argv = ["--records", "40", "--groups", "4", "--paths", "raw,embedded,neo4j",
            "--stream", "both", "--neo4j-uri", neo4j_uri, "--out", str(out)]  # fmt: skip
    assert throughput.main(argv) == 0
    paths = read(out)["paths"]
    assert list(paths) == ["raw", "embedded", "embedded/off", "neo4j", "neo4j/off"]
    for name in ("embedded", "neo4j"):
        on, off = paths[name], paths[f"{name}/off"]
        assert on["check"]["subjects_wrong"] == off["check"]["subjects_wrong"] == 0
        assert on["fraction_of_raw"] > 0 and off["fraction_of_raw"] > 0
        assert on["changes"] > 40 and off["changes"] == 0, name  # the stream is on, then off
    assert "in-process -> Neo4j, change stream off" in throughput.table(read(out))


def test_mapped_ingest_runs_one_in_process_path(tmp_path: Path) -> None:
    out = tmp_path / "mapped_ingest.json"
    argv = ["--records", "24", "--groups", "2", "--store", "embedded", "--out", str(out)]
    assert mapped_ingest.main(argv) == 0
    document = read(out)
    assert document["records"] == 24 and document["events_per_s"] > 0
    assert document["failures"] == 0 and document["check"]["subjects_wrong"] == 0
    assert document["peak_rss_mb"] > 0


def test_source_stages_benchmark_writes_every_paths_stages(tmp_path: Path) -> None:
    out = tmp_path / "stages.json"
    assert source_stages.main(["--records", "40", "--repeat", "1", "--out", str(out)]) == 0
    document = read(out)
    assert document["changes"] == 40
    paths = document["us_per_change"]
    assert set(paths) == {"envelope", "debezium-json", "debezium-avro"}
    for stages in paths.values():
        assert stages["total"] > 0 and "mapping" in stages and "encode_extracted" in stages
    assert {"decode_value", "decode_value_whole", "episode"} <= set(paths["debezium-json"])


def test_embedders_benchmark_writes_speeds(tmp_path: Path) -> None:
    out = tmp_path / "embedders.json"
    assert embedders.main(["-n", "8", "--out", str(out)]) == 0
    document = read(out)
    assert {"cpus", "python", "results"} <= set(document)
    assert len(document["results"]) == 2
    for result in document["results"]:
        assert {"model", "load_s", "short_per_s", "long_per_s"} <= set(result)
        assert result["short_per_s"] > 0 and result["long_per_s"] > 0


def tiny_temporal_facts(path: Path, n: int = 240) -> Path:
    """A YAGO11k-shaped TSV: a few clusters of entities whose facts start and end over time."""
    rng = random.Random(3)
    lines = ["subject\trelation\tobject\tstart_year\tend_year\tsplit"]
    for i in range(n):
        cluster = rng.randrange(6)
        a, b = rng.sample(range(12), 2)
        start = 1950 + i // 4
        end = 3000 if rng.random() < 0.7 else start + rng.randint(1, 8)
        lines.append(f"c{cluster}e{a}\trel\tc{cluster}e{b}\t{start}\t{end}\ttrain")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_community_drift_benchmark_writes_checkpoints(tmp_path: Path) -> None:
    out = tmp_path / "community_drift.json"
    data = tiny_temporal_facts(tmp_path / "facts.tsv")
    assert community_drift.main(["--data", str(data), "--out", str(out)]) == 0
    document = read(out)
    assert document["facts"] == 240
    assert set(document["runs"]) == {"on", "off"}
    for points in document["runs"].values():
        assert points, "no checkpoint"
        assert {"facts", "year", "nodes", "ari_live", "nmi_live", "refresh_seconds"} <= set(
            points[-1]
        )
        assert points[-1]["facts"] == 240
