"""``nexus-mcp install CLIENT``: add nexus-mcp to a desktop client's MCP configuration.

Each client keeps its MCP servers in a JSON file of its own shape and place. The entry
runs this environment's ``nexus-mcp`` over stdio by absolute path (a client starts it
without the user's shell, PATH or virtualenv). The file is merged, never rewritten from
scratch: other servers and keys it holds stay, a copy is kept beside it first, a server
of the same name is replaced only with ``--force``, a file that is not JSON is left
alone, and the new file replaces the old one in one step with the old one's mode.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import shutil
import stat
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_SERVER_NAME = "nexus-mcp"


@dataclass(frozen=True)
class ClientShape:
    """Where a client keeps its MCP servers, and how it writes one started over stdio."""

    label: str
    servers_key: str
    entry_type: str | None  # the "type" an entry carries, when the client's docs give one
    with_env: bool  # whether the documented entry carries "env"
    next_step: str


CLIENTS: dict[str, ClientShape] = {
    "claude-desktop": ClientShape(
        label="Claude Desktop",
        servers_key="mcpServers",
        entry_type=None,
        with_env=False,
        next_step="quit Claude Desktop fully and open it again; its tools menu then lists "
        "{name} (Settings > Developer shows whether it is running, and its log)",
    ),
    "claude-code": ClientShape(
        label="Claude Code",
        servers_key="mcpServers",
        entry_type="stdio",
        with_env=True,
        next_step="start `claude` in this folder and approve the project server when asked; "
        "`claude mcp list` (or /mcp) shows whether {name} is connected",
    ),
    "cursor": ClientShape(
        label="Cursor",
        servers_key="mcpServers",
        entry_type=None,
        with_env=False,
        next_step="restart Cursor; Settings > MCP lists {name}, with a green dot once it runs",
    ),
    "vscode": ClientShape(
        label="VS Code",
        servers_key="servers",
        entry_type="stdio",
        with_env=False,
        next_step="open {path} in VS Code and press Start above {name}; "
        "'MCP: List Servers' in the command palette shows its state",
    ),
}


class InstallError(Exception):
    """A refusal, said in one plain line; nothing was written."""


def default_config_path(
    client: str,
    *,
    platform: str | None = None,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    cwd: Path | None = None,
) -> Path:
    """The client's documented configuration file on this machine."""
    platform = sys.platform if platform is None else platform
    environ = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    cwd = Path.cwd() if cwd is None else cwd
    if client == "claude-desktop":
        if platform == "darwin":
            folder = home / "Library" / "Application Support" / "Claude"
        elif platform == "win32":
            appdata = environ.get("APPDATA")
            folder = (Path(appdata) if appdata else home / "AppData" / "Roaming") / "Claude"
        else:
            xdg = environ.get("XDG_CONFIG_HOME", "")
            base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".config"
            folder = base / "Claude"
        return folder / "claude_desktop_config.json"
    if client == "claude-code":
        return cwd / ".mcp.json"
    if client == "cursor":
        return home / ".cursor" / "mcp.json"
    if client == "vscode":
        return cwd / ".vscode" / "mcp.json"
    raise ValueError(f"unknown client {client!r}")


def server_command() -> tuple[str, list[str]]:
    """The absolute command that starts this environment's nexus-mcp, and its first args.

    The ``nexus-mcp`` script beside the running interpreter (its environment's scripts
    folder), else the interpreter itself with ``-m nexus_mcp``. Not a resolved symlink: a
    virtualenv's python is a link, and resolving it would leave the environment.
    """
    folders = [sysconfig.get_path("scripts"), os.path.dirname(os.path.abspath(sys.executable))]
    for folder in dict.fromkeys(f for f in folders if f):
        found = shutil.which("nexus-mcp", path=folder)
        if found:
            return os.path.abspath(found), []
    return os.path.abspath(sys.executable), ["-m", "nexus_mcp"]


def server_entry(client: str, args: argparse.Namespace) -> dict[str, Any]:
    """The client's entry for nexus-mcp: command, args (and type, env where documented)."""
    shape = CLIENTS[client]
    workspace = os.path.abspath(os.path.expanduser(args.workspace))
    if not os.path.isdir(workspace):
        raise InstallError(f"the workspace is not a folder: {workspace}")
    command, first = server_command()
    serve = [*first, "serve", "--workspace", workspace]
    subject = args.subject or _login_name()
    serve += ["--subject", subject]
    if args.role:
        serve += ["--role", args.role]
    if args.profile:
        serve += ["--profile", args.profile]
    if args.config is not None:
        config = os.path.abspath(os.path.expanduser(args.config))
        if not os.path.isfile(config):
            raise InstallError(f"the configuration file does not exist: {config}")
        serve += ["--config", config]
    entry: dict[str, Any] = {}
    if shape.entry_type is not None:
        entry["type"] = shape.entry_type
    entry["command"] = command
    entry["args"] = serve
    if shape.with_env:
        entry["env"] = {}
    return entry


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name in the environment or the password database
        return "user"


