"""Real servers in subprocesses for the transport benchmarks, and a minimal MCP client.

The servers: nexus-mcp as users run it (``nexus-mcp serve``, dev mode, its real chain,
the JSONL audit file) and the bare FastMCP baselines of ``bare_server.py``, each its own
process, on stdio or on a loopback port. Logs are set to ERROR (``--log-level``), so what
a server writes to stderr is worth reading: it goes to a file, which is printed when the
server fails or writes anything beyond nexus-mcp's start-up banner.

The client speaks MCP's JSON-RPC directly (the 2025-11-25 handshake era, which desktop
clients speak), with nothing per call but one request and one response: a heavy client
would add the same cost to both sides and hide the server's share of the ratio. A
server's CPU time is read from ``/proc/<pid>/stat`` (all its threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
PROTOCOL_VERSION = "2025-11-25"
READY_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 60.0
LOG_LEVEL = "ERROR"
# The nexus server keeps its limits on; only their thresholds are raised, so a benchmark's
# burst of calls is not refused by the default rate limit.
NEXUS_BUDGETS_ENV = {
    "NEXUS_MCP_BUDGETS__RATE_LIMIT_CALLS": str(10**9),
    "NEXUS_MCP_BUDGETS__MAX_CALLS_PER_SESSION": str(10**9),
}
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_BANNER_PREFIXES = (
    "nexus-mcp ", "workspace: ", "client config", "dev mode: ", "operator console: ",
)  # fmt: skip


class RpcError(Exception):
    """The server answered a request with a JSON-RPC error, or not at all."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, utime 14 and stime 15 (1-based, man 5 proc).
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


@functools.cache
def compile_sources() -> None:
    """Byte-compile ``src`` once per run, as pip compiles an installed package.

    The processes a benchmark starts then import nexus-mcp as an installed copy does. A
    machine with ``PYTHONDONTWRITEBYTECODE=1`` set (this one) never writes the cache
    itself, so without this every start compiled nexus-mcp's ~250 modules from source
    (0.8 s of CPU here), a cost no installed copy pays. The bare baselines import
    nexus-mcp's workspace and tool modules from the same tree, so they read it too."""
    import compileall

    compileall.compile_dir(SRC, quiet=1)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    compile_sources()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEXUS_MCP_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


@dataclass
class ServerSpec:
    """One server to start: ``nexus`` or a bare baseline (``equal`` / ``plain``)."""

    name: str
    kind: str  # "nexus", "equal", "plain"
    workspace: Path
    data_dir: Path
    extra_args: tuple[str, ...] = ()  # more ``serve`` flags (nexus only): --config, --workers

    def command(self, transport: str, port: int | None, stateless: bool) -> list[str]:
        if self.kind == "nexus":
            cmd = [sys.executable, "-m", "nexus_mcp", "serve", "--transport", transport,
                   "--mode", "dev", "--workspace", str(self.workspace),
                   "--data-dir", str(self.data_dir), "--log-level", LOG_LEVEL]  # fmt: skip
            if port is not None:
                cmd += ["--port", str(port)]
            if stateless:
                cmd.append("--stateless-http")
            return cmd + list(self.extra_args)
        cmd = [sys.executable, str(HERE / "bare_server.py"), "--kind", self.kind,
               "--workspace", str(self.workspace), "--transport", transport]  # fmt: skip
        if port is not None:
            cmd += ["--port", str(port)]
        if stateless:
            cmd.append("--stateless")
        return cmd

    def env(self) -> dict[str, str]:
        return child_env(NEXUS_BUDGETS_ENV if self.kind == "nexus" else None)


@dataclass
class Running:
    """A started server process and where its stderr goes."""

    spec: ServerSpec
    pid: int
    stderr_path: Path
    url: str | None = None
    _stop: Any = None

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def stderr_worth_showing(self) -> str:
        """Its stderr, unless it holds nothing but nexus-mcp's start-up banner."""
        try:
            text = self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip()]
        # The banner ends with the client config JSON; skip through its closing brace.
        in_banner_json = False
        notable = []
        for line in lines:
            if line.startswith(_BANNER_PREFIXES):
                in_banner_json = line.startswith("client config")
                continue
            if in_banner_json:
                in_banner_json = line != "}"
                continue
            notable.append(line)
        return "\n".join(notable)


