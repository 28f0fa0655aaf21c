"""A real ``nexus-mcp serve`` says when it starts and when it stops, in a line people read.

Subprocesses with stderr on a pipe (so ``auto`` means JSON) or ``--log-format text``:
``server_started`` names the address (the URL, or ``stdio``), mode and transport;
``server_stopped`` names why (``SIGINT``, ``SIGTERM``, ``stdin_closed``) and the process
exits 0. At INFO no line is an empty ``library_log`` and no line is blank. The prod
banner's client config shows where the caller's token goes, never a token.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from .servers import serve_command, server_env
from .test_http_listen import BANNER_DEADLINE_S, Lines

pytestmark = pytest.mark.slow

JWT_SECRET = "lifecycle-jwt-secret-0123456789abcdef-XYZ"
TEXT_LINE = re.compile(
    r"^\d\d:\d\d:\d\d (INFO |WARN |ERROR|DEBUG|CRIT ) (?P<event>\S+)(?P<rest>.*)$"
)


def start(
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None, **popen: Any
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        serve_command(*args, "--data-dir", str(tmp_path / "d")),
        env=server_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen,
    )  # fmt: skip


def close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def read_until(lines: Lines, predicate: Any, seen: list[str]) -> str:
    deadline = time.monotonic() + BANNER_DEADLINE_S
    while True:
        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        if line is None:
            raise AssertionError("stderr ended early:\n" + "\n".join(seen))
        seen.append(line)
        if predicate(line):
            return line


def rest(lines: Lines, seen: list[str]) -> list[str]:
    while (line := lines.get(timeout=BANNER_DEADLINE_S)) is not None:
        seen.append(line)
    return seen


def stop(proc: subprocess.Popen[bytes], sig: signal.Signals) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"still running 20 s after {sig.name}") from None


def json_events(seen: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in seen if line.startswith('{"')]


def no_empty_lines(seen: list[str]) -> None:
    assert all(line.strip() for line in seen), seen
    assert not [line for line in seen if "library_log" in line], seen


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_http_json_start_and_stop_lines_and_a_clean_exit_on_a_signal(
    workspace: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    proc = start(
        ["--transport", "http", "--mode", "dev", "--port", "0", "--workspace", str(workspace)],
        tmp_path,
    )
    assert proc.stderr is not None
    lines, seen = Lines(proc.stderr), []
    try:
        started = json.loads(read_until(lines, lambda ln: "server_started" in ln, seen))
        url = started["address"]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/mcp", url)
        assert (started["mode"], started["transport"]) == ("dev", "http")
        # The address is really served, and a request logs nothing empty.
        base = url.removesuffix("/mcp")
        assert httpx.get(f"{base}/healthz", timeout=10).json() == {"status": "ok"}
        code = stop(proc, sig)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    seen = rest(lines, seen)
    close_pipes(proc)
    assert code == 0, seen
    stopped = json_events(seen)[-1]
    assert (stopped["event"], stopped["reason"], stopped["transport"]) == (
        "server_stopped",
        sig.name,
        "http",
    )
    no_empty_lines(seen)
    assert "Traceback" not in "\n".join(seen)


def test_http_text_lines_on_request_and_the_banner_in_between(
    workspace: Path, tmp_path: Path
) -> None:
    proc = start(
        ["--transport", "http", "--mode", "dev", "--port", "0", "--log-format", "text",
         "--workspace", str(workspace)],
        tmp_path,
    )  # fmt: skip
    assert proc.stderr is not None
    lines, seen = Lines(proc.stderr), []
    try:
        started = read_until(lines, lambda ln: " server_started " in ln, seen)
        code = stop(proc, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    seen = rest(lines, seen)
    close_pipes(proc)
    assert code == 0
    match = TEXT_LINE.match(started)
    assert match is not None, started
    assert re.search(r" address=http://127\.0\.0\.1:\d+/mcp mode=dev transport=http ", started)
    assert not [line for line in seen if line.startswith('{"')], seen  # no JSON log line
    assert TEXT_LINE.match(seen[-1]) and seen[-1].endswith(
        "server_stopped reason=SIGTERM transport=http"
    )
    no_empty_lines(seen)


def test_stdio_logs_start_and_stop_when_the_client_closes_stdin(
    workspace: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        serve_command("--mode", "dev", "--workspace", str(workspace), "--data-dir",
                      str(tmp_path / "d")),
        env=server_env(), input=b"", capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == b""  # stdio's channel carries nothing but MCP messages
    seen = done.stderr.decode().splitlines()
    events = json_events(seen)
    started = next(e for e in events if e["event"] == "server_started")
    assert (started["address"], started["transport"], started["mode"]) == ("stdio", "stdio", "dev")
    assert (events[-1]["event"], events[-1]["reason"]) == ("server_stopped", "stdin_closed")
    no_empty_lines(seen)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_stdio_stops_on_a_signal_while_stdin_stays_open(
    workspace: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C in a terminal: stdin is open and its reader thread blocked; it still stops."""
    proc = start(["--mode", "dev", "--workspace", str(workspace)], tmp_path, stdin=subprocess.PIPE)
    assert proc.stderr is not None and proc.stdin is not None
    lines, seen = Lines(proc.stderr), []
    try:
        read_until(lines, lambda ln: "server_started" in ln, seen)
        began = time.monotonic()
        code = stop(proc, sig)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    seen = rest(lines, seen)
    close_pipes(proc)
    assert code == 0, seen
    assert took < 10
    stopped = json_events(seen)[-1]
    assert (stopped["event"], stopped["reason"]) == ("server_stopped", sig.name)


