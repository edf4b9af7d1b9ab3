"""The temporal graph core against the real Neo4j server and the scripted LLM (issue 3).

Episodes run through the group runner (``GroupRunner``/``ingest``) (and, for a few cases, the real
CLI as a subprocess). The LLM is ``ScriptedLLMServer`` driven through the real ``openai`` client by
``LLMClient``; what it answers comes from a :class:`Script` written in each test, in a tiny fixture
language: an episode's content maps to the facts it states, one per line::

    Alice Smith[Person] -WORKS_AT-> Acme Corp[Organization] @since last March ~2025-01-01

(``[Type]`` optional; ``@`` the stated start, ``~`` the stated end and ``= text`` the fact's
wording, all optional). The scripted LLM answers extraction from that table, entity
resolution from the names the script declares the same (``script.same``), and fact resolution
like a careful model: the same subject-relation-object is a duplicate, a new value of a
one-valued relation (``script.one_valued``) contradicts the old one, nothing else does.
``script.hostile`` makes it also claim that every new fact contradicts every candidate shown
(and some indexes that do not exist), to show that only facts sharing an endpoint can close.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.support import crm_feed as crm
from tests.support.extraction_requests import JOINT_EXTRACTION, on_extraction
from tests.support.fake_llm import TIMEOUT_STATUS, FakeRequest, ScriptedLLMServer
from tests.support.stores import upsert_entities
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.llm import LLMClient
from tidegraph.pipelines.ingest import IngestReport, ingest
from tidegraph.pipelines.retry import RetryPolicy
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.processors.mapping import MappingSet
from tidegraph.processors.resolution import ResolutionStep
from tidegraph.records.episode import Episode
from tidegraph.records.ids import normalize_name, to_relation_name
from tidegraph.stores.base import GraphStore
from tidegraph.stores.neo4j.store import Neo4jStore
from tidegraph.stores.sqlite.driver import sqlite3
from tidegraph.stores.sqlite.store import SqliteStore

pytestmark = pytest.mark.integration

DIM = 384  # the shared test server's vector indexes are 384-dimensional
EXTRACTION, ENTITY_RES, FACT_RES = (
    "ExtractionOutput",
    "EntityResolutionOutput",
    "FactResolutionOutput",
)
JOINT = JOINT_EXTRACTION  # several waiting episodes of a group in one extraction call
HOSTILE_NAME = "x'}) DETACH DELETE n //"
HOSTILE_RELATION = "works `at`) MATCH (n) DETACH DELETE n //"


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


# ============================================================================= scripted LLM
_LINE = re.compile(
    r"^(?P<s>.+?) -(?P<rel>.+?)-> (?P<o>.+?)"
    r"(?: @(?P<valid>[^@~=]+?))?(?: ~(?P<invalid>[^@~=]+?))?(?: = (?P<text>.+))?$"
)
_TYPED = re.compile(r"^(?P<name>.+?)(?:\[(?P<type>[^\[\]]+)\])?$")
_INDEXED = re.compile(r"^\[(\d+)\] (.*)$")


@dataclass(frozen=True)
class Said:
    subject: str
    relation: str
    object: str
    fact: str
    valid_at: str | None
    invalid_at: str | None


@dataclass
class Script:
    episodes: dict[str, list[Said]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    same: dict[str, str] = field(default_factory=dict)  # normalised variant -> canonical
    one_valued: set[str] = field(
        default_factory=lambda: {"WORKS_AT", "HAS_PLAN", "LIVES_IN", "REPORTS_TO", "USES"}
    )
    hostile: bool = False

    def says(self, content: str, *lines: str) -> str:
        """Declare what an episode's content states; returns the content."""
        facts = []
        for line in lines:
            m = _LINE.match(line.strip())
            assert m, f"bad fixture line {line!r}"
            subject, obj = self._entity(m["s"]), self._entity(m["o"])
            text = m["text"] or f"{subject} {m['rel'].lower().replace('_', ' ')} {obj}"
            facts.append(Said(subject, m["rel"], obj, text, m["valid"], m["invalid"]))
        self.episodes[content] = facts
        return content

    def declare_same(self, variant: str, canonical: str) -> None:
        self.same[normalize_name(variant)] = normalize_name(canonical)

    def install(self, server: ScriptedLLMServer) -> None:
        on_extraction(server, self.extract)
        server.on(ENTITY_RES, self.resolve_entities)
        server.on(FACT_RES, self.resolve_facts)

    # ---- helpers
    def _entity(self, text: str) -> str:
        m = _TYPED.match(text.strip())
        assert m
        if m["type"]:
            self.types[m["name"]] = m["type"]
        return m["name"]

    def canonical(self, name: str) -> str:
        norm = normalize_name(name)
        return self.same.get(norm, norm)

    def names(self) -> list[str]:
        known = {
            n for facts in self.episodes.values() for f in facts for n in (f.subject, f.object)
        }
        return sorted(known, key=len, reverse=True)  # longest first: "Acme Corp" before "Acme"

    def _name_at(self, rest: str, ends: tuple[str, ...]) -> str:
        for name in self.names():
            if any(rest.startswith(name + end) for end in ends):
                return name
        raise AssertionError(f"the script knows no name at the start of {rest!r}")

    def _said(self, text: str) -> Said | None:
        for facts in self.episodes.values():
            for said in facts:
                if said.fact == text:
                    return said
        return None  # not from a scripted episode (e.g. a mapped record's fact)

    @staticmethod
    def _sections(user: str, first: str, second: str) -> tuple[list[str], list[str]]:
        head, _, tail = user.partition(second)
        assert first in head, user
        return head.split(first, 1)[1].strip().splitlines(), tail.strip().splitlines()

    # ---- the three stages
    def extract(self, request: FakeRequest) -> dict[str, Any]:
        content = request.user.split("\n", request.user.count("\n"))
        start = next(i for i, line in enumerate(content) if line.startswith("Current episode ("))
        facts = self.episodes.get("\n".join(content[start + 1 :]), [])
        names = list(dict.fromkeys(n for f in facts for n in (f.subject, f.object)))
        return {
            "entities": [
                {"name": n, "type": self.types.get(n), "summary": f"{n} in the conversation"}
                for n in names
            ],
            "facts": [
                {
                    "subject": f.subject,
                    "relation": f.relation,
                    "object": f.object,
                    "fact": f.fact,
                    "valid_at": f.valid_at,
                    "invalid_at": f.invalid_at,
                }
                for f in facts
            ],
        }

    def resolve_entities(self, request: FakeRequest) -> dict[str, Any]:
        listed, new = self._sections(
            request.user, "Existing entities (candidates):", "New entities:"
        )
        candidates = []
        for line in listed:
            m = _INDEXED.match(line)
            assert m
            candidates.append((int(m[1]), self.canonical(self._name_at(m[2], (" (",)))))
        matches = []
        for line in new:
            m = _INDEXED.match(line)
            assert m
            mine = self.canonical(self._name_at(m[2], (":",)))
            same = [i for i, c in candidates if c == mine]
            matches.append({"entity": int(m[1]), "duplicate_of": same[0] if same else None})
        return {"matches": matches}

    def resolve_facts(self, request: FakeRequest) -> dict[str, Any]:
        listed, new = self._sections(request.user, "Existing facts:", "New facts:")
        existing: list[tuple[int, Said]] = []
        for line in listed:
            m = _INDEXED.match(line)
            assert m
            old = self._said(m[2].split(": ", 1)[1].rsplit(" (", 1)[0])
            if old is not None:
                existing.append((int(m[1]), old))
        judgements = []
        earlier: list[tuple[int, Said]] = []  # new facts of earlier messages (a joint call)
        current: list[tuple[int, Said]] = []
        for line in new:
            if line.startswith("(message "):
                earlier, current = earlier + current, []
                continue
            m = _INDEXED.match(line)
            assert m
            said = self._said(m[2])
            assert said is not None, f"the script never stated {m[2]!r}"
            current.append((int(m[1]), said))
            me = (
                self.canonical(said.subject),
                to_relation_name(said.relation),
                self.canonical(said.object),
            )
            duplicate, contradicts = None, []
            for i, old in [*existing, *earlier]:
                them = (
                    self.canonical(old.subject),
                    to_relation_name(old.relation),
                    self.canonical(old.object),
                )
                if them == me:
                    duplicate = i
                elif them[:2] == me[:2] and them[2] != me[2] and me[1] in self.one_valued:
                    contradicts.append(i)
            if self.hostile:
                contradicts = [i for i, _ in [*existing, *earlier]] + [99, -1]
            judgements.append(
                {"new_fact": int(m[1]), "duplicate_of": duplicate, "contradicts": contradicts}
            )
        return {"judgements": judgements}


