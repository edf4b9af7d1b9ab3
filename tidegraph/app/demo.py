"""``tidegraph demo``: the main job on the embedded default, on a bundled sample feed.

A CRM feed (JSON records, three tenants, one year) goes through the declared mapping in
``samples/crm_mapping.yaml`` into the embedded SQLite store with the bundled MiniLM embedder: no
Kafka, no Neo4j, no API key, no network. Support-ticket messages need an LLM to be extracted:
without one they are stored unextracted (searchable, extracted later by ``tidegraph extract
--pending``) with a line saying how to enable the LLM; with one they are extracted live. Every
answer printed afterwards is read back from the graph, and the demo ends with an agent's
recall: a search and the context string it would put in its prompt.

``python -m tidegraph.app.demo scale N`` writes a larger copy of the sample feed (N records) to
stdout, for measuring the ingest speed (docs/performance.md, "The embedded store").
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tidegraph.embed import MiniLMEmbedder
from tidegraph.pipelines.ingest import FailedRecord, IngestReport, ingest, read_jsonl
from tidegraph.pipelines.runtime import Runtime, open_runtime
from tidegraph.records.episode import Episode
from tidegraph.records.graph import EntityRecord, FactView
from tidegraph.settings import Settings

SAMPLES = Path(__file__).parent / "samples"
MAPPING_FILE = SAMPLES / "crm_mapping.yaml"
FEED_FILE = SAMPLES / "crm_feed.jsonl"
MESSAGES_FILE = SAMPLES / "ticket_messages.jsonl"

#: The tenant whose graph the demo shows.
DEMO_GROUP = "northwind"
#: The account whose plan history and as-of answer are shown (Acme Corp), and the past date.
FEATURED_ACCOUNT_ID = "nw-a-001"
AS_OF = datetime(2025, 3, 1, tzinfo=UTC)
#: The account with a plan change delivered out of order (Globex), and a date it decides.
LATE_ACCOUNT_ID = "nw-a-002"
LATE_AS_OF = datetime(2025, 6, 1, tzinfo=UTC)

PLAN = "HAS_PLAN"
_LABEL_ORDER = ("Account", "Contact", "User", "Plan", "Ticket", "TicketStatus")


def account_key(account_id: str) -> str:
    """The stable key the sample mapping gives an account (``crm:account:{account.id}``)."""
    return f"crm:account:{account_id}"


# ----------------------------------------------------------------------------- entry point
async def run_demo(*, data_dir: Path | None, console: Console) -> None:
    """Run the demo in ``data_dir`` (kept), or in a fresh temporary folder (deleted after)."""
    if data_dir is not None:
        await _run(Path(data_dir), console, temporary=False)
        return
    with tempfile.TemporaryDirectory(prefix="tidegraph-demo-") as tmp:
        await _run(Path(tmp), console, temporary=True)


def demo_settings(data_dir: Path) -> Settings:
    """The embedded store in ``data_dir`` and the bundled MiniLM, whatever the environment
    says about stores and embedders; the LLM settings still come from TIDEGRAPH_LLM_*."""
    return Settings(store="embedded", data_dir=data_dir, embedder="minilm")


async def _run(data_dir: Path, console: Console, *, temporary: bool) -> None:
    settings = demo_settings(data_dir)
    _print_intro(console, data_dir, temporary)
    runtime = await open_runtime(settings, mapping_path=MAPPING_FILE)
    try:
        await _load_embedder(runtime, console)
        await _ingest_feed(runtime, console)
        await _ingest_messages(runtime, console)
        await _show_graph(runtime, console)
        await _show_recall(runtime, console)
    finally:
        await runtime.close()
    _print_outro(console, data_dir, temporary)


# ----------------------------------------------------------------------------- printing
def _say(console: Console, text: str) -> None:
    """A line of data: names are never read as rich markup or emoji codes, never wrapped."""
    console.print(text, markup=False, emoji=False, highlight=False, soft_wrap=True)


def _heading(console: Console, text: str) -> None:
    console.print()
    console.print(Text(text, style="bold"))


def _table(title: str, columns: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


# ----------------------------------------------------------------------------- ingest
def _print_intro(console: Console, data_dir: Path, temporary: bool) -> None:
    where = "a temporary folder, deleted at the end" if temporary else str(data_dir)
    console.rule(Text("tidegraph demo", style="bold"))
    _say(
        console,
        "A year of CRM records from three tenants becomes a bi-temporal knowledge graph: "
        "embedded SQLite store, bundled MiniLM embedder, no Kafka, no Neo4j, no API key.",
    )
    _say(console, f"Graph folder: {where}")


async def _load_embedder(runtime: Runtime, console: Console) -> None:
    embedder = runtime.embedder
    if not isinstance(embedder, MiniLMEmbedder):  # demo_settings always picks MiniLM
        raise TypeError(f"the demo runs on the bundled MiniLM embedder, not {embedder!r}")
    seconds = await embedder.warm_up()
    _say(console, f"Embedder: {embedder.model_name} (bundled, offline), loaded in {seconds:.2f} s")


def _read_episodes(path: Path) -> list[Episode]:
    episodes, failures = read_jsonl(path.read_bytes().splitlines())
    if failures:  # the bundled samples are valid; anything else is a packaging error
        raise ValueError(f"{path.name}: {failures[0].failure.message}")
    return episodes


def _rate(report: IngestReport) -> str:
    """Events per second over the episodes actually processed (not the already-stored ones)."""
    processed = report.written
    if processed == 0 or report.seconds <= 0:
        return "nothing new to ingest"
    return f"{processed / report.seconds:,.0f} events/s"


async def _ingest_feed(runtime: Runtime, console: Console) -> None:
    episodes = _read_episodes(FEED_FILE)
    groups = sorted({e.group_id for e in episodes})
    _heading(console, "CRM feed")
    _say(
        console,
        f"  {len(episodes)} JSON records from {len(groups)} tenants ({', '.join(groups)}), "
        f"mapped by {MAPPING_FILE.name} (no LLM)",
    )
    report = await ingest(runtime.runner(), episodes)
    _say(console, f"  {report.line()}, {_rate(report)}")
    _print_failures(console, report.failures)


async def _ingest_messages(runtime: Runtime, console: Console) -> None:
    episodes = _read_episodes(MESSAGES_FILE)
    _heading(console, "Support-ticket messages")
    if runtime.llm is None:
        report = await ingest(runtime.runner(), episodes)
        _say(
            console,
            f"  Stored {report.written} ticket messages ({MESSAGES_FILE.name}) "
            "without extraction: no LLM is configured. They are searchable now; "
            "`tidegraph extract --pending` extracts them once an LLM is.",
        )
        _say(
            console,
            "  To extract them live, set TIDEGRAPH_LLM_BASE_URL (any OpenAI-compatible endpoint, "
            "e.g. https://api.openai.com/v1), TIDEGRAPH_LLM_API_KEY and TIDEGRAPH_LLM_MODEL, then "
            "run the demo again.",
        )
        _print_failures(console, report.failures)
        return
    settings = runtime.settings
    _say(
        console,
        f"  Extracting {len(episodes)} ticket messages live with {settings.llm_model} at "
        f"{settings.llm_base_url}",
    )
    report = await ingest(runtime.runner(), episodes)
    _say(console, f"  {report.line()}, {_rate(report)}")
    _print_failures(console, report.failures)
    await _show_extracted(runtime, console, episodes)


def _print_failures(console: Console, failures: list[FailedRecord]) -> None:
    for failed in failures[:10]:
        _say(console, f"  failed {failed.episode_id or '?'} at {failed.failure.line()}")


async def _show_extracted(runtime: Runtime, console: Console, episodes: list[Episode]) -> None:
    """The facts the live LLM extraction stored (every version), per tenant."""
    ids = {e.id for e in episodes}
    rows = []
    for group in sorted({e.group_id for e in episodes}):
        for v in await runtime.store.browse.query_facts(group, include_invalid=True):
            if ids.intersection(v.episodes):
                rows.append((group, v.subject, v.relation, v.object, _day(v.valid_at), v.fact))
    columns = ("tenant", "subject", "relation", "object", "valid from", "fact")
    console.print()
    console.print(_table("Facts extracted live from the ticket messages", columns, rows))


# ----------------------------------------------------------------------------- recall
RECALL_GROUP = "northwind"
RECALL_QUERY = "Why can Acme Corp not sign in, and which plan are they on?"


async def _show_recall(runtime: Runtime, console: Console) -> None:
    """What an agent answering Acme Corp's ticket would recall (docs/retrieval.md "Memory
    retrieval")."""
    from tidegraph.recall.context import build_context
    from tidegraph.recall.search import Searcher
    from tidegraph.records.search import SearchRequest

    searcher = Searcher(runtime.store.search, runtime.embedder, runtime.cross_encoder)
    results = await searcher.search(SearchRequest(query=RECALL_QUERY, group_ids=[RECALL_GROUP]))
    _heading(console, "Recall: what an agent answering the ticket puts in its prompt")
    _say(console, f"  tidegraph search --group {RECALL_GROUP} --context {RECALL_QUERY!r}")
    for line in build_context(results, max_chars=1400, episode_chars=160).splitlines():
        _say(console, f"  {line}")


