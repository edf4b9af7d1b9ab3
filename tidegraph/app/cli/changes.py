"""``tidegraph changes``: a group's change stream (docs/streaming.md "Change stream").

    tidegraph changes --group G [--after N] [--limit N] [--follow] [--via kafka] [--json]

One short line per change in commit order (``--json``: its envelope, as in
``tidegraph/records/changes.py``), then the cursor: the last change's ``seq``, to give back as
``--after N`` (``--json``: ``{"cursor": N}``). ``--follow`` keeps waiting for new changes
until Ctrl-C (then prints the cursor line and exits 0). The
changes are read from the store's outbox (``Memory.changes``, opened read-only), or with
``--via kafka`` from the ``{prefix}.changes`` topic (``stream_changes``), where a change the
relay published again after a restart is printed once.

Importing this module registers ``changes`` on ``tidegraph.app.cli.main.app``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from tidegraph.app.browse import MAX_PAGE
from tidegraph.app.cli.main import (
    app,
    data_dir_option,
    get_settings,
    group_option,
    interval,
    json_line,
    open_reading,
    use_data_dir,
)

if TYPE_CHECKING:
    from tidegraph.records.changes import Change

FOLLOW_WAIT_SECONDS = 30.0  # one long poll of the outbox; --follow asks again at once
MAX_CURSOR = 2**63 - 1  # a seq is a 64-bit integer in both stores


@dataclass
class Position:
    """Where the stream is: the last seq printed (or ``--after``), and how many were."""

    cursor: int
    printed: int = 0


@app.command()
def changes(
    group: str = group_option(),
    after: int = typer.Option(
        0,
        "--after",
        min=0,
        max=MAX_CURSOR,
        help="Only changes after this cursor (a change's seq; 0: from the first).",
    ),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="Stop after this many changes (default: every one)."
    ),
    follow: bool = typer.Option(
        False, "--follow", help="Keep waiting for new changes, until Ctrl-C."
    ),
    via: str = typer.Option(
        "store",
        "--via",
        help="store (the store's outbox, read-only) or kafka (the {prefix}.changes topic).",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="One JSON line per change (its envelope), then the cursor's."
    ),
    data_dir: Path | None = data_dir_option(),
) -> None:
    """The group's changes in commit order: facts created, invalidated, expired, reopened,
    entities created, merged, changed, and what was forgotten; then the cursor to resume
    from (docs/streaming.md "Change stream")."""
    use_data_dir(data_dir)
    if via not in ("store", "kafka"):
        raise typer.BadParameter(f"'store' or 'kafka', not {via[:80]!r}", param_hint="--via")
    position = Position(after)

    def emit(change: Change) -> None:
        if as_json:
            json_line(change.model_dump(mode="json"), flush=True)
        else:
            sys.stdout.write(brief(change) + "\n")
            sys.stdout.flush()
        position.cursor = change.seq
        position.printed += 1

    read = _from_topic if via == "kafka" else _from_store
    try:
        asyncio.run(read(group, position, limit, follow, emit))
    except KeyboardInterrupt:
        if not follow:
            raise
    if as_json:
        json_line({"cursor": position.cursor})
    else:
        sys.stdout.write(f"cursor {position.cursor}: resume with --after {position.cursor}\n")


async def _from_store(
    group: str,
    position: Position,
    limit: int | None,
    follow: bool,
    emit: Callable[[Change], None],
) -> None:
    async with await open_reading() as memory:
        while True:
            room = MAX_PAGE if limit is None else min(MAX_PAGE, limit - position.printed)
            page = await memory.changes(
                group,
                after=position.cursor,
                limit=room,
                wait_seconds=FOLLOW_WAIT_SECONDS if follow else 0.0,
            )
            for change in page.changes:
                emit(change)
            if limit is not None and position.printed >= limit:
                return
            if not follow and len(page.changes) < room:
                return


async def _from_topic(
    group: str,
    position: Position,
    limit: int | None,
    follow: bool,
    emit: Callable[[Change], None],
) -> None:
    from tidegraph.topics.client import stream_changes

    stream = cast(
        "AsyncGenerator[Change, None]", stream_changes(get_settings(), [group], follow=follow)
    )
    async with aclosing(stream):  # stops the consumer at once, on Ctrl-C too
        async for change in stream:
            if change.seq <= position.cursor:
                continue  # before --after, or published again after a restart
            emit(change)
            if limit is not None and position.printed >= limit:
                return


def brief(change: Change) -> str:
    """One short line for a person: seq, kind, what changed, its valid range, the cause."""
    state = change.after or change.before or {}
    label = " ".join(str(state.get("fact") or state.get("name") or change.uuid).split())
    line = f"#{change.seq} {change.kind} {label}"
    if change.kind.startswith("fact.") and change.after:
        line += f" [{interval(change.after.get('valid_at'), change.after.get('invalid_at'))}]"
    if change.episode_id:
        line += f" (episode {change.episode_id})"
    return line
