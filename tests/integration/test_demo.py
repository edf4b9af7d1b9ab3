"""`tidegraph demo`, end to end: a subprocess on the embedded store and the bundled MiniLM.

No Kafka or Neo4j is involved. The expected answers are computed here from the sample feed
itself (crm_feed.jsonl, in delivery order), never from the demo's code, and compared with what
the demo reads back from its graph.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.extraction_requests import episodes_asked, on_extraction
from tests.support.fake_llm import FakeRequest, ScriptedLLMServer
from tidegraph.app import demo
from tidegraph.processors.mapping import MappingSet
from tidegraph.records.episode import parse_episode

TIDEGRAPH = Path(sys.executable).parent / "tidegraph"
DEMO_TIMEOUT = 180


# ----------------------------------------------------------------------------- the feed, by hand
@dataclass(frozen=True)
class PlanRecord:
    delivered: int  # position in the feed (delivery order)
    effective: datetime  # when the plan took effect (the record's own date field)
    plan: str


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def feed_records() -> list[dict[str, Any]]:
    lines = demo.FEED_FILE.read_bytes().splitlines()
    return [orjson.loads(line) for line in lines if line.strip()]


def plan_records(group: str, account_id: str) -> list[PlanRecord]:
    """The account's plan records, in delivery order, with their effective dates."""
    found = []
    for n, record in enumerate(feed_records()):
        content = record["content"]
        if record["group_id"] != group or content.get("account", {}).get("id") != account_id:
            continue
        if content["type"] == "account.created":
            found.append(PlanRecord(n, _when(content["created_at"]), content["plan"]))
        elif content["type"] == "account.plan_changed":
            found.append(PlanRecord(n, _when(content["changed_at"]), content["plan"]))
    return found


def plan_at(records: list[PlanRecord], when: datetime | None = None) -> str:
    """The plan in force at ``when`` (None: the latest), whatever the delivery order."""
    in_force = [r for r in records if when is None or r.effective <= when]
    return max(in_force, key=lambda r: r.effective).plan


def late_records(records: list[PlanRecord]) -> list[tuple[PlanRecord, datetime]]:
    """Records delivered after a record with a later effective date, with the date their plan
    ended (the next effective date among all the account's records)."""
    late = []
    for r in records:
        if any(o.delivered < r.delivered and o.effective > r.effective for o in records):
            end = min(o.effective for o in records if o.effective > r.effective)
            late.append((r, end))
    return late


def belief_before_current(records: list[PlanRecord]) -> str:
    """The plan tidegraph should have believed current just before it received the record of
    today's plan: the latest effective plan among the records delivered before that one."""
    current = max(records, key=lambda r: r.effective)
    earlier = [r for r in records if r.delivered < current.delivered]
    return max(earlier, key=lambda r: r.effective).plan


