"""``nexus-mcp upstream``: the upstream MCP servers of a configuration, their tools and pins.

nexus-mcp upstream list  --config FILE           servers, state, tools, class, pin state
nexus-mcp upstream check --config FILE SERVER    connect, list, diff against registry and
                                                 pins; exit 1 on drift
nexus-mcp upstream pin   --config FILE SERVER [--tool T] [--yes]
                                                 show the diff, then write the pins

``check`` says of every tool whether it is "pinned, unchanged", "not pinned yet",
"changed" (with a diff of its title, description, schemas and annotations against the
definition it was pinned from) or "removed upstream"; ``pin`` shows the same diff (the
whole definition, for a tool not pinned yet) before it asks and writes. What an upstream
wrote is escaped and bounded before it reaches the terminal (``upstream_diff.py``).

Each command connects the way ``serve`` would (the same ``UpstreamServer``), as the
gateway itself (no caller's identity), and lists the tools; nothing is called. It reads
the quarantine evidence ``serve`` keeps (the data directory's file on the embedded
backend, Redis on the shared one), so a definition that changed and was reverted shows as
changed; ``pin`` clears that evidence for the tools it pins, then writes their pins with
a new stamp (a running server forgets its own copy when it reads the new lock file).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nexus_mcp.commands import print_table
from nexus_mcp.commands.upstream_diff import definition_diff
from nexus_mcp.errors import ConfigError, UnavailableError
from nexus_mcp.observability.logs import ensure_logging
from nexus_mcp.policy.pins import (
    PinnedDefinitions,
    PinState,
    load_pinned_definitions,
    load_pins,
    lock_path,
    write_pinned_definitions,
    write_pins,
)
from nexus_mcp.policy.quarantine import PersistedEvidence
from nexus_mcp.policy.registry import (
    RegistrySet,
    load_registry_dir,
    upstream_registry_dir,
)
from nexus_mcp.policy.upstreams import UpstreamsConfig, load_upstreams, resolve_secrets
from nexus_mcp.settings import Settings, config_sections, load_settings
from nexus_mcp.stores.locations import upstream_quarantine_path
from nexus_mcp.stores.sqlite_quarantine import SqliteQuarantineEvidence

if TYPE_CHECKING:
    from nexus_mcp.stores.redis_quarantine import RedisSeenDigests

EXIT_OK = 0
EXIT_DRIFT = 1
EXIT_USAGE = 2

_COLUMNS = ("server", "state", "tool", "exposed as", "class", "pin", "status")

# What ``check`` and ``pin`` say of a tool's pin.
PINNED_UNCHANGED = "pinned, unchanged"
NOT_PINNED_YET = "not pinned yet"
CHANGED = "changed"
REMOVED_UPSTREAM = "removed upstream"
PIN_UNUSABLE = "pin unusable"
ONLY_DIGEST = "(the lock file has only the digest, re-pin to see diffs next time)"


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
    pin.set_defaults(func=run_pin)


def run_list(args: argparse.Namespace) -> int:
    rows: list[Sequence[str]] = []
    try:
        context = _load(args)
        for server_id in context.server_ids:
            rows.extend(_rows(asyncio.run(_inspect(context, server_id))))
    except ConfigError as exc:
        return _refuse(str(exc))
    if not rows:
        print("no upstreams configured")
        return EXIT_OK
    print_table(_COLUMNS, rows)
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    try:
        _context, report = _connect(args)
    except ConfigError as exc:
        return _refuse(str(exc))
    print_table(_COLUMNS, _rows(report, verdicts=True))
    for name, tool in report["tools"].items():
        if tool["allowed"] and _verdict(tool) == CHANGED:
            print(f"\n{name}: {CHANGED}")
            for line in _change_lines(tool, report["kept"]):
                print(line)
    drift = _drift(report)
    unusable = _print_unusable(report)
    if report["state"] != "ready":
        print(f"{args.server}: could not connect ({report['failure']})", file=sys.stderr)
        return EXIT_DRIFT
    if drift:
        print(f"{args.server}: {len(drift)} tool(s) drifted: {', '.join(drift)}", file=sys.stderr)
        return EXIT_DRIFT
    if unusable:
        return EXIT_DRIFT
    print(f"{args.server}: every listed tool is classified and pinned")
    return EXIT_OK


def run_pin(args: argparse.Namespace) -> int:
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
    wanted = set(args.tool) if args.tool else {n for n, t in tools.items() if t["allowed"]}
    unknown = sorted(wanted - set(tools))
    if unknown:
        return _refuse(f"{args.server} does not list: {', '.join(unknown)}")
    changes = {
        name: tools[name]["sha256"]
        for name in sorted(wanted)
        if tools[name]["pin"] != PinState.PINNED
    }
    print_table(_COLUMNS, _rows(report, only=set(wanted), verdicts=True))
    if not changes:
        print(f"{args.server}: nothing to pin")
        _keep_definitions(context, args.server, tools, report["kept"], quiet=False)
        return EXIT_OK
    for name, digest in changes.items():
        before = tools[name]["pinned"] or "(none)"
        print(f"\n{name}: {_verdict(tools[name])}, to pin: {before} -> {digest}")
        for line in _change_lines(tools[name], report["kept"]):
            print(line)
    print()
    if not args.yes:
        if not sys.stdin.isatty():
            return _refuse("no terminal to confirm on: pass --yes to write the pins")
        answer = input(f"write {len(changes)} pin(s) to {context.lock_file(args.server)}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("not written")
            return EXIT_DRIFT
    try:
        # First the evidence, then the lock file: a server that reads the new pins finds
        # no evidence left against them.
        _clear_evidence(context, args.server, {n: tools[n]["pinned"] for n in changes}, changes)
    except (ConfigError, UnavailableError):
        return _refuse(f"{args.server}: the quarantine evidence could not be cleared: not written")
    pins = load_pins(context.registry_dir, args.server).with_pins(changes, renew=True)
    path = write_pins(pins)
    print(f"wrote {len(changes)} pin(s) to {path}")
    _keep_definitions(context, args.server, tools, report["kept"], quiet=True)
    return EXIT_OK


def _keep_definitions(
    context: _Context,
    server_id: str,
    tools: dict[str, dict[str, Any]],
    kept: PinnedDefinitions,
    *,
    quiet: bool,
) -> None:
    """Keep the listed definitions of the pinned tools beside the lock file (only those
    that hash to their pin), for the next diff. The pins are written whatever happens
    here: a failure is one line on stderr."""
    pins = load_pins(context.registry_dir, server_id)
    if pins.unusable is not None:
        return
    listed = {name: tool["definition"] for name, tool in tools.items()}
    missing = [
        name
        for name, digest in pins.digests.items()
        if kept.for_pin(name, digest) is None and name in listed
    ]
    if quiet is False and not missing:
        return
    try:
        path = write_pinned_definitions(context.registry_dir, pins, listed)
    except OSError as exc:
        print(
            f"{server_id}: the pinned definitions could not be kept ({type(exc).__name__}): "
            "the pins hold, the next change is shown without a diff",
            file=sys.stderr,
        )
        return
    if not quiet:
        print(f"kept the pinned definitions beside the pins in {path}, for later diffs")


def _connect(args: argparse.Namespace) -> tuple[_Context, dict[str, Any]]:
    """The configuration, and what connecting to ``args.server`` as the gateway finds."""
    context = _load(args, server_id=args.server)
    return context, asyncio.run(_inspect(context, args.server))


class _Context:
    def __init__(
        self,
        config: UpstreamsConfig,
        registry_dir: Path,
        mode: str,
        registry: RegistrySet,
        settings: Settings,
    ) -> None:
        self.registry = registry
        self.config = config
        self.registry_dir = registry_dir
        self.mode = mode
        self.settings = settings
        self._redis: Any = None

    def persisted(self) -> PersistedEvidence | None:
        """The embedded backend's evidence file, when there is one (never created here)."""
        if self.settings.state.backend == "shared":
            return None
        path = upstream_quarantine_path(self.settings)
        return SqliteQuarantineEvidence(path) if path.exists() else None

    def shared(self) -> RedisSeenDigests | None:
        """The shared backend's evidence store (Redis), as ``serve`` opens it."""
        if self.settings.state.backend != "shared":
            return None
        from nexus_mcp.stores.backends import resolve_url
        from nexus_mcp.stores.redis_quarantine import RedisSeenDigests
        from nexus_mcp.stores.redis_state import redis_client

        state = self.settings.state
        if self._redis is None:
            url = resolve_url(state.redis_url, "state.redis_url", self.settings, os.environ)
            self._redis = redis_client(
                url,
                pool_size=1,
                connect_timeout=state.connect_timeout_seconds,
                timeout=state.timeout_seconds,
            )
        return RedisSeenDigests(self._redis, state.key_prefix)

    @property
    def server_ids(self) -> list[str]:
        return [s.server_id for s in self.config.servers]

    def lock_file(self, server_id: str) -> Path:
        return lock_path(self.registry_dir, server_id)


