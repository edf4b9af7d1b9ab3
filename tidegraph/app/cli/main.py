"""The ``tidegraph`` command."""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path

import orjson
import typer
from rich.console import Console
from rich.table import Table

from tidegraph.settings import Settings, get_settings

app = typer.Typer(
    help="tidegraph: event feeds -> bi-temporal knowledge graph (Kafka, Faust, Neo4j).",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err = Console(stderr=True)


def _setup_logging() -> None:
    logging.basicConfig(
        level=get_settings().log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


# ----------------------------------------------------------------------------- demo
@app.command()
def demo(
    data_dir: Path | None = typer.Option(
        None, help="Folder for the demo's embedded graph (default: a fresh temporary one)."
    ),
) -> None:
    """Run the main job on the embedded default (no Kafka, no Neo4j, no API key)."""
    from tidegraph.app.demo import run_demo

    asyncio.run(run_demo(data_dir=data_dir, console=console))


# ----------------------------------------------------------------------------- ingest
@app.command()
def ingest(
    path: Path = typer.Argument(..., exists=True, dir_okay=False, help="Episodes, JSON lines."),
    mapping: Path | None = typer.Option(
        None, "--mapping", exists=True, dir_okay=False, help="Declared-mapping file (YAML)."
    ),
    via: str = typer.Option("process", help="process (in this process) or kafka."),
    concurrency: int = typer.Option(8, help="Groups processed at once (in-process)."),
    failures_file: Path | None = typer.Option(
        None,
        "--failures",
        dir_okay=False,
        help="Write every failed record to this file, one JSON line each (line, stage, "
        "reason, group_id, episode_id, error, record).",
    ),
) -> None:
    """Process a file of episodes, in order per group, into the configured store. Records
    that fail are reported with their dead-letter reason and the rest go on."""
    settings = get_settings()
    if via == "kafka":
        from tidegraph.app.cli.kafka import ingest_via_kafka

        ingest_via_kafka(path, settings)
        return
    if via != "process":
        raise typer.BadParameter("--via must be 'process' or 'kafka'")
    _setup_logging()
    from tidegraph.pipelines.ingest import read_jsonl

    episodes, failures = read_jsonl(path.read_bytes().splitlines())
    report = asyncio.run(_ingest(episodes, mapping or settings.mappings, settings, concurrency))
    report.failures[:0] = failures
    _report_failures(report.failures, failures_file)
    console.print(report.line())
    if report.failures:
        raise typer.Exit(1)


SHOWN_FAILURES = 20


def _report_failures(failures: list, path: Path | None) -> None:
    """The first failures on stderr, a count per reason, and every one of them in ``path``."""
    from collections import Counter

    for failed in failures[:SHOWN_FAILURES]:
        where = f"line {failed.line}" if failed.line else (failed.episode_id or "")
        f = failed.failure
        err.print(
            f"[red]failed[/red] {where} at {f.stage} ({f.reason}): "
            f"{f.error_class}: {f.message[:300]}"
        )
    if not failures:
        return
    counts = Counter(f.failure.reason for f in failures)
    err.print("failures by reason: " + ", ".join(f"{r}: {n}" for r, n in counts.most_common()))
    if path is not None:
        with path.open("wb") as out:
            for failed in failures:
                out.write(orjson.dumps(failed.as_json()) + b"\n")
        err.print(f"all {len(failures)} failures written to {path}")
    elif len(failures) > SHOWN_FAILURES:
        err.print(
            f"{len(failures) - SHOWN_FAILURES} more failures not shown: "
            "run again with --failures FILE to get every one"
        )


async def _ingest(episodes, mapping: Path | None, settings: Settings, concurrency: int):
    from rich.progress import Progress

    from tidegraph.pipelines.ingest import ingest as run_ingest
    from tidegraph.pipelines.runtime import open_runtime

    runtime = await open_runtime(settings, mapping_path=mapping)
    try:
        with Progress(console=err, transient=True) as progress:
            task = progress.add_task("ingesting", total=len(episodes))
            report = await run_ingest(
                runtime.runner(),
                episodes,
                concurrency=concurrency,
                on_done=lambda _: progress.advance(task),
            )
    finally:
        await runtime.close()
    return report


# ----------------------------------------------------------------------------- queries
def _when(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    from tidegraph.processors.temporal import parse_when

    parsed = parse_when(value, datetime.now(UTC))
    if parsed is None:
        raise typer.BadParameter(f"{option}: cannot read {value!r} as a time (use ISO 8601)")
    return parsed


@app.command()
def facts(
    group: str = typer.Option(..., "--group", help="Group id (tenant)."),
    valid_at: str | None = typer.Option(None, "--valid-at", help="Valid at T (default: now)."),
    known_at: str | None = typer.Option(None, "--known-at", help="As believed at K."),
    history: bool = typer.Option(False, "--history", help="Every fact, valid or not."),
    as_json: bool = typer.Option(False, "--json", help="JSON lines."),
) -> None:
    """Facts valid at T as believed at K (docs/architecture.md "Two timelines")."""
    views = asyncio.run(
        _query_facts(group, _when(valid_at, "--valid-at"), _when(known_at, "--known-at"), history)
    )
    if as_json:
        for view in views:
            sys.stdout.write(orjson.dumps(view.model_dump()).decode() + "\n")
        return
    table = Table("subject", "relation", "object", "valid", "invalid", "fact")
    for v in views:
        table.add_row(v.subject, v.relation, v.object, v.valid_at or "", v.invalid_at or "", v.fact)
    console.print(table)


async def _query_facts(group: str, valid_at, known_at, history: bool):
    from tidegraph.stores import open_store

    store = open_store(get_settings())
    try:
        return await store.query_facts(
            group, valid_at=valid_at, known_at=known_at, include_invalid=history
        )
    finally:
        await store.close()


@app.command()
def entities(
    group: str = typer.Option(..., "--group", help="Group id (tenant)."),
    as_json: bool = typer.Option(False, "--json", help="JSON lines."),
) -> None:
    """The group's entities."""
    records = asyncio.run(_list_entities(group))
    rows = [
        {"uuid": r.uuid, "name": r.name, "labels": r.labels, "summary": r.summary, "key": r.key}
        for r in records
    ]
    if as_json:
        for row in rows:
            sys.stdout.write(orjson.dumps(row).decode() + "\n")
        return
    table = Table("name", "labels", "key", "summary")
    for row in rows:
        table.add_row(row["name"], ", ".join(row["labels"]), row["key"] or "", row["summary"])
    console.print(table)


async def _list_entities(group: str):
    from tidegraph.stores import open_store

    store = open_store(get_settings())
    try:
        return await store.list_entities(group)
    finally:
        await store.close()


from tidegraph.app.cli.communities import communities_app  # noqa: E402

app.add_typer(communities_app, name="communities")

# Kafka commands (worker, produce, dlq) live in their own module.
from tidegraph.app.cli import kafka as _cli_kafka  # noqa: E402,F401  (registers commands on `app`)
from tidegraph.app.cli import search as _cli_memory  # noqa: E402,F401  (search, extract)
from tidegraph.app.cli import serve as _cli_serve  # noqa: E402,F401  (serve, mcp)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
