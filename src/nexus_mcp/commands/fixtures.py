"""``nexus-mcp fixtures``: the recordings ``serve --record DIR`` makes (seed 002).

    nexus-mcp fixtures list   DIR                     tools, calls and sizes, per server
    nexus-mcp fixtures verify DIR [--config FILE]     schema-valid, consistent, no secrets
    nexus-mcp fixtures prune  DIR --tool T [--version V] [--config FILE]

``verify`` runs the very check ``serve --replay`` start-up runs (``server/replay.check_recording``
over ``providers/fixtures.check_replay``, with the settings and configuration of
``--config`` and the environment, ``fixture_key`` included), so a recording it passes is
one a replay accepts: every folder entry a regular ``*.jsonl`` file, every line schema-valid
and consistent in itself, every MAC (with a key), every tool in this build at its version
and schemas, every upstream tool exposed and pinned as recorded, every code known. It also
checks that no line holds a secret: the configured secret values and bearer tokens by
shape (``fixtures/secrets.py``). It names the file, the line and the kind of problem,
never the secret. Exit codes: 0 clean, 1 problems found (or, for ``prune``, no line of
that tool), 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nexus_mcp.commands import print_table
from nexus_mcp.errors import ConfigError

if TYPE_CHECKING:  # the fixture store and settings are imported by the command that runs
    from nexus_mcp.fixtures.secrets import SecretScanner

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "fixtures", help="recorded tool calls (serve --record / --replay): list, verify, prune"
    )
    commands = parser.add_subparsers(dest="fixtures_command", required=True)
    listing = commands.add_parser("list", help="tools, calls and sizes of a fixture folder")
    listing.add_argument("directory", type=Path, metavar="DIR", help="the fixture folder")
    listing.set_defaults(func=run_list)

    verify = commands.add_parser(
        "verify", help="every line valid, every call's tool listed, no secret in any line"
    )
    verify.add_argument("directory", type=Path, metavar="DIR", help="the fixture folder")
    verify.add_argument(
        "--config", type=Path, default=None,
        help="the YAML configuration whose secrets to look for [NEXUS_MCP_CONFIG]",
    )  # fmt: skip
    verify.set_defaults(func=run_verify)

    pruning = commands.add_parser("prune", help="remove a tool's lines from a fixture folder")
    pruning.add_argument("directory", type=Path, metavar="DIR", help="the fixture folder")
    pruning.add_argument("--tool", required=True, metavar="T", help="the tool's name")
    pruning.add_argument(
        "--version", default=None, metavar="V", help="only the lines of this contract version"
    )
    pruning.add_argument(
        "--config", type=Path, default=None,
        help="the YAML configuration (its fixture_key re-seals a sealed recording) "
        "[NEXUS_MCP_CONFIG]",
    )  # fmt: skip
    pruning.set_defaults(func=run_prune)


def run_list(args: argparse.Namespace) -> int:
    from nexus_mcp.fixtures.store import read_fixtures

    try:
        servers, problems = read_fixtures(args.directory)
    except ConfigError as exc:
        return _refuse(str(exc))
    rows: list[list[object]] = []
    for server_id, fixtures in sorted(servers.items()):
        names = sorted(set(fixtures.tools) | set(fixtures.calls_by_tool))
        for name in names:
            record = fixtures.tools.get(name)
            versions = sorted(fixtures.call_versions.get(name, set()))
            listed = record.version if record is not None else "(not listed)"
            stale = [v for v in versions if record is None or v != record.version]
            rows.append(
                [
                    server_id,
                    name,
                    listed + (f" (+calls of {', '.join(stale)})" if stale else ""),
                    fixtures.calls_by_tool.get(name, 0),
                    fixtures.bytes_by_tool.get(name, 0),
                ]
            )
    if rows:
        print_table(("server", "tool", "version", "calls", "bytes"), rows)
    else:
        print("no fixtures")
    # A listing lists: only what keeps lines from being read at all fails it (verify
    # checks the rest).
    problems = [p for p in problems if p.bad_line or p.line == 0]
    if problems:
        print(
            f"{len(problems)} line(s) are not fixture lines: nexus-mcp fixtures verify",
            file=sys.stderr,
        )
        return EXIT_PROBLEMS
    return EXIT_OK


def run_verify(args: argparse.Namespace) -> int:
    # Imported here: the composition root is heavy, and only verify needs this build.
    from nexus_mcp.fixtures.lines import KIND_CALL, KIND_TOOL
    from nexus_mcp.fixtures.secrets import SecretScanner, configured_secrets
    from nexus_mcp.fixtures.store import iter_lines, parse_line, scan_folder
    from nexus_mcp.server.replay import check_recording
    from nexus_mcp.settings import config_sections, load_settings

    config = _config_path(args)
    try:
        settings = load_settings(config, {})
        sections = config_sections(config)
        scanner = SecretScanner.of(configured_secrets(settings, sections, os.environ))
        files, _entries = scan_folder(args.directory)
        # What serve --replay start-up refuses, by the same code (folder entries included).
        shared = check_recording(settings, args.directory, sections=sections, environ=os.environ)
    except ConfigError as exc:
        return _refuse(str(exc))
    problems: list[str] = []
    lines = 0
    for path in files:
        listed: set[tuple[str, str]] = set()
        calls: list[tuple[int, str, str]] = []
        try:
            numbered = list(iter_lines(path))
        except OSError:
            continue  # named by the shared check
        for number, raw in numbered:
            if not raw.strip():
                continue
            lines += 1
            where = f"{path.name} line {number}"
            line, problem = parse_line(raw)
            text = raw.decode("utf-8", errors="replace")
            kinds = scanner.findings(text)
            if line is not None:
                kinds |= _findings_in(scanner, line)
            for kind in sorted(kinds):
                problems.append(f"{where}: holds a secret ({kind})")
            if line is None:
                problems.append(f"{where}: not a fixture line ({problem})")
                continue
            if line["server_id"] + ".jsonl" != path.name:
                problems.append(f"{where}: server_id differs from the file name")
            if line["kind"] == KIND_TOOL:
                listed.add((line["tool"], line["version"]))
            elif line["kind"] == KIND_CALL:
                calls.append((number, line["tool"], line["version"]))
        for number, tool, version in calls:
            if (tool, version) not in listed:
                problems.append(
                    f"{path.name} line {number}: a call of {tool} {version}, "
                    "which no tool line lists"
                )
    problems = list(dict.fromkeys([*problems, *shared]))
    for problem in problems:
        # A name read from a line may itself be a planted secret: never printed.
        print(scanner.redact_text(problem)[0])
    if problems:
        print(f"{len(problems)} problem(s) in {lines} line(s)", file=sys.stderr)
        return EXIT_PROBLEMS
    print(f"{lines} line(s) in {len(files)} file(s): valid, no secrets")
    return EXIT_OK


def _config_path(args: argparse.Namespace) -> Path | None:
    given: Path | None = getattr(args, "config", None)
    return given or (
        Path(os.environ["NEXUS_MCP_CONFIG"]) if os.environ.get("NEXUS_MCP_CONFIG") else None
    )


def _findings_in(scanner: SecretScanner, line: dict[str, Any]) -> set[str]:
    """Secrets in the decoded strings (a secret JSON escaped in the raw line)."""
    kinds: set[str] = set()
    stack: list[Any] = [line]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            kinds |= scanner.findings(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return kinds


def run_prune(args: argparse.Namespace) -> int:
    from nexus_mcp.fixtures.integrity import resolve_fixture_key
    from nexus_mcp.fixtures.store import prune
    from nexus_mcp.settings import load_settings

    config = _config_path(args)
    try:
        settings = load_settings(config, {})
        key = resolve_fixture_key(
            settings.fixture_key, is_dev=settings.is_dev, environ=os.environ, folder=args.directory
        )
        removed = prune(args.directory, args.tool, version=args.version, key=key)
    except ConfigError as exc:
        return _refuse(str(exc))
    except OSError as exc:
        return _refuse(f"cannot rewrite the fixture files ({type(exc).__name__})")
    if not removed:
        print(f"no line of {json.dumps(args.tool)} to prune", file=sys.stderr)
        return EXIT_PROBLEMS
    for name, count in sorted(removed.items()):
        print(f"{name}: {count} line(s) removed")
    return EXIT_OK


def _refuse(message: str) -> int:
    print(f"nexus-mcp fixtures: {message}", file=sys.stderr)
    return EXIT_USAGE


__all__ = ["add_parser"]
