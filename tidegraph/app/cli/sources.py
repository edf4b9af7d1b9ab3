"""``tidegraph sources check FILE``: a sources file validated, its topics and registries
reached, a sample of each source's records decoded and shown as the episodes, entities and
facts they would become (docs/sources.md). Writes nothing: no offsets, no graph.

Registration: imported at the bottom of ``tidegraph/app/cli/main.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from tidegraph.app.cli.main import app, console, err, get_settings

if TYPE_CHECKING:
    from tidegraph.pipelines.streaming.sources import DeclaredSources, SourceHandler
    from tidegraph.processors.mapping import MappingSet
    from tidegraph.settings import Settings

sources_app = typer.Typer(
    help="Declared sources: existing topics (Debezium, Avro, JSON) read beside the input topic.",
    rich_markup_mode=None,
)
app.add_typer(sources_app, name="sources")


@sources_app.command("check")
def check(
    path: Path = typer.Argument(..., help="The sources file (YAML)."),
    sample: int = typer.Option(5, "--sample", min=1, max=1000, help="Records per source."),
    mapping: Path | None = typer.Option(
        None, "--mapping", help="Mapping file (default: TIDEGRAPH_MAPPINGS)."
    ),
) -> None:
    """Validate FILE, reach its topics and registries, and show what the first records of
    each source would become. Exits 1 on a problem with the file or the cluster."""
    from tidegraph.connections import ConnectionSettingsError, KafkaConnection
    from tidegraph.pipelines.streaming.sources import resolve_sources
    from tidegraph.processors.mapping import MappingSet
    from tidegraph.processors.sources import SourceFileError

    settings = get_settings()
    mapping_path = mapping or settings.mappings
    try:
        mappings = MappingSet.load(mapping_path) if mapping_path else None
    except (OSError, ValueError) as exc:
        err.print(f"[red]error:[/red] {escape(' '.join(str(exc).split())[:500])}", soft_wrap=True)
        raise typer.Exit(1) from None
    try:
        kafka = KafkaConnection.from_settings(settings)
        declared = asyncio.run(resolve_sources(path, kafka))
    except (SourceFileError, ConnectionSettingsError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from None
    except Exception as exc:  # the cluster did not answer
        err.print(
            f"[red]error:[/red] Kafka at {settings.kafka_bootstrap_servers} "
            f"(TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS): {type(exc).__name__}: "
            f"{escape(str(exc) or 'no answer')}",
            soft_wrap=True,
        )
        raise typer.Exit(1) from None
    console.print(
        f"{path}: {len(declared.sources.sources)} sources, topics "
        f"{', '.join(declared.topics)}; reading up to {sample} records of each source "
        "(nothing is written)",
        soft_wrap=True,
        markup=False,
    )
    asyncio.run(_show_samples(settings, declared, sample, mappings))


async def _show_samples(
    settings: Settings, declared: DeclaredSources, sample: int, mappings: MappingSet | None
) -> None:
    from tidegraph.pipelines.streaming.config import WorkerSettings
    from tidegraph.pipelines.streaming.sources import SourceHandler
    from tidegraph.topics.names import TopicNames

    handler = SourceHandler(
        declared.sources, TopicNames(settings.topic_prefix), WorkerSettings(), 30.0
    )
    for spec in declared.sources.sources:
        topics = [t for t in declared.topics if spec.reads(t)]
        console.print(
            f"\n[bold]source {spec.name}[/bold] ({escape(', '.join(topics))})", soft_wrap=True
        )
        records = await _first_records(settings, topics, sample)
        if not records:
            console.print("  (no records yet)", soft_wrap=True)
        for record in records:
            await _show(handler, record, mappings)


async def _first_records(settings: Settings, topics: list[str], most: int) -> list[Any]:
    """The first ``most`` records of ``topics`` (no consumer group: nothing committed)."""
    from aiokafka import TopicPartition

    from tidegraph.connections import KafkaConnection
    from tidegraph.pipelines.streaming.handlers import Consumed
    from tidegraph.topics.admin import partitions_of
    from tidegraph.topics.client import dlq_consumer

    kafka = KafkaConnection.from_settings(settings)
    parts = [TopicPartition(t, p) for t in topics for p in await partitions_of(kafka, t)]
    out: list[Consumed] = []
    if not parts:
        return out
    consumer = dlq_consumer(settings)  # no group, no commits, from the beginning
    try:
        await consumer.start()  # inside: a failed start still closes the client
        consumer.assign(parts)
        ends = await consumer.end_offsets(parts)
        for tp in parts:
            await consumer.seek_to_beginning(tp)
        remaining = {tp for tp in parts if ends[tp] > 0}
        while remaining and len(out) < most:
            batch = await consumer.getmany(*parts, timeout_ms=2000, max_records=most - len(out))
            for messages in batch.values():
                out += [
                    Consumed(m.topic, m.partition, m.offset, m.timestamp, m.key, m.value,
                             tuple(m.headers or ()))
                    for m in messages
                ]  # fmt: skip
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
    finally:
        await consumer.stop()
    return out[:most]


async def _show(handler: SourceHandler, record: Any, mappings: MappingSet | None) -> None:
    from tidegraph.processors.sources import Skipped
    from tidegraph.records.errors import RecordError
    from tidegraph.records.outcome import Failure

    where = f"{record.topic}:{record.partition}:{record.offset}"
    _, result = await handler.convert(record)
    if isinstance(result, Failure):
        console.print(
            f"  {escape(where)}  [red]dead letter[/red] {result.reason}: "
            f"{escape(result.message[:300])}",
            soft_wrap=True,
        )
        return
    if isinstance(result, Skipped):
        console.print(f"  {where}  skipped ({result.kind})", soft_wrap=True, markup=False)
        return
    console.print(
        f"  {where}  episode {result.id!r} group {result.group_id!r} at "
        f"{result.reference_time.isoformat()}",
        soft_wrap=True,
        markup=False,
    )
    if mappings is None:
        console.print(
            "    no mapping file (TIDEGRAPH_MAPPINGS or --mapping): not extracted here",
            soft_wrap=True,
        )
        return
    try:
        extraction = mappings.extract(result)
    except RecordError as exc:
        console.print(
            f"    [red]dead letter[/red] {exc.reason}: {escape(str(exc)[:300])}", soft_wrap=True
        )
        return
    if extraction is None:
        console.print(
            "    no mapping rule matches (without an LLM: dead letter no_extractor)", soft_wrap=True
        )
        return
    names = [e.name for e in extraction.entities]
    entities = ", ".join(f"{e.name} [{', '.join(e.labels)}]" if e.labels else e.name
                         for e in extraction.entities)  # fmt: skip
    console.print(f"    entities: {entities or '(none)'}", soft_wrap=True, markup=False)
    for fact in extraction.facts:
        target = names[fact.object] if fact.object >= 0 else "(any)"
        verb = "closes" if fact.closes else "states"
        console.print(
            f"    {verb}: {names[fact.subject]} {fact.relation} {target}: {fact.fact}",
            soft_wrap=True,
            markup=False,
        )
    for close in extraction.table_closes:
        console.print(
            f"    closes: every open {close.relation} of the entities keyed "
            f"{close.key_prefix}... (a truncate)",
            soft_wrap=True,
            markup=False,
        )
    if not extraction.facts and not extraction.table_closes:
        console.print("    no fact changes", soft_wrap=True)
