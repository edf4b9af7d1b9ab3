"""Search over HTTP under load: requests/s and p50/p99 latency of ``POST /v1/search`` at 10 and
100 concurrent clients, and the server's memory (docs/serving.md "Serving memory to agents").

The server is the real ``tidegraph serve`` in its own process on loopback (its RSS read from
/proc), over the configured store (``TIDEGRAPH_STORE``; the embedded default in a temporary
folder), or with ``--in-memory`` over the in-memory store with exact search methods
(tests/integration/serve_harness.py: for comparing the HTTP layer alone, and until the real
stores have their search methods). It is seeded through ``POST /v1/episodes`` (CRM plan
records, mapped without an LLM, and chat messages), then, after ``--warmup`` unmeasured
searches (the server's first searches fill its caches: each reader connection's matrices of
the group's vectors), each concurrency level sends ``--requests`` searches (bounded) of
varied queries.

    python -m benchmarks.serve_load                       # embedded default
    python -m benchmarks.serve_load --in-memory --requests 2000
    python -m benchmarks.serve_load --route facts          # the HTTP layer over one store read
    TIDEGRAPH_STORE=neo4j python -m benchmarks.serve_load
    python -m benchmarks.serve_load --noisy                # one tenant slowing the others?
    python -m benchmarks.serve_load --noisy --server-path /tmp/old-tree   # another checkout

``--noisy`` measures what one tenant's load does to another's: tenant B reads ``GET
/v1/facts`` one after another (and ``/healthz`` is probed) while tenant A sends, in turn,
searches with a 100-character time phrase (40 clients), reads waiting on tokens never
written (100 clients, one read each) and slow-header connections (300, one byte a second).
``--server-path`` runs the server from another source tree (PYTHONPATH), for before/after.

With ``--facts N`` (and ``--episodes M``) the group is instead the synthetic one of
benchmarks/recall_latency.py (N facts between N/5 entities, M episodes; written straight
through the store before the server starts, hashing embeddings) and the queries are 2-4 of its
words, as there:

    python -m benchmarks.serve_load --facts 10000 --episodes 10000 --clients 10
    TIDEGRAPH_STORE=neo4j python -m benchmarks.serve_load --facts 100000 --keep --clients 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

KEY = "bench-key-0123456789"
GROUP = "bench"
KEY_B = "bench-key-b-0123456789"  # the other tenant of --noisy
GROUP_B = "bench-b"
PLANS = ["Free", "Basic", "Pro", "Business", "Enterprise"]
QUERIES = [
    "which plan is {a} on?",
    "{a} plan",
    "who talked about the renewal of {a}",
    "invoice problems at {a}",
    "{a} enterprise upgrade",
]


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values["VmRSS"], values["VmHWM"]


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) a process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(
    port: int, data: Path, in_memory: bool, server_path: str | None = None
) -> subprocess.Popen[bytes]:
    keys = f'{{"{KEY}": ["{GROUP}"], "{KEY_B}": ["{GROUP_B}"]}}'
    env = {**os.environ, "TIDEGRAPH_API_KEYS": keys}
    if server_path:
        env["PYTHONPATH"] = server_path
    env.setdefault("TIDEGRAPH_DATA_DIR", str(data))
    env.setdefault("TIDEGRAPH_EMBEDDER", "hashing")
    env.setdefault("TIDEGRAPH_LOG_LEVEL", "ERROR")
    mapping = data / "mapping.yaml"
    from tests.support.crm_feed import CRM_MAPPING

    mapping.write_text(CRM_MAPPING)
    env["TIDEGRAPH_MAPPINGS"] = str(mapping)
    if in_memory:
        command = [sys.executable, "-m", "benchmarks.serve_load", "--serve-in-memory", str(port)]
    else:
        tidegraph = str(Path(sys.executable).with_name("tidegraph"))
        command = [tidegraph, "serve", "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)


async def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"the server exited with {process.returncode}")
            try:
                if (await http.get(f"{url}/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise SystemExit("the server did not get ready")


async def seed(http: httpx.AsyncClient, accounts: int) -> list[str]:
    names = [f"Account {n:03d}" for n in range(accounts)]
    start = datetime(2025, 1, 1, tzinfo=UTC)
    for n, name in enumerate(names):
        for step, plan in enumerate(random.Random(n).sample(PLANS, 3)):
            at = start + timedelta(days=30 * step + n % 30)
            record = {"type": "account.plan", "account": {"id": n, "name": name}, "plan": plan,
                      "at": at.isoformat()}  # fmt: skip
            body = {"content": record, "source": "json", "reference_time": at.isoformat()}
            (await http.post("/v1/episodes", json=body)).raise_for_status()
        note = f"Dana talked with {name} about the renewal and an invoice problem"
        body = {"content": note, "reference_time": (start + timedelta(days=n)).isoformat()}
        (await http.post("/v1/episodes", json=body)).raise_for_status()
    return names


async def seed_synthetic(data: Path, facts: int, episodes: int | None, keep: bool) -> list[str]:
    """The synthetic group of recall_latency written into the configured store as GROUP (kept
    with ``keep`` on Neo4j, and reused when there); its query words."""
    from benchmarks.recall_latency import DIM, FACTS_PER_EPISODE, _id, build_group, vocabulary
    from tidegraph.settings import Settings
    from tidegraph.stores import open_store

    store = open_store(Settings(data_dir=data, embedding_dim=DIM))
    try:
        await store.setup(DIM)
        per = FACTS_PER_EPISODE if episodes is None else max(1, -(-facts // episodes))
        last = _id(GROUP, "ep", (facts - 1) // per * per)
        if not (keep and await store.episode_status(GROUP, last) == "processed"):
            await store.forget.delete_group(GROUP)
            await build_group(store, GROUP, facts, 3, episodes)
    finally:
        await store.close()
    return vocabulary(random.Random(3))


def queries_of(names: list[str], synthetic: bool, rng: random.Random) -> str:
    if synthetic:  # 2-4 words of the synthetic group's vocabulary (recall_latency)
        return " ".join(rng.sample(names, rng.randint(2, 4)))
    return rng.choice(QUERIES).format(a=rng.choice(names))


async def level(
    url: str,
    names: list[str],
    clients: int,
    total: int,
    route: str,
    synthetic: bool = False,
    server_pid: int | None = None,
) -> dict[str, Any]:
    rng = random.Random(clients)
    bodies = [{"query": queries_of(names, synthetic, rng), "limit": 10} for _ in range(total)]
    latencies: list[float] = []
    errors = 0
    queue = iter(bodies)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Authorization": f"Bearer {KEY}"}

    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as http:

        async def client() -> None:
            nonlocal errors
            for body in queue:
                started = time.perf_counter()
                try:
                    if route == "facts":  # the HTTP layer over one store read, for comparison
                        response = await http.get("/v1/facts")
                    else:
                        response = await http.post("/v1/search", json=body)
                    ok = response.status_code == 200
                except httpx.TransportError:
                    ok = False
                latencies.append(time.perf_counter() - started)
                errors += not ok

        started = time.perf_counter()
        client_cpu = time.process_time()
        server_cpu = cpu_seconds(server_pid) if server_pid else 0.0
        await asyncio.gather(*(client() for _ in range(clients)))
        seconds = time.perf_counter() - started
        client_cpu = time.process_time() - client_cpu
        server_cpu = cpu_seconds(server_pid) - server_cpu if server_pid else 0.0
    latencies.sort()
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / seconds,
        "p50_ms": quantiles[49] * 1000,
        "p99_ms": quantiles[98] * 1000,
        # CPU per request: the server's (every thread) and this load generator's
        "server_cpu_ms": 1000 * server_cpu / len(latencies),
        "client_cpu_ms": 1000 * client_cpu / len(latencies),
    }


async def run(args: argparse.Namespace) -> None:
    from tests.support.metrics import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"  # loopback only
    synthetic = args.facts is not None
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        started = time.perf_counter()
        if synthetic:
            os.environ.setdefault("TIDEGRAPH_DATA_DIR", tmp)
            names = await seed_synthetic(Path(tmp), args.facts, args.episodes, args.keep)
        process = start_server(port, Path(tmp), args.in_memory, args.server_path)
        try:
            await wait_ready(url, process)
            if args.noisy:
                for key, accounts in ((KEY, 20), (KEY_B, 5)):
                    headers = {"Authorization": f"Bearer {key}"}
                    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
                        await seed(http, accounts)
                print(f"server: {args.server_path or 'this tree'}; {args.seconds:.0f} s a phase")
                await noisy(url, port, args.seconds)
                return
            idle = rss_kib(process.pid)[0]
            headers = {"Authorization": f"Bearer {KEY}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
                if not synthetic:
                    names = await seed(http, args.accounts)
                seeded = time.perf_counter() - started
            store = (
                "in-memory (exact search)"
                if args.in_memory
                else os.environ.get("TIDEGRAPH_STORE", "embedded")
            )
            what = (
                f"{args.facts} facts, {args.episodes or args.facts // 10} episodes in one group"
                if synthetic
                else f"{args.accounts * 4} episodes"
            )
            print(
                f"store: {store}; seeded {what} in {seeded:.1f}s; "
                f"route: {'GET /v1/facts' if args.route == 'facts' else 'POST /v1/search'}"
            )
            print(f"{'clients':>8} {'requests':>9} {'errors':>7} {'req/s':>8} {'p50 ms':>8} "
                  f"{'p99 ms':>8} {'server CPU ms':>14} {'client CPU ms':>14}")  # fmt: skip
            if args.warmup:  # the server's caches filled (each reader's matrices), unmeasured
                await level(url, names, max(args.clients), args.warmup, args.route, synthetic)
                print(f"(after {args.warmup} unmeasured searches)")
            for clients in args.clients:
                r = await level(
                    url, names, clients, args.requests, args.route, synthetic, process.pid
                )
                print(f"{r['clients']:>8} {r['requests']:>9} {r['errors']:>7} {r['rps']:>8.1f} "
                      f"{r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['server_cpu_ms']:>14.1f} "
                      f"{r['client_cpu_ms']:>14.1f}")  # fmt: skip
            rss, peak = rss_kib(process.pid)
            print(f"server RSS: {idle / 1024:.0f} MiB idle, {rss / 1024:.0f} MiB after, "
                  f"peak {peak / 1024:.0f} MiB")  # fmt: skip
        finally:
            process.terminate()
            process.wait(30)
            if not args.in_memory and os.environ.get("TIDEGRAPH_STORE") == "neo4j":
                if not args.keep:
                    await _delete_seeded_group()


# ----------------------------------------------------------------------------- --noisy
PHRASE = (
    "since the first monday of the second quarter of the fiscal year two thousand and twenty "
    "three, march"
)[:100]
# Letters beyond ASCII: dateparser's language detection reads it (tidegraph/processors/temporal.py).
PHRASE_ES = (
    "desde el primer lunes del segundo trimestre del año fiscal dos mil veintitrés, en marzo"
)


async def probe(url: str, path: str, key: str | None, until: float) -> list[float]:
    """Latencies of ``GET path`` sent one after another until the monotonic time ``until``."""
    headers = {"X-API-Key": key} if key else {}
    latencies = []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
        while time.monotonic() < until:
            started = time.perf_counter()
            (await http.get(path)).raise_for_status()
            latencies.append(time.perf_counter() - started)
    return latencies


async def phrases(url: str, until: float, phrase: str, clients: int = 40) -> int:
    """Searches with a 100-character time phrase, ``clients`` at once, until ``until``."""
    sent = 0
    limits = httpx.Limits(max_connections=clients)
    headers = {"X-API-Key": KEY}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as http:

        async def client() -> None:
            nonlocal sent
            while time.monotonic() < until:
                await http.post("/v1/search", json={"query": "Account plan", "valid_at": phrase})
                sent += 1

        await asyncio.gather(*(client() for _ in range(clients)))
    return sent


async def waits(url: str, seconds: float, clients: int = 100) -> dict[int, int]:
    """``clients`` reads at once, each waiting on a token never written; their statuses."""
    import base64
    import uuid

    def token() -> str:
        data = {"g": GROUP, "u": str(uuid.uuid4())}
        return "rw1." + base64.urlsafe_b64encode(orjson_dumps(data)).decode().rstrip("=")

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(
        base_url=url, headers={"X-API-Key": KEY}, limits=limits, timeout=seconds + 30
    ) as http:
        params = {"wait_timeout_seconds": seconds}
        answers = await asyncio.gather(
            *(http.get("/v1/facts", params={**params, "wait_for": token()}) for _ in range(clients))
        )
    statuses: dict[int, int] = {}
    for answer in answers:
        statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
    return statuses


def orjson_dumps(value: Any) -> bytes:
    import orjson

    return orjson.dumps(value)


async def slow_headers(port: int, seconds: float, connections: int = 300) -> tuple[int, int]:
    """``connections`` sending one header byte a second for ``seconds``: (still open at the
    end, answered 408)."""
    until = time.monotonic() + seconds

    async def one() -> tuple[bool, bool]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/facts HTTP/1.1\r\nHost: bench\r\nX-Slow: ")

        async def trickle() -> None:
            while True:
                writer.write(b"a")
                await writer.drain()
                await asyncio.sleep(1.0)  # the load's pace: one byte a second

        sending = asyncio.create_task(trickle())
        try:
            answer = await asyncio.wait_for(reader.read(), max(until - time.monotonic(), 0))
            return False, answer.startswith(b"HTTP/1.1 408")
        except (TimeoutError, ConnectionError):
            return True, False
        finally:
            sending.cancel()
            writer.close()

    results = await asyncio.gather(*(one() for _ in range(connections)))
    return sum(still for still, _ in results), sum(answered for _, answered in results)


def _ms(latencies: list[float]) -> str:
    if not latencies:
        return "-"
    ordered = sorted(latencies)
    return f"{statistics.median(ordered) * 1000:7.1f} {ordered[-1] * 1000:8.1f}"


async def noisy(url: str, port: int, seconds: float) -> None:
    """Tenant B's reads (and /healthz) while tenant A loads the server (see the docstring)."""

    async def measured(load: Any) -> tuple[list[float], list[float], Any]:
        until = time.monotonic() + seconds
        facts, health, result = await asyncio.gather(
            probe(url, "/v1/facts", KEY_B, until), probe(url, "/healthz", None, until), load(until)
        )
        return facts, health, result

    async def idle(until: float) -> str:
        await asyncio.sleep(max(until - time.monotonic(), 0))
        return ""

    async def phrase_load(until: float) -> str:
        return f"{await phrases(url, until, PHRASE)} searches"

    async def foreign_phrase_load(until: float) -> str:
        return f"{await phrases(url, until, PHRASE_ES)} searches"

    async def wait_load(until: float) -> str:
        statuses = await waits(url, seconds)
        return ", ".join(f"{n}x{code}" for code, n in sorted(statuses.items()))

    async def slow_load(until: float) -> str:
        still, answered = await slow_headers(port, seconds)
        return f"{still} of 300 still open after {seconds:.0f} s, {answered} answered 408"

    print(f"{'tenant A load':<42} {'B facts p50/max ms':>18} {'/healthz p50/max ms':>19}  A")
    for name, load in (
        ("none", idle),
        ("40 searches with a 100-char time phrase", phrase_load),
        ("40 searches, a 90-char non-ASCII phrase", foreign_phrase_load),
        ("100 reads waiting on unwritten tokens", wait_load),
        ("300 connections sending 1 header byte/s", slow_load),
    ):
        facts, health, result = await measured(load)
        print(f"{name:<42} {_ms(facts):>18} {_ms(health):>19}  {result}")


