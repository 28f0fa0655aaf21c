"""``nexus-mcp upstream``: the upstream MCP servers of a configuration, their tools and pins.

nexus-mcp upstream list  --config FILE           servers, state, tools, class, pin state,
                                                 sandboxed or not, network on or off
nexus-mcp upstream check --config FILE SERVER    connect, list, diff against registry and
                                                 pins; exit 1 on drift
nexus-mcp upstream pin   --config FILE SERVER [--tool T] [--yes]
                                                 show the diff, then write the pins

``check`` says of every tool whether it is "pinned, unchanged", "not pinned yet",
"changed" (with a diff of its title, description, schemas and annotations against the
definition it was pinned from) or "removed upstream"; ``pin`` shows the same diff (the
whole definition, for a tool not pinned yet) before it asks and writes. What an upstream
wrote is escaped and bounded before it reaches the terminal (``policy/definition_diff.py``).

Each command connects the way ``serve`` would (the same ``UpstreamServer``), as the
gateway itself (no caller's identity), and lists the tools; nothing is called. It reads
the quarantine evidence ``serve`` keeps (the data directory's file on the embedded
backend, Redis on the shared one), so a definition that changed and was reverted shows as
changed; ``pin`` clears that evidence for the tools it pins, then writes their pins with
a new stamp (a running server forgets its own copy when it reads the new lock file).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nexus_mcp.commands import print_table, upstream_items
from nexus_mcp.errors import ConfigError, UnavailableError

# The settings, registries and the review (which loads the upstream client stack) are
# imported by each action that uses them: `upstream --help` loads none (issue 29).
if TYPE_CHECKING:
    from nexus_mcp.policy.pins import PinnedDefinitions
    from nexus_mcp.policy.registry import RegistrySet
    from nexus_mcp.providers.upstream.review import ReviewContext
    from nexus_mcp.settings import Settings

EXIT_OK = 0
EXIT_DRIFT = 1
EXIT_USAGE = 2

_COLUMNS = ("server", "state", "tool", "exposed as", "class", "pin", "status")
# ``list`` also says how each upstream runs (``policy.sandbox.isolation``): in the
# bubblewrap sandbox or not (``remote``: an HTTP upstream), with the network or not.
_LIST_COLUMNS = (*_COLUMNS, "sandbox", "network")
_NETWORK = {True: "on", False: "off", None: "-"}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "upstream", help="upstream MCP servers: list, check and pin their tool definitions"
    )
    commands = parser.add_subparsers(dest="upstream_command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, help="the YAML configuration with upstreams:")
    common.add_argument("--mode", choices=("dev", "prod"), default=None)
    common.add_argument("--registry-dir", type=Path, default=None, metavar="DIR")
    common.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the server's data directory (its quarantine evidence, embedded backend)",
    )

    listing = commands.add_parser("list", parents=[common], help="every upstream and its tools")
    listing.set_defaults(func=run_list)

    check = commands.add_parser(
        "check", parents=[common], help="diff an upstream's tools against registry and pins"
    )
    check.add_argument("server", metavar="SERVER", help="an upstream's server_id")
    check.set_defaults(func=run_check)

    pin = commands.add_parser("pin", parents=[common], help="pin an upstream's tool definitions")
    pin.add_argument("server", metavar="SERVER", help="an upstream's server_id")
    pin.add_argument("--tool", action="append", default=None, metavar="T", help="only this tool")
    pin.add_argument("--yes", action="store_true", help="write without asking (no terminal)")
    upstream_items.add_arguments(pin)
    pin.set_defaults(func=run_pin)


def run_list(args: argparse.Namespace) -> int:
    import asyncio

    from nexus_mcp.providers.upstream.review import inspect

    rows: list[Sequence[str]] = []
    try:
        context = _load(args)
        for server_id in context.server_ids:
            report = asyncio.run(inspect(context, server_id))
            how = report["isolation"]
            runs = (how["sandbox"], _NETWORK[how["network"]])
            rows.extend((*row, *runs) for row in _rows(report))
    except ConfigError as exc:
        return _refuse(str(exc))
    if not rows:
        print("no upstreams configured")
        return EXIT_OK
    print_table(_LIST_COLUMNS, rows)
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    from nexus_mcp.providers.upstream.review import CHANGED, change_lines, verdict

    try:
        _context, report = _connect(args)
    except ConfigError as exc:
        return _refuse(str(exc))
    print_table(_COLUMNS, _rows(report, verdicts=True))
    for name, tool in report["tools"].items():
        if tool["allowed"] and verdict(tool) == CHANGED:
            print(f"\n{name}: {CHANGED}")
            for line in change_lines(tool, report["kept"]):
                print(line)
    upstream_items.print_items(report)
    drift = _drift(report) + upstream_items.item_drift(report)
    unusable = _print_unusable(report)
    if report["state"] != "ready":
        print(f"{args.server}: could not connect ({report['failure']})", file=sys.stderr)
        return EXIT_DRIFT
    if drift:
        print(
            f"{args.server}: {len(drift)} definition(s) drifted: {', '.join(drift)}",
            file=sys.stderr,
        )
        return EXIT_DRIFT
    if unusable:
        return EXIT_DRIFT
    print(f"{args.server}: every listed tool is classified and pinned, and so is every item")
    return EXIT_OK


def run_pin(args: argparse.Namespace) -> int:
    from nexus_mcp.providers.upstream.review import (
        change_lines,
        items_to_pin,
        pin_items,
        pin_reviewed,
        to_pin,
        verdict,
    )

    try:
        context, report = _connect(args)
    except ConfigError as exc:
        return _refuse(str(exc))
    if report["state"] != "ready":
        return _refuse(f"{args.server}: could not connect ({report['failure']})")
    _print_unusable(report)
    if report["pins_unusable"]:
        # Writing would replace every pin it holds: the operator decides (move it away).
        return _refuse(
            f"{context.lock_file(args.server)} cannot be used; move it away and pin again"
        )
    tools: dict[str, dict[str, Any]] = report["tools"]
    selected = upstream_items.wanted_items(args)
    if args.tool:
        wanted = set(args.tool)
    elif selected:
        wanted = set()  # only the prompts and resources named
    else:
        wanted = {n for n, t in tools.items() if t["allowed"]}
    unknown = sorted(wanted - set(tools))
    if unknown:
        return _refuse(f"{args.server} does not list: {', '.join(unknown)}")
    if upstream_items.unknown_items(report, selected):
        return _refuse(f"{args.server} does not list a prompt or resource named")
    changes = to_pin(report, wanted)
    item_changes = items_to_pin(report, selected)
    print_table(_COLUMNS, _rows(report, only=set(wanted), verdicts=True))
    upstream_items.print_items(report, selected)
    if not changes and not item_changes:
        print(f"{args.server}: nothing to pin")
        _keep_definitions(context, args.server, tools, report["kept"], quiet=False)
        return EXIT_OK
    for name, digest in changes.items():
        before = tools[name]["pinned"] or "(none)"
        print(f"\n{name}: {verdict(tools[name])}, to pin: {before} -> {digest}")
        for line in change_lines(tools[name], report["kept"]):
            print(line)
    upstream_items.print_changes(report, item_changes)
    print()
    count = len(changes) + sum(len(v) for v in item_changes.values())
    if not args.yes:
        if not sys.stdin.isatty():
            return _refuse("no terminal to confirm on: pass --yes to write the pins")
        answer = input(f"write {count} pin(s) to {context.lock_file(args.server)}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("not written")
            return EXIT_DRIFT
    try:
        path = context.lock_file(args.server)
        if changes:
            path = pin_reviewed(context, args.server, report, changes)
        if item_changes:
            path = pin_items(context, args.server, item_changes)
    except (ConfigError, UnavailableError):
        return _refuse(f"{args.server}: the quarantine evidence could not be cleared: not written")
    print(f"wrote {count} pin(s) to {path}")
    _keep_definitions(context, args.server, tools, report["kept"], quiet=True)
    return EXIT_OK


def _keep_definitions(
    context: ReviewContext,
    server_id: str,
    tools: dict[str, dict[str, Any]],
    kept: PinnedDefinitions,
    *,
    quiet: bool,
) -> None:
    """Keep the listed definitions of the pinned tools beside the lock file, for the next
    diff (``review.keep_definitions``). The pins are written whatever happens here: a
    failure is one line on stderr."""
    from nexus_mcp.providers.upstream.review import keep_definitions

    try:
        path = keep_definitions(context, server_id, tools, kept, always=quiet)
    except OSError as exc:
        print(
            f"{server_id}: the pinned definitions could not be kept ({type(exc).__name__}): "
            "the pins hold, the next change is shown without a diff",
            file=sys.stderr,
        )
        return
    if not quiet and path is not None:
        print(f"kept the pinned definitions beside the pins in {path}, for later diffs")


def _connect(args: argparse.Namespace) -> tuple[ReviewContext, dict[str, Any]]:
    """The configuration, and what connecting to ``args.server`` as the gateway finds."""
    import asyncio

    from nexus_mcp.providers.upstream.review import inspect

    context = _load(args, server_id=args.server)
    return context, asyncio.run(inspect(context, args.server))


def served_registry(settings: Any) -> RegistrySet:
    from nexus_mcp.server.startup import load_served_registry

    return load_served_registry(settings)


def _load(args: argparse.Namespace, server_id: str | None = None) -> ReviewContext:
    # What connecting logs (quarantine warnings, an upstream's library records) goes to
    # stderr as JSON lines; stdout is the table.
    from nexus_mcp.observability.logs import ensure_logging
    from nexus_mcp.settings import load_settings

    ensure_logging()
    overrides: dict[str, Any] = {"mode": args.mode, "data_dir": args.data_dir}
    settings = load_settings(args.config, overrides)
    context = review_context(settings, args.config, args.registry_dir)
    if server_id is not None and context.config.get(server_id) is None:
        raise ConfigError(f"no upstream {server_id!r} in the configuration")
    return context


def review_context(
    settings: Settings, config: Path | None, registry_dir: Path | None = None
) -> ReviewContext:
    """The upstreams of ``config`` as ``serve`` would load them (``upstream`` commands and
    ``nexus-mcp console``, which have no running gateway)."""
    from nexus_mcp.policy.registry import load_registry_dir, upstream_registry_dir
    from nexus_mcp.policy.upstreams import load_upstreams
    from nexus_mcp.providers.upstream.review import ReviewContext
    from nexus_mcp.settings import config_sections

    upstreams = load_upstreams(
        config_sections(config).get("upstreams") if config is not None else None,
        mode=settings.mode,
        native_server_id=settings.registry.server_id,
        source=config,
    )
    # The upstream commands read upstream registries only: --registry-dir names their
    # folder; without it, the registries serve would load.
    registry = (
        load_registry_dir(registry_dir) if registry_dir is not None else served_registry(settings)
    )
    folder = registry_dir or upstream_registry_dir(
        settings.registry.directory, settings.registry.upstream_directory
    )
    return ReviewContext(upstreams, folder, settings.mode, registry, settings)


def _print_unusable(report: dict[str, Any]) -> int:
    """Skipped definitions, a cut listing and bad lock entries, on stderr; their count."""
    lines = [
        f"definition #{i['position']} skipped ({i['reason']}), sha256 {i['sha256']}"
        for i in report.get("invalid", ())
    ]
    if report.get("cut") is not None:
        reason, kept = report["cut"]
        lines.append(f"listing cut after {kept} definitions ({reason}): the rest is not exposed")
    lines.extend(report.get("pin_problems", ()))
    lines.extend(report.get("item_problems", ()))
    if "kept" in report:
        lines.extend(report["kept"].problems())
    for line in lines:
        print(f"{report['server_id']}: {line}", file=sys.stderr)
    return len(lines)


def _drift(report: dict[str, Any]) -> list[str]:
    from nexus_mcp.policy.pins import PinState

    drifted = [
        name
        for name, tool in report["tools"].items()
        if tool["allowed"] and (tool["pin"] != PinState.PINNED or tool["class"] == "unclassified")
    ]
    return drifted + [f"{name} (pinned, no longer listed)" for name in report["missing"]]


def _rows(
    report: dict[str, Any], only: set[str] | None = None, *, verdicts: bool = False
) -> list[Sequence[str]]:
    from nexus_mcp.providers.upstream.review import REMOVED_UPSTREAM, verdict

    rows: list[Sequence[str]] = []
    for name, tool in report["tools"].items():
        if only is not None and name not in only:
            continue
        rows.append(
            (
                report["server_id"],
                report["state"],
                name,
                tool["exposed"],
                tool["class"],
                verdict(tool) if verdicts else str(tool["pin"]),
                tool["status"],
            )
        )
    missing = REMOVED_UPSTREAM if verdicts else "missing"
    for name in report["missing"]:
        rows.append((report["server_id"], report["state"], name, "-", "-", missing, "-"))
    if not rows:
        rows.append((report["server_id"], report["state"], "-", "-", "-", "-", "-"))
    return rows


def _refuse(message: str) -> int:
    print(f"nexus-mcp upstream: {message}", file=sys.stderr)
    return EXIT_USAGE


__all__ = ["add_parser", "review_context"]
