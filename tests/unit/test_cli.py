"""The command line: every subcommand documents its options; bad settings stop cleanly."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nexus_mcp.cli import COMMANDS, build_parser, command_in, main
from nexus_mcp.policy.serve_flags import SERVE_OPTIONS
from tests.support.logging_state import isolated_logging


def help_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    out = help_text(capsys)
    for command in ("serve", "registry", "profiles", "approvals", "audit", "call"):
        assert command in out


def test_serve_help_documents_every_flag_and_its_environment_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = help_text(capsys, "serve")
    for flag, dest, _, _ in SERVE_OPTIONS:
        assert flag in out
        assert f"NEXUS_MCP_{dest.upper()}" in out
    for flag in ("--read-only", "--stateless-http", "--config"):
        assert flag in out


def test_every_subcommand_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    for name, sub in subparsers.choices.items():  # type: ignore[attr-defined]
        help_text(capsys, name)
        nested = [a for a in sub._actions if getattr(a, "choices", None) and a.dest != "help"]
        for action in nested:
            if isinstance(action.choices, dict):
                for child in action.choices:
                    help_text(capsys, name, child)


def test_bad_setting_exits_2_naming_the_setting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("NEXUS_MCP_PORT", "not-a-port")
    with isolated_logging():  # serve configures the process's logging before it reads settings
        code = main(["serve", "--workspace", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "NEXUS_MCP_PORT" in err and "Traceback" not in err and "not-a-port" not in err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--port", "70000"], "--port"),
        (["--port", "-1"], "--port"),
        (["--http-path", "mcp"], "--http-path"),
        (["--host", "127.0.0.1", "--port", "65536"], "--port"),
    ],
)
def test_a_bad_flag_value_names_the_flag_not_the_environment_variable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], flag: str
) -> None:
    with isolated_logging():
        code = main(["serve", "--workspace", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert flag in err
    assert "NEXUS_MCP_" not in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_flag_value_argparse_cannot_convert_names_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--workspace", str(tmp_path), "--port", "abc"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--port" in err and "NEXUS_MCP_PORT" not in err


def test_a_bad_flag_and_a_bad_environment_value_are_each_named_by_their_source(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NEXUS_MCP_HTTP_PATH", "no-slash")
    with isolated_logging():
        code = main(["serve", "--workspace", str(tmp_path), "--port", "70000"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--port" in err and "NEXUS_MCP_HTTP_PATH" in err
    assert "NEXUS_MCP_PORT" not in err and "--http-path" not in err


def test_every_positional_argument_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    undocumented = [
        f"{path} {action.dest}"
        for path, parser in walk_parsers(build_parser())
        for action in parser._actions
        if not action.option_strings
        and not isinstance(action, argparse._SubParsersAction)
        and not (action.help or "").strip()
    ]
    assert undocumented == []


def test_serve_help_says_the_workspace_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    out = " ".join(help_text(capsys, "serve").split())
    assert "A workspace is required" in out
    assert "tools serve (required)" in out


def walk_parsers(
    parser: argparse.ArgumentParser, path: str = "nexus-mcp"
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += walk_parsers(child, f"{path} {name}")
    return found


# What a server or a shared store needs and `--help` must not pay for (issue 29: a one-shot
# command starts in well under a second). A module here at `--help` is a start-up regression.
HEAVY_MODULES = (
    "fastmcp", "mcp", "pydantic", "pydantic_settings", "starlette", "uvicorn", "psycopg",
    "redis", "jinja2", "structlog", "httpx", "httpx2", "yaml", "jsonschema", "asyncio",
)  # fmt: skip
PROBE = """
import sys
from nexus_mcp.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(" ".join(sys.modules), file=sys.stderr)
"""


def modules_loaded_by(*argv: str) -> set[str]:
    """The modules a fresh interpreter has imported after `nexus-mcp ARGV` (stdin empty)."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEXUS_MCP_")}
    env["PYTHONPATH"] = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True, text=True, env=env, timeout=120, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return set(done.stderr.split())


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"], ["--version"], ["call", "--help"], ["audit", "--help"], ["audit", "tail", "-h"],
        ["console", "--help"], ["state", "--help"], ["state", "import", "-h"], ["init", "--help"],
        ["install", "--help"], ["serve", "--help"], ["fixtures", "--help"],
        ["fixtures", "list", "-h"], ["profiles", "--help"], ["profiles", "grant", "-h"],
        ["upstream", "--help"], ["upstream", "pin", "-h"],
    ],
)  # fmt: skip
def test_help_imports_no_server_stack(argv: list[str]) -> None:
    loaded = {name.split(".")[0] for name in modules_loaded_by(*argv)}
    assert "nexus_mcp" in loaded  # the probe did run the command line
    assert sorted(loaded.intersection(HEAVY_MODULES)) == []


