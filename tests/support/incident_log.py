"""A generated incident log: business records asked by their ids, over a long history.

Each of ``subjects`` tickets (ids shaped like a ticketing system's, ``1-732025285``) has
``changes`` updates over two years; an update is a snapshot of the ticket's three one-valued
attributes (its status, its owner and its team), as an incident export gives them, mapped by
:data:`INCIDENT_MAPPING` (a declared mapping: no LLM). So a group holds
``3 * subjects * changes`` facts, all but ``3 * subjects`` of them closed. :class:`IncidentLog`
keeps the truth: a ticket's status at any time.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from tidegraph.processors.mapping import MappingSet
from tidegraph.records.episode import Episode
from tidegraph.records.times import iso

INCIDENT_MAPPING = """\
mappings:
  - name: ticket_update
    match: {type: ticket.update}
    entities:
      ticket: {name: "Ticket {ticket.id}", label: Ticket, key: "itsm:ticket:{ticket.id}",
               summary: "{ticket.title}"}
      status: {name: "{status}", label: TicketStatus}
      owner: {name: "{owner.name}", label: User, key: "itsm:user:{owner.id}"}
      team: {name: "{team} team", label: Team}
    facts:
      - {relation: HAS_STATUS, subject: ticket, object: status, cardinality: one,
         valid_at: at, fact: "Ticket {ticket.id} status is {status}"}
      - {relation: OWNED_BY, subject: ticket, object: owner, cardinality: one,
         valid_at: at, fact: "Ticket {ticket.id} is owned by {owner.name}"}
      - {relation: ASSIGNED_TO, subject: ticket, object: team, cardinality: one,
         valid_at: at, fact: "Ticket {ticket.id} is assigned to the {team} team"}
"""

STATUSES = ("New", "Assigned", "In Progress", "Pending", "Resolved", "Closed", "Reopened")
TEAMS = ("Network", "Database", "Storage", "Desktop", "Identity", "Payments", "Mobile", "Web")
OWNERS = tuple(
    f"{first} {last}"
    for first in ("Ana", "Ben", "Chen", "Dara", "Eli", "Femi", "Gia", "Hugo")
    for last in ("Ito", "Lund", "Moss", "Park", "Roy")
)
TITLES = ("VPN drops", "Login fails", "Disk full", "Slow queries", "Printer jam", "App crash")
START = datetime(2011, 1, 1, tzinfo=UTC)
SPAN = timedelta(days=730)


def incident_mappings() -> MappingSet:
    return MappingSet.model_validate(yaml.safe_load(INCIDENT_MAPPING))


@dataclass(frozen=True)
class Question:
    """ "What is the status of ticket <id>?" valid at ``valid_at`` (None: now); ``status``
    the answer."""

    ticket: str
    valid_at: datetime | None
    status: str

    @property
    def query(self) -> str:
        return f"What is the status of ticket {self.ticket}?"


@dataclass
class IncidentLog:
    episodes: list[Episode]
    # ticket id -> its updates (time, status), in time order
    statuses: dict[str, list[tuple[datetime, str]]]

    def status_at(self, ticket: str, at: datetime | None) -> str:
        updates = self.statuses[ticket]
        if at is None:
            return updates[-1][1]
        return updates[bisect.bisect_right([t for t, _ in updates], at) - 1][1]

    def questions(self, count: int, seed: int = 1) -> list[Question]:
        """``count`` questions about random tickets, half asked now and half as of a random
        moment between two of the ticket's updates."""
        rng = random.Random(seed)
        tickets = sorted(self.statuses)
        asked: list[Question] = []
        for n in range(count):
            ticket = rng.choice(tickets)
            at: datetime | None = None
            if n % 2:
                updates = self.statuses[ticket]
                i = rng.randrange(len(updates) - 1)
                start, end = updates[i][0], updates[i + 1][0]
                at = start + (end - start) * rng.uniform(0.1, 0.9)
            asked.append(Question(ticket, at, self.status_at(ticket, at)))
        return asked


def incident_log(
    group_id: str, subjects: int = 1000, changes: int = 20, seed: int = 3
) -> IncidentLog:
    """The feed of one group, in time order (see the module docstring)."""
    rng = random.Random(seed)
    ids = rng.sample(range(100_000_000, 1_000_000_000), subjects)
    updates: list[tuple[datetime, dict[str, Any]]] = []
    statuses: dict[str, list[tuple[datetime, str]]] = {}
    for number in ids:
        ticket = f"1-{number}"
        title = rng.choice(TITLES)
        times = sorted(START + SPAN * rng.random() for _ in range(changes))
        statuses[ticket] = []
        for at in times:
            status, team = rng.choice(STATUSES), rng.choice(TEAMS)
            owner = rng.randrange(len(OWNERS))
            statuses[ticket].append((at, status))
            record = {
                "type": "ticket.update",
                "ticket": {"id": ticket, "title": title},
                "status": status,
                "owner": {"id": f"u{owner:03d}", "name": OWNERS[owner]},
                "team": team,
                "at": iso(at),
            }
            updates.append((at, record))
    updates.sort(key=lambda u: (u[0], str(u[1]["ticket"])))
    episodes = [
        Episode(
            id=f"itsm:{record['ticket']['id']}:{n}",
            group_id=group_id,
            source="json",
            name="ticket.update",
            source_description="incident export",
            content=record,
            reference_time=at,
        )
        for n, (at, record) in enumerate(updates)
    ]
    return IncidentLog(episodes, statuses)
