"""A PostgreSQL database of a test's own, captured by a Debezium connector of its own on the
local Kafka Connect worker (``tests.support.local_services``): the tables' changes arrive on
``<topic_prefix>.<schema>.<table>``.

    async with CapturedDatabase(postgres_dsn, connect_url, kafka_bootstrap, "t1a2b3") as db:
        db.execute("CREATE TABLE accounts (...)")
        await db.capture(["public.accounts"])      # the connector runs; snapshot taken
        db.execute("UPDATE accounts SET ...")

Everything is dropped at the end: the connector, its replication slot and publication, the
database.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Any

import psycopg

from tests.support.local_services import (
    APICURIO_V2_API_PATH,
    CONFLUENT_API_PATH,
    DEBEZIUM_POSTGRES_CONNECTOR,
)

CONNECTOR_TIMEOUT_SECONDS = 90.0
# The connector's poll interval (docs/sources.md "Walkthrough: a Debezium feed").
POLL_INTERVAL_MS = 50


def avro_converter(registry_url: str) -> dict[str, str]:
    """A connector's converter settings for Avro values in Confluent's wire format (a zero
    byte, the 4-byte schema id, Avro binary), as Confluent's AvroConverter writes them, through
    Apicurio Registry's converter (the local Connect worker's plugin) and the registry whose
    Confluent-compatible API is ``registry_url``: each value schema registered there, its id
    the one that API serves (the content id). Keys stay plain JSON."""
    native = registry_url.removesuffix(CONFLUENT_API_PATH) + APICURIO_V2_API_PATH
    value = "value.converter.apicurio.registry"
    return {
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter": "io.apicurio.registry.utils.converter.AvroConverter",
        f"{value}.url": native,
        f"{value}.auto-register": "true",
        f"{value}.find-latest": "true",
        f"{value}.headers.enabled": "false",  # the schema id in the value, not in headers
        f"{value}.as-confluent": "true",  # 4-byte id, Confluent's framing
        f"{value}.use-id": "contentId",
    }


class CapturedDatabase:
    """A database and its Debezium connector, both named after ``name`` (letters, digits)."""

    def __init__(
        self,
        postgres_dsn: str,
        connect_url: str,
        name: str,
        *,
        converter: dict[str, str] | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        """``converter``: the connector's key/value converter settings (default: Connect's
        JSON converter with schemas, the worker's default); ``extra``: more connector
        settings."""
        if not name.isalnum():
            raise ValueError(f"name {name!r} must be letters and digits")
        self.name = name.lower()
        self.admin_dsn = postgres_dsn
        self.dsn = postgres_dsn.rsplit("/", 1)[0] + f"/{self.name}"
        self.connect_url = connect_url
        self.converter = converter or {}
        self.extra = extra or {}
        self.topic_prefix = self.name
        self._captured = False

    def topic(self, table: str, schema: str = "public") -> str:
        return f"{self.topic_prefix}.{schema}.{table}"

    async def __aenter__(self) -> CapturedDatabase:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.drop)

    def execute(self, sql: str, params: Any = None) -> None:
        """Run statements in one transaction (committed when this returns)."""
        with psycopg.connect(self.dsn) as conn:
            conn.execute(sql, params)

    def connector_config(self, tables: list[str]) -> dict[str, str]:
        host, port = self.dsn.split("@", 1)[1].split("/", 1)[0].split(":")
        user = self.dsn.split("//", 1)[1].split("@", 1)[0]
        return {
            "connector.class": DEBEZIUM_POSTGRES_CONNECTOR,
            "database.hostname": host,
            "database.port": port,
            "database.user": user,
            "database.password": "",
            "database.dbname": self.name,
            "topic.prefix": self.topic_prefix,
            "plugin.name": "pgoutput",
            "slot.name": self.name,
            "publication.name": self.name,
            "publication.autocreate.mode": "filtered",
            "table.include.list": ",".join(tables),
            "snapshot.mode": "initial",
            # Debezium waits this long for more changes before it hands a batch to Connect
            # (and again before it reads the WAL when nothing was pending): its default, 500
            # ms, is up to a second between a commit and its change on Kafka.
            "poll.interval.ms": str(POLL_INTERVAL_MS),
            **self.converter,
            **self.extra,
        }

    async def capture(self, tables: list[str]) -> None:
        """Create the connector for ``tables`` (``schema.table``) and wait until its task
        runs."""
        _request("PUT", f"{self.connect_url}/connectors/{self.name}/config",
                 self.connector_config(tables))  # fmt: skip
        self._captured = True
        await self.wait_running()

    async def wait_running(self) -> None:
        deadline = time.monotonic() + CONNECTOR_TIMEOUT_SECONDS
        status: Any = None
        while time.monotonic() < deadline:
            try:
                status = _request("GET", f"{self.connect_url}/connectors/{self.name}/status")
            except urllib.error.HTTPError:
                status = None
            tasks = (status or {}).get("tasks") or []
            if tasks and all(t.get("state") == "RUNNING" for t in tasks):
                return
            if any(t.get("state") == "FAILED" for t in tasks):
                raise RuntimeError(f"connector {self.name} failed: {json.dumps(status)[:3000]}")
            await asyncio.sleep(0.2)  # polling interval of the status, not a synchronisation
        raise TimeoutError(f"connector {self.name} not running: {json.dumps(status)[:3000]}")

    async def restart(self) -> None:
        """Restart the connector and its task (Connect's REST API), as an operator would."""
        _request(
            "POST",
            f"{self.connect_url}/connectors/{self.name}/restart?includeTasks=true",
        )
        await self.wait_running()

    def drop(self) -> None:
        if self._captured:
            try:
                _request("DELETE", f"{self.connect_url}/connectors/{self.name}")
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
        # The slot stays active until the task has let go of it; then it, the publication
        # and the database go.
        deadline = time.monotonic() + 60.0
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.name,)
                ).fetchone()
                if row is None:
                    break
                if not row[0]:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (self.name,))
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"replication slot {self.name} still in use")
                time.sleep(0.2)  # polling the slot's state, not a synchronisation
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def _request(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        raw = response.read()
    return json.loads(raw) if raw else None