# ----------------------------------------------------------------------------- read back
@dataclass
class PlanAnswer:
    """An account's plan at a past date and now, both read from the graph."""

    account: str
    date: datetime
    then: str | None
    now: str | None

    def sentence(self) -> str:
        then = f"on the {self.then} plan" if self.then else "on no plan"
        now = f"on the {self.now} plan" if self.now else "on no plan"
        return f"On {self.date:%Y-%m-%d} {self.account} was {then}; now it is {now}."


async def _show_graph(runtime: Runtime, console: Console) -> None:
    store = runtime.store
    await _show_tenants(runtime, console)
    entities = await store.browse.list_entities(DEMO_GROUP)
    _print_entities(console, entities)
    _print_facts_now(console, await store.browse.query_facts(DEMO_GROUP))
    featured = _by_key(entities, account_key(FEATURED_ACCOUNT_ID))
    late = _by_key(entities, account_key(LATE_ACCOUNT_ID))
    featured_history = await plan_history(runtime, featured)
    _print_history(console, featured.name, featured_history)
    _heading(console, "As-of answers (valid at a past date, read from the graph)")
    for account, date in ((featured, AS_OF), (late, LATE_AS_OF)):
        _say(console, f"  {(await plan_answer(runtime, account, date)).sentence()}")
    await _show_late_arrival(runtime, console, late)
    await _show_known_at(runtime, console, featured, featured_history)


