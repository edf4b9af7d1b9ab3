"""Replay and delivery order never change the graph (property tests over plan_facts).

Random small feeds of the CRM kinds (plan changes: cardinality one; ticket statuses with the
ticket's account: one and many; contacts joining and leaving: one and closing records; notes
restating a many relation word for word; cardinality-free facts restated in other letters or
in other words) are delivered in any order, some episodes twice (the same episode, or the same
record under another episode id). Applied episode by episode through ``plan_facts`` to an
in-memory store that does what the graph stores do, every delivery must give the facts of the
feed sorted by reference time, fact by fact: endpoints, relation, text, valid_at, invalid_at,
episodes, and the same answers to "valid at t, as known now".
uuids and the T' fields (created_at, expired_at) depend on arrival and are not compared.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tidegraph.processors.invalidation import candidate_reads
from tidegraph.processors.timeline import plan_facts
from tidegraph.records.asof import AsOf
from tidegraph.records.graph import FactRecord
from tidegraph.records.stages import StampedFact

T0 = datetime(2024, 1, 1, tzinfo=UTC)
NOW0 = datetime(2030, 1, 1, tzinfo=UTC)  # ingestion time: later than every event time
GROUP = "g"
ACCOUNTS = ["Acme", "Globex"]


def day(n: int) -> datetime:
    return T0 + timedelta(days=n)


@dataclass(frozen=True, eq=False)
class Delivery:
    """One episode as delivered: its id, reference time (its event time) and facts."""

    episode: str
    at: int
    facts: tuple[StampedFact, ...]


# ----------------------------------------------------------------------------- the store
class Store:
    """The facts of one group, changed by plans exactly as the graph stores change them:
    a processed episode is skipped; a fact upsert keeps created_at, a set expired_at and a
    stored history when it carries none; a closure sets the end (expired_at once)."""

    def __init__(self, *, skip_ended: bool = False) -> None:
        """``skip_ended``: a plan is given only the facts that did not end before the
        episode's earliest fact starts, as the batch read gives them
        (``FactRecord.ended_before``)."""
        self.skip_ended = skip_ended
        self.facts: dict[str, FactRecord] = {}
        self.processed: set[str] = set()
        self.clock = itertools.count()
        self.now = NOW0

    def deliver(self, delivery: Delivery) -> None:
        if delivery.episode in self.processed:
            return
        self.now = NOW0 + timedelta(seconds=next(self.clock))
        stamped = list(delivery.facts)
        pairs, _ = candidate_reads(stamped, judged=False)
        wanted = set(pairs)
        start = min(f.valid_at for f in stamped) if self.skip_ended and stamped else None
        existing = [
            f.model_copy(deep=True)
            for f in self.facts.values()
            if (f.source_uuid, f.name) in wanted and not (start and f.ended_before(start))
        ]
        plan = plan_facts(
            group_id=GROUP,
            episode_uuid=delivery.episode,
            stamped=stamped,
            existing=existing,
            now=self.now,
        )
        for fact in plan.facts.values():
            self._upsert(fact.model_copy(deep=True))
        for closure in plan.closures.values():
            stored = self.facts[closure.uuid]
            stored.invalid_at = closure.invalid_at
            stored.expired_at = stored.expired_at or closure.expired_at
            if closure.prior_ends:
                stored.prior_ends = list(closure.prior_ends)
                stored.prior_ends_learned_at = list(closure.prior_ends_learned_at)
                stored.end_learned_at = closure.end_learned_at
        self.processed.add(delivery.episode)

    def _upsert(self, fact: FactRecord) -> None:
        stored = self.facts.get(fact.uuid)
        if stored is not None:
            fact.created_at = stored.created_at
            fact.expired_at = stored.expired_at or fact.expired_at
            for history in (
                "prior_ends",
                "prior_ends_learned_at",
                "prior_starts",
                "prior_starts_learned_at",
            ):
                if not getattr(fact, history):
                    setattr(fact, history, getattr(stored, history))
            fact.end_learned_at = fact.end_learned_at or stored.end_learned_at
            fact.start_learned_at = fact.start_learned_at or stored.start_learned_at
        self.facts[fact.uuid] = fact

    def rows(self) -> list[tuple[Any, ...]]:
        """The facts as compared: everything but uuids and the T' fields."""
        return sorted(
            (
                f.source_uuid,
                f.name,
                f.target_uuid,
                f.fact,
                f.valid_at,
                f.invalid_at,
                tuple(sorted(f.episodes)),
            )
            for f in self.facts.values()
        )

    def believed(self, valid_at: datetime) -> list[tuple[str, str, str, str]]:
        """The facts valid at ``valid_at`` as known now (the stores' exact as-of test)."""
        asof = AsOf(valid_at, self.now, include_invalid=False, entity_uuid=None)
        return sorted(
            (f.source_uuid, f.name, f.target_uuid, f.fact)
            for f in self.facts.values()
            if asof.believed(f)
        )


# ----------------------------------------------------------------------------- the feeds
def fact(
    subject: str, relation: str, obj: str | None, text: str, at: int, cardinality: str | None
) -> StampedFact:
    return StampedFact(
        source_uuid=subject,
        target_uuid=obj,
        relation=relation,
        fact=text,
        valid_at=day(at),
        cardinality=cardinality,
    )


