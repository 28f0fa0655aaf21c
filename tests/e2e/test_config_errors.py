"""A bad ``nexus.yaml`` stops ``nexus-mcp serve`` with plain words, one line per problem.

The real command in a subprocess, as a person runs it the first time: each line names the
file and line (or the environment variable, or the flag) and the dotted key; unknown keys
get a guess; no value is ever echoed (it may be a secret), no traceback, exit status 2.
``${NAME}`` names a secret's environment variable.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from .servers import server_env

pytestmark = pytest.mark.slow

EXIT_CONFIG_ERROR = 2
CANARY = "sk-canary-0c7e1d9a"


def serve(
    config: Path, workspace: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "nexus_mcp", "serve", "--config", str(config)]
    argv += ["--workspace", str(workspace), "--data-dir", str(workspace.parent / "data"), *flags]
    return subprocess.run(
        argv, env=server_env(env), cwd=workspace, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def refusal(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The refusal's lines (JSON log lines left out), after checking how it ended."""
    assert done.returncode == EXIT_CONFIG_ERROR, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    return [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith('{"')]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


def test_every_bad_setting_is_one_plain_line_naming_the_file_line_and_key(
    tmp_path: Path, ws: Path
) -> None:
    config = tmp_path / "nexus.yaml"
    config.write_text(
        "mode: staging\n"  # 1
        "allowed_hosts: example.com\n"  # 2
        "dev_principal:\n"  # 3
        "  subjet: alice\n"  # 4
        "  read_only: maybe\n"  # 5
        "search:\n"  # 6
        "  max_seconds: 0\n"  # 7
        "notes:\n"  # 8
        "  vaults: [a]\n"  # 9
        f"prot: {CANARY}\n"  # 10
    )
    done = serve(config, ws, "--port", "70000", env={"NEXUS_MCP_WORKERS": "zero"})
    assert refusal(done) == [
        "nexus-mcp: invalid configuration (9 problems):",
        f"  {config}:1: `mode` should be one of: dev, prod",
        "  --port: `port` should be at most 65535",
        "  NEXUS_MCP_WORKERS: `workers` should be a whole number",
        f"  {config}:2: `allowed_hosts` should be a list",
        f"  {config}:5: `dev_principal.read_only` should be true or false",
        f"  {config}:4: unknown key `dev_principal.subjet`; did you mean `dev_principal.subject`?",
        f"  {config}:7: `search.max_seconds` should be greater than 0",
        f"  {config}:9: `notes.vaults` should be a mapping (key: value)",
        f"  {config}:10: unknown key `prot`; did you mean `port`?",
    ]
    assert CANARY not in done.stderr


def test_one_problem_is_one_line(tmp_path: Path, ws: Path) -> None:
    config = tmp_path / "nexus.yaml"
    config.write_text("mode: dev\nlimits:\n  max_read_bytes: lots\n")
    assert refusal(serve(config, ws)) == [
        f"nexus-mcp: {config}:3: `limits.max_read_bytes` should be a whole number"
    ]


def test_a_section_of_its_own_loader_reads_the_same(tmp_path: Path, ws: Path) -> None:
    config = tmp_path / "nexus.yaml"
    config.write_text(
        "mode: dev\n"  # 1
        "write_policies:\n"  # 2
        "  workspace:\n"  # 3
        "    allowed_paths: notes/**\n"  # 4
        "    allowed_operations: [write]\n"  # 5
        "    max_bytes_per_write: 1000\n"  # 6
        "    require_approvel: false\n"  # 7
    )
    assert refusal(serve(config, ws)) == [
        "nexus-mcp: invalid configuration (2 problems):",
        f"  {config}:4: `write_policies.workspace.allowed_paths` should be a list",
        f"  {config}:7: unknown key `write_policies.workspace.require_approvel`; did you mean "
        "`write_policies.workspace.require_approval`?",
    ]


def test_upstreams_are_named_by_their_id_and_a_secret_is_never_echoed(
    tmp_path: Path, ws: Path
) -> None:
    config = tmp_path / "nexus.yaml"
    config.write_text(
        "mode: prod\n"  # 1
        "upstreams:\n"  # 2
        "  - server_id: fs\n"  # 3
        "    transport: stdio\n"  # 4
        "    comand: npx\n"  # 5
        "  - server_id: web\n"  # 6
        "    transport: http\n"  # 7
        "    url: https://mcp.example.com/mcp\n"  # 8
        "    credentials:\n"  # 9
        "      type: bearer\n"  # 10
        f"      token: {CANARY}\n"  # 11
    )
    lines = refusal(serve(config, ws, "--subject", "alice"))
    assert lines == [
        f"nexus-mcp: {config}:5: unknown key `upstreams.fs.comand`; did you mean "
        "`upstreams.fs.command`?"
    ]
    config.write_text(config.read_text().replace("comand", "command"))
    done = serve(config, ws, "--subject", "alice")
    assert refusal(done) == [
        f"nexus-mcp: {config}:11: `upstreams.web.credentials.token`: inline secrets are "
        "refused in prod (use ${NAME})"
    ]
    assert CANARY not in done.stderr


