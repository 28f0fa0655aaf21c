"""A stdio upstream run inside a bubblewrap sandbox (issue 27): the ``sandbox:`` section
of an upstream and the command line that launches it.

The isolation is bubblewrap's (``bwrap``, Debian's ``bubblewrap`` package, a maintained
tool), and the limits are the kernel's rlimits set by util-linux's ``prlimit``: nexus only
writes their command line, it never builds namespaces or mounts of its own. What the
upstream gets: the system folders read-only (``/usr``, ``/lib*``, a few files of ``/etc``),
the folder its command runs from read-only, its ``readable`` folders read-only, its
``writable`` folders read-write, a private ``/tmp``, ``/proc`` of its own PID namespace, no
network unless ``network: true``, and only the environment its configuration gives (PATH
and HOME set here). The gateway's data directory, configuration and secret files, and
every other upstream's folders are never bound; where one lies under a folder that is
bound (the command's own folder), it is hidden (an empty tmpfs, or ``/dev/null``).

No FastMCP here: ``providers/upstream/sessions.py`` runs the command this module writes.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from nexus_mcp.errors import ConfigError

# Where bwrap and prlimit are looked for; the variable names another binary (tests, and
# an operator whose bwrap is elsewhere).
BWRAP_ENV = "NEXUS_MCP_BWRAP"
PRLIMIT_ENV = "NEXUS_MCP_PRLIMIT"
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
# The sandbox's own /tmp: a private tmpfs inside it, never the host's.
SANDBOX_HOME = "/tmp"  # noqa: S108
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# /etc: only what a program needs to load libraries, name users, check certificates and
# tell the time (resolv.conf and hosts only with network).
ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "localtime",
    "nsswitch.conf",
    "passwd",
    "group",
    "mime.types",
)
ETC_NETWORK_FILES = ("resolv.conf", "hosts", "host.conf", "gai.conf")
# Never writable, never "readable" (they are bound, or must not be, as the sandbox says).
RESERVED = ("/", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
RESERVED_UNDER = ("/proc", "/dev", "/sys", "/boot", "/usr", "/etc")


class SandboxConfig(BaseModel):
    """Run this stdio upstream in a bubblewrap sandbox: read-only system, only the
    ``writable`` folders writable, no network unless ``network``, CPU and memory limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: StrictBool = True
    writable: tuple[Path, ...] = ()
    readable: tuple[Path, ...] = ()
    network: StrictBool = False
    # RLIMIT_CPU: CPU seconds over the process's whole life (it is killed past it).
    cpu_seconds: int = Field(default=3600, ge=1, le=30 * 86_400)
    # RLIMIT_AS: address space, not resident memory (Node reserves much; give it more).
    memory_mb: int = Field(default=4096, ge=64, le=1_048_576)

    @field_validator("writable", "readable")
    @classmethod
    def _absolute(cls, paths: tuple[Path, ...]) -> tuple[Path, ...]:
        for path in paths:
            if not path.is_absolute():
                raise ValueError("sandbox folders must be absolute paths")
            text = os.path.normpath(path)
            if text in RESERVED or any(_under(Path(text), Path(r)) for r in RESERVED_UNDER):
                raise ValueError("sandbox folders may not be the root or a system folder")
        return paths


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def overlaps(a: Path, b: Path) -> bool:
    return _under(a, b) or _under(b, a)


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(path))


