"""Declared sources in the worker (docs/sources.md): the source topics' records decoded (JSON,
or Avro through a schema registry) and turned into episodes by their declared source
(``tidegraph.processors.sources``). An episode a declared mapping extracts is mapped here, where
it is read (the mapping is pure), and its extraction produced to ``{prefix}.extracted``, keyed
by group, where the write hop takes it like any other (the one group runner: one writer per
group, the group's records in order); an episode no rule matches goes to ``{prefix}.episodes``,
keyed by group, for the extraction hop (the LLM's extraction). A record is acked once what it
became (or its dead letter) is acknowledged by Kafka.

Order: the source agent has one lane per source partition (``SourceHandler.lane_of``), so each
row's changes (Debezium keys them by primary key: one partition) and a table's truncate reach
``{prefix}.extracted`` in their source order; records of other partitions of one group may
interleave differently, which the temporal rules absorb (a record older than what is stored is
late, and stored closed).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidegraph.connections import KafkaConnection
from tidegraph.metrics import (
    RETRIES,
    SOURCE_BEHIND,
    SOURCE_DEAD_LETTERS,
    SOURCE_RECORDS,
    SOURCE_SKIPPED,
)
from tidegraph.pipelines.streaming.config import WorkerSettings
from tidegraph.pipelines.streaming.connect_json import JsonValues
from tidegraph.pipelines.streaming.handlers import Consumed, Emit, RecordHandler, Taken
from tidegraph.processors.sources import (
    RegistrySpec,
    Skipped,
    SourceFileError,
    SourceRecord,
    SourceSet,
    SourceSpec,
)
from tidegraph.records import jsontext
from tidegraph.records.episode import Episode
from tidegraph.records.errors import RecordError
from tidegraph.records.outcome import Failure, Outcome
from tidegraph.records.stages import Extraction
from tidegraph.topics.admin import admin_client
from tidegraph.topics.names import TopicNames
from tidegraph.topics.records import encode, encode_key

log = logging.getLogger(__name__)

# The schema-registry wire format (Confluent's): a zero byte, the schema id (4 bytes, big
# endian), then the encoded record.
WIRE_MAGIC = 0
WIRE_HEADER_BYTES = 5


class RegistryUnavailable(ConnectionError):
    """The schema registry did not answer (a transient failure: retried)."""


class RegistryDecoder:
    """Values in the schema registry's wire format, decoded with the schemas fetched from the
    registry by confluent-kafka's client once per id and cached (ids are immutable):
    ``avro``: ``AvroValues``, fastavro's reader with the schema parsed once; ``jsonschema``:
    confluent-kafka's deserializer, JSON checked against its schema; ``protobuf``:
    ``ProtobufValues``, the schema's descriptors built at run time."""

    def __init__(self, registry: RegistrySpec, format: str = "avro") -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.client = SchemaRegistryClient(registry_conf(registry, timeout=10))
        self.deserializer: Callable[[bytes, Any], Any]
        if format == "jsonschema":
            from confluent_kafka.schema_registry.json_schema import JSONDeserializer

            self.deserializer = JSONDeserializer(None, schema_registry_client=self.client)
        elif format == "protobuf":
            from tidegraph.pipelines.streaming.protobuf import ProtobufValues

            self.deserializer = ProtobufValues(self.client)
        else:
            from tidegraph.pipelines.streaming.avro import AvroValues

            self.deserializer = AvroValues(self.client)
        self._known: set[int] = set()

    async def decode(self, topic: str, data: bytes) -> Any:
        from confluent_kafka.schema_registry import SchemaRegistryError
        from confluent_kafka.serialization import MessageField, SerializationContext

        if len(data) < WIRE_HEADER_BYTES or data[0] != WIRE_MAGIC:
            raise RecordError(
                "the value is not in the schema registry's wire format (a zero byte and a "
                "4-byte schema id first)",
                reason="source_undecodable",
            )
        schema_id = int.from_bytes(data[1:WIRE_HEADER_BYTES], "big")
        context = SerializationContext(topic, MessageField.VALUE)
        try:
            if schema_id in self._known:  # its schema is in the client's cache: no I/O
                return self.deserializer(data, context)
            # The first record of a schema id fetches the schema: I/O, off the event loop.
            value = await asyncio.to_thread(self.deserializer, data, context)
            self._known.add(schema_id)
            return value
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise RecordError(
                    f"schema id {schema_id} is unknown to the registry", reason="unknown_schema"
                ) from None
            if exc.http_status_code is not None and 400 <= exc.http_status_code < 500:
                raise RecordError(
                    f"the registry refused schema id {schema_id}: {exc}",
                    reason="registry_refused",
                ) from None
            raise RegistryUnavailable(f"schema registry: {exc}") from exc
        except RecordError:
            raise
        except (OSError, TimeoutError) as exc:
            raise RegistryUnavailable(f"schema registry: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # fastavro's and the deserializer's errors: bad bytes
            if _is_transport_error(exc):
                raise RegistryUnavailable(f"schema registry: {exc}") from exc
            raise RecordError(
                f"the value does not decode with schema {schema_id}: {type(exc).__name__}: "
                f"{str(exc)[:200]}",
                reason="source_undecodable",
            ) from None


def registry_conf(registry: RegistrySpec, *, timeout: float) -> dict[str, Any]:
    """confluent-kafka's registry client settings. The worker's retry policy retries an outage
    (TIDEGRAPH_STAGE_MAX_ATTEMPTS and its backoff), not the client on its own."""
    conf: dict[str, Any] = {"url": registry.url, "timeout": timeout, "max.retries": 0}
    if registry.username is not None:
        conf["basic.auth.user.info"] = f"{registry.username}:{registry.password or ''}"
    return conf


def _is_transport_error(exc: BaseException) -> bool:
    """An HTTP client's connection error (httpx, under confluent-kafka's client)."""
    return any(c.__name__ in ("ConnectError", "TransportError", "TimeoutException")
               for c in type(exc).__mro__)  # fmt: skip


# A declared mapping's extraction of an episode (``GroupRunner.map_now``): None when no rule
# matches it.
Mapper = Callable[[Episode], Awaitable[Outcome[Extraction] | None]]


class SourceHandler(RecordHandler):
    """The source stage: records of the declared source topics in; out, each one's extraction
    on ``{prefix}.extracted`` when ``mapper`` maps it, else its envelope on
    ``{prefix}.episodes`` (or its dead letter)."""

    stage = "source"

    def __init__(
        self,
        sources: SourceSet,
        names: TopicNames,
        worker: WorkerSettings,
        record_timeout: float,
        mapper: Mapper | None = None,
    ) -> None:
        super().__init__(names, worker, record_timeout)
        self.sources = sources
        self.mapper = mapper
        self.registry = {
            s.name: RegistryDecoder(s.registry, s.format)
            for s in sources.sources
            if s.registry is not None
        }
        self.json = JsonValues()

    def lane_of(self, topic: str, partition: int, key: bytes | None) -> Hashable:
        """A source partition's records run in one lane, in offset order: every change of a
        row (keyed by its primary key) and a table's truncate (no key) on that partition keep
        their source order, and a lane's job carries many records rather than one row's."""
        return (topic, partition)

    async def handle_group(self, records: Sequence[Consumed]) -> list[list[Emit]]:
        return [await self._one(record) for record in records]

    async def _one(self, record: Consumed) -> list[Emit]:
        spec, result = await self.convert(record)
        if record.timestamp_ms is not None:
            SOURCE_BEHIND.labels(spec.name).set(max(0.0, time.time() - record.timestamp_ms / 1000))
        if isinstance(result, Failure):
            return [self._dead(spec, record, result)]
        if isinstance(result, Skipped):
            SOURCE_SKIPPED.labels(spec.name, result.kind).inc()
            SOURCE_RECORDS.labels(spec.name, "skipped").inc()
            return []
        SOURCE_RECORDS.labels(spec.name, "episode").inc()
        if self.mapper is not None:
            mapped = await self.mapper(result)
            read = Taken(result, record.ref)
            if mapped is not None and mapped.failure is not None:  # a rule that cannot map it
                return [self.failed(record, mapped.failure, read)]
            if mapped is not None and mapped.value is not None:  # straight to the write hop
                return [self.extracted_hop(record, read, mapped.value)]
        return [Emit(self.names.episodes, encode_key(result.group_id), encode(result))]

    async def convert(self, record: Consumed) -> tuple[SourceSpec, Episode | Skipped | Failure]:
        """The record's source, and its episode, why it is skipped, or why it fails (a
        registry outage retried first, with the worker's retry policy)."""
        spec = self.sources.for_topic(record.topic)
        if spec is None:  # subscribed topics are the declared ones: a bug if it happens
            raise RuntimeError(f"topic {record.topic} is read by no declared source")
        attempts = 0
        while True:
            attempts += 1
            try:
                return spec, spec.episode(await self.decoded(spec, record))
            except RecordError as exc:
                return spec, Failure.of(self.stage, exc, exc.reason)
            except RegistryUnavailable as exc:
                if attempts >= self.policy.max_attempts:
                    return spec, Failure.of(self.stage, exc, "registry_unavailable", attempts)
                RETRIES.labels(self.stage, "registry_unavailable").inc()
                log.warning(
                    "stage=source source=%s registry unavailable (attempt %d of %d): %s",
                    spec.name, attempts, self.policy.max_attempts, exc,
                )  # fmt: skip
                await asyncio.sleep(self.policy.delay(attempts))

    async def decoded(self, spec: SourceSpec, record: Consumed) -> SourceRecord:
        return SourceRecord(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            timestamp_ms=record.timestamp_ms,
            key=_decode_key(record.key),
            value=await self._decode_value(spec, record),
            headers={
                name: value.decode(errors="replace")
                for name, value in record.headers
                if value is not None
            },
        )

    async def _decode_value(self, spec: SourceSpec, record: Consumed) -> Any:
        if record.value is None:
            return None
        if spec.format in ("avro", "jsonschema", "protobuf"):
            return await self.registry[spec.name].decode(record.topic, record.value)
        try:
            return self.json.decode(record.topic, record.value)
        except ValueError as exc:
            raise RecordError(
                f"the value is not JSON: {exc}", reason="source_undecodable"
            ) from None

    def _dead(self, spec: SourceSpec, record: Consumed, failure: Failure) -> Emit:
        SOURCE_RECORDS.labels(spec.name, "dead_lettered").inc()
        SOURCE_DEAD_LETTERS.labels(spec.name, failure.reason).inc()
        return self.dead(record, failure, raw=record.value)


def _decode_key(key: bytes | None) -> Any:
    """A record key as JSON when it is JSON (Debezium's, with or without schemas), else as
    text."""
    if key is None:
        return None
    try:
        return jsontext.loads(key)
    except ValueError:
        return key.decode(errors="replace")


@dataclass(frozen=True)
class DeclaredSources:
    """A validated sources file and the existing topics it reads (``source_topics``)."""

    sources: SourceSet
    topics: list[str]


def install_sources(
    app: Any,
    declared: DeclaredSources,
    handler: SourceHandler,
    run_agent: Callable[[RecordHandler], Callable[[Any], Awaitable[None]]],
) -> None:
    """The source agent on the declared topics (the app's ``stage_agent`` around
    ``handler``): one lane per source partition."""
    topic = app.topic(*declared.topics, key_serializer="raw", value_serializer="raw")
    app.agent(topic, name="tidegraph.source")(run_agent(handler))


async def resolve_sources(path: Path, kafka: KafkaConnection) -> DeclaredSources:
    """The sources file validated and its topics checked against the cluster's
    (``SourceFileError``: one line)."""
    sources = SourceSet.load(path)
    admin = admin_client(kafka)
    await admin.start()
    try:
        existing = await admin.list_topics()
    finally:
        await admin.close()
    for spec in sources.sources:
        if spec.registry is not None:
            await asyncio.to_thread(probe_registry, spec)
    return DeclaredSources(sources, source_topics(sources, existing))


def probe_registry(spec: SourceSpec) -> None:
    """``SourceFileError`` unless the source's registry answers (its subject list)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    assert spec.registry is not None
    try:
        SchemaRegistryClient(registry_conf(spec.registry, timeout=5)).get_subjects()
    except Exception as exc:
        raise SourceFileError(
            f"source {spec.name}: the schema registry at {spec.registry.url} does not answer "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
        ) from None


def source_topics(sources: SourceSet, existing: Sequence[str]) -> list[str]:
    """The existing topics the sources read; ``SourceFileError`` naming a declared topic that
    does not exist, or a pattern that matches none."""
    have = set(existing)
    wanted: list[str] = []
    for spec in sources.sources:
        if spec.pattern is not None:
            matched = sorted(t for t in have if re.fullmatch(spec.pattern, t))
            if not matched:
                raise SourceFileError(
                    f"source {spec.name}: pattern {spec.pattern!r} matches no topic"
                )
            wanted += matched
        for topic in spec.topics:
            if topic not in have:
                raise SourceFileError(f"source {spec.name}: topic {topic!r} does not exist")
            wanted.append(topic)
    return list(dict.fromkeys(wanted))