async def _delete_seeded_group() -> None:
    """Leave a shared Neo4j as it was: the seeded episodes would otherwise wait there as
    pending (unextracted) for any worker with an LLM to sweep."""
    from tidegraph.settings import Settings
    from tidegraph.stores import open_store

    store = open_store(Settings())
    try:
        await store.forget.delete_group(GROUP)
    finally:
        await store.close()


def serve_in_memory(port: int) -> None:
    """The server over the in-memory store with exact search (a separate process)."""
    import uvicorn

    from tests.integration.serve_harness import in_memory_service
    from tidegraph.app.serving.http_api import create_app
    from tidegraph.app.serving.settings import KeyRing
    from tidegraph.settings import Settings

    settings = Settings()
    app = create_app(in_memory_service(settings), KeyRing({KEY: [GROUP]}))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="Searches per level.")
    parser.add_argument(
        "--warmup", type=int, default=200, help="Unmeasured searches first (0: none)."
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--accounts", type=int, default=100, help="Seeded accounts (x4).")
    parser.add_argument("--in-memory", action="store_true", help="In-memory store, exact search.")
    parser.add_argument("--route", choices=["search", "facts"], default="search")
    parser.add_argument("--facts", type=int, help="Seed the synthetic group of N facts.")
    parser.add_argument("--episodes", type=int, help="... with M episodes (default N/10).")
    parser.add_argument("--keep", action="store_true", help="Neo4j: keep and reuse the group.")
    parser.add_argument("--noisy", action="store_true", help="One tenant's load, another's reads.")
    parser.add_argument("--seconds", type=float, default=15.0, help="--noisy: each phase.")
    parser.add_argument("--server-path", help="Run the server from this source tree.")
    parser.add_argument("--serve-in-memory", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_in_memory:
        serve_in_memory(args.serve_in_memory)
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
