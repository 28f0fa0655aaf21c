"""The non-Python MCP clients the end-to-end tests drive: where they are, and running them.

They are npm packages pinned in ``tests/clients/package.json`` and its lock file, and
installed by ``make clients`` (``make test`` runs it when npm exists; ``.ci/run`` always).
The official TypeScript SDK is driven by ``tests/clients/call_tools.mjs`` (one process runs
many calls in one session); the MCP Inspector through its own command line, one call per
process, exactly as a user types it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLIENTS_DIR = Path(__file__).resolve().parents[1] / "clients"
TS_SCRIPT = CLIENTS_DIR / "call_tools.mjs"
# The Inspector's `mcp-inspector` bin (its launcher: --cli, --web, --tui).
INSPECTOR_BIN = Path("node_modules/.bin/mcp-inspector")
# The Inspector CLI's documented exit status for a result with isError (EXIT_CODES.TOOL_ERROR
# in its sources): it printed the result and says the tool reported an error.
INSPECTOR_EXIT_TOOL_ERROR = 5
INSPECTOR_TOOL_IS_ERROR = "tool_is_error"
INSPECTOR_TOOL_NOT_FOUND = "tool_not_found"
CLIENT_TIMEOUT_S = 120.0  # a bound, not a pace: a healthy run takes a few seconds
# The Inspector gives up connecting after 15 s by default; a stdio server starting on a
# busy CI machine can take longer. A bound, not a pace.
INSPECTOR_CONNECT_TIMEOUT_MS = 60_000
# Truthy spellings of the CI variable that CI services set (GitHub, GitLab: "true").
CI_TRUE = frozenset({"1", "true", "yes"})


def is_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in CI_TRUE


@dataclass(frozen=True)
class NodeClients:
    node: str
    pinned: Mapping[str, str]

    @property
    def inspector(self) -> Path:
        return CLIENTS_DIR / INSPECTOR_BIN


def pinned_versions() -> dict[str, str]:
    manifest = json.loads((CLIENTS_DIR / "package.json").read_text(encoding="utf-8"))
    return dict(manifest["dependencies"])


def find_node_clients() -> tuple[NodeClients | None, str]:
    """The installed clients, or None and why not (the skip or failure reason)."""
    node = shutil.which("node")
    if node is None:
        return None, "node is not installed: the TypeScript SDK and MCP Inspector tests need it"
    pinned = pinned_versions()
    for package, version in pinned.items():
        manifest = CLIENTS_DIR / "node_modules" / package / "package.json"
        if not manifest.is_file():
            return None, f"{package} is not installed: run `make clients` (npm ci, tests/clients)"
        installed = json.loads(manifest.read_text(encoding="utf-8")).get("version")
        if installed != version:
            return None, f"{package} {installed} installed, {version} pinned: run `make clients`"
    return NodeClients(node=node, pinned=pinned), ""


def client_env(home: Path) -> dict[str, str]:
    """The environment of a client process: no NEXUS_MCP_* of ours, and its own HOME
    (the Inspector keeps a catalog and client config under ~/.mcp-inspector)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEXUS_MCP_")}
    env["HOME"] = str(home)
    return env


# --- the TypeScript SDK ---------------------------------------------------------------------


@dataclass(frozen=True)
class SessionRun:
    tools: dict[str, dict[str, Any]]  # by name, as listed
    calls: list[dict[str, Any]]  # {"result": CallToolResult} or {"threw": message}