def plan_change(at: int, account: str, plan: str) -> tuple[StampedFact, ...]:
    return (fact(account, "HAS_PLAN", plan, f"{account} is on the {plan} plan", at, "one"),)


def ticket_status(at: int, ticket: str, status: str, account: str) -> tuple[StampedFact, ...]:
    return (
        fact(ticket, "HAS_STATUS", status, f"Ticket {ticket} is {status}", at, "one"),
        fact(
            ticket, "FOR_ACCOUNT", account, f"Ticket {ticket} was raised by {account}", at, "many"
        ),
    )


def contact_joined(at: int, contact: str, company: str) -> tuple[StampedFact, ...]:
    return (fact(contact, "WORKS_AT", company, f"{contact} works at {company}", at, "one"),)


def contact_left(at: int, contact: str, company: str | None) -> tuple[StampedFact, ...]:
    ended = fact(contact, "WORKS_AT", company, f"{contact} left {company}", at, "many")
    return (ended.model_copy(update={"closes": True}),)


def note(at: int, account: str, topic: str) -> tuple[StampedFact, ...]:
    """A many relation whose every statement has the same text."""
    return (fact(account, "DISCUSSED", topic, f"{account} discussed {topic}", at, "many"),)


MENTIONS = ["{a} mentioned {t}", "{A} MENTIONED {t}!", "{a} brought up {t}"]


def mention(at: int, account: str, topic: str, wording: int) -> tuple[StampedFact, ...]:
    """A fact without cardinality (unjudged): the first two wordings are the same text once
    normalised, the third is another fact."""
    text = MENTIONS[wording].format(a=account, A=account.upper(), t=topic)
    return (fact(account, "MENTIONED", topic, text, at, None),)


accounts = st.sampled_from(ACCOUNTS)
RECORDS = {
    "plan": st.tuples(accounts, st.sampled_from(["Basic", "Pro", "Enterprise"])),
    "ticket": st.tuples(
        st.sampled_from(["T1", "T2"]), st.sampled_from(["open", "pending", "closed"]), accounts
    ),
    "joined": st.tuples(st.sampled_from(["Ann", "Bob"]), accounts),
    "left": st.tuples(st.sampled_from(["Ann", "Bob"]), st.sampled_from([*ACCOUNTS, None])),
    "note": st.tuples(accounts, st.sampled_from(["pricing", "sso"])),
    "mention": st.tuples(accounts, st.sampled_from(["pricing", "sso"]), st.integers(0, 2)),
}
BUILD = {
    "plan": plan_change,
    "ticket": ticket_status,
    "joined": contact_joined,
    "left": contact_left,
    "note": note,
    "mention": mention,
}


@st.composite
def records(draw: st.DrawFn, kinds: tuple[str, ...]) -> list[Delivery]:
    """A feed in event order: distinct event times, one record each."""
    times = sorted(draw(st.lists(st.integers(0, 90), min_size=1, max_size=12, unique=True)))
    feed = []
    for n, at in enumerate(times):
        kind = draw(st.sampled_from(kinds))
        feed.append(Delivery(f"ep-{n}", at, BUILD[kind](at, *draw(RECORDS[kind]))))
    return feed


@st.composite
def deliveries(draw: st.DrawFn, kinds: tuple[str, ...]) -> list[Delivery]:
    """The feed's records in any order, some delivered twice: the same episode again (a
    redelivery) or the same record under another episode id (a producer's resend)."""
    feed = draw(records(kinds))
    again = draw(st.lists(st.sampled_from(feed), max_size=4))
    resent = [
        Delivery(f"{d.episode}-resent", d.at, d.facts)
        for d in draw(st.lists(st.sampled_from(feed), max_size=2, unique_by=lambda d: d.episode))
    ]
    return draw(st.permutations([*feed, *again, *resent]))


def run(delivered: list[Delivery], *, skip_ended: bool = False) -> Store:
    store = Store(skip_ended=skip_ended)
    for delivery in delivered:
        store.deliver(delivery)
    return store


def check_any_order_gives_the_sorted_graph(delivered: list[Delivery]) -> None:
    in_order = run(sorted(delivered, key=lambda d: d.at))
    shuffled = run(delivered)
    assert shuffled.rows() == in_order.rows()
    times = sorted({d.at for d in delivered})
    for t in [-1, *times, *(t + 0.5 for t in times), 1000]:
        at = T0 + timedelta(days=t)
        assert shuffled.believed(at) == in_order.believed(at), t


KINDS = tuple(BUILD)


@settings(max_examples=300, deadline=None)
@given(deliveries(KINDS))
def test_any_delivery_order_gives_the_graph_of_the_sorted_feed(delivered: list[Delivery]) -> None:
    check_any_order_gives_the_sorted_graph(delivered)


@settings(max_examples=200, deadline=None)
@given(deliveries(KINDS))
def test_facts_that_ended_before_an_episode_starts_change_none_of_its_plans(
    delivered: list[Delivery],
) -> None:
    """Leaving out of each plan's candidates the facts that ended before the episode's
    earliest fact starts (what the batch read does) gives the very same facts, the T' fields
    and histories included, in any delivery order."""
    everything = run(delivered)
    without_ended = run(delivered, skip_ended=True)
    assert without_ended.facts == everything.facts
