"""The streaming topology on the real broker and Neo4j, workers as subprocesses (issue 5).

Most tests use the mapped CRM feed of ``benchmarks.kafka_throughput`` (no LLM); the LLM test
uses the scripted OpenAI-compatible server. Graphs are compared through the store API
(``graph_compare``); every wait is a condition polled with a deadline.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import orjson
import pytest
from aiokafka.partitioner import DefaultPartitioner

from tests.integration.graph_compare import comparable, creation_order_problems, exact
from tests.integration.topology_harness import PARTITIONS, Topology, Worker, eventually
from tests.support.crm_feed import CRM_MAPPING, crm_feed, plan_record
from tests.support.extraction_requests import (
    EXTRACTION,
    JOINT_EXTRACTION,
    on_extraction,
    split_joint_user,
)
from tests.support.fake_llm import FakeRequest, ScriptedLLMServer
from tidegraph.pipelines.ingest import ingest
from tidegraph.pipelines.runtime import open_runtime
from tidegraph.records.episode import MAX_CONTENT_CHARS, Episode
from tidegraph.settings import Settings

pytestmark = pytest.mark.integration

EPISODES = 200
GROUPS = 10


def group(run: str, i: int) -> str:
    return f"{run}-tenant-{i:02d}"


@pytest.fixture(scope="module")
async def reference(neo4j_uri: str, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Any]:
    """The in-process run of the 200-episode feed: comparable snapshots per group index."""
    run = f"ref{uuid.uuid4().hex[:10]}"
    tmp = tmp_path_factory.mktemp("reference")
    mapping = tmp / "mapping.yaml"
    mapping.write_text(CRM_MAPPING)
    settings = Settings(store="neo4j", neo4j_uri=neo4j_uri, embedder="hashing", data_dir=tmp)
    runtime = await open_runtime(settings, mapping_path=mapping, use_llm=False)
    try:
        episodes = [Episode.model_validate(e) for e in crm_feed(EPISODES, GROUPS, run=run)]
        report = await ingest(runtime.runner(), episodes, concurrency=8)
        assert not report.failures, report.failures
        return {i: await comparable(runtime.store, group(run, i)) for i in range(GROUPS)}
    finally:
        for i in range(GROUPS):
            await runtime.store.forget.delete_group(group(run, i))
        await runtime.close()


def covering_run(run: str, partitions: int = PARTITIONS) -> str:
    """A run id (prefix ``run``) whose feed's group ids hash onto every partition, so that
    every worker sharing the partitions has groups to process."""
    for k in range(1000):
        candidate = f"{run}x{k}"
        keys = [group(candidate, i).encode() for i in range(GROUPS)]
        hit = {DefaultPartitioner()(key, list(range(partitions)), []) for key in keys}
        if len(hit) == partitions:
            return candidate
    raise AssertionError("no covering run id found")


async def assert_matches_reference(
    topo: Topology, reference: dict[int, Any], run: str | None = None
) -> None:
    run = run or topo.run
    store = topo.store()
    try:
        for i in range(GROUPS):
            got = await comparable(store, group(run, i))
            assert got == reference[i], f"group {i} differs from the in-process run"
            assert await creation_order_problems(store, group(run, i)) == []
    finally:
        await store.close()


def events(worker: Worker, stage: str, outcome: str) -> float:
    return worker.value("tidegraph_stage_events_total", stage=stage, outcome=outcome)


async def exact_graph(topo: Topology) -> dict[int, Any]:
    store = topo.store()
    try:
        return {i: await exact(store, group(topo.run, i)) for i in range(GROUPS)}
    finally:
        await store.close()


# ----------------------------------------------------------------------------- order, replay
async def test_feed_matches_in_process_run_replay_changes_nothing_and_metrics_move(
    topology: Topology, reference: dict[int, Any]
) -> None:
    # Without the community processor: its timer refreshes communities on a schedule of its
    # own (every 30 s, so only in a slow run), a change of the graph this comparison could not
    # tell from a replay's. Replaying entities.new is tested in test_community_worker.
    worker = topology.start_worker(TIDEGRAPH_COMMUNITIES_ENABLED="false")
    await topology.wait_assigned([worker])
    assert worker.get("/healthz")[0] == 200
    status, body = worker.get("/readyz")
    assert status == 200, body
    before = worker.metrics()
    assert "tidegraph_stage_events_total{" not in before  # nothing counted yet

    report = await topology.produce(crm_feed(EPISODES, GROUPS, run=topology.run))
    assert len(report.sent) == EPISODES and not report.refused
    result = await topology.wait_reflected(report)
    assert result.processed == EPISODES and result.dead == []
    await assert_matches_reference(topology, reference)

    # The metrics endpoint, scraped: the counters moved by exactly the feed.
    for stage in ("extraction", "resolution", "temporal", "invalidation"):
        assert events(worker, stage, "ok") == EPISODES
        assert worker.value("tidegraph_stage_latency_seconds_count", stage=stage) == EPISODES
    assert worker.value("tidegraph_batch_records_count", stage="extraction") >= 1
    assert worker.value("tidegraph_end_to_end_latency_seconds_count") == EPISODES
    # Mapped records with nothing of their group on the way to the write hop are written in
    # the extraction hop (docs/streaming.md "Why two hops"): none took the hop.
    mapped = "tidegraph_extraction_hop_mapped_total"
    assert worker.value(mapped, path="written") == EPISODES
    assert worker.value(mapped, path="handed_on") == 0
    assert worker.value("tidegraph_records_produced_total", topic="extracted") == 0
    # One write call per episode, or per micro-batch of a group's episodes (docs/streaming.md
    # "Batch-native stages"): every episode in exactly one of them.
    writes = worker.value("tidegraph_store_write_latency_seconds_count", operation="write_episode")
    batches = worker.value("tidegraph_batches_total", outcome="batched")
    batched = worker.value("tidegraph_batch_episodes_sum")
    assert batches >= 1 and batched + (writes - batches) == EPISODES
    assert worker.value("tidegraph_dead_letters_total") == 0
    written = await exact_graph(topology)
    assert worker.stop() == 0  # SIGTERM: a graceful stop

    # Replay every topic from offset 0: a new consumer group re-reads the input. Extraction
    # maps the records again (pure, no store access); resolution finds every episode
    # processed, so temporal stamping and the write never run. Nothing in the graph may
    # change, not even created_at.
    replayer = topology.start_worker(
        "--consumer-group", f"{topology.prefix}.replay", TIDEGRAPH_COMMUNITIES_ENABLED="false"
    )
    await topology.wait_metric(
        replayer, "tidegraph_stage_events_total", EPISODES, stage="resolution",
        outcome="skipped",
    )  # fmt: skip
    assert events(replayer, "extraction", "ok") == EPISODES
    assert events(replayer, "resolution", "skipped") == EPISODES
    for stage, outcome in (("resolution", "ok"), ("temporal", "ok"), ("invalidation", "ok")):
        assert events(replayer, stage, outcome) == 0
    assert replayer.value("tidegraph_end_to_end_latency_seconds_count") == 0
    assert await exact_graph(topology) == written


# ----------------------------------------------------------------------------- one Acme
async def test_twenty_back_to_back_episodes_of_one_group_yield_one_acme(
    topology: Topology,
) -> None:
    gid = f"{topology.run}-acme"
    spellings = ["Acme Corp", "ACME Corp", "Acme Corp.", "acme corp", " Acme  Corp "]
    start = datetime(2025, 3, 1, tzinfo=UTC)
    episodes = [
        {
            "id": f"note-{n}",
            "group_id": gid,
            "source": "json",
            "content": {"type": "company.note", "company": spellings[n % 5], "topic": f"t{n}"},
            "reference_time": (start + timedelta(minutes=n)).isoformat(),
        }
        for n in range(20)
    ]
    path = topology.tmp / "acme.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in episodes))
    topology.start_worker()
    # ingest --via kafka: produce, then wait until the graph reflects the whole file
    out = topology.cli("ingest", "--via", "kafka", str(path))
    assert "20 episodes in the graph, 0 dead-lettered" in out.stdout, out.stdout

    store = topology.store()
    try:
        entities = await store.browse.list_entities(gid)
        counts = await store.browse.counts(gid)
    finally:
        await store.close()
    acme = [e for e in entities if "Organization" in e.labels]
    assert len(acme) == 1, [e.name for e in acme]
    assert counts == {"episodes": 20, "entities": 21, "facts": 20, "mentions": 40}
    # the community processor hears of each created entity once
    events = await read_topic(topology, topology.names.entities_new)
    assert Counter(e["entity_uuid"] for e in events)[acme[0].uuid] == 1
    assert len(events) == 21 and {e["group_id"] for e in events} == {gid}


async def read_topic(topology: Topology, topic: str) -> list[dict[str, Any]]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=topology.kafka, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(4)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        values = []
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            for messages in (await consumer.getmany(timeout_ms=1000)).values():
                values += [orjson.loads(m.value) for m in messages]
        return values
    finally:
        await consumer.stop()


# ----------------------------------------------------------------------------- crash, scale
async def test_workers_stopped_and_killed_mid_run_give_the_uninterrupted_graph(
    topology: Topology, reference: dict[int, Any]
) -> None:
    groups = [group(topology.run, i) for i in range(GROUPS)]

    async def written_at_least(n: int) -> int:
        return await topology.written_at_least(groups, n)

    feed = crm_feed(EPISODES, GROUPS, run=topology.run)
    half = EPISODES // 2
    # Each half is produced at a pace (10 episodes/s) only once a worker owns the partitions,
    # so that the stop and the kill land while records are in flight however slowly the
    # workers start on a loaded machine (a feed produced before a worker is up is taken in
    # big batches and may be finished by a graceful stop).
    first = topology.start_worker()
    await topology.wait_assigned([first])
    head = await topology.produce(feed[:half], rate=10)
    await written_at_least(40)
    # SIGTERM mid-run: the worker finishes the records it took, commits, exits 0
    assert first.stop() == 0
    stopped_at = await topology.episodes_written(groups)

    second = topology.start_worker()
    await topology.wait_assigned([second])
    producing = asyncio.create_task(topology.produce(feed[half:], rate=10))
    await written_at_least(max(stopped_at, half) + 20)  # into the paced second half
    # SIGKILL mid-run: nothing finishes, nothing more is committed
    second.kill()
    killed_at = await topology.episodes_written(groups)
    assert killed_at < EPISODES, "the run finished before the kill: nothing was interrupted"

    topology.start_worker()
    tail = await producing
    results = [await topology.wait_reflected(report) for report in (head, tail)]
    assert sum(r.processed for r in results) == EPISODES
    assert [r.dead for r in results] == [[], []]
    await assert_matches_reference(topology, reference)  # no loss, no duplicates


async def test_a_second_worker_joining_mid_run_shares_partitions_same_graph_as_one(
    topology: Topology, reference: dict[int, Any]
) -> None:
    run = covering_run(topology.run)  # every partition holds groups: both workers get work
    groups = [group(run, i) for i in range(GROUPS)]
    feed = crm_feed(EPISODES, GROUPS, run=run)
    first = topology.start_worker()
    head = await topology.produce(feed[:120])
    await eventually(
        lambda: topology.episodes_written(groups),
        lambda n: n >= 30,
        timeout=120,
        what="30 episodes to be written",
    )
    # Scale out mid-run: the group rebalances while records are in flight; the first worker
    # finishes what it took before its partitions move. The rest of the feed comes after the
    # rebalance, so that both workers have work however fast the machine is.
    second = topology.start_worker()
    await topology.wait_assigned([first, second])
    tail = await topology.produce(feed[120:])
    written_head = (await topology.wait_reflected(head)).processed
    result = await topology.wait_reflected(tail)
    assert written_head + result.processed == EPISODES and result.dead == []
    await assert_matches_reference(topology, reference, run)
    # At least once: a rebalance may redeliver a few records, which the writer skips as
    # processed; every episode is written exactly once, by one of the two workers.
    written = [events(w, "invalidation", "ok") for w in (first, second)]
    assert sum(written) == EPISODES and all(written), written


# ----------------------------------------------------------------------------- dead letters
NOTE_RULE = CRM_MAPPING[CRM_MAPPING.index("  - name: company_note") :]
WITHOUT_NOTES = CRM_MAPPING[: CRM_MAPPING.index("  - name: company_note")]


async def test_malformed_records_are_dead_lettered_and_fixed_records_replay(
    topology: Topology,
) -> None:
    topology.mapping.write_text(WITHOUT_NOTES)  # the company.note rule is "forgotten"
    good = crm_feed(30, 3, run=topology.run)
    gid = group(topology.run, 0)
    when = "2025-02-01T10:00:00Z"
    valid = {"id": "x", "group_id": gid, "source": "json", "content": {"a": 1},
             "reference_time": when}  # fmt: skip
    missing = {k: v for k, v in valid.items() if k != "reference_time"} | {"id": "missing"}
    bad_time = valid | {"id": "bad-time", "reference_time": "the day after tomorrowish"}
    bad_source = valid | {"id": "fax", "source": "fax"}
    oversized = valid | {"id": "big", "source": "text", "content": "x" * (MAX_CONTENT_CHARS + 1)}
    unmapped = valid | {"id": "note-1", "content": {"type": "company.note", "company": "Acme",
                                                    "topic": "renewal"}}  # fmt: skip
    lines = [orjson.dumps(e) for e in good[:15]]
    lines += [b'{"id": "broken", "group_id": "' + gid.encode() + b'", "source": ']
    lines += [orjson.dumps(e) for e in (missing, bad_time, bad_source, oversized, unmapped)]
    lines += [orjson.dumps(e) for e in good[15:]]

    worker = topology.start_worker()
    report = await topology.produce(lines)
    result = await topology.wait_reflected(report)
    assert result.processed == 30
    reasons = {record_id(d.record): (d.stage, d.reason) for d in result.dead}
    assert reasons == {
        "broken": ("validation", "invalid_json"),
        "missing": ("validation", "missing_field"),
        "bad-time": ("validation", "bad_timestamp"),
        "fax": ("validation", "unknown_source"),
        "big": ("validation", "oversized"),
        "note-1": ("extraction", "no_extractor"),
    }, reasons
    letters = await topology.dead_letters()
    assert len(letters) == 6
    for letter in letters:
        assert letter.message and letter.error_class and letter.attempts == 1
        assert letter.origin is not None and letter.origin.topic == topology.names.episodes
        assert letter.failed_at <= datetime.now(UTC)
    note = next(d for d in letters if d.reason == "no_extractor")
    assert note.record == Episode.model_validate(unmapped).model_dump(mode="json")
    broken = next(d for d in letters if d.reason == "invalid_json")
    assert broken.record_encoding == "text" and broken.record.startswith('{"id": "broken"')
    assert worker.value("tidegraph_dead_letters_total", stage="validation") == 5

    listed = topology.cli("dlq", "list", "--json").stdout.splitlines()
    assert sorted(orjson.loads(row)["reason"] for row in listed) == sorted(
        r for _, r in reasons.values()
    )
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert topology.cli("dlq", "list", "--json", "--since", later).stdout.strip() == ""

    # Fix the cause (add the mapping rule), restart the worker, replay what extraction gave
    # up on; the invalid records stay dead (they need fixing by hand).
    topology.mapping.write_text(WITHOUT_NOTES + NOTE_RULE)
    assert worker.stop() == 0
    topology.start_worker()
    out = topology.cli("dlq", "replay", "--stage", "extraction")
    assert "replayed 1 records" in out.stdout, out.stdout
    store = topology.store()
    try:
        await eventually(
            lambda: store.episode_processed(gid, Episode.model_validate(unmapped).uuid),
            bool,
            timeout=60,
            what="the replayed episode to be written",
        )
        names = [e.name for e in await store.browse.list_entities(gid)]
    finally:
        await store.close()
    assert "Acme" in names
    assert len(await topology.dead_letters()) == 6  # nothing failed again


def record_id(record: Any) -> str:
    return str(record.get("id")) if isinstance(record, dict) else "broken"


# ----------------------------------------------------------------------------- LLM faults
USES = re.compile(r"^(?P<subject>.+?) uses (?P<object>.+?)\.?$")


def uses_feed(
    gid: str, products: list[str], *, companies: int, start: datetime
) -> list[dict[str, Any]]:
    """Text envelopes "Company k uses P." of one group, an hour apart, for
    ``extraction_answer``."""
    return [
        {"id": f"msg-{n}", "group_id": gid, "source": "text",
         "content": f"Company {n % companies} uses {product}.",
         "reference_time": (start + timedelta(hours=n)).isoformat()}
        for n, product in enumerate(products)
    ]  # fmt: skip


def extraction_answer(request: FakeRequest) -> dict[str, Any]:
    current = request.user.rsplit("):\n", 1)[1].strip()
    if "POISON" in current:
        return {"entities": "this is not a list", "facts": []}  # never fits the schema
    match = USES.match(current)
    assert match, current
    subject, obj = match["subject"], match["object"]
    return {
        "entities": [
            {"name": subject, "type": "Organization", "summary": None},
            {"name": obj, "type": "Product", "summary": None},
        ],
        "facts": [
            {"subject": subject, "relation": "USES", "object": obj,
             "fact": f"{subject} uses {obj}", "valid_at": None, "invalid_at": None}
        ],
    }  # fmt: skip


async def test_llm_429s_and_500s_are_retried_and_a_poison_episode_is_stored_unextracted(
    topology: Topology,
) -> None:
    gid = f"{topology.run}-llm"
    products = ["Zendesk", "Slack", "Jira", "Notion", "Figma", "Linear", "Stripe", "Okta"]
    start = datetime(2025, 4, 1, tzinfo=UTC)
    episodes = uses_feed(gid, products, companies=3, start=start)
    poison = {"id": "poison", "group_id": gid, "source": "text",
              "content": "POISON pill that no model can parse.",
              "reference_time": (start + timedelta(hours=2, minutes=30)).isoformat()}  # fmt: skip
    feed = episodes[:3] + [poison] + episodes[3:]
    with ScriptedLLMServer() as server:
        on_extraction(server, extraction_answer)
        server.on("EntityResolutionOutput", lambda _: {"matches": []})
        server.on("FactResolutionOutput", lambda _: {"judgements": []})
        # One group: its first one-episode extractions meet the 8 faults (a joint call the
        # poison's answer spoils is asked again one episode at a time); every failed attempt
        # is retried, by the client or, past its 3 attempts, the stage.
        server.inject("429", times=4, schema_name="ExtractionOutput")
        server.inject("500", times=4, schema_name="ExtractionOutput")
        worker = topology.start_worker(
            TIDEGRAPH_LLM_BASE_URL=server.base_url,
            TIDEGRAPH_LLM_API_KEY="test",
            TIDEGRAPH_LLM_MODEL="fake-model",
            TIDEGRAPH_LLM_MAX_ATTEMPTS="3",
        )
        report = await topology.produce(feed)
        result = await topology.wait_reflected(report, timeout=180)
        # The poison is no dead letter: a text episode the LLM cannot extract is stored
        # unextracted, searchable, with why (docs/architecture.md "Episodes without an LLM").
        assert result.processed == len(feed) and result.dead == []
        assert server.count("ExtractionOutput", status=429) == 4
        assert server.count("ExtractionOutput", status=500) == 4
    assert worker.value("tidegraph_llm_errors_total", stage="extraction", kind="rate_limited") == 4
    assert worker.value("tidegraph_llm_errors_total", stage="extraction", kind="server") == 4
    assert worker.value("tidegraph_retries_total", stage="extraction") >= 8
    assert worker.value("tidegraph_episodes_not_extracted_total",
                        reason="llm_invalid_output") == 1  # fmt: skip
    store = topology.store()
    try:
        facts = await store.browse.query_facts(gid)
        [pending] = await store.pending_episodes(gid, 10)
    finally:
        await store.close()
    assert sorted(f.object for f in facts) == sorted(products)
    assert (pending.producer_id, pending.not_extracted) == ("poison", "llm_invalid_output")


async def test_a_groups_waiting_text_records_share_extraction_calls_in_the_worker(
    topology: Topology,
) -> None:
    """Text records of one group waiting in the extraction hop's micro-batch are extracted
    several to an LLM call, each record once, and written in the group's order."""
    gid = f"{topology.run}-joint"
    products = ["Zendesk", "Slack", "Jira", "Notion", "Figma", "Linear"]
    feed = uses_feed(gid, products, companies=2, start=datetime(2025, 4, 1, tzinfo=UTC))
    with ScriptedLLMServer() as server:
        on_extraction(server, extraction_answer)
        server.on("EntityResolutionOutput", lambda _: {"matches": []})
        server.on("FactResolutionOutput", lambda _: {"judgements": []})
        report = await topology.produce(feed)  # waiting before the worker starts
        worker = topology.start_worker(
            TIDEGRAPH_LLM_BASE_URL=server.base_url,
            TIDEGRAPH_LLM_API_KEY="test",
            TIDEGRAPH_LLM_MODEL="fake-model",
        )
        result = await topology.wait_reflected(report, timeout=180)
        requests = server.requests
    assert result.processed == len(feed) and result.dead == []
    joint = [r.user for name, r, _ in requests if name == JOINT_EXTRACTION]
    alone = [r.user for name, r, _ in requests if name == EXTRACTION]
    assert joint and len(joint) + len(alone) < len(feed)
    asked = [part for user in joint for part in split_joint_user(user)] + alone
    assert sorted(u.rsplit("):\n", 1)[1] for u in asked) == sorted(e["content"] for e in feed)
    calls = worker.value("tidegraph_llm_calls_total", stage="extraction", outcome="ok")
    assert calls == len(joint) + len(alone)
    store = topology.store()
    try:
        facts = await store.browse.query_facts(gid)
    finally:
        await store.close()
    assert sorted((f.subject, f.object) for f in facts) == sorted(
        (f"Company {n % 2}", product) for n, product in enumerate(products)
    )