def _read_document(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    if not path.is_file():
        raise InstallError(f"{path} is not a file; give --config-file the client's JSON file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        text = "\0"
    except OSError as exc:
        raise InstallError(f"{path} cannot be read ({exc.strerror})") from None
    if not text.strip():
        return {}
    try:
        document = json.loads(text)
    except ValueError:
        raise InstallError(
            f"{path} is not valid JSON; left unchanged (fix it, or add the entry by hand "
            "from `--print`)"
        ) from None
    if not isinstance(document, dict):
        raise InstallError(f"{path} does not hold a JSON object; left unchanged")
    return document


def _backup(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = path.with_name(f"{path.name}.bak-{stamp}")
    counter = 1
    while candidate.exists() or candidate.is_symlink():
        candidate = path.with_name(f"{path.name}.bak-{stamp}-{counter}")
        counter += 1
    shutil.copy2(path, candidate)
    return candidate


def _file_mode(path: Path) -> int:
    if path.exists():
        return stat.S_IMODE(path.stat().st_mode)
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomically(path: Path, text: str, mode: int) -> None:
    """Replace ``path`` with ``text`` in one step (a reader sees the old or the new file)."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@dataclass(frozen=True)
class Installed:
    path: Path  # the file written (a link's target when the given path was a link)
    backup: Path | None
    replaced: bool
    unchanged: bool


def install_entry(
    path: Path, servers_key: str, name: str, entry: dict[str, Any], *, force: bool
) -> Installed:
    """Merge ``entry`` under ``servers_key``/``name`` into the JSON file at ``path``.

    A symbolic link is written through: its target is backed up and replaced, and the link
    stays (dotfile managers keep these files as links). A link to nothing is refused.
    """
    path = Path(os.path.abspath(path))
    if path.is_symlink():
        target = Path(os.path.realpath(path))
        if not target.exists():
            raise InstallError(f"{path} is a link to {target}, which does not exist")
        path = target
    document = _read_document(path)
    servers = document.get(servers_key)
    if servers is None:
        servers = {}
    elif not isinstance(servers, dict):
        raise InstallError(f"{path}: '{servers_key}' is not a JSON object; left unchanged")
    existing = servers.get(name)
    if existing == entry:
        return Installed(path, None, replaced=False, unchanged=True)
    if existing is not None and not force:
        raise InstallError(
            f"{path} already has a server named '{name}'; --force replaces it "
            "(or choose another --name)"
        )
    servers[name] = entry
    document[servers_key] = servers
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = _file_mode(path)
        backup = _backup(path) if path.exists() else None
        write_atomically(path, text, mode)
    except OSError as exc:
        raise InstallError(f"cannot write {path} ({exc.strerror})") from None
    return Installed(path, backup, replaced=existing is not None, unchanged=False)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "install",
        help="add nexus-mcp to a client's MCP configuration (Claude Desktop, Claude Code, ...)",
        description=(
            "Write the client's MCP server entry for nexus-mcp over stdio: this "
            "environment's nexus-mcp by absolute path, serving --workspace. An existing "
            "configuration file is merged (other servers and keys stay) after a copy is "
            "kept beside it (<file>.bak-<time>); a server of the same name is replaced "
            "only with --force. Files: claude-desktop its claude_desktop_config.json, "
            "claude-code ./.mcp.json (project scope), cursor ~/.cursor/mcp.json, "
            "vscode ./.vscode/mcp.json."
        ),
    )
    parser.add_argument("client", choices=sorted(CLIENTS), help="which client")
    parser.add_argument(
        "--workspace", required=True, metavar="DIR",
        help="the folder the tools serve (written as an absolute path)",
    )  # fmt: skip
    parser.add_argument(
        "--subject", default=None,
        help="who the caller is, in grants and the audit log (default: your login name)",
    )  # fmt: skip
    parser.add_argument(
        "--role", default=None,
        help="viewer (default: the read tools), editor, evaluator or admin",
    )  # fmt: skip
    parser.add_argument("--profile", default=None, help="a tool profile instead of a role")
    parser.add_argument(
        "--config", default=None, metavar="FILE",
        help="a nexus.yaml for the server (passed as --config)",
    )  # fmt: skip
    parser.add_argument(
        "--name", default=DEFAULT_SERVER_NAME,
        help=f"the server's name in the client (default {DEFAULT_SERVER_NAME})",
    )  # fmt: skip
    parser.add_argument(
        "--config-file", type=Path, default=None, metavar="FILE",
        help="the client's configuration file (default: where the client keeps it)",
    )  # fmt: skip
    parser.add_argument("--force", action="store_true", help="replace a server of the same name")
    parser.add_argument(
        "--print", dest="print_only", action="store_true",
        help="print the entry as JSON and write nothing",
    )  # fmt: skip
    parser.set_defaults(func=run_install)


def run_install(args: argparse.Namespace) -> int:
    client: str = args.client
    shape = CLIENTS[client]
    try:
        if not args.name or not args.name.strip():
            raise InstallError("--name must not be empty")
        entry = server_entry(client, args)
        if args.print_only:
            snippet = {shape.servers_key: {args.name: entry}}
            sys.stdout.write(json.dumps(snippet, indent=2, ensure_ascii=False) + "\n")
            return 0
        path = args.config_file if args.config_file is not None else default_config_path(client)
        done = install_entry(path, shape.servers_key, args.name, entry, force=args.force)
    except InstallError as exc:
        sys.stderr.write(f"nexus-mcp: {exc}\n")
        return 1
    if done.unchanged:
        sys.stdout.write(f"{done.path} already has this '{args.name}' entry; nothing changed\n")
        return 0
    verb = "replaced" if done.replaced else "added"
    kept = f" (the old file is kept as {done.backup.name})" if done.backup else ""
    sys.stdout.write(f"{verb} '{args.name}' in {done.path}{kept}\n")
    sys.stdout.write(f"next: {shape.next_step.format(name=args.name, path=done.path)}\n")
    return 0


__all__ = [
    "CLIENTS",
    "DEFAULT_SERVER_NAME",
    "ClientShape",
    "InstallError",
    "Installed",
    "add_parser",
    "default_config_path",
    "install_entry",
    "run_install",
    "server_command",
    "server_entry",
    "write_atomically",
]
