"""``tidegraph search``: recall from the memory (docs/retrieval.md "Memory retrieval").

One query as a table, JSON lines (``--json``) or the agent's context string (``--context``);
or a batch (``--queries FILE``: JSON lines ``{"id", "query", "valid_at"?, "known_at"?}``)
answered in one process, one JSON line per result with the query's ``query_id``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson
import typer
from rich.table import Table

from tidegraph.app.cli.main import (
    app,
    console,
    data_dir_option,
    err,
    first_problem,
    get_settings,
    interval,
    open_reading,
    use_data_dir,
)
from tidegraph.recall.recipes import recipe_problem, recipes_help
from tidegraph.records.search import DEFAULT_RECIPE, MAX_LIMIT, SearchRequest

_RECIPES_HELP = "Recipes (--recipe; the first is the default):\n\n" + "\n\n".join(
    recipes_help().splitlines()
)


@app.command(epilog=_RECIPES_HELP)
def search(
    query: str | None = typer.Argument(None, help="What to recall (omit with --queries)."),
    group: list[str] = typer.Option(
        ..., "--group", help="Group id (tenant) to search; repeat for several."
    ),
    valid_at: str | None = typer.Option(None, "--valid-at", help="Valid at T (default: now)."),
    known_at: str | None = typer.Option(None, "--known-at", help="As known at K (default: now)."),
    recipe: str = typer.Option(
        DEFAULT_RECIPE, "--recipe", help="Search recipe (listed below; docs/retrieval.md)."
    ),
    centre: str | None = typer.Option(
        None, "--centre", help="Entity uuid the distance recipes rank from."
    ),
    limit: int | None = typer.Option(
        None, "--limit", min=1, max=MAX_LIMIT, help="Results per kind."
    ),
    history: bool = typer.Option(False, "--history", help="Also facts that have ended."),
    as_json: bool = typer.Option(False, "--json", help="JSON lines, one per result."),
    context: bool = typer.Option(False, "--context", help="Print the agent's context string."),
    max_chars: int = typer.Option(4000, "--max-chars", min=200, help="Context budget."),
    queries: Path | None = typer.Option(
        None,
        "--queries",
        exists=True,
        dir_okay=False,
        help='JSON lines {"id", "query", "valid_at"?, "known_at"?}: each answered, JSON out.',
    ),
    data_dir: Path | None = data_dir_option(),
) -> None:
    """Search the memory of the given groups: facts (valid at T as known at K), entities,
    episodes and community summaries, fused and reranked by the recipe."""
    from pydantic import ValidationError

    from tidegraph.app.cli.main import _when

    use_data_dir(data_dir)
    if (query is None) == (queries is None):
        raise typer.BadParameter("give a query or --queries FILE (one of the two)")
    settings = get_settings()
    problem = recipe_problem(
        recipe,
        centre=centre,
        cross_encoder=bool(settings.rerank_base_url and settings.rerank_model),
    )
    if problem is not None:  # said before anything is opened
        raise typer.BadParameter(problem, param_hint="--recipe")
    try:
        request = SearchRequest(
            query=query or "(each of --queries)",
            group_ids=group,
            valid_at=_when(valid_at, "--valid-at"),
            known_at=_when(known_at, "--known-at"),
            include_invalid=history,
            recipe=recipe,
            limit=limit,
            centre=centre,
        )
    except ValidationError as exc:
        raise typer.BadParameter(first_problem(exc)) from None
    if queries is not None:
        asyncio.run(_run_batch(_read_queries(queries, request)))
        return
    asyncio.run(_run_one(request, as_json=as_json, context=context, max_chars=max_chars))


def _read_queries(path: Path, base: SearchRequest) -> list[tuple[str, SearchRequest]]:
    """Each line's id and request: ``base`` with the line's query and times."""
    from pydantic import ValidationError

    from tidegraph.app.cli.main import _when

    batch = []
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise typer.BadParameter(f"{path}:{n}: not JSON ({exc})") from None
        if not isinstance(item, dict) or not isinstance(item.get("query"), str):
            raise typer.BadParameter(f'{path}:{n}: needs {{"id", "query"}}')
        asked = {
            "query": item["query"],
            "valid_at": _when(item.get("valid_at"), f"{path}:{n} valid_at"),
            "known_at": _when(item.get("known_at"), f"{path}:{n} known_at"),
        }
        try:
            request = SearchRequest.model_validate({**base.model_dump(), **asked})
        except ValidationError as exc:
            raise typer.BadParameter(f"{path}:{n}: {first_problem(exc)}") from None
        batch.append((str(item.get("id", n)), request))
    return batch


async def _run_one(request: SearchRequest, *, as_json: bool, context: bool, max_chars: int) -> None:
    from tidegraph.recall.context import build_context

    async with await open_reading() as memory:
        results = await memory.search(request)
        note = await memory.missing_facts_note(results)
    if note:
        err.print(f"note: {note}", highlight=False)
    if context:
        sys.stdout.write(build_context(results, max_chars=max_chars) + "\n")
        return
    hits = results.all()
    if as_json:
        for rank, hit in enumerate(hits, 1):
            sys.stdout.write(orjson.dumps(hit.as_json(rank)).decode() + "\n")
        return
    if not hits:
        err.print("nothing found")
        return
    table = Table("rank", "kind", "score", "text", "valid", "episodes")
    table.columns[4].no_wrap = True
    for rank, hit in enumerate(hits, 1):
        line = hit.as_json(rank)
        valid = interval(line["valid_at"], line["invalid_at"]) if hit.kind == "fact" else ""
        sources = line.get("episodes") or [line.get("episode_id", "")]
        table.add_row(
            str(rank), hit.kind, f"{hit.score:.3f}", hit.text[:120], valid, ", ".join(sources[:3])
        )
    console.print(table)


async def _run_batch(batch: list[tuple[str, SearchRequest]]) -> None:
    async with await open_reading() as memory:
        for query_id, request in batch:
            results = await memory.search(request)
            for rank, hit in enumerate(results.all(), 1):
                line = hit.as_json(rank, query_id=query_id)
                sys.stdout.write(orjson.dumps(line).decode() + "\n")


# ----------------------------------------------------------------------------- extract
@app.command()
def extract(
    pending: bool = typer.Option(
        False, "--pending", help="Extract the episodes stored without extraction."
    ),
    group: list[str] = typer.Option(
        [], "--group", help="Only these groups (repeat; default: every group with some)."
    ),
    concurrency: int = typer.Option(8, help="Groups processed at once."),
) -> None:
    """Extract episodes stored without extraction (no LLM was configured, no mapping rule
    matched, or the LLM failed on them), in event order per group (docs/architecture.md "Episodes
    without
    an LLM"). Configure the LLM (TIDEGRAPH_LLM_*) or the mapping first."""
    if not pending:
        raise typer.BadParameter("say what to extract: --pending")
    report = asyncio.run(_extract_pending(group, concurrency))
    console.print(report.line())
    for group_id, why in {**report.still_pending, **report.failed}.items():
        err.print(f"[yellow]group {group_id} stopped[/yellow] at {why}")
    if report.still_pending or report.failed:
        raise typer.Exit(1)


async def _extract_pending(groups: list[str], concurrency: int) -> Any:
    from tidegraph.pipelines.pending import extract_pending
    from tidegraph.pipelines.runtime import open_runtime

    settings = get_settings()
    runtime = await open_runtime(settings, mapping_path=settings.mappings)
    try:
        targets = groups or await runtime.store.pending_groups()
        return await extract_pending(
            runtime.runner(), runtime.store, targets, concurrency=concurrency
        )
    finally:
        await runtime.close()