def counts_by_schema(server: ScriptedLLMServer) -> dict[str, int]:
    return {name: server.count(name) for name in (EXTRACTION, JOINT, ENTITY_RES, FACT_RES)}


# ============================================================================= fixtures
# ``store``: each real store in turn (tests/integration/conftest.py).
@pytest.fixture
async def neo4j_store(neo4j_uri: str) -> AsyncIterator[Neo4jStore]:
    """The Neo4j store alone: for the CLI tests, whose subprocesses use the same server."""
    graph = Neo4jStore(neo4j_uri)
    await graph.setup(DIM)
    yield graph
    await graph.close()


@pytest.fixture
async def group_id(store: GraphStore) -> AsyncIterator[str]:
    """A group id of this test's own; every node of it is deleted afterwards."""
    gid = f"test-{os.urandom(6).hex()}"
    yield gid
    await store.forget.delete_group(gid)


@pytest.fixture
async def cli_group(neo4j_driver: Any) -> AsyncIterator[str]:
    """A group id of a CLI test's own, deleted from the Neo4j server afterwards."""
    gid = f"test-{os.urandom(6).hex()}"
    yield gid
    await neo4j_driver.execute_query("MATCH (n {group_id: $g}) DETACH DELETE n", g=gid)


@pytest.fixture(scope="module")
def embedder() -> HashingEmbedder:
    return HashingEmbedder(dim=DIM)


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def server(script: Script) -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer(embedding_dim=DIM) as fake:
        script.install(fake)
        yield fake


def make_llm(server: ScriptedLLMServer, **kw: Any) -> LLMClient:
    options: dict[str, Any] = {
        "timeout": 5.0,
        "max_attempts": 4,
        "backoff_base": 0.01,
        "backoff_max": 0.05,
    }
    options.update(kw)
    return LLMClient(base_url=server.base_url, api_key="test", model="fake", **options)


@pytest.fixture
async def llm(server: ScriptedLLMServer) -> AsyncIterator[LLMClient]:
    client = make_llm(server)
    yield client
    await client.close()


@pytest.fixture
def pipeline(store: GraphStore, embedder: HashingEmbedder, llm: LLMClient) -> GroupRunner:
    return GroupRunner.of(store=store, embedder=embedder, llm=llm, mappings=None)


@pytest.fixture
async def other_group(store: GraphStore) -> AsyncIterator[str]:
    gid = f"test-other-{os.urandom(6).hex()}"
    yield gid
    await store.forget.delete_group(gid)


# ============================================================================= helpers
class Feed:
    """Builds episodes of one group with increasing reference times."""

    def __init__(self, group: str, start: datetime = at(2024, 1, 1)) -> None:
        self.group = group
        self.t = start
        self.n = 0

    def text(
        self, content: str, *, ref: datetime | None = None, source: str = "message"
    ) -> Episode:
        self.n += 1
        self.t = ref or self.t + timedelta(days=1)
        return Episode(
            id=f"{self.group}:msg-{self.n}",
            group_id=self.group,
            source=source,  # type: ignore[arg-type]
            name=f"message {self.n}",
            content=content,
            reference_time=self.t,
        )

    def record(self, record: dict[str, Any], *, ident: str, ref: datetime) -> Episode:
        return Episode(
            id=ident, group_id=self.group, source="json", content=record, reference_time=ref
        )


async def run(pipeline: GroupRunner, episodes: list[Episode]) -> IngestReport:
    report = await ingest(pipeline, episodes)
    assert not report.failures, report.failures
    return report


# Every node and relationship of a group with all its properties, asked of Neo4j in its own
# words; of the embedded store, every row of its tables (rowids left out).
_SNAPSHOT = (
    "MATCH (n:Entity|Episodic|Community) WHERE n.group_id = $g "
    "RETURN labels(n) AS labels, properties(n) AS props ORDER BY n.uuid",
    "MATCH (a:Entity|Episodic|Community)-[r]->(b) WHERE a.group_id = $g "
    "RETURN type(r) AS type, properties(r) AS props, a.uuid AS source, b.uuid AS target "
    "ORDER BY type, source, target, r.uuid",
)
_SQLITE_TABLES = ("episode", "entity", "entity_name", "fact", "mention", "community", "member")


async def snapshot(store: GraphStore, group: str) -> dict[str, Any]:
    """Every node and relationship of the group with all its properties."""
    if isinstance(store, SqliteStore):

        def rows(conn: sqlite3.Connection) -> dict[str, Any]:
            return {
                table: sorted(
                    tuple((k, r[k]) for k in r.keys() if k != "id")
                    for r in conn.execute(f"SELECT * FROM {table} WHERE group_id = ?", (group,))
                )
                for table in _SQLITE_TABLES
            }

        return await store.db.run(rows)
    nodes_query, rels_query = _SNAPSHOT
    ex = store.ex  # type: ignore[attr-defined]

    def props(value: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in value.items() if not k.startswith("_")}

    nodes = await ex.rows(nodes_query, {"g": group})
    rels = await ex.rows(rels_query, {"g": group})
    return {
        "nodes": [(sorted(r["labels"]), props(r["props"])) for r in nodes],
        "rels": [(r["type"], props(r["props"]), r["source"], r["target"]) for r in rels],
    }


async def facts_of(store: GraphStore, group: str) -> dict[tuple[str, str, str], Any]:
    """Every stored fact (whole history) by (subject, relation, object)."""
    views = await store.browse.query_facts(group, include_invalid=True)
    out: dict[tuple[str, str, str], Any] = {}
    for v in views:
        key = (v.subject, v.relation, v.object)
        assert key not in out, f"two facts {key}"
        out[key] = v
    return out


async def values_at(store: GraphStore, group: str, t: datetime, **kw: Any) -> set[tuple]:
    views = await store.browse.query_facts(group, valid_at=t, **kw)
    return {(v.subject, v.relation, v.object) for v in views}


def parse_iso(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))


