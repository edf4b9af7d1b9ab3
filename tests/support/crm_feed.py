"""A generated CRM/ticket feed of mapped JSON records, its mapping, and its ground truth.

One source for the benchmarks (``benchmarks.throughput`` and its Kafka path) and the
integration tests. :func:`generate` builds a deterministic feed (``seed``) of ``records``
episodes over ``groups`` tenants: accounts changing plan and owner, contacts joining and
leaving companies, tickets opening, closing and reopening. A share of each tenant's records
(``late_fraction``) is delivered late, after records that happened later; the tenants are
interleaved as a live feed would be, each tenant's ``reference_time`` increasing in delivery
order. :class:`CrmFeed` keeps the truth: the value every (subject, relation) has now, which
:func:`check_graph` compares with what a store holds.

The record builders (:func:`plan_record` ...) are what the mapping :data:`CRM_MAPPING` reads;
tests that write their own events use them too. Every record's event time is its ``at``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from tidegraph.processors.mapping import MappingSet
from tidegraph.records.episode import Episode
from tidegraph.records.times import iso
from tidegraph.stores.base import GraphStore

# The company_note rule stays last: tests cut the mapping text at it.
CRM_MAPPING = """\
mappings:
  - name: plan
    match: {type: account.plan}
    entities:
      account: {name: "{account.name}", label: Account, key: "crm:account:{account.id}"}
      plan: {name: "{plan}", label: Plan}
    facts:
      - {relation: HAS_PLAN, subject: account, object: plan, cardinality: one,
         valid_at: at, fact: "{account.name} is on the {plan} plan"}
  - name: owner
    match: {type: account.owner}
    entities:
      account: {name: "{account.name}", label: Account, key: "crm:account:{account.id}"}
      owner: {name: "{owner.name}", label: User, key: "crm:user:{owner.id}"}
    facts:
      - {relation: OWNED_BY, subject: account, object: owner, cardinality: one,
         valid_at: at, fact: "{account.name} is owned by {owner.name}"}
  - name: ticket
    match: {type: ticket.status}
    entities:
      ticket: {name: "Ticket {ticket.id}", label: Ticket, key: "crm:ticket:{ticket.id}",
               summary: "{ticket.subject}"}
      status: {name: "{status}", label: TicketStatus}
      account: {name: "{account.name}", label: Account, key: "crm:account:{account.id}"}
    facts:
      - {relation: HAS_STATUS, subject: ticket, object: status, cardinality: one,
         valid_at: at, fact: "Ticket {ticket.id} is {status}: {ticket.subject}"}
      - {relation: FOR_ACCOUNT, subject: ticket, object: account, valid_at: at,
         fact: "Ticket {ticket.id} was raised by {account.name}"}
  - name: contact_joined
    match: {type: contact.joined}
    entities:
      contact: {name: "{contact.name}", label: Contact, key: "crm:contact:{contact.id}"}
      company: {name: "{company.name}", label: Account, key: "crm:account:{company.id}"}
    facts:
      - {relation: WORKS_AT, subject: contact, object: company, cardinality: one,
         valid_at: at, fact: "{contact.name} works at {company.name}"}
  - name: contact_left
    match: {type: contact.left}
    entities:
      contact: {name: "{contact.name}", label: Contact, key: "crm:contact:{contact.id}"}
      company: {name: "{company.name}", label: Account, key: "crm:account:{company.id}"}
    facts:
      - {relation: WORKS_AT, subject: contact, object: company, closes: true, valid_at: at}
  - name: company_note
    match: {type: company.note}
    entities:
      company: {name: "{company}", label: Organization}
      topic: {name: "{topic}", label: Topic}
    facts:
      - {relation: DISCUSSED, subject: company, object: topic, fact: "{company} discussed {topic}"}
