"""Local Kafka and Neo4j for development and tests, without Docker (a tool of the checkout:
it needs the poms in ``deploy/local``, so it is not part of the installed product).

    python -m tests.support.local_services up|down|status     (or `make services-up`)

The jars come from Maven Central through the poms in ``deploy/local/{kafka,neo4j}`` (pinned
versions), are cached under ``LocalSettings.cache_dir`` and reused. Each service runs from the
machine's Java on loopback, with its state, pid file, ports and log under
``LocalSettings.services_dir`` (inside the checkout by default). Readiness is probed (a Kafka
metadata request, a Bolt ``RETURN 1``), never slept for.

A service is used only when this checkout started it (its pid file names a live process that
carries our marker): a Kafka or Neo4j that merely answers on the same port (another checkout's,
another program's) is never reused, so two checkouts on one machine never share or wipe each
other's data. With ``free_ports`` (the tests) a service that is not running starts on ports
that are free; otherwise on the configured ones, and a port held by someone else is an error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
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
START_TIMEOUT_SECONDS = 180.0
# The SASL user of the local broker's SASL_SSL listener (a development credential).
LOCAL_SASL_USERNAME = "tidegraph"
LOCAL_SASL_PASSWORD = "tidegraph-local"


SERVICES = ("kafka", "neo4j")
# Each service's ports, by role; the first is the one clients connect to.
PORT_ROLES = {"kafka": ("plain", "controller", "secure"), "neo4j": ("bolt",)}


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

    def configured_ports(self, name: str) -> dict[str, int]:
        if name == "kafka":
            return {
                "plain": self.local_kafka_port,
                "controller": self.local_kafka_controller_port,
                "secure": self.local_kafka_secure_port,
            }
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
                setting = {"plain": "KAFKA_PORT", "controller": "KAFKA_CONTROLLER_PORT"}.get(
                    role, {"secure": "KAFKA_SECURE_PORT"}.get(role, "NEO4J_BOLT_PORT")
                )
                raise ServiceError(
                    f"port {port} ({name} {role}) is held by a process this checkout did not "
                    f"start (another checkout's {name}?); stop it, or set "
                    f"TIDEGRAPH_LOCAL_{setting} to a free port"
                )
        return ports

    def jar_dir(self, name: str) -> Path:
        version = KAFKA_VERSION if name == "kafka" else NEO4J_VERSION
        return self.cache / "jars" / f"{name}-{version}"

    @property
    def kafka_address(self) -> str:
        return f"127.0.0.1:{self.ports('kafka')['plain']}"

    @property
    def neo4j_address(self) -> str:
        return f"bolt://127.0.0.1:{self.ports('neo4j')['bolt']}"

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
        """Copy the service's jars from Maven Central into the cache (once)."""
        target = self.jar_dir(name)
        marker = target / ".complete"
        if marker.exists():
            return target
        mvn = shutil.which("mvn")
        if mvn is None:
            raise ServiceError("Maven (mvn) is not on PATH: install it to fetch Kafka and Neo4j.")
        pom = POM_DIR / name / "pom.xml"
        if not pom.exists():
            raise ServiceError(f"{pom} is missing: run from a checkout of tidegraph.")
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        log.info("fetching %s jars from Maven Central into %s", name, target)
        cmd = [
            mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
            f"-DoutputDirectory={partial}", "-DincludeScope=runtime",
        ]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise ServiceError(
                f"fetching {name} with Maven failed (exit {result.returncode}):\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
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

    def _spawn(self, name: str, args: list[str], cwd: Path, ports: dict[str, int]) -> int:
        log_path = self.log_file(name)
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                [self._java(), f"-Dtidegraph.service={name}", *args],
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
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
        log4j = home / "log4j2.properties"
        log4j.write_text(
            "status = warn\n"
            "appender.out.type = Console\nappender.out.name = OUT\n"
            "appender.out.layout.type = PatternLayout\n"
            "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\nrootLogger.appenderRef.out.ref = OUT\n"
            "logger.kafka.name = org.apache.kafka\nlogger.kafka.level = WARN\n"
            "logger.server.name = kafka.server\nlogger.server.level = INFO\n"
        )
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

    # ------------------------------------------------------------------ probes
    def probe_kafka(self, timeout: float = 3.0) -> bool:
        return probe_kafka_sync(self.kafka_address, timeout)

    def probe_neo4j(self, timeout: float = 3.0) -> bool:
        return probe_neo4j(self.neo4j_address, timeout)

    def _probe(self, name: str) -> bool:
        return self.probe_kafka() if name == "kafka" else self.probe_neo4j()

    # ------------------------------------------------------------------ public API
    def status(self) -> list[ServiceStatus]:
        out = []
        for name, address in (("kafka", self.kafka_address), ("neo4j", self.neo4j_address)):
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
                starter = self._start_kafka if name == "kafka" else self._start_neo4j
                pending[name] = starter()
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

    def down(self, names: tuple[str, ...] = SERVICES) -> list[str]:
        """Stop the processes this tool started (by pid file); return the names stopped."""
        stopped = []
        for name in names:
            pid = self._read_pid(name)
            if pid is None:
                self.pid_file(name).unlink(missing_ok=True)
                continue
            os.killpg(pid, signal.SIGTERM)
            if not _wait_gone(pid, 60.0):
                os.killpg(pid, signal.SIGKILL)
                _wait_gone(pid, 10.0)
            self.pid_file(name).unlink(missing_ok=True)
            stopped.append(name)
        return stopped


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
) -> None:
    """Fetch (once) and start Kafka and Neo4j on loopback; a no-op for what already runs."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    _quiet_clients()
    names = tuple(n for n, on in (("kafka", kafka), ("neo4j", neo4j)) if on)
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
    """Stop the Kafka and Neo4j processes that `up` started from this checkout (pid files)."""
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
        typer.echo(f"{s.name:6} {s.address:28} pid {s.pid or '-':<8} {state:18} log {s.log}")


if __name__ == "__main__":
    cli()
