"""A deterministic feed of support-chat messages with the ground truth of every message.

``text_feed(episodes, groups, seed)`` builds chat/ticket messages over ``groups`` tenants
(interleaved as a live feed would be, each tenant's reference times increasing). Every
message names known entities and states known facts; some facts contradict earlier ones of
the same tenant (an account changes plan, a person changes employer, a ticket changes status,
an account gets a new manager, a person a new manager). The truth of a message is what a
careful extraction model would answer: its entities (the speaker first) and its facts, each
with its relation, its wording (one fixed sentence per subject-relation-object, so a restated
fact is worded identically) and the start date the message states, if any.

``FeedIndex`` finds a message's truth from its exact content and a fact's truth from its
wording; the fake LLM answers both systems from it (benchmarks/graphiti_answers.py).

    python -m benchmarks.text_feed --episodes 200 --groups 16 > feed.jsonl
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

START = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)

FIRST = (
    "Dana Ada Bruno Carla Diego Elif Farah Goran Hana Ivo Jonas Kira Liam Mona Nils Olga "
    "Pavel Quinn Rosa Sven Tara Umar Vera Wei"
).split()
LAST = (
    "Reyes Okafor Novak Chen Patel Haddad Lindqvist Moreau Tanaka Schulz Oliveira Kowalski "
    "Ferreira Nakamura Duarte Brennan Petrov Mensah Varga Castillo Ibsen Sato Keller Romano"
).split()
ADJECTIVES = (
    "Bluebird Harbor Northwind Granite Juniper Copper Silverline Redwood Lakeside Summit "
    "Brightwater Ironbridge Meadow Starling Westfield Cobalt Kestrel Alder"
).split()
NOUNS = (
    "Logistics Bakery Robotics Clinics Outfitters Analytics Foods Studios Freight Energy "
    "Pharmacy Mobility"
).split()
PLANS = ("Free", "Starter", "Pro", "Business", "Enterprise")
PRODUCTS = ("Billing API", "Analytics Suite", "Mobile SDK", "Data Export", "SSO Connector")
STATUSES = ("open", "pending", "in progress", "solved", "closed")
TEAMS = ("finance", "support", "warehouse", "marketing", "engineering")

ONE_VALUED = frozenset({"HAS_PLAN", "WORKS_AT", "HAS_STATUS", "MANAGED_BY", "REPORTS_TO"})
"""Relations with one value at a time: a new object contradicts the previous one."""


@dataclass(frozen=True)
class TruthEntity:
    name: str
    type: str


@dataclass(frozen=True)
class TruthFact:
    subject: str
    relation: str
    object: str
    fact: str
    valid_at: str | None  # the date the message states (ISO date), or None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.subject, self.relation, self.object)


@dataclass
class TruthEpisode:
    entities: list[TruthEntity]
    facts: list[TruthFact]
    contradicts_earlier: int = 0  # facts that replace an earlier value of the same tenant


@dataclass
class FeedEpisode:
    """One message: the envelope fields (group is the tenant, not yet a run's group_id)."""

    id: str
    group: str
    name: str
    content: str
    reference_time: datetime
    truth: TruthEpisode

    def envelope(self, group_id: str) -> dict[str, Any]:
        """The episode as tidegraph's envelope, under ``group_id``."""
        return {
            "id": self.id,
            "group_id": group_id,
            "source": "message",
            "name": self.name,
            "source_description": "support chat",
            "content": self.content,
            "reference_time": self.reference_time.isoformat(),
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "episode": self.envelope(self.group),
            "truth": asdict(self.truth),
        }


@dataclass
class _Tenant:
    """One tenant's cast and current state (what the next contradiction replaces)."""

    index: int
    company: str
    others: list[str]  # other companies people move between
    people: list[str]
    tickets: list[str]
    state: dict[tuple[str, str], str] = field(default_factory=dict)  # (subject, rel) -> object


def _cast(groups: int, rng: random.Random) -> list[_Tenant]:
    """Distinct people and companies for every tenant (no name is shared between tenants)."""
    companies = [f"{a} {n}" for a in ADJECTIVES for n in NOUNS]
    people = [f"{f} {last}" for f in FIRST for last in LAST]
    rng.shuffle(companies)
    rng.shuffle(people)
    if groups * 3 > len(companies) or groups * 4 > len(people):
        raise ValueError(f"at most {min(len(companies) // 3, len(people) // 4)} groups")
    tenants = []
    for g in range(groups):
        tickets = [f"ticket #{4000 + 100 * g + k}" for k in range(1, 4)]
        tenants.append(
            _Tenant(
                g,
                companies[3 * g],
                companies[3 * g + 1 : 3 * g + 3],
                people[4 * g : 4 * g + 4],
                tickets,
            )  # fmt: skip
        )
    return tenants


class _Builder:
    """Builds one message: its text parts, entities (speaker first) and facts."""

    def __init__(self, tenant: _Tenant, speaker: str) -> None:
        self.tenant = tenant
        self.speaker = speaker
        self.entities: dict[str, TruthEntity] = {speaker: TruthEntity(speaker, "Person")}
        self.facts: list[TruthFact] = []
        self.contradictions = 0

    def entity(self, name: str, type_: str) -> str:
        self.entities.setdefault(name, TruthEntity(name, type_))
        return name

    def fact(self, s: str, rel: str, o: str, text: str, valid_at: str | None = None) -> None:
        if rel in ONE_VALUED:
            before = self.tenant.state.get((s, rel))
            if before is not None and before != o:
                self.contradictions += 1
            self.tenant.state[(s, rel)] = o
        self.facts.append(TruthFact(s, rel, o, text, valid_at))

    def truth(self) -> TruthEpisode:
        return TruthEpisode(list(self.entities.values()), self.facts, self.contradictions)


Template = Callable[[_Builder, random.Random, datetime], str]


def _plan(b: _Builder, rng: random.Random, ref: datetime) -> str:
    company = b.entity(b.tenant.company, "Organization")
    plan = rng.choice(PLANS)
    plan_name = b.entity(f"{plan} plan", "Plan")
    day = (ref - timedelta(days=rng.randint(0, 3))).date().isoformat()
    b.fact(company, "HAS_PLAN", plan_name, f"{company} is on the {plan} plan", day)
    return f"Heads-up, {company} moved to the {plan} plan on {day}."


def _job(b: _Builder, rng: random.Random, ref: datetime) -> str:
    person = b.entity(rng.choice([p for p in b.tenant.people if p != b.speaker]), "Person")
    org = b.entity(rng.choice([b.tenant.company, *b.tenant.others]), "Organization")
    day = (ref - timedelta(days=rng.randint(1, 20))).date().isoformat()
    b.fact(person, "WORKS_AT", org, f"{person} works at {org}", day)
    return f"FYI {person} has been working at {org} since {day}."


def _status(b: _Builder, rng: random.Random, ref: datetime) -> str:
    ticket = b.entity(rng.choice(b.tenant.tickets), "Ticket")
    product = b.entity(PRODUCTS[int(ticket[-1]) % len(PRODUCTS)], "Product")
    status = rng.choice(STATUSES)
    status_name = b.entity(f"status {status}", "Status")
    b.fact(ticket, "HAS_STATUS", status_name, f"{ticket} has status {status}")
    b.fact(ticket, "CONCERNS", product, f"{ticket} concerns the {product}")
    return f"Update on {ticket} about the {product}: it is {status} now."


def _report(b: _Builder, rng: random.Random, ref: datetime) -> str:
    ticket = b.entity(rng.choice(b.tenant.tickets), "Ticket")
    product = b.entity(PRODUCTS[int(ticket[-1]) % len(PRODUCTS)], "Product")
    company = b.entity(b.tenant.company, "Organization")
    b.fact(b.speaker, "REPORTED", ticket, f"{b.speaker} reported {ticket}")
    b.fact(company, "AFFECTED_BY", ticket, f"{company} is affected by {ticket}")
    return f"I am following up on {ticket}: the {product} keeps failing for {company}."


def _manager(b: _Builder, rng: random.Random, ref: datetime) -> str:
    company = b.entity(b.tenant.company, "Organization")
    person = b.entity(rng.choice(b.tenant.people), "Person")
    b.fact(company, "MANAGED_BY", person, f"{person} is the account manager for {company}")
    return f"From today {person} is the account manager for {company}."


def _uses(b: _Builder, rng: random.Random, ref: datetime) -> str:
    company = b.entity(b.tenant.company, "Organization")
    product = b.entity(rng.choice(PRODUCTS), "Product")
    team = rng.choice(TEAMS)
    b.fact(company, "USES", product, f"{company} uses the {product}")
    return f"Good to know: {company} uses the {product} for their {team} team."


def _reports_to(b: _Builder, rng: random.Random, ref: datetime) -> str:
    person, boss = rng.sample(b.tenant.people, 2)
    b.entity(person, "Person")
    b.entity(boss, "Person")
    b.fact(person, "REPORTS_TO", boss, f"{person} reports to {boss}")
    return f"Org change: {person} now reports to {boss}."


TEMPLATES: tuple[Template, ...] = (
    _plan, _job, _status, _report, _manager, _uses, _reports_to,
)  # fmt: skip


def _message(
    tenant: _Tenant, n: int, ref: datetime, rng: random.Random, seen: set[str]
) -> tuple[str, TruthEpisode]:
    """A message whose content no earlier message of the feed has (drawn again if so)."""
    for attempt in range(50):
        speaker = rng.choice(tenant.people)
        saved = dict(tenant.state)
        builder = _Builder(tenant, speaker)
        body = rng.choice(TEMPLATES)(builder, rng, ref)
        content = f"{speaker}: {body}"
        if attempt >= 10:  # a crowded tenant: make the wording unique instead
            content = f"{speaker}: ({n}) {body}"
        if content not in seen:
            seen.add(content)
            return content, builder.truth()
        tenant.state = saved
    raise RuntimeError("could not draw a new message")  # pragma: no cover


def text_feed(episodes: int, groups: int, *, seed: int = 8) -> list[FeedEpisode]:
    """``episodes`` messages over ``groups`` tenants (``tenant-00`` ...), interleaved."""
    if episodes < 1 or groups < 1:
        raise ValueError("episodes and groups must be at least 1")
    rng = random.Random(seed)
    tenants = _cast(groups, rng)
    clocks = [START + timedelta(minutes=7 * g) for g in range(groups)]
    counts = [0] * groups
    seen: set[str] = set()
    feed: list[FeedEpisode] = []
    for i in range(episodes):
        g = i % groups
        tenant = tenants[g]
        counts[g] += 1
        clocks[g] += timedelta(hours=rng.randint(2, 30), minutes=rng.randint(0, 59))
        content, truth = _message(tenant, counts[g], clocks[g], rng, seen)
        group = f"tenant-{g:02d}"
        feed.append(
            FeedEpisode(
                f"{group}-msg-{counts[g]:04d}",
                group,
                f"message {counts[g]}",
                content,
                clocks[g],
                truth,
            )  # fmt: skip
        )
    return feed


def feed_stats(feed: list[FeedEpisode]) -> dict[str, Any]:
    """What the ground truth holds, per episode."""
    n = len(feed) or 1
    return {
        "episodes": len(feed),
        "groups": len({e.group for e in feed}),
        "entities_per_episode": round(sum(len(e.truth.entities) for e in feed) / n, 3),
        "facts_per_episode": round(sum(len(e.truth.facts) for e in feed) / n, 3),
        "contradicting_facts": sum(e.truth.contradicts_earlier for e in feed),
        "content_chars_per_episode": round(sum(len(e.content) for e in feed) / n, 1),
    }


class FeedIndex:
    """Lookups for the fake LLM: a message's truth by content, a fact's truth by wording."""

    def __init__(self, feed: list[FeedEpisode]) -> None:
        self.by_content: dict[str, FeedEpisode] = {}
        self.by_fact: dict[str, TruthFact] = {}
        self.types: dict[str, str] = {}
        for episode in feed:
            if episode.content in self.by_content:
                raise ValueError(f"two messages share the content {episode.content!r}")
            self.by_content[episode.content] = episode
            for fact in episode.truth.facts:
                known = self.by_fact.setdefault(fact.fact, fact)
                if known.key != fact.key:
                    raise ValueError(f"one wording for two facts: {fact.fact!r}")
            for entity in episode.truth.entities:
                self.types.setdefault(entity.name, entity.type)

    def episode(self, text: str) -> FeedEpisode:
        """The message whose content is ``text`` (surrounding whitespace ignored)."""
        found = self.by_content.get(text.strip())
        if found is None:
            raise KeyError(f"no message of the feed has the content {text.strip()[:120]!r}")
        return found

    def fact(self, text: str) -> TruthFact | None:
        return self.by_fact.get(text.strip())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--seed", type=int, default=8)
    args = parser.parse_args(argv)
    feed = text_feed(args.episodes, args.groups, seed=args.seed)
    for episode in feed:
        sys.stdout.buffer.write(orjson.dumps(episode.as_json()) + b"\n")
    print(orjson.dumps(feed_stats(feed)).decode(), file=sys.stderr)


if __name__ == "__main__":
    main()
