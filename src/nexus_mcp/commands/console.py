"""``nexus-mcp console``: the operator console beside a stdio server, or a login link.

    nexus-mcp console [--config F] [--data-dir D] [--port N]
        Serve the console on 127.0.0.1 (port 8766 by default; 0 picks a free one) over the
        data dir and configuration a stdio server uses, and print a one-time login link for
        the local admin. Runs until Ctrl-C.
    nexus-mcp console --link [--url URL] [--config F] [--data-dir D]
        Print a one-time login link for a console already served (``serve --transport
        http`` serves one at /console): URL is that server's address.

The link signs in ``local:<OS user>`` as ``admin`` (this command needs the data dir, which
only the server's owner can read). It works once, for five minutes.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from nexus_mcp.errors import ConfigError

if TYPE_CHECKING:  # settings are loaded by the functions that run: `console --help` skips them
    from nexus_mcp.settings import Settings

DEFAULT_PORT = 8766
EXIT_OK, EXIT_USAGE = 0, 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "console",
        help="the operator console (inbox, pins, access, audit, health) in a browser",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default=None, help="the server's nexus.yaml")
    parser.add_argument("--data-dir", type=Path, default=None, help="the server's data dir")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="where to serve (0: a free port)"
    )
    parser.add_argument(
        "--link", action="store_true", help="only print a login link for a running server"
    )
    parser.add_argument(
        "--url", default=None, help="with --link: the running server (default: from settings)"
    )
    parser.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> Settings:
    from nexus_mcp.settings import load_settings

    config = args.config or os.environ.get("NEXUS_MCP_CONFIG")
    return load_settings(
        Path(config) if config else None,
        {"data_dir": args.data_dir},
        flags={"data_dir": "--data-dir"},
    )


def login_link(settings: Settings, base_url: str) -> str:
    from nexus_mcp.console.services import console_keys

    keys = console_keys(settings, os.environ)
    token = keys.mint_link(subject=f"local:{getpass.getuser()}", role="admin")
    return f"{base_url.rstrip('/')}/console/login?t={quote(token)}"


def run(args: argparse.Namespace) -> int:
    try:
        settings = _settings(args)
    except ConfigError as exc:
        print(f"nexus-mcp: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.link:
        url = args.url or f"http://127.0.0.1:{settings.port}"
        if not url.startswith(("http://", "https://")):
            print("nexus-mcp: --url should start with http:// or https://", file=sys.stderr)
            return EXIT_USAGE
        print(login_link(settings, url))
        return EXIT_OK
    if not 0 <= args.port <= 65535:
        print("nexus-mcp: --port should be 0 to 65535", file=sys.stderr)
        return EXIT_USAGE
    try:
        return serve_console(settings, args.config, args.port)
    except ConfigError as exc:
        print(f"nexus-mcp: {exc}", file=sys.stderr)
        return EXIT_USAGE


def standalone_app(settings: Settings, config: str | None) -> tuple[Any, Any]:
    """The console as its own ASGI app over the data dir (and what to close after)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    from nexus_mcp.console.app import console_routes
    from nexus_mcp.console.services import ConsoleServices, console_keys
    from nexus_mcp.observability.audit import AuditLog, JsonlAuditSink
    from nexus_mcp.observability.audit_anchor import anchor_audit_sinks
    from nexus_mcp.policy.approvals import load_approval_settings
    from nexus_mcp.settings import config_sections
    from nexus_mcp.stores.backends import audit_replica, open_state

    sections = config_sections(Path(config)) if config else {}
    approval_settings = load_approval_settings(os.environ, sections)
    state = open_state(settings, os.environ)
    sink = JsonlAuditSink(settings.audit_path, max_bytes=settings.audit_max_bytes)
    anchor_audit_sinks([sink], state.audit_heads, replica=audit_replica(settings))
    audit = AuditLog([sink])
    services = ConsoleServices(
        pins=_pins(settings, Path(config) if config else None),
        settings=settings,
        config_file=Path(config) if config else None,
        approval_settings=approval_settings,
        state=state,
        audit=audit,
        keys=console_keys(settings, os.environ),
        host="standalone",
    )
    app = Starlette(
        routes=console_routes(services),
        # Loopback only: a page on another site cannot reach it by DNS rebinding.
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1", "localhost", "[::1]"])
        ],
    )

    def close() -> None:
        audit.close()
        state.close()

    return app, close


def _pins(settings: Settings, config: Path | None) -> Any:
    """The pins page beside a stdio server: no gateway here, so each page connects to the
    upstreams as ``nexus-mcp upstream check`` does; None without upstreams."""
    from nexus_mcp.commands.upstream import review_context
    from nexus_mcp.providers.upstream.pins_view import PinsView
    from nexus_mcp.settings import config_sections

    if config is None or not config_sections(config).get("upstreams"):
        return None
    context = review_context(settings, config)
    return PinsView(context) if context.server_ids else None


def serve_console(settings: Settings, config: str | None, port: int) -> int:
    import asyncio
    import socket

    import uvicorn

    app, close = standalone_app(settings, config)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("127.0.0.1", port))
        except OSError as exc:
            print(
                f"nexus-mcp: port {port} cannot be used ({(exc.strerror or '').lower()}): "
                "choose another with --port",
                file=sys.stderr,
            )
            return EXIT_USAGE
        listener.listen(64)
        bound = listener.getsockname()[1]
        base = f"http://127.0.0.1:{bound}"
        print(f"nexus-mcp console on {base}/console", flush=True)
        print(f"sign in (once, within 5 minutes): {login_link(settings, base)}", flush=True)
        config_ = uvicorn.Config(app, log_config=None, log_level="warning")
        server = uvicorn.Server(config_)
        asyncio.run(server.serve(sockets=[listener]))
    finally:
        listener.close()
        close()
    return EXIT_OK


__all__ = ["add_parser", "login_link", "run", "standalone_app"]
