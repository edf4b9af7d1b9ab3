"""The worker's Kafka consumer waits at most ``TIDEGRAPH_FETCH_MAX_WAIT_SECONDS`` at the broker
for a fetch (tidegraph/pipelines/streaming/fetching.py): faust-streaming builds it with 1.5 s,
and a fetch of idle partitions held that long kept the worker's other partitions from being
fetched (docs/performance.md "Sources"). It waits there for ``TIDEGRAPH_FETCH_MIN_BYTES``
(docs/performance.md "Fewer fetches (thirteenth stop)")."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tidegraph.pipelines.streaming.app import _faust_app
from tidegraph.pipelines.streaming.config import WorkerSettings
from tidegraph.settings import Settings


async def fetch_wait_ms(tmp_path: Path, worker: WorkerSettings) -> Any:
    """The fetch wait of the aiokafka consumer the worker's Faust consumer creates when it
    starts (created here, not started)."""
    return (await fetch_settings(tmp_path, worker))[0]


async def fetch_settings(tmp_path: Path, worker: WorkerSettings) -> tuple[Any, Any]:
    """The fetch wait and size of that consumer."""
    app = _faust_app(Settings(data_dir=tmp_path), worker, None)
    thread: Any = app.consumer._thread  # type: ignore[attr-defined]  # the driver's
    consumer = thread._create_consumer(loop=asyncio.get_running_loop())
    try:
        # what aiokafka's fetcher is started with
        return consumer._fetch_max_wait_ms, consumer._fetch_min_bytes
    finally:
        await consumer.stop()


async def test_the_workers_fetches_wait_at_most_a_tenth_of_a_second_by_default(
    tmp_path: Path,
) -> None:
    assert await fetch_wait_ms(tmp_path, WorkerSettings()) == 100


async def test_the_setting_sets_the_wait(tmp_path: Path) -> None:
    assert await fetch_wait_ms(tmp_path, WorkerSettings(fetch_max_wait_seconds=0.25)) == 250


async def test_a_fetch_waits_for_16_kib_by_default_and_for_what_the_setting_says(
    tmp_path: Path,
) -> None:
    assert (await fetch_settings(tmp_path, WorkerSettings()))[1] == 16384
    first_record = WorkerSettings(fetch_min_bytes=1, fetch_max_wait_seconds=0.05)
    assert await fetch_settings(tmp_path, first_record) == (50, 1)