# ============================================================================= contradiction
async def test_a_later_contradicting_fact_closes_the_earlier_one_and_a_late_one_is_born_closed(
    store: GraphStore,
    pipeline: GroupRunner,
    server: ScriptedLLMServer,
    script: Script,
    group_id: str,
) -> None:
    feed = Feed(group_id)
    first = feed.text(
        script.says(
            "Alice here, I work at Acme Corp since 2023.",
            "Alice Smith[Person] -WORKS_AT-> Acme Corp[Organization] @2023",
        ),
        ref=at(2024, 1, 10),
    )
    second = feed.text(
        script.says(
            "Quick update: I moved to Globex last March!",
            "Alice Smith -WORKS_AT-> Globex[Organization] @since last March",
        ),
        ref=at(2024, 6, 1),
    )
    await run(pipeline, [first])
    before_close = datetime.now(UTC)
    report = await run(pipeline, [second])
    assert (report.facts_new, report.facts_closed, report.facts_born_closed) == (1, 1, 0)

    facts = await facts_of(store, group_id)
    acme = facts[("Alice Smith", "WORKS_AT", "Acme Corp")]
    globex = facts[("Alice Smith", "WORKS_AT", "Globex")]
    assert parse_iso(acme.valid_at) == at(2023, 1, 1)
    assert parse_iso(acme.invalid_at) == parse_iso(globex.valid_at) == at(2024, 3, 1)
    assert acme.expired_at is not None and parse_iso(acme.expired_at) >= before_close
    assert globex.invalid_at is None and globex.expired_at is None

    # A fact about an earlier time arrives after both: stored already closed.
    late = feed.text(
        script.says(
            "Before Acme I was at Initech, from May 2020.",
            "Alice Smith -WORKS_AT-> Initech[Organization] @2020-05-01",
        ),
        ref=at(2024, 7, 1),
    )
    report = await run(pipeline, [late])
    assert (report.facts_new, report.facts_born_closed, report.facts_closed) == (1, 1, 0)
    facts = await facts_of(store, group_id)
    initech = facts[("Alice Smith", "WORKS_AT", "Initech")]
    assert parse_iso(initech.valid_at) == at(2020, 5, 1)
    assert parse_iso(initech.invalid_at) == at(2023, 1, 1)  # bounded by the next job
    assert initech.expired_at == initech.created_at  # born closed
    assert facts[("Alice Smith", "WORKS_AT", "Acme Corp")] == acme  # untouched
    assert facts[("Alice Smith", "WORKS_AT", "Globex")].invalid_at is None

    for t, employer in [
        (at(2021, 1, 1), "Initech"),
        (at(2023, 6, 1), "Acme Corp"),
        (at(2024, 3, 1), "Globex"),
        (datetime.now(UTC), "Globex"),
    ]:
        assert await values_at(store, group_id, t) == {("Alice Smith", "WORKS_AT", employer)}
    assert await values_at(store, group_id, at(2019, 1, 1)) == set()
    # One extraction per episode; fact resolution only once there were candidates.
    assert counts_by_schema(server) == {EXTRACTION: 3, JOINT: 0, ENTITY_RES: 0, FACT_RES: 2}


async def test_unrelated_facts_never_close_each_other_even_when_the_llm_says_so(
    store: GraphStore,
    pipeline: GroupRunner,
    server: ScriptedLLMServer,
    script: Script,
    group_id: str,
) -> None:
    feed = Feed(group_id)
    await run(
        pipeline,
        [
            feed.text(
                script.says(
                    "Team intro: Alice is at Acme, Bob lives in Paris, Dave uses the LaserJet.",
                    "Alice[Person] -WORKS_AT-> Acme[Organization]",
                    "Bob[Person] -LIVES_IN-> Paris[Place]",
                    "Dave[Person] -USES-> LaserJet[Product]",
                ),
                ref=at(2024, 1, 1),
            )
        ],
    )
    script.hostile = True  # from now on, every new fact "contradicts" every candidate
    report = await run(
        pipeline,
        [
            feed.text(
                script.says(
                    "News: Alice joined Globex. Bob still lives in Paris.",
                    "Alice -WORKS_AT-> Globex[Organization]",
                    # Worded otherwise: a candidate the LLM is asked about (and says duplicate).
                    "Bob -LIVES_IN-> Paris = Bob still lives in Paris",
                ),
                ref=at(2024, 2, 1),
            )
        ],
    )
    assert server.count(FACT_RES) == 1  # the LLM was asked, and answered with everything
    (asked,) = [request.user for name, request, _ in server.requests if name == FACT_RES]
    assert "Alice works at Acme (" in asked and "Bob lives in Paris (" in asked  # both shown
    assert (report.facts_new, report.facts_merged, report.facts_closed) == (1, 1, 1)
    facts = await facts_of(store, group_id)
    assert parse_iso(facts[("Alice", "WORKS_AT", "Acme")].invalid_at) == at(2024, 2, 1)
    for key in [
        ("Bob", "LIVES_IN", "Paris"),
        ("Dave", "USES", "LaserJet"),
        ("Alice", "WORKS_AT", "Globex"),
    ]:
        assert facts[key].invalid_at is None and facts[key].expired_at is None, key
    assert len(facts[("Bob", "LIVES_IN", "Paris")].episodes) == 2

    # A fact sharing no endpoint with anything stored is never even shown to the LLM.
    await run(
        pipeline,
        [
            feed.text(
                script.says(
                    "Carol works at Initech.",
                    "Carol[Person] -WORKS_AT-> Initech[Organization]",
                ),
                ref=at(2024, 3, 1),
            )
        ],
    )
    assert server.count(FACT_RES) == 1
    assert len(await values_at(store, group_id, at(2024, 3, 2))) == 4


# The shared CRM mapping (tests.support.crm_feed), with the plan relation spelled
# "`has`plan`" to show that a mapping's relation type is stored normalised.
CRM_MAPPING = crm.CRM_MAPPING.replace("relation: HAS_PLAN,", 'relation: "`has`plan`",')
assert CRM_MAPPING != crm.CRM_MAPPING


def crm_mappings() -> MappingSet:
    return MappingSet.model_validate(yaml.safe_load(CRM_MAPPING))


@dataclass(frozen=True)
class Event:
    """One CRM change: the subject's relation has ``value`` from ``at`` on (for ``left``:
    the contact stops working at ``value``)."""

    kind: str
    subject_id: int
    value: str
    at: datetime


ACCOUNTS = {1: "Acme Corp", 2: "Globex", 3: "Initech"}
OWNERS = {"Olivia": 10, "Omar": 11, "Oscar": 12}


def crm_record(event: Event) -> dict[str, Any]:
    account = (event.subject_id, ACCOUNTS.get(event.subject_id, "?"))
    if event.kind in ("joined", "left"):
        contact = (event.subject_id, f"Contact {event.subject_id}")
        company_id = next(i for i, name in ACCOUNTS.items() if name == event.value)
        return crm.contact_record(event.kind, contact, (company_id, event.value), event.at)
    if event.kind == "plan":
        return crm.plan_record(account, event.value, event.at)
    if event.kind == "owner":
        return crm.owner_record(account, (OWNERS[event.value], event.value), event.at)
    return crm.ticket_record(event.subject_id, event.value, (1, "Acme Corp"), event.at)


def crm_subject(event: Event) -> tuple[str, str]:
    if event.kind == "plan":
        return ACCOUNTS[event.subject_id], "HAS_PLAN"
    if event.kind == "owner":
        return ACCOUNTS[event.subject_id], "OWNED_BY"
    if event.kind in ("joined", "left"):
        return f"Contact {event.subject_id}", "WORKS_AT"
    return f"Ticket {event.subject_id}", "HAS_STATUS"


def expected_at(events: list[Event], t: datetime) -> set[tuple[str, str, str]]:
    """Ground truth: per subject+relation, the value of the latest change at or before t."""
    latest: dict[tuple[str, str], Event] = {}
    for event in sorted(events, key=lambda e: e.at):
        if event.at <= t:
            latest[crm_subject(event)] = event
    return {(s, r, e.value) for (s, r), e in latest.items() if e.kind != "left"}


