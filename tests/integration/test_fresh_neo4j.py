"""On a Neo4j database that has never held tidegraph's data, no command logs a warning.

Until a node has a property, every read that filters on it made Neo4j notify "property key
does not exist" once per query (``forgotten_at`` until something is forgotten; on the first
command also ``aliases``, ``content_hash``, ``content``, ...): a wall of warnings for a user
of a new database. The store's driver asks Neo4j not to send that class of notification
(UNRECOGNIZED, ``tidegraph/connections.py``); every other class still reaches the log.

The suite's shared Neo4j has held every key long since (a key stays once created), so this
module starts a Neo4j of its own in a temporary folder, checks that it holds none of
tidegraph's keys, then runs a worker, ``ingest``, ``search`` and ``forget`` against it in that
order: each reads ``forgotten_at`` before the forget first writes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from neo4j import AsyncGraphDatabase

from tests.integration.topology_harness import Topology
from tests.support.crm_feed import crm_feed
from tests.support.local_services import LocalServices, LocalSettings, ServiceError

pytestmark = pytest.mark.integration

UNSET_KEYS = {"forgotten_at", "aliases", "content_hash", "content", "created_entities", "source"}


@pytest.fixture(scope="module")
def fresh_neo4j(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Neo4j server of this module's own, on a new database; stopped afterwards."""
    folder = tmp_path_factory.mktemp("fresh-neo4j")
    services = LocalServices(LocalSettings(services_dir=folder), free_ports=True)
    try:
        services.up(("neo4j",))
    except ServiceError as exc:
        pytest.fail(f"a Neo4j of the test's own could not be started: {exc}", pytrace=False)
    try:
        yield services.neo4j_address
    finally:
        services.down(("neo4j",))


def warnings(text: str) -> list[str]:
    """The lines of a log or of a command's output that warn (any logger's at WARNING, a
    notification of severity WARNING however it is printed) or show a traceback."""
    return [line for line in text.splitlines() if "WARNING" in line or "Traceback" in line]


async def property_keys(uri: str) -> set[str]:
    async with AsyncGraphDatabase.driver(uri, auth=None) as driver:
        records, _, _ = await driver.execute_query("CALL db.propertyKeys()")
        return {r["propertyKey"] for r in records}


async def test_no_command_logs_a_warning_on_a_fresh_database(
    fresh_neo4j: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    assert not UNSET_KEYS & await property_keys(fresh_neo4j), "the database is not fresh"
    topology = Topology(kafka_bootstrap, fresh_neo4j, topic_prefix, tmp_path)
    try:
        worker = topology.start_worker(TIDEGRAPH_COMMUNITIES_ENABLED="false")
        await topology.wait_assigned([worker])
        await topology.wait_reflected(await topology.produce(crm_feed(12, 2, run=topology.run)))
        assert worker.stop() == 0
        assert warnings(worker.log.read_text()) == []

        ingested = crm_feed(6, 1, run=f"{topology.run}-cli")
        group, first = ingested[0]["group_id"], ingested[0]["id"]
        feed = tmp_path / "feed.jsonl"
        feed.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in ingested))
        for args in (
            ("ingest", str(feed), "--mapping", str(topology.mapping)),
            ("search", "plan", "--group", group),
            ("forget", "--group", group, "--episode", first),
        ):
            done = topology.cli(*args)
            assert warnings(done.stdout + done.stderr) == [], args
        assert "forgotten_at" in await property_keys(fresh_neo4j)  # each command read it unset
    finally:
        for running in topology.workers:
            if running.alive():
                running.kill()
