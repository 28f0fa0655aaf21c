"""``nexus-mcp init``: write a commented starter ``nexus.yaml``, or print its JSON Schema."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_NAME = "nexus.yaml"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "init",
        help="write a starter nexus.yaml (or print its JSON Schema)",
        description=(
            "Write a commented starter configuration file: the workspace, a write policy, "
            "the approval mode and where roles and profiles are set. An existing file is "
            "never overwritten. Its first line names the JSON Schema, so editors with the "
            "YAML language server complete and check it."
        ),
    )
    parser.add_argument(
        "path", nargs="?", type=Path, default=Path(DEFAULT_CONFIG_NAME),
        help=f"where to write it (default ./{DEFAULT_CONFIG_NAME})",
    )  # fmt: skip
    parser.add_argument(
        "--workspace", type=Path, default=None, metavar="DIR",
        help="the folder the tools serve (default: the current folder)",
    )  # fmt: skip
    parser.add_argument(
        "--print-schema", action="store_true",
        help="print the JSON Schema of nexus.yaml and write nothing",
    )  # fmt: skip
    parser.set_defaults(func=run_init)


def yaml_string(text: str) -> str:
    """``text`` as a YAML double-quoted scalar (a JSON string is one)."""
    return json.dumps(text, ensure_ascii=False)


def starter_config(workspace: Path, schema: str) -> str:
    """The starter file's text: it loads and serves as it is (``tests/unit/commands``)."""
    return f"""\
# yaml-language-server: $schema={schema}
# nexus-mcp configuration. Run it with:  nexus-mcp serve --config {DEFAULT_CONFIG_NAME}
# Every setting can also be given as an environment variable (NEXUS_MCP_<NAME>, nested
# with __, e.g. NEXUS_MCP_LIMITS__MAX_READ_BYTES) or a serve flag; flags win over the
# environment, which wins over this file.

# The only folder the tools can reach. Absolute: a desktop client starts the server
# from a folder of its own choosing.
workspace: {yaml_string(str(workspace))}

# prod (the default) accepts no write without a write policy and shows no tool to a caller
# without a subject; dev serves everything to a default admin caller. Keep prod.
mode: prod

# Who the caller is and which tools they see is given where the server is started:
#   nexus-mcp serve --config {DEFAULT_CONFIG_NAME} --subject alice --role editor
# Roles: viewer (read tools), editor (and the write tools), evaluator (search), admin
# (everything); --profile names a profile instead. Your own profiles:
# profiles:
#   file: /path/to/tool_profiles.yaml

# Where state goes (audit log, grants, idempotency records). Default: the per-user
# data directory (~/.local/share/nexus-mcp on Linux).
# data_dir: /path/to/state

write_policies:
  workspace:
    # The only places a write may touch, relative to the workspace. .git/ and
    # .github/workflows/ stay denied whatever is listed here.
    allowed_paths: ["notes/**", "drafts/**"]
    # Of write, edit, delete, mkdir, rmdir, rename. No delete, rmdir or rename here.
    allowed_operations: [write, edit, mkdir]
    # false: each allowed write happens at once. true: each write needs an approval,
    # by approval_mode: token (an approver mints a token for the exact call with
    # `nexus-mcp approvals mint`; set NEXUS_MCP_APPROVAL_SECRET, 32+ random bytes, for
    # the server and the approver) or elicit (the client asks its user to confirm).
    require_approval: false
    approval_mode: token

# Approval tokens: keep the secret out of this file, in NEXUS_MCP_APPROVAL_SECRET.
# approvals:
#   ttl_seconds: 300

# Over HTTP (serve --transport http), agents sign in with your identity provider and its
# groups give roles (docs/oauth.md):
# auth:
#   base_url: https://nexus.example.com
#   authorization_servers: [https://sso.example.com/realms/engineering]
#   claims:
#     subject: email
#     rules:
#       - {{group: engineering, role: editor}}
"""


def run_init(args: argparse.Namespace) -> int:
    from nexus_mcp.commands.config_schema import schema_text, shipped_schema_path

    if args.print_schema:
        sys.stdout.write(schema_text())
        return 0
    target: Path = args.path
    workspace = Path(os.path.abspath((args.workspace or Path.cwd()).expanduser()))
    if target.is_dir():
        sys.stderr.write(f"nexus-mcp: {target} is a folder; give the file to write\n")
        return 1
    if target.exists() or target.is_symlink():
        sys.stderr.write(f"nexus-mcp: {target} already exists; not overwriting it\n")
        return 1
    if not workspace.is_dir():
        sys.stderr.write(f"nexus-mcp: the workspace is not a folder: {workspace}\n")
        return 1
    schema = shipped_schema_path()
    text = starter_config(workspace, schema.as_uri() if schema.is_file() else str(schema))
    try:
        # "x": never replace a file that appeared since the check above.
        with target.open("x", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError:
        sys.stderr.write(f"nexus-mcp: {target} already exists; not overwriting it\n")
        return 1
    except OSError as exc:
        sys.stderr.write(f"nexus-mcp: cannot write {target} ({exc.strerror})\n")
        return 1
    config = shlex.quote(str(target))
    sys.stdout.write(
        f"wrote {target}\n"
        f'next: nexus-mcp serve --config {config} --subject "$USER" --role editor'
        f"  (or connect a desktop client: nexus-mcp install claude-desktop --workspace "
        f"{shlex.quote(str(workspace))} --config {config})\n"
    )
    return 0


__all__ = ["DEFAULT_CONFIG_NAME", "add_parser", "run_init", "starter_config"]