async def test_a_groups_mapped_records_behind_its_text_records_keep_the_groups_order(
    topology: Topology,
) -> None:
    """A mapped record with nothing of its group ahead of it is written in the extraction
    hop; one behind a text record of its group takes the hop after it (docs/streaming.md
    "Why two hops"). Either way the group's facts are created in the feed's order."""
    gid = f"{topology.run}-mixed"
    start = datetime(2025, 4, 1, tzinfo=UTC)
    products = ["Zendesk", "Slack", "Jira", "Notion"]
    feed: list[dict[str, Any]] = []
    for n in range(12):
        at = start + timedelta(hours=n)
        if n % 3 == 1:  # a text record between mapped ones
            content: Any = f"Company {n % 2} uses {products[n // 3]}."
            source = "text"
        else:
            content = plan_record((n % 2, f"Company {n % 2}"), f"Plan {n}", at)
            source = "json"
        feed.append({"id": f"mix:{gid}:{n}", "group_id": gid, "source": source,
                     "content": content, "reference_time": at.isoformat()})  # fmt: skip
    mapped = sum(1 for e in feed if e["source"] == "json")
    with ScriptedLLMServer() as server:
        on_extraction(server, extraction_answer)
        server.on("EntityResolutionOutput", lambda _: {"matches": []})
        server.on("FactResolutionOutput", lambda _: {"judgements": []})
        report = await topology.produce(feed)  # waiting before the worker starts: one job
        worker = topology.start_worker(
            TIDEGRAPH_LLM_BASE_URL=server.base_url,
            TIDEGRAPH_LLM_API_KEY="test",
            TIDEGRAPH_LLM_MODEL="fake-model",
            TIDEGRAPH_COMMUNITIES_ENABLED="false",
        )
        result = await topology.wait_reflected(report, timeout=180)
    assert result.processed == len(feed) and result.dead == []
    counted = "tidegraph_extraction_hop_mapped_total"
    here = worker.value(counted, path="written")
    handed_on = worker.value(counted, path="handed_on")
    # the first record, with nothing ahead, is written here; those behind a text record of
    # the same job take the hop
    assert here >= 1 and handed_on >= 1 and here + handed_on == mapped
    store = topology.store()
    try:
        facts = await store.browse.query_facts(gid, include_invalid=True)
        assert await creation_order_problems(store, gid) == []
    finally:
        await store.close()
    assert len(facts) == len(feed)
    assert {f.fact for f in facts} >= {f"Company {n % 2} uses {products[n // 3]}"
                                       for n in range(1, 12, 3)}  # fmt: skip


