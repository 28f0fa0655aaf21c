"""Helpers that run ``nexus-mcp serve`` as a real subprocess for transport tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import httpx

SRC = Path(__file__).resolve().parents[2] / "src"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment: only what the server needs, never this process's NEXUS_MCP_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEXUS_MCP_")}
    env["PYTHONPATH"] = str(SRC)
    env.update(extra or {})
    return env


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "nexus_mcp", "serve", *args]


@contextmanager
def http_server(
    args: list[str],
    env: Mapping[str, str],
    *,
    port: int,
    timeout: float = 20.0,
    stderr: IO[bytes] | int = subprocess.PIPE,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``serve --transport http`` and wait (bounded) until /healthz answers.

    ``stderr`` may be a file: a chatty server (``--log-level DEBUG``) would otherwise fill
    the pipe while the test is still talking to it, and block."""
    proc = subprocess.Popen(
        serve_command("--transport", "http", "--port", str(port), *args),
        env=server_env(env),
        stdout=subprocess.PIPE,
        stderr=stderr,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                _, err = proc.communicate()
                tail = err.decode(errors="replace")[-2000:] if err else "(stderr redirected)"
                raise RuntimeError(f"server exited early: {tail}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("server did not become healthy")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
