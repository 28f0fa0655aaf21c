"""Building gateways for the upstream tests: registries, pins, profiles and configuration.

The upstreams are real processes: ``tests/support/upstream_server.py`` (a FastMCP server
written here, which records what it receives) over stdio or streamable HTTP, and the
reference servers nobody here wrote: server-filesystem and server-everything from npm
(``tests/clients``), mcp-server-git from PyPI (the test extra).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from nexus_mcp.cli import main as cli_main
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.policy.approvals import mint_approval_token
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import load_settings

from .node_clients import is_ci
from .servers import free_port

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_SCRIPT = REPO / "tests" / "support" / "upstream_server.py"
SHIPPED_PROFILES = REPO / "config" / "tool_profiles.yaml"
FS_SERVER = (
    REPO
    / "tests"
    / "clients"
    / "node_modules"
    / "@modelcontextprotocol"
    / "server-filesystem"
    / "dist"
    / "index.js"
)
NODE_MODULES = REPO / "tests" / "clients" / "node_modules"
EVERYTHING_SERVER = (
    NODE_MODULES / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
)
REGISTRIES = REPO / "config" / "upstreams"

# The test server's tools and their registry classes.
UP_TOOLS: dict[str, str] = {
    "echo": "read",
    "add": "read",
    "count_writes": "read",
    "recall": "read",
    "slow": "read",
    "fail_tool": "read",
    "rpc_error": "read",
    "huge": "read",
    "whoami": "read",
    "mutate": "read",
    "mutate_silently": "read",
    "crash": "read",
    "garbage": "read",
    "mutate_prompt": "read",
    "spawn_tool": "read",
    "ask_sampling": "read",
    "ask_roots": "read",
    "ask_elicit": "read",
    "progress": "read",
    "log_error": "read",
    "write_note": "write",
    "remember": "write",
}


def write_registry(
    directory: Path,
    server_id: str,
    tools: Mapping[str, str],
    *,
    documents: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    entries = []
    for name, tool_class in tools.items():
        spec = (documents or {}).get(name)
        entry: dict[str, Any] = {
            "tool_name": name,
            "tool_class": tool_class,
            "is_document_op": spec is not None,
        }
        if spec is not None:
            entry["document_spec"] = dict(spec)
        entries.append(entry)
    path = directory / f"{server_id}.json"
    path.write_text(
        json.dumps(
            {
                "schema_id": "talos.mcp.tool_registry",
                "schema_version": "v1",
                "server_id": server_id,
                "server_version": "1.0.0",
                "tools": entries,
            },
            indent=2,
        )
    )
    return path


STDIO_CONNECT_SECONDS = 30


def stdio_upstream(
    server_id: str = "up", *, record: Path | None = None, variant: str | None = None, **extra: Any
) -> dict[str, Any]:
    args = [str(UPSTREAM_SCRIPT), "--transport", "stdio"]
    if record is not None:
        args += ["--record", str(record)]
    if variant is not None:
        args += ["--variant", variant]
    return {
        "server_id": server_id,
        "transport": "stdio",
        "command": sys.executable,
        "args": args,
        # A Python process starting on a machine busy with parallel test workers can take
        # longer than the default 10 s to answer; tests of the timeout pass their own.
        "timeouts": {"connect_seconds": STDIO_CONNECT_SECONDS},
        **extra,
    }


def http_upstream(server_id: str, url: str, **extra: Any) -> dict[str, Any]:
    return {"server_id": server_id, "transport": "http", "url": url, **extra}


def fs_upstream(root: Path, server_id: str = "fs", **extra: Any) -> dict[str, Any]:
    return {
        "server_id": server_id,
        "transport": "stdio",
        "command": shutil.which("node") or "node",
        "args": [str(FS_SERVER), str(root)],
        **extra,
    }


def everything_upstream(server_id: str = "everything", **extra: Any) -> dict[str, Any]:
    """``@modelcontextprotocol/server-everything`` over stdio (skipped without it, failed
    under CI)."""
    node = shutil.which("node")
    if node is None or not EVERYTHING_SERVER.is_file():
        missing("node or @modelcontextprotocol/server-everything", "make clients")
    return {
        "server_id": server_id,
        "transport": "stdio",
        "command": node,
        "args": [str(EVERYTHING_SERVER), "stdio"],
        **extra,
    }


def git_upstream(repository: Path | None, server_id: str = "git", **extra: Any) -> dict[str, Any]:
    """``mcp-server-git`` over stdio, run by this Python (skipped without it, failed under
    CI); ``repository``: its own ``--repository`` confinement (None: any path it is given)."""
    require_git_server()
    args = ["-m", "mcp_server_git"]
    if repository is not None:
        args += ["--repository", str(repository)]
    return {
        "server_id": server_id,
        "transport": "stdio",
        "command": sys.executable,
        "args": args,
        # A Python process starting on a machine busy with parallel test workers can take
        # longer than the default 10 s to answer; tests of the timeout pass their own.
        "timeouts": {"connect_seconds": STDIO_CONNECT_SECONDS},
        **extra,
    }


def require_git_server() -> None:
    """git and mcp-server-git, or the test is skipped (failed under CI)."""
    if importlib.util.find_spec("mcp_server_git") is None or shutil.which("git") is None:
        missing("git or mcp-server-git", "make test installs the test extra")


def missing(what: str, fix: str) -> None:
    if is_ci():
        pytest.fail(f"{what} is required in CI ({fix})", pytrace=False)
    pytest.skip(f"{what} missing: {fix}")


def copy_registry(gw: Gateway, server_id: str, shipped: str | None = None) -> None:
    """A shipped registry of ``config/upstreams`` (``shipped``, default: the id's) as the
    registry of upstream ``server_id``."""
    document = json.loads((REGISTRIES / f"{shipped or server_id}.json").read_text())
    document["server_id"] = server_id
    (gw.registry_dir / f"{server_id}.json").write_text(json.dumps(document))


@dataclass
class Gateway:
    """A configuration on disk: the YAML file, the upstream registry folder, profiles."""

    root: Path
    config_file: Path
    registry_dir: Path
    profiles_file: Path
    data_dir: Path
    workspace: Path
    audit: MemoryAuditSink = field(default_factory=MemoryAuditSink)
    built: list[NexusServer] = field(default_factory=list)

    def pin(self, server_id: str, *tools: str) -> int:
        args = ["upstream", "pin", server_id, "--config", str(self.config_file), "--yes"]
        args += ["--data-dir", str(self.data_dir)]
        for tool in tools:
            args += ["--tool", tool]
        return run_cli(args)

    def pin_items(
        self, server_id: str = "up", *, prompt: str | None = None, resource: str | None = None
    ) -> int:
        args = ["upstream", "pin", server_id, "--config", str(self.config_file), "--yes"]
        args += ["--data-dir", str(self.data_dir)]
        args += ["--prompt", prompt] if prompt is not None else []
        args += ["--resource", resource] if resource is not None else []
        return run_cli(args)

    def check(self, server_id: str) -> int:
        return run_cli(
            [
                "upstream",
                "check",
                server_id,
                "--config",
                str(self.config_file),
                "--data-dir",
                str(self.data_dir),
            ]
        )

    def build(self, env: Mapping[str, str] | None = None, **overrides: Any) -> NexusServer:
        values: dict[str, Any] = {"workspace": self.workspace, "data_dir": self.data_dir}
        values.update(overrides)
        settings = load_settings(self.config_file, values)
        server = build_server(
            settings, config_file=self.config_file, audit_sinks=[self.audit], env=env
        )
        self.built.append(server)
        return server

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        records = [dict(e.record) for e in self.audit.events]
        return [r for r in records if kind is None or r.get("event") == kind]


def make_gateway(
    root: Path,
    upstreams: list[dict[str, Any]],
    *,
    mode: str = "prod",
    registries: Mapping[str, Mapping[str, str]] | None = None,
    documents: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    grant: Mapping[str, list[str]] | None = None,
    extra: Mapping[str, Any] | None = None,
    grant_items: Mapping[str, Mapping[str, list[str]]] | None = None,
) -> Gateway:
    """A gateway configuration under ``root``: one registry per upstream (``registries``,
    default: the test server's classes), profiles granting upstream tools, prod mode."""
    root.mkdir(parents=True, exist_ok=True)
    registry_dir = root / "upstream-registries"
    registry_dir.mkdir(exist_ok=True)
    for upstream in upstreams:
        sid = upstream["server_id"]
        tools = (registries or {}).get(sid, UP_TOOLS)
        write_registry(registry_dir, sid, tools, documents=(documents or {}).get(sid))
    profiles = yaml.safe_load(SHIPPED_PROFILES.read_text())
    for profile, names in (grant or {}).items():
        profiles["profiles"][profile]["tools"] = [*profiles["profiles"][profile]["tools"], *names]
    for profile, kinds in (grant_items or {}).items():
        for kind, names in kinds.items():  # "resources" (sources), "prompts" (names)
            profiles["profiles"][profile][kind] = [
                *profiles["profiles"][profile].get(kind, []),
                *names,
            ]
    profiles_file = root / "profiles.yaml"
    profiles_file.write_text(yaml.safe_dump(profiles))
    workspace = root / "ws"
    workspace.mkdir(exist_ok=True)
    config = {
        "mode": mode,
        "subject": "alice",
        "role": "admin",
        "registry": {"upstream_directory": str(registry_dir)},
        "profiles": {"file": str(profiles_file)},
        "upstreams": upstreams,
        **(extra or {}),
    }
    config_file = root / "nexus.yaml"
    config_file.write_text(yaml.safe_dump(config))
    return Gateway(
        root=root,
        config_file=config_file,
        registry_dir=registry_dir,
        profiles_file=profiles_file,
        data_dir=root / "data",
        workspace=workspace,
    )


def envelope(result: Any) -> dict[str, str]:
    """The error envelope of a refused call: isError, no structuredContent, {error, code}."""
    payload: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert payload["isError"] is True, payload
    assert "structuredContent" not in payload
    parsed: dict[str, str] = json.loads(payload["content"][0]["text"])
    return parsed


async def poll(predicate: Callable[[], bool], seconds: float = 15.0) -> None:
    """Until ``predicate()`` holds (bounded): a wait, not a pace."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def approve(server: NexusServer, tool: str, arguments: Mapping[str, Any]) -> str:
    """An approval token minted by approver ``bob`` for alice, this tool, these arguments."""
    keys = server.runtime.approval_keys
    assert keys is not None, "the gateway was built without approval keys"
    return mint_approval_token(
        keys,
        server.runtime.approval_settings,
        approver="bob",
        subject="alice",
        tool=tool,
        arguments=arguments,
        host_id="ci",
    )


def run_cli(args: list[str]) -> int:
    """``nexus-mcp ARGS`` in this process, on a thread of its own: the command runs its
    own event loop, which cannot nest inside an async test's."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(cli_main, args).result()


def wait_listening(port: int, proc: subprocess.Popen[bytes], seconds: float = 20) -> None:
    """Until something accepts connections on the port (bounded)."""
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            raise RuntimeError("upstream test server exited early")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError("upstream test server did not listen") from None
            time.sleep(0.1)


def all_up_tools(prefix: str = "up_") -> list[str]:
    return [prefix + name for name in UP_TOOLS]


def read_record(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@contextlib.contextmanager
def http_upstream_process(
    record: Path | None = None,
    *,
    variant: str | None = None,
    port: int | None = None,
    tls: Mapping[str, Path] | None = None,
    flag_file: Path | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The test server over streamable HTTP on a loopback port; yields its MCP URL.

    ``tls``: ``cert``, ``key`` and optionally ``client_ca`` (client certificates required).
    """
    port = port or free_port()
    args = [sys.executable, str(UPSTREAM_SCRIPT), "--transport", "http", "--port", str(port)]
    if record is not None:
        args += ["--record", str(record)]
    if variant is not None:
        args += ["--variant", variant]
    if flag_file is not None:
        args += ["--flag-file", str(flag_file)]
    scheme = "http"
    if tls is not None:
        scheme = "https"
        args += ["--tls-cert", str(tls["cert"]), "--tls-key", str(tls["key"])]
        if "client_ca" in tls:
            args += ["--tls-client-ca", str(tls["client_ca"])]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"{scheme}://127.0.0.1:{port}/mcp"
    try:
        wait_listening(port, proc)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
