"""Start one worker process: topics, runtime, metrics endpoint, then the Faust worker.

Everything that can be wrong with the configuration (Kafka or Neo4j unreachable, topics with another
partition count, a broken mapping file) fails here, before Faust starts. The runtime (one store
connection, one embedder, one LLM client = one global LLM rate limiter) is opened once on the event
loop the Faust worker then runs on, and closed after the app has stopped. Several workers (one
machine or many) with the same consumer group share the partitions. The HTTP port serves
``/metrics``, ``/healthz`` and ``/readyz`` (``tidegraph.pipelines.streaming.health``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import NoReturn

import faust
from aiokafka.errors import KafkaError
from neo4j.exceptions import (
    AuthError,
    DriverError,
    Neo4jError,
    ServiceUnavailable,
    SessionExpired,
)

from tidegraph.connections import (
    ConnectionSettingsError,
    KafkaConnection,
    neo4j_driver_options,
    quiet_neo4j_driver_logs,
)
from tidegraph.pipelines.collector import settle_collector
from tidegraph.pipelines.runtime import Runtime, open_runtime
from tidegraph.pipelines.streaming.app import create_app
from tidegraph.pipelines.streaming.config import WorkerSettings
from tidegraph.pipelines.streaming.health import HealthState, health_routes
from tidegraph.pipelines.streaming.observability import ObservabilityServer, Response
from tidegraph.pipelines.streaming.sources import resolve_sources
from tidegraph.processors.sources import SourceFileError
from tidegraph.settings import Settings
from tidegraph.stores import StoreSchemaError, open_store
from tidegraph.topics.admin import TopicSetupError, ensure_topics
from tidegraph.topics.names import TopicNames

log = logging.getLogger(__name__)


LOG_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    """One root handler for our and Faust's loggers (Faust keeps an existing one)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    quiet_neo4j_driver_logs()


# Exit status of a worker whose store did not answer for TIDEGRAPH_STORE_OUTAGE_LIMIT_SECONDS
# (at start or while running): nothing was committed past an unwritten record; restart it.
EXIT_STORE_UNREACHABLE = 75
START_BACKOFF_SECONDS = 0.5
START_BACKOFF_MAX_SECONDS = 15.0


class StartupError(RuntimeError):
    """The worker cannot start with this configuration (the message says what to fix);
    ``exit_code``: the process's exit status."""

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


async def open_when_store_answers(settings: Settings) -> Runtime:
    """The worker's runtime, once its store answers: a store that does not answer yet (a
    worker started before Neo4j, or during an outage) is waited for with backoff, up to
    TIDEGRAPH_STORE_OUTAGE_LIMIT_SECONDS, with one warning and a line per try; anything else
    wrong (a refused login, a schema that does not fit, a broken mapping file) stops the
    start at once."""
    started = time.monotonic()
    delay = START_BACKOFF_SECONDS
    where = f"Neo4j at {settings.neo4j_uri} (TIDEGRAPH_NEO4J_URI)"
    while True:
        store = open_store(settings)
        try:
            return await open_runtime(settings, mapping_path=settings.mappings, store=store)
        except (DriverError, Neo4jError) as exc:
            await store.close()
            if not _unreachable(exc):
                raise StartupError(f"{where}: {type(exc).__name__}: {exc}") from exc
            waited = time.monotonic() - started
            if waited + delay > settings.store_outage_limit_seconds:
                raise StartupError(
                    f"{where} did not answer for {waited:.0f} s "
                    f"(TIDEGRAPH_STORE_OUTAGE_LIMIT_SECONDS): {type(exc).__name__}: {exc}",
                    exit_code=EXIT_STORE_UNREACHABLE,
                ) from exc
            if waited == 0 or delay == START_BACKOFF_SECONDS:
                log.warning(
                    "%s does not answer (%s: %s): waiting for it before consuming (/readyz "
                    "says so meanwhile)", where, type(exc).__name__, exc,
                )  # fmt: skip
            else:
                log.info("still waiting for %s; next try in %.1f s", where, delay)
            await asyncio.sleep(delay)  # backoff between tries, not a synchronisation
            delay = min(START_BACKOFF_MAX_SECONDS, delay * 2)
        except (ValueError, StoreSchemaError, OSError) as exc:  # mapping file, schema, paths
            await store.close()
            raise StartupError(f"{type(exc).__name__}: {exc}") from exc


