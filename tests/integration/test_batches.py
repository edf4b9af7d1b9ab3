"""A group's micro-batch processed as one unit gives the graph of one episode at a time, on
both real stores (property test), and a failing episode inside a batch fails alone.

The feeds are those of ``test_delivery_order_stores`` (random mapped CRM records in any order, late
ones, the same episode twice, the same record under another id, contradicting plans and statuses).
One run processes them one at a time (units of one episode, each episode run alone), the other as
units of a random size (``GroupRunner.run`` on the whole feed); each run writes a group of its own.
Everything the graph says must agree: every fact with its interval on both timelines' shape, the
facts valid at each event time, every entity with its labels, summary, key and aliases, the counts,
and what each episode's write summary reported."""

from __future__ import annotations

import threading
import uuid as uuidlib
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from tests.integration.graph_compare import comparable
from tests.integration.test_delivery_order_stores import DIM, Record, deliveries, rows
from tests.support import crm_feed as crm
from tests.support.extraction_requests import (
    EXTRACTION,
    JOINT_EXTRACTION,
    joint_answer,
    on_extraction,
    split_joint_user,
)
from tests.support.fake_llm import FakeRequest, ScriptedLLMServer
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.llm import LLMClient
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.records.episode import Episode
from tidegraph.records.outcome import Outcome
from tidegraph.records.stages import WriteSummary
from tidegraph.records.times import iso
from tidegraph.stores.base import GraphStore

pytestmark = pytest.mark.integration


def chain(store: GraphStore, unit_episodes: int = 64) -> GroupRunner:
    return GroupRunner.of(
        store=store,
        embedder=HashingEmbedder(dim=DIM),
        llm=None,
        mappings=crm.crm_mappings(),
        unit_episodes=unit_episodes,
    )


async def one_at_a_time(
    runner: GroupRunner, episodes: list[Episode]
) -> list[Outcome[WriteSummary]]:
    return [(await runner.run([episode]))[0] for episode in episodes]


def outcome(result: Outcome[WriteSummary]) -> tuple[Any, ...]:
    episode = result.episode
    if result.failure is not None:
        return ("failed", episode.id, result.failure.stage, result.failure.reason)
    summary = result.value or WriteSummary(
        group_id=episode.group_id, episode_uuid=episode.uuid, episode_id=episode.id
    )
    created = result.created_entities if result.processed else summary.created_entities
    return (
        episode.id,
        result.processed,
        summary.facts_new,
        summary.facts_merged,
        summary.facts_closed,
        summary.facts_born_closed,
        summary.entities,
        summary.entities_new,
        len(created),
    )


async def graph_and_outcomes(
    store: GraphStore, records: list[Record], batch: int | None
) -> dict[str, Any]:
    """``records`` into a group of their own (deleted afterwards): one at a time when
    ``batch`` is None, else in batches of up to ``batch`` episodes."""
    group = f"batch-{uuidlib.uuid4().hex[:12]}"
    episodes = [r.episode(group) for r in records]
    try:
        if batch is None:
            results = await one_at_a_time(chain(store, 1), episodes)
        else:
            results = await chain(store, batch).run(episodes)
        graph: dict[str, Any] = await comparable(store, group)
        for at in sorted({r.at for r in records}):
            graph[iso(at) or ""] = rows(await store.browse.query_facts(group, valid_at=at))
        graph["outcomes"] = [
            tuple(str(v).replace(group, "<group>") for v in outcome(r)) for r in results
        ]
        return graph
    finally:
        await store.forget.delete_group(group)


def batches_done() -> float:
    return REGISTRY.get_sample_value("tidegraph_batches_total", {"outcome": "batched"}) or 0.0


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(delivered=deliveries(), batch=st.integers(2, 8))
async def test_batches_give_the_graph_of_one_episode_at_a_time(
    store: GraphStore, delivered: list[Record], batch: int
) -> None:
    one_by_one = await graph_and_outcomes(store, delivered, None)
    before = batches_done()
    batched = await graph_and_outcomes(store, delivered, batch)
    assert batched == one_by_one
    if len(delivered) > 1:
        assert batches_done() > before  # the batch path ran, not only its fallback


