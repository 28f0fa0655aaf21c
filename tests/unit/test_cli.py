"""The command line: every subcommand documents its options; bad settings stop cleanly."""

from __future__ import annotations

import pytest

from nexus_mcp.cli import build_parser, main
from nexus_mcp.commands.serve import SERVE_OPTIONS
from tests.support.logging_state import isolated_logging


def help_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    out = help_text(capsys)
    for command in ("serve", "registry", "profiles", "approvals", "audit"):
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
