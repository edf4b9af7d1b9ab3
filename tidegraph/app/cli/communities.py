"""``tidegraph communities``: list a group's communities, force a refresh.

    tidegraph communities --group G [--json]          # = tidegraph communities list ...
    tidegraph communities refresh --group G

With ``--json`` one object per line: ``{"uuid", "name", "summary", "members": [names],
"size"}``, largest community first.

Importing this module registers ``communities`` on ``tidegraph.app.cli.main.app``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from tidegraph.app.cli.main import (
    app,
    data_dir_option,
    get_settings,
    group_option,
    json_option,
    open_reading,
    use_data_dir,
)

communities_app = typer.Typer(
    help="Communities of entities (label propagation + neighbour-majority assignment).",
    no_args_is_help=True,
    invoke_without_command=True,
    rich_markup_mode=None,
)
app.add_typer(communities_app, name="communities")
console = Console()


@communities_app.callback()
def communities(
    ctx: typer.Context,
    group: str | None = typer.Option(
        None, "--group", help="Group id (tenant): list its communities."
    ),
    as_json: bool = json_option(),
    data_dir: Path | None = data_dir_option(),
) -> None:
    """Communities of entities: `tidegraph communities --group G [--json]` lists a group's
    communities (as the `list` command does)."""
    if ctx.invoked_subcommand is not None:
        if group is not None or as_json or data_dir is not None:
            raise typer.BadParameter(
                f"give --group/--json/--data-dir after the command: tidegraph communities "
                f"{ctx.invoked_subcommand} --group G"
            )
        return
    if group is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)
    use_data_dir(data_dir)
    _print(group, as_json)


@communities_app.command("list")
def list_communities(
    group: str = group_option(),
    as_json: bool = json_option(),
    data_dir: Path | None = data_dir_option(),
) -> None:
    """The group's communities with their members' names, largest first."""
    use_data_dir(data_dir)
    _print(group, as_json)


def _print(group: str, as_json: bool) -> None:
    rows = asyncio.run(_rows(group))
    if as_json:
        for row in rows:
            sys.stdout.write(orjson.dumps(row).decode() + "\n")
        return
    table = Table("name", "size", "members", "summary")
    for row in rows:
        table.add_row(row["name"], str(row["size"]), ", ".join(row["members"][:8]), row["summary"])
    console.print(table)


async def _rows(group: str) -> list[dict[str, Any]]:
    async with await open_reading() as memory:
        communities = await memory.store.communities.list_communities(group)
        members = sorted({m for c in communities for m in c.members})
        found = await memory.store.entities_by_uuids(group, members)
    names = {e.uuid: e.name for e in found}
    rows = [
        {
            "uuid": c.uuid,
            "name": c.name,
            "summary": c.summary,
            "members": sorted(names.get(m, m) for m in c.members),
            "size": len(c.members),
        }
        for c in communities
    ]
    return sorted(rows, key=lambda r: (-r["size"], r["name"], r["uuid"]))


@communities_app.command("refresh")
def refresh(
    group: str = group_option(),
    seed: int = typer.Option(0, help="Label propagation seed."),
    max_iterations: int = typer.Option(30, help="Label propagation sweep cap."),
) -> None:
    """Recompute the group's communities now (only changed ones are rewritten)."""
    result = asyncio.run(_refresh(group, seed, max_iterations))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


async def _refresh(group: str, seed: int, max_iterations: int) -> dict[str, Any]:
    from tidegraph.embed import make_embedder
    from tidegraph.llm.client import LLMClient
    from tidegraph.pipelines.community_service import CommunityService
    from tidegraph.stores import open_store

    settings = get_settings()
    embedder = make_embedder(settings)
    llm = LLMClient.from_settings(settings)
    store = open_store(settings)
    try:
        await store.setup(embedder.dim, embedder.model_name)
        service = CommunityService(store, llm, embedder)
        result = await service.refresh(group, seed=seed, max_iterations=max_iterations)
    finally:
        await store.close()
        await embedder.close()
        if llm is not None:
            await llm.close()
    return {**vars(result), "seconds": round(result.seconds, 3)}