async def test_a_failing_episode_in_a_batch_fails_alone(store: GraphStore) -> None:
    """A record its mapping cannot read, in the middle of a batch: it fails with its reason,
    the batch goes on without it, and the graph is that of one episode at a time."""
    at = [crm.START + timedelta(days=d) for d in range(6)]
    contents = [
        crm.plan_record((1, "Acme Corp"), "Basic", at[0]),
        crm.plan_record((1, "Acme Corp"), "Pro", at[1]),
        {"type": "account.plan", "account": {"id": 1}, "at": "not a time"},
        crm.plan_record((1, "Acme Corp"), "Enterprise", at[3]),
        crm.contact_record("joined", (7, "Contact 7"), (1, "Acme Corp"), at[4]),
        crm.plan_record((1, "Acme Corp"), "Basic", at[5]),
    ]
    records = [Record(f"rec-{i}", at[i], c) for i, c in enumerate(contents)]
    one_by_one = await graph_and_outcomes(store, records, None)
    before = batches_done()
    batched = await graph_and_outcomes(store, records, 6)
    assert batched == one_by_one
    assert batches_done() == before + 2  # the two before it, then the three after it
    failed = [o for o in batched["outcomes"] if o[0] == "failed"]
    assert [o[1] for o in failed] == ["rec-2"]
    assert len(batched["outcomes"]) == 6


# ----------------------------------------------------------------------------- text: run ahead
TEXT = [
    (0, "Ana Lima: Harbor Freight signed up for the Starter plan."),
    (1, "Ben Okafor: Harbor Freight reports slow invoice exports."),
    (3, "Ana Lima: Harbor Freight moved to the Business plan."),
    (2, "Ben Okafor: (late) Harbor Freight asked about SSO before the upgrade."),
    (4, "Cleo Park: Harbor Freight invoice exports are fixed."),
    (5, "Ana Lima: Harbor Freight added ten seats."),
    (6, "Ben Okafor: Harbor Freight wants a quarterly invoice."),
]


def text_episodes(group: str) -> list[Episode]:
    start = crm.START
    return [
        Episode(
            id=f"chat-{n}",
            group_id=group,
            source="message",
            content=text,
            reference_time=start + timedelta(hours=hours),
        )
        for n, (hours, text) in enumerate(TEXT)
    ]


FACTS = "FactResolutionOutput"


def answer_extraction(request: FakeRequest) -> dict[str, Any]:
    """The speaker and what they said about Harbor Freight, from the current message only."""
    current = request.user.split("Current episode", 1)[1].split("\n", 1)[1]
    speaker, body = current.split(": ", 1)
    return {
        "entities": [
            {"name": speaker.strip(), "type": "Person", "summary": None},
            {"name": "Harbor Freight", "type": "Organization", "summary": None},
        ],
        "facts": [
            {
                "subject": speaker.strip(),
                "relation": "SAID_ABOUT",
                "object": "Harbor Freight",
                "fact": f"{speaker.strip()} said: {body.strip()}",
                "valid_at": None,
                "invalid_at": None,
            }
        ],
    }