async def _show_tenants(runtime: Runtime, console: Console) -> None:
    table = Table(title="Tenants (group ids)", title_justify="left", title_style="bold")
    table.add_column("tenant")
    for column in ("episodes", "entities", "facts"):
        table.add_column(column, justify="right")
    for group in sorted({e.group_id for e in _read_episodes(FEED_FILE)}):
        counts = await runtime.store.browse.counts(group)
        table.add_row(
            Text(group), str(counts["episodes"]), str(counts["entities"]), str(counts["facts"])
        )
    console.print()
    console.print(table)


def _by_key(entities: list[EntityRecord], key: str) -> EntityRecord:
    for entity in entities:
        if entity.key == key:
            return entity
    raise LookupError(f"no entity with key {key!r} in {DEMO_GROUP}: is the sample feed complete?")


def _entity_order(entity: EntityRecord) -> tuple[int, str]:
    ranks = [_LABEL_ORDER.index(label) for label in entity.labels if label in _LABEL_ORDER]
    return (min(ranks) if ranks else len(_LABEL_ORDER), entity.name.casefold())


def _print_entities(console: Console, entities: list[EntityRecord]) -> None:
    rows = [
        (e.name, ", ".join(e.labels), e.key or "", e.summary)
        for e in sorted(entities, key=_entity_order)
    ]
    console.print()
    console.print(_table(f"Entities of {DEMO_GROUP}", ("name", "type", "key", "summary"), rows))


def _print_facts_now(console: Console, views: list[FactView]) -> None:
    rows = [(v.subject, v.relation, v.object, _day(v.valid_at)) for v in views]
    columns = ("subject", "relation", "object", "valid since")
    console.print()
    console.print(_table(f"Facts of {DEMO_GROUP} valid now", columns, rows))


async def plan_history(runtime: Runtime, account: EntityRecord) -> list[FactView]:
    """Every version of the account's plan fact, valid or not, oldest first."""
    views = await runtime.store.browse.query_facts(
        account.group_id, include_invalid=True, entity_uuid=account.uuid
    )
    return [v for v in views if v.relation == PLAN and v.subject == account.name]


async def plan_answer(runtime: Runtime, account: EntityRecord, date: datetime) -> PlanAnswer:
    """The account's plan valid at ``date`` and valid now, from ``query_facts``."""
    return PlanAnswer(
        account=account.name,
        date=date,
        then=await _plan_at(runtime, account, valid_at=date),
        now=await _plan_at(runtime, account),
    )


async def _plan_at(
    runtime: Runtime,
    account: EntityRecord,
    *,
    valid_at: datetime | None = None,
    known_at: datetime | None = None,
) -> str | None:
    views = await runtime.store.browse.query_facts(
        account.group_id, valid_at=valid_at, known_at=known_at, entity_uuid=account.uuid
    )
    plans = [v.object for v in views if v.relation == PLAN and v.subject == account.name]
    return " + ".join(plans) if plans else None


def _is_born_closed(view: FactView) -> bool:
    """Stored already closed: it ended before it was learned (a late arrival)."""
    return view.invalid_at is not None and view.expired_at == view.created_at


def _note(view: FactView) -> str:
    if view.invalid_at is None:
        return "current"
    if _is_born_closed(view):
        return "arrived late: stored already closed"
    return "closed by a later change"


