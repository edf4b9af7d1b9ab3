"""``tidegraph episodes`` and ``tidegraph groups``: browse what the memory holds
(docs/retrieval.md "Browse, forget, follow").

    tidegraph episodes --group G [--since T] [--until T] [--status S] [--limit N]
                       [--cursor C | --all-pages] [--content] [--json]
    tidegraph episodes --group G --show ID [--json]
    tidegraph groups [--group G ...] [--json]

A listing is a page at a time, by event time; a table ends with the command for the next page,
and ``--json`` prints one line per episode, then ``{"next_cursor": C}`` (null on the last
page). Everything is read from the store as it is (``open_reading``); dead letters from the
Kafka dead-letter topic.

Importing this module registers ``episodes`` and ``groups`` on ``tidegraph.app.cli.main.app``.
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table
from rich.text import Text

from tidegraph.app.browse import EPISODE_STATUSES, MAX_PAGE, BadCursor, read_episode_cursor
from tidegraph.app.cli.main import (
    _when,
    app,
    console,
    data_dir_option,
    err,
    group_ids,
    group_option,
    interval,
    json_line,
    json_option,
    open_reading,
    use_data_dir,
    when_text,
)
from tidegraph.records.ids import id_problem

if TYPE_CHECKING:
    from tidegraph.app.browse import EpisodeDetailView, EpisodePage, EpisodeView

DEFAULT_PAGE = 50


@app.command()
def episodes(
    group: str = group_option(),
    since: str | None = typer.Option(
        None, "--since", help="At or after T (event time; a tombstone: when it was forgotten)."
    ),
    until: str | None = typer.Option(None, "--until", help="Before T."),
    status: str | None = typer.Option(
        None,
        "--status",
        help="written, not_extracted, forgotten, or dead_lettered (read from the Kafka "
        "dead-letter topic); default: written and not_extracted.",
    ),
    limit: int = typer.Option(DEFAULT_PAGE, "--limit", min=1, max=MAX_PAGE, help="Per page."),
    cursor: str | None = typer.Option(
        None, "--cursor", help="The next page: the cursor the previous page printed."
    ),
    all_pages: bool = typer.Option(False, "--all-pages", help="Every page, one after another."),
    content: bool = typer.Option(False, "--content", help="With each episode's content."),
    show: str | None = typer.Option(
        None,
        "--show",
        metavar="ID",
        help="One episode (its id or uuid): its content, the entities it mentions and the "
        "facts it supports.",
    ),
    as_json: bool = json_option(),
    data_dir: Path | None = data_dir_option(),
) -> None:
    """The group's episodes, a page at a time by event time, or one of them (--show)."""
    use_data_dir(data_dir)
    if show is not None:
        listing = {"--since": since, "--until": until, "--status": status, "--cursor": cursor}
        given = [name for name, value in listing.items() if value is not None]
        given += ["--all-pages"] * all_pages + ["--content"] * content
        _show(group, show, given, as_json)
        return
    _check_listing(group, status, cursor)
    asked = {
        "since": _when(since, "--since"),
        "until": _when(until, "--until"),
        "status": status,
        "limit": limit,
        "content": content,
    }
    rows: list[EpisodeView] = []

    def take(page: EpisodePage) -> None:
        if as_json:
            for view in page.episodes:
                json_line(view.as_json(), flush=True)
        else:
            rows.extend(page.episodes)

    last = asyncio.run(_pages(group, asked, cursor, all_pages, take))
    if as_json:
        json_line({"next_cursor": last.next_cursor})
        return
    _table(rows)
    again = ["tidegraph", "episodes", "--group", group]
    for option, value in (("--since", since), ("--until", until), ("--status", status)):
        if value is not None:
            again += [option, value]
    if limit != DEFAULT_PAGE:
        again += ["--limit", str(limit)]
    _footer(len(rows), last, again)


def _check_listing(group: str, status: str | None, cursor: str | None) -> None:
    """A status or cursor this listing cannot take, refused before anything is opened."""
    if status is not None and status not in EPISODE_STATUSES:
        raise typer.BadParameter(
            f"one of {', '.join(EPISODE_STATUSES)}, not {status[:80]!r}", param_hint="--status"
        )
    if cursor is not None:
        try:
            read_episode_cursor(cursor, group)
        except BadCursor as exc:
            raise typer.BadParameter(
                str(exc).removeprefix("cursor: "), param_hint="--cursor"
            ) from None


def _footer(shown: int, last: EpisodePage, again: list[str]) -> None:
    """Below the table: how many, and the command for the next page when there is one."""
    counted = f"{shown} episode{'' if shown == 1 else 's'}"
    if last.source != "store":
        counted += f" (from {last.source})"
    if last.next_cursor is None:
        console.print(counted, highlight=False, markup=False)
        return
    console.print(
        f"{counted}; next page: {shlex.join([*again, '--cursor', last.next_cursor])}",
        highlight=False,
        markup=False,
        soft_wrap=True,  # the command stays one line, to copy whole
    )


