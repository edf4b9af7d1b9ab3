"""``tidegraph serve`` (HTTP) and ``tidegraph mcp`` (Model Context Protocol): the memory for
agents (docs/serving.md "Serving memory to agents")."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import typer

from tidegraph.app.cli.main import _setup_logging, app, err, get_settings
from tidegraph.app.serving.settings import KeyFileError, KeyRing, ServeSettings, is_loopback

log = logging.getLogger("tidegraph.serve")


def _keys(serve_settings: ServeSettings) -> KeyRing:
    try:
        return KeyRing.from_settings(serve_settings)
    except KeyFileError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def _bind_host(host: str | None, keys: KeyRing, what: str) -> str:
    """The address to bind: loopback only without API keys."""
    chosen = host or ("0.0.0.0" if keys.enabled else "127.0.0.1")
    if not keys.enabled and not is_loopback(chosen):
        err.print(
            f"[red]error:[/red] no API keys are configured, so {what} serves loopback only and "
            f"will not bind {chosen}. Set TIDEGRAPH_API_KEYS or TIDEGRAPH_API_KEYS_FILE "
            '(JSON {"key": ["group", ...]}), or bind 127.0.0.1.'
        )
        raise typer.Exit(2)
    return chosen


def _announce(keys: KeyRing, host: str, port: int, what: str) -> None:
    if keys.enabled:
        log.info("%s on %s:%s: %d API key(s) configured", what, host, port, len(keys))
    else:
        log.warning(
            "%s on %s:%s: NO API KEYS configured (TIDEGRAPH_API_KEYS / TIDEGRAPH_API_KEYS_FILE):"
            " any local caller may read and write every group; bound to loopback only",
            what,
            host,
            port,
        )


async def open_service(via: str, mapping: Path | None, serve_settings: ServeSettings) -> Any:
    from tidegraph.app.memory import Memory
    from tidegraph.app.serving.service import MemoryService

    settings = get_settings()
    memory = await Memory.open(
        settings,
        via="kafka" if via == "kafka" else "process",
        mapping_path=str(mapping) if mapping else None,
    )
    return MemoryService(
        memory,
        wait_seconds=serve_settings.serve_wait_seconds,
        waits_per_key=serve_settings.serve_waits_per_key,
    )


@app.command()
def serve(
    host: str | None = typer.Option(
        None, help="Address to bind (default 0.0.0.0 with API keys, 127.0.0.1 without)."
    ),
    port: int | None = typer.Option(None, help="Port (default TIDEGRAPH_SERVE_PORT, 8080)."),
    via: str | None = typer.Option(
        None, help="process (write in this process) or kafka (queue for the workers)."
    ),
    mapping: Path | None = typer.Option(
        None, "--mapping", exists=True, dir_okay=False, help="Declared-mapping file (YAML)."
    ),
) -> None:
    """Serve the memory over HTTP for agents: add episodes, search, context, facts as of a
    time, with API keys bound to groups (OpenAPI docs at /docs)."""
    import uvicorn

    from tidegraph.app.serving.http_api import create_app
    from tidegraph.app.serving.server import uvicorn_config

    _setup_logging()
    serve_settings = ServeSettings()
    keys = _keys(serve_settings)
    bind = _bind_host(host or serve_settings.serve_host, keys, "tidegraph serve")
    chosen_via = via or serve_settings.serve_via
    if chosen_via not in ("process", "kafka"):
        raise typer.BadParameter("--via must be 'process' or 'kafka'")
    the_port = serve_settings.serve_port if port is None else port
    mapping = mapping or get_settings().mappings
    _announce(keys, bind, the_port, f"tidegraph serve (via {chosen_via})")

    async def opened() -> Any:
        return await open_service(chosen_via, mapping, serve_settings)

    web = create_app(
        opened,
        keys,
        max_body_bytes=serve_settings.serve_max_body_bytes,
        body_timeout_seconds=serve_settings.serve_body_timeout_seconds,
        settle_gc=True,  # this process is the server's
    )
    config = uvicorn_config(
        web,
        bind,
        the_port,
        serve_settings,
        log_level=get_settings().log_level.lower(),
        access_log=False,  # the server logs each request itself (route, status, key id)
    )
    uvicorn.Server(config).run()


@app.command()
def mcp(
    group: list[str] = typer.Option(
        [],
        "--group",
        help="Group id the tools may use (repeat). Required over stdio; over HTTP with API "
        "keys it narrows each key's groups.",
    ),
    transport: str = typer.Option("stdio", help="stdio or http (streamable HTTP at /mcp)."),
    host: str | None = typer.Option(None, help="HTTP: address to bind (as `serve`)."),
    port: int = typer.Option(8765, help="HTTP: port."),
    via: str | None = typer.Option(None, help="process or kafka (as `serve`)."),
    mapping: Path | None = typer.Option(
        None, "--mapping", exists=True, dir_okay=False, help="Declared-mapping file (YAML)."
    ),
) -> None:
    """Serve the memory as MCP tools (add_memory, search_facts, search_entities,
    search_episodes, get_context, facts_as_of, episode_status) over stdio or HTTP."""
    import sys

    from tidegraph.app.serving.mcp_server import Holder, Scoping, build_mcp, http_app

    _setup_logging(sys.stderr)  # stdout carries the protocol over stdio: logs go to stderr
    serve_settings = ServeSettings()
    keys = _keys(serve_settings)
    chosen_via = via or serve_settings.serve_via
    mapping = mapping or get_settings().mappings
    if transport not in ("stdio", "http"):
        raise typer.BadParameter("--transport must be 'stdio' or 'http'")
    if (transport == "stdio" or not keys.enabled) and not group:
        raise typer.BadParameter("name the groups the tools may use: --group ID (repeat)")

    async def opened() -> Any:
        return await open_service(chosen_via, mapping, serve_settings)

    holder = Holder(opened)
    scoping = Scoping(keys if transport == "http" else KeyRing({}), group or None)
    if transport == "stdio":
        build_mcp(holder, scoping).run("stdio")
        return
    import uvicorn

    from tidegraph.app.serving.server import uvicorn_config

    bind = _bind_host(host, keys, "tidegraph mcp")
    _announce(keys, bind, port, "tidegraph mcp (streamable HTTP at /mcp)")
    server = build_mcp(holder, scoping, stdio=False, host=bind, port=port)
    app = http_app(server, keys, holder, serve_settings, settle_gc=True)
    uvicorn.Server(uvicorn_config(app, bind, port, serve_settings, log_level="warning")).run()
