"""Local Kafka and Neo4j for development and tests, without Docker (a tool of the checkout:
it needs the poms in ``deploy/local``, so it is not part of the installed product); and, for
the tests of declared sources only, PostgreSQL with logical replication, Kafka Connect with
Debezium's PostgreSQL connector, and a schema registry (Apicurio Registry, which serves
Confluent's REST API).

    python -m tests.support.local_services up|down|status     (or `make services-up`)

The jars come from Maven Central through the poms in ``deploy/local/{kafka,neo4j,connect,
debezium,converter,registry}`` (pinned versions), are cached under ``LocalSettings.cache_dir``
and reused (the registry is Apicurio's own distribution, unpacked; the converter is Apicurio's
Connect plugin beside Debezium's). Each Java service runs from the machine's Java on loopback;
PostgreSQL runs from Debian's ``postgresql`` package (its server binary, as the ``postgres``
user when started by root) on a data folder of its own. Each keeps its state, pid file, ports
and log under ``LocalSettings.services_dir`` (inside the checkout by default). Readiness is
probed (a Kafka metadata request, a Bolt ``RETURN 1``, ``pg_isready``, Connect's plugin list
naming Debezium's connector, the registry's subject list), never slept for.

A service is used only when this checkout started it (its pid file names a live process that
carries our marker): a Kafka or Neo4j that merely answers on the same port (another checkout's,
another program's) is never reused, so two checkouts on one machine never share or wipe each
other's data. With ``free_ports`` (the tests) a service that is not running starts on ports
that are free; otherwise on the configured ones, and a port held by someone else is an error.
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import typer
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
POM_DIR = REPO_ROOT / "deploy" / "local"
KAFKA_VERSION = "4.3.1"
NEO4J_VERSION = "5.26.30"
# Built against Kafka 4.3.1 (deploy/local/debezium/pom.xml); one version for all its jars.
DEBEZIUM_VERSION = "3.7.0.Final"
DEBEZIUM_POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
# Apicurio Registry 3.0.9 runs on Java 17, the machine's Java (deploy/local/registry/pom.xml).
APICURIO_VERSION = "3.0.9"
# Where Apicurio Registry serves Confluent's schema-registry API, and its own (v2), which its
# Kafka Connect converters use.
CONFLUENT_API_PATH = "/apis/ccompat/v7"
APICURIO_V2_API_PATH = "/apis/registry/v2"
# The PostgreSQL superuser of the local server (trust authentication, loopback only).
LOCAL_POSTGRES_USER = "tidegraph"
START_TIMEOUT_SECONDS = 180.0
# The SASL user of the local broker's SASL_SSL listener (a development credential).
LOCAL_SASL_USERNAME = "tidegraph"
LOCAL_SASL_PASSWORD = "tidegraph-local"


# What `up` starts by default; the sources services start only for the tests that need them
# (or `up --sources`). `down` and `status` cover all of them; Connect stops before Kafka.
SERVICES = ("kafka", "neo4j")
SOURCE_SERVICES = ("postgres", "connect", "registry")
ALL_SERVICES = ("connect", "registry", "postgres", "kafka", "neo4j")
# Each service's ports, by role; the first is the one clients connect to.
PORT_ROLES = {
    "kafka": ("plain", "controller", "secure"),
    "neo4j": ("bolt",),
    "postgres": ("sql",),
    "connect": ("rest",),
    "registry": ("http",),
}
# The Debian package whose server binaries run the local PostgreSQL.
POSTGRES_BIN_GLOB = "/usr/lib/postgresql/*/bin"


class LocalSettings(BaseSettings):
    """Where the local services keep their state and which ports they take (``TIDEGRAPH_``
    environment variables, like the product's settings)."""

    model_config = SettingsConfigDict(env_prefix="TIDEGRAPH_", extra="ignore")

    cache_dir: Path = Field(
        Path.home() / ".cache" / "tidegraph",
        description="Where fetched Kafka/Neo4j jars are cached between runs.",
    )
    services_dir: Path = Field(
        Path(".tidegraph") / "services",
        description="State, data, ports and logs of locally started Kafka and Neo4j.",
    )
    local_kafka_port: int = Field(19092, description="Port of the local Kafka broker.")
    local_kafka_controller_port: int = Field(19093, description="Port of the local controller.")
    local_kafka_secure_port: int = Field(
        19094, description="Port of the local broker's SASL_SSL listener (tests of TLS/SASL)."
    )
    local_neo4j_bolt_port: int = Field(17687, description="Bolt port of the local Neo4j.")
    local_postgres_port: int = Field(15432, description="Port of the local PostgreSQL.")
    local_connect_port: int = Field(18083, description="REST port of the local Kafka Connect.")
    local_registry_port: int = Field(
        18081, description="HTTP port of the local schema registry (Apicurio Registry)."
    )

    def configured_ports(self, name: str) -> dict[str, int]:
        if name == "kafka":
            return {
                "plain": self.local_kafka_port,
                "controller": self.local_kafka_controller_port,
                "secure": self.local_kafka_secure_port,
            }
        if name == "postgres":
            return {"sql": self.local_postgres_port}
        if name == "connect":
            return {"rest": self.local_connect_port}
        if name == "registry":
            return {"http": self.local_registry_port}
        return {"bolt": self.local_neo4j_bolt_port}


class ServiceError(RuntimeError):
    """A local service could not be fetched or started; the message says what to look at."""


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    running: bool  # a process we started is alive
    ready: bool  # the probe answers
    pid: int | None
    address: str
    log: Path


class LocalServices:
    """Fetch, start, probe and stop the local Kafka broker and Neo4j server."""

    def __init__(self, settings: LocalSettings | None = None, *, free_ports: bool = False) -> None:
        """``free_ports``: a service that is not running starts on free ports (the tests)
        instead of the configured ones."""
        self.settings = settings or LocalSettings()
        self.root = self.settings.services_dir.resolve()
        self.cache = self.settings.cache_dir.resolve()
        self.free_ports = free_ports
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # ------------------------------------------------------------------ paths
    def _dir(self, name: str) -> Path:
        return self.root / name

    def pid_file(self, name: str) -> Path:
        return self._dir(name) / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self._dir(name) / f"{name}.log"

    def ports_file(self, name: str) -> Path:
        return self._dir(name) / "ports.json"

    def ports(self, name: str) -> dict[str, int]:
        """The ports of the service: those it was started on while it runs, else the ones it
        would be started on (configured)."""
        if self._read_pid(name) is not None:
            try:
                recorded = json.loads(self.ports_file(name).read_text())
                if set(recorded) == set(PORT_ROLES[name]):
                    return {role: int(port) for role, port in recorded.items()}
            except (FileNotFoundError, ValueError):
                pass
        return self.settings.configured_ports(name)

    def _choose_ports(self, name: str) -> dict[str, int]:
        """The ports to start ``name`` on: free ones (``free_ports``), or the configured ones
        when nothing holds them."""
        if self.free_ports:
            return {role: _free_port() for role in PORT_ROLES[name]}
        ports = self.settings.configured_ports(name)
        for role, port in ports.items():
            if not _port_free(port):
                setting = {
                    "plain": "KAFKA_PORT",
                    "controller": "KAFKA_CONTROLLER_PORT",
                    "secure": "KAFKA_SECURE_PORT",
                    "bolt": "NEO4J_BOLT_PORT",
                    "sql": "POSTGRES_PORT",
                    "rest": "CONNECT_PORT",
                    "http": "REGISTRY_PORT",
                }[role]
                raise ServiceError(
                    f"port {port} ({name} {role}) is held by a process this checkout did not "
                    f"start (another checkout's {name}?); stop it, or set "
                    f"TIDEGRAPH_LOCAL_{setting} to a free port"
                )
        return ports

    def jar_dir(self, name: str) -> Path:
        if name == "debezium":
            # A Connect plugin: a folder of its own inside the folder on plugin.path.
            return self.plugin_path / "debezium-connector-postgres"
        if name == "converter":
            # Apicurio Registry's Connect converters: a plugin of their own beside Debezium.
            return self.plugin_path / "apicurio-registry-converter"
        if name == "registry":
            return self.cache / "jars" / f"apicurio-registry-{APICURIO_VERSION}"
        version = NEO4J_VERSION if name == "neo4j" else KAFKA_VERSION
        return self.cache / "jars" / f"{name}-{version}"

    @property
    def plugin_path(self) -> Path:
        """The local Connect worker's plugin.path: Debezium's connector and Apicurio
        Registry's converters."""
        return self.cache / "jars" / f"connect-plugins-debezium-{DEBEZIUM_VERSION}"

    @property
    def kafka_address(self) -> str:
        return f"127.0.0.1:{self.ports('kafka')['plain']}"

    @property
    def neo4j_address(self) -> str:
        return f"bolt://127.0.0.1:{self.ports('neo4j')['bolt']}"

    @property
    def postgres_dsn(self) -> str:
        """The local PostgreSQL's ``postgres`` database as its superuser (libpq URI)."""
        return (
            f"postgresql://{LOCAL_POSTGRES_USER}@127.0.0.1:{self.ports('postgres')['sql']}/postgres"
        )

    @property
    def connect_url(self) -> str:
        """The local Kafka Connect worker's REST API."""
        return f"http://127.0.0.1:{self.ports('connect')['rest']}"

    @property
    def registry_url(self) -> str:
        """The local schema registry's Confluent-compatible API (a registry ``url`` for
        confluent-kafka's client and for a sources file)."""
        return f"http://127.0.0.1:{self.ports('registry')['http']}{CONFLUENT_API_PATH}"

    @property
    def kafka_secure_address(self) -> str:
        """The SASL_SSL listener (PLAIN user LOCAL_SASL_USERNAME, certificate ``ca_file``)."""
        return f"127.0.0.1:{self.ports('kafka')['secure']}"

    @property
    def tls_dir(self) -> Path:
        return self.root / "tls"

    @property
    def ca_file(self) -> Path:
        """The self-signed certificate of both local services (127.0.0.1 and localhost):
        the CA file a client trusts to reach their TLS listeners."""
        return self.tls_dir / "server.crt"

    def ensure_certificate(self) -> Path:
        """Create the local services' self-signed key and certificate once (openssl)."""
        key, cert = self.tls_dir / "server.key", self.ca_file
        if key.exists() and cert.exists():
            return self.tls_dir
        openssl = shutil.which("openssl")
        if openssl is None:
            raise ServiceError(
                "openssl is needed to create the local services' TLS certificate; install it "
                "(Debian: apt-get install openssl)"
            )
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        made = subprocess.run(
            [
                openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
                "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            ],
            capture_output=True, text=True,
        )  # fmt: skip
        if made.returncode != 0:
            raise ServiceError(f"openssl could not create the TLS certificate:\n{made.stderr}")
        # Kafka reads a PEM key store: the private key followed by the certificate chain.
        (self.tls_dir / "kafka-keystore.pem").write_text(key.read_text() + cert.read_text())
        return self.tls_dir

    # ------------------------------------------------------------------ fetch
    def fetch(self, name: str) -> Path:
        """Copy the service's jars from Maven Central into the cache (once); the registry's
        distribution is unpacked there instead."""
        target = self.jar_dir(name)
        marker = target / ".complete"
        if marker.exists():
            return target
        mvn = shutil.which("mvn")
        if mvn is None:
            raise ServiceError(f"Maven (mvn) is not on PATH: install it to fetch {name}.")
        pom = POM_DIR / name / "pom.xml"
        if not pom.exists():
            raise ServiceError(f"{pom} is missing: run from a checkout of tidegraph.")
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        log.info("fetching %s jars from Maven Central into %s", name, target)
        if name == "registry":
            # The artifact named in the pom, unpacked (its markers kept out of the checkout).
            goal = ["dependency:unpack", f"-DmarkersDirectory={partial}.markers"]
        else:
            goal = ["dependency:copy-dependencies", "-DincludeScope=runtime"]
        cmd = [mvn, "-B", "-q", "-f", str(pom), *goal, f"-DoutputDirectory={partial}"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise ServiceError(
                f"fetching {name} with Maven failed (exit {result.returncode}):\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        shutil.rmtree(f"{partial}.markers", ignore_errors=True)
        (partial / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        return target

    # ------------------------------------------------------------------ processes
    def _read_pid(self, name: str) -> int | None:
        try:
            pid = int(self.pid_file(name).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        cmdline = ""
        for _ in range(20):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except FileNotFoundError:
                return None
            if cmdline:
                break
            time.sleep(0.05)  # cmdline reads empty while the java launcher re-executes itself
        # Guard against a recycled pid: only a process we started carries our marker.
        return pid if f"tidegraph.service={name}" in cmdline else None

    def _java(self) -> str:
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
        if not java or not Path(java).exists():
            raise ServiceError("Java 17+ is needed to run Kafka and Neo4j: none found on PATH.")
        return java

    def _spawn(
        self,
        name: str,
        args: list[str],
        cwd: Path,
        ports: dict[str, int],
        *,
        command: list[str] | None = None,
        user: str | None = None,
    ) -> int:
        """Start the service in a session of its own. ``command`` (default: Java with our
        marker) is what runs; it must carry ``tidegraph.service=NAME`` (the pid file's guard)."""
        log_path = self.log_file(name)
        cmd = command if command is not None else [self._java(), f"-Dtidegraph.service={name}"]
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                [*cmd, *args],
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                user=user,
            )
        self.ports_file(name).write_text(json.dumps(ports))
        self.pid_file(name).write_text(str(proc.pid))
        self._procs[name] = proc
        return proc.pid

    def _exited(self, name: str) -> bool:
        proc = self._procs.get(name)
        if proc is not None:
            return proc.poll() is not None
        return self._read_pid(name) is None

    # ------------------------------------------------------------------ kafka
    def _start_kafka(self) -> int:
        jars = self.fetch("kafka")
        home = self._dir("kafka")
        home.mkdir(parents=True, exist_ok=True)
        data = home / "data"
        ports = self._choose_ports("kafka")
        port, cport, sport = ports["plain"], ports["controller"], ports["secure"]
        keystore = self.ensure_certificate() / "kafka-keystore.pem"
        jaas = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_{LOCAL_SASL_USERNAME}="{LOCAL_SASL_PASSWORD}";'
        )
        props = home / "server.properties"
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{cport}",
                    f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport},"
                    f"SASL_SSL://127.0.0.1:{sport}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{port},"
                    f"SASL_SSL://127.0.0.1:{sport}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
                    "SASL_SSL:SASL_SSL",
                    # A SASL_SSL listener (PLAIN, self-signed certificate) for testing the
                    # clients' TIDEGRAPH_KAFKA_SECURITY_PROTOCOL/SASL/SSL settings.
                    "sasl.enabled.mechanisms=PLAIN",
                    "listener.name.sasl_ssl.sasl.enabled.mechanisms=PLAIN",
                    f"listener.name.sasl_ssl.plain.sasl.jaas.config={jaas}",
                    "listener.name.sasl_ssl.ssl.keystore.type=PEM",
                    f"listener.name.sasl_ssl.ssl.keystore.location={keystore}",
                    f"log.dirs={data}",
                    "num.partitions=1",
                    "auto.create.topics.enable=true",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=8",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "log.retention.hours=24",
                    "",
                ]
            )
        )
        log4j = _write_log4j(home, {"server": ("kafka.server", "INFO")})
        classpath = f"{jars}/*"
        if not (data / "meta.properties").exists():
            cluster_id = _kafka_cluster_id()
            fmt = subprocess.run(
                [
                    self._java(), "-cp", classpath, f"-Dlog4j2.configurationFile={log4j}",
                    "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props),
                ],
                capture_output=True, text=True,
            )  # fmt: skip
            if fmt.returncode != 0:
                raise ServiceError(
                    f"formatting Kafka storage failed:\n{fmt.stdout[-2000:]}{fmt.stderr[-2000:]}"
                )
        return self._spawn(
            "kafka",
            [
                "-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={log4j}", f"-Dkafka.logs.dir={home}",
                "-cp", classpath, "kafka.Kafka", str(props),
            ],
            cwd=home,
            ports=ports,
        )  # fmt: skip

    # ------------------------------------------------------------------ neo4j
    def _start_neo4j(self) -> int:
        jars = self.fetch("neo4j")
        home = self._dir("neo4j")
        conf = home / "conf"
        for sub in ("conf", "data", "logs", "plugins", "import", "run"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        ports = self._choose_ports("neo4j")
        port = ports["bolt"]
        tls = self.ensure_certificate()
        (conf / "neo4j.conf").write_text(
            "\n".join(
                [
                    "server.default_listen_address=127.0.0.1",
                    f"server.bolt.listen_address=127.0.0.1:{port}",
                    f"server.bolt.advertised_address=127.0.0.1:{port}",
                    "server.http.enabled=false",
                    "server.https.enabled=false",
                    # Bolt takes plain and TLS connections (self-signed certificate), so the
                    # driver's TIDEGRAPH_NEO4J_CA_FILE setting can be tested locally.
                    "server.bolt.tls_level=OPTIONAL",
                    "dbms.ssl.policy.bolt.enabled=true",
                    f"dbms.ssl.policy.bolt.base_directory={tls}",
                    "dbms.ssl.policy.bolt.private_key=server.key",
                    "dbms.ssl.policy.bolt.public_certificate=server.crt",
                    "dbms.ssl.policy.bolt.client_auth=NONE",
                    "dbms.usage_report.enabled=false",
                    "dbms.security.auth_enabled=false",
                    "server.memory.pagecache.size=256m",
                    # no recv-timeout hint for the driver (docs/operations.md "Neo4j for
                    # searches")
                    "server.bolt.connection_keep_alive_for_requests=STREAMING",
                    "db.tx_log.rotation.retention_policy=2 files",
                    f"server.directories.data={home / 'data'}",
                    f"server.directories.logs={home / 'logs'}",
                    f"server.directories.plugins={home / 'plugins'}",
                    f"server.directories.import={home / 'import'}",
                    f"server.directories.run={home / 'run'}",
                    "",
                ]
            )
        )
        return self._spawn(
            "neo4j",
            [
                "-Xms512m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                "--add-opens=java.base/java.nio=ALL-UNNAMED",
                "--add-opens=java.base/java.io=ALL-UNNAMED",
                "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
                "--add-opens=java.base/java.lang=ALL-UNNAMED",
                "--add-opens=java.base/java.util=ALL-UNNAMED",
                "-cp", f"{jars}/*",
                "org.neo4j.server.CommunityEntryPoint",
                f"--home-dir={home}", f"--config-dir={conf}", "--console-mode",
            ],
            cwd=home,
            ports=ports,
        )  # fmt: skip

    # ------------------------------------------------------------------ postgres
    def _postgres_bin(self) -> Path:
        """The newest server binaries of Debian's ``postgresql`` package."""
        found = sorted(
            (Path(p) for p in glob.glob(POSTGRES_BIN_GLOB) if (Path(p) / "postgres").exists()),
            key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        )
        if not found:
            raise ServiceError(
                "PostgreSQL's server is not installed (no /usr/lib/postgresql/*/bin/postgres); "
                "install Debian's package: apt-get install postgresql"
            )
        return found[-1]

    def _postgres_user(self) -> str | None:
        """The user the server runs as: ``postgres`` when we are root (PostgreSQL refuses to
        run as root), else ourselves."""
        return "postgres" if os.geteuid() == 0 else None

    def postgres_home(self) -> Path:
        """Where the server's data folder lives: in the services folder; or, when root starts
        it as the ``postgres`` user, who may not be let into the checkout (a home folder of
        mode 700), in a folder of its own under the system's temporary folder, named after
        this checkout's services folder."""
        if self._postgres_user() is None:
            return self._dir("postgres")
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"tidegraph-postgres-{digest}"

    def _start_postgres(self) -> int:
        bin_dir = self._postgres_bin()
        home = self.postgres_home()
        home.mkdir(parents=True, exist_ok=True)
        data = home / "data"
        user = self._postgres_user()
        if user is not None:
            shutil.chown(home, user, user)
            home.chmod(0o700)
        if not (data / "PG_VERSION").exists():
            shutil.rmtree(data, ignore_errors=True)
            init = subprocess.run(
                [
                    str(bin_dir / "initdb"), "-D", str(data), "-U", LOCAL_POSTGRES_USER,
                    "--auth=trust", "-E", "UTF8", "--no-locale",
                ],
                capture_output=True, text=True, user=user, cwd=home,
            )  # fmt: skip
            if init.returncode != 0:
                raise ServiceError(
                    f"initdb of the local PostgreSQL failed:\n{init.stdout[-2000:]}"
                    f"{init.stderr[-2000:]}"
                )
        ports = self._choose_ports("postgres")
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(ports["sql"]),
            "unix_socket_directories": "",  # loopback TCP only
            # Debezium reads the write-ahead log through logical decoding (pgoutput).
            "wal_level": "logical",
            "max_replication_slots": "20",
            "max_wal_senders": "20",
            "fsync": "off",  # a throwaway test database
            "tidegraph.service": "postgres",  # the pid file's guard (a custom setting)
        }
        args = [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]
        return self._spawn(
            "postgres",
            ["-D", str(data), *args],
            cwd=home,
            ports=ports,
            command=[str(bin_dir / "postgres")],
            user=user,
        )

    def probe_postgres(self, timeout: float = 3.0) -> bool:
        try:
            bin_dir = self._postgres_bin()
        except ServiceError:
            return False
        ready = subprocess.run(
            [
                str(bin_dir / "pg_isready"), "-q", "-h", "127.0.0.1",
                "-p", str(self.ports("postgres")["sql"]), "-t", str(max(1, int(timeout))),
            ],
            capture_output=True,
        )  # fmt: skip
        return ready.returncode == 0

    # ------------------------------------------------------------------ connect
    def _start_connect(self) -> int:
        if self._read_pid("kafka") is None or not self.probe_kafka():
            raise ServiceError("Kafka Connect needs this checkout's Kafka: start kafka first")
        jars = self.fetch("connect")
        self.fetch("debezium")
        self.fetch("converter")
        home = self._dir("connect")
        home.mkdir(parents=True, exist_ok=True)
        ports = self._choose_ports("connect")
        port = ports["rest"]
        props = home / "connect-distributed.properties"
        props.write_text(
            "\n".join(
                [
                    f"bootstrap.servers={self.kafka_address}",
                    "group.id=tidegraph-local-connect",
                    f"listeners=http://127.0.0.1:{port}",
                    "rest.advertised.host.name=127.0.0.1",
                    f"rest.advertised.port={port}",
                    f"plugin.path={self.plugin_path}",
                    "plugin.discovery=only_scan",
                    "key.converter=org.apache.kafka.connect.json.JsonConverter",
                    "value.converter=org.apache.kafka.connect.json.JsonConverter",
                    "config.storage.topic=_tidegraph_connect_configs",
                    "offset.storage.topic=_tidegraph_connect_offsets",
                    "status.storage.topic=_tidegraph_connect_status",
                    "config.storage.replication.factor=1",
                    "offset.storage.replication.factor=1",
                    "status.storage.replication.factor=1",
                    "offset.flush.interval.ms=1000",
                    "",
                ]
            )
        )
        log4j = _write_log4j(
            home,
            {
                "connect": ("org.apache.kafka.connect.runtime", "INFO"),
                "reflections": ("org.reflections", "ERROR"),
            },
        )
        return self._spawn(
            "connect",
            [
                "-Xms128m", "-Xmx512m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={log4j}", f"-Dkafka.logs.dir={home}",
                "-cp", f"{jars}/*",
                "org.apache.kafka.connect.cli.ConnectDistributed", str(props),
            ],
            cwd=home,
            ports=ports,
        )  # fmt: skip

    def probe_connect(self, timeout: float = 3.0) -> bool:
        """True when the worker's REST API answers and lists Debezium's connector."""
        return probe_connect(self.connect_url, timeout)

    # ------------------------------------------------------------------ registry
    def _start_registry(self) -> int:
        home = self.fetch("registry")
        self._dir("registry").mkdir(parents=True, exist_ok=True)
        ports = self._choose_ports("registry")
        runner = home / f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
        return self._spawn(
            "registry",
            [
                "-Xms128m", "-Xmx512m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                # The quick compiler alone: ready in about half the time on two busy cores
                # (the optimising compiler's threads compete with the start).
                "-XX:TieredStopAtLevel=1",
                "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={ports['http']}",
                # Storage: H2 in memory (the default); no access log line per request.
                "-Dquarkus.http.access-log.enabled=false",
                "-jar", str(runner),
            ],
            cwd=self._dir("registry"),
            ports=ports,
        )  # fmt: skip

    def probe_registry(self, timeout: float = 3.0) -> bool:
        return probe_registry(self.registry_url, timeout)

    # ------------------------------------------------------------------ probes
    def probe_kafka(self, timeout: float = 3.0) -> bool:
        return probe_kafka_sync(self.kafka_address, timeout)

    def probe_neo4j(self, timeout: float = 3.0) -> bool:
        return probe_neo4j(self.neo4j_address, timeout)

    def _probe(self, name: str) -> bool:
        probes = {
            "kafka": self.probe_kafka,
            "neo4j": self.probe_neo4j,
            "postgres": self.probe_postgres,
            "connect": self.probe_connect,
            "registry": self.probe_registry,
        }
        return probes[name]()

    def address(self, name: str) -> str:
        addresses = {
            "kafka": lambda: self.kafka_address,
            "neo4j": lambda: self.neo4j_address,
            "postgres": lambda: self.postgres_dsn,
            "connect": lambda: self.connect_url,
            "registry": lambda: self.registry_url,
        }
        return addresses[name]()

    # ------------------------------------------------------------------ public API
    def status(self) -> list[ServiceStatus]:
        out = []
        for name in ALL_SERVICES:
            address = self.address(name)
            pid = self._read_pid(name)
            ready = pid is not None and self._probe(name)  # only ours counts
            out.append(
                ServiceStatus(name, pid is not None, ready, pid, address, self.log_file(name))
            )
        return out

    def up(self, names: tuple[str, ...] = SERVICES) -> dict[str, bool]:
        """Start what this checkout does not run yet (a service answering on a port but not
        started from here is never used); return {name: started_by_this_call}."""
        started: dict[str, bool] = {}
        pending: dict[str, int] = {}
        for name in names:
            self._dir(name).mkdir(parents=True, exist_ok=True)
            pid = self._read_pid(name)
            if pid is not None and self._probe(name):
                started[name] = False
                continue
            if pid is None:
                starters = {
                    "kafka": self._start_kafka,
                    "neo4j": self._start_neo4j,
                    "postgres": self._start_postgres,
                    "connect": self._start_connect,
                    "registry": self._start_registry,
                }
                pending[name] = starters[name]()
            else:
                pending[name] = pid  # ours, still starting
            started[name] = True
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while pending:
            for name in list(pending):
                if self._probe(name):
                    log.info("%s is ready", name)
                    del pending[name]
                elif self._exited(name):
                    raise ServiceError(
                        f"{name} exited while starting; see its log: {self.log_file(name)}\n"
                        + _tail(self.log_file(name))
                    )
            if pending and time.monotonic() > deadline:
                name = next(iter(pending))
                raise ServiceError(
                    f"{name} did not become ready in {START_TIMEOUT_SECONDS:.0f}s; "
                    f"see its log: {self.log_file(name)}\n" + _tail(self.log_file(name))
                )
            if pending:
                time.sleep(0.5)  # polling interval between probes, not a synchronisation
        return started

    def down(self, names: tuple[str, ...] = ALL_SERVICES) -> list[str]:
        """Stop the processes this tool started (by pid file); return the names stopped."""
        stopped = []
        for name in sorted(names, key=ALL_SERVICES.index):  # Connect before Kafka
            pid = self._read_pid(name)
            if pid is None:
                self.pid_file(name).unlink(missing_ok=True)
                continue
            # PostgreSQL's "fast" shutdown is SIGINT (SIGTERM waits for every client to
            # leave, Debezium's replication connection included).
            os.killpg(pid, signal.SIGINT if name == "postgres" else signal.SIGTERM)
            if not _wait_gone(pid, 60.0):
                os.killpg(pid, signal.SIGKILL)
                _wait_gone(pid, 10.0)
            self.pid_file(name).unlink(missing_ok=True)
            stopped.append(name)
        return stopped