def served_registry(settings: Any) -> RegistrySet:
    from nexus_mcp.server.startup import load_served_registry

    return load_served_registry(settings)


def _load(args: argparse.Namespace, server_id: str | None = None) -> _Context:
    # What connecting logs (quarantine warnings, an upstream's library records) goes to
    # stderr as JSON lines; stdout is the table.
    ensure_logging()
    overrides: dict[str, Any] = {"mode": args.mode, "data_dir": args.data_dir}
    settings = load_settings(args.config, overrides)
    registry_dir = args.registry_dir or upstream_registry_dir(
        settings.registry.directory, settings.registry.upstream_directory
    )
    config = load_upstreams(
        config_sections(args.config).get("upstreams"),
        mode=settings.mode,
        native_server_id=settings.registry.server_id,
        source=args.config,
    )
    if server_id is not None and config.get(server_id) is None:
        raise ConfigError(f"no upstream {server_id!r} in the configuration")
    # The upstream commands read upstream registries only: --registry-dir names their
    # folder; without it, the registries serve would load.
    registry = (
        load_registry_dir(args.registry_dir)
        if args.registry_dir is not None
        else served_registry(settings)
    )
    return _Context(config, registry_dir, settings.mode, registry, settings)


async def _inspect(context: _Context, server_id: str) -> dict[str, Any]:
    """Connect as the gateway, list, and say what serve would decide for every tool."""
    from nexus_mcp.providers.upstream.server import UpstreamServer  # FastMCP: only when connecting

    upstream = context.config.get(server_id)
    assert upstream is not None
    registry = context.registry
    server = UpstreamServer(
        upstream,
        secrets=resolve_secrets(upstream, os.environ),
        registry=registry,
        registry_dir=context.registry_dir,
        mode=context.mode,
        on_change=lambda _server: None,
        seen=context.shared(),
    )
    persisted = context.persisted()
    if persisted is not None:
        server.use_persisted(persisted)
    try:
        await server.start()
        await server.wait_first_attempt(upstream.timeouts.connect_seconds + 1)
        tools = {
            name: {
                "exposed": view.exposed_name or "-",
                "class": view.entry.tool_class if view.entry is not None else "unclassified",
                "pin": view.pin_state,
                "pinned": server.pins.digests.get(name),
                "sha256": view.digest,
                "status": view.status,
                "allowed": view.status != "not_allowed",
                "upstream_name": name,
                "definition": view.definition,
                "broken": name in server.pins.broken or server.pins.unusable is not None,
                "seen": server.other_digest(name),
            }
            for name, view in sorted(server.views.items())
        }
        missing = sorted(set(server.pins.digests) - set(server.views))
        return {
            "server_id": server_id,
            "state": server.state,
            "failure": server.last_failure,
            "tools": tools,
            "missing": missing,
            "kept": load_pinned_definitions(context.registry_dir, server_id),
            **_listing_report(server),
        }
    finally:
        await server.close()