def crm_events() -> list[Event]:
    d = at(2024, 1, 1)
    days = lambda n: d + timedelta(days=n)  # noqa: E731
    return [
        Event("plan", 1, "Basic", days(0)),
        Event("plan", 1, "Pro", days(30)),
        Event("plan", 1, "Enterprise", days(60)),
        Event("plan", 1, "Pro", days(90)),
        Event("plan", 2, "Pro", days(5)),
        Event("plan", 2, "Basic", days(45)),
        Event("plan", 3, "Basic", days(10)),
        Event("owner", 1, "Olivia", days(0)),
        Event("owner", 1, "Omar", days(40)),
        Event("owner", 2, "Omar", days(5)),
        Event("owner", 2, "Oscar", days(70)),
        Event("owner", 3, "Oscar", days(10)),
        Event("ticket", 100, "open", days(20)),
        Event("ticket", 100, "pending", days(22)),
        Event("ticket", 100, "closed", days(25)),
        Event("ticket", 100, "open", days(50)),
        Event("ticket", 100, "closed", days(55)),
        Event("ticket", 101, "open", days(33)),
        Event("ticket", 101, "closed", days(80)),
        Event("joined", 7, "Acme Corp", days(3)),
        Event("left", 7, "Acme Corp", days(35)),
        Event("joined", 7, "Globex", days(50)),
        Event("left", 7, "Globex", days(85)),
        Event("joined", 8, "Globex", days(12)),
        Event("joined", 8, "Initech", days(65)),
    ]


def crm_episode(group: str, event: Event, n: int) -> Episode:
    return Episode(
        id=f"crm:{event.kind}:{event.subject_id}:{event.at.date()}",
        group_id=group,
        source="json",
        content=crm_record(event),
        reference_time=event.at + timedelta(hours=1 + n),  # delivery order != event order
    )


# Every change instant, the moment before it, and the middle of each interval.
_CHANGES = sorted({e.at for e in crm_events()})
CHECK_TIMES = sorted(
    {at(2023, 6, 1), at(2030, 1, 1)}
    | set(_CHANGES)
    | {t - timedelta(seconds=1) for t in _CHANGES}
    | {a + (b - a) / 2 for a, b in zip(_CHANGES, _CHANGES[1:], strict=False)}
)


async def test_mapped_cardinality_one_after_out_of_order_delivery(
    store: GraphStore,
    embedder: HashingEmbedder,
    llm: LLMClient,
    server: ScriptedLLMServer,
    group_id: str,
    tmp_path: Path,
) -> None:
    mapping_file = tmp_path / "crm.yaml"
    mapping_file.write_text(CRM_MAPPING)
    pipeline = GroupRunner.of(
        store=store, embedder=embedder, llm=llm, mappings=MappingSet.load(mapping_file)
    )
    events = crm_events()
    # Reversed within every subject: each change arrives before the ones it follows.
    delivery = sorted(events, key=lambda e: (e.kind, e.subject_id, -e.at.timestamp()))
    episodes = [crm_episode(group_id, e, n) for n, e in enumerate(delivery)]
    report = await run(pipeline, episodes)
    assert report.facts_born_closed > 0  # late facts really happened
    assert counts_by_schema(server) == {EXTRACTION: 0, JOINT: 0, ENTITY_RES: 0, FACT_RES: 0}
    for t in CHECK_TIMES:
        got = {f for f in await values_at(store, group_id, t) if f[1] != "FOR_ACCOUNT"}
        assert got == expected_at(events, t), t
    # The relation type from the mapping (`has`plan`) is stored normalised.
    relations = {v.relation for v in await store.browse.query_facts(group_id, include_invalid=True)}
    assert relations == {"HAS_PLAN", "OWNED_BY", "HAS_STATUS", "FOR_ACCOUNT", "WORKS_AT"}
    # Plans are shared entities: Acme's changes never closed Globex's or Initech's plan.
    assert ("Initech", "HAS_PLAN", "Basic") in await values_at(store, group_id, datetime.now(UTC))


async def test_the_same_episode_twice_changes_nothing_and_a_whole_feed_twice_neither(
    store: GraphStore,
    embedder: HashingEmbedder,
    llm: LLMClient,
    server: ScriptedLLMServer,
    script: Script,
    group_id: str,
) -> None:
    pipeline = GroupRunner.of(
        store=store,
        embedder=embedder,
        llm=llm,
        mappings=crm_mappings(),
    )
    feed = Feed(group_id)
    episodes = [
        feed.text(
            script.says(
                "Alice from Acme Corp here; we are on the Pro plan.",
                "Alice[Person] -WORKS_AT-> Acme Corp[Organization]",
                "Acme Corp -HAS_PLAN-> Pro[Plan] @since last March",
            )
        ),
        *(crm_episode(group_id, e, n) for n, e in enumerate(crm_events()[:8])),
        feed.text(
            script.says(
                "Alice moved to Globex, she says Acme Corp is on Enterprise.",
                "Alice -WORKS_AT-> Globex[Organization]",
                "Acme Corp -HAS_PLAN-> Enterprise[Plan]",
            )
        ),
    ]
    await run(pipeline, episodes)
    calls = len(server.requests)
    first = await snapshot(store, group_id)
    assert all(
        v for k, v in first.items() if k not in ("community", "member")
    )  # no communities here

    [outcome] = await pipeline.run([episodes[0]])
    assert outcome.status == "processed"
    assert await snapshot(store, group_id) == first  # same counts AND properties

    report = await ingest(pipeline, episodes)
    assert (report.episodes, report.already_processed, report.failures) == (
        len(episodes),
        len(episodes),
        [],
    )
    assert await snapshot(store, group_id) == first
    assert len(server.requests) == calls  # a replay costs no LLM call


async def test_a_replay_after_a_crash_mid_episode_gives_the_same_graph(
    store: GraphStore,
    embedder: HashingEmbedder,
    llm: LLMClient,
    script: Script,
    group_id: str,
    other_group: str,
) -> None:
    """An episode whose entities are stored but whose write never happened (a worker of an
    earlier version that wrote entities at resolution, killed before the write) ends, once
    redelivered, exactly like an uninterrupted run (compared by names: uuids and ingestion
    times differ between the two groups)."""
    lines = [
        (
            "Alice from Acme Corp: we use the LaserJet.",
            [
                "Alice[Person] -WORKS_AT-> Acme Corp[Organization]",
                "Acme Corp -USES-> LaserJet[Product]",
            ],
        ),
        (
            "Bob: Alice left for Globex in April.",
            ["Alice -WORKS_AT-> Globex[Organization] @April 2024", "Bob[Person] -KNOWS-> Alice"],
        ),
        (
            "Acme Corp replaced the LaserJet with an OfficeJet.",
            ["Acme Corp -USES-> OfficeJet[Product]"],
        ),
    ]
    for content, facts in lines:
        script.says(content, *facts)

    def episodes(group: str) -> list[Episode]:
        feed = Feed(group, start=at(2024, 5, 1))
        return [feed.text(content) for content, _ in lines]

    clean = GroupRunner.of(store=store, embedder=embedder, llm=llm, mappings=None)
    await run(clean, episodes(other_group))

    crashed = episodes(group_id)
    await run(clean, crashed[:1])
    resolution = ResolutionStep(store=store, embedder=embedder, llm=llm)
    resolved = await resolution.run(await clean.extraction.run(crashed[1]))
    assert resolved.pending.created  # resolution leaves its upserts to the episode's write
    await upsert_entities(store, group_id, resolved.pending.entities)  # then the worker dies
    assert not await store.episode_processed(group_id, crashed[1].uuid)
    await run(clean, crashed)

    async def by_name(group: str) -> tuple[list, list]:
        entities = sorted(
            (e.name, e.labels, e.summary, e.key, sorted(e.aliases))
            for e in await store.browse.list_entities(group)
        )
        facts = sorted(
            (
                v.subject,
                v.relation,
                v.object,
                v.fact,
                v.valid_at,
                v.invalid_at,
                v.expired_at is None,
                [ep.split(":", 1)[1] for ep in v.episodes],
            )
            for v in await store.browse.query_facts(group, include_invalid=True)
        )
        return entities, facts

    assert await by_name(group_id) == await by_name(other_group)
    assert await store.browse.counts(group_id) == await store.browse.counts(other_group)


