"""``tidegraph forget``, ``episodes``, ``groups`` and ``changes`` as an operator runs them, the
installed command on the embedded store (docs/retrieval.md "Browse, forget, follow"): a
forgotten episode is gone from search and from the listing, a subject's dry run writes
nothing, a whole group goes and the others stay, episodes page with the cursor each page
prints, a cursor not given out is one line, a forget that would need a confirmation refuses
without a terminal, and the change stream resumes after a cursor and follows until Ctrl-C.
Through Kafka: a forget is a record on the input topic, and ``changes --via kafka`` reads what
the relay published."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.serve_harness import TIDEGRAPH
from tests.support import crm_feed as crm

pytestmark = pytest.mark.integration

GROUP = "acme"
OTHER = "globex"
AT = [crm.START + timedelta(days=d) for d in range(6)]
RECORDS = [
    crm.plan_record((1, "Acme Corp"), "Basic", AT[0]),
    crm.contact_record("joined", (7, "Dana Reyes"), (1, "Acme Corp"), AT[1]),
    crm.owner_record((1, "Acme Corp"), (3, "Sam Lee"), AT[2]),
    crm.contact_record("joined", (8, "Ravi Shah"), (1, "Acme Corp"), AT[3]),
    crm.plan_record((1, "Acme Corp"), "Pro", AT[4]),
    crm.contact_record("joined", (7, "Dana Reyes"), (1, "Acme Corp"), AT[5]),  # restated
]
IDS = [f"rec-{n}" for n in range(len(RECORDS))]
TIMEOUT = 120


def run(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``tidegraph *args`` in ``folder`` (stdin not a terminal), its store in ``folder/data``."""
    return subprocess.run(
        [TIDEGRAPH, *args],
        cwd=folder,
        env=environment(folder, **env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def environment(folder: Path, **env: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGRAPH_")}
    clean.update(
        {
            "COLUMNS": "200",
            "NO_COLOR": "1",
            "TIDEGRAPH_DATA_DIR": str(folder / "data"),
            "TIDEGRAPH_EMBEDDER": "hashing",
            **env,
        }
    )
    return clean


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def rows(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in ok(result).splitlines() if line.strip()]


def refused(result: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The one ``error:`` line a refused command prints, and its exit code."""
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def listed(folder: Path, *args: str) -> tuple[list[str], str | None]:
    """The episode ids ``episodes --json`` lists (a tombstone: its uuid), and its cursor."""
    *episodes, last = rows(run(folder, "episodes", "--group", GROUP, "--json", *args))
    return [e["episode_id"] if "episode_id" in e else e["uuid"] for e in episodes], last[
        "next_cursor"
    ]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A folder whose embedded store holds the feed for GROUP and one record for OTHER."""
    return ingested(tmp_path)


def ingested(tmp_path: Path, **env: str) -> Path:
    """``store``'s folder, ingested with ``env`` (e.g. a deployment's topic prefix)."""
    (tmp_path / "crm.yaml").write_text(crm.CRM_MAPPING)
    lines = [
        {"id": ident, "group_id": GROUP, "content": record, "reference_time": AT[n].isoformat()}
        for n, (ident, record) in enumerate(zip(IDS, RECORDS, strict=True))
    ]
    other = crm.plan_record((9, "Globex"), "Pro", AT[0])
    lines.append({"id": "g-0", "group_id": OTHER, "content": other, "reference_time": AT[0]})
    (tmp_path / "feed.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    ok(run(tmp_path, "ingest", "feed.jsonl", "--mapping", "crm.yaml", **env))
    return tmp_path


def test_a_forgotten_episode_is_gone_from_search_and_the_listing(store: Path) -> None:
    def owner_facts() -> list[dict[str, Any]]:
        found = rows(run(store, "search", "Sam Lee owner", "--group", GROUP, "--json"))
        return [r for r in found if r["kind"] == "fact" and r.get("relation") == "OWNED_BY"]

    assert [f["episodes"] for f in owner_facts()] == [["rec-2"]]
    assert listed(store) == (IDS, None)

    said = ok(run(store, "forget", "--group", GROUP, "--episode", "rec-2"))
    assert said.startswith("forgot 1 episode of group 'acme':\n  rec-2\n"), said
    assert owner_facts() == []
    assert listed(store) == ([i for i in IDS if i != "rec-2"], None)
    [tombstone], _ = listed(store, "--status", "forgotten")
    shown = rows(run(store, "episodes", "--group", GROUP, "--show", tombstone, "--json"))
    assert shown[0]["status"] == "forgotten" and shown[0]["facts"] == []

    again = run(store, "forget", "--group", GROUP, "--episode", "rec-2")
    assert ok(again).startswith("forgot 0 episodes") and "already forgotten: rec-2" in again.stderr
    never = run(store, "forget", "--group", GROUP, "--episode", "rec-99")
    assert never.returncode == 1 and "not an episode of group 'acme': rec-99" in never.stderr
    # Another tenant's episode is not this group's to forget.
    assert run(store, "forget", "--group", GROUP, "--episode", "g-0").returncode == 1


def test_a_subject_dry_run_writes_nothing_and_without_a_terminal_asks_for_yes(
    store: Path,
) -> None:
    def names() -> set[str]:
        return {e["name"] for e in rows(run(store, "entities", "--group", GROUP, "--json"))}

    dry = rows(
        run(store, "forget", "--group", GROUP, "--subject", "dana reyes", "--dry-run", "--json")
    )
    assert dry == [
        {
            "group_id": GROUP,
            "status": "dry_run",
            "episodes": ["rec-1", "rec-5"],
            "forgotten": 2,
            "facts_removed": dry[0]["facts_removed"],
            "facts_changed": dry[0]["facts_changed"],
            "entities_removed": 1,
            "entities_changed": dry[0]["entities_changed"],
        }
    ]
    text = ok(run(store, "forget", "--group", GROUP, "--subject", "Dana Reyes", "--dry-run"))
    assert "would forget 2 episodes" in text and "dry run: nothing was written" in text
    assert listed(store)[0] == IDS

    asked = run(store, "forget", "--group", GROUP, "--subject", "Dana Reyes")
    refused(asked, 2, "--subject", "terminal", "--yes")
    assert listed(store)[0] == IDS

    by_key = ("--subject", "crm:contact:7", "--yes", "--json")
    done = rows(run(store, "forget", "--group", GROUP, *by_key))
    assert done[0]["status"] == "forgotten" and done[0]["episodes"] == ["rec-1", "rec-5"]
    assert listed(store)[0] == ["rec-0", "rec-2", "rec-3", "rec-4"]
    assert "Dana Reyes" not in names() and {"Acme Corp", "Ravi Shah"} <= names()
    unknown = run(store, "forget", "--group", GROUP, "--subject", "Dana Reyes", "--yes")
    refused(unknown, 1, "has no entity 'Dana Reyes'")


def test_forget_all_takes_the_whole_group_and_leaves_the_others(store: Path) -> None:
    def held() -> dict[str, dict[str, Any]]:
        return {g["group_id"]: g for g in rows(run(store, "groups", "--json"))}

    before = held()
    assert before[GROUP]["episodes"] == len(IDS) and before[OTHER]["episodes"] == 1
    refused(run(store, "forget", "--group", GROUP, "--all"), 2, "--all", "terminal", "--yes")
    assert held() == before

    dry = rows(run(store, "forget", "--group", GROUP, "--all", "--dry-run", "--json"))
    assert dry[0]["episodes"] == IDS and held() == before
    said = ok(run(store, "forget", "--group", GROUP, "--all", "--yes"))
    assert said.startswith("forgot the whole group 'acme': 6 episodes"), said
    after = held()
    assert after[OTHER] == before[OTHER]
    assert (after[GROUP]["episodes"], after[GROUP]["entities"], after[GROUP]["facts"]) == (0, 0, 0)
    assert listed(store) == ([], None)
    assert len(listed(store, "--status", "forgotten")[0]) == len(IDS)  # the tombstones stay
    ok(run(store, "forget", "--group", GROUP, "--all", "--purge", "--yes"))
    assert listed(store, "--status", "forgotten") == ([], None)
    assert held()[OTHER] == before[OTHER]


def test_episodes_page_with_the_printed_cursor_and_refuse_one_not_given_out(
    store: Path,
) -> None:
    first, cursor = listed(store, "--limit", "4")
    assert first == IDS[:4] and cursor is not None
    rest, end = listed(store, "--limit", "4", "--cursor", cursor)
    assert rest == IDS[4:] and end is None
    table = ok(run(store, "episodes", "--group", GROUP, "--limit", "4"))
    assert (
        f"4 episodes; next page: tidegraph episodes --group acme --limit 4 --cursor {cursor}"
        in table
    )
    since = listed(store, "--since", AT[2].isoformat(), "--until", AT[4].isoformat())
    assert since == (["rec-2", "rec-3"], None)

    for bad in ("not-a-cursor", cursor[:-6]):
        refused(run(store, "episodes", "--group", GROUP, "--cursor", bad), 2, "--cursor")
    other = run(store, "episodes", "--group", OTHER, "--cursor", cursor)
    refused(other, 2, "--cursor", "another group")
    # A cursor of the group's own at a time out of range (issue 48: an OverflowError), and
    # times out of range as options: one line each.
    for at in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
        forged = "ep1." + base64.urlsafe_b64encode(orjson.dumps([GROUP, at, "x"])).decode()
        refused(run(store, "episodes", "--group", GROUP, "--cursor", forged), 2, "--cursor")
        for option in ("--since", "--until"):
            out_of_range = run(store, "episodes", "--group", GROUP, option, at)
            refused(out_of_range, 2, option, "out of range")
        refused(run(store, "facts", "--group", GROUP, "--valid-at", at), 2, "out of range")
    refused(run(store, "episodes", "--group", GROUP, "--status", "gone"), 2, "--status")


def _ctrl_c_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_changes_resume_after_a_cursor_and_follow_until_ctrl_c(store: Path) -> None:
    *history, last = rows(run(store, "changes", "--group", GROUP, "--json"))
    cursor = last["cursor"]
    assert [c["seq"] for c in history] == list(range(1, cursor + 1))
    assert {c["group_id"] for c in history} == {GROUP}
    assert rows(run(store, "changes", "--group", GROUP, "--after", str(cursor), "--json")) == [
        {"cursor": cursor}
    ]
    brief = ok(run(store, "changes", "--group", GROUP, "--after", str(cursor - 1)))
    assert brief.splitlines()[-1] == f"cursor {cursor}: resume with --after {cursor}"
    assert brief.startswith(f"#{cursor} "), brief

    follow = subprocess.Popen(
        [TIDEGRAPH, "changes", "--group", GROUP, "--after", str(cursor - 1), "--follow", "--json"],
        cwd=store,
        env=environment(store),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As in a terminal: Ctrl-C is not ignored, even when this test runs in a shell's
        # background job (which starts with SIGINT ignored, and a child inherits that).
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )
    watchdog = threading.Timer(TIMEOUT, follow.kill)  # a hang fails the test, never blocks it
    watchdog.start()
    try:
        assert follow.stdout is not None
        assert orjson.loads(follow.stdout.readline())["seq"] == cursor  # it is following
        ok(run(store, "forget", "--group", GROUP, "--episode", "rec-2"))
        seen: list[dict[str, Any]] = []
        while not seen or seen[-1]["kind"] != "episode.forgotten":
            seen.append(orjson.loads(follow.stdout.readline()))
        follow.send_signal(signal.SIGINT)
        out, errors = follow.communicate(timeout=TIMEOUT)
    finally:
        watchdog.cancel()
        follow.kill()
    assert follow.returncode == 0 and "Traceback" not in errors, errors
    assert [c["seq"] for c in seen] == list(range(cursor + 1, cursor + 1 + len(seen)))
    assert seen[-1]["episode_id"] == "rec-2"
    assert orjson.loads(out.splitlines()[-1]) == {"cursor": seen[-1]["seq"]}
    after = rows(run(store, "changes", "--group", GROUP, "--after", str(cursor), "--json"))
    assert after == [*seen, {"cursor": seen[-1]["seq"]}]


def test_forget_and_changes_through_kafka(
    tmp_path: Path, kafka_bootstrap: str, topic_prefix: str
) -> None:
    import asyncio

    kafka = {
        "TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "TIDEGRAPH_TOPIC_PREFIX": topic_prefix,
        "TIDEGRAPH_PARTITIONS": "2",
    }
    # Written in-process by the deployment of this prefix: its workers' relay publishes it.
    store = ingested(tmp_path, TIDEGRAPH_TOPIC_PREFIX=topic_prefix)
    asked = ("--episode", "rec-2", "--via", "kafka", "--json")
    queued = rows(run(store, "forget", "--group", GROUP, *asked, **kafka))
    assert queued[0]["status"] == "queued" and queued[0]["topic"] == f"{topic_prefix}.episodes"
    record = asyncio.run(_read_record(kafka_bootstrap, queued[0]))
    assert orjson.loads(record) == {"forget": {"group_id": GROUP, "episode_ids": ["rec-2"]}}
    assert listed(store)[0] == IDS  # the worker that owns the group runs it, not this command

    published = asyncio.run(_relay(store, kafka_bootstrap, topic_prefix))
    *from_store, _ = rows(run(store, "changes", "--group", GROUP, "--after", "3", "--json"))
    assert published > len(from_store) > 0
    *from_topic, last = rows(
        run(store, "changes", "--group", GROUP, "--after", "3", "--via", "kafka", "--json", **kafka)
    )
    assert from_topic == from_store and last == {"cursor": from_store[-1]["seq"]}
    nowhere = {**kafka, "TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    for args in (("changes", "--via", "kafka"), ("forget", "--episode", "rec-3", "--via", "kafka")):
        unreachable = run(store, *args, "--group", GROUP, **nowhere)
        refused(unreachable, 1, "could not reach Kafka at 127.0.0.1:1", "TIDEGRAPH_KAFKA")


async def _read_record(bootstrap: str, queued: dict[str, Any]) -> bytes:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    place = TopicPartition(queued["topic"], queued["partition"])
    await consumer.start()
    try:
        consumer.assign([place])
        consumer.seek(place, queued["offset"])
        message = await consumer.getone()
        assert message.value is not None
        return message.value
    finally:
        await consumer.stop()


async def _relay(folder: Path, bootstrap: str, prefix: str) -> int:
    """What a worker's relay does: the outbox of every group of the deployment published to
    the changes topic."""
    from tidegraph.embed import make_embedder
    from tidegraph.pipelines.streaming.relay import relay_changes
    from tidegraph.settings import Settings
    from tidegraph.stores import open_store
    from tidegraph.topics.client import ensure_all_topics, producer_for

    settings = Settings(
        data_dir=folder / "data",
        kafka_bootstrap_servers=bootstrap,
        topic_prefix=prefix,
        partitions=2,
        embedder="hashing",
    )
    await ensure_all_topics(settings)
    store = open_store(settings)
    producer = producer_for(settings)
    await producer.start()
    try:
        assert await store.open_existing(make_embedder(settings).dim)
        topic = f"{prefix}.changes"

        async def send(key: bytes, value: bytes) -> Any:
            return await producer.send(topic, value, key=key)

        return await relay_changes(store.outbox, send, {0, 1}, 2)
    finally:
        await producer.stop()
        await store.close()
