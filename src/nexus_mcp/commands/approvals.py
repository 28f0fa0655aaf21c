"""The ``approvals`` subcommand: mint and verify approval tokens from an operator's shell.

``nexus-mcp approvals mint --tool T --subject S --approver A --args JSON|@FILE`` prints a
token; ``nexus-mcp approvals verify TOKEN --tool T --subject S --args JSON|@FILE`` prints
the verified claims as JSON (the ``jti`` only as its sha256) or the error code. The
secret comes from ``NEXUS_MCP_APPROVAL_SECRET`` / ``NEXUS_MCP_APPROVAL_KEYS`` or the
``approvals`` section of ``--config``; it is never printed. ``mint`` approves only a write
tool of the server that ``--config`` (its ``registry`` settings) describes, refused exactly
as ``POST /approvals/mint`` refuses it.

Exit codes: 0 success, 1 token refused (verify) or minting refused (not a write tool),
2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from nexus_mcp.commands.inbox import add_inbox_commands
from nexus_mcp.errors import ApprovalError, ConfigError, InvalidInputError
from nexus_mcp.policy.approvals import (
    ENV_AUDIENCE,
    ENV_ISSUER,
    MAX_APPROVAL_TTL_SECONDS,
    MIN_APPROVAL_TTL_SECONDS,
    ApprovalKeys,
    ApprovalSettings,
    approval_jti_digest,
    check_mintable_tool,
    load_approval_keys,
    load_approval_settings,
    mint_approval_token,
    verify_approval_token,
)
from nexus_mcp.policy.hashing import first_unrepresentable

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
DEFAULT_CLI_HOST_ID = "nexus-mcp-cli"


class _UsageError(Exception):
    """A bad flag value; its message is ours, never the value."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``approvals mint`` and ``approvals verify`` on the top-level CLI."""
    approvals = subparsers.add_parser(
        "approvals", help="the approvals inbox; mint and verify approval tokens"
    )
    actions = approvals.add_subparsers(dest="approvals_command", required=True)

    mint = actions.add_parser("mint", help="print an approval token for one exact call")
    _add_binding_flags(mint)
    mint.add_argument("--approver", required=True, help="who approves (the token's sub)")
    mint.add_argument("--host-id", default=DEFAULT_CLI_HOST_ID, help="minting host id")
    mint.add_argument("--ttl", type=int, default=None, help="lifetime in seconds (120-300)")
    mint.set_defaults(func=run_mint)

    verify = actions.add_parser("verify", help="check a token against a call")
    verify.add_argument("token", help="the approval token")
    _add_binding_flags(verify)
    verify.set_defaults(func=run_verify)

    # The inbox: requests an agent's write opened, decided by a person (commands/inbox.py).
    add_inbox_commands(actions)


def run_mint(args: argparse.Namespace) -> int:
    try:
        keys, settings = _load_keys_and_settings(args)
        arguments = _read_arguments(args.args)
        tool_class = registry_tool_class(args.config, args.tool)
    except (ConfigError, _UsageError) as exc:
        return _fail_usage(str(exc))
    try:
        check_mintable_tool(tool_class)
    except InvalidInputError as exc:
        print(f"error: {exc.message} ({exc.code})", file=sys.stderr)
        return EXIT_REFUSED
    try:
        token = mint_approval_token(
            keys,
            settings,
            approver=args.approver,
            subject=args.subject,
            tool=args.tool,
            arguments=arguments,
            host_id=args.host_id,
        )
    except InvalidInputError as exc:  # an empty --approver, --subject or --host-id
        return _fail_usage(exc.message)
    print(token)
    return EXIT_OK


def run_verify(args: argparse.Namespace) -> int:
    try:
        keys, settings = _load_keys_and_settings(args)
        arguments = _read_arguments(args.args)
    except (ConfigError, _UsageError) as exc:
        return _fail_usage(str(exc))
    try:
        claims = verify_approval_token(
            keys, settings, args.token, subject=args.subject, tool=args.tool, arguments=arguments
        )
    except ApprovalError as exc:
        refusal: dict[str, Any] = {"code": str(exc.code)}
        if "reason" in exc.facts:
            refusal["reason"] = exc.facts["reason"]
        print(json.dumps(refusal, sort_keys=True))
        return EXIT_REFUSED
    shown = {
        "ver": claims.ver,
        "iss": claims.iss,
        "aud": claims.aud,
        "sub": claims.sub,
        "iat": claims.iat,
        "nbf": claims.nbf,
        "exp": claims.exp,
        "jti_sha256": approval_jti_digest(claims),
        "tool": claims.tool,
        "args_sha256": claims.args_sha256,
        "subject": claims.subject,
        "host_id": claims.host_id,
    }
    print(json.dumps(shown, sort_keys=True, indent=2))
    return EXIT_OK