def test_a_secret_named_by_an_unset_variable_names_the_key_and_the_variable(
    tmp_path: Path, ws: Path
) -> None:
    config = tmp_path / "nexus.yaml"
    config.write_text(
        "mode: dev\ntransport: http\nauth:\n  jwt_secret: ${NEXUS_TEST_JWT}\n"
        "metrics:\n  bearer_token: Bearer ${NEXUS_TEST_METRICS}\n"
    )
    done = serve(config, ws, env={"NEXUS_TEST_METRICS": CANARY})
    assert refusal(done) == [
        "nexus-mcp: invalid configuration (2 problems):",
        f"  {config}:4: `auth.jwt_secret` names the environment variable NEXUS_TEST_JWT, "
        "which is not set",
        f"  {config}:6: `metrics.bearer_token`: name an environment variable as the whole "
        "value, ${NAME} (no text around it)",
    ]
    assert CANARY not in done.stderr


def test_a_secret_read_from_its_variable_is_checked_but_never_shown(
    tmp_path: Path, ws: Path
) -> None:
    config = tmp_path / "nexus.yaml"
    config.write_text("mode: dev\nauth:\n  jwt_secret: ${NEXUS_TEST_JWT}\n")
    done = serve(config, ws, env={"NEXUS_TEST_JWT": CANARY})  # shorter than 32 bytes
    assert refusal(done) == [f"nexus-mcp: {config}:3: `auth.jwt_secret`: must be at least 32 bytes"]
    assert CANARY not in done.stderr


def test_an_environment_list_that_is_not_json_is_a_plain_line(tmp_path: Path, ws: Path) -> None:
    config = tmp_path / "nexus.yaml"
    config.write_text("mode: dev\n")
    done = serve(config, ws, env={"NEXUS_MCP_ALLOWED_HOSTS": CANARY})
    assert refusal(done) == [
        "nexus-mcp: NEXUS_MCP_ALLOWED_HOSTS: `allowed_hosts` should be a list "
        '(JSON, e.g. ["a", "b"])'
    ]
    assert CANARY not in done.stderr


def test_a_hostile_key_cannot_reach_the_terminal_raw(tmp_path: Path, ws: Path) -> None:
    config = tmp_path / "nexus.yaml"
    escape = "\x1b]0;owned\x07\x1b[2J\x1b[31m"
    key = escape + "k" * 10_000
    # An explicit key (``? ...``): YAML allows a plain key of 1024 characters at most.
    config.write_text(f'mode: dev\n? "{key.encode("unicode_escape").decode()}"\n: 1\n')
    done = serve(config, ws)
    [line] = refusal(done)
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert line == (
        f"nexus-mcp: {config}:2: unknown key "
        "`\\x1b]0;owned\\x07\\x1b[2J\\x1b[31m" + "k" * (64 - len(escape)) + "...`"
    )
    assert len(line) < 200


def test_a_file_of_thousands_of_bad_keys_is_answered_at_once_in_a_screenful(
    tmp_path: Path, ws: Path
) -> None:
    # Each problem's line was found by composing the whole file again: 800 bad keys took
    # 20 seconds, 5000 some minutes, and every one of them was printed.
    config = tmp_path / "nexus.yaml"
    config.write_text("mode: dev\n" + "".join(f"unknown_{i}: 1\n" for i in range(5000)))
    started = time.monotonic()
    lines = refusal(serve(config, ws))
    assert time.monotonic() - started < 30
    assert lines[0] == "nexus-mcp: invalid configuration (5000 problems):"
    assert lines[1] == f"  {config}:2: unknown key `unknown_0`"
    assert lines[-1] == "  ... and 4950 more problems"
    assert len(lines) == 1 + 50 + 1


def test_problems_in_the_settings_and_in_every_section_are_reported_in_one_run(
    tmp_path: Path, ws: Path
) -> None:
    """The sections other loaders own (write_policies, upstreams, repos, approvals) are
    checked too when the settings already failed: one run shows the whole file."""
    config = tmp_path / "nexus.yaml"
    config.write_text(
        "mode: prodd\n"  # 1
        "write_policies:\n"  # 2
        "  workspace:\n"  # 3
        f"    allowed_paths: {CANARY}/**\n"  # 4
        "    alowed_operations: [write]\n"  # 5
        "upstreams: {fs: 1}\n"  # 6
        "repos: [x]\n"  # 7
        "approvals:\n"  # 8
        "  ttl_seconds: lots\n"  # 9
    )
    lines = refusal(serve(config, ws))

    assert lines[0] == "nexus-mcp: invalid configuration (7 problems):"
    body = [line.strip() for line in lines[1:]]
    assert body[0] == f"{config}:1: `mode` should be one of: dev, prod"
    assert f"{config}:4: `write_policies.workspace.allowed_paths` should be a list" in body
    assert f"{config}:3: `write_policies.workspace.allowed_operations` is required" in body
    assert any("did you mean `write_policies.workspace.allowed_operations`?" in b for b in body)
    assert f"{config}:6: `upstreams` should be a list" in body
    assert f"{config}:7: `repos` should be a mapping (key: value)" in body
    assert any("approvals.ttl_seconds" in b for b in body)
    assert CANARY not in "\n".join(lines)


def test_a_file_with_only_section_problems_still_reports_them_as_before(
    tmp_path: Path, ws: Path
) -> None:
    config = tmp_path / "nexus.yaml"
    config.write_text("write_policies:\n  workspace:\n    allowed_paths: notes/**\n")
    lines = refusal(serve(config, ws, "--subject", "alice"))
    body = [line.strip() for line in lines]
    assert f"{config}:3: `write_policies.workspace.allowed_paths` should be a list" in body
