"""The ``tidegraph`` command. ``main`` is its entry point: a failure it cannot go on from is one
line on stderr (``tidegraph.app.cli.errors``), never a traceback."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TextIO

import orjson
import typer
from rich.console import Console
from rich.table import Table

from tidegraph.connections import quiet_neo4j_driver_logs
from tidegraph.records import jsontext
from tidegraph.settings import Settings
from tidegraph.settings import get_settings as _environment_settings

app = typer.Typer(
    help="tidegraph: event feeds -> bi-temporal knowledge graph (Kafka, Faust, Neo4j).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain help: no "<bool>" after flags, docstrings rewrapped
)
console = Console()
err = Console(stderr=True)

# The data folder a command was given (--data-dir), over TIDEGRAPH_DATA_DIR.
_data_dir: Path | None = None


def get_settings() -> Settings:
    """The environment's settings, with the command's ``--data-dir`` when it has one."""
    settings = _environment_settings()
    if _data_dir is not None:
        return settings.model_copy(update={"data_dir": _data_dir})
    return settings


def group_id(value: str | None) -> str | None:
    """``--group`` as every way in takes a group id (``GroupId``: kept exactly as written, so
    padding, control characters or a lone surrogate are refused, never trimmed)."""
    if value is None:
        return None
    from pydantic import TypeAdapter, ValidationError

    from tidegraph.records.episode import GroupId

    try:
        return str(TypeAdapter(GroupId).validate_python(value))
    except ValidationError as exc:
        raise typer.BadParameter(first_problem(exc), param_hint="--group") from None


def group_ids(values: list[str]) -> list[str]:
    """A repeated ``--group``, each as ``group_id`` takes it."""
    return [str(group_id(v)) for v in values]


def first_problem(exc: Any) -> str:
    """The first problem of a pydantic ``ValidationError``, as one line."""
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def group_option() -> Any:
    return typer.Option(..., "--group", callback=group_id, help="Group id (tenant).")


def json_option() -> Any:
    return typer.Option(False, "--json", help="JSON lines.")


def data_dir_option() -> Any:
    return typer.Option(
        None,
        "--data-dir",
        file_okay=False,
        help="Folder of the embedded store (default: TIDEGRAPH_DATA_DIR, else .tidegraph).",
    )


def use_data_dir(folder: Path | None) -> None:
    global _data_dir
    _data_dir = folder


def _version(show: bool) -> None:
    if show:
        try:
            typer.echo(f"tidegraph {version('tidegraph')}")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree
            typer.echo("tidegraph (not installed)")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """tidegraph: event feeds -> bi-temporal knowledge graph (Kafka, Faust, Neo4j)."""


def main() -> None:
    """The console entry point: the command, and one line instead of a traceback."""
    for name in ("aiokafka", "neo4j"):  # unconfigured, their errors would print as they occur
        logging.getLogger(name).addHandler(logging.NullHandler())
    try:
        sys.exit(app(standalone_mode=False) or 0)  # an int: the code a command exited with
    except typer.Abort:  # Ctrl-D or Ctrl-C at a prompt
        err.print("aborted: nothing was done")
        sys.exit(1)
    except typer.TyperException as exc:  # a refused command line (click's UsageError ...)
        if type(exc).__name__ == "NoArgsIsHelpError":  # `tidegraph` alone: its help
            typer.echo(exc.format_message(), err=True)
        else:
            sys.stderr.write(f"error: {usage_line(exc)}\n")
        sys.exit(getattr(exc, "exit_code", 2))
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except BrokenPipeError:  # the reader went away (`... | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except Exception as exc:
        from tidegraph.app.cli.errors import explain

        settings = get_settings()
        if settings.log_level.upper() == "DEBUG":
            traceback.print_exc()
        sys.stderr.write(f"error: {explain(exc, settings)}\n")  # one line, never wrapped
        sys.exit(1)


def usage_line(exc: typer.TyperException) -> str:
    """A refused command line as one line, with where to read how it is given."""
    text = " ".join(exc.format_message().split())
    command = getattr(getattr(exc, "ctx", None), "command_path", None)
    return f"{text} (see `{command} --help`)" if command else text


def _setup_logging(stream: TextIO | None = None) -> None:
    logging.basicConfig(
        level=get_settings().log_level.upper(),
        stream=stream,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    quiet_neo4j_driver_logs()  # as the worker


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

    from tidegraph.pipelines.collector import settle_collector
    from tidegraph.pipelines.ingest import ingest as run_ingest
    from tidegraph.pipelines.runtime import open_runtime

    runtime = await open_runtime(settings, mapping_path=mapping)
    settle_collector()  # the episodes read and the runtime are held to the end
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
    from tidegraph.processors.temporal import read_when
    from tidegraph.records.errors import BadTime

    try:
        parsed = read_when(value, datetime.now(UTC))
    except BadTime as exc:
        raise typer.BadParameter(f"{option}: {exc} (use ISO 8601)") from None
    if parsed is None:
        raise typer.BadParameter(f"{option}: cannot read {value!r} as a time (use ISO 8601)")
    return parsed


async def open_reading() -> Any:
    """The configured memory, read-only: no LLM client, no mapping, nothing created."""
    from tidegraph.app.memory import Memory

    return await Memory.open(get_settings(), read_only=True)


async def open_writing(via: str = "process") -> Any:
    """The configured memory with its write side, over a store that exists: like
    ``open_reading``, a store nothing was added to is ``NoStore`` (one line), never created."""
    from tidegraph.app.memory import Memory, open_reader
    from tidegraph.pipelines.runtime import open_runtime

    settings = get_settings()
    reader = await open_reader(settings)
    if reader.cross_encoder is not None:  # the runtime opens its own
        await reader.cross_encoder.close()
    try:
        runtime = await open_runtime(settings, store=reader.store, embedder=reader.embedder)
    except BaseException:
        await reader.embedder.close()
        await reader.store.close()
        raise
    return Memory(runtime, via="kafka" if via == "kafka" else "process")


def json_line(row: Any, *, flush: bool = False) -> None:
    """One JSON line on stdout (``flush``: now, for a reader waiting on a pipe); integers
    over 64 bits (a record's content may hold one) written exactly."""
    sys.stdout.write(jsontext.dumps(row).decode() + "\n")
    if flush:
        sys.stdout.flush()


def when_text(value: str | None) -> str:
    """A stored time as a table shows it: the day, and the minute when it is not midnight."""
    if not value:
        return ""
    at = datetime.fromisoformat(value).astimezone(UTC)
    return at.strftime("%Y-%m-%d" if at.time() == datetime.min.time() else "%Y-%m-%d %H:%MZ")


def interval(valid_at: str | None, invalid_at: str | None) -> str:
    return f"{when_text(valid_at)} – {when_text(invalid_at) or 'now'}"


@app.command()
def facts(
    group: str = group_option(),
    valid_at: str | None = typer.Option(None, "--valid-at", help="Valid at T (default: now)."),
    known_at: str | None = typer.Option(None, "--known-at", help="As believed at K."),
    history: bool = typer.Option(False, "--history", help="Every fact, valid or not."),
    as_json: bool = json_option(),
    data_dir: Path | None = data_dir_option(),
) -> None:
    """Facts valid at T as believed at K (docs/architecture.md "Two timelines")."""
    use_data_dir(data_dir)
    valid, known = _when(valid_at, "--valid-at"), _when(known_at, "--known-at")

    async def read() -> Any:
        async with await open_reading() as memory:
            return await memory.facts(
                group, valid_at=valid, known_at=known, include_invalid=history
            )

    views = asyncio.run(read())
    if as_json:
        for view in views:
            sys.stdout.write(orjson.dumps(view.model_dump()).decode() + "\n")
        return
    table = Table("subject", "relation", "object", "valid", "fact")
    table.columns[3].no_wrap = True
    for v in views:
        table.add_row(v.subject, v.relation, v.object, interval(v.valid_at, v.invalid_at), v.fact)
    console.print(table)


@app.command()
def entities(
    group: str = group_option(),
    as_json: bool = json_option(),
    data_dir: Path | None = data_dir_option(),
) -> None:
    """The group's entities."""
    use_data_dir(data_dir)

    async def read() -> Any:
        async with await open_reading() as memory:
            return await memory.entities(group)

    rows = [
        {"uuid": r.uuid, "name": r.name, "labels": r.labels, "summary": r.summary, "key": r.key}
        for r in asyncio.run(read())
    ]
    if as_json:
        for row in rows:
            sys.stdout.write(orjson.dumps(row).decode() + "\n")
        return
    table = Table("name", "labels", "key", "summary")
    for row in rows:
        table.add_row(row["name"], ", ".join(row["labels"]), row["key"] or "", row["summary"])
    console.print(table)


# The other commands live in their own modules; importing one registers its commands on `app`.
from tidegraph.app.cli import changes as _cli_changes  # noqa: E402,F401
from tidegraph.app.cli import communities as _cli_communities  # noqa: E402,F401
from tidegraph.app.cli import episodes as _cli_episodes  # noqa: E402,F401  (episodes, groups)
from tidegraph.app.cli import forget as _cli_forget  # noqa: E402,F401

# Kafka commands (worker, produce, dlq) live in their own module.
from tidegraph.app.cli import kafka as _cli_kafka  # noqa: E402,F401  (registers commands on `app`)
from tidegraph.app.cli import keys as _cli_keys  # noqa: E402,F401  (rotate-key)
from tidegraph.app.cli import search as _cli_memory  # noqa: E402,F401  (search, extract)
from tidegraph.app.cli import serve as _cli_serve  # noqa: E402,F401  (serve, mcp)
from tidegraph.app.cli import sources as _cli_sources  # noqa: E402,F401  (sources check)

if __name__ == "__main__":  # pragma: no cover
    main()
