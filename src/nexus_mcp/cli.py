"""The ``nexus-mcp`` command: assembles one subcommand module per noun."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from nexus_mcp._version import __version__

# What a shell reports for a command whose reader went away (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141

# Each module exposes add_parser(subparsers); its parsers set func(args) -> exit code.
COMMAND_MODULES = (
    "nexus_mcp.commands.serve",
    "nexus_mcp.commands.init",
    "nexus_mcp.commands.install",
    "nexus_mcp.commands.registry",
    "nexus_mcp.commands.profiles",
    "nexus_mcp.commands.approvals",
    "nexus_mcp.commands.console",
    "nexus_mcp.commands.audit",
    "nexus_mcp.commands.call",
    "nexus_mcp.commands.upstream",
    "nexus_mcp.commands.fixtures",
    "nexus_mcp.commands.state",
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
    args, extras = parser.parse_known_args(argv)
    # `call TOOL a=1 --full b=2`: argparse stops a positional list at the first option, so a
    # command that takes trailing KEY=VALUE pairs gets the rest here. Anything else, or
    # anything that looks like an option, is refused exactly as parse_args would.
    if extras:
        if not getattr(args, "accepts_trailing_pairs", False) or any(
            extra.startswith("-") for extra in extras
        ):
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        args.pairs = [*args.pairs, *extras]
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # `nexus-mcp ... | head`: the reader stopped reading, which is not an error to report
        # with a traceback. Python's documented recipe: point stdout at /dev/null so the
        # interpreter's own flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
