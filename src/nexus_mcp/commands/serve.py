"""``nexus-mcp serve``: run the server on stdio or streamable HTTP."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.serve_flags import SERVE_FLAGS, SERVE_OPTIONS


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the workspace over stdio or streamable HTTP",
        description=(
            "Serve the workspace tools. A workspace is required (except with --replay): "
            "--workspace, NEXUS_MCP_WORKSPACE or 'workspace' in the --config file. "
            "Every option can also be set with the environment "
            "variable NEXUS_MCP_<OPTION> (e.g. NEXUS_MCP_PORT=9000) or in the YAML --config "
            "file; flags win over the environment, which wins over the file. The stdio "
            "principal flags other than --subject need --subject in prod; in dev, without "
            "it, they can only narrow the dev principal."
        ),
    )
    for flag, dest, help_text, extra in SERVE_OPTIONS:
        parser.add_argument(
            flag, dest=dest, default=None, help=f"{help_text} [NEXUS_MCP_{dest.upper()}]", **extra
        )
    parser.add_argument(
        "--read-only", dest="read_only", action="store_const", const=True, default=None,
        help="stdio principal: read-only caller [NEXUS_MCP_READ_ONLY]",
    )  # fmt: skip
    parser.add_argument(
        "--stateless-http", dest="stateless_http", action="store_const", const=True, default=None,
        help="HTTP without sessions, for replicas behind a balancer [NEXUS_MCP_STATELESS_HTTP]",
    )  # fmt: skip
    parser.add_argument(
        "--config", type=Path, default=None,
        help="YAML configuration file [NEXUS_MCP_CONFIG]",
    )  # fmt: skip
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    # Imported here, not at the top: `serve --help` needs none of them.
    import asyncio

    from nexus_mcp.observability.logs import LOG_FORMATS, configure_logging
    from nexus_mcp.policy.config_errors import format_problems, split_problems
    from nexus_mcp.server.build import build_server
    from nexus_mcp.server.heap import freeze_start_up_heap
    from nexus_mcp.settings import ENV_PREFIX, load_settings
    from nexus_mcp.transport.serve import serve

    overrides = {dest: getattr(args, dest) for _, dest, _, _ in SERVE_OPTIONS}
    overrides["read_only"] = args.read_only
    overrides["stateless_http"] = args.stateless_http
    config = args.config or (
        Path(os.environ["NEXUS_MCP_CONFIG"]) if os.environ.get("NEXUS_MCP_CONFIG") else None
    )
    # Until the settings are read: the flag or the environment, else auto (a bad value is
    # reported by load_settings).
    early_format = args.log_format or os.environ.get(f"{ENV_PREFIX}LOG_FORMAT", "auto")
    configure_logging("INFO", early_format if early_format in LOG_FORMATS else "auto")
    try:
        try:
            settings = load_settings(config, overrides, flags=SERVE_FLAGS)
        except ConfigError as exc:
            # Every problem of the file in one run: the sections' own too.
            from nexus_mcp.server.startup import section_problems

            lines = split_problems(str(exc))
            if lines[-1].startswith("... and "):
                raise  # already more than a screenful
            more = section_problems(config, os.environ, mode=overrides.get("mode"))
            raise ConfigError(format_problems([*lines, *more])) from None
        configure_logging(settings.log_level, settings.log_format)
        if settings.workers > 1:
            from nexus_mcp.transport.workers import serve_workers

            serve_workers(settings, config, overrides)
            return 0
        server = build_server(settings, config_file=config)
    except ConfigError as exc:
        sys.stderr.write(f"nexus-mcp: {exc}\n")
        return 2
    freeze_start_up_heap()  # built: the start-up heap is set aside from collections
    try:
        asyncio.run(serve(server))
    except (KeyboardInterrupt, asyncio.CancelledError):  # stopped (transport/serve.py)
        return 0
    except ConfigError as exc:  # the HTTP address cannot be listened on
        sys.stderr.write(f"nexus-mcp: {exc}\n")
        return 2
    return 0


__all__ = ["add_parser", "run_serve"]
