"""A worker asked for WARNING logs does not build a record for every debug call."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import faust
import pytest

from tidegraph.pipelines.streaming.worker import QuietWorker


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("level", ["WARNING", "ERROR"])
def test_root_logger_keeps_the_level_asked_for(level: str, restored_logging: None) -> None:
    loop = asyncio.new_event_loop()
    try:
        app = faust.App("tidegraph-logging-test", broker="kafka://127.0.0.1:9", loop=loop)
        worker = QuietWorker(app, loop=loop, loglevel=level, quiet=True, redirect_stdouts=False)
        worker._setup_logging()  # what Worker.execute_from_commandline does first
        assert logging.getLogger().level == getattr(logging, level)
        for library in ("neo4j", "aiokafka.consumer.fetcher"):
            assert not logging.getLogger(library).isEnabledFor(logging.DEBUG)
    finally:
        loop.close()