# ============================================================================= resolution
async def test_acme_corp_and_acme_corporation_resolve_to_one_entity_when_the_llm_says_so(
    store: GraphStore,
    pipeline: GroupRunner,
    server: ScriptedLLMServer,
    script: Script,
    group_id: str,
    other_group: str,
) -> None:
    script.declare_same("ACME Corporation", "Acme Corp")
    contents = [
        script.says(
            "Our customer Acme Corp bought the Pro plan.",
            "Acme Corp[Organization] -HAS_PLAN-> Pro[Plan]",
        ),
        script.says(
            "ACME Corporation called about their invoice.",
            "ACME Corporation[Organization] -DISPUTES-> Invoice 7[Invoice]",
        ),
        script.says("acme corporation paid invoice 7.", "acme corporation -PAID-> Invoice 7"),
    ]
    feed = Feed(group_id)
    await run(pipeline, [feed.text(contents[0]), feed.text(contents[1])])
    assert server.count(ENTITY_RES) == 1  # only "ACME Corporation" was undecided
    entities = await store.browse.list_entities(group_id)
    assert sorted(e.name for e in entities) == ["Acme Corp", "Invoice 7", "Pro"]
    acme = next(e for e in entities if e.name == "Acme Corp")
    assert "acme corporation" in acme.aliases
    subjects = {v.subject for v in await store.browse.query_facts(group_id, include_invalid=True)}
    assert subjects == {"Acme Corp"}

    # Now a known alias: exact match, no LLM call.
    await run(pipeline, [feed.text(contents[2])])
    assert server.count(ENTITY_RES) == 1
    assert len(await store.browse.list_entities(group_id)) == 3

    # Control: when the LLM says they differ, they stay two entities.
    script.same.clear()
    other = Feed(other_group)
    await run(pipeline, [other.text(contents[0]), other.text(contents[1])])
    assert server.count(ENTITY_RES) == 2
    names = sorted(e.name for e in await store.browse.list_entities(other_group))
    assert names == ["ACME Corporation", "Acme Corp", "Invoice 7", "Pro"]


async def test_records_with_the_same_crm_key_resolve_without_any_llm_call(
    store: GraphStore,
    embedder: HashingEmbedder,
    llm: LLMClient,
    server: ScriptedLLMServer,
    group_id: str,
) -> None:
    pipeline = GroupRunner.of(store=store, embedder=embedder, llm=llm, mappings=crm_mappings())
    feed = Feed(group_id)
    records = [
        {
            "type": "account.plan",
            "account": {"id": 42, "name": "Acme Corp"},
            "plan": "Pro",
            "at": "2024-01-01",
        },
        {
            "type": "account.plan",
            "account": {"id": 42, "name": "ACME Corporation"},
            "plan": "Enterprise",
            "at": "2024-02-01",
        },
        {
            "type": "contact.joined",
            "contact": {"id": 7, "name": "Alice"},
            "company": {"id": 42, "name": "Acme (renamed)"},
            "at": "2024-03-01",
        },
        {
            "type": "account.plan",
            "account": {"id": 43, "name": "Acme Corp"},
            "plan": "Basic",
            "at": "2024-03-01",
        },  # another account that happens to share the name
    ]
    episodes = [
        feed.record(r, ident=f"crm-{i}", ref=at(2024, 4, 1) + timedelta(i))
        for i, r in enumerate(records)
    ]
    report = await run(pipeline, episodes)
    assert server.requests == []  # not one LLM request, of any kind
    entities = await store.browse.list_entities(group_id)
    assert report.entities_new == len(entities) == 6  # 2 accounts, 3 plans, 1 contact
    assert "6 new entities" in report.line()
    keyed = {e.key: e for e in entities if e.key}
    assert set(keyed) == {"crm:account:42", "crm:account:43", "crm:contact:7"}
    acme = keyed["crm:account:42"]
    assert acme.name == "Acme Corp"
    assert {"acme corporation", "acme renamed"} <= set(acme.aliases)
    now = await values_at(store, group_id, datetime.now(UTC))
    assert now == {
        ("Acme Corp", "HAS_PLAN", "Enterprise"),
        ("Alice", "WORKS_AT", "Acme Corp"),
        ("Acme Corp", "HAS_PLAN", "Basic"),
    }
    views = await store.browse.query_facts(group_id, entity_uuid=keyed["crm:account:43"].uuid)
    assert [(v.relation, v.object) for v in views] == [("HAS_PLAN", "Basic")]


async def test_a_text_mention_joins_the_one_crm_entity_of_its_name_without_an_llm_call(
    store: GraphStore,
    embedder: HashingEmbedder,
    llm: LLMClient,
    server: ScriptedLLMServer,
    script: Script,
    group_id: str,
    other_group: str,
) -> None:
    """A ticket that says "Acme Corp" is about the CRM account named Acme Corp: with one keyed
    entity of that name, no resolution call; with two (two accounts share the name), the
    LLM decides, as it does for any undecided mention."""
    pipeline = GroupRunner.of(store=store, embedder=embedder, llm=llm, mappings=crm_mappings())

    def account(feed: Feed, ident: int, at_day: int) -> Episode:
        record = {"type": "account.plan", "account": {"id": ident, "name": "Acme Corp"},
                  "plan": "Pro", "at": "2024-01-01"}  # fmt: skip
        return feed.record(record, ident=f"crm-{ident}", ref=at(2024, 1, at_day))

    said = script.says(
        "Acme Corp reported a broken printer.", "Acme Corp[Organization] -REPORTED-> Printer"
    )
    feed = Feed(group_id)
    await run(pipeline, [account(feed, 42, 1), feed.text(said)])
    assert server.count(ENTITY_RES) == 0
    entities = await store.browse.list_entities(group_id)
    assert sorted(e.name for e in entities) == ["Acme Corp", "Printer", "Pro"]
    [acme] = [e for e in entities if e.name == "Acme Corp"]
    assert acme.key == "crm:account:42" and "Organization" in acme.labels
    reported = {(v.subject, v.relation) for v in await store.browse.query_facts(group_id)}
    assert ("Acme Corp", "REPORTED") in reported
    assert {v.uuid for v in await store.browse.query_facts(group_id, entity_uuid=acme.uuid)} == {
        v.uuid for v in await store.browse.query_facts(group_id)
    }

    other = Feed(other_group)
    await run(pipeline, [account(other, 42, 1), account(other, 43, 2), other.text(said)])
    assert server.count(ENTITY_RES) == 1  # two keyed Acme Corps: the mention is undecided


