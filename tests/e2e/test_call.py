"""``nexus-mcp call`` against a real ``serve --transport http`` subprocess, run as a user runs it.

The client is a subprocess too: what is checked is exactly what a script sees (stdout,
stderr, exit status), including that a token never shows up in either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jwt
import pytest

from .servers import free_port, http_server, server_env

pytestmark = pytest.mark.slow

SECRET = "call-test-secret-0123456789abcdef-0123"
AUDIENCE = "nexus-call-test"
HELLO = "hello through nexus-mcp call\n"
CALL_TIMEOUT_SECONDS = 60  # a bound on the subprocess, far above any healthy call


def bearer(**overrides: Any) -> str:
    secret = overrides.pop("_secret", SECRET)
    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": "carol",
        "aud": AUDIENCE,
        "iat": now,
        "exp": now + 300,
        "role": "editor",
    }
    claims.update(overrides)
    return jwt.encode(claims, secret, algorithm="HS256")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workspace = tmp_path_factory.mktemp("ws")
    (workspace / "hello.txt").write_text(HELLO)
    port = free_port()
    env = {
        "NEXUS_MCP_MODE": "prod",
        "NEXUS_MCP_AUTH__JWT_SECRET": SECRET,
        "NEXUS_MCP_AUTH__AUDIENCE": AUDIENCE,
        "NEXUS_MCP_DATA_DIR": str(tmp_path_factory.mktemp("data")),
    }
    with http_server(["--workspace", str(workspace)], env, port=port):
        yield f"http://127.0.0.1:{port}/mcp"


def call(*argv: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nexus_mcp", "call", *argv],
        env=server_env(env),
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT_SECONDS,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """Exit 2, nothing on stdout, one ``error:`` line on stderr (no traceback)."""
    assert done.returncode == 2, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_a_successful_call_prints_the_structured_content_and_exits_0(url: str) -> None:
    done = call("nexus_read_file", "path=hello.txt", env={"NEXUS_MCP_URL": url,
                                                          "NEXUS_MCP_TOKEN": bearer()})  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "path": "hello.txt",
        "content": HELLO,
        "size_bytes": len(HELLO),
        "binary": False,
    }
    assert done.stderr == ""


def test_the_url_and_token_flags_work_as_the_environment_does(url: str) -> None:
    done = call("--url", url, "--token", bearer(), "nexus_read_file", "path=hello.txt")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["content"] == HELLO


def test_options_may_come_after_the_arguments(url: str) -> None:
    done = call("nexus_read_file", "--full", "path=hello.txt", "--url", url,
                env={"NEXUS_MCP_TOKEN": bearer()})  # fmt: skip

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["isError"] is False
    assert result["structuredContent"]["content"] == HELLO
    assert result["_meta"]["nexus.mcp/tool_effect"]["tool_name"] == "nexus_read_file"


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["nexus_read_file", "path=../etc/passwd"], "INVALID_PATH"),
        (["nexus_read_file", "path=/etc/passwd"], "INVALID_PATH"),
        (["nexus_read_file", "path=hello.txt/../../x"], "INVALID_PATH"),
        (["nexus_read_file", "path=missing.txt"], "NOT_FOUND"),
        (["nexus_read_file", "path=hello.txt", "bogus:=1"], "INVALID_INPUT"),
        (["nexus_read_file", "path:=7"], "INVALID_INPUT"),
        (["nexus_write_file", "path=scratch/a.txt", "content=x"], "IDEMPOTENCY_KEY_REQUIRED"),
        (
            ["nexus_write_file", "path=scratch/a.txt", "content=x", "idempotency_key=k1"],
            "WRITE_POLICY_DENIED",  # prod without a write policy accepts no writes
        ),
    ],
)
def test_a_refusal_prints_the_envelope_and_exits_1(url: str, argv: list[str], code: str) -> None:
    done = call(*argv, env={"NEXUS_MCP_URL": url, "NEXUS_MCP_TOKEN": bearer()})

    assert done.returncode == 1, done
    envelope = json.loads(done.stdout)
    assert set(envelope) == {"error", "code"}
    assert envelope["code"] == code
    assert done.stderr == ""


def test_a_tool_the_caller_cannot_see_answers_as_an_unknown_tool_and_exits_1(url: str) -> None:
    viewer = bearer(sub="vic", role="viewer")  # minimal: no write tools
    env = {"NEXUS_MCP_URL": url, "NEXUS_MCP_TOKEN": viewer}

    hidden = call("nexus_write_file", "path=a", "content=b", "idempotency_key=k", env=env)
    missing = call("no_such_tool", env=env)

    assert (hidden.returncode, missing.returncode) == (1, 1)
    assert json.loads(hidden.stdout) == {"error": "Unknown tool: 'nexus_write_file'"}
    assert json.loads(missing.stdout) == {"error": "Unknown tool: 'no_such_tool'"}


@pytest.mark.parametrize(
    "token",
    [
        None,
        "CANARY-not-a-jwt-4f1d",
        bearer(_secret="CANARY-wrong-secret-0123456789abcdef-xyz"),
        bearer(exp=int(time.time()) - 3600, iat=int(time.time()) - 7200),
        bearer(aud="someone-else"),
    ],
)
def test_a_missing_or_bad_token_is_one_line_exit_2_and_the_token_is_never_shown(
    url: str, token: str | None
) -> None:
    env = {"NEXUS_MCP_URL": url} | ({"NEXUS_MCP_TOKEN": token} if token else {})
    done = call("nexus_read_file", "path=hello.txt", env=env)

    line = one_line_error(done)
    assert "401" in line
    if token:
        assert token not in done.stdout + done.stderr


def test_a_connection_refused_is_one_line_and_exit_2() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()

    done = call("--url", f"http://127.0.0.1:{port}/mcp", "--token", "CANARY-tok-9e2",
                "nexus_read_file", "path=hello.txt")  # fmt: skip

    line = one_line_error(done)
    assert f"127.0.0.1:{port}" in line
    assert "CANARY" not in done.stderr
    assert time.monotonic() - started < CALL_TIMEOUT_SECONDS


def test_a_wrong_endpoint_path_is_one_line_and_exit_2(url: str) -> None:
    done = call("--url", url.replace("/mcp", "/not-mcp"), "nexus_read_file", "path=hello.txt",
                env={"NEXUS_MCP_TOKEN": bearer()})  # fmt: skip

    one_line_error(done)


def test_credentials_in_the_url_are_never_shown() -> None:
    port = free_port()
    done = call("--url", f"http://user:CANARY-pass-51@127.0.0.1:{port}/mcp?key=CANARY-q",
                "nexus_read_file", "path=hello.txt")  # fmt: skip

    one_line_error(done)
    assert "CANARY" not in done.stderr


def test_a_usage_error_is_one_line_exit_2_without_contacting_any_server() -> None:
    # The default URL would be `make run`'s; a free port proves nothing was contacted.
    done = call("nexus_read_file", "n:=CANARY{not json",
                env={"NEXUS_MCP_URL": f"http://127.0.0.1:{free_port()}/mcp"})  # fmt: skip

    line = one_line_error(done)
    assert "CANARY" not in line and "cannot connect" not in line


def test_an_unknown_option_is_refused_by_the_parser() -> None:
    done = call("nexus_read_file", "path=a", "--bogus")

    assert done.returncode == 2
    assert "--bogus" in done.stderr and "Traceback" not in done.stderr


def test_help_documents_the_exit_codes() -> None:
    done = call("--help")

    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "0 the tool succeeded, 1 the tool refused or failed, 2 usage error" in text


def test_the_repository_path_is_not_needed_to_run_it(tmp_path: Path, url: str) -> None:
    # Run from an unrelated folder, as a script would: nothing is read from the cwd.
    done = subprocess.run(
        [sys.executable, "-m", "nexus_mcp", "call", "nexus_read_file", "path=hello.txt"],
        env=server_env({"NEXUS_MCP_URL": url, "NEXUS_MCP_TOKEN": bearer()}),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT_SECONDS,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_reader_that_goes_away_ends_the_command_quietly(url: str) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head` that already exited: every write fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "nexus_mcp", "call", "nexus_read_file", "path=hello.txt"],
            env=server_env({"NEXUS_MCP_URL": url, "NEXUS_MCP_TOKEN": bearer()}),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=CALL_TIMEOUT_SECONDS,
            check=False,
        )
    finally:
        os.close(write_end)

    assert done.returncode == 141
    assert done.stderr == ""