async def text_run(
    store: GraphStore,
    server: ScriptedLLMServer,
    ahead: bool,
    episodes_per_call: int = 1,
    faults: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The conversation ``TEXT`` into a group of its own (deleted afterwards); ``faults``:
    answers of the first joint extraction requests (e.g. ``"500"``)."""
    group = f"text-{uuidlib.uuid4().hex[:12]}"
    llm = LLMClient(
        base_url=server.base_url, api_key="test", model="fake", cache=None, max_attempts=1
    )
    pipeline = GroupRunner.of(
        store=store,
        embedder=HashingEmbedder(dim=DIM),
        llm=llm,
        mappings=None,
        episodes_per_call=episodes_per_call,
        unit_episodes=64 if ahead else 1,
    )
    server.reset()
    for fault in faults:
        server.inject(fault, times=1, schema_name=JOINT_EXTRACTION)
    try:
        episodes = text_episodes(group)
        if ahead:
            results = await pipeline.run(episodes)
        else:
            results = await one_at_a_time(pipeline, episodes)
        requests = [(name, request.user) for name, request, _ in server.requests]
        graph: dict[str, Any] = await comparable(store, group)
        graph["outcomes"] = [outcome(r) for r in results]
        graph["extraction_prompts"] = sorted(u for n, u in requests if n == EXTRACTION)
        graph["joint_prompts"] = [u for n, u in requests if n == JOINT_EXTRACTION]
        # extractions the server saw before the first episode's write: 1 one at a time
        graph["order"] = [n for n, _ in requests]
        return graph
    finally:
        await llm.close()
        await store.forget.delete_group(group)


async def test_llm_extractions_run_ahead_with_the_prompts_and_graph_of_one_at_a_time(
    store: GraphStore,
) -> None:
    """A conversation's extraction calls run ahead of its ordered stages (several in flight at
    once: the first answer is held until three extractions were asked), with exactly the
    prompts (context included, a late message too) and the graph of one episode at a time."""
    held = HeldFirst(3)
    with ScriptedLLMServer(latency_seconds=0.05) as server:
        on_extraction(server, answer_extraction)
        server.on("EntityResolutionOutput", lambda _: {"matches": []})
        server.on("FactResolutionOutput", lambda _: {"judgements": []})
        alone = await text_run(store, server, ahead=False)
        on_extraction(server, held)
        ahead = await text_run(store, server, ahead=True)
    order_alone = alone.pop("order")
    ahead.pop("order")
    assert ahead == alone
    assert len(alone["extraction_prompts"]) == len(TEXT)
    assert "Previous episodes" in alone["extraction_prompts"][-1]
    # one at a time, an episode's judging calls come before the next extraction (the first
    # episode has nothing to judge); ahead, three extractions were asked while the first
    # one's answer was held
    assert order_alone[:3] == [EXTRACTION, EXTRACTION, FACTS]
    assert held.reached


class HeldFirst:
    """An extraction handler that holds its first answer until ``n`` extraction requests
    have arrived (``reached``), or 10 s have passed (one at a time, they never would)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.arrived = 0
        self.reached = False
        self.changed = threading.Condition()

    def __call__(self, request: FakeRequest) -> dict[str, Any]:
        with self.changed:
            self.arrived += 1
            self.changed.notify_all()
            if self.arrived == 1:
                self.reached = self.changed.wait_for(lambda: self.arrived >= self.n, 10.0)
        return answer_extraction(request)


@pytest.mark.parametrize("fault", [None, "500", "omitted"])
async def test_a_conversations_waiting_episodes_share_extraction_calls(
    store: GraphStore, fault: str | None
) -> None:
    """A group's waiting text episodes are extracted four to a call, with the graph of one
    call per episode; an episode the joint call fails on (``500`` after every attempt) or
    leaves out of its answer is asked alone, and nothing is lost."""
    with ScriptedLLMServer(latency_seconds=0.05) as server:
        on_extraction(server, answer_extraction)
        server.on("EntityResolutionOutput", lambda _: {"matches": []})
        server.on("FactResolutionOutput", lambda _: {"judgements": []})
        alone = await text_run(store, server, ahead=False)
        if fault == "omitted":
            full = joint_answer(answer_extraction)
            server.on(JOINT_EXTRACTION, lambda r: {"episodes": full(r)["episodes"][1:]})
        faults = ("500",) if fault == "500" else ()  # the first call, its only attempt
        joint = await text_run(store, server, ahead=True, episodes_per_call=4, faults=faults)
    alone.pop("order"), joint.pop("order")
    prompts, asked_alone = joint.pop("joint_prompts"), joint.pop("extraction_prompts")
    alone.pop("joint_prompts"), alone.pop("extraction_prompts")
    assert joint == alone  # outcomes, facts with both timelines, entities, counts
    # 7 messages: a call for messages 1-4 (its context: none), one for 5-7 (context: 1-4).
    assert len(prompts) == 2
    prompts.sort(key=lambda u: "Previous episodes" in u)
    first, second = (split_joint_user(u) for u in prompts)
    assert [len(first), len(second)] == [4, 3]
    assert "Previous episodes" not in prompts[0] and TEXT[3][1] in prompts[1]
    current = [content(u) for u in first + second]
    assert current == [text for _, text in TEXT]
    again = sorted(content(u) for u in asked_alone)
    if fault is None:
        assert again == []
    elif fault == "500":  # the episodes of the call that failed, each in its own call
        assert again in (sorted(current[:4]), sorted(current[4:]))
    else:  # the first episode of each call
        assert again == sorted([current[0], current[4]])


def content(user: str) -> str:
    """The current episode's content in a one-episode extraction request."""
    return user.rsplit("):\n", 1)[1]


