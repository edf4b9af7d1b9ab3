"""What the ``tidegraph`` command says when it cannot go on: one line naming what it could not
reach or read and how to fix it, never a traceback (``TIDEGRAPH_LOG_LEVEL=DEBUG`` adds it)."""

from __future__ import annotations

import ssl

from tidegraph.settings import Settings


def explain(exc: BaseException, settings: Settings) -> str:
    """The one line for ``exc`` (see the module docstring)."""
    from aiokafka.errors import KafkaConnectionError, KafkaError
    from neo4j.exceptions import (
        AuthError,
        DriverError,
        Neo4jError,
        ServiceUnavailable,
        TransientError,
    )

    from tidegraph.app.browse import BadCursor
    from tidegraph.app.memory import NoStore
    from tidegraph.connections import ConnectionSettingsError
    from tidegraph.embed import EmbedderConfigError
    from tidegraph.embed.minilm import ModelFilesError
    from tidegraph.pipelines.forget import ForgetError
    from tidegraph.stores.errors import StoreSchemaError, StoreUnreachable

    detail = " ".join(str(exc).split()) or type(exc).__name__
    kafka = f"Kafka at {settings.kafka_bootstrap_servers} (TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS)"
    neo4j = f"Neo4j at {settings.neo4j_uri} (TIDEGRAPH_NEO4J_URI)"
    if isinstance(exc, KafkaConnectionError) or (
        isinstance(exc, KafkaError) and "connect" in detail.lower()
    ):
        return (
            f"could not reach {kafka}: {detail}; start Kafka (make services-up) or point "
            "TIDEGRAPH_KAFKA_BOOTSTRAP_SERVERS at a running broker"
        )
    if isinstance(exc, KafkaError):
        return f"{kafka} answered with an error: {type(exc).__name__}: {detail}"
    if isinstance(exc, AuthError):
        return (
            f"{neo4j} refused the credentials: set TIDEGRAPH_NEO4J_USER / TIDEGRAPH_NEO4J_PASSWORD"
        )
    if isinstance(exc, StoreUnreachable):
        return (
            f"{detail}; once the store answers, run the same command again: what was written "
            "is skipped, the rest follows in order"
        )
    if isinstance(exc, ServiceUnavailable):
        return (
            f"could not reach {neo4j}: {detail}; start Neo4j (make services-up) or point "
            "TIDEGRAPH_NEO4J_URI at a running server"
        )
    if isinstance(exc, TransientError):
        return (
            f"{neo4j} could not answer now ({exc.code or type(exc).__name__}, tried twice): "
            f"{detail}; retry shortly"
        )
    if isinstance(exc, DriverError | Neo4jError):
        return f"{neo4j}: {type(exc).__name__}: {detail}"
    if isinstance(
        exc,
        NoStore
        | ConnectionSettingsError
        | EmbedderConfigError
        | ModelFilesError
        | ForgetError
        | BadCursor,
    ):
        return detail
    if isinstance(exc, StoreSchemaError):
        return f"the store cannot be used as it is: {detail}"
    if isinstance(exc, ssl.SSLError):
        return f"a TLS connection failed: {detail}; check the TIDEGRAPH_*_CA_FILE settings"
    if isinstance(exc, ConnectionError | TimeoutError):
        return f"a connection failed: {type(exc).__name__}: {detail}"
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {detail}"
    return f"{type(exc).__name__}: {detail} (TIDEGRAPH_LOG_LEVEL=DEBUG shows where)"