"""

PLANS = ["Free", "Basic", "Pro", "Business", "Enterprise"]
STATUSES = ["open", "pending", "closed"]
SUBJECTS = ["Printer jams", "Invoice overdue", "SSO login fails", "Export is slow", "API 500s"]
START = datetime(2024, 1, 1, tzinfo=UTC)

Ref = tuple[int | str, str]  # (id, name) of an account, user or contact


def crm_mappings() -> MappingSet:
    return MappingSet.model_validate(yaml.safe_load(CRM_MAPPING))


# ----------------------------------------------------------------------------- records
def _ref(ref: Ref) -> dict[str, Any]:
    return {"id": ref[0], "name": ref[1]}


def plan_record(account: Ref, plan: str, at: datetime) -> dict[str, Any]:
    return {"type": "account.plan", "account": _ref(account), "plan": plan, "at": iso(at)}


def owner_record(account: Ref, owner: Ref, at: datetime) -> dict[str, Any]:
    return {"type": "account.owner", "account": _ref(account), "owner": _ref(owner), "at": iso(at)}


def contact_record(kind: str, contact: Ref, company: Ref, at: datetime) -> dict[str, Any]:
    """``kind``: ``joined`` or ``left``."""
    return {
        "type": f"contact.{kind}",
        "contact": _ref(contact),
        "company": _ref(company),
        "at": iso(at),
    }


def ticket_record(
    ticket_id: int | str, status: str, account: Ref, at: datetime, subject: str = SUBJECTS[0]
) -> dict[str, Any]:
    return {
        "type": "ticket.status",
        "ticket": {"id": ticket_id, "subject": subject},
        "status": status,
        "account": _ref(account),
        "at": iso(at),
    }


# ----------------------------------------------------------------------------- the feed
@dataclass(frozen=True)
class Change:
    """Ground truth: ``subject`` (its CRM key) has ``relation`` ``value`` from ``at`` on
    (``value`` None: the relation ended)."""

    group: str
    subject: str
    relation: str
    value: str | None
    at: datetime


@dataclass
class CrmFeed:
    groups: list[str]
    episodes: list[dict[str, Any]] = field(default_factory=list)  # envelopes, delivery order
    changes: list[Change] = field(default_factory=list)

    def as_episodes(self) -> list[Episode]:
        return [Episode.model_validate(e) for e in self.episodes]

    def current(self) -> dict[tuple[str, str, str], str | None]:
        """(group, subject key, relation) -> its value now."""
        latest: dict[tuple[str, str, str], Change] = {}
        for change in sorted(self.changes, key=lambda c: c.at):
            latest[(change.group, change.subject, change.relation)] = change
        return {k: c.value for k, c in latest.items()}


class _Tenant:
    """One tenant's records in event order, and the changes they make."""

    def __init__(self, group: str, index: int, rng: random.Random, records: int) -> None:
        self.group, self.rng = group, rng
        tag = f"{index:02d}"
        self.accounts: list[Ref] = [(a, f"Company {tag}-{a}") for a in range(max(3, records // 40))]
        self.owners: list[Ref] = [(o, f"Owner {o}") for o in range(max(2, records // 150))]
        self.contacts: list[Ref] = [(c, f"Contact {tag}-{c}") for c in range(max(3, records // 25))]
        self.tag = tag
        self.tickets: dict[int, tuple[str, Ref]] = {}  # ticket number -> status, account
        self.employer: dict[int | str, Ref | None] = {}
        self.records: list[dict[str, Any]] = []
        self.changes: list[Change] = []
        self.clock = START

    def step(self) -> None:
        self.clock += timedelta(minutes=self.rng.randint(5, 600))
        kind = self.rng.choices(["plan", "owner", "contact", "ticket"], [3, 2, 3, 6])[0]
        getattr(self, f"_{kind}")(self.rng.choice(self.accounts), self.clock)

    def _change(self, subject: str, relation: str, value: str | None, at: datetime) -> None:
        self.changes.append(Change(self.group, subject, relation, value, at))

    def _plan(self, account: Ref, at: datetime) -> None:
        plan = self.rng.choice(PLANS)
        self.records.append(plan_record(account, plan, at))
        self._change(f"crm:account:{account[0]}", "HAS_PLAN", plan, at)

    def _owner(self, account: Ref, at: datetime) -> None:
        owner = self.rng.choice(self.owners)
        self.records.append(owner_record(account, owner, at))
        self._change(f"crm:account:{account[0]}", "OWNED_BY", owner[1], at)

    def _contact(self, account: Ref, at: datetime) -> None:
        contact = self.rng.choice(self.contacts)
        current = self.employer.get(contact[0])
        if current is not None and self.rng.random() < 0.3:
            self.records.append(contact_record("left", contact, current, at))
            self.employer[contact[0]] = None
            self._change(f"crm:contact:{contact[0]}", "WORKS_AT", None, at)
        else:
            self.records.append(contact_record("joined", contact, account, at))
            self.employer[contact[0]] = account
            self._change(f"crm:contact:{contact[0]}", "WORKS_AT", account[1], at)

    def _ticket(self, account: Ref, at: datetime) -> None:
        if self.tickets and self.rng.random() < 0.75:  # a status change (closed -> open: reopened)
            number = self.rng.choice(list(self.tickets))
            was, account = self.tickets[number]
            status = self.rng.choice([s for s in STATUSES if s != was])
        else:
            number, status = len(self.tickets) + 1, "open"
        self.tickets[number] = (status, account)
        ticket_id = f"{self.tag}-{number}"
        subject = SUBJECTS[number % len(SUBJECTS)]
        self.records.append(ticket_record(ticket_id, status, account, at, subject))
        self._change(f"crm:ticket:{ticket_id}", "HAS_STATUS", status, at)

    def delivery(self, late_fraction: float) -> list[dict[str, Any]]:
        """The records in delivery order: event order, except a share held back and sent
        at a random later point. reference_time: the latest event time sent so far + 1 s."""
        rng, n = self.rng, len(self.records)
        late = [i for i in range(n) if rng.random() < late_fraction]
        held = set(late)
        order = [i for i in range(n) if i not in held]
        for i in late:
            first = next((k for k, j in enumerate(order) if j > i), len(order))
            order.insert(rng.randint(first, len(order)), i)
        arrival, out = START, []
        for position, i in enumerate(order, 1):
            record = self.records[i]
            arrival = max(arrival, datetime.fromisoformat(record["at"]))
            out.append(
                {
                    "id": f"crm:{self.group}:{position:06d}",
                    "group_id": self.group,
                    "source": "json",
                    "name": record["type"],
                    "source_description": "CRM webhook",
                    "content": record,
                    "reference_time": iso(arrival + timedelta(seconds=1)),
                }
            )
        return out


def group_name(prefix: str, index: int) -> str:
    return f"{prefix}-tenant-{index:02d}"


def generate(
    records: int, groups: int, *, prefix: str = "crm", seed: int = 7, late_fraction: float = 0.05
) -> CrmFeed:
    """``records`` episodes over ``groups`` tenants (group ids ``{prefix}-tenant-NN``). The
    content depends on ``seed``, ``records``, ``groups`` and ``late_fraction``, never on
    ``prefix``: feeds under different prefixes are the same feed."""
    if groups < 1 or records < groups:
        raise ValueError("need at least one record per group")
    rng = random.Random(seed)
    per_group = [records // groups + (1 if g < records % groups else 0) for g in range(groups)]
    tenants = [_Tenant(group_name(prefix, g), g, rng, n) for g, n in enumerate(per_group)]
    queues = []
    for tenant, n in zip(tenants, per_group, strict=True):
        for _ in range(n):
            tenant.step()
        queues.append(iter(tenant.delivery(late_fraction)))
    # Interleave the tenants at random, each tenant's records staying in its delivery order.
    turns = [g for g, n in enumerate(per_group) for _ in range(n)]
    rng.shuffle(turns)
    feed = CrmFeed(groups=[t.group for t in tenants])
    feed.episodes = [next(queues[g]) for g in turns]
    feed.changes = [c for t in tenants for c in t.changes]
    return feed


def crm_feed(
    episodes: int, groups: int, *, run: str = "bench", seed: int = 7
) -> list[dict[str, Any]]:
    """The envelopes of :func:`generate` (group ids ``{run}-tenant-NN``)."""
    return generate(episodes, groups, prefix=run, seed=seed).episodes


# ----------------------------------------------------------------------------- checking
async def check_graph(store: GraphStore, feed: CrmFeed) -> dict[str, Any]:
    """Every subject's current value in the store (facts valid now) against the truth."""
    found: dict[tuple[str, str, str], list[str]] = {}
    for group in feed.groups:
        keys = {e.name: e.key for e in await store.browse.list_entities(group)}  # names are unique
        for view in await store.browse.query_facts(group):
            key = keys.get(view.subject)
            if key is not None:
                found.setdefault((group, key, view.relation), []).append(view.object)
    truth = feed.current()
    wrong = [
        f"{subject}: expected {value}, found {sorted(found.get(subject, []))}"
        for subject, value in truth.items()
        if sorted(found.get(subject, [])) != ([value] if value is not None else [])
    ]
    return {"subjects_checked": len(truth), "subjects_wrong": len(wrong), "wrong": wrong[:10]}