# ----------------------------------------------------------------------------- text: one unit
PLANS = [
    (0, "Ana Lima", "Harbor Freight signed up for the Starter plan."),
    (1, "Ben Okafor", "Harbor Freight reports slow invoice exports."),
    (4, "Ana Lima", "Harbor Freight moved to the Business plan."),
    (2, "Ben Okafor", "(late) Harbor Freight asked about SSO before the upgrade."),
    (5, "Cleo Park", "Harbor Freight invoice exports are fixed."),
    (6, "Ana Lima", "Harbor Freight moved to the Enterprise plan."),
    (3, "Ana Lima", "(late) Harbor Freight was on the Growth plan."),
    (7, "Ben Okafor", "Harbor Freight wants a quarterly invoice."),
    # extracted in one call, so resolved and written as one unit: the first closes the
    # Enterprise plan fact (a held write), the second reads that fact again through the
    # Enterprise plan, which must give the held state, not the stored one
    (9, "Ana Lima", "Harbor Freight moved to the Starter plan."),
    (10, "Ben Okafor", "Harbor Freight dropped the Enterprise plan."),
    (11, "Cleo Park", "Harbor Freight invoice exports are slow again."),
    (12, "Ana Lima", "Harbor Freight moved to the Growth plan."),
]


def plan_of(text: str) -> str | None:
    words = text.rstrip(".").split()
    return words[words.index("plan") - 1] if "plan" in words else None


def answer_plans(request: FakeRequest) -> dict[str, Any]:
    """The speaker, Harbor Freight, what the speaker said, and the plan it is on (a plan is
    an entity: a new plan is a draft no name finds, so resolution searches the store)."""
    current = request.user.split("Current episode", 1)[1].split("\n", 1)[1]
    speaker, body = (part.strip() for part in current.split(": ", 1))
    entities = [
        {"name": speaker, "type": "Person", "summary": None},
        {"name": "Harbor Freight", "type": "Organization", "summary": None},
    ]
    facts = [
        {"subject": speaker, "relation": "SAID_ABOUT", "object": "Harbor Freight",
         "fact": f"{speaker} said: {body}", "valid_at": None, "invalid_at": None},
    ]  # fmt: skip
    plan = plan_of(body)
    if plan:
        entities.append({"name": f"{plan} plan", "type": "Plan", "summary": None})
        facts.append(
            {"subject": "Harbor Freight", "relation": "ON_PLAN", "object": f"{plan} plan",
             "fact": f"Harbor Freight is on the {plan} plan", "valid_at": None,
             "invalid_at": None}
        )  # fmt: skip
    return {"entities": entities, "facts": facts}


def judge_plans(request: FakeRequest) -> dict[str, Any]:
    """A new plan fact contradicts every listed fact of another plan and repeats one of the
    same plan; read from the prompt alone, so equal prompts get equal answers."""
    existing_part, new_part = request.user.split("New facts:\n", 1)
    listed = [
        (int(line[1:].split("] ", 1)[0]), plan_of(line.split(": ", 1)[1].rsplit(" (", 1)[0]))
        for line in existing_part.splitlines()[1:]
        if line
    ]
    earlier: list[tuple[int, str | None]] = []  # new facts of earlier messages (joint call)
    current: list[tuple[int, str | None]] = []
    judgements = []
    for line in new_part.splitlines():
        if line.startswith("(message "):
            earlier, current = earlier + current, []
            continue
        index, text = line[1:].split("] ", 1)
        plan = plan_of(text)
        current.append((int(index), plan))
        if plan is None:
            continue
        known = [*listed, *earlier]
        judgements.append(
            {
                "new_fact": int(index),
                "duplicate_of": next((k for k, p in known if p == plan), None),
                "contradicts": [k for k, p in known if p is not None and p != plan],
            }
        )
    return {"judgements": judgements}


def calls_ahead(outcome: str) -> float:
    return REGISTRY.get_sample_value("tidegraph_llm_calls_ahead_total", {"outcome": outcome}) or 0.0


def writes_done() -> float:
    return (
        REGISTRY.get_sample_value(
            "tidegraph_store_write_latency_seconds_count", {"operation": "write_episode"}
        )
        or 0.0
    )


