"""The command line: every subcommand documents its options; bad settings stop cleanly."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nexus_mcp.cli import build_parser, main
from nexus_mcp.settings import SERVE_OPTIONS
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