# ----------------------------------------------------------------------------- running the demo
def demo_env(**extra: str) -> dict[str, str]:
    """The caller's environment without any TIDEGRAPH_* setting (no LLM), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGRAPH_")}
    env.update({"COLUMNS": "100", "NO_COLOR": "1", **extra})
    return env


def run_demo(
    tmp_path: Path, env: dict[str, str], prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    command = [*prefix, str(TIDEGRAPH), "demo", "--data-dir", str(tmp_path / "graph")]
    return subprocess.run(
        command,
        cwd=tmp_path,  # no .env of the repository is read
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
        check=False,
    )


def flat(text: str) -> str:
    return " ".join(text.split())


def assert_answers(output: str) -> None:
    """The as-of, late-arrival and known-at answers the feed implies, as the demo prints them."""
    out = flat(output)
    featured = plan_records(demo.DEMO_GROUP, demo.FEATURED_ACCOUNT_ID)
    then, now = plan_at(featured, demo.AS_OF), plan_at(featured)
    assert then != now, "the sample feed must make the as-of answer differ from today's"
    assert (
        f"On {demo.AS_OF:%Y-%m-%d} Acme Corp was on the {then} plan; now it is on the {now} plan."
        in out
    ), output

    late = plan_records(demo.DEMO_GROUP, demo.LATE_ACCOUNT_ID)
    then, now = plan_at(late, demo.LATE_AS_OF), plan_at(late)
    assert then != now
    assert (
        f"On {demo.LATE_AS_OF:%Y-%m-%d} Globex was on the {then} plan; now it is on the {now} plan."
        in out
    ), output
    (record, end), *_ = late_records(late)
    assert (
        f"Globex's move to {record.plan} (from {record.effective:%Y-%m-%d}) was delivered after "
        f"a later change, so tidegraph stored it already closed: "
        f"valid {record.effective:%Y-%m-%d} -> {end:%Y-%m-%d}." in out
    ), output

    believed = belief_before_current(featured)
    assert re.search(
        rf"just before tidegraph learned of the move to {plan_at(featured)}, Acme Corp was on "
        rf"the {believed} plan; as known now, it is on the {plan_at(featured)} plan\.",
        out,
    ), output


# ----------------------------------------------------------------------------- tests
def test_sample_feed_is_fully_mapped_and_has_a_late_record() -> None:
    mappings = MappingSet.load(demo.MAPPING_FILE)
    records = feed_records()
    assert 40 <= len(records) <= 80
    assert len({r["group_id"] for r in records}) >= 2
    for line in demo.FEED_FILE.read_bytes().splitlines():
        extraction = mappings.extract(parse_episode(line))
        assert extraction is not None and extraction.facts, line
    assert late_records(plan_records(demo.DEMO_GROUP, demo.LATE_ACCOUNT_ID))
    messages = demo.MESSAGES_FILE.read_bytes().splitlines()
    assert messages and all(parse_episode(m).source == "message" for m in messages)


def test_scaled_feed_keeps_the_sample_and_renames_the_copies() -> None:
    records = list(demo.scaled_feed(500))
    assert len(records) == 500
    assert len({r["id"] for r in records}) == 500
    assert records[0] == feed_records()[0]
    mappings = MappingSet.load(demo.MAPPING_FILE)
    for record in records:
        assert mappings.extract(parse_episode(record)) is not None
    times = [r["reference_time"] for r in records if "redelivered" not in r["source_description"]]
    assert times == sorted(times)


def test_demo_prints_the_graph_and_as_of_answers_matching_the_feed(tmp_path: Path) -> None:
    result = run_demo(tmp_path, demo_env())
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert_answers(out)
    records = feed_records()
    assert f"{len(records)} episodes (0 already processed)" in out
    assert "0 failed" in out and "events/s" in out
    assert re.search(r"all-MiniLM-L6-v2-int8 \(bundled, offline\), loaded in \d+\.\d\d s", out)
    messages = len(demo.MESSAGES_FILE.read_bytes().splitlines())
    assert f"Stored {messages} ticket messages (ticket_messages.jsonl) without extraction" in out
    assert "TIDEGRAPH_LLM_BASE_URL" in out and "TIDEGRAPH_LLM_API_KEY" in out
    assert "Extracting" not in out and "Facts extracted live" not in out
    for title in ("Entities of northwind", "Facts of northwind valid now", "History of Acme"):
        assert title in out
    # The recall ends the demo: the unextracted ticket message about the SSO lock-out is
    # found by its words, and the plan fact from the CRM feed by the graph.
    recall = out.split("Recall: what an agent answering the ticket puts in its prompt")[1]
    assert "FACTS (when each was true):" in recall and "EPISODES:" in recall
    assert "sign in with SSO" in recall
    assert re.search(r"Acme Corp .*Enterprise", recall), recall
    assert "crm:account:nw-a-001" in out  # keys are printed as data, never as emoji codes
    # the closing hint is a command that runs as printed (tidegraph is not on PATH here)
    hint = flat(out).split("Query it yourself: ")[1].split(" (also")[0]
    assert hint.split()[0] != "tidegraph", hint
    ran = subprocess.run(
        shlex.split(hint), cwd=tmp_path, env=demo_env(), capture_output=True, text=True,
        timeout=DEMO_TIMEOUT, check=False,
    )  # fmt: skip
    assert ran.returncode == 0 and "HAS_PLAN" in ran.stdout, (hint, ran.stdout, ran.stderr)
    # A ticket asked by its id after the demo comes first, before the tickets whose ids are
    # merely similar (every ticket of the tenant shares "NW"), however the id is typed.
    for asked in ("NW-1002", "What is ticket NW-1002 about?", "nw1002", "1002"):
        search = [str(TIDEGRAPH), "search", "--data-dir", str(tmp_path / "graph"),
                  "--group", demo.DEMO_GROUP, "--json", asked]  # fmt: skip
        found = subprocess.run(
            search, cwd=tmp_path, env=demo_env(), capture_output=True, text=True,
            timeout=DEMO_TIMEOUT, check=False,
        )  # fmt: skip
        assert found.returncode == 0, found.stderr
        first = orjson.loads(found.stdout.splitlines()[0])
        assert "NW-1002" in first["text"], (asked, found.stdout)


def test_demo_runs_with_the_network_off(tmp_path: Path) -> None:
    """Nothing is downloaded at run time: the demo works in a network namespace with no
    interfaces up, and with an empty HOME and caches."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("`unshare` is not installed (util-linux): the offline check cannot run")
    probe = subprocess.run([unshare, "-n", "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.fail(
            f"`unshare -n` is not permitted here ({probe.stderr.strip()}): the offline check "
            "needs root or CAP_SYS_ADMIN"
        )
    home = tmp_path / "home"
    home.mkdir()
    env = demo_env(
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        HF_HOME=str(home / "hf"),
    )
    result = run_demo(tmp_path, env, prefix=(unshare, "-n"))
    assert result.returncode == 0, result.stderr
    assert_answers(result.stdout)


# ----------------------------------------------------------------------------- live LLM path
_SPEAKER = re.compile(r"^(?P<speaker>[^()\n]+?) \((?P<org>[^)]+)\): (?P<body>.+)$", re.MULTILINE)
_TICKET = re.compile(r"\b([A-Z]{2}-\d+)\b")


def _current_episode(user: str) -> str:
    return user.split("Current episode", 1)[1].split("\n", 1)[1]


def extract(request: FakeRequest) -> dict[str, Any]:
    """A scripted extraction: the speaker, the ticket they name and one fact linking them."""
    text = _current_episode(request.user)
    match = _SPEAKER.search(text)
    assert match, text
    speaker, body = match["speaker"].strip(), match["body"]
    ticket = f"Ticket {_TICKET.search(body)[1]}"  # type: ignore[index]
    return {
        "entities": [
            {"name": speaker, "type": "Person", "summary": f"writes about {ticket}"},
            {"name": ticket, "type": "Ticket", "summary": None},
        ],
        "facts": [
            {
                "subject": speaker,
                "relation": "COMMENTED_ON",
                "object": ticket,
                "fact": f"{speaker} commented on {ticket}: {body.split('.')[0]}",
                "valid_at": None,
                "invalid_at": None,
            }
        ],
    }


def _indexed(lines: Iterator[str]) -> dict[int, str]:
    names = {}
    for line in lines:
        found = re.match(r"^\[(\d+)\] (.+?)(?: \([^)]*\))?:", line)
        if found:
            names[int(found[1])] = found[2].casefold()
    return names


def resolve(request: FakeRequest) -> dict[str, Any]:
    """Same entity when the names are equal (case aside)."""
    existing, new = request.user.split("New entities:")
    candidates = {name: i for i, name in _indexed(iter(existing.splitlines())).items()}
    return {
        "matches": [
            {"entity": i, "duplicate_of": candidates.get(name)}
            for i, name in _indexed(iter(new.splitlines())).items()
        ]
    }


def test_demo_extracts_ticket_messages_live_when_an_llm_is_configured(tmp_path: Path) -> None:
    with ScriptedLLMServer(model="scripted-model") as server:
        on_extraction(server, extract)
        server.on("EntityResolutionOutput", resolve)
        server.on("FactResolutionOutput", lambda _: {"judgements": []})
        env = demo_env(
            COLUMNS="200",
            NO_PROXY="127.0.0.1",
            TIDEGRAPH_LLM_BASE_URL=server.base_url,
            TIDEGRAPH_LLM_API_KEY="test",
            TIDEGRAPH_LLM_MODEL="scripted-model",
        )
        result = run_demo(tmp_path, env)
        extractions = episodes_asked(server)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    messages = len(demo.MESSAGES_FILE.read_bytes().splitlines())
    assert extractions == messages
    assert f"Extracting {messages} ticket messages live with scripted-model" in out
    assert "Skipped" not in out
    live = out.split("Facts extracted live from the ticket messages")[1]
    assert "Fatima Khan" in live and "COMMENTED_ON" in live and "Ticket NW-1002" in live
    assert_answers(out)  # the mapped answers do not change with an LLM
