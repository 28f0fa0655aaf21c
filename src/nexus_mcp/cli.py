"""The ``nexus-mcp`` command: assembles one subcommand module per noun."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from nexus_mcp import __version__

# Each module exposes add_parser(subparsers); its parsers set func(args) -> exit code.
COMMAND_MODULES = (
    "nexus_mcp.commands.serve",
    "nexus_mcp.commands.registry",
    "nexus_mcp.commands.profiles",
    "nexus_mcp.commands.approvals",
    "nexus_mcp.commands.audit",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nexus-mcp",
        description="A least-privilege MCP server: per-caller tool grants, a manifest-first "
        "registry, hashed documents, approved writes and an audit trail.",
    )
    parser.add_argument("--version", action="version", version=f"nexus-mcp {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
