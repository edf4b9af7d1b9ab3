"""``tidegraph forget``: take episodes out of a group's memory (docs/architecture.md
"Forgetting").

    tidegraph forget --group G --episode ID [--episode ID ...]    # these episodes
    tidegraph forget --group G --subject "Dana Reyes" [--yes]      # every episode mentioning her
    tidegraph forget --group G --all [--purge] --yes               # the whole group
    ... [--dry-run] [--via kafka] [--json] [--data-dir DIR]

In this process (the default) the forget is done when the command returns; ``--via kafka``
puts a forget record on the input topic and the worker that owns the group runs it in the
group's order. ``--dry-run`` says what would go and writes nothing. A subject or a whole
group is only forgotten after a confirmation on the terminal, or with ``--yes`` (without a
terminal and without ``--yes`` the command refuses, exit code 2).

Importing this module registers ``forget`` on ``tidegraph.app.cli.main.app``.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tidegraph.app.cli.main import (
    app,
    data_dir_option,
    err,
    first_problem,
    get_settings,
    group_option,
    json_line,
    json_option,
    open_writing,
    use_data_dir,
)
from tidegraph.records.ids import id_problem

if TYPE_CHECKING:
    from tidegraph.app.browse import ForgetResult
    from tidegraph.app.memory import Memory
    from tidegraph.records.forget import ForgetRequest


@dataclass
class Outcome:
    """What the command reports: the memory's answer and, for named episodes, the ones the
    group did not hold (already forgotten, or never added)."""

    result: ForgetResult
    already_forgotten: list[str] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        row = self.result.as_json()
        if self.already_forgotten:
            row["already_forgotten"] = self.already_forgotten
        if self.not_found:
            row["not_found"] = self.not_found
        return row


@app.command()
def forget(
    group: str = group_option(),
    episode: list[str] = typer.Option(
        [], "--episode", metavar="ID", help="An episode to forget, by its id (repeat for several)."
    ),
    subject: str | None = typer.Option(
        None,
        "--subject",
        help="Every episode that mentions this entity: its uuid, its key (e.g. crm:contact:7) "
        "or its exact name.",
    ),
    whole_group: bool = typer.Option(
        False, "--all", help="The whole group: every episode, entity, fact and index entry."
    ),
    purge: bool = typer.Option(
        False,
        "--purge",
        help="With --all: the tombstones and the group's data keys too (a replay of the "
        "group's old records would then bring back those in clear; sealed ones can no longer "
        "be read).",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="List what would go, with the counts; write nothing."
    ),
    via: str = typer.Option(
        "process",
        "--via",
        help="process (here; done when the command returns) or kafka (a forget record on the "
        "input topic: the worker that owns the group runs it in the group's order).",
    ),
    yes: bool = typer.Option(
        False,
        "--yes",
        help="Forget a subject or a whole group without asking (needed without a terminal).",
    ),
    as_json: bool = json_option(),
    data_dir: Path | None = data_dir_option(),
) -> None:
    """Forget episodes of a group: the graph afterwards is the one its remaining episodes
    give, and a replay of the input topic never brings them back (docs/architecture.md
    "Forgetting"). Name exactly one of --episode, --subject or --all."""
    use_data_dir(data_dir)
    request = _request(group, episode, subject, whole_group, purge)
    if via not in ("process", "kafka"):
        raise typer.BadParameter(f"'process' or 'kafka', not {via[:80]!r}", param_hint="--via")
    confirm = (whole_group or subject is not None) and not dry_run and not yes
    if confirm and not sys.stdin.isatty():
        what = "--all" if whole_group else "--subject"
        err.print(
            f"error: forget {what} is confirmed on a terminal and stdin is not one: nothing "
            "was forgotten; add --yes to forget without asking (--dry-run lists what would go)",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(2)
    outcome = asyncio.run(_forget(request, dry_run=dry_run, via=via, confirm=confirm))
    if as_json:
        json_line(outcome.as_json())
    else:
        _say(outcome, request, subject)
    if outcome.not_found:
        raise typer.Exit(1)


def _request(
    group: str, episodes: list[str], subject: str | None, whole_group: bool, purge: bool
) -> ForgetRequest:
    from pydantic import ValidationError

    from tidegraph.records.forget import ForgetRequest

    if sum([bool(episodes), subject is not None, whole_group]) != 1:
        raise typer.BadParameter(
            "say what to forget: --episode ID (repeatable), --subject S or --all (exactly one)"
        )
    if purge and not whole_group:
        raise typer.BadParameter("it applies to a whole group (--all)", param_hint="--purge")
    for ident in episodes:
        problem = id_problem(ident)
        if problem is not None:
            raise typer.BadParameter(
                f"episode id {ident[:80]!r} {problem}; give it exactly as it was added",
                param_hint="--episode",
            )
    try:
        return ForgetRequest(
            group_id=group,
            episode_ids=tuple(episodes),
            subject=subject,
            group=whole_group,
            purge=purge,
        )
    except ValidationError as exc:
        raise typer.BadParameter(first_problem(exc)) from None


async def _open(via: str, in_process: bool) -> Memory:
    """The memory a forget goes through: with its write side (in this process, and for a
    dry run), or reading the store only to name the subject and produce the record (Kafka)."""
    from tidegraph.app.memory import Memory, open_reader

    if via == "kafka" and not in_process:
        return Memory(await open_reader(get_settings()), via="kafka")
    memory: Memory = await open_writing(via)
    return memory


async def _forget(request: ForgetRequest, *, dry_run: bool, via: str, confirm: bool) -> Outcome:
    async with await _open(via, in_process=dry_run or confirm) as memory:
        if confirm and not await _confirmed(memory, request):
            err.print("nothing was forgotten", highlight=False)
            raise typer.Exit(1)
        outcome = Outcome(await memory.forget(request, dry_run=dry_run))
        if outcome.result.status != "queued":
            for ident in sorted(set(request.episode_ids) - set(outcome.result.episodes)):
                held_now = await memory.episode(request.group_id, ident)
                if held_now is not None and held_now.episode.status == "forgotten":
                    outcome.already_forgotten.append(ident)
                else:
                    outcome.not_found.append(ident)
    return outcome


SHOWN_BEFORE_ASKING = 20


async def _confirmed(memory: Memory, request: ForgetRequest) -> bool:
    """What would go, and the user's yes on the terminal (a subject with no episode: yes)."""
    group = request.group_id
    if request.group:
        [held] = await memory.groups([group])
        asked = (
            f"Forget everything of group {group!r} ({_plural(held.episodes, 'episode')}, "
            f"{_plural(held.entities, 'entity')}, {_plural(held.facts, 'fact')})"
            + (" and its tombstones and data keys" if request.purge else "")
        )
    else:
        preview = await memory.forget(request, dry_run=True)
        if not preview.forgotten:
            return True
        for ident in preview.episodes[:SHOWN_BEFORE_ASKING]:
            typer.echo(f"  {ident}")
        if preview.forgotten > SHOWN_BEFORE_ASKING:
            typer.echo(f"  ... and {preview.forgotten - SHOWN_BEFORE_ASKING} more")
        asked = (
            f"Forget these {_plural(preview.forgotten, 'episode')} of group {group!r} (every "
            f"one that mentions {request.subject!r}), with what only they support"
        )
    return typer.confirm(f"{asked}? It cannot be undone", default=False)


