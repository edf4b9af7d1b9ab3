"""Start one worker process: topics, runtime, metrics endpoint, then the Faust worker.

Everything that can be wrong with the configuration (Kafka or Neo4j unreachable, topics with
another partition count, a broken mapping file) fails here, before Faust starts. The runtime
(one store connection, one embedder, one LLM client = one global LLM rate limiter) is opened
once on the event loop the Faust worker then runs on, and closed after the app has stopped.
Several workers (one machine or many) with the same consumer group share the partitions.
"""

from __future__ import annotations

import asyncio
import logging
from typing import NoReturn

import faust

from pipelines.app import create_app
from pipelines.config import WorkerSettings
from pipelines.observability import ObservabilityServer
from tidegraph.runtime import open_runtime
from tidegraph.settings import Settings
from topics.admin import ensure_topics
from topics.names import TopicNames

log = logging.getLogger(__name__)


LOG_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    """One root handler for our and Faust's loggers (Faust keeps an existing one)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    # The driver logs every schema "already exists" notice at INFO.
    logging.getLogger("neo4j.notifications").setLevel(logging.WARNING)


def run_worker(settings: Settings, worker: WorkerSettings) -> NoReturn:
    setup_logging(settings.log_level)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    names = TopicNames(settings.topic_prefix)
    loop.run_until_complete(
        ensure_topics(
            settings.kafka_bootstrap_servers,
            names,
            partitions=settings.partitions,
            replication_factor=settings.replication_factor,
        )
    )
    (settings.data_dir / "faust").mkdir(parents=True, exist_ok=True)
    runtime = loop.run_until_complete(open_runtime(settings, mapping_path=settings.mappings))
    server = ObservabilityServer(settings.metrics_port, worker.metrics_host)
    server.start()
    app = create_app(settings, worker, runtime, loop=loop)
    app.add_closer(_stopper(server))
    log.info(
        "worker starting: group=%s topics=%s.* partitions=%d store=%s llm=%s mappings=%s",
        worker.group_id(settings.topic_prefix), settings.topic_prefix, settings.partitions,
        settings.store, "yes" if runtime.llm else "no", settings.mappings or "none",
    )  # fmt: skip
    faust_worker = faust.Worker(
        app,
        loop=loop,
        loglevel=settings.log_level.upper(),
        quiet=True,
        redirect_stdouts=False,
    )
    faust_worker.execute_from_commandline()


def _stopper(server: ObservabilityServer):  # type: ignore[no-untyped-def]
    async def stop() -> None:
        server.stop()

    return stop
