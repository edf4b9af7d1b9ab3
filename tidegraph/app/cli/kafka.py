"""Kafka commands of the ``tidegraph`` CLI: worker, produce, dlq list/replay, ingest --via kafka.

Registration: ``tidegraph/app/cli/main.py`` imports this module at its bottom, after ``app`` exists;
importing it registers the commands on that ``app`` (module-level ``from tidegraph.app.cli.main
import app``, which also works when this module is imported first). Heavy imports (Faust, aiokafka,
the pipelines) happen inside the commands.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tidegraph.app.cli.main import _when, app, console, err, get_settings, json_line
from tidegraph.settings import Settings

if TYPE_CHECKING:
    from tidegraph.topics.client import ProduceReport

dlq_app = typer.Typer(
    help="Dead letters: records the pipeline gave up on, and their replay.",
    rich_markup_mode=None,
)
app.add_typer(dlq_app, name="dlq")


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )


# ----------------------------------------------------------------------------- worker
@app.command()
def worker(
    consumer_group: str | None = typer.Option(
        None,
        "--consumer-group",
        help="Kafka consumer group (default '<prefix>.pipeline'); workers of one group share "
        "the partitions. A new group re-reads every topic from the beginning.",
    ),
) -> None:
    """Run a streaming worker (Faust): every stage agent, /metrics on TIDEGRAPH_METRICS_PORT.

    Start several (on one machine or many) to share the partitions. Mapped JSON feeds need
    TIDEGRAPH_MAPPINGS; free text needs TIDEGRAPH_LLM_BASE_URL. Stops gracefully on SIGTERM
    or Ctrl-C: records already taken are finished and committed first.
    """
    from tidegraph.pipelines.streaming.config import WorkerSettings
    from tidegraph.pipelines.streaming.worker import StartupError, run_worker

    settings = get_settings()
    worker_settings = WorkerSettings()
    if consumer_group:
        worker_settings = worker_settings.model_copy(update={"consumer_group": consumer_group})
    try:
        run_worker(settings, worker_settings)
    except StartupError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(exc.exit_code) from exc


# ----------------------------------------------------------------------------- produce
def _read_lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.strip()]


def _produce(
    path: Path, settings: Settings, skip_invalid: bool, rate: float | None = None
) -> ProduceReport:
    from tidegraph.topics.client import produce_lines

    lines = _read_lines(path)
    with _progress() as progress:
        task = progress.add_task("producing", total=len(lines))
        report = asyncio.run(
            produce_lines(
                settings,
                lines,
                skip_invalid=skip_invalid,
                rate=rate,
                on_delivered=lambda: progress.advance(task),
            )
        )
    invalid = report.invalid
    console.print(
        f"{len(report.sent)} records delivered to {report.topic} (acks=all) in "
        f"{report.seconds:.1f}s"
        + (f"; {len(invalid)} of them are not valid episodes" if invalid else "")
        + (f"; {report.skipped_invalid} invalid lines skipped" if report.skipped_invalid else "")
    )
    for item in invalid[:10]:
        err.print(f"[yellow]line {item.line}[/yellow]: {item.problem} (will be dead-lettered)")
    for line, reason in report.refused[:10]:
        err.print(f"[red]line {line} refused by Kafka[/red]: {reason}")
    return report


@app.command()
def produce(
    path: Path = typer.Argument(..., exists=True, dir_okay=False, help="Episodes, JSON lines."),
    skip_invalid: bool = typer.Option(
        False,
        "--skip-invalid",
        help="Do not send lines that are not valid episodes (default: send them; the pipeline "
        "dead-letters them with the reason, as it would for any producer).",
    ),
    rate: float | None = typer.Option(
        None, "--rate", min=0.001, help="At most this many records per second (default: no limit)."
    ),
) -> None:
    """Send episodes to the input topic (key = group_id) and wait for Kafka's acknowledgement."""
    report = _produce(path, get_settings(), skip_invalid, rate)
    if report.refused:
        raise typer.Exit(1)