_PLURALS = {"episode": "episodes", "fact": "facts", "entity": "entities"}


def _plural(n: int, word: str) -> str:
    return f"{n} {word if n == 1 else _PLURALS[word]}"


def _say(outcome: Outcome, request: ForgetRequest, subject: str | None) -> None:
    result, group = outcome.result, request.group_id
    out = typer.echo
    what = f"every episode of group {group!r} that mentions {subject!r}" if subject else ""
    if result.status == "queued":
        target = what or (
            f"the whole group {group!r}" if request.group else
            f"{_plural(len(result.episodes), 'episode')} of group {group!r}"
        )  # fmt: skip
        out(
            f"queued the forget of {target} on {result.topic} (partition {result.partition}, "
            f"offset {result.offset}): the worker that owns the group runs it in the group's "
            f"order; `tidegraph episodes --group {group} --status forgotten` lists what it forgot"
        )
        return
    dry = result.status == "dry_run"
    verb = "would forget" if dry else "forgot"
    if request.group and not dry:
        out(
            f"forgot the whole group {group!r}: {_plural(result.forgotten, 'episode')} with "
            "their entities, facts and index entries"
            + (", and its tombstones and data keys" if request.purge else "")
        )
    else:
        out(
            f"{verb} {_plural(result.forgotten, 'episode')} of group {group!r}"
            + (f" (every one that mentions {subject!r})" if subject else "")
            + (":" if result.episodes else "")
        )
        for ident in result.episodes:
            out(f"  {ident}")
        if not request.group and result.forgotten:
            removed = (
                f"{_plural(result.facts_removed, 'fact')} and "
                f"{_plural(result.entities_removed, 'entity')}"
            )
            changed = (
                f"{_plural(result.facts_changed, 'fact')} and "
                f"{_plural(result.entities_changed, 'entity')}"
            )
            out(
                f"{'would remove' if dry else 'removed'} {removed}; "
                f"{'would change' if dry else 'changed'} {changed}"
            )
        if dry:
            out("dry run: nothing was written")
    for ident in outcome.already_forgotten:
        err.print(f"already forgotten: {ident}", highlight=False, markup=False)
    for ident in outcome.not_found:
        err.print(
            f"not an episode of group {group!r}: {ident} (`tidegraph episodes --group {group}` "
            "lists them)",
            highlight=False,
            markup=False,
        )