async def _pages(
    group: str, asked: dict[str, Any], cursor: str | None, all_pages: bool, take: Any
) -> EpisodePage:
    """The page at ``cursor`` (with ``all_pages``, it and every page after it), each handed
    to ``take`` as it comes; the last one read."""
    async with await open_reading() as memory:
        while True:
            page: EpisodePage = await memory.episodes(group, cursor=cursor, **asked)
            take(page)
            if not all_pages or page.next_cursor is None:
                return page
            cursor = page.next_cursor


def _table(rows: list[EpisodeView]) -> None:
    with_content = any(v.content for v in rows)
    columns = ["episode", "status", "when", "name / source", "note"]
    table = Table(*columns, *(["content"] if with_content else []))
    table.columns[2].no_wrap = True
    for v in rows:
        when = v.forgotten_at if v.status == "forgotten" else v.reference_time or v.created_at
        note = v.not_extracted or ""
        if v.status == "dead_lettered":
            note = f"{v.stage}/{v.reason}: {v.message or ''}"[:200]
        cells = [
            v.episode_id or v.uuid,  # a tombstone keeps only its uuid
            v.status,
            when_text(when),
            " / ".join(part for part in (v.name, v.source) if part),
            note,
        ]
        if with_content:
            cells.append((v.content or "")[:200])
        table.add_row(*(Text(cell) for cell in cells))
    console.print(table)


def _show(group: str, ident: str, given: list[str], as_json: bool) -> None:
    if given:
        raise typer.BadParameter(
            f"--show shows one episode: leave out {', '.join(given)}", param_hint="--show"
        )
    problem = id_problem(ident)
    if problem is not None:
        raise typer.BadParameter(f"episode id {ident[:80]!r} {problem}", param_hint="--show")

    async def read() -> EpisodeDetailView | None:
        async with await open_reading() as memory:
            return await memory.episode(group, ident)

    detail = asyncio.run(read())
    if detail is None:
        err.print(
            f"error: group {group!r} has no episode {ident[:80]!r} (`tidegraph episodes "
            f"--group {shlex.quote(group)}` lists them)",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)
    if as_json:
        json_line(detail.as_json())
        return
    shown = detail.as_json()
    fields = Table.grid(padding=(0, 2))
    for label, key in (
        ("episode", "episode_id"),
        ("uuid", "uuid"),
        ("status", "status"),
        ("reference time", "reference_time"),
        ("stored at", "created_at"),
        ("forgotten at", "forgotten_at"),
        ("name", "name"),
        ("source", "source"),
        ("not extracted", "not_extracted"),
    ):
        if shown.get(key):
            fields.add_row(label, Text(str(shown[key])))
    console.print(fields)
    if detail.episode.content:
        console.print("\ncontent:")
        console.print(Text(detail.episode.content), soft_wrap=True)
    console.print(f"\nentities it mentions ({len(detail.entities)}):")
    if detail.entities:
        entities = Table("name", "labels", "key", "uuid")
        for e in detail.entities:
            entities.add_row(Text(e.name), Text(", ".join(e.labels)), Text(e.key or ""), e.uuid)
        console.print(entities)
    console.print(f"\nfacts it supports ({len(detail.facts)}):")
    if detail.facts:
        facts = Table("fact", "relation", "valid", "known", "episodes")
        facts.columns[2].no_wrap = True
        for f in shown["facts"]:
            facts.add_row(
                Text(f["fact"]),
                Text(f["relation"]),
                interval(f["valid_at"], f["invalid_at"]),
                interval(f["created_at"], f["expired_at"]),
                str(f["supported_by"]),
            )
        console.print(facts)


# ----------------------------------------------------------------------------- groups
@app.command()
def groups(
    group: list[str] = typer.Option(
        [], "--group", help="Only these groups (repeat; default: every group of the store)."
    ),
    as_json: bool = json_option(),
    data_dir: Path | None = data_dir_option(),
) -> None:
    """The groups (tenants) of the store, with their episodes, entities and facts and the
    change stream's last cursor."""
    use_data_dir(data_dir)
    wanted = group_ids(group) if group else None

    async def read() -> list[Any]:
        async with await open_reading() as memory:
            return list(await memory.groups(wanted))

    views = asyncio.run(read())
    if as_json:
        for view in views:
            json_line(view.as_json())
        return
    table = Table("group", "episodes", "entities", "facts", "changes")
    for v in views:
        table.add_row(
            Text(v.group_id), str(v.episodes), str(v.entities), str(v.facts), str(v.changes)
        )
    console.print(table)
