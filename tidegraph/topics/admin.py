"""Creating tidegraph's topics (idempotently) with the configured partitions and replication.

Workers call :func:`ensure_topics` before they subscribe (a Faust worker must not subscribe
to a topic that does not exist yet), and so do the producing commands.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tidegraph.connections import KafkaConnection, as_kafka_connection, bootstrap_list
from tidegraph.topics.names import TopicNames

log = logging.getLogger(__name__)

TOPIC_ALREADY_EXISTS = 36


class TopicSetupError(RuntimeError):
    """Topics could not be created, or exist with a partition count that breaks
    co-partitioning."""


__all__ = ["TopicSetupError", "bootstrap_list", "delete_topics", "ensure_topics", "partitions_of"]


def admin_client(kafka: str | KafkaConnection) -> AIOKafkaAdminClient:
    """An admin client with the connection's TLS/SASL options (a bare string = plaintext)."""
    return AIOKafkaAdminClient(**as_kafka_connection(kafka).client_options())


async def ensure_topics(
    kafka: str | KafkaConnection,
    names: TopicNames | Iterable[str],
    *,
    partitions: int,
    replication_factor: int,
    timeout: float = 60.0,
) -> list[str]:
    """Create the missing topics; check every one has ``partitions`` partitions, all with a
    leader. Returns the names of the topics this call created."""
    wanted = names.all() if isinstance(names, TopicNames) else list(names)
    admin = admin_client(kafka)
    try:
        await admin.start()  # inside: a failed start still closes the client
        # list_topics, not describe_topics: a metadata request naming a missing topic makes
        # a broker with auto.create.topics.enable create it with the broker's defaults.
        existing = set(await admin.list_topics())
        missing = [n for n in wanted if n not in existing]
        created: list[str] = []
        if missing:
            response = await admin.create_topics(
                [NewTopic(n, partitions, replication_factor) for n in missing]
            )
            for row in response.to_object()["topic_errors"]:
                code = row["error_code"]
                if code == 0:
                    created.append(row["topic"])
                elif code != TOPIC_ALREADY_EXISTS:  # another process won the race: fine
                    raise TopicSetupError(
                        f"cannot create topic {row['topic']!r}: {row['error_message']} "
                        f"(Kafka error {code}; partitions={partitions}, "
                        f"replication factor={replication_factor})"
                    )
        await _wait_ready(admin, wanted, partitions, timeout)
    finally:
        await admin.close()
    if created:
        log.info("created topics %s (partitions=%d)", ", ".join(created), partitions)
    return created


async def _wait_ready(
    admin: AIOKafkaAdminClient, names: list[str], partitions: int, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        described = {t["topic"]: t for t in await admin.describe_topics(names)}
        problems = _problems(described, names, partitions)
        if not problems:
            return
        wrong = [p for p in problems if p[1] == "partitions"]
        if wrong:
            details = "; ".join(msg for _, _, msg in wrong)
            raise TopicSetupError(
                f"topics exist with another partition count than TIDEGRAPH_PARTITIONS="
                f"{partitions}: {details}. All tidegraph topics must have the same count "
                f"(co-partitioned by group_id); use another TIDEGRAPH_TOPIC_PREFIX or "
                f"recreate the topics."
            )
        if time.monotonic() > deadline:
            details = "; ".join(msg for _, _, msg in problems)
            raise TopicSetupError(f"topics not ready after {timeout:.0f}s: {details}")
        await asyncio.sleep(0.2)


def _problems(
    described: dict[str, Any], names: list[str], partitions: int
) -> list[tuple[str, str, str]]:
    problems = []
    for name in names:
        topic = described.get(name)
        if topic is None or topic["error_code"] != 0:
            code = None if topic is None else topic["error_code"]
            problems.append((name, "missing", f"{name}: not available (error {code})"))
            continue
        parts = topic["partitions"]
        if len(parts) != partitions:
            problems.append((name, "partitions", f"{name} has {len(parts)} partitions"))
        elif any(p["leader"] < 0 or p["error_code"] != 0 for p in parts):
            problems.append((name, "leader", f"{name}: some partitions have no leader yet"))
    return problems


async def partitions_of(kafka: str | KafkaConnection, topic: str) -> list[int]:
    """The partition numbers of an existing topic; empty when the topic does not exist."""
    admin = admin_client(kafka)
    try:
        await admin.start()  # inside: a failed start still closes the client
        if topic not in set(await admin.list_topics()):  # never auto-create it
            return []
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return sorted(p["partition"] for t in described if t["topic"] == topic for p in t["partitions"])


async def delete_topics(kafka: str | KafkaConnection, names: Iterable[str]) -> None:
    admin = admin_client(kafka)
    try:
        await admin.start()  # inside: a failed start still closes the client
        await admin.delete_topics(list(names))
    finally:
        await admin.close()