def _add_binding_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tool", required=True, help="the tool the token approves")
    parser.add_argument("--subject", required=True, help="the caller allowed to use it")
    parser.add_argument(
        "--args", required=True, help="the exact tool arguments: a JSON object or @FILE"
    )
    parser.add_argument("--config", default=None, help="YAML configuration file")
    parser.add_argument("--audience", default=None, help=f"overrides {ENV_AUDIENCE}")
    parser.add_argument("--issuer", default=None, help=f"overrides {ENV_ISSUER}")


def registry_tool_class(config: str | None, tool: str) -> str | None:
    """The class the server's registry gives ``tool`` (``None``: not a tool of this server).

    The registry is the one ``serve --config`` loads (``registry.directory`` and
    ``registry.server_id``); start-up refuses a native tool whose class disagrees with it,
    so this is the class the server's own mint endpoint checks.
    """
    # Imported here: `approvals --help` needs none of them (issue 29).
    from nexus_mcp.policy.registry import default_registry_dir, load_registry_dir
    from nexus_mcp.policy.repos import load_repos_config
    from nexus_mcp.policy.upstreams import load_upstreams
    from nexus_mcp.repos.writes import WRITE_OPERATIONS as REPO_WRITE_TOOLS
    from nexus_mcp.settings import config_sections, load_settings

    settings = load_settings(Path(config) if config else None)
    registries = load_registry_dir(
        settings.registry.directory or default_registry_dir(),
        upstream_directory=settings.registry.upstream_directory,
    )
    server_id, name = settings.registry.server_id, tool
    # A tool of an upstream server is named by its exposed name (prefix + its own name).
    source = Path(config) if config else None
    upstreams = load_upstreams(
        config_sections(source).get("upstreams"),
        mode=settings.mode,
        native_server_id=settings.registry.server_id,
        source=source,
    )
    for upstream in upstreams.servers:
        prefix = upstream.name_prefix
        if tool.startswith(prefix) and upstream.allows(tool[len(prefix) :]):
            server_id, name = upstream.server_id, tool[len(prefix) :]
            break
    if server_id == settings.registry.server_id and name in REPO_WRITE_TOOLS:
        # Mounted only where repositories are configured, as ``serve`` does.
        repos = load_repos_config(
            config_sections(source).get("repos"), mode=settings.mode, source=source
        )
        if not repos.enabled:
            return None
    entry = registries.lookup(server_id, name)
    return entry.tool_class if entry is not None else None


def _load_keys_and_settings(args: argparse.Namespace) -> tuple[ApprovalKeys, ApprovalSettings]:
    config = _read_config(args.config)
    env: dict[str, str] = dict(os.environ)
    settings = load_approval_settings(env, config)
    # Flags win over the environment and the file; a bad value names the flag it came from.
    for flag, name, value in (
        ("--audience", "audience", args.audience),
        ("--issuer", "issuer", args.issuer),
        ("--ttl", "ttl_seconds", getattr(args, "ttl", None)),
    ):
        if value is None:
            continue
        try:
            settings = dataclasses.replace(settings, **{name: value})
        except ConfigError:
            raise _UsageError(f"{flag}: {_FLAG_RULES[name]}") from None
    return load_approval_keys(env, config), settings


_FLAG_RULES = {
    "audience": "must be a non-empty string of at most 256 characters",
    "issuer": "must be a non-empty string of at most 256 characters",
    "ttl_seconds": f"must be between {MIN_APPROVAL_TTL_SECONDS} and "
    f"{MAX_APPROVAL_TTL_SECONDS} seconds",
}


def _read_config(path: str | None) -> Mapping[str, Any] | None:
    if path is None:
        return None
    try:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        raise ConfigError("--config: the file cannot be read as YAML") from None
    if loaded is None:
        return None
    if not isinstance(loaded, Mapping):
        raise ConfigError("--config: the file must hold a YAML mapping")
    return loaded


def _read_arguments(raw: str) -> dict[str, Any]:
    text = raw
    if raw.startswith("@"):
        try:
            text = Path(raw[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise _UsageError("--args: the file cannot be read") from None
    try:
        value = json.loads(text)
    except ValueError:  # not JSON, or an integer past Python's digit limit
        raise _UsageError("--args: not valid JSON") from None
    if not isinstance(value, dict):
        raise _UsageError("--args: must be a JSON object")
    if first_unrepresentable(value) is not None:  # Python reads NaN and Infinity; JSON has none
        raise _UsageError("--args: not valid JSON (a number is NaN or infinite)")
    return value


def _fail_usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


__all__ = ["add_parser", "registry_tool_class", "run_mint", "run_verify"]
