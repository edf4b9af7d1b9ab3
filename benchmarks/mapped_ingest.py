"""Ingest speed of a mapped JSON feed (no LLM): CRM accounts, contacts and support tickets.

``python -m benchmarks.mapped_ingest --records 5000 --store neo4j`` generates a synthetic feed
over ``--groups`` tenants (accounts changing plan and owner, contacts changing employer and
leaving, tickets opening, closing and reopening; a share of the records delivered late, out of
order), ingests it in-process through the real pipeline (declared mappings, resolution by
stable key, temporal stamping, invalidation, one transaction per episode) and prints events/s.
It then checks every subject's current value against the feed's ground truth and writes the
figures to ``benchmarks/results/mapped_ingest-<store>-<embedder>-<records>.json``.

Neo4j: ``--neo4j-uri`` (default: the local test server); the benchmark's groups are deleted
afterwards unless ``--keep``. Embedded: a fresh kuzu folder in a temporary directory.
``--profile`` writes a pyinstrument HTML profile next to the JSON (pyinstrument must be
installed; it is not a dependency of tidegraph).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from processors.mapping import MappingSet
from processors.models import Episode
from processors.pipeline import EpisodePipeline, ingest
from tidegraph.embed.base import Embedder
from tidegraph.store.base import GraphStore

RESULTS = Path(__file__).parent / "results"
START = datetime(2024, 1, 1, tzinfo=UTC)
PLANS = ["Free", "Basic", "Pro", "Business", "Enterprise"]
STATUSES = ["open", "pending", "closed"]

MAPPING = """
mappings:
  - name: account_plan
    match: {type: account.plan_changed}
    entities:
      account: {name: "{account.name}", label: Account, key: "crm:account:{account.id}"}
      plan: {name: "{plan}", label: Plan}
    facts:
      - {relation: HAS_PLAN, subject: account, object: plan, cardinality: one,
         valid_at: changed_at, fact: "{account.name} is on the {plan} plan"}
  - name: account_owner
    match: {type: account.owner_changed}
    entities:
      account: {name: "{account.name}", label: Account, key: "crm:account:{account.id}"}
      owner: {name: "{owner.name}", label: User, key: "crm:user:{owner.id}"}
    facts:
      - {relation: OWNED_BY, subject: account, object: owner, cardinality: one,
         valid_at: changed_at, fact: "{account.name} is owned by {owner.name}"}
  - name: contact_joined
    match: {type: contact.joined}
    entities:
      contact: {name: "{contact.name}", label: Contact, key: "crm:contact:{contact.id}",
                summary: "{contact.title}"}
      company: {name: "{company.name}", label: Account, key: "crm:account:{company.id}"}
    facts:
      - {relation: WORKS_AT, subject: contact, object: company, cardinality: one,
         valid_at: joined_at, fact: "{contact.name} works at {company.name} as {contact.title}"}
  - name: contact_left
    match: {type: contact.left}
    entities:
      contact: {name: "{contact.name}", label: Contact, key: "crm:contact:{contact.id}"}
      company: {name: "{company.name}", label: Account, key: "crm:account:{company.id}"}
    facts:
      - {relation: WORKS_AT, subject: contact, object: company, closes: true, valid_at: left_at}
  - name: ticket_status
    match: {type: ticket.status_changed}
    entities:
      ticket: {name: "Ticket {ticket.id}", label: Ticket, key: "crm:ticket:{ticket.id}",
               summary: "{ticket.subject}"}
      status: {name: "{status}", label: TicketStatus}
      account: {name: "{account.name}", label: Account, key: "crm:account:{account.id}"}
    facts:
      - {relation: HAS_STATUS, subject: ticket, object: status, cardinality: one,
         valid_at: changed_at, fact: "Ticket {ticket.id} is {status}: {ticket.subject}"}
      - {relation: FOR_ACCOUNT, subject: ticket, object: account, valid_at: changed_at,
         fact: "Ticket {ticket.id} was raised by {account.name}"}