def _write_log4j(home: Path, loggers: dict[str, tuple[str, str]]) -> Path:
    """A Kafka or Connect process's log4j2 configuration: INFO to the console, Kafka's own
    classes at WARN, and ``loggers`` (id -> (logger name, level)) as given."""
    lines = [
        "status = warn",
        "appender.out.type = Console",
        "appender.out.name = OUT",
        "appender.out.layout.type = PatternLayout",
        "appender.out.layout.pattern = [%d] %p %m (%c)%n",
        "rootLogger.level = INFO",
        "rootLogger.appenderRef.out.ref = OUT",
        "logger.kafka.name = org.apache.kafka",
        "logger.kafka.level = WARN",
    ]
    for key, (name, level) in loggers.items():
        lines += [f"logger.{key}.name = {name}", f"logger.{key}.level = {level}"]
    path = home / "log4j2.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


def _free_port() -> int:
    """A port nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _kafka_cluster_id() -> str:
    """A 22-character base64url cluster id, as ``kafka-storage random-uuid`` prints: never
    starting with '-', which the storage tool would read as an option (as Kafka's own
    generator avoids)."""
    import base64

    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.2)
    return False


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


async def probe_kafka(bootstrap: str, timeout: float = 3.0) -> bool:
    """True when the broker answers a metadata request."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout)
        await asyncio.wait_for(admin.list_topics(), timeout)
        return True
    except Exception:
        return False
    finally:
        try:
            await admin.close()
        except Exception:
            pass