# ----------------------------------------------------------------------------- pure parts
async def test_lanes_keep_order_per_key_and_run_keys_concurrently() -> None:
    import asyncio

    from tidegraph.pipelines.streaming.lanes import KeyedLanes

    lanes = KeyedLanes(capacity=8, on_error=lambda exc: pytest.fail(f"job failed: {exc!r}"))
    done: list[tuple[str, int]] = []
    gates = {key: asyncio.Event() for key in "ab"}

    def job(key: str, n: int) -> Any:
        async def run() -> None:
            if n == 0:
                await gates[key].wait()
            done.append((key, n))

        return run

    for n in range(3):
        for key in "ab":
            await lanes.submit(key, job(key, n))
    gates["b"].set()  # b runs to the end while a's first job still waits

    async def finished() -> int:
        return len(done)

    await eventually(finished, lambda n: n == 3, timeout=5, what="lane b to finish")
    assert done == [("b", 0), ("b", 1), ("b", 2)]
    gates["a"].set()
    await lanes.drain()
    assert [n for key, n in done if key == "a"] == [0, 1, 2]


async def test_lanes_bound_one_groups_backlog_and_drop_work_while_closed() -> None:
    import asyncio

    from tidegraph.pipelines.streaming.lanes import KeyedLanes

    lanes = KeyedLanes(capacity=8, per_key=2, on_error=lambda exc: pytest.fail(repr(exc)))
    gate = asyncio.Event()
    ran: list[int] = []

    def job(n: int) -> Any:
        async def run() -> None:
            await gate.wait()
            ran.append(n)

        return run

    await lanes.submit("hot", job(0))
    await lanes.submit("hot", job(1))
    third = asyncio.create_task(lanes.submit("hot", job(2)))
    await lanes.submit("other", job(9))  # other groups are admitted meanwhile
    assert not third.done() and lanes.in_flight == 3  # the hot group is at its bound
    gate.set()
    await third
    await lanes.quiesce()  # finishes everything admitted, then admits nothing
    assert sorted(ran) == [0, 1, 2, 9]
    await lanes.submit("hot", job(3))
    assert lanes.in_flight == 0 and 3 not in ran
    lanes.reopen()
    await lanes.submit("hot", job(4))
    await lanes.drain()
    assert ran[-1] == 4