def show_stderr(server: Running, failed: bool = False) -> None:
    text = server.stderr_worth_showing()
    if text or failed:
        sys.stderr.write(f"--- stderr of {server.spec.name} (pid {server.pid}) ---\n{text}\n")
        sys.stderr.flush()


# --- stdio -------------------------------------------------------------------------


class StdioSession:
    """One MCP session with a server over its stdin/stdout."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self._ids = itertools.count(1)

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        ident = next(self._ids)
        message = {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        await stdin.drain()
        while True:
            line = await asyncio.wait_for(stdout.readline(), CALL_TIMEOUT_S)
            if not line:
                raise RpcError("the server closed stdout")
            answer = json.loads(line)
            if answer.get("id") == ident:  # skip notifications the server sends meanwhile
                if "error" in answer:
                    raise RpcError(str(answer["error"].get("code")))
                result: dict[str, Any] = answer["result"]
                return result

    async def notify(self, method: str) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}).encode() + b"\n")
        await stdin.drain()

    async def initialize(self) -> None:
        await self.request("initialize", initialize_params())
        await self.notify("notifications/initialized")

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await self.request("tools/call", {"name": name, "arguments": arguments})


@contextlib.asynccontextmanager
async def stdio_server(spec: ServerSpec, logs: Path) -> AsyncIterator[tuple[Running, StdioSession]]:
    """Start ``spec`` on stdio, open its session, and stop it afterwards."""
    stderr_path = logs / f"{spec.name}.stdio.stderr"
    with stderr_path.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *spec.command("stdio", None, False),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=spec.env(),
            limit=16 * 1024 * 1024,
        )
    running = Running(spec, process.pid, stderr_path)
    session = StdioSession(process)
    failed = True
    try:
        await asyncio.wait_for(session.initialize(), READY_TIMEOUT_S)
        yield running, session
        failed = False
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
        show_stderr(running, failed)


# --- streamable HTTP -------------------------------------------------------------------


def initialize_params() -> dict[str, Any]:
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "nexus-bench", "version": "1"},
    }


HTTP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


class HttpConnection:
    """One keep-alive HTTP/1.1 connection, with no more HTTP than MCP needs.

    A general client (httpx) costs the load generator about as much CPU per call as the
    server spends, on the same two cores; this writes one request and reads one response
    (``Content-Length`` or chunked, as uvicorn sends them) and nothing else.
    """

    def __init__(self, url: str) -> None:
        parsed = urlsplit(url)
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 80
        self.path = parsed.path or "/"
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def send(
        self, method: str, headers: Mapping[str, str], body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        reused = self._writer is not None
        try:
            return await self._exchange(method, headers, body)
        except (ConnectionError, asyncio.IncompleteReadError):
            await self.close()
            if not reused:
                raise
            # The server closed an idle keep-alive connection: once more, on a new one.
            return await self._exchange(method, headers, body)

    async def _exchange(
        self, method: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        lines = [f"{method} {self.path} HTTP/1.1", f"host: {self.host}:{self.port}",
                 f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]  # fmt: skip
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        answer = {}
        for line in head[1:]:
            if line:
                name, _, value = line.partition(":")
                answer[name.strip().lower()] = value.strip()
        if answer.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")  # no trailers: the empty line
                    break
                parts.append((await reader.readexactly(size + 2))[:-2])
            content = b"".join(parts)
        else:
            content = await reader.readexactly(int(answer.get("content-length", "0")))
        if answer.get("connection", "").lower() == "close":
            await self.close()
        return status, answer, content

    async def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def parse_http_answer(
    status: int, headers: Mapping[str, str], content: bytes, ident: int
) -> dict[str, Any]:
    """The JSON-RPC answer with ``ident`` from a JSON body or an SSE stream."""
    if status != 200:
        raise RpcError(f"HTTP {status}")
    if headers.get("content-type", "").startswith("text/event-stream"):
        for line in content.decode().splitlines():
            if line.startswith("data:"):
                answer = json.loads(line[5:])
                if answer.get("id") == ident:
                    break
        else:
            raise RpcError("no answer in the event stream")
    else:
        answer = json.loads(content)
    if "error" in answer:
        raise RpcError(str(answer["error"].get("code")))
    result: dict[str, Any] = answer["result"]
    return result


class HttpSession:
    """One MCP session over streamable HTTP on its own connection (stateless: no session
    id, nothing to close)."""

    def __init__(self, url: str, stateless: bool) -> None:
        self.connection = HttpConnection(url)
        self.stateless = stateless
        self.headers = dict(HTTP_HEADERS)
        self._ids = itertools.count(1)

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        ident = next(self._ids)
        body = json.dumps({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
        status, headers, content = await self.connection.send("POST", self.headers, body.encode())
        if method == "initialize" and "mcp-session-id" in headers:
            self.headers["mcp-session-id"] = headers["mcp-session-id"]
        return parse_http_answer(status, headers, content, ident)

    async def initialize(self) -> None:
        await self.request("initialize", initialize_params())
        self.headers["mcp-protocol-version"] = PROTOCOL_VERSION
        if not self.stateless:
            body = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
            status, _, _ = await self.connection.send("POST", self.headers, body.encode())
            if status not in (200, 202):
                raise RpcError(f"HTTP {status}")

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await self.request("tools/call", {"name": name, "arguments": arguments})

    async def close(self) -> None:
        try:
            if not self.stateless and "mcp-session-id" in self.headers:
                with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                    await self.connection.send("DELETE", self.headers)
        finally:
            await self.connection.close()


@contextlib.asynccontextmanager
async def http_server(spec: ServerSpec, logs: Path, *, stateless: bool) -> AsyncIterator[Running]:
    """Start ``spec`` on a free loopback port; yield it once it answers ``initialize``."""
    port = free_port()
    mode = "stateless" if stateless else "stateful"
    stderr_path = logs / f"{spec.name}.http-{mode}.stderr"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            spec.command("http", port, stateless),
            stdin=subprocess.DEVNULL,
            stdout=stderr,  # nothing is expected on stdout for HTTP; keep it with stderr
            stderr=stderr,
            env=spec.env(),
        )
    running = Running(spec, process.pid, stderr_path, url=f"http://127.0.0.1:{port}/mcp")
    failed = True
    try:
        await wait_until_serving(process, running.url or "", stateless)
        yield running
        failed = False
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        show_stderr(running, failed)


async def wait_until_serving(process: subprocess.Popen[bytes], url: str, stateless: bool) -> None:
    """Bounded wait: the server answers an ``initialize`` (no fixed sleep)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"server exited early (status {process.returncode})")
        session = HttpSession(url, stateless)
        try:
            await asyncio.wait_for(session.initialize(), 5.0)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, RpcError):
            await session.connection.close()
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start serving") from None
            await asyncio.sleep(0.1)  # polling interval of a bounded wait
            continue
        await session.close()
        return


@contextlib.contextmanager
def bench_workspace() -> Any:
    """A temporary workspace with the small file every transport benchmark reads."""
    with tempfile.TemporaryDirectory(prefix="nexus-bench-") as tmp:
        root = Path(tmp)
        workspace = root / "ws"
        workspace.mkdir()
        (workspace / "small.txt").write_text("hello benchmark\n" * 16)
        logs = root / "logs"
        logs.mkdir()
        yield root, workspace, logs


def check_read_result(result: dict[str, Any]) -> None:
    """The call really read the file (a refusal measured as fast is worse than none)."""
    if result.get("isError") or (result.get("structuredContent") or {}).get("size_bytes") != 256:
        raise RpcError("the read did not return the file")


__all__ = [
    "HttpSession",
    "RpcError",
    "ServerSpec",
    "StdioSession",
    "bench_workspace",
    "check_read_result",
    "free_port",
    "http_server",
    "process_cpu_seconds",
    "show_stderr",
    "stdio_server",
]
