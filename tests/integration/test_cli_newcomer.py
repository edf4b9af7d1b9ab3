"""The ``tidegraph`` command as a newcomer meets it (issue 31): the installed command, run in a
fresh folder with none of the project's settings. Reads of a store that does not exist, and
commands whose Kafka or Neo4j is not there (the lifecycle commands of issue 34 too), say so in
one line and create nothing; one episode shape for ``ingest`` and the HTTP API; mapped keys
that keep their integers; ``--version``, ``--data-dir``, plain help and whole dates.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson

from tests.integration.serve_harness import TIDEGRAPH
from tests.support.crm_feed import CRM_MAPPING
from tests.support.metrics import free_port
from tidegraph.records import jsontext

TIMEOUT = 120


def run(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``tidegraph *args`` in ``folder``, with no TIDEGRAPH_* setting but ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGRAPH_")}
    clean.update({"COLUMNS": "80", "NO_COLOR": "1", "TIDEGRAPH_EMBEDDER": "hashing", **env})
    return subprocess.run(
        [TIDEGRAPH, *args],
        cwd=folder,
        env=clean,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout and "Unclosed" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_reads_of_a_store_never_written_say_so_and_create_nothing(tmp_path: Path):
    for args in (
        ("facts", "--group", "G"),
        ("entities", "--group", "G"),
        ("communities", "list", "--group", "G"),
        ("communities", "--group", "G"),
        ("search", "anything", "--group", "G"),
        ("facts", "--group", "G", "--data-dir", "elsewhere"),
        ("episodes", "--group", "G"),
        ("groups",),
        ("changes", "--group", "G", "--follow"),
        ("forget", "--group", "G", "--episode", "e1"),
        ("forget", "--group", "G", "--all", "--yes"),
    ):
        line = one_line_error(run(tmp_path, *args), "no tidegraph store in")
        assert str(tmp_path) in line, line
        assert list(tmp_path.iterdir()) == [], args  # no .tidegraph/, no elsewhere/


def test_commands_without_their_kafka_or_neo4j_say_which_in_one_line(tmp_path: Path):
    nowhere = f"127.0.0.1:{free_port()}"
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text('{"id": "e1", "group_id": "g", "content": "x", "reference_time": "2025"}\n')
    sources = tmp_path / "sources.yaml"
    sources.write_text("sources:\n  - {name: a, topics: [t], group: g}\n")
    kafka = {"TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS": nowhere}
    for args in (
        ("dlq", "list"),
        ("dlq", "replay"),
        ("produce", str(episodes)),
        ("changes", "--group", "g", "--via", "kafka"),
        ("sources", "check", str(sources)),
    ):
        one_line_error(run(tmp_path, *args, **kafka), nowhere, "TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS")
    neo4j = {"TIDEGRAPH_STORE": "neo4j", "TIDEGRAPH_NEO4J_URI": f"bolt://{nowhere}"}
    for args in (
        ("facts", "--group", "g"),
        ("search", "x", "--group", "g"),
        ("ingest", str(episodes)),
        ("extract", "--pending"),
        ("communities", "refresh", "--group", "g"),
        ("episodes", "--group", "g"),
        ("changes", "--group", "g"),
        ("forget", "--group", "g", "--episode", "e1"),
    ):
        one_line_error(run(tmp_path, *args, **neo4j), nowhere, "TIDEGRAPH_NEO4J_URI")
    # nothing created
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episodes.jsonl", "sources.yaml"]


def test_ingest_takes_the_episode_as_the_http_api_takes_it(tmp_path: Path):
    body = {  # POST /v1/episodes' body: episode_id, no source, plus the group
        "episode_id": "chat-1",
        "group_id": "acme",
        "content": "Dana: Harbor moved to quarterly invoicing",
        "reference_time": "2025-02-03T10:00:00Z",
    }
    (tmp_path / "one.jsonl").write_bytes(orjson.dumps(body) + b"\n")
    ingested = run(tmp_path, "ingest", "one.jsonl")
    assert ingested.returncode == 0, ingested.stderr
    found = run(tmp_path, "search", "quarterly invoicing", "--group", "acme", "--json")
    assert found.returncode == 0, found.stderr
    hits = [orjson.loads(line) for line in found.stdout.splitlines()]
    assert [h["episode_id"] for h in hits if h["kind"] == "episode"] == ["chat-1"]


def test_mapped_keys_take_each_id_exactly_as_sent(tmp_path: Path):
    """Big integers are read exactly, 7.0 is not 7, a padded "7 " is refused (issue 48)."""
    (tmp_path / "mapping.yaml").write_text(CRM_MAPPING)
    ids = [2**64, 2**64 + 1, 7, 7.0, "7 ", "7"]
    lines = []
    for n, account in enumerate(ids):
        at = f"2025-01-{n + 1:02d}T00:00:00+00:00"
        record = {"type": "account.plan", "account": {"id": account, "name": f"Account {n}"},
                  "plan": "Pro", "at": at}  # fmt: skip
        episode = {"id": f"r{n}", "group_id": "crm", "content": record, "reference_time": at}
        lines.append(jsontext.dumps(episode))  # integers of 65 bits as their digits
    (tmp_path / "crm.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    ingested = run(tmp_path, "ingest", "crm.jsonl", "--mapping", "mapping.yaml")
    assert "Traceback" not in ingested.stderr, ingested.stderr
    assert "mapping_bad_value" in ingested.stdout + ingested.stderr, ingested
    assert "kept exactly as sent" in ingested.stdout + ingested.stderr, ingested
    listed = run(tmp_path, "entities", "--group", "crm", "--json")
    keys = sorted(orjson.loads(line)["key"] or "" for line in listed.stdout.splitlines())
    assert [k for k in keys if k.startswith("crm:account:")] == [
        f"crm:account:{2**64}",
        f"crm:account:{2**64 + 1}",
        "crm:account:7",  # 7 and "7": a template writes both as 7
        "crm:account:7.0",
    ]


def test_version_data_dir_plain_help_and_whole_dates(tmp_path: Path):
    version = run(tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.startswith("tidegraph "), version
    listed = run(tmp_path, "--help").stdout
    assert all(f" {c} " in listed for c in ("forget", "episodes", "groups", "changes")), listed
    for command in ("facts", "search", "entities", "ingest", "dlq list", "forget", "episodes"):
        helped = run(tmp_path, *command.split(), "--help")
        assert helped.returncode == 0 and "<bool>" not in helped.stdout, helped.stdout
    assert "--data-dir" in run(tmp_path, "search", "--help").stdout
    (tmp_path / "mapping.yaml").write_text(CRM_MAPPING)
    record = {"type": "account.plan", "account": {"id": 1, "name": "Acme Corporation Worldwide"},
              "plan": "Enterprise Unlimited", "at": "2025-02-10T00:00:00+00:00"}  # fmt: skip
    episode = {"id": "p1", "group_id": "crm", "content": record, "reference_time": record["at"]}
    (tmp_path / "crm.jsonl").write_bytes(orjson.dumps(episode) + b"\n")
    env = {"TIDEGRAPH_DATA_DIR": str(tmp_path / "memory")}
    assert run(tmp_path, "ingest", "crm.jsonl", "--mapping", "mapping.yaml", **env).returncode == 0
    shown = run(tmp_path, "facts", "--group", "crm", "--data-dir", "memory")
    assert shown.returncode == 0, shown.stderr
    assert "2025-02-10 – now" in shown.stdout, shown.stdout  # 80 columns: the date stays whole
    searched = run(tmp_path, "search", "Acme plan", "--group", "crm", "--data-dir", "memory")
    assert "2025-02-10 – now" in searched.stdout, searched.stdout
    listed = run(tmp_path, "entities", "--group", "crm", "--data-dir", "memory", "--json")
    assert "Acme Corporation Worldwide" in listed.stdout