@dataclass(frozen=True)
class SandboxLaunch:
    """How one sandboxed upstream is started: ``argv(command, args)`` at each launch (the
    hidden paths are looked at then: the data directory may be made after start-up)."""

    bwrap: str
    prlimit: str
    command: Path  # the command, found on PATH at start-up
    config: SandboxConfig
    cwd: Path | None
    protected: tuple[Path, ...] = ()
    read_only: tuple[Path, ...] = field(default=())  # the command's own folders

    def env(self, given: Mapping[str, str]) -> dict[str, str]:
        """The whole environment of the upstream: PATH, HOME and what its config gives
        (passed as the process's environment, never on the command line, where any user
        of the machine could read a secret in ``ps``)."""
        path = ":".join(dict.fromkeys([str(self.command.parent), *SAFE_PATH.split(":")]))
        return {"PATH": path, "HOME": SANDBOX_HOME, **given}

    def argv(self, args: Sequence[str]) -> list[str]:
        box = self.config
        out = [
            self.prlimit,
            f"--cpu={box.cpu_seconds}",
            f"--as={box.memory_mb * 1024 * 1024}",
            "--",
            self.bwrap,
            "--die-with-parent",
            "--new-session",
            "--unshare-all",
            *(["--share-net"] if box.network else []),
            "--cap-drop",
            "ALL",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            SANDBOX_HOME,
        ]
        bound: list[Path] = []
        for name in SYSTEM_DIRS:
            path = Path(name)
            if path.is_symlink():
                out += ["--symlink", os.readlink(path), name]
            elif path.is_dir():
                out += ["--ro-bind", name, name]
                bound.append(path)
        etc = ETC_FILES + (ETC_NETWORK_FILES if box.network else ())
        for name in etc:
            out += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        folders = [*self.read_only, *box.readable]
        if self.cwd is not None and not any(_under(self.cwd, w) for w in box.writable):
            folders.append(self.cwd)
        for folder in dict.fromkeys(folders):
            if not any(_under(folder, b) for b in bound):
                out += _bind("--ro-bind", folder)
                bound += [folder, _resolved(folder)]
        for folder in box.writable:
            out += _bind("--bind", folder)
            bound += [folder, _resolved(folder)]
        out += self._hidden(bound)
        out += ["--chdir", str(self.cwd) if self.cwd is not None else SANDBOX_HOME]
        return [*out, "--", str(self.command), *args]

    def _hidden(self, bound: Sequence[Path]) -> list[str]:
        """Mounts that hide every protected path a bound folder holds."""
        out: list[str] = []
        for path in self.protected:
            if not any(_under(path, b) for b in bound):
                continue
            if path.is_dir():
                out += ["--tmpfs", str(path)]
            elif path.exists():
                out += ["--ro-bind", os.devnull, str(path)]
        return out


def _bind(option: str, folder: Path) -> list[str]:
    """A folder at its real path, and at the path given when that is a link to it (a
    program that resolves links, as Node does for its modules, finds the real one)."""
    real = _resolved(folder)
    out = [option, str(real), str(real)]
    if real != folder:
        out += [option, str(real), str(folder)]
    return out


@dataclass(frozen=True)
class SandboxUpstream:
    """What the plan needs of one stdio upstream (``UpstreamConfig`` gives it)."""

    server_id: str
    command: str
    cwd: Path | None
    sandbox: SandboxConfig | None


def find_binary(name: str, variable: str, environ: Mapping[str, str]) -> str | None:
    given = environ.get(variable)
    if given:
        return given if os.path.isfile(given) and os.access(given, os.X_OK) else None
    return shutil.which(name)


def plan_sandboxes(
    upstreams: Sequence[SandboxUpstream],
    *,
    protected: Mapping[Path, str],
    environ: Mapping[str, str],
) -> tuple[dict[str, SandboxLaunch], list[str]]:
    """Every sandboxed upstream's launch, and the ids of those that run unsandboxed.

    ``protected``: the gateway's own paths (data directory, configuration and secret
    files, registries) and what to call each. A sandbox folder that overlaps one of them,
    or another upstream's folder (its writable folders or cwd), is refused; so is a
    sandbox on a machine without bwrap (never run unsandboxed instead)."""
    gateway = {_resolved(p): words for p, words in protected.items()}
    folders = {u.server_id: [_resolved(p) for p in _own_folders(u)] for u in upstreams}
    problems: list[str] = []
    launches: dict[str, SandboxLaunch] = {}
    unsandboxed: list[str] = []
    tools: tuple[str | None, str | None] | None = None
    for upstream in upstreams:
        box = upstream.sandbox
        if box is None or not box.enabled:
            unsandboxed.append(upstream.server_id)
            continue
        where = f"upstream {upstream.server_id}: sandbox"
        if tools is None:
            tools = (
                find_binary("bwrap", BWRAP_ENV, environ),
                find_binary("prlimit", PRLIMIT_ENV, environ),
            )
        bwrap, prlimit = tools
        if bwrap is None:
            problems.append(
                f"{where} is configured but bubblewrap (bwrap) is not installed or not"
                f" executable (install the bubblewrap package, or set {BWRAP_ENV})"
            )
        if prlimit is None:
            problems.append(f"{where} needs prlimit (util-linux) for its limits; not found")
        found = shutil.which(upstream.command, path=environ.get("PATH", SAFE_PATH))
        if found is None:
            problems.append(f"{where}: its command is not found on PATH")
        mine = [_resolved(p) for p in (*box.writable, *box.readable)]
        if upstream.cwd is not None:
            mine.append(_resolved(upstream.cwd))
        for path in box.writable:
            if not path.is_dir():
                problems.append(f"{where}.writable: a folder does not exist")
        for path in box.readable:
            if not path.exists():
                problems.append(f"{where}.readable: a path does not exist")
        if upstream.cwd is not None and not upstream.cwd.is_dir():
            problems.append(f"{where}: its cwd is not a folder")
        for path in mine:
            for theirs, words in gateway.items():
                if overlaps(path, theirs):
                    problems.append(f"{where}: a folder overlaps {words}")
            for other, paths in folders.items():
                if other != upstream.server_id and any(overlaps(path, p) for p in paths):
                    problems.append(f"{where}: a folder overlaps a folder of upstream {other}")
        if problems or bwrap is None or prlimit is None or found is None:
            continue
        command = Path(os.path.abspath(found))
        others = [p for o, paths in folders.items() if o != upstream.server_id for p in paths]
        launches[upstream.server_id] = SandboxLaunch(
            bwrap=bwrap,
            prlimit=prlimit,
            command=command,
            config=box,
            cwd=upstream.cwd,
            protected=tuple(dict.fromkeys([*gateway, *others])),
            read_only=command_folders(command),
        )
    if problems:
        raise ConfigError("\n".join(dict.fromkeys(problems)))
    return launches, unsandboxed