def ingest_via_kafka(path: Path, settings: Settings) -> None:
    """Produce the file to the input topic and wait until the graph reflects all of it: every
    valid episode's processed marker exists, or a dead letter names its record."""
    from tidegraph.topics.client import StalledError, dlq_end_offsets, ensure_all_topics
    from tidegraph.topics.client import wait_until_reflected as wait

    asyncio.run(ensure_all_topics(settings))
    dlq_from = asyncio.run(dlq_end_offsets(settings))
    report = _produce(path, settings, skip_invalid=False)
    with _progress() as progress:
        task = progress.add_task("waiting for the graph", total=len(report.sent))
        try:
            result = asyncio.run(
                wait(
                    settings,
                    report,
                    dlq_from=dlq_from,
                    on_progress=lambda n: progress.advance(task, n),
                )
            )
        except StalledError as exc:
            err.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from exc
    reasons = Counter(f"{d.stage}/{d.reason}" for d in result.dead)
    console.print(
        f"{result.processed} episodes in the graph, {len(result.dead)} dead-lettered"
        + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(reasons.items()))})" if reasons else "")
        + f", {result.seconds:.1f}s after the last delivery"
    )
    if result.dead or report.refused:
        err.print("see `tidegraph dlq list` for the reasons")
        raise typer.Exit(1)


# ----------------------------------------------------------------------------- dlq
def _since(value: str | None) -> datetime | None:
    return _when(value, "--since")


@dlq_app.command("list")
def dlq_list(
    stage: str | None = typer.Option(None, "--stage", help="Only this stage's dead letters."),
    since: str | None = typer.Option(None, "--since", help="Failed at or after (ISO 8601)."),
    group: list[str] | None = typer.Option(
        None, "--group", help="Only dead letters of this group id (repeat for several)."
    ),
    as_json: bool = typer.Option(False, "--json", help="One dead letter per line, as stored."),
) -> None:
    """Show the dead letters: when, stage, reason, group, episode, attempts, error. A record
    of the topic that is no readable dead letter is shown as such (``--json``: a line with
    ``unreadable``), after the others."""
    from tidegraph.topics.client import read_dlq

    found = asyncio.run(read_dlq(get_settings(), stage=stage, since=_since(since), groups=group))
    if as_json:
        for stored in found.letters:
            row = stored.letter.model_dump(mode="json")
            row["dlq_partition"], row["dlq_offset"] = stored.at.partition, stored.at.offset
            json_line(row)
        for odd in found.unreadable:
            json_line(
                {"unreadable": odd.problem, "dlq_partition": odd.at.partition,
                 "dlq_offset": odd.at.offset}
            )  # fmt: skip
        return
    table = Table("failed at", "stage", "reason", "group", "episode", "tries", "error")
    for stored in found.letters:
        d = stored.letter
        table.add_row(
            d.failed_at.strftime("%Y-%m-%d %H:%M:%S"),
            d.stage,
            d.reason,
            d.group_id or "-",
            d.episode_id or (f"{d.origin.partition}:{d.origin.offset}" if d.origin else "-"),
            str(d.attempts),
            f"{d.error_class}: {d.message[:160]}",
        )
    for odd in found.unreadable:
        where = f"dlq {odd.at.partition}:{odd.at.offset}"
        table.add_row("-", "-", "unreadable", "-", where, "-", odd.problem[:160])
    console.print(table)
    unreadable = f" and {len(found.unreadable)} unreadable records" if found.unreadable else ""
    console.print(f"{len(found.letters)} dead letters{unreadable}")


@dlq_app.command("replay")
def dlq_replay(
    stage: str | None = typer.Option(None, "--stage", help="Only this stage's dead letters."),
    since: str | None = typer.Option(None, "--since", help="Failed at or after (ISO 8601)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count, do not send."),
) -> None:
    """Send the original records of dead letters back to the input topic, after fixing the
    cause (mapping, LLM settings...). Processed episodes are skipped, so replays are safe.
    Bad data (invalid JSON...) needs fixing by hand: `dlq list --json`, edit, `produce`."""
    from tidegraph.topics.client import replay_dead_letters

    report = asyncio.run(
        replay_dead_letters(get_settings(), stage=stage, since=_since(since), dry_run=dry_run)
    )
    verb = "would replay" if dry_run else "replayed"
    console.print(
        f"{verb} {report.replayed} records"
        + (f" ({report.duplicates} repeated dead letters merged)" if report.duplicates else "")
    )
    for stored, why in report.not_replayable[:10]:
        err.print(
            f"[yellow]not replayed[/yellow] dlq {stored.at.partition}:{stored.at.offset}: {why}"
        )
    for odd in report.unreadable[:10]:
        err.print(
            f"[yellow]not replayed[/yellow] dlq {odd.at.partition}:{odd.at.offset}: no dead "
            f"letter this version reads ({odd.problem})"
        )
