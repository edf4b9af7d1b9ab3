"""How tidegraph connects to Kafka and Neo4j: addresses plus TLS / SASL, from ``Settings``.

Every Kafka client tidegraph opens (the Faust worker, the admin client that creates topics,
the producer of ``tidegraph produce``, the dead-letter reader) and the Neo4j driver take their
security options from here, so one set of ``TIDEGRAPH_KAFKA_*`` / ``TIDEGRAPH_NEO4J_*``
variables configures all of them.

    kafka = KafkaConnection.from_settings(settings)
    AIOKafkaProducer(**kafka.client_options(), acks="all")
    faust.App(..., broker=kafka.faust_brokers(), broker_credentials=kafka.faust_credentials())
    AsyncGraphDatabase.driver(uri, auth=..., **NEO4J_NOTIFICATIONS,
                              **neo4j_driver_options(settings))
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidegraph.settings import KafkaSaslMechanism, KafkaSecurityProtocol

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT

    from tidegraph.settings import Settings


# The notifications Neo4j is asked not to send (every driver the store opens): UNRECOGNIZED
# ones name a label, relationship type or property key the database has never held, which on a
# fresh database every read filtering on a property no node has yet (``forgotten_at``,
# ``aliases``, ``content_hash``, ...) raised, once per query. Every other class (deprecations,
# performance, hints, security, ...) still reaches the log through ``neo4j.notifications``.
NEO4J_NOTIFICATIONS: dict[str, Any] = {"notifications_disabled_classifications": ["UNRECOGNIZED"]}


class ConnectionSettingsError(ValueError):
    """The TLS/SASL settings do not fit together (the message names the variables)."""


def bootstrap_list(servers: str) -> list[str]:
    return [s.strip() for s in servers.split(",") if s.strip()]


@dataclass(frozen=True)
class KafkaConnection:
    """Bootstrap servers and the security options every Kafka client of tidegraph uses."""

    bootstrap_servers: str
    security_protocol: KafkaSecurityProtocol = "PLAINTEXT"
    sasl_mechanism: KafkaSaslMechanism = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: str | None = None
    ssl_check_hostname: bool = True

    @classmethod
    def from_settings(cls, settings: Settings) -> KafkaConnection:
        password = settings.kafka_sasl_password
        key_password = settings.kafka_ssl_key_password
        connection = cls(
            bootstrap_servers=settings.kafka_bootstrap_servers,
            security_protocol=settings.kafka_security_protocol,
            sasl_mechanism=settings.kafka_sasl_mechanism,
            sasl_username=settings.kafka_sasl_username,
            sasl_password=None if password is None else password.get_secret_value(),
            ssl_cafile=settings.kafka_ssl_cafile,
            ssl_certfile=settings.kafka_ssl_certfile,
            ssl_keyfile=settings.kafka_ssl_keyfile,
            ssl_key_password=None if key_password is None else key_password.get_secret_value(),
            ssl_check_hostname=settings.kafka_ssl_check_hostname,
        )
        connection.check()
        return connection

    @classmethod
    def plain(cls, bootstrap_servers: str) -> KafkaConnection:
        return cls(bootstrap_servers=bootstrap_servers)

    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def check(self) -> None:
        """Raise ConnectionSettingsError when the settings cannot work together."""
        if self.uses_sasl and not (self.sasl_username and self.sasl_password):
            raise ConnectionSettingsError(
                f"TIDEGRAPH_KAFKA_SECURITY_PROTOCOL={self.security_protocol} needs "
                "TIDEGRAPH_KAFKA_SASL_USERNAME and TIDEGRAPH_KAFKA_SASL_PASSWORD"
            )
        tls_files = (self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile)
        if not self.uses_ssl and any(tls_files):
            raise ConnectionSettingsError(
                "TIDEGRAPH_KAFKA_SSL_* files are set but TIDEGRAPH_KAFKA_SECURITY_PROTOCOL="
                f"{self.security_protocol} does not use TLS; set it to SSL or SASL_SSL"
            )
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ConnectionSettingsError(
                "a Kafka client certificate needs both TIDEGRAPH_KAFKA_SSL_CERTFILE and "
                "TIDEGRAPH_KAFKA_SSL_KEYFILE"
            )
        for name, path in (
            ("TIDEGRAPH_KAFKA_SSL_CAFILE", self.ssl_cafile),
            ("TIDEGRAPH_KAFKA_SSL_CERTFILE", self.ssl_certfile),
            ("TIDEGRAPH_KAFKA_SSL_KEYFILE", self.ssl_keyfile),
        ):
            if path is not None and not Path(path).is_file():
                raise ConnectionSettingsError(f"{name}={path}: no such file")

    @property
    def bootstrap(self) -> list[str]:
        return bootstrap_list(self.bootstrap_servers)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context: system CAs, or the CA file; with the client certificate
        when one is configured (mutual TLS)."""
        if not self.uses_ssl:
            return None
        context = ssl.create_default_context(
            purpose=ssl.Purpose.SERVER_AUTH,
            cafile=None if self.ssl_cafile is None else str(self.ssl_cafile),
        )
        context.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile is not None and self.ssl_keyfile is not None:
            context.load_cert_chain(
                str(self.ssl_certfile), str(self.ssl_keyfile), password=self.ssl_key_password
            )
        return context

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka's producer, consumer and admin client."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.security_protocol,
        }
        if self.uses_ssl:
            options["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = self.sasl_password
        return options

    def faust_brokers(self) -> list[str]:
        return [f"kafka://{server}" for server in self.bootstrap]

    def faust_credentials(self) -> CredentialsT | None:
        """``broker_credentials`` for the Faust app (None = plaintext)."""
        from faust.auth import SASLCredentials, SSLCredentials

        if self.uses_sasl:
            return SASLCredentials(
                username=self.sasl_username,
                password=self.sasl_password,
                mechanism=self.sasl_mechanism,
                ssl_context=self.ssl_context(),  # SASL_SSL when a context is given
            )
        if self.uses_ssl:
            context = self.ssl_context()
            assert context is not None
            return SSLCredentials(context)
        return None


def as_kafka_connection(target: str | KafkaConnection) -> KafkaConnection:
    """Accept a bare bootstrap string (plaintext, tests and local tools) or a connection."""
    return target if isinstance(target, KafkaConnection) else KafkaConnection.plain(target)


def neo4j_driver_options(settings: Settings) -> dict[str, Any]:
    """TLS options for the Neo4j driver.

    ``neo4j+s://`` (system CAs) and ``neo4j+ssc://`` URIs carry their own TLS choice; a
    private CA is given with TIDEGRAPH_NEO4J_CA_FILE on a ``bolt://`` or ``neo4j://`` URI."""
    ca_file = settings.neo4j_ca_file
    if ca_file is None:
        return {}
    scheme = settings.neo4j_uri.split("://", 1)[0].lower()
    if "+" in scheme:
        raise ConnectionSettingsError(
            f"TIDEGRAPH_NEO4J_CA_FILE is set but TIDEGRAPH_NEO4J_URI uses {scheme}://, which "
            "chooses its own certificate trust; use bolt:// or neo4j:// with a CA file"
        )
    if not Path(ca_file).is_file():
        raise ConnectionSettingsError(f"TIDEGRAPH_NEO4J_CA_FILE={ca_file}: no such file")
    from neo4j import TrustCustomCAs

    return {"encrypted": True, "trusted_certificates": TrustCustomCAs(str(ca_file))}


def quiet_neo4j_driver_logs() -> None:
    """The Neo4j driver's loggers at the level where what they say is news to an operator:
    it logs every schema "already exists" notice at INFO (``neo4j.notifications``); a managed
    transaction retried after a transient error (two writers deadlocked, a leader moving) as
    a WARNING before it retries (``neo4j.session``); every broken connection at ERROR before
    it raises the same error (``neo4j.io``). What does not succeed within the driver's retry
    time reaches the caller, which says it once: a record's failure, or an outage
    (docs/streaming.md "When the store is down")."""
    logging.getLogger("neo4j.notifications").setLevel(logging.WARNING)
    logging.getLogger("neo4j.session").setLevel(logging.ERROR)
    logging.getLogger("neo4j.io").setLevel(logging.CRITICAL)
