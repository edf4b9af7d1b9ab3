"""Kafka commands of the ``tidegraph`` CLI: worker, produce, dlq, ingest --via kafka."""

from __future__ import annotations

from pathlib import Path

import typer

from tidegraph.settings import Settings


def ingest_via_kafka(path: Path, settings: Settings) -> None:
    """Produce the file to the input topic and wait until the graph reflects all of it."""
    raise typer.BadParameter("--via kafka is not built yet (streaming topology issue)")