def probe_kafka_sync(bootstrap: str, timeout: float = 3.0) -> bool:
    """``probe_kafka`` from synchronous code, even when an event loop runs in this thread."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, probe_kafka(bootstrap, timeout)).result()


def probe_connect(url: str, timeout: float = 3.0) -> bool:
    """True when a Kafka Connect worker answers at ``url`` and lists Debezium's PostgreSQL
    connector among its plugins."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/connector-plugins", timeout=timeout) as response:
            plugins = json.loads(response.read())
    except Exception:
        return False
    return any(p.get("class") == DEBEZIUM_POSTGRES_CONNECTOR for p in plugins)


def probe_registry(url: str, timeout: float = 3.0) -> bool:
    """True when a schema registry answers Confluent's subject list at ``url``."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=timeout) as response:
            return isinstance(json.loads(response.read()), list)
    except Exception:
        return False


def probe_neo4j(uri: str, timeout: float = 3.0, auth: tuple[str, str] | None = None) -> bool:
    """True when Neo4j answers ``RETURN 1`` over Bolt."""
    from neo4j import GraphDatabase

    try:
        with GraphDatabase.driver(
            uri, auth=auth, connection_timeout=timeout, max_transaction_retry_time=0
        ) as driver:
            with driver.session() as session:
                record = session.run("RETURN 1 AS ok").single()
                return record is not None and record["ok"] == 1
    except Exception:
        return False


# ----------------------------------------------------------------------------- command
cli = typer.Typer(
    help="Local Kafka and Neo4j for development and tests (no Docker): "
    "python -m tests.support.local_services up|down|status",
    no_args_is_help=True,
    add_completion=False,
)


@cli.command("up")
def _up(
    kafka: bool = typer.Option(True, help="Start Kafka."),
    neo4j: bool = typer.Option(True, help="Start Neo4j."),
    sources: bool = typer.Option(
        False,
        help="Also start PostgreSQL, Kafka Connect with Debezium (needs Kafka) and the schema "
        "registry.",
    ),
) -> None:
    """Fetch (once) and start Kafka and Neo4j on loopback; a no-op for what already runs."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    _quiet_clients()
    names = tuple(n for n, on in (("kafka", kafka), ("neo4j", neo4j)) if on)
    if sources:
        names += SOURCE_SERVICES
    services = LocalServices()
    try:
        started = services.up(names)
    except ServiceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    for name, was_started in started.items():
        typer.echo(f"{name}: {'started' if was_started else 'already running'}")
    _print_status(services)


@cli.command("down")
def _down() -> None:
    """Stop the processes that `up` started from this checkout (pid files)."""
    stopped = LocalServices().down()
    typer.echo(f"stopped: {', '.join(stopped) if stopped else 'nothing (none running)'}")


@cli.command("status")
def _status() -> None:
    """Whether this checkout's services run and answer their probes."""
    _quiet_clients()
    _print_status(LocalServices())


def _quiet_clients() -> None:
    """The probes expect refusals while a service starts: the clients' own error logs of them
    ("Unable connect to ...") would only be noise on the terminal."""
    for name in ("aiokafka", "neo4j"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _print_status(services: LocalServices) -> None:
    for s in services.status():
        state = "ready" if s.ready else ("starting or stuck" if s.running else "not running")
        typer.echo(f"{s.name:8} {s.address:48} pid {s.pid or '-':<8} {state:18} log {s.log}")


if __name__ == "__main__":
    cli()
