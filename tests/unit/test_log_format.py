"""``log_format``: the same events as text lines for a terminal, or JSON lines.

Real ``configure_logging`` on the real (captured) stderr, restored afterwards. Text lines
must stay one line an event whatever a value holds: a newline, a carriage return, an ANSI
escape or a bidirectional override in a value could otherwise forge or hide a line.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

from nexus_mcp.observability import logs
from nexus_mcp.observability.logs import configure_logging, resolve_log_format
from tests.support.logging_state import isolated_logging

TEXT_LINE = re.compile(r"^\d\d:\d\d:\d\d (INFO |WARN |ERROR|DEBUG|CRIT ) \S")


@pytest.fixture
def isolated() -> Iterator[None]:
    with isolated_logging():
        yield


def err_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    out, err = capsys.readouterr()
    assert out == ""  # stdout is the stdio protocol channel
    return err.splitlines()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Closed(io.StringIO):
    def isatty(self) -> bool:
        raise ValueError("I/O operation on closed file")


@pytest.mark.parametrize(
    ("setting", "stream", "expected"),
    [
        ("auto", _Tty(), "text"),
        ("auto", io.StringIO(), "json"),
        ("auto", _Closed(), "json"),
        ("auto", object(), "json"),
        ("text", io.StringIO(), "text"),
        ("json", _Tty(), "json"),
    ],
)
def test_auto_is_text_on_a_terminal_and_json_otherwise(
    setting: str, stream: Any, expected: str
) -> None:
    assert resolve_log_format(setting, stream) == expected


def test_text_lines_read_as_time_level_event_message_and_sorted_fields(
    isolated: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", "text")
    log = logs.get_logger("nexus_mcp.transport.serve")
    log.info("server_started", address="http://127.0.0.1:8765/mcp", mode="dev", transport="http")
    log.warning("write_policy", message="no write policy configured: dev mode")
    log.info("counts", tools=19, registry={"nexus": {"digest": "ab"}}, ok=True, none=None)
    started, policy, counts = err_lines(capsys)
    assert TEXT_LINE.match(started)
    assert started[9:] == (
        "INFO  server_started address=http://127.0.0.1:8765/mcp mode=dev transport=http"
    )
    assert policy[9:] == "WARN  write_policy no write policy configured: dev mode"
    assert counts[9:] == (
        'INFO  counts none=null ok=true registry={"nexus":{"digest":"ab"}} tools=19'
    )


def test_library_lines_in_text_name_their_logger_and_nothing_else(
    isolated: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", "text")
    logging.getLogger("uvicorn.error").warning("Invalid HTTP request: %s", "SECRET-BODY")
    (line,) = err_lines(capsys)
    assert line[9:] == "WARN  library_log logger=uvicorn.error"


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("a line\nforged", '"a line\\nforged"'),
        ("looks like admin=true", '"looks like admin=true"'),
        ("caf\u00e9 \u202e", '"caf\\u00e9 \\u202e"'),
        ("  ", '"  "'),
    ],
)
def test_a_message_that_could_pass_for_a_field_or_a_line_is_quoted(
    isolated: None, capsys: pytest.CaptureFixture[str], message: str, shown: str
) -> None:
    configure_logging("INFO", "text")
    logs.get_logger("nexus_mcp.x").warning("event", message=message)
    (line,) = err_lines(capsys)
    assert line[9:] == f"WARN  event {shown}"


@pytest.mark.parametrize(
    "hostile",
    [
        "a\nINFO  forged_line admin=true",
        "a\rWARN overwrite",
        "\x1b[2J\x1b[31mred",
        "safe\u202etxt.exe",
        "x" * 5000,
        'quote" key=value',
        "",
    ],
)
def test_a_hostile_value_cannot_forge_or_hide_a_text_line(
    isolated: None, capsys: pytest.CaptureFixture[str], hostile: str
) -> None:
    configure_logging("INFO", "text")
    logs.get_logger("nexus_mcp.tools.files").info("event", subject=hostile, **{"k ey=": hostile})
    (line,) = err_lines(capsys)
    assert TEXT_LINE.match(line)
    assert line.isascii() and line.isprintable()
    # Each value comes back whole from its JSON quoting.
    quoted = re.findall(r'"(?:[^"\\]|\\.)*"', line)
    assert hostile in [json.loads(q) for q in quoted]


def test_json_is_unchanged_by_the_format_setting(
    isolated: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", "json")
    logs.get_logger("nexus_mcp.transport.serve").info("server_stopped", reason="SIGTERM")
    (line,) = err_lines(capsys)
    parsed = json.loads(line)
    assert {k: v for k, v in parsed.items() if k != "timestamp"} == {
        "event": "server_stopped",
        "level": "info",
        "logger": "nexus_mcp.transport.serve",
        "reason": "SIGTERM",
    }


def test_debug_keeps_library_lines_in_text_too(
    isolated: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("DEBUG", "text")
    logging.getLogger("httpcore.http11").debug("send_request_headers %s", "Authorization: x")
    (line,) = err_lines(capsys)
    assert line[9:] == "DEBUG library_log logger=httpcore.http11"


def test_a_library_level_name_cannot_forge_a_text_line(
    isolated: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # A level name is a library's to choose (logging.addLevelName): printed raw, its
    # newline and escapes made a second line that read as the server's own.
    level = 37
    logging.addLevelName(level, "NOTE\n12:00:00 ERROR server_stopped \x1b[2J")
    try:
        configure_logging("INFO", "text")
        logging.getLogger("some.library").log(level, "hello")
        (line,) = err_lines(capsys)
    finally:
        logging.addLevelName(level, f"Level {level}")
    assert "server_stopped" not in line.split('"')[0]
    assert line.isascii() and line.isprintable()