def _listing_report(server: Any) -> dict[str, Any]:
    """What the listing and the lock file held that could not be used (by position)."""
    return {
        "invalid": [i.as_record() for i in server.invalid],
        "cut": server.listing_cut,
        "pin_problems": server.pins.problems(),
        "pins_unusable": server.pins.unusable is not None,
    }


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
    if "kept" in report:
        lines.extend(report["kept"].problems())
    for line in lines:
        print(f"{report['server_id']}: {line}", file=sys.stderr)
    return len(lines)


def _clear_evidence(
    context: _Context, server_id: str, pinned: dict[str, str | None], digests: dict[str, str]
) -> None:
    """Forget the quarantine evidence against the tools about to be pinned, under their
    old pin and their new one, in the store ``serve`` keeps it in."""
    persisted = context.persisted()
    if persisted is not None:
        persisted.clear(server_id, frozenset(digests))
    shared = context.shared()
    if shared is not None:
        for name, digest in digests.items():
            shared.clear(server_id, name, (pinned.get(name), digest))


def _drift(report: dict[str, Any]) -> list[str]:
    drifted = [
        name
        for name, tool in report["tools"].items()
        if tool["allowed"] and (tool["pin"] != PinState.PINNED or tool["class"] == "unclassified")
    ]
    return drifted + [f"{name} (pinned, no longer listed)" for name in report["missing"]]


def _verdict(tool: dict[str, Any]) -> str:
    """What ``check`` says of a listed tool's pin."""
    if tool["broken"]:
        return PIN_UNUSABLE
    if tool["pin"] == PinState.PINNED:
        return PINNED_UNCHANGED
    if tool["pin"] == PinState.UNPINNED:
        return NOT_PINNED_YET
    return CHANGED


def _change_lines(tool: dict[str, Any], kept: PinnedDefinitions) -> list[str]:
    """How a tool about to be pinned, or that changed, differs from its pin (indented)."""
    pinned = tool["pinned"]
    if pinned is None:
        return definition_diff(None, tool["definition"])
    if tool["sha256"] == pinned:
        if tool["seen"] is None:
            return []
        return [
            "    the listing matches the pin again, but a session was shown another "
            f"definition (sha256 {tool['seen']}): re-pin once that is understood"
        ]
    before = kept.for_pin(tool["upstream_name"], pinned)
    if before is None:
        return [f"    {ONLY_DIGEST}"]
    return definition_diff(before, tool["definition"])


def _rows(
    report: dict[str, Any], only: set[str] | None = None, *, verdicts: bool = False
) -> list[Sequence[str]]:
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
                _verdict(tool) if verdicts else str(tool["pin"]),
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


__all__ = ["add_parser"]
