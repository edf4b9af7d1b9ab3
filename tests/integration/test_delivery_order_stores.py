"""Delivery order and redelivery never change the graph, on both real stores (property test).

Random small feeds of mapped CRM records (``tests.support.crm_feed``: plan changes, ticket
statuses with the ticket's account, contacts joining and leaving, company notes restating a
many relation word for word) go through the in-process pipeline one episode at a time: once
sorted by reference time, once in a random order with some episodes delivered twice (the same
episode again, or the same record under another episode id). Each run writes a group of its
own; ``query_facts(include_invalid=True)`` of the two must agree fact by fact (subject,
relation, object, text, valid_at, invalid_at, episodes), and so must the facts valid at each
event time as known now. uuids and created_at / expired_at depend on arrival: not compared.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import crm_feed as crm
from tidegraph.embed.hashing import HashingEmbedder
from tidegraph.pipelines.runner import GroupRunner
from tidegraph.records.episode import Episode
from tidegraph.records.graph import FactView
from tidegraph.records.times import iso
from tidegraph.stores.base import GraphStore

pytestmark = pytest.mark.integration

DIM = 384  # the shared test server's vector indexes are 384-dimensional
ACCOUNTS = [(1, "Acme Corp"), (2, "Globex")]
CONTACTS = [(7, "Contact 7"), (8, "Contact 8")]


@dataclass(frozen=True, eq=False)
class Record:
    """One delivered record: its episode id (group-free), event time and content."""

    id: str
    at: datetime
    content: dict[str, Any]

    def episode(self, group: str) -> Episode:
        return Episode(
            id=self.id,
            group_id=group,
            source="json",
            name=self.content["type"],
            content=self.content,
            reference_time=self.at,
        )


# ----------------------------------------------------------------------------- the feeds
def note_record(company: str, topic: str, at: datetime) -> dict[str, Any]:
    """A company.note (DISCUSSED, many, the same text every time; valid from the episode's
    reference time)."""
    return {"type": "company.note", "company": company, "topic": topic, "at": iso(at)}


accounts = st.sampled_from(ACCOUNTS)
contacts = st.sampled_from(CONTACTS)
CONTENTS = {
    "plan": st.tuples(accounts, st.sampled_from(["Basic", "Pro", "Enterprise"])).map(
        lambda a: lambda at: crm.plan_record(a[0], a[1], at)
    ),
    "ticket": st.tuples(
        st.sampled_from(["T-1", "T-2"]), st.sampled_from(crm.STATUSES), accounts
    ).map(lambda a: lambda at: crm.ticket_record(a[0], a[1], a[2], at, f"Subject of {a[0]}")),
    "contact": st.tuples(st.sampled_from(["joined", "left"]), contacts, accounts).map(
        lambda a: lambda at: crm.contact_record(a[0], a[1], a[2], at)
    ),
    "note": st.tuples(st.sampled_from(["Initech", "Umbrella"]), st.sampled_from(["pricing"])).map(
        lambda a: lambda at: note_record(a[0], a[1], at)
    ),
}


@st.composite
def deliveries(draw: st.DrawFn) -> list[Record]:
    """A feed (distinct event times) in any order, some records delivered twice."""
    days = sorted(draw(st.lists(st.integers(0, 60), min_size=1, max_size=9, unique=True)))
    feed = []
    for n, day in enumerate(days):
        at = crm.START + timedelta(days=day)
        make = draw(CONTENTS[draw(st.sampled_from(sorted(CONTENTS)))])
        feed.append(Record(f"rec-{n}", at, make(at)))
    again = draw(st.lists(st.sampled_from(feed), max_size=3))
    resent = [
        Record(f"{r.id}-resent", r.at, r.content)
        for r in draw(st.lists(st.sampled_from(feed), max_size=2, unique_by=lambda r: r.id))
    ]
    return draw(st.permutations([*feed, *again, *resent]))


# ----------------------------------------------------------------------------- the property
Row = tuple[str, str, str, str, str | None, str | None, tuple[str, ...]]


def rows(views: list[FactView]) -> list[Row]:
    return sorted(
        (
            v.subject,
            v.relation,
            v.object,
            v.fact,
            v.valid_at,
            v.invalid_at,
            tuple(sorted(v.episodes)),
        )
        for v in views
    )


async def graph_of(store: GraphStore, records: list[Record]) -> dict[str, list[Row]]:
    """The facts of ``records`` delivered in this order into a group of their own (deleted
    afterwards): all of them, and those valid at each event time, as known now."""
    group = f"order-{uuidlib.uuid4().hex[:12]}"
    pipeline = GroupRunner.of(
        store=store, embedder=HashingEmbedder(dim=DIM), llm=None, mappings=crm.crm_mappings()
    )
    try:
        for record in records:
            [outcome] = await pipeline.run([record.episode(group)])
            assert outcome.failure is None, outcome.failure
        graph = {"all": rows(await store.browse.query_facts(group, include_invalid=True))}
        for at in sorted({r.at for r in records}):
            for t in (at, at + timedelta(hours=12)):
                graph[iso(t) or ""] = rows(await store.browse.query_facts(group, valid_at=t))
        return graph
    finally:
        await store.forget.delete_group(group)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(delivered=deliveries())
async def test_any_delivery_order_gives_the_graph_of_the_sorted_feed(
    store: GraphStore, delivered: list[Record]
) -> None:
    in_order = await graph_of(store, sorted(delivered, key=lambda r: r.at))
    assert await graph_of(store, delivered) == in_order
