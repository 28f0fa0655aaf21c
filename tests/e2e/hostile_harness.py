"""The hostile upstream (``tests/support/hostile_upstream.py``) as a process, for the tests."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .upstream_harness import REPO, read_record

HOSTILE_SCRIPT = REPO / "tests" / "support" / "hostile_upstream.py"


def hostile_stdio(server_id: str, mode: str, record: Path, **extra: Any) -> dict[str, Any]:
    args = [str(HOSTILE_SCRIPT), "--transport", "stdio", "--mode", mode, "--record", str(record)]
    return {
        "server_id": server_id,
        "transport": "stdio",
        "command": sys.executable,
        "args": args,
        **extra,
    }


@dataclass
class HostileHttp:
    url: str
    port: int
    other_port: int | None
    record: Path

    def requests(self) -> list[dict[str, Any]]:
        return [r for r in read_record(self.record) if r["kind"] == "http"]


@contextlib.contextmanager
def hostile_http(mode: str, record: Path) -> Iterator[HostileHttp]:
    """The hostile upstream over HTTP on loopback; yields once it listens."""
    args = [sys.executable, str(HOSTILE_SCRIPT), "--transport", "http", "--mode", mode]
    args += ["--record", str(record)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        ports: dict[str, int] = {}
        deadline = time.monotonic() + 20
        assert proc.stderr is not None
        while "READY" not in ports:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("hostile upstream did not start")
            line = proc.stderr.readline()
            if line.split()[:1] in (["READY"], ["OTHER"]):
                ports[line.split()[0]] = int(line.split()[1])
        port = ports["READY"]
        yield HostileHttp(f"http://127.0.0.1:{port}/mcp", port, ports.get("OTHER"), record)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
