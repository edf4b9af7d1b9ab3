"""The ``tidegraph`` command."""

from __future__ import annotations

import logging

import typer
from rich.console import Console
from rich.table import Table

from tidegraph.settings import get_settings

app = typer.Typer(
    help="tidegraph: event feeds -> bi-temporal knowledge graph (Kafka, Faust, Neo4j).",
    no_args_is_help=True,
    add_completion=False,
)
services_app = typer.Typer(help="Local Kafka and Neo4j for development and tests (no Docker).")
app.add_typer(services_app, name="services")

console = Console()
err = Console(stderr=True)


def _setup_logging() -> None:
    logging.basicConfig(
        level=get_settings().log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


# ----------------------------------------------------------------------------- services
@services_app.command("up")
def services_up(
    kafka: bool = typer.Option(True, help="Start Kafka."),
    neo4j: bool = typer.Option(True, help="Start Neo4j."),
) -> None:
    """Fetch (once) and start Kafka and Neo4j on loopback; a no-op for what already runs."""
    from tidegraph.local_services import LocalServices, ServiceError

    _setup_logging()
    names = tuple(n for n, on in (("kafka", kafka), ("neo4j", neo4j)) if on)
    services = LocalServices(get_settings())
    try:
        started = services.up(names)
    except ServiceError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    for name, was_started in started.items():
        console.print(f"{name}: {'started' if was_started else 'already running'}")
    _print_status(services)


@services_app.command("down")
def services_down() -> None:
    """Stop the Kafka and Neo4j processes that `services up` started (by pid file)."""
    from tidegraph.local_services import LocalServices

    stopped = LocalServices(get_settings()).down()
    console.print(f"stopped: {', '.join(stopped) if stopped else 'nothing (none running)'}")


@services_app.command("status")
def services_status() -> None:
    """Show whether the local services run and answer their probes."""
    from tidegraph.local_services import LocalServices

    _print_status(LocalServices(get_settings()))


def _print_status(services: object) -> None:
    table = Table("service", "address", "pid", "ready", "log")
    for s in services.status():  # type: ignore[attr-defined]
        table.add_row(s.name, s.address, str(s.pid or "-"), "yes" if s.ready else "no", str(s.log))
    console.print(table)


# ----------------------------------------------------------------------------- demo
@app.command()
def demo() -> None:
    """Run the main job on the embedded default (no Kafka, no Neo4j, no API key)."""
    console.print("tidegraph demo: the pipeline is not built yet (see the core-pipeline issue).")


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