def _print_history(console: Console, account: str, history: list[FactView]) -> None:
    rows = [
        (
            v.object,
            _day(v.valid_at),
            _day(v.invalid_at) or "(open)",
            _clock(v.created_at),
            _clock(v.expired_at),
            _note(v),
        )
        for v in history
    ]
    columns = ("plan", "valid from", "valid until", "learned at", "end learned at", "note")
    console.print()
    console.print(_table(f"History of {account}'s plan ({PLAN}, every version)", columns, rows))
    _say(
        console,
        "  valid from/until: when it was true (event time, from the records); learned at: "
        "when tidegraph stored it (ingestion time, UTC, during this run).",
    )


async def _show_late_arrival(runtime: Runtime, console: Console, account: EntityRecord) -> None:
    for v in await plan_history(runtime, account):
        if _is_born_closed(v):
            _say(
                console,
                f"  Out of order: {account.name}'s move to {v.object} (from {_day(v.valid_at)}) "
                "was delivered after a later change, so tidegraph stored it already closed: "
                f"valid {_day(v.valid_at)} -> {_day(v.invalid_at)}.",
            )


async def _show_known_at(
    runtime: Runtime, console: Console, account: EntityRecord, history: list[FactView]
) -> None:
    """What the graph believed just before it learned the account's current plan."""
    current = [v for v in history if v.invalid_at is None]
    latest = current[-1] if current else None
    if latest is None or latest.created_at is None:
        return
    known_at = _parse(latest.created_at) - timedelta(microseconds=1)
    believed = await _plan_at(runtime, account, known_at=known_at)
    _heading(console, "Known-at answer (what tidegraph believed at an earlier moment)")
    _say(
        console,
        f"  As known at {known_at:%H:%M:%S.%f} UTC, just before tidegraph learned of the move "
        f"to {latest.object}, {account.name} was "
        f"{f'on the {believed} plan' if believed else 'on no plan'}; as known now, it is on the "
        f"{latest.object} plan.",
    )


def _print_outro(console: Console, data_dir: Path, temporary: bool) -> None:
    console.print()
    tidegraph = command_name()
    if temporary:
        _say(
            console,
            f"Keep the graph and query it yourself: {tidegraph} demo --data-dir ./demo-graph, "
            f"then {tidegraph} facts --data-dir ./demo-graph --group northwind "
            "--valid-at 2025-03-01",
        )
        return
    _say(
        console,
        f"Query it yourself: {tidegraph} facts --data-dir {data_dir} --group northwind "
        f"--valid-at 2025-03-01 (also --history, --known-at; {tidegraph} entities, "
        f"{tidegraph} search)",
    )


def command_name() -> str:
    """How to run ``tidegraph`` from here: its name when that is the command on PATH, else
    its path (``.venv/bin/tidegraph`` after ``make install``)."""
    running = Path(sys.argv[0]) if Path(sys.argv[0]).name == "tidegraph" else None
    running = running or Path(sys.executable).with_name("tidegraph")
    on_path = shutil.which("tidegraph")
    if on_path is not None and Path(on_path).resolve() == running.resolve():
        return "tidegraph"
    try:
        return str(running.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(running.resolve())


# ----------------------------------------------------------------------------- formatting
def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _day(text: str | None) -> str:
    return "" if text is None else _parse(text).strftime("%Y-%m-%d")


def _clock(text: str | None) -> str:
    return "" if text is None else _parse(text).strftime("%H:%M:%S.%f")[:-3]


# ----------------------------------------------------------------------------- scaled copy
def scaled_feed(records: int) -> Iterator[dict[str, Any]]:
    """``records`` episodes: the sample feed repeated with renamed accounts, contacts and
    tickets (copy 0 is the sample itself), interleaved so time order is kept. The tenants,
    sales reps and plans are the same: a bigger CRM, not more tenants."""
    feed = [orjson.loads(line) for line in FEED_FILE.read_bytes().splitlines() if line.strip()]
    copies = -(-records // len(feed))
    emitted = 0
    for episode in feed:
        for copy in range(copies):
            if emitted == records:
                return
            yield _renamed(episode, copy)
            emitted += 1


def _renamed(episode: dict[str, Any], copy: int) -> dict[str, Any]:
    if copy == 0:
        return episode
    content = orjson.loads(orjson.dumps(episode["content"]))
    for part in ("account", "company", "contact", "ticket"):
        entity = content.get(part)
        if isinstance(entity, dict):
            entity["id"] = f"{entity['id']}-{copy}"
            if "name" in entity:
                entity["name"] = f"{entity['name']} {copy}"
    return {**episode, "id": f"{episode['id']}-{copy}", "content": content}


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "scale" or not argv[1].isdigit():
        sys.stderr.write("usage: python -m tidegraph.app.demo scale RECORDS > feed.jsonl\n")
        return 2
    for episode in scaled_feed(int(argv[1])):
        sys.stdout.write(orjson.dumps(episode).decode() + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover - a helper for the performance measurements
    raise SystemExit(_main(sys.argv[1:]))