def test_the_prod_banner_shows_where_the_token_goes_and_never_a_token(
    workspace: Path, tmp_path: Path
) -> None:
    proc = start(
        ["--transport", "http", "--mode", "prod", "--port", "0", "--workspace", str(workspace)],
        tmp_path,
        env={"NEXUS_MCP_AUTH__JWT_SECRET": JWT_SECRET},
    )
    assert proc.stderr is not None
    lines, seen = Lines(proc.stderr), []
    try:
        read_until(lines, lambda ln: "server_started" in ln, seen)
        code = stop(proc, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    seen = rest(lines, seen)
    close_pipes(proc)
    assert code == 0
    text = "\n".join(seen)
    assert JWT_SECRET not in text
    start_at = seen.index("{")
    end_at = seen.index("}", start_at)
    config = json.loads("\n".join(seen[start_at : end_at + 1]))
    (entry,) = config["mcpServers"].values()
    assert entry["headers"] == {"Authorization": "Bearer <your token>"}
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/mcp", entry["url"])


def test_log_format_comes_from_the_environment_or_the_config_file_too(
    workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "nexus.yaml"
    config.write_text("log_format: text\n", encoding="utf-8")
    for env, args in (
        ({"NEXUS_MCP_LOG_FORMAT": "text"}, []),
        ({}, ["--config", str(config)]),
    ):
        done = subprocess.run(
            serve_command("--mode", "dev", "--workspace", str(workspace), "--data-dir",
                          str(tmp_path / "d"), *args),
            env=server_env(env), input=b"", capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        seen = done.stderr.decode().splitlines()
        assert TEXT_LINE.match(seen[-1]) and seen[-1].endswith(
            "server_stopped reason=stdin_closed transport=stdio"
        ), seen
        assert not [line for line in seen if line.startswith('{"')], seen


@pytest.mark.parametrize(
    ("env", "args", "named"),
    [
        ({"NEXUS_MCP_LOG_FORMAT": "yaml\n{forged}"}, [], "NEXUS_MCP_LOG_FORMAT"),
        ({}, ["--log-format", "xml"], "--log-format"),
    ],
)
def test_a_bad_log_format_is_one_line_naming_where_it_came_from(
    workspace: Path, tmp_path: Path, env: dict[str, str], args: list[str], named: str
) -> None:
    done = subprocess.run(
        serve_command("--mode", "dev", "--workspace", str(workspace), "--data-dir",
                      str(tmp_path / "d"), *args),
        env=server_env(env), input=b"", capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    text = done.stderr.decode()
    assert named in text and "Traceback" not in text
    assert "forged" not in text  # the value given is never echoed
