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

# Each command, the module that builds its parser, and the line `nexus-mcp --help` shows for
# it. The module exposes add_parser(subparsers); its parsers set func(args) -> exit code.
# Only the module of the command being run is imported (a command's dependencies cost
# nothing to another command or to `--help`); the others get a placeholder parser with the
# same line. tests/unit/test_cli.py checks each line against the module's own.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("nexus_mcp.commands.serve", "serve the workspace over stdio or streamable HTTP"),
    "init": ("nexus_mcp.commands.init", "write a starter nexus.yaml (or print its JSON Schema)"),
    "install": (
        "nexus_mcp.commands.install",
        "add nexus-mcp to a client's MCP configuration (Claude Desktop, Claude Code, ...)",
    ),
    "registry": ("nexus_mcp.commands.registry", "tool registry files (validate, digest, show)"),
    "profiles": ("nexus_mcp.commands.profiles", "manage tool profiles and grants"),
    "approvals": (
        "nexus_mcp.commands.approvals",
        "the approvals inbox; mint and verify approval tokens",
    ),
    "console": (
        "nexus_mcp.commands.console",
        "the operator console (inbox, pins, access, audit, health) in a browser",
    ),
    "audit": ("nexus_mcp.commands.audit", "show or verify the audit trail"),
    "call": (
        "nexus_mcp.commands.call",
        "call one tool on a running server and print the result (for scripts)",
    ),
    "upstream": (
        "nexus_mcp.commands.upstream",
        "upstream MCP servers: list, check and pin their tool definitions",
    ),
    "fixtures": (
        "nexus_mcp.commands.fixtures",
        "recorded tool calls (serve --record / --replay): list, verify, prune",
    ),
    "state": (
        "nexus_mcp.commands.state",
        "shared state backend: migrate its schema, show its status, move grants",
    ),
}
COMMAND_MODULES = tuple(module for module, _ in COMMANDS.values())


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, just that command's parser is built in full."""
    parser = argparse.ArgumentParser(
        prog="nexus-mcp",
        description="A least-privilege MCP server: per-caller tool grants, a manifest-first "
        "registry, hashed documents, approved writes and an audit trail.",
    )
    parser.add_argument("--version", action="version", version=f"nexus-mcp {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_line) in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module_name).add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=help_line)
    return parser


def command_in(argv: Sequence[str]) -> str | None:
    """The command a command line names: its first word that is not an option.

    The top level takes no option with a value (``--help``, ``--version``), so the first
    other word is the command, or a word argparse will refuse as one.
    """
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=command_in(words) or "")
    args, extras = parser.parse_known_args(words)
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
