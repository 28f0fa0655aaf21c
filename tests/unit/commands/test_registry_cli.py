"""``nexus-mcp registry validate|digest|show`` through the parser the CLI assembles."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest

from nexus_mcp.commands.registry import add_parser

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "schemas" / "mcp" / "registries" / "nexus.json"
INVALID = REPO / "schemas" / "mcp" / "examples" / "invalid" / "tool_registry"


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="nexus-mcp")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    code: int = args.func(args)
    return code


def test_validate_accepts_the_shipped_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("registry", "validate", str(SHIPPED)) == 0
    digest = hashlib.sha256(SHIPPED.read_bytes()).hexdigest()
    assert capsys.readouterr().out == f"OK {SHIPPED} sha256={digest}\n"


def test_validate_prints_every_error_of_every_file_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = json.loads(SHIPPED.read_text(encoding="utf-8"))
    broken["tools"][0]["tool_class"] = "admin"
    broken["tools"][1]["is_document_op"] = "no"
    broken_path = tmp_path / "broken.json"
    broken_path.write_text(json.dumps(broken), encoding="utf-8")
    not_json = tmp_path / "not.json"
    not_json.write_text("{", encoding="utf-8")

    assert run("registry", "validate", str(SHIPPED), str(broken_path), str(not_json)) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"OK {SHIPPED}")
    assert lines[1] == f"INVALID {broken_path} (2 errors)"
    assert lines[2].startswith("  $.tools[0].tool_class: ")
    assert lines[3].startswith("  $.tools[1].is_document_op: ")
    assert lines[4].startswith(f"INVALID registry {not_json}: not JSON")


def test_validate_reports_duplicate_tool_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = json.loads(SHIPPED.read_text(encoding="utf-8"))
    document["tools"].append(dict(document["tools"][0]))
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    assert run("registry", "validate", str(path)) == 1
    assert "duplicate tool name 'nexus_read_file'" in capsys.readouterr().out


def test_digest_prints_the_sha256_of_the_file_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("registry", "digest", str(SHIPPED)) == 0
    assert capsys.readouterr().out == hashlib.sha256(SHIPPED.read_bytes()).hexdigest() + "\n"


def test_digest_of_a_missing_file_fails_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("registry", "digest", str(tmp_path / "absent.json")) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "absent.json" in captured.err


def test_show_prints_one_row_per_tool_with_its_limits(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("registry", "show") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "server",
        "tool",
        "class",
        "document",
        "op",
        "encoding",
        "max",
        "read",
        "max",
        "write",
        "max",
        "batch",
    ]
    rows = {line.split()[1]: line.split() for line in lines[2:]}
    assert len(rows) == len(json.loads(SHIPPED.read_text(encoding="utf-8"))["tools"])
    assert rows["nexus_write_file"] == [
        "nexus",
        "nexus_write_file",
        "write",
        "yes",
        "utf8",
        "10485760",
        "5242880",
        "52428800",
    ]
    assert rows["nexus_glob"] == ["nexus", "nexus_glob", "read", "no", "-", "-", "-", "-"]


def test_show_with_an_invalid_registry_dir_fails_listing_the_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.json").write_bytes((INVALID / "tool_class_admin.json").read_bytes())
    assert run("registry", "show", "--registry-dir", str(tmp_path)) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "$.tools[2].tool_class" in captured.err


def test_registry_without_a_subcommand_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as caught:
        run("registry")
    assert caught.value.code == 2
