"""The ``nexus-mcp profiles`` command: list and show profiles, assign, grant, revoke, inspect.

Operators manage tool visibility here without starting the server. Every action prints
plain text to stdout and returns an exit code: 0 done, 1 refused (unknown profile,
invalid tool name), 2 configuration problem (profile file or grants database). Subjects
that look like credentials are shown hashed in confirmations; ``inspect`` echoes the
subject the operator typed, since it is their own terminal.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from nexus_mcp.errors import ConfigError, NexusError, NotFoundError
from nexus_mcp.policy.grants import (
    DIRECT_RELATION,
    PROFILE_RELATION,
    assign_profile,
    grant_tool,
    revoke_profile_grants,
    revoke_tool,
    to_tool_name,
)
from nexus_mcp.policy.profiles import (
    ToolProfileConfig,
    default_profiles_path,
    load_profiles,
    select_profile,
)
from nexus_mcp.principal import ROLE_FALLBACK, to_log_subject
from nexus_mcp.state import GRANTS_DB
from nexus_mcp.stores.grants import DEFAULT_ZONE, TOOLS_PREFIX, SqliteTupleStore

DATA_DIR_ENV = "NEXUS_MCP_DATA_DIR"
DEFAULT_DATA_DIR = Path(".nexus-data")

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_CONFIG = 2

Action = Callable[[argparse.Namespace], int]


def default_grants_path() -> Path:
    """``$NEXUS_MCP_DATA_DIR/grants.sqlite3``, else ``./.nexus-data/grants.sqlite3``."""
    data_dir = os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    return Path(data_dir) / GRANTS_DB


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Add ``profiles`` and its actions; each action parser sets ``func``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", type=Path, help="grants SQLite file (default: data dir)")
    common.add_argument("--profiles", type=Path, help="tool profiles YAML file")
    common.add_argument("--zone", default=DEFAULT_ZONE, help="grants zone (default: %(default)s)")

    parser = subparsers.add_parser("profiles", help="manage tool profiles and grants")
    actions = parser.add_subparsers(dest="profiles_action", required=True, metavar="ACTION")

    _add(actions, "list", "list profiles and the role mapping", common, list_profiles)
    show = _add(actions, "show", "show one profile's resolved tools", common, show_profile)
    show.add_argument("name")
    assign = _add(actions, "assign", "assign a profile to a subject", common, assign_subject)
    assign.add_argument("subject")
    assign.add_argument("profile")
    grant = _add(actions, "grant", "grant one tool directly to a subject", common, grant_subject)
    grant.add_argument("subject")
    grant.add_argument("tool")
    revoke_parser = _add(
        actions, "revoke", "revoke a direct tool grant or the profile", common, revoke_subject
    )
    revoke_parser.add_argument("subject")
    which = revoke_parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--tool", help="remove this direct grant")
    which.add_argument("--profile", action="store_true", help="remove profile and assignment")
    inspect = _add(actions, "inspect", "the tools a subject would see", common, inspect_subject)
    inspect.add_argument("subject")
    inspect.add_argument("--role", default=ROLE_FALLBACK, help="role (default: %(default)s)")
    return parser


def list_profiles(args: argparse.Namespace) -> int:
    config = _load_config(args)
    if config is None:
        return EXIT_CONFIG
    rows = [
        (p.name, p.extends or "-", str(len(p.tools)), p.description)
        for p in config.profiles.values()
    ]
    _print_table(("PROFILE", "EXTENDS", "TOOLS", "DESCRIPTION"), rows)
    print(f"\ndefault profile: {config.default_profile}")
    roles = ", ".join(f"{role}={name}" for role, name in config.role_profiles.items())
    print(f"roles: {roles}")
    return EXIT_OK


def show_profile(args: argparse.Namespace) -> int:
    config = _load_config(args)
    if config is None:
        return EXIT_CONFIG
    profile = config.profiles.get(args.name)
    if profile is None:
        return _refuse("unknown profile; see 'nexus-mcp profiles list'")
    print(f"profile: {profile.name}")
    print(f"extends: {profile.extends or '-'}")
    print(f"description: {profile.description}")
    print(f"tools ({len(profile.tools)}):")
    for tool in sorted(profile.tools):
        print(f"  {tool}")
    return EXIT_OK


def assign_subject(args: argparse.Namespace) -> int:
    def act(config: ToolProfileConfig, store: SqliteTupleStore) -> str:
        if args.profile not in config.profiles:
            raise NotFoundError("unknown profile; see 'nexus-mcp profiles list'")
        revision = assign_profile(store, config, args.subject, args.profile, args.zone)
        return f"assigned profile '{args.profile}' (revision {revision})"

    return _with_store(args, act)


def grant_subject(args: argparse.Namespace) -> int:
    def act(config: ToolProfileConfig, store: SqliteTupleStore) -> str:
        revision = grant_tool(store, args.subject, args.tool, args.zone)
        return f"granted tool '{args.tool}' directly (revision {revision})"

    return _with_store(args, act)


def revoke_subject(args: argparse.Namespace) -> int:
    def act(config: ToolProfileConfig, store: SqliteTupleStore) -> str:
        if args.profile:
            revoke_profile_grants(store, args.subject, args.zone)
            revision = store.clear_assignment(args.subject, args.zone)
            return f"revoked profile grants and assignment (revision {revision})"
        revision = revoke_tool(store, args.subject, args.tool, args.zone)
        message = f"revoked direct grant of '{args.tool}' (revision {revision})"
        if store.check(args.subject, PROFILE_RELATION, TOOLS_PREFIX + args.tool, args.zone):
            message += "; the tool stays visible through the subject's profile"
        return message

    return _with_store(args, act)


def inspect_subject(args: argparse.Namespace) -> int:
    def act(config: ToolProfileConfig, store: SqliteTupleStore) -> str:
        selection = select_profile(
            config,
            principal_profile=None,
            stored_assignment=store.get_assignment(args.subject, args.zone),
            role=args.role,
        )
        direct = {
            to_tool_name(o)
            for o in store.list_objects(args.subject, DIRECT_RELATION, args.zone, TOOLS_PREFIX)
        }
        print(f"subject: {args.subject}")
        print(f"zone: {args.zone}")
        if selection.name is None:
            print(f"profile: none ({selection.source}): the subject sees no tools")
            return ""
        print(f"profile: {selection.name} (from {selection.source})")
        profile_tools = config.profiles[selection.name].tools
        sources: dict[str, list[str]] = {}
        for tool in profile_tools:
            sources.setdefault(tool, []).append(f"profile:{selection.name}")
        for tool in direct:
            sources.setdefault(tool, []).append("direct")
        rows = [(tool, ", ".join(sources[tool])) for tool in sorted(sources)]
        _print_table(("TOOL", "SOURCE"), rows)
        stored = store.list_objects(args.subject, PROFILE_RELATION, args.zone, TOOLS_PREFIX)
        if {to_tool_name(o) for o in stored} != profile_tools:
            print("note: stored profile grants differ; the next session brings them in line")
        return ""

    return _with_store(args, act)


def _add(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help_text: str,
    common: argparse.ArgumentParser,
    func: Action,
) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, help=help_text, parents=[common])
    parser.set_defaults(func=func)
    return parser


def _load_config(args: argparse.Namespace) -> ToolProfileConfig | None:
    try:
        return load_profiles(args.profiles or default_profiles_path())
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _with_store(
    args: argparse.Namespace, act: Callable[[ToolProfileConfig, SqliteTupleStore], str]
) -> int:
    """Open config and store, run one action, print its confirmation, always close."""
    config = _load_config(args)
    if config is None:
        return EXIT_CONFIG
    try:
        store = SqliteTupleStore(args.db or default_grants_path())
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        message = act(config, store)
    except NexusError as exc:
        return _refuse(f"{exc.message} ({exc.code})")
    finally:
        store.close()
    if message:
        print(f"{to_log_subject(args.subject)}: {message}")
    return EXIT_OK


def _refuse(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_REFUSED


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


__all__ = ["add_parser", "default_grants_path"]