async def plans_run(
    store: GraphStore, server: ScriptedLLMServer, group: str, *, together: bool
) -> dict[str, Any]:
    """``PLANS`` into ``group`` (deleted afterwards; the same group for both runs, since
    the judging prompts list facts by uuid, which the group is part of): one episode at a
    time, or ``together`` (extracted ahead, resolved and written as units)."""
    llm = LLMClient(
        base_url=server.base_url, api_key="test", model="fake", cache=None, max_attempts=1
    )
    pipeline = GroupRunner.of(
        store=store,
        embedder=HashingEmbedder(dim=DIM),
        llm=llm,
        mappings=None,
        unit_episodes=64 if together else 1,
    )
    server.reset()
    server.latency_seconds = 0.02
    episodes = [
        Episode(
            id=f"msg-{n}",
            group_id=group,
            source="message",
            content=f"{speaker}: {text}",
            reference_time=crm.START + timedelta(hours=hours),
        )
        for n, (hours, speaker, text) in enumerate(PLANS)
    ]
    try:
        if together:
            results = await pipeline.run(episodes)
        else:
            results = await one_at_a_time(pipeline, episodes)
        graph: dict[str, Any] = await comparable(store, group)
        graph["outcomes"] = [outcome(r) for r in results]
        for schema in ("EntityResolutionOutput", "FactResolutionOutput"):
            asked = [r.user for name, r, _ in server.requests if name == schema]
            graph[schema] = asked
        for at in sorted({crm.START + timedelta(hours=h) for h, _, _ in PLANS}):
            graph[iso(at) or ""] = sorted(
                f.fact for f in await store.browse.query_facts(group, valid_at=at)
            )
        return graph
    finally:
        await llm.close()
        await store.forget.delete_group(group)


@pytest.mark.parametrize("fault", [None, "judge_500"])
async def test_a_conversation_resolved_and_written_together_writes_as_one_at_a_time(
    store: GraphStore, fault: str | None
) -> None:
    """A conversation's extracted messages resolved and written as units: the same graph
    (plans closed by later and late ones, a repeated plan merged) as one message at a time,
    every entity judging request one at a time makes, fewer write calls and fewer fact
    judging calls (the new facts of a unit's messages judged in one call, each message's
    facts against the earlier messages' too). A new entity in the middle (a plan no name
    finds) is searched in the store once the messages before it are written, its judging
    call started ahead on a guess meanwhile (the real request: the guess's search includes
    the plans the messages before it introduce); a joint judging call that fails (HTTP 500)
    sends each of its messages to ask alone, and nothing is lost."""
    failed: list[str] = []

    def judge(request: FakeRequest) -> dict[str, Any]:
        if fault and "(message 2, " in request.user and not failed:
            failed.append(request.user)
            raise RuntimeError("scripted failure")
        return judge_plans(request)

    with ScriptedLLMServer() as server:
        on_extraction(server, answer_plans)
        server.on("EntityResolutionOutput", lambda _: {"matches": []})
        server.on("FactResolutionOutput", judge)
        group = f"plans-{uuidlib.uuid4().hex[:12]}"
        alone = await plans_run(store, server, group, together=False)
        assert not failed  # one at a time, no call judges two messages
        writes, batches = writes_done(), batches_done()
        ahead = {o: calls_ahead(o) for o in ("used", "unused")}
        together = await plans_run(store, server, group, together=True)
        writes = writes_done() - writes
        ahead = {o: calls_ahead(o) - n for o, n in ahead.items()}
    judged_alone = alone.pop("FactResolutionOutput")
    judged_together = together.pop("FactResolutionOutput")
    assert not any("(message " in u for u in judged_alone)
    joint = [u for u in judged_together if "(message 2, " in u]
    assert joint  # several messages' facts were judged in one call
    if fault:
        assert failed == joint[:1]
    else:
        assert len(judged_together) < len(judged_alone)
    # Entity judging: every one-at-a-time request, and the calls started ahead on a guess
    # (a new plan's judging, while the messages before it are judged and written) that were
    # not the real request; the ones that were served it.
    asked_alone = Counter(alone.pop("EntityResolutionOutput"))
    asked_together = Counter(together.pop("EntityResolutionOutput"))
    assert asked_alone  # new plans were searched for and judged
    assert not asked_alone - asked_together
    assert (asked_together - asked_alone).total() == ahead["unused"]
    assert ahead["used"] > 0
    # Every guess was the real request, the plan the message before introduced among its
    # candidates (the guess's search adds the entities held ahead of their write): no
    # judging call waited for a write.
    assert ahead["unused"] == 0
    assert together == alone
    assert batches_done() > batches
    assert writes < len(PLANS)
    assert any(o[4] for o in alone["outcomes"])  # plans were closed