# ============================================================================= hostile text
async def test_hostile_names_and_relation_types_are_stored_verbatim_and_harm_nothing(
    store: GraphStore,
    pipeline: GroupRunner,
    embedder: HashingEmbedder,
    llm: LLMClient,
    script: Script,
    group_id: str,
    other_group: str,
) -> None:
    canary = Feed(other_group)
    canary_says = script.says("Canary: Alice works at Acme.", "Alice[Person] -WORKS_AT-> Acme[Org]")
    await run(pipeline, [canary.text(canary_says)])
    canary_before = await snapshot(store, other_group)

    feed = Feed(group_id)
    text = feed.text(
        script.says(
            f"{HOSTILE_NAME} talked to Bob `the` builder",
            f"{HOSTILE_NAME}[Person`) MATCH (n) DETACH DELETE n //] -{HOSTILE_RELATION}-> "
            f"Bob `the` builder",
        )
    )
    mapped = GroupRunner.of(store=store, embedder=embedder, llm=llm, mappings=crm_mappings())
    record = feed.record(
        {
            "type": "account.plan",
            "account": {"id": "1' OR 1=1 //", "name": HOSTILE_NAME},
            "plan": "`Pro`}) DETACH DELETE n",
            "at": "2024-02-01",
        },
        ident="crm:`hostile`'",
        ref=at(2024, 3, 1),
    )
    await run(pipeline, [text])
    await run(mapped, [record])

    entities = {e.name: e for e in await store.browse.list_entities(group_id)}
    assert set(entities) == {HOSTILE_NAME, "Bob `the` builder", "`Pro`}) DETACH DELETE n"}
    # The text mention and the CRM record are one entity (same name; the record adds its key).
    assert entities[HOSTILE_NAME].key == "crm:account:1' OR 1=1 //"
    assert entities[HOSTILE_NAME].labels == ["Person_MATCH_n_DETACH_DELETE_n_", "Account"]
    facts = await store.browse.query_facts(group_id, include_invalid=True)
    relations = sorted((v.subject, v.relation, v.object) for v in facts)
    assert relations == [
        (HOSTILE_NAME, "HAS_PLAN", "`Pro`}) DETACH DELETE n"),
        (HOSTILE_NAME, "WORKS_AT_MATCH_N_DETACH_DELETE_N", "Bob `the` builder"),
    ]
    hostile_fact = next(v for v in facts if v.relation.startswith("WORKS_AT"))
    assert hostile_fact.fact.startswith(HOSTILE_NAME)
    assert hostile_fact.episodes == [text.id]
    plan_fact = next(v for v in facts if v.relation == "HAS_PLAN")
    assert plan_fact.episodes == ["crm:`hostile`'"]
    assert await store.browse.counts(group_id) == {
        "episodes": 2,
        "entities": 3,
        "facts": 2,
        "mentions": 4,
    }
    assert await snapshot(store, other_group) == canary_before


# ============================================================================= LLM faults
async def test_llm_rate_limits_server_errors_and_timeouts_are_retried(
    store: GraphStore,
    embedder: HashingEmbedder,
    server: ScriptedLLMServer,
    script: Script,
    group_id: str,
) -> None:
    client = make_llm(server, timeout=0.5, max_attempts=6)
    # One call per episode: the faults follow each call (a joint call's faults: test_batches).
    pipeline = GroupRunner.of(
        store=store, embedder=embedder, llm=client, mappings=None, episodes_per_call=1
    )
    feed = Feed(group_id)
    first = feed.text(script.says("Alice joined Acme.", "Alice[Person] -WORKS_AT-> Acme[Org]"))
    second = feed.text(script.says("Alice moved to Globex.", "Alice -WORKS_AT-> Globex[Org]"))
    server.inject("429", times=2, schema_name=EXTRACTION, retry_after=0.01)
    server.inject("500", times=1, schema_name=EXTRACTION)
    server.inject("timeout", times=1, schema_name=EXTRACTION)
    server.inject("500", times=1, schema_name=FACT_RES)
    server.inject("429", times=1, schema_name=FACT_RES)
    try:
        report = await run(pipeline, [first, second])
    finally:
        await client.close()
    assert report.episodes == 2
    statuses = [(name, status) for name, _, status in server.requests]
    assert statuses == [
        (EXTRACTION, 429),
        (EXTRACTION, 429),
        (EXTRACTION, 500),
        (EXTRACTION, TIMEOUT_STATUS),
        (EXTRACTION, 200),
        (EXTRACTION, 200),
        (FACT_RES, 500),
        (FACT_RES, 429),
        (FACT_RES, 200),
    ]
    assert await values_at(store, group_id, datetime.now(UTC)) == {("Alice", "WORKS_AT", "Globex")}
    errors = client.stats.errors
    assert errors[("extraction", "rate_limited")] == 2 and errors[("extraction", "timeout")] == 1


@pytest.mark.parametrize("fault", ["malformed", "invalid_schema"])
async def test_malformed_answers_are_retried_then_the_episode_is_stored_unextracted(
    store: GraphStore,
    embedder: HashingEmbedder,
    server: ScriptedLLMServer,
    script: Script,
    group_id: str,
    fault: str,
) -> None:
    client = make_llm(server, max_attempts=3)
    pipeline = GroupRunner.of(
        store=store, embedder=embedder, llm=client, mappings=None, episodes_per_call=1
    )
    pipeline.extract_ahead = 1  # one extraction at a time: the faults follow the group's progress
    feed = Feed(group_id)
    episodes = [
        feed.text(script.says("Alice joined Acme.", "Alice[Person] -WORKS_AT-> Acme[Org]")),
        feed.text(script.says("Bob lives in Paris.", "Bob[Person] -LIVES_IN-> Paris[Place]")),
        feed.text(script.says("Carol uses Slack.", "Carol[Person] -USES-> Slack[Product]")),
    ]
    # Faults hit the next matching requests: arm them as the (sequential) group advances.
    arm = iter(
        [
            lambda: server.inject(fault, times=3, schema_name=EXTRACTION),  # all attempts
            lambda: server.inject("malformed", times=1, schema_name=EXTRACTION),  # just one
        ]
    )
    try:
        report = await ingest(pipeline, episodes, on_done=lambda _: next(arm, lambda: None)())
    finally:
        await client.close()
    # The episode the LLM kept failing on is not lost and not dead-lettered: it is stored
    # without extraction (docs/architecture.md "Episodes without an LLM"), with why.
    assert report.episodes == 3 and report.failures == []
    assert server.count(EXTRACTION, status=200) == 6  # 1, then 3 failed, then 1 failed + 1
    assert await store.episode_status(group_id, episodes[1].uuid) == "not_extracted"
    asked = [e.uuid for e in episodes] + ["never-sent"]
    assert await store.episode_statuses(group_id, asked) == {
        episodes[0].uuid: "processed",
        episodes[1].uuid: "not_extracted",
        episodes[2].uuid: "processed",
        "never-sent": "missing",
    }
    elsewhere = await store.episode_statuses(f"{group_id}-other", asked)  # tenants apart
    assert set(elsewhere.values()) == {"missing"}
    [pending] = await store.pending_episodes(group_id, 10)
    assert (pending.producer_id, pending.not_extracted) == (episodes[1].id, "llm_invalid_output")
    assert pending.content == episodes[1].content
    # The other episodes of the group went on; the failed one is not marked processed.
    assert await values_at(store, group_id, datetime.now(UTC)) == {
        ("Alice", "WORKS_AT", "Acme"),
        ("Carol", "USES", "Slack"),
    }
    assert not await store.episode_processed(group_id, episodes[1].uuid)
    # Redelivered once the model behaves, it goes through.
    retry_client = make_llm(server)
    try:
        again = await ingest(
            GroupRunner.of(store=store, embedder=embedder, llm=retry_client, mappings=None),
            episodes,
        )
    finally:
        await retry_client.close()
    assert (again.already_processed, again.failures) == (2, [])
    assert ("Bob", "LIVES_IN", "Paris") in await values_at(store, group_id, datetime.now(UTC))


