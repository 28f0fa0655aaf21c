"""``serve --transport http`` announces where it listens only once it listens there.

The banner and the paste-ready client config name the port really bound (``--port 0``
gets one from the system), and an address that cannot be had is one line on stderr and
exit 2: no banner, nothing on stdout, no traceback.
"""

from __future__ import annotations

import json
import queue
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from .servers import serve_command, server_env

pytestmark = pytest.mark.slow

EXIT_CONFIG_ERROR = 2
BANNER_DEADLINE_S = 30.0
BANNER = re.compile(r"^nexus-mcp dev server on http://(?P<host>[^ ]+):(?P<port>\d+)/mcp$")
TEST_NET_ADDRESS = "192.0.2.1"  # RFC 5737: never an address of this machine


class Lines:
    """Every line of a stream as it arrives, read on a thread; None at its end."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self.queue.put(raw.decode(errors="replace").rstrip("\n"))
        self.queue.put(None)

    def get(self, timeout: float) -> str | None:
        return self.queue.get(timeout=timeout)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def read_banner(lines: Lines) -> re.Match[str]:
    """The banner line, read within a bounded time (start-up logs come before it)."""
    seen: list[str] = []
    deadline = time.monotonic() + BANNER_DEADLINE_S
    while True:
        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        if line is None:
            raise AssertionError("server ended before its banner: " + "\n".join(seen))
        seen.append(line)
        match = BANNER.match(line)
        if match is not None:
            return match


@pytest.fixture
def started(workspace: Path, tmp_path: Path) -> Iterator[Lines]:
    """A server on --port 0; its stderr lines (stdout is drained by the OS pipe, unused)."""
    proc = subprocess.Popen(
        serve_command("--transport", "http", "--mode", "dev", "--port", "0",
                      "--workspace", str(workspace), "--data-dir", str(tmp_path / "d")),
        env=server_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    lines = Lines(proc.stderr)
    try:
        yield lines
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        lines.join(timeout=10)  # the pipe reached its end: the reader is done with it
        proc.stderr.close()


async def test_port_0_announces_the_port_really_bound_and_serves_on_it(started: Lines) -> None:
    lines = started
    match = read_banner(lines)
    port = int(match["port"])
    assert port != 0 and match["host"] == "127.0.0.1"
    url = f"http://127.0.0.1:{port}/mcp"
    # The paste-ready client config that follows names the same URL.
    config_lines: list[str] = []
    while not config_lines or config_lines[-1] != "}":
        line = lines.get(timeout=BANNER_DEADLINE_S)
        assert line is not None
        if config_lines or line == "{":
            config_lines.append(line)
    assert json.loads("\n".join(config_lines)) == {"mcpServers": {"nexus": {"url": url}}}
    # Listening already: no retry loop is needed to reach it.
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).json() == {"status": "ok"}
    async with (
        httpx2.AsyncClient(timeout=10) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        result = await session.call_tool("nexus_read_file", {"path": "todo.txt"})
    assert result.is_error is False


@pytest.fixture
def listener(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """Something else listening on a port: the address the server asks for is taken."""
    host = request.param
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        pytest.skip(f"{host} is not available on this machine")
    with sock:
        sock.listen(1)
        yield host, int(sock.getsockname()[1])


def refused(workspace: Path, tmp_path: Path, host: str, port: int) -> str:
    """Run the server on host:port; it must stop with exit 2. Returns its one-line refusal."""
    done = subprocess.run(
        serve_command("--transport", "http", "--mode", "dev", "--host", host, "--port",
                      str(port), "--workspace", str(workspace), "--data-dir", str(tmp_path / "d")),
        env=server_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == EXIT_CONFIG_ERROR, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert "client config" not in done.stderr and "server on" not in done.stderr
    # Start-up logs are JSON lines; the refusal is the only other line.
    [line] = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith('{"')]
    return line


@pytest.mark.parametrize("listener", ["127.0.0.1", "::1"], indirect=True)
def test_a_taken_port_is_one_line_naming_the_address_and_exit_2(
    workspace: Path, tmp_path: Path, listener: tuple[str, int]
) -> None:
    host, port = listener
    shown = f"[{host}]" if ":" in host else host
    line = refused(workspace, tmp_path, host, port)
    assert line.startswith(f"nexus-mcp: cannot listen on {shown}:{port}: address already in use")
    assert "NEXUS_MCP_PORT" in line and "--port" in line
    # The Makefile way too: `make run` serves on PORT (8765 unless given).
    assert "make run PORT=" in line and "--port 0" in line


def test_an_address_that_is_not_this_machines_is_one_line_and_exit_2(
    workspace: Path, tmp_path: Path
) -> None:
    line = refused(workspace, tmp_path, TEST_NET_ADDRESS, 8765)
    assert line.startswith(f"nexus-mcp: cannot listen on {TEST_NET_ADDRESS}:8765: ")
    assert "NEXUS_MCP_HOST" in line