def _unreachable(exc: DriverError | Neo4jError) -> bool:
    """Whether the error says the store does not answer (rather than refusing us: a
    certificate it does not trust, a refused login)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError | AuthError):
            return False
        cause = cause.__cause__ or cause.__context__
    return isinstance(exc, ServiceUnavailable | SessionExpired) or exc.is_retryable()


def run_worker(settings: Settings, worker: WorkerSettings) -> NoReturn:
    setup_logging(settings.log_level)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    names = TopicNames(settings.topic_prefix)
    try:
        kafka = KafkaConnection.from_settings(settings)
        neo4j_driver_options(settings)  # checks the Neo4j TLS settings before anything starts
    except ConnectionSettingsError as exc:
        raise StartupError(str(exc)) from exc
    try:
        loop.run_until_complete(
            ensure_topics(
                kafka,
                names,
                partitions=settings.partitions,
                replication_factor=settings.replication_factor,
            )
        )
    except (KafkaError, OSError) as exc:  # OSError includes TLS handshake failures
        raise StartupError(
            f"Kafka at {settings.kafka_bootstrap_servers} (TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS, "
            f"security protocol {settings.kafka_security_protocol}): {type(exc).__name__}: "
            f"{exc or 'no answer'}; check the address and the TIDEGRAPH_KAFKA_SASL_* / "
            f"TIDEGRAPH_KAFKA_SSL_* settings"
        ) from exc
    except TopicSetupError as exc:
        raise StartupError(str(exc)) from exc
    sources = None
    if settings.sources is not None:  # validated, and its topics checked, before anything runs
        try:
            sources = loop.run_until_complete(resolve_sources(settings.sources, kafka))
        except SourceFileError as exc:
            raise StartupError(f"{exc} (TIDEGRAPH_SOURCES)") from exc
        except (KafkaError, OSError) as exc:
            raise StartupError(
                f"reading the topics of {settings.sources} (TIDEGRAPH_SOURCES) from Kafka at "
                f"{settings.kafka_bootstrap_servers}: {type(exc).__name__}: {exc}"
            ) from exc
    (settings.data_dir / "faust").mkdir(parents=True, exist_ok=True)
    # Readiness answers from the start: while the store does not answer, it says so.
    health = HealthState(neo4j_reachable=False, stuck_after_seconds=worker.health_stuck_seconds)
    server = ObservabilityServer(settings.metrics_port, worker.metrics_host)
    for path, route in health_routes(health, Response).items():
        server.add_route(path, route)
    server.start()
    try:
        runtime = loop.run_until_complete(open_when_store_answers(settings))
    except BaseException:
        server.stop()
        raise
    health.neo4j_reachable = True
    app = create_app(settings, worker, runtime, loop=loop, health=health, sources=sources)
    health.watch_loop(loop)
    app.add_closer(_stopper(server, health))
    log.info(
        "worker starting: group=%s topics=%s.* partitions=%d store=%s llm=%s mappings=%s",
        worker.group_id(settings.topic_prefix), settings.topic_prefix, settings.partitions,
        settings.store, "yes" if runtime.llm else "no", settings.mappings or "none",
    )  # fmt: skip
    settle_collector()
    faust_worker = QuietWorker(
        app,
        loop=loop,
        loglevel=settings.log_level.upper(),
        quiet=True,
        redirect_stdouts=False,
    )
    faust_worker.execute_from_commandline()


class QuietWorker(faust.Worker):
    """faust.Worker without its terminal spinner. For the spinner Faust sets the root logger
    to DEBUG whenever the level asked for is WARNING or above, so every debug call of the
    neo4j driver and aiokafka built a log record (about 8 % of a busy worker's CPU, profiled
    with py-spy) and wrote cursor codes into the log."""

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        self.spinner = None


def _stopper(server: ObservabilityServer, health: HealthState):
    async def stop() -> None:
        health.unwatch_loop()
        health.kafka_connected = False
        server.stop()

    return stop