async def test_a_store_error_before_any_stage_fails_only_that_episode(
    store: GraphStore, embedder: HashingEmbedder, llm: LLMClient, script: Script, group_id: str
) -> None:
    feed = Feed(group_id)
    episodes = [
        feed.text(script.says("Alice joined Acme.", "Alice[Person] -WORKS_AT-> Acme[Org]")),
        feed.text(script.says("Bob lives in Paris.", "Bob[Person] -LIVES_IN-> Paris[Place]")),
        feed.text(script.says("Carol uses Slack.", "Carol[Person] -USES-> Slack[Product]")),
    ]

    class Flaky:
        """The real store, except that reading one episode's marker fails (alone, or with
        the markers of the episodes extracted with it)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        async def episode_processed(
            self, group: str, uuid: str, content_hash: str | None = None
        ) -> bool:
            if uuid == episodes[1].uuid:
                raise ConnectionError("Neo4j went away")
            return await store.episode_processed(group, uuid, content_hash)

        async def episode_markers(
            self, group: str, asked: list[tuple[str, str | None]]
        ) -> dict[str, list[str]]:
            if any(uuid == episodes[1].uuid for uuid, _ in asked):
                raise ConnectionError("Neo4j went away")
            return await store.episode_markers(group, asked)

    chain = GroupRunner.of(
        store=Flaky(),  # type: ignore[arg-type]
        embedder=embedder,
        llm=llm,
        mappings=None,
        policy=RetryPolicy(max_attempts=2, backoff=0.01),
    )
    report = await ingest(chain, episodes)
    assert report.episodes == 2
    assert [
        (f.failure.stage, f.failure.error_class, f.failure.reason, f.episode_id)
        for f in report.failures
    ] == [("extraction", "ConnectionError", "io", episodes[1].id)]
    assert len(await values_at(store, group_id, datetime.now(UTC))) == 2


# ============================================================================= LLM cost
def support_feed(feed: Feed, script: Script, people: tuple[str, str], company: str) -> list:
    a, b = people
    group = feed.group
    return [
        feed.text(script.says(content, *facts))
        for content, facts in [
            (
                f"Hi, {a} from {company} here. Our {company} account is on the Basic plan and the "
                f"LaserJet 4000 keeps jamming.",
                [
                    f"{a}[Person] -WORKS_AT-> {company}[Organization]",
                    f"{company} -HAS_PLAN-> Basic[Plan]",
                    f"{company} -USES-> LaserJet 4000[Product]",
                ],
            ),
            (
                f"{b} from support: thanks {a}, I opened ticket T-{group[-3:]} for the "
                "LaserJet 4000.",
                [f"{b}[Person] -WORKS_AT-> Support Team[Team]", f"{a} -REPORTED-> LaserJet 4000"],
            ),
            (
                f"{a}: we upgraded {company} to the Pro plan yesterday.",
                [f"{company} -HAS_PLAN-> Pro[Plan] @yesterday"],
            ),
            (
                f"{b}: the LaserJet 4000 is fixed, {a} confirmed. {company} still uses it.",
                [f"{b} -FIXED-> LaserJet 4000", f"{company} -USES-> LaserJet 4000"],
            ),
            (
                f"{a}: I am moving to Northwind next month; {b} will talk to my colleague Dana.",
                [
                    f"{a} -WORKS_AT-> Northwind[Organization] @next month",
                    f"Dana[Person] -WORKS_AT-> {company}",
                    f"{b} -KNOWS-> Dana",
                ],
            ),
        ]
    ]


async def test_llm_calls_per_episode_by_stage_on_a_small_text_feed(
    store: GraphStore,
    pipeline: GroupRunner,
    server: ScriptedLLMServer,
    script: Script,
    group_id: str,
    other_group: str,
) -> None:
    third = Feed(f"{group_id}-c", start=at(2024, 4, 1))
    script.declare_same("Contoso Ltd", "Contoso")
    episodes = [
        *support_feed(Feed(group_id, start=at(2024, 4, 1)), script, ("Alice", "Sam"), "Acme Corp"),
        *support_feed(Feed(other_group, start=at(2024, 4, 1)), script, ("Bruno", "Sam"), "Globex"),
        *support_feed(third, script, ("Chen", "Priya"), "Contoso")[:3],
        # A variant name the LLM must resolve against the stored "Contoso".
        third.text(
            script.says(
                "Priya: Contoso Ltd asked for an invoice copy.",
                "Contoso Ltd[Organization] -REQUESTED-> Invoice Copy[Document]",
            )
        ),
    ]
    try:
        report = await run(pipeline, episodes)
        names = {e.name for e in await store.browse.list_entities(third.group)}
        assert "Contoso" in names and "Contoso Ltd" not in names  # resolved by the LLM
    finally:
        await store.forget.delete_group(third.group)
    counts = counts_by_schema(server)
    n = len(episodes)
    per_episode = {name: round(c / n, 2) for name, c in counts.items()}
    total = sum(counts.values()) / n
    print(
        f"\nLLM calls on {n} message episodes in 3 groups: {counts}; "
        f"per episode {per_episode}, total {total:.2f} "
        f"(ingest report: {report.llm_calls} calls, {report.facts_new} new facts, "
        f"{report.facts_merged} merged, {report.facts_closed} closed)"
    )
    assert n >= 10
    # A group's waiting episodes are extracted four to a call (docs/streaming.md "Batch-native
    # stages").
    per_group = Counter(e.group_id for e in episodes).values()
    assert counts[EXTRACTION] + counts[JOINT] == sum(math.ceil(k / 4) for k in per_group)
    assert counts[ENTITY_RES] <= n and counts[FACT_RES] <= n
    assert total <= 3
    assert report.llm_calls == sum(counts.values())
    assert report.facts_closed >= 4  # plans upgraded, people moved
    assert server.count(status=None) == sum(counts.values())  # no failed request hidden


# ============================================================================= the CLI
def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidegraph.app.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def cli_env(neo4j_uri: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGRAPH_")}
    env.update(
        TIDEGRAPH_STORE="neo4j",
        TIDEGRAPH_NEO4J_URI=neo4j_uri,
        TIDEGRAPH_EMBEDDER="hashing",
        TIDEGRAPH_EMBEDDING_DIM=str(DIM),
        TIDEGRAPH_DATA_DIR=str(tmp_path / "data"),
        TIDEGRAPH_LOG_LEVEL="WARNING",
    )
    return env


def cli_facts(env: dict[str, str], group: str, *args: str) -> list[dict[str, Any]]:
    done = cli(env, "facts", "--group", group, "--json", *args)
    assert done.returncode == 0, done.stderr
    return [orjson.loads(line) for line in done.stdout.splitlines()]


def write_jsonl(path: Path, episodes: list[Episode]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(e.model_dump(mode="json")) + b"\n" for e in episodes))
    return path


async def test_cli_mapped_feed_answers_valid_at_and_known_at(
    cli_env: dict[str, str], neo4j_store: Neo4jStore, cli_group: str, tmp_path: Path
) -> None:
    """`tidegraph ingest --mapping` twice (the second part out of order and with late
    arrivals), then `tidegraph facts --valid-at/--known-at` as subprocesses; the many other
    instants are asked in-process through the same store call the command makes."""
    group_id = cli_group
    mapping = tmp_path / "crm.yaml"
    mapping.write_text(CRM_MAPPING)
    events = crm_events()
    # Part one: the first half of each subject's changes, newest first (out of order).
    first_half, second_half = [], []
    for subject in sorted({(e.kind, e.subject_id) for e in events}):
        mine = sorted((e for e in events if (e.kind, e.subject_id) == subject), key=lambda e: e.at)
        cut = (len(mine) + 1) // 2
        first_half += reversed(mine[:cut])
        second_half += mine[cut:]
    # Part two mixes later changes with late arrivals: two from before anything stored, and
    # one between two changes part one stored (Acme Corp's Basic, closed on 31 January by
    # Pro, now ends on 16 January: a moved end).
    between = Event("plan", 1, "Team", at(2024, 1, 16))
    early = [
        Event("plan", 3, "Trial", at(2023, 12, 1)),
        Event("owner", 3, "Olivia", at(2023, 12, 15)),
        between,
    ]
    second_half = second_half[::2] + early + second_half[1::2]
    one = write_jsonl(
        tmp_path / "one.jsonl", [crm_episode(group_id, e, n) for n, e in enumerate(first_half)]
    )
    two = write_jsonl(
        tmp_path / "two.jsonl", [crm_episode(group_id, e, n) for n, e in enumerate(second_half)]
    )

    done = cli(cli_env, "ingest", str(one), "--mapping", str(mapping))
    assert done.returncode == 0, done.stderr
    assert f"{len(first_half)} episodes" in done.stdout and "0 LLM calls" in done.stdout
    known = datetime.now(UTC)
    times = CHECK_TIMES[::2]  # every instant is asked in the in-process test above
    belief = {t: await neo4j_store.browse.query_facts(group_id, valid_at=t) for t in times}
    done = cli(cli_env, "ingest", str(two), "--mapping", str(mapping))
    assert done.returncode == 0, done.stderr
    assert "born closed" in done.stdout

    def triples(rows: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        found = {(r["subject"], r["relation"], r["object"]) for r in rows}
        return {f for f in found if f[1] != "FOR_ACCOUNT"}

    all_events = events + early
    rows = cli_facts(cli_env, group_id, "--valid-at", "2023-12-10")  # only a late arrival
    assert (
        triples(rows)
        == expected_at(all_events, at(2023, 12, 10))
        == {("Initech", "HAS_PLAN", "Trial")}
    )
    for t in [at(2023, 11, 1), at(2023, 12, 20), *times]:
        views = await neo4j_store.browse.query_facts(group_id, valid_at=t)
        assert triples([v.model_dump() for v in views]) == expected_at(all_events, t), t

    # --known-at: the belief right after part one, although part two changed the past.
    # (Episodes merged into a fact later are not versioned: compare everything else.)
    def strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "episodes"} for r in rows]

    changed = [t for t in times if expected_at(first_half, t) != expected_at(all_events, t)]
    assert len(changed) > 10
    t = changed[len(changed) // 2]
    rows = cli_facts(
        cli_env, group_id, "--valid-at", t.isoformat(), "--known-at", known.isoformat()
    )
    assert strip(rows) == strip([v.model_dump() for v in belief[t]])
    assert triples(rows) == expected_at(first_half, t)
    assert triples(rows) != expected_at(all_events, t)  # the belief did change since
    for t, before in belief.items():
        views = await neo4j_store.browse.query_facts(group_id, valid_at=t, known_at=known)
        assert strip([v.model_dump() for v in views]) == strip([v.model_dump() for v in before])
        assert triples([v.model_dump() for v in views]) == expected_at(first_half, t), t
    # The moved end, asked directly: on 20 January Acme Corp was on Basic as known after part
    # one, on Team as known now.
    t = at(2024, 1, 20)
    acme_plan = {("Acme Corp", "HAS_PLAN", "Basic")}
    assert triples(cli_facts(cli_env, group_id, "--valid-at", t.isoformat())) & acme_plan == set()
    assert ("Acme Corp", "HAS_PLAN", "Team") in expected_at(all_events, t)
    then = cli_facts(
        cli_env, group_id, "--valid-at", t.isoformat(), "--known-at", known.isoformat()
    )
    assert triples(then) >= acme_plan

    row = next(
        r
        for r in cli_facts(cli_env, group_id)
        if r["relation"] == "HAS_PLAN" and r["subject"] == "Acme Corp"
    )
    assert set(row) == {
        "uuid",
        "subject",
        "relation",
        "object",
        "fact",
        "valid_at",
        "invalid_at",
        "created_at",
        "expired_at",
        "episodes",
    }
    assert row["object"] == "Pro" and row["invalid_at"] is None
    assert row["valid_at"] == "2024-03-31T00:00:00Z" and row["episodes"] == [
        "crm:plan:1:2024-03-31"
    ]


def test_cli_text_feed_through_the_scripted_llm(
    cli_env: dict[str, str],
    server: ScriptedLLMServer,
    script: Script,
    cli_group: str,
    tmp_path: Path,
) -> None:
    group_id = cli_group
    script.one_valued.add(to_relation_name(HOSTILE_RELATION))
    feed = Feed(group_id)
    episodes = [
        feed.text(
            script.says(
                f"{HOSTILE_NAME} signed up with Acme Corp.",
                f"{HOSTILE_NAME}[Person] -{HOSTILE_RELATION}-> Acme Corp[Org]",
            ),
            ref=at(2024, 1, 5),
        ),
        feed.text(
            script.says(
                "They moved to Globex since last March.",
                f"{HOSTILE_NAME} -{HOSTILE_RELATION}-> Globex @since last March",
            ),
            ref=at(2024, 6, 1),
        ),
    ]
    path = write_jsonl(tmp_path / "text.jsonl", episodes)
    env = {**cli_env, "TIDEGRAPH_LLM_BASE_URL": server.base_url, "TIDEGRAPH_LLM_API_KEY": "t"}
    done = cli(env, "ingest", str(path))
    assert done.returncode == 0, done.stderr
    # Both episodes are extracted by one call (a group's waiting episodes share one).
    assert "2 episodes" in done.stdout and "2 LLM calls" in done.stdout
    assert counts_by_schema(server) == {EXTRACTION: 0, JOINT: 1, ENTITY_RES: 0, FACT_RES: 1}

    relation = "WORKS_AT_MATCH_N_DETACH_DELETE_N"
    history = cli_facts(cli_env, group_id, "--history")
    assert [
        (r["subject"], r["relation"], r["object"], r["valid_at"], r["invalid_at"]) for r in history
    ] == [
        (HOSTILE_NAME, relation, "Acme Corp", "2024-01-05T00:00:00Z", "2024-03-01T00:00:00Z"),
        (HOSTILE_NAME, relation, "Globex", "2024-03-01T00:00:00Z", None),
    ]
    done = cli(cli_env, "entities", "--group", group_id, "--json")
    assert done.returncode == 0, done.stderr
    rows = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert sorted(r["name"] for r in rows) == sorted([HOSTILE_NAME, "Acme Corp", "Globex"])
    assert all(set(r) == {"uuid", "name", "labels", "summary", "key"} for r in rows)
    # A second run finds every episode processed: no LLM call at all.
    again = cli(env, "ingest", str(path))
    assert again.returncode == 0 and "2 already processed" in again.stdout
    assert len(server.requests) == 2
