"""A small CRM in PostgreSQL (accounts, contacts, tickets, each row of a tenant), the declared
source and mapping that read its Debezium change events, a script of changes, and the facts
each state of the tables means: what the graph must hold valid at any time of the script.

Used by the end-to-end tests of declared sources and ``benchmarks.sources``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).resolve().parents[2] / "tidegraph" / "app" / "samples"

SCHEMA = """
CREATE TABLE accounts (id int PRIMARY KEY, tenant text NOT NULL, name text NOT NULL,
                       plan text NOT NULL, owner text NOT NULL);
CREATE TABLE contacts (id int PRIMARY KEY, tenant text NOT NULL, name text NOT NULL,
                       account_id int NOT NULL);
CREATE TABLE tickets (id int PRIMARY KEY, tenant text NOT NULL, account_id int NOT NULL,
                      subject text NOT NULL, status text NOT NULL);
ALTER TABLE accounts REPLICA IDENTITY FULL;
ALTER TABLE contacts REPLICA IDENTITY FULL;
ALTER TABLE tickets REPLICA IDENTITY FULL;
"""
TABLES = ("accounts", "contacts", "tickets")

# One rule per table, declared once: what a row means (docs/sources.md "Change events"). The
# sample the README's tour names.
MAPPING = (SAMPLES / "crm_tables_mapping.yaml").read_text()


def sources_file(name: str, topic_prefix: str, group_prefix: str, **extra: str) -> str:
    """The sources file of the CRM's three change topics: the group is the row's tenant
    (``group_prefix`` before it)."""
    topics = ", ".join(f"{topic_prefix}.public.{table}" for table in TABLES)
    lines = [
        "sources:",
        f"  - name: {name}",
        f"    topics: [{topics}]",
        "    envelope: debezium",
        f'    group: "{group_prefix}{{row.tenant}}"',
    ]
    lines += [f"    {key}: {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


Row = dict[str, Any]


@dataclass
class Tables:
    """The tables' state as the script leaves it (a model of the database)."""

    accounts: dict[int, Row] = field(default_factory=dict)
    contacts: dict[int, Row] = field(default_factory=dict)
    tickets: dict[int, Row] = field(default_factory=dict)

    def copy(self) -> Tables:
        return Tables(
            {k: dict(v) for k, v in self.accounts.items()},
            {k: dict(v) for k, v in self.contacts.items()},
            {k: dict(v) for k, v in self.tickets.items()},
        )

    def facts(self, tenant: str) -> set[tuple[str, str, str]]:
        """(subject, relation, object) of every fact the rows of ``tenant`` state."""
        out: set[tuple[str, str, str]] = set()
        for a in self.accounts.values():
            if a["tenant"] == tenant:
                out.add((f"Account {a['id']}", "HAS_PLAN", a["plan"]))
                out.add((f"Account {a['id']}", "OWNED_BY", a["owner"]))
        for c in self.contacts.values():
            if c["tenant"] == tenant:
                out.add((c["name"], "WORKS_AT", f"Account {c['account_id']}"))
        for t in self.tickets.values():
            if t["tenant"] == tenant:
                out.add((f"Ticket {t['id']}", "HAS_STATUS", t["status"]))
                out.add((f"Ticket {t['id']}", "FOR_ACCOUNT", f"Account {t['account_id']}"))
        return out


@dataclass(frozen=True)
class Step:
    """One transaction: its SQL, what it does to the model, and the rows it changes (each
    change is one change event: one episode)."""

    sql: str
    apply: Callable[[Tables], None]
    rows: tuple[tuple[str, int], ...]

    def tenants(self, before: Tables, after: Tables) -> list[str]:
        """The tenant of each change event of this step."""
        out = []
        for table, row_id in self.rows:
            row = getattr(before, table).get(row_id) or getattr(after, table)[row_id]
            out.append(row["tenant"])
        return out


def _insert(table: str, row: Row) -> Step:
    columns = ", ".join(row)
    values = ", ".join(_literal(v) for v in row.values())

    def apply(t: Tables) -> None:
        getattr(t, table)[row["id"]] = dict(row)

    return Step(f"INSERT INTO {table} ({columns}) VALUES ({values})", apply, ((table, row["id"]),))


def _update(table: str, row_id: int, **changes: Any) -> Step:
    sets = ", ".join(f"{k} = {_literal(v)}" for k, v in changes.items())

    def apply(t: Tables) -> None:
        getattr(t, table)[row_id].update(changes)

    return Step(f"UPDATE {table} SET {sets} WHERE id = {row_id}", apply, ((table, row_id),))


def _delete(table: str, row_id: int) -> Step:
    def apply(t: Tables) -> None:
        del getattr(t, table)[row_id]

    return Step(f"DELETE FROM {table} WHERE id = {row_id}", apply, ((table, row_id),))


def _both(*steps: Step) -> Step:
    def apply(t: Tables) -> None:
        for step in steps:
            step.apply(t)

    return Step(";".join(s.sql for s in steps), apply, tuple(r for s in steps for r in s.rows))


def _literal(value: Any) -> str:
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def initial() -> list[Step]:
    """The rows before capture starts (Debezium's snapshot reads them: op r)."""
    return [
        _insert("accounts", {"id": 1, "tenant": "north", "name": "Acme", "plan": "Pro",
                             "owner": "Alice"}),
        _insert("accounts", {"id": 2, "tenant": "north", "name": "Globex", "plan": "Starter",
                             "owner": "Bob"}),
        _insert("accounts", {"id": 3, "tenant": "south", "name": "Initech", "plan": "Pro",
                             "owner": "Carol"}),
        _insert("contacts", {"id": 10, "tenant": "north", "name": "Fatima Khan",
                             "account_id": 1}),
        _insert("tickets", {"id": 100, "tenant": "north", "account_id": 1,
                            "subject": "SSO fails", "status": "open"}),
    ]  # fmt: skip


def script() -> list[Step]:
    """Inserts, updates and deletes after capture started, one transaction each."""
    return [
        _update("accounts", 1, plan="Enterprise"),
        _both(_update("tickets", 100, status="pending"), _update("accounts", 2, owner="Dana")),
        _insert("contacts", {"id": 11, "tenant": "south", "name": "Wei Zhang", "account_id": 3}),
        _update("contacts", 10, account_id=2),  # Fatima moves to Globex
        _delete("tickets", 100),
        # the owner changes; the plan is written with its same value: only the owner moves
        _update("accounts", 1, owner="Erin", plan="Enterprise"),
        _insert("tickets", {"id": 101, "tenant": "south", "account_id": 3,
                            "subject": "Invoice wrong", "status": "open"}),
        _update("tickets", 101, status="closed"),
        _delete("accounts", 2),
        _update("accounts", 3, plan="Business"),
    ]  # fmt: skip
