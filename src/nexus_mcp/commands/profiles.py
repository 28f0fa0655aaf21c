"""The ``nexus-mcp profiles`` command: list and show profiles, assign, grant, revoke, inspect.

Operators manage tool visibility here without starting the server. Every action prints
plain text to stdout and returns an exit code: 0 done, 1 refused (unknown profile,
invalid tool name, a tool no profile or registered server has), 2 configuration problem
(profile file, registry or grants database). Subjects that look like credentials are
shown hashed in confirmations; ``inspect`` echoes the subject the operator typed, since
it is their own terminal, and only reads: it creates and changes nothing.

Every action finds what ``serve`` would use as ``serve`` finds it: ``--config`` (else
``NEXUS_MCP_CONFIG``) names the configuration, whose ``profiles`` section gives the
profiles file and zone and whose ``state`` section the grants store (the PostgreSQL one
every replica shares, on ``state.backend: shared``); ``--profiles``, ``--zone``, ``--db``
and ``--data-dir`` override it. The tools a grant may name include those of the
configured upstreams under the names callers see (their registry entries, as ``serve``
exposes them), and ``show`` and ``inspect`` say for each upstream tool whether ``serve``
exposes it now, from the registry and the lock file, without starting the upstream.

``grant`` and ``revoke`` also take ``--resource SOURCE`` (``notes``, or an upstream server
id: every resource and template it exposes) and ``--prompt NAME`` (an exposed prompt),
granted directly as a tool is; a source or prompt no profile names and no configured
upstream has is refused unless ``--allow-unknown-tool`` is given.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from nexus_mcp.commands import print_table
from nexus_mcp.errors import ConfigError, NexusError, NotFoundError
from nexus_mcp.policy.resources import NOTES_SOURCE
from nexus_mcp.policy.tuples import PROMPTS_PREFIX, RESOURCES_PREFIX
from nexus_mcp.principal import ROLE_FALLBACK, to_log_subject
from nexus_mcp.stores.grants import DEFAULT_ZONE, TOOLS_PREFIX, SqliteTupleStore, TupleStore

# The settings, profiles, registry and grants logic are imported by each action that uses
# them: `profiles --help` builds its parser without loading any (issue 29).
if TYPE_CHECKING:
    from nexus_mcp.policy.grant_admin import ItemKind
    from nexus_mcp.policy.pins import PinFile
    from nexus_mcp.policy.profiles import ToolProfile, ToolProfileConfig
    from nexus_mcp.policy.registry import RegistrySet
    from nexus_mcp.policy.upstreams import UpstreamConfig
    from nexus_mcp.settings import Settings

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_CONFIG = 2
ALLOW_UNKNOWN_TOOL_FLAG = "--allow-unknown-tool"
UNKNOWN_TOOL_MESSAGE = (
    "no profile or registered server has this tool; check the name (see 'nexus-mcp "
    f"registry show'), or pass {ALLOW_UNKNOWN_TOOL_FLAG} for a tool of an upstream server "
    "that is not connected yet"
)
UNKNOWN_SOURCE_MESSAGE = (
    "no profile names this resource source and no configured upstream has this id "
    f"(the note resources are '{NOTES_SOURCE}'); pass {ALLOW_UNKNOWN_TOOL_FLAG} to grant it even so"
)
UNKNOWN_PROMPT_MESSAGE = (
    "no profile names this prompt and it has no configured upstream's name prefix; pass "
    f"{ALLOW_UNKNOWN_TOOL_FLAG} to grant it even so"
)
STALE_PROFILE_NOTE = (
    "note: the grants database holds another tool list for this profile than the profiles "
    "file; a server started before the file changed shows the stored list until it restarts"
)

Action = Callable[[argparse.Namespace], int]


def default_grants_path(data_dir: Path | None = None) -> Path:
    """The grants database ``serve`` uses: ``profiles.grants_db``, else
    ``<data dir>/grants.sqlite3`` (``--data-dir``, ``NEXUS_MCP_DATA_DIR``, else the per-user
    data directory). Raises ``ConfigError`` naming the setting when there is none."""
    from nexus_mcp.stores.locations import grants_path, load_state_settings

    return grants_path(load_state_settings(data_dir))


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Add ``profiles`` and its actions; each action parser sets ``func``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config", type=Path, default=None, metavar="FILE",
        help="the YAML configuration serve reads: its profiles file, zone, grants store "
        "and upstream tools [NEXUS_MCP_CONFIG]",
    )  # fmt: skip
    common.add_argument("--db", type=Path, help="grants SQLite file (default: data dir)")
    common.add_argument(
        "--data-dir", type=Path,
        help="the server's state folder (default: the per-user data directory, as serve) "
        "[NEXUS_MCP_DATA_DIR]",
    )  # fmt: skip
    common.add_argument(
        "--profiles", type=Path, help="tool profiles YAML file (default: the configuration's)"
    )
    common.add_argument(
        "--zone", default=None,
        help=f"grants zone (default: the configuration's, else {DEFAULT_ZONE})",
    )  # fmt: skip

    parser = subparsers.add_parser("profiles", help="manage tool profiles and grants")
    actions = parser.add_subparsers(dest="profiles_action", required=True, metavar="ACTION")

    _add(actions, "list", "list profiles and the role mapping", common, list_profiles)
    show = _add(actions, "show", "show one profile's resolved tools", common, show_profile)
    show.add_argument("name", metavar="PROFILE", help="a profile name (see 'profiles list')")
    assign = _add(actions, "assign", "assign a profile to a subject", common, assign_subject)
    _add_subject(assign)
    assign.add_argument("profile", metavar="PROFILE", help="a profile name (see 'profiles list')")
    grant = _add(
        actions, "grant", "grant one tool, resource source or prompt directly to a subject",
        common, grant_subject,
    )  # fmt: skip
    _add_subject(grant)
    granted = grant.add_mutually_exclusive_group(required=True)
    granted.add_argument(
        "tool", metavar="TOOL", nargs="?",
        help="a tool name that a profile or a registered server has (see 'registry show')",
    )  # fmt: skip
    granted.add_argument(
        "--resource", metavar="SOURCE",
        help=f"a resource source: '{NOTES_SOURCE}' or an upstream server id",
    )  # fmt: skip
    granted.add_argument("--prompt", metavar="NAME", help="an exposed prompt name")
    grant.add_argument(
        ALLOW_UNKNOWN_TOOL_FLAG, action="store_true",
        help="grant it even so: a tool, source or prompt of an upstream not connected yet",
    )  # fmt: skip
    revoke_parser = _add(
        actions, "revoke", "revoke a direct tool grant or the profile", common, revoke_subject
    )
    _add_subject(revoke_parser)
    which = revoke_parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--tool", help="remove this direct grant")
    which.add_argument("--resource", metavar="SOURCE", help="remove this direct source grant")
    which.add_argument("--prompt", metavar="NAME", help="remove this direct prompt grant")
    which.add_argument("--profile", action="store_true", help="remove profile and assignment")
    inspect = _add(actions, "inspect", "the tools a subject would see", common, inspect_subject)
    _add_subject(inspect)
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
    print_table(("PROFILE", "EXTENDS", "TOOLS", "DESCRIPTION"), rows)
    print(f"\ndefault profile: {config.default_profile}")
    roles = ", ".join(f"{role}={name}" for role, name in config.role_profiles.items())
    print(f"roles: {roles}")
    return EXIT_OK


def show_profile(args: argparse.Namespace) -> int:
    from nexus_mcp.policy.grant_admin import UNKNOWN_PROFILE

    config = _load_config(args)
    if config is None:
        return EXIT_CONFIG
    profile = config.profiles.get(args.name)
    if profile is None:
        return _refuse(UNKNOWN_PROFILE)
    print(f"profile: {profile.name}")
    print(f"extends: {profile.extends or '-'}")
    print(f"description: {profile.description}")
    try:
        states = upstream_states(args.settings, _config_path(args), profile.tools)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"tools ({len(profile.tools)}):")
    for tool in sorted(profile.tools):
        print(f"  {tool}  ({states[tool]})" if tool in states else f"  {tool}")
    for label, names in (("resources", profile.resources), ("prompts", profile.prompts)):
        if names:
            print(f"{label} ({len(names)}):")
            for name in sorted(names):
                print(f"  {name}")
    return EXIT_OK


def assign_subject(args: argparse.Namespace) -> int:
    from nexus_mcp.policy.grant_admin import assign

    def act(config: ToolProfileConfig, store: TupleStore) -> str:
        revision = assign(store, config, args.subject, args.profile, args.zone)
        return f"assigned profile '{args.profile}' (revision {revision})"

    return _with_store(args, act)


def grant_subject(args: argparse.Namespace) -> int:
    from nexus_mcp.policy.grants import grant_tool, to_tool_object

    # Checked before the database is opened: a refused grant creates nothing.
    config = _load_config(args)
    if config is None:
        return EXIT_CONFIG
    if args.resource is not None or args.prompt is not None:
        return _grant_resource_or_prompt(args, config)
    try:
        to_tool_object(args.tool)  # a name that cannot be a tool is INVALID_INPUT first
        if not args.allow_unknown_tool and args.tool not in known_tools(
            config, args.settings, _config_path(args)
        ):
            raise NotFoundError(UNKNOWN_TOOL_MESSAGE, kind="tool")
    except NexusError as exc:
        return _refuse(f"{exc.message} ({exc.code})")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    def act(config: ToolProfileConfig, store: TupleStore) -> str:
        revision = grant_tool(store, args.subject, args.tool, args.zone)
        return f"granted tool '{args.tool}' directly (revision {revision})"

    return _with_store(args, act)


def _grant_resource_or_prompt(args: argparse.Namespace, config: ToolProfileConfig) -> int:
    """``grant --resource SOURCE`` or ``grant --prompt NAME``, checked as a tool grant is
    (``grant_admin``: the console's Access page grants them on the same code)."""
    from nexus_mcp.policy.grant_admin import grant_item, item_object, known_item

    kind: ItemKind = "prompt" if args.prompt is not None else "resource"
    name = args.prompt if kind == "prompt" else args.resource
    try:
        item_object(kind, name)  # a name that cannot be a source or prompt: INVALID_INPUT
        if not args.allow_unknown_tool:
            upstreams = configured_upstreams(args.settings, _config_path(args))
            if not known_item(
                config,
                kind,
                name,
                upstream_ids=[u.server_id for u in upstreams],
                prompt_prefixes=[u.name_prefix for u in upstreams],
            ):
                message = UNKNOWN_PROMPT_MESSAGE if kind == "prompt" else UNKNOWN_SOURCE_MESSAGE
                raise NotFoundError(message, kind=kind)
    except NexusError as exc:
        return _refuse(f"{exc.message} ({exc.code})")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    def act(config: ToolProfileConfig, store: TupleStore) -> str:
        revision = grant_item(store, args.subject, kind, name, args.zone)
        what = "prompt" if kind == "prompt" else "resource source"
        return f"granted {what} '{name}' directly (revision {revision})"

    return _with_store(args, act)


def revoke_subject(args: argparse.Namespace) -> int:
    from nexus_mcp.policy.grant_admin import revoke_direct, revoke_profile

    def act(config: ToolProfileConfig, store: TupleStore) -> str:
        if args.profile:
            revision = revoke_profile(store, args.subject, args.zone)
            return f"revoked profile grants and assignment (revision {revision})"
        if args.resource is not None or args.prompt is not None:
            return _revoke_resource_or_prompt(args, config, store)
        revoked = revoke_direct(store, args.subject, args.tool, args.zone)
        message = f"revoked direct grant of '{args.tool}' (revision {revoked.revision})"
        if revoked.still_from_profile:
            message += "; the tool stays visible through the subject's profile"
        return message

    return _with_store(args, act)


def _revoke_resource_or_prompt(
    args: argparse.Namespace, config: ToolProfileConfig, store: TupleStore
) -> str:
    from nexus_mcp.policy.grant_admin import revoke_item

    kind: ItemKind = "prompt" if args.prompt is not None else "resource"
    name = args.prompt if kind == "prompt" else args.resource
    revoked = revoke_item(store, args.subject, kind, name, args.zone)
    what = "prompt" if kind == "prompt" else "resource source"
    message = f"revoked direct grant of {what} '{name}' (revision {revoked.revision})"
    if revoked.still_from_profile:
        message += f"; the {what} stays visible through the subject's profile"
    return message


def inspect_subject(args: argparse.Namespace) -> int:
    """Print what the subject would see; reads the grants database, creates nothing.

    Without a database (no server or command has used this data directory yet) the
    subject has no assignment and no direct grants: its role's profile applies.
    """
    config = _load_config(args)
    if config is None:
        return EXIT_CONFIG
    try:
        store, close = _open_for_reading(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        _print_inspection(args, config, store)
    finally:
        close()
    return EXIT_OK


def known_tools(
    config: ToolProfileConfig,
    settings: Settings | None = None,
    config_file: Path | None = None,
) -> frozenset[str]:
    """Every tool a profile names or a registered server classifies (the registries
    ``serve`` loads: ``registry.directory``, else the shipped one, and
    ``registry.upstream_directory``), and every name a configured upstream's classified
    tool is exposed under (as ``serve`` counts them)."""
    from nexus_mcp.stores.locations import load_state_settings

    settings = settings or load_state_settings()
    from nexus_mcp.server.startup import load_served_registry  # serve's own loading

    registries = load_served_registry(settings)
    tools = {tool for profile in config.profiles.values() for tool in profile.tools}
    tools.update(
        entry.tool_name for registry in registries.registries.values() for entry in registry.entries
    )
    for upstream in configured_upstreams(settings, config_file):
        registry = registries.get(upstream.server_id)
        for entry in registry.entries if registry is not None else ():
            exposed = upstream.exposed_name(entry.tool_name)
            if exposed is not None and upstream.allows(entry.tool_name):
                tools.add(exposed)
    return frozenset(tools)


def configured_upstreams(
    settings: Settings, config_file: Path | None
) -> tuple[UpstreamConfig, ...]:
    """The configuration's ``upstreams:`` (none without a configuration file)."""
    from nexus_mcp.policy.upstreams import load_upstreams
    from nexus_mcp.settings import config_sections

    if config_file is None:
        return ()
    raw = config_sections(config_file).get("upstreams")
    return load_upstreams(
        raw, mode=settings.mode, native_server_id=settings.registry.server_id
    ).servers


def upstream_states(
    settings: Settings, config_file: Path | None, tools: frozenset[str]
) -> dict[str, str]:
    """For each of ``tools`` that a configured upstream would expose: whether ``serve``
    exposes it now, from the configuration, the registry and the lock file (the upstream
    is not started: a tool it no longer lists, or whose definition changed, is known
    only to ``nexus-mcp upstream check``)."""
    from nexus_mcp.policy.pins import load_pins
    from nexus_mcp.policy.registry import upstream_registry_dir

    upstreams = configured_upstreams(settings, config_file)
    if not upstreams:
        return {}
    from nexus_mcp.server.startup import load_served_registry  # serve's own loading

    registries = load_served_registry(settings)
    states: dict[str, str] = {}
    for upstream in upstreams:
        pins = load_pins(
            upstream_registry_dir(
                settings.registry.directory, settings.registry.upstream_directory
            ),
            upstream.server_id,
        )
        for tool in sorted(tools):
            if tool in states or not tool.startswith(upstream.name_prefix):
                continue
            name = tool[len(upstream.name_prefix) :]
            if upstream.exposed_name(name) != tool:
                continue
            states[tool] = _upstream_state(upstream, name, registries, pins, settings.mode)
    return states


def _upstream_state(
    upstream: UpstreamConfig, name: str, registries: RegistrySet, pins: PinFile, mode: str
) -> str:
    from nexus_mcp.policy.classification import DEV_MODE

    where = f"upstream {upstream.server_id}"
    if not upstream.allows(name):
        return f"{where}: not in its tools: allowlist, never exposed"
    dev = mode == DEV_MODE
    if registries.lookup(upstream.server_id, name) is None:
        if dev:
            return f"{where}: unclassified (exposed in dev mode only)"
        return f"{where}: unclassified, hidden until its registry classifies it"
    if pins.quarantines(name):
        return f"{where}: its lock entry is unusable, hidden"
    if name not in pins.digests:
        if dev:
            return f"{where}: not pinned yet (exposed in dev mode only)"
        return (
            f"{where}: not pinned yet, hidden until 'nexus-mcp upstream pin {upstream.server_id}'"
        )
    return f"{where}: classified and pinned (exposed while it matches its pin)"


def _print_inspection(
    args: argparse.Namespace, config: ToolProfileConfig, store: TupleStore | None
) -> None:
    from nexus_mcp.policy.grants import DIRECT_RELATION, to_tool_name
    from nexus_mcp.policy.profiles import select_profile

    assignment = store.get_assignment(args.subject, args.zone) if store is not None else None
    direct = (
        {
            to_tool_name(o)
            for o in store.list_objects(args.subject, DIRECT_RELATION, args.zone, TOOLS_PREFIX)
        }
        if store is not None
        else set()
    )
    selection = select_profile(
        config, principal_profile=None, stored_assignment=assignment, role=args.role
    )
    print(f"subject: {args.subject}")
    print(f"zone: {args.zone}")
    if selection.name is None:
        print(f"profile: none ({selection.source}): the subject sees no tools")
        return
    print(f"profile: {selection.name} (from {selection.source})")
    profile_tools = config.profiles[selection.name].tools
    sources: dict[str, list[str]] = {}
    for tool in profile_tools:
        sources.setdefault(tool, []).append(f"profile:{selection.name}")
    for tool in direct:
        sources.setdefault(tool, []).append("direct")
    states = upstream_states(args.settings, _config_path(args), frozenset(sources))
    if states:
        rows: list[tuple[str, ...]] = [
            (tool, ", ".join(sources[tool]), states.get(tool, "-")) for tool in sorted(sources)
        ]
        print_table(("TOOL", "SOURCE", "UPSTREAM"), rows)
    else:
        rows = [(tool, ", ".join(sources[tool])) for tool in sorted(sources)]
        print_table(("TOOL", "SOURCE"), rows)
    _print_resources_and_prompts(args, config.profiles[selection.name], store)
    stored = _served_profile_tools(store, selection.name, args.zone)
    if stored is not None and stored != profile_tools:
        print(STALE_PROFILE_NOTE)


def _print_resources_and_prompts(
    args: argparse.Namespace, profile: ToolProfile, store: TupleStore | None
) -> None:
    """The resource sources and prompts the subject gets: its profile's and direct ones."""
    from nexus_mcp.policy.grants import DIRECT_RELATION

    for label, granted, prefix in (
        ("RESOURCE SOURCE", profile.resources, RESOURCES_PREFIX),
        ("PROMPT", profile.prompts, PROMPTS_PREFIX),
    ):
        direct = (
            store.list_objects(args.subject, DIRECT_RELATION, args.zone, prefix)
            if store is not None
            else []
        )
        sources: dict[str, list[str]] = {n: [f"profile:{profile.name}"] for n in granted}
        for obj in direct:
            sources.setdefault(obj.removeprefix(prefix), []).append("direct")
        if sources:
            print()
            print_table((label, "SOURCE"), [(n, ", ".join(sources[n])) for n in sorted(sources)])


def _served_profile_tools(
    store: TupleStore | None, profile: str, zone: str
) -> frozenset[str] | None:
    """The tools a server wrote for ``profile`` when it started (``None``: no server has
    started with this database and zone, so there is nothing to differ from)."""
    from nexus_mcp.identity.access import PROFILE_SUBJECT_PREFIX, profile_subject
    from nexus_mcp.policy.grants import PROFILE_RELATION, to_tool_name

    if store is None:
        return None
    if not any(s.startswith(PROFILE_SUBJECT_PREFIX) for s in store.list_subjects(zone)):
        return None
    objects = store.list_objects(profile_subject(profile), PROFILE_RELATION, zone, TOOLS_PREFIX)
    return frozenset(to_tool_name(o) for o in objects)


def _open_for_reading(
    args: argparse.Namespace,
) -> tuple[TupleStore | None, Callable[[], None]]:
    """The grants store ``serve`` uses (or ``--db``) and how to close it: the shared one
    when configured, else the SQLite file read-only; ``None`` if that file is absent."""
    from nexus_mcp.stores.locations import grants_path

    settings = args.settings if args.db is None else None
    if settings is not None and settings.state.backend == "shared":
        from nexus_mcp.stores.backends import open_shared_grants

        return open_shared_grants(settings, os.environ)
    db = args.db if settings is None else grants_path(settings)
    if not db.exists():
        return None, lambda: None
    store = SqliteTupleStore(db, read_only=True)
    return store, store.close


def _add_subject(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "subject", metavar="SUBJECT",
        help="the caller: a token's 'sub' claim, or NEXUS_MCP_SUBJECT on stdio",
    )  # fmt: skip


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
    """The profiles file, after the settings ``serve`` would run with (``args.settings``;
    the zone, when ``--zone`` is not given)."""
    from nexus_mcp.policy.profiles import default_profiles_path, load_profiles

    try:
        args.settings = _settings(args)
        if args.zone is None:
            args.zone = args.settings.profiles.zone
        path = args.profiles or args.settings.profiles.file or default_profiles_path()
        return load_profiles(path)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _settings(args: argparse.Namespace) -> Settings:
    """The settings ``serve`` would run with: ``--config``, else ``NEXUS_MCP_CONFIG``;
    ``--data-dir`` wins over both."""
    from nexus_mcp.settings import load_settings

    return load_settings(
        _config_path(args), {"data_dir": args.data_dir}, flags={"data_dir": "--data-dir"}
    )


def _config_path(args: argparse.Namespace) -> Path | None:
    from nexus_mcp.stores.locations import CONFIG_ENV

    if args.config is not None:
        return Path(args.config)
    return Path(os.environ[CONFIG_ENV]) if os.environ.get(CONFIG_ENV) else None


def _with_store(
    args: argparse.Namespace, act: Callable[[ToolProfileConfig, TupleStore], str]
) -> int:
    """Open config and store, run one action, print its confirmation, always close."""
    config = _load_config(args)
    if config is None:
        return EXIT_CONFIG
    try:
        store, close = _open_store(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        message = act(config, store)
    except NexusError as exc:
        return _refuse(f"{exc.message} ({exc.code})")
    finally:
        close()
    if message:
        print(f"{to_log_subject(args.subject)}: {message}")
    return EXIT_OK


def _open_store(args: argparse.Namespace) -> tuple[TupleStore, Callable[[], None]]:
    """The grants store ``serve`` uses (or ``--db``), and how to close it.

    With ``state.backend: shared`` it is the PostgreSQL store every replica reads, and a
    change is announced to all of them at once; otherwise the SQLite file, its folder made
    and writable.
    """
    from nexus_mcp.stores.locations import (
        DATA_DIR_SETTING,
        GRANTS_DB_SETTING,
        grants_path,
        prepare_folder,
    )

    if args.db is not None:
        store = SqliteTupleStore(args.db)  # its own error names the file given
        return store, store.close
    settings = args.settings
    if settings.state.backend == "shared":
        from nexus_mcp.stores.backends import open_shared_grants

        return open_shared_grants(settings, os.environ)
    db = grants_path(settings)
    # A folder that cannot be made or written is one line naming the setting to change.
    prepare_folder(
        db.parent, GRANTS_DB_SETTING if settings.profiles.grants_db else DATA_DIR_SETTING
    )
    store = SqliteTupleStore(db)
    return store, store.close


def _refuse(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_REFUSED


__all__ = ["add_parser", "default_grants_path"]