"""


# ----------------------------------------------------------------------------- the feed
@dataclass
class Change:
    """Ground truth: subject (key) + relation has ``value`` from ``at`` (None: ended)."""

    group: str
    subject: str
    relation: str
    value: str | None
    at: datetime


class FeedBuilder:
    """A deterministic synthetic CRM/ticket feed spread over ``groups`` tenants."""

    def __init__(self, records: int, groups: int, late_fraction: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.records = records
        self.groups = [f"bench-{seed}-g{g:02d}" for g in range(groups)]
        self.late_fraction = late_fraction
        self.changes: list[Change] = []
        self.episodes: list[Episode] = []
        self._n = 0

    def build(self) -> list[Episode]:
        per_group = self.records // len(self.groups)
        extra = self.records - per_group * len(self.groups)
        for i, group in enumerate(self.groups):
            self._group(group, per_group + (1 if i < extra else 0))
        return self.episodes

    def _group(self, group: str, n: int) -> None:
        rng = self.rng
        accounts = [(a, f"Company {group[-3:]}-{a}") for a in range(max(3, n // 40))]
        owners = [(o, f"Owner {o}") for o in range(max(2, n // 150))]
        contacts = [(c, f"Contact {group[-3:]}-{c}") for c in range(max(3, n // 25))]
        tickets: dict[int, str] = {}
        employer: dict[int, int | None] = {}
        clock = START
        records: list[tuple[datetime, dict[str, Any]]] = []
        for _ in range(n):
            clock += timedelta(minutes=rng.randint(5, 600))
            when = clock.isoformat().replace("+00:00", "Z")
            kind = rng.choices(["plan", "owner", "contact", "ticket"], [3, 2, 3, 6])[0]
            account_id, account_name = rng.choice(accounts)
            account = {"id": account_id, "name": account_name}
            if kind == "plan":
                plan = rng.choice(PLANS)
                records.append(
                    (
                        clock,
                        {
                            "type": "account.plan_changed",
                            "account": account,
                            "plan": plan,
                            "changed_at": when,
                        },
                    )
                )
                self._truth(group, f"crm:account:{account_id}", "HAS_PLAN", plan, clock)
            elif kind == "owner":
                owner_id, owner_name = rng.choice(owners)
                owner = {"id": owner_id, "name": owner_name}
                records.append(
                    (
                        clock,
                        {
                            "type": "account.owner_changed",
                            "account": account,
                            "owner": owner,
                            "changed_at": when,
                        },
                    )
                )
                self._truth(group, f"crm:account:{account_id}", "OWNED_BY", owner_name, clock)
            elif kind == "contact":
                contact_id, contact_name = rng.choice(contacts)
                contact = {"id": contact_id, "name": contact_name, "title": "Buyer"}
                current = employer.get(contact_id)
                if current is not None and rng.random() < 0.3:
                    company = {"id": current, "name": accounts[current][1]}
                    records.append(
                        (
                            clock,
                            {
                                "type": "contact.left",
                                "contact": contact,
                                "company": company,
                                "left_at": when,
                            },
                        )
                    )
                    employer[contact_id] = None
                    self._truth(group, f"crm:contact:{contact_id}", "WORKS_AT", None, clock)
                else:
                    records.append(
                        (
                            clock,
                            {
                                "type": "contact.joined",
                                "contact": contact,
                                "company": account,
                                "joined_at": when,
                            },
                        )
                    )
                    employer[contact_id] = account_id
                    self._truth(group, f"crm:contact:{contact_id}", "WORKS_AT", account_name, clock)
            else:
                if tickets and rng.random() < 0.75:  # a status change (closed -> open: reopened)
                    ticket_id = rng.choice(list(tickets))
                    status = rng.choice([s for s in STATUSES if s != tickets[ticket_id]])
                else:
                    ticket_id, status = len(tickets) + 1, "open"
                tickets[ticket_id] = status
                ticket = {"id": f"{group[-3:]}-{ticket_id}", "subject": "Printer jams"}
                records.append(
                    (
                        clock,
                        {
                            "type": "ticket.status_changed",
                            "ticket": ticket,
                            "status": status,
                            "account": account,
                            "changed_at": when,
                        },
                    )
                )
                self._truth(group, f"crm:ticket:{ticket['id']}", "HAS_STATUS", status, clock)
        # Delivery: in event order, except a share of records held back and sent late (at a
        # random later point). reference_time = arrival: the latest event time sent so far.
        late = [i for i in range(len(records)) if rng.random() < self.late_fraction]
        held = set(late)
        order = [i for i in range(len(records)) if i not in held]
        for i in late:
            first = next((k for k, j in enumerate(order) if j > i), len(order))
            order.insert(rng.randint(first, len(order)), i)
        arrival = START
        for i in order:
            at, record = records[i]
            arrival = max(arrival, at)
            self._n += 1
            self.episodes.append(
                Episode(
                    id=f"bench:{group}:{self._n}",
                    group_id=group,
                    source="json",
                    source_description="synthetic CRM",
                    content=record,
                    reference_time=arrival + timedelta(seconds=1),
                )
            )

    def _truth(self, group: str, subject: str, relation: str, value: str | None, at: datetime):
        self.changes.append(Change(group, subject, relation, value, at))

    def current(self) -> dict[tuple[str, str, str], str | None]:
        """(group, subject key, relation) -> the value now, from the ground truth."""
        latest: dict[tuple[str, str, str], Change] = {}
        for change in sorted(self.changes, key=lambda c: c.at):
            latest[(change.group, change.subject, change.relation)] = change
        return {k: c.value for k, c in latest.items()}


# ----------------------------------------------------------------------------- running
def make_embedder(name: str) -> Embedder:
    if name == "hashing":
        from tidegraph.embed.hashing import HashingEmbedder

        return HashingEmbedder(dim=384)
    from tidegraph.embed.minilm import MiniLMEmbedder

    return MiniLMEmbedder()


async def open_store(kind: str, neo4j_uri: str, folder: Path) -> GraphStore:
    if kind == "neo4j":
        from tidegraph.store.neo4j_store import Neo4jStore

        return Neo4jStore(neo4j_uri)
    from tidegraph.store.kuzu_store import KuzuStore

    return KuzuStore(folder / "graph")


async def check(store: GraphStore, builder: FeedBuilder) -> dict[str, Any]:
    """Compare every subject's current value (facts valid now) with the ground truth."""
    found: dict[tuple[str, str, str], list[str]] = {}
    for group in builder.groups:
        keys = {e.name: e.key for e in await store.list_entities(group)}  # names are unique
        for view in await store.query_facts(group):
            key = keys.get(view.subject)
            if key is not None:
                found.setdefault((group, key, view.relation), []).append(view.object)
    truth = builder.current()
    wrong = [
        f"{subject}: expected {value}, found {sorted(found.get(subject, []))}"
        for subject, value in truth.items()
        if sorted(found.get(subject, [])) != ([value] if value is not None else [])
    ]
    return {"subjects_checked": len(truth), "subjects_wrong": len(wrong), "wrong": wrong[:10]}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    builder = FeedBuilder(args.records, args.groups, args.late_fraction, args.seed)
    episodes = builder.build()
    mappings = MappingSet.model_validate(yaml.safe_load(MAPPING))
    embedder = make_embedder(args.embedder)
    with tempfile.TemporaryDirectory(prefix="tidegraph-bench-") as tmp:
        store = await open_store(args.store, args.neo4j_uri, Path(tmp))
        await store.setup(embedder.dim)
        for group in builder.groups:
            await store.delete_group(group)
        pipeline = EpisodePipeline(store=store, embedder=embedder, llm=None, mappings=mappings)
        profiler = None
        if args.profile:
            from pyinstrument import Profiler

            profiler = Profiler(async_mode="enabled")
            profiler.start()
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        report = await ingest(pipeline, episodes, concurrency=args.concurrency)
        seconds = time.perf_counter() - started
        if profiler is not None:
            profiler.stop()
        checked = await check(store, builder)
        counts = {"entities": 0, "facts": 0, "episodes": 0, "mentions": 0}
        for group in builder.groups:
            for k, v in (await store.counts(group)).items():
                counts[k] += v
        if args.store == "neo4j" and not args.keep:
            for group in builder.groups:
                await store.delete_group(group)
        await store.close()
    await embedder.close()
    result = {
        "command": "python -m benchmarks.mapped_ingest " + " ".join(sys.argv[1:]),
        "store": args.store,
        "embedder": args.embedder,
        "records": len(episodes),
        "groups": args.groups,
        "concurrency": args.concurrency,
        "late_fraction": args.late_fraction,
        "seconds": round(seconds, 3),
        "events_per_s": round(len(episodes) / seconds, 1),
        "ms_per_event_per_group": round(
            1000 * seconds * min(args.concurrency, args.groups) / len(episodes), 2
        ),
        "failures": len(report.failures),
        "first_failure": report.failures[0].message if report.failures else None,
        "facts_new": report.facts_new,
        "facts_merged": report.facts_merged,
        "facts_closed": report.facts_closed,
        "facts_born_closed": report.facts_born_closed,
        "llm_calls": report.llm_calls,
        **counts,
        **checked,
        "cpus": os.cpu_count(),
        # The machine may be shared: the 1-minute load average before and after the ingest.
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "python": platform.python_version(),
    }
    if profiler is not None:
        path = RESULTS / f"mapped_ingest-{args.store}-{args.embedder}-{args.records}.profile.html"
        path.write_text(profiler.output_html())
        result["profile"] = str(path)
        print(profiler.output_text(unicode=False, color=False)[:8000])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--store", choices=["neo4j", "embedded"], default="neo4j")
    parser.add_argument("--embedder", choices=["hashing", "minilm"], default="hashing")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16, help="groups processed at once")
    parser.add_argument("--late-fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--neo4j-uri", default="bolt://127.0.0.1:17687")
    parser.add_argument("--keep", action="store_true", help="keep the groups in Neo4j")
    parser.add_argument("--profile", action="store_true", help="pyinstrument profile")
    args = parser.parse_args(argv)
    if args.groups < 1 or args.records < args.groups:
        parser.error("need at least one record per group")
    result = asyncio.run(run(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"mapped_ingest-{args.store}-{args.embedder}-{args.records}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{result['records']} records, {args.groups} groups, {args.store} + {args.embedder}: "
        f"{result['seconds']:.1f} s, {result['events_per_s']:.0f} events/s "
        f"({result['facts_new']} facts, {result['facts_closed']} closed, "
        f"{result['facts_born_closed']} born closed, {result['failures']} failed; "
        f"{result['subjects_wrong']}/{result['subjects_checked']} subjects wrong) -> {out}"
    )
    return 0 if result["failures"] == 0 and result["subjects_wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
