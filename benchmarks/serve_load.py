"""Search over HTTP under load: requests/s and p50/p99 latency of ``POST /v1/search`` at 10 and
100 concurrent clients, and the server's memory (docs/serving.md "Serving memory to agents").

The server is the real ``tidegraph serve`` in its own process on loopback (its RSS read from
/proc), over the configured store (``TIDEGRAPH_STORE``; the embedded default in a temporary
folder), or with ``--in-memory`` over the in-memory store with exact search methods
(tests/integration/serve_harness.py: for comparing the HTTP layer alone, and until the real
stores have their search methods). It is seeded through ``POST /v1/episodes`` (CRM plan
records, mapped without an LLM, and chat messages), then each concurrency level sends
``--requests`` searches (bounded) of varied queries.

    python -m benchmarks.serve_load                       # embedded default
    python -m benchmarks.serve_load --in-memory --requests 2000
    python -m benchmarks.serve_load --route facts          # the HTTP layer over one store read
    TIDEGRAPH_STORE=neo4j python -m benchmarks.serve_load

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


def start_server(port: int, data: Path, in_memory: bool) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TIDEGRAPH_API_KEYS": f'{{"{KEY}": ["{GROUP}"]}}'}
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
            await store.delete_group(GROUP)
            await build_group(store, GROUP, facts, 3, episodes)
    finally:
        await store.close()
    return vocabulary(random.Random(3))


def queries_of(names: list[str], synthetic: bool, rng: random.Random) -> str:
    if synthetic:  # 2-4 words of the synthetic group's vocabulary (recall_latency)
        return " ".join(rng.sample(names, rng.randint(2, 4)))
    return rng.choice(QUERIES).format(a=rng.choice(names))


async def level(
    url: str, names: list[str], clients: int, total: int, route: str, synthetic: bool = False
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
        await asyncio.gather(*(client() for _ in range(clients)))
        seconds = time.perf_counter() - started
    latencies.sort()
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / seconds,
        "p50_ms": quantiles[49] * 1000,
        "p99_ms": quantiles[98] * 1000,
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
        process = start_server(port, Path(tmp), args.in_memory)
        try:
            await wait_ready(url, process)
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
            print(f"{'clients':>8} {'requests':>9} {'errors':>7} {'req/s':>8} "
                  f"{'p50 ms':>8} {'p99 ms':>8}")  # fmt: skip
            for clients in args.clients:
                r = await level(url, names, clients, args.requests, args.route, synthetic)
                print(f"{r['clients']:>8} {r['requests']:>9} {r['errors']:>7} {r['rps']:>8.1f} "
                      f"{r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f}")  # fmt: skip
            rss, peak = rss_kib(process.pid)
            print(f"server RSS: {idle / 1024:.0f} MiB idle, {rss / 1024:.0f} MiB after, "
                  f"peak {peak / 1024:.0f} MiB")  # fmt: skip
        finally:
            process.terminate()
            process.wait(30)
            if not args.in_memory and os.environ.get("TIDEGRAPH_STORE") == "neo4j":
                if not args.keep:
                    await _delete_seeded_group()


async def _delete_seeded_group() -> None:
    """Leave a shared Neo4j as it was: the seeded episodes would otherwise wait there as
    pending (unextracted) for any worker with an LLM to sweep."""
    from tidegraph.settings import Settings
    from tidegraph.stores import open_store

    store = open_store(Settings())
    try:
        await store.delete_group(GROUP)
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
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--accounts", type=int, default=100, help="Seeded accounts (x4).")
    parser.add_argument("--in-memory", action="store_true", help="In-memory store, exact search.")
    parser.add_argument("--route", choices=["search", "facts"], default="search")
    parser.add_argument("--facts", type=int, help="Seed the synthetic group of N facts.")
    parser.add_argument("--episodes", type=int, help="... with M episodes (default N/10).")
    parser.add_argument("--keep", action="store_true", help="Neo4j: keep and reuse the group.")
    parser.add_argument("--serve-in-memory", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_in_memory:
        serve_in_memory(args.serve_in_memory)
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