def _own_folders(upstream: SandboxUpstream) -> list[Path]:
    """The folders that are this upstream's own: its writable folders and its cwd."""
    box = upstream.sandbox
    own = list(box.writable) if box is not None and box.enabled else []
    if upstream.cwd is not None:
        own.append(upstream.cwd)
    return own


def command_folders(command: Path) -> tuple[Path, ...]:
    """The folders a command runs from, read-only: its installation prefix (the parent of
    its ``bin``) as given and as resolved (a venv and the Python it links to), and the
    gateway's own Python prefixes when the command is that same interpreter."""
    found: list[Path] = []
    for path in (command, _resolved(command)):
        folder = path.parent
        found.append(folder.parent if folder.name == "bin" else folder)
    if _resolved(command) == _resolved(Path(sys.executable)):
        found += [Path(sys.prefix), Path(sys.base_prefix)]
    for folder in found:
        if folder == Path("/"):
            raise ConfigError("a sandboxed command may not run from the root folder")
    return tuple(dict.fromkeys(found))


def isolation(transport: str, box: SandboxConfig | SandboxLaunch | None) -> dict[str, Any]:
    """How an upstream runs, as operators are told (``nexus-mcp upstream list``, the
    console's Upstream pins page, ``/readyz``'s operator detail).

    ``sandbox``: ``bubblewrap`` (``network`` as its section says), ``none`` (a stdio
    upstream with the gateway's user's rights over its files, and the network:
    ``network`` true) or ``remote`` (an HTTP upstream, not a process of this gateway:
    ``network`` None). ``box``: the sandbox it was launched with (``SandboxLaunch``), or
    the one its configuration asks for; a configured sandbox that cannot be had stops
    start-up, it never runs unsandboxed instead (``plan_sandboxes``)."""
    if transport != "stdio":
        return {"sandbox": "remote", "network": None}
    config = box.config if isinstance(box, SandboxLaunch) else box
    if config is None or not config.enabled:
        return {"sandbox": "none", "network": True}
    return {"sandbox": "bubblewrap", "network": config.network}


def gateway_paths(
    *, data_dir: Path, audit_path: Path, registry_dir: Path, trusted_files: Sequence[Path]
) -> dict[Path, str]:
    """The gateway's own paths no sandboxed upstream may see, and what to call each."""
    paths = {data_dir: "the gateway's data directory", audit_path: "the gateway's audit log"}
    paths[registry_dir] = "the upstream registries and pins"
    for path in trusted_files:
        paths.setdefault(path, "the gateway's configuration or a secret file")
    return paths


__all__ = [
    "BWRAP_ENV",
    "PRLIMIT_ENV",
    "SandboxConfig",
    "SandboxLaunch",
    "SandboxUpstream",
    "command_folders",
    "gateway_paths",
    "isolation",
    "overlaps",
    "plan_sandboxes",
]