# What only a server (or one action of a command) uses: no command's --help loads any.
SERVER_STACK = (
    "fastmcp", "mcp", "mcp_types", "starlette", "uvicorn", "psycopg", "redis", "jinja2",
    "structlog", "httpx", "httpx2", "pydantic_settings", "detect_secrets", "jwt",
    "cryptography",
)  # fmt: skip


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_command_help_loads_the_server_stack(command: str) -> None:
    """Issue 29: each command's --help within half a second of CPU; these are the
    modules that cost it (approvals, profiles and upstream --help took 0.5-0.8 s)."""
    loaded = {name.split(".")[0] for name in modules_loaded_by(command, "--help")}
    assert "nexus_mcp" in loaded
    assert sorted(loaded.intersection(SERVER_STACK)) == []


def test_a_one_shot_call_runs_without_the_mcp_sdk_or_fastmcp() -> None:
    """`call` speaks MCP over httpx2 itself: the SDK's import alone is seconds of CPU."""
    modules = modules_loaded_by(
        "call", "--url", "http://127.0.0.1:9/mcp", "--timeout", "5", "nexus_read_file"
    )
    assert "nexus_mcp.commands.call_client" in modules  # it did try to call
    loaded = {name.split(".")[0] for name in modules}
    assert sorted(loaded & {"fastmcp", "mcp", "mcp_types", "pydantic", "structlog"}) == []


def test_a_command_loads_only_its_own_module() -> None:
    modules = modules_loaded_by("call", "--help")
    assert "nexus_mcp.commands.call" in modules
    others = {module for module, _ in COMMANDS.values()} - {"nexus_mcp.commands.call"}
    assert sorted(modules & others) == []


# What a stdio server without upstreams, repositories, a hosted vault, a replay or a
# recording never uses (issue 29: the upstream client stack alone was 0.3 s of its start).
# A module here after such a start is a start-up regression.
NOT_FOR_A_PLAIN_STDIO_SERVER = (
    "nexus_mcp.identity.oauth", "nexus_mcp.console", "jinja2",
    "fastmcp.client", "fastmcp.server.auth.oauth_proxy", "key_value", "authlib", "httpx",
    "redis", "psycopg", "jwt", "nexus_mcp.providers.upstream", "nexus_mcp.providers.fixtures",
    "nexus_mcp.repos", "nexus_mcp.tools.repo", "nexus_mcp.notes.canister",
)  # fmt: skip


def test_a_stdio_server_starts_without_the_http_front_door_or_the_console(
    tmp_path: Path,
) -> None:
    """OAuth (FastMCP's proxies and their stores) and the console serve HTTP only; the
    upstream client stack, the repositories, the hosted vault's client, the fixtures and
    the shared stores load only where configured."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    modules = modules_loaded_by(
        "serve", "--transport", "stdio", "--mode", "dev", "--workspace", str(workspace),
        "--data-dir", str(tmp_path / "data"), "--log-level", "ERROR",
    )  # fmt: skip
    assert "nexus_mcp.server.build" in modules  # the server was built (and stdin's EOF ended it)
    loaded = sorted(
        name for name in modules
        if any(name == lazy or name.startswith(f"{lazy}.") for lazy in NOT_FOR_A_PLAIN_STDIO_SERVER)
    )  # fmt: skip
    assert loaded == []


def test_top_level_help_is_the_same_built_lazily_or_in_full() -> None:
    """The line each placeholder shows is the one its module's parser declares."""
    assert build_parser(only="").format_help() == build_parser().format_help()
    for name in COMMANDS:
        assert build_parser(only=name).format_help() == build_parser().format_help()


def test_every_command_module_registers_the_command_named_for_it() -> None:
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(subparsers.choices) == list(COMMANDS)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        ([], None),
        (["--help"], None),
        (["--version"], None),
        (["call", "--help"], "call"),
        (["--help", "audit", "tail"], "audit"),
        (["no-such-command", "--help"], "no-such-command"),
    ],
)
def test_the_command_a_command_line_names(argv: list[str], command: str | None) -> None:
    assert command_in(argv) == command


def test_an_unknown_command_is_refused_naming_every_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["no-such-command"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err
    for name in COMMANDS:
        assert name in err
