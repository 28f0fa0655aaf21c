"""``serve --transport http --workers N``: N server processes behind one listening socket.

One Python process saturates one core (the GIL). This runs N of them on one host the way
uvicorn's own ``--workers`` does, with uvicorn's own supervisor (``Multiprocess``: it
spawns the workers, pings them, restarts one that dies, and stops them all on SIGINT or
SIGTERM); we do not write another. The parent binds the socket (``transport/serve.bind_listener``:
the same bind rules and one-line errors as a single process), announces it, and hands it
to every worker; the kernel spreads connections among them.

Each worker builds its own server from the same settings (the parent passes the config
file and the ``serve`` flags in ``NEXUS_MCP_WORKER_SPEC``). Per-process stores would
multiply every limit by N (a budget, a rate, an approval token spent once per worker), so
more than one worker is refused unless the state backend is shared; and the SDK keeps a
2025-11-25 session in one process's memory, so they also need ``--stateless-http``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp

from nexus_mcp.errors import ConfigError
from nexus_mcp.settings import Settings

WORKER_SPEC_ENV = "NEXUS_MCP_WORKER_SPEC"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def check_workers(settings: Settings) -> None:
    """Refuse a worker count the rest of the configuration cannot keep its promises with."""
    if settings.workers <= 1:
        return
    if settings.transport != "http":
        raise ConfigError("'workers' (--workers) above 1 needs --transport http")
    if settings.state.backend != "shared":
        raise ConfigError(
            "'workers' (--workers) above 1 needs state.backend: shared: per-process stores "
            "would multiply budgets, rate limits and approval-token use by the worker count"
        )
    if not settings.stateless_http:
        raise ConfigError(
            "'workers' (--workers) above 1 needs --stateless-http: a 2025-11-25 session "
            "lives in one worker's memory and the kernel spreads connections among workers"
        )
    if settings.replay is not None or settings.record is not None:
        raise ConfigError("'workers' (--workers) above 1 cannot be used with record or replay")


def serve_workers(settings: Settings, config_file: Path | None, overrides: dict[str, Any]) -> None:
    """Bind, announce, then run ``settings.workers`` workers until stopped."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from nexus_mcp.server.build import build_server
    from nexus_mcp.transport.serve import (
        announce,
        bind_listener,
        http_url,
        log_started,
        log_stopped,
    )

    check_workers(settings)
    # Build (and close) one server first: every configuration or store problem is one line
    # here, not N workers failing in a restart loop.
    build_server(settings, config_file=config_file).close()
    listener = bind_listener(settings)
    port = int(listener.getsockname()[1])
    announce(settings, port=port)
    spec = {
        "config": str(config_file) if config_file is not None else None,
        "overrides": {k: (str(v) if isinstance(v, Path) else v) for k, v in overrides.items()},
        "port": port,
    }
    os.environ[WORKER_SPEC_ENV] = json.dumps(spec)
    # /metrics answers from whichever worker takes the scrape: prometheus-client's
    # multiprocess mode makes every worker's counters part of that answer. A folder of
    # this run's own, unless the operator chose one.
    if not os.environ.get(MULTIPROC_ENV):
        os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="nexus-mcp-metrics-")
    config = uvicorn.Config(
        "nexus_mcp.transport.workers:create_app",
        factory=True,
        workers=settings.workers,
        host=settings.host,
        port=port,
        lifespan="on",
        log_config=None,  # every line leaves through our JSON handler (observability/logs.py)
        timeout_graceful_shutdown=2,
    )
    log_started(settings, address=http_url(settings, port), workers=settings.workers)
    try:
        Multiprocess(config, sockets=[listener]).run()
    finally:
        listener.close()
    log_stopped(settings, reason="exit")


def create_app() -> ASGIApp:
    """A worker's ASGI app: the server built from the parent's settings (uvicorn factory)."""
    from nexus_mcp.observability.logs import configure_logging, enforce_one_handler
    from nexus_mcp.server.build import build_server
    from nexus_mcp.server.heap import freeze_start_up_heap
    from nexus_mcp.settings import SERVE_FLAGS, load_settings
    from nexus_mcp.transport.serve import LifespanHooks, http_options

    spec = json.loads(os.environ[WORKER_SPEC_ENV])
    config = Path(spec["config"]) if spec["config"] else None
    overrides = dict(spec["overrides"])
    overrides["port"] = spec["port"]
    configure_logging("INFO")
    settings = load_settings(config, overrides, flags=SERVE_FLAGS)
    configure_logging(settings.log_level, settings.log_format)
    server = build_server(settings, config_file=config)
    enforce_one_handler()
    app = server.mcp.http_app(**http_options(settings))
    freeze_start_up_heap()  # built: the start-up heap is set aside from collections
    return LifespanHooks(app, stopped=server.close)


__all__ = ["WORKER_SPEC_ENV", "check_workers", "create_app", "serve_workers"]