async def test_a_lagging_groups_job_takes_every_record_waiting_for_it() -> None:
    import asyncio

    from tidegraph.pipelines.streaming.lanes import KeyedBacklog, KeyedLanes

    lanes = KeyedLanes(capacity=8, on_error=lambda exc: pytest.fail(repr(exc)))
    backlog: KeyedBacklog[int] = KeyedBacklog(most=4)
    gate = asyncio.Event()
    jobs: list[list[int]] = []

    async def job(key: str) -> None:
        await gate.wait()
        jobs.append(backlog.take(key, keep=lambda n: n >= 0))  # negatives: stale, dropped

    # Four micro-batches arrive while the group's first job waits (a slow write).
    for batch in ([0, 1], [-1, 2, 3], [4], [5, 6, 7, 8]):
        backlog.add("g", batch)
        await lanes.submit("g", lambda: job("g"))
    gate.set()
    await lanes.drain()
    # Jobs take up to four of what waited, in order; later jobs find the rest, then nothing.
    assert jobs == [[0, 1, 2, 3], [4, 5, 6, 7], [8], []]
    assert backlog.waiting("g") == 0
    with pytest.raises(ValueError):
        backlog.add("g", [1, 2, 3, 4, 5])  # more than one job takes


async def test_records_arriving_while_a_groups_job_waits_join_it_rather_than_a_job_more() -> None:
    import asyncio

    from tidegraph.pipelines.streaming.lanes import KeyedBacklog, KeyedLanes

    lanes = KeyedLanes(capacity=8, on_error=lambda exc: pytest.fail(repr(exc)))
    backlog: KeyedBacklog[int] = KeyedBacklog(most=4)
    gate = asyncio.Event()
    jobs: list[list[int]] = []

    async def job(key: str) -> None:
        await gate.wait()
        jobs.append(backlog.take(key))

    # As the stage agent submits: a job only when those waiting for their turn cannot take
    # everything waiting. The group's first job is held (a slow write); five micro-batches
    # arrive meanwhile, and another group's.
    for key, batch in (("g", [0]), ("g", [1, 2]), ("h", [50]), ("g", [3, 4]), ("g", [5]),
                       ("g", [6, 7, 8, 9]), ("g", [10])):  # fmt: skip
        backlog.add(key, batch)
        if backlog.needs_job(key):
            assert await lanes.submit(key, partial(job, key))
            backlog.admitted(key)
    assert lanes.in_flight == 4  # g: three jobs for eleven records (four at most each); h: one
    gate.set()
    await lanes.drain()
    assert sorted(jobs) == sorted([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10], [50]])
    assert [j for j in jobs if j != [50]] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    # Once they have started, what arrives gets a job of its own again.
    backlog.add("g", [11])
    assert backlog.needs_job("g")
    await lanes.quiesce()
    assert not await lanes.submit("g", lambda: job("g"))  # closed: dropped, not admitted


def test_dead_letter_keeps_the_original_record() -> None:
    from tidegraph.topics.records import (
        MAX_DEAD_RECORD_BYTES,
        DeadLetter,
        decode,
        encode,
        original_record,
    )

    for raw, encoding in [(b'{"a": 1}', "json"), (b"not json", "text"), (b"\xff\xfe", "base64")]:
        record, got, truncated = original_record(raw)
        assert (got, truncated) == (encoding, False)
        letter = DeadLetter(
            stage="validation", reason="r", error_class="E", message="m", attempts=1,
            failed_at=datetime.now(UTC), record=record, record_encoding=got,
        )  # fmt: skip
        again = decode(DeadLetter, encode(letter)).original_bytes()
        assert orjson.loads(again) == orjson.loads(raw) if got == "json" else again == raw
    _, encoding, truncated = original_record(b"x" * (MAX_DEAD_RECORD_BYTES + 10))
    assert (encoding, truncated) == ("text", True)