def run_ts_plans(
    clients: NodeClients, plans: Sequence[Sequence[Mapping[str, Any]]], *, work: Path
) -> list[list[SessionRun]]:
    """Run each plan (a list of sessions, see call_tools.mjs) in its own node process.

    The processes run concurrently: plans are independent by construction (each talks to
    its own server, or spawns its own)."""
    outputs: list[bytes] = []
    with ExitStack() as stack:
        procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        for number, plan in enumerate(plans):
            path = work / f"ts-plan-{number}.json"
            path.write_text(json.dumps(plan), encoding="utf-8")
            errlog = stack.enter_context(path.with_suffix(".stderr").open("wb"))
            proc = stack.enter_context(
                subprocess.Popen(
                    [clients.node, str(TS_SCRIPT), str(path)],
                    env=client_env(work),
                    stdout=subprocess.PIPE,
                    stderr=errlog,
                )
            )
            stack.callback(_kill_if_running, proc)  # before Popen's own exit waits for it
            procs.append((proc, path.with_suffix(".stderr")))
        for proc, errpath in procs:
            out, _ = proc.communicate(timeout=CLIENT_TIMEOUT_S)
            if proc.returncode != 0:
                tail = errpath.read_text(errors="replace")[-3000:]
                raise AssertionError(f"TypeScript SDK client exited {proc.returncode}: {tail}")
            outputs.append(out)
    return [
        [
            SessionRun(tools={t["name"]: t for t in session["tools"]}, calls=session["calls"])
            for session in json.loads(out)
        ]
        for out in outputs
    ]


def _kill_if_running(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()


# --- the MCP Inspector CLI ------------------------------------------------------------------


@dataclass(frozen=True)
class InspectorRun:
    returncode: int
    result: dict[str, Any] | None  # the CallToolResult it printed
    error_code: str | None  # the code of the CLI's own error line on stderr
    stderr: str


@dataclass(frozen=True)
class InspectorTarget:
    """Where the Inspector connects: a URL goes first, a stdio command last, after ``--``
    (``--tool-arg`` takes every following word up to the next option or ``--``)."""

    leading: tuple[str, ...] = ()
    trailing: tuple[str, ...] = ()

    @classmethod
    def http(cls, url: str) -> InspectorTarget:
        return cls(leading=(url, "--transport", "http"))

    @classmethod
    def stdio(cls, command: Sequence[str], env: Mapping[str, str]) -> InspectorTarget:
        return cls(leading=inspector_env_args(env), trailing=("--", *command))


def inspector_env_args(env: Mapping[str, str]) -> tuple[str, ...]:
    """``-e KEY=VALUE`` for each entry the Inspector CLI accepts: it refuses the whole
    command on an empty value (``MAKEFLAGS=`` under make), so those are left out."""
    return tuple(part for key, value in env.items() if value for part in ("-e", f"{key}={value}"))


def inspector_command(
    clients: NodeClients,
    target: InspectorTarget,
    tool: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    meta: Mapping[str, Any] | None = None,
    tool_args: Sequence[str] = (),
) -> list[str]:
    """``mcp-inspector --cli TARGET --method tools/call ...``.

    ``arguments`` go as ``--tool-args-json`` (verbatim JSON, no coercion); ``tool_args``
    as the ``--tool-arg key=value`` pairs a user types. ``meta`` entries become
    ``--tool-metadata key=<json>``, which the CLI sends as the request's ``_meta``.
    """
    command = [
        clients.node,
        str(clients.inspector),
        "--cli",
        *target.leading,
        "--connect-timeout",
        str(INSPECTOR_CONNECT_TIMEOUT_MS),
        "--method",
        "tools/call",
        "--tool-name",
        tool,
    ]
    if arguments is not None:
        command += ["--tool-args-json", json.dumps(arguments)]
    if tool_args:
        command += ["--tool-arg", *tool_args]
    for key, value in (meta or {}).items():
        command += ["--tool-metadata", f"{key}={json.dumps(value)}"]
    return [*command, *target.trailing]


def run_inspector(command: Sequence[str], *, home: Path) -> InspectorRun:
    proc = subprocess.run(
        list(command),
        env=client_env(home),
        capture_output=True,
        timeout=CLIENT_TIMEOUT_S,
        check=False,
    )
    stdout = proc.stdout.decode(errors="replace").strip()
    stderr = proc.stderr.decode(errors="replace")
    # The default (text) output a user reads: the result as pretty-printed JSON, nothing else.
    result = json.loads(stdout) if stdout else None
    return InspectorRun(proc.returncode, result, _cli_error_code(stderr), stderr)


def _cli_error_code(stderr: str) -> str | None:
    # The CLI's own error is one JSON line {"error": {"code", "message"}} on stderr; a stdio
    # server's log lines may come before it.
    for line in reversed(stderr.splitlines()):
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            return str(error["code"])
    return None
