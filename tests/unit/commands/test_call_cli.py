"""``nexus-mcp call`` in process: how arguments are read and results printed, and every usage
error stopping before any server is contacted (the calls themselves: tests/e2e/test_call.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nexus_mcp.cli import main
from nexus_mcp.commands.call import (
    REPLAY_NOTE,
    UsageError,
    build_arguments,
    is_replay,
    result_to_output,
)
from nexus_mcp.middleware.classification import META_REPLAYED

CANARY = "CANARY-7c1e"
UNREACHABLE = "http://127.0.0.1:9/mcp"  # the discard port: never an MCP server


@pytest.fixture(autouse=True)
def nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXUS_MCP_URL", UNREACHABLE)
    monkeypatch.delenv("NEXUS_MCP_TOKEN", raising=False)


def test_pairs_are_strings_and_json_pairs_are_json_values() -> None:
    arguments = build_arguments(
        None,
        ["path=notes/a.md", "count:=3", "flags:=[1, true, null]", "text=a=b", "empty=", 'j:="7"'],
    )

    assert arguments == {
        "path": "notes/a.md",
        "count": 3,
        "flags": [1, True, None],
        "text": "a=b",
        "empty": "",
        "j": "7",
    }


def test_pairs_are_added_to_the_args_object() -> None:
    assert build_arguments('{"path": "a", "n": 1}', ["content=x"]) == {
        "path": "a",
        "n": 1,
        "content": "x",
    }


def test_args_can_come_from_a_file(tmp_path: Path) -> None:
    args_file = tmp_path / "args.json"
    args_file.write_text('{"path": "from-file"}', encoding="utf-8")

    assert build_arguments(f"@{args_file}", []) == {"path": "from-file"}


@pytest.mark.parametrize(
    ("args_json", "pairs"),
    [
        (None, ["path=a", "path=b"]),
        (None, ["path=a", "path:=1"]),
        ('{"path": "a"}', ["path=b"]),
        (None, ["path"]),
        (None, ["=x"]),
        (None, [":=1"]),
        (None, [f"n:={CANARY}"]),
        (None, ["n:="]),
        (f'{{"a": "{CANARY}"', []),
        ("[1, 2]", []),
        ('"text"', []),
        ("@/nonexistent/args.json", []),
    ],
)
def test_ambiguous_or_malformed_arguments_are_refused_without_echoing_them(
    args_json: str | None, pairs: list[str]
) -> None:
    with pytest.raises(UsageError) as refused:
        build_arguments(args_json, pairs)

    assert CANARY not in str(refused.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["nexus_read_file", f"n:={CANARY}"],
        ["nexus_read_file", "path=a", "path=b"],
        ["nexus_read_file", "--args", f"{CANARY}{{"],
        ["nexus_read_file", "--meta", f"{CANARY}{{"],
        ["nexus_read_file", "--meta", "[1]"],
        ["nexus_read_file", "--timeout", "0"],
        ["nexus_read_file", "--timeout", "-5"],
        ["--url", "file:///etc/passwd", "nexus_read_file"],
        ["--url", f"{CANARY}", "nexus_read_file"],
        ["--url", "http://", "nexus_read_file"],
    ],
)
def test_a_usage_error_is_one_line_and_exit_2_before_any_connection(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert main(["call", *argv]) == 2

    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert CANARY not in err
    assert "cannot connect" not in err  # it never got that far


@pytest.mark.parametrize(
    "argv",
    [
        ["call", "nexus_read_file", "path=a", "--bogus"],
        ["call", "nexus_read_file", "path=a", "--full", "-x"],
        ["profiles", "list", "extra"],
        ["audit", "tail", "a=b"],
    ],
)
def test_trailing_words_are_only_accepted_as_arguments_of_call(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)

    assert exited.value.code == 2


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


@pytest.mark.parametrize(
    ("result", "printed"),
    [
        (
            {"content": [text('{"a":1}')], "structuredContent": {"a": 1}, "isError": False},
            {"a": 1},
        ),
        ({"content": [text('{"a":1}')], "isError": False}, {"a": 1}),
        ({"content": [text("plain words")], "isError": False}, "plain words"),
        ({"content": [text("1"), text("two")], "isError": False}, [1, "two"]),
        ({"content": [], "isError": False}, []),
        (
            {"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}]},
            {"type": "image", "data": "AA==", "mimeType": "image/png"},
        ),
        (
            {"content": [text('{"error":"path is not allowed","code":"INVALID_PATH"}')],
             "isError": True},
            {"error": "path is not allowed", "code": "INVALID_PATH"},
        ),
        ({"content": [text("Unknown tool: 'x'")], "isError": True}, {"error": "Unknown tool: 'x'"}),
        ({"content": [], "isError": True}, {"error": None}),
    ],
)  # fmt: skip
def test_what_is_printed_for_each_kind_of_result(result: dict[str, Any], printed: Any) -> None:
    assert result_to_output(result, full=False) == printed
    assert result_to_output(result, full=True) == result


def test_a_replay_is_recognised_by_its_meta_marker() -> None:
    assert is_replay({"_meta": {META_REPLAYED: True}})
    assert not is_replay({"_meta": {META_REPLAYED: "yes"}})
    assert not is_replay({"_meta": {}})
    assert not is_replay({})
    assert "idempotent replay" in REPLAY_NOTE
