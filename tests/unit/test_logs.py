"""configure_logging: whatever logger emits a record, no content reaches stderr.

Each test runs the real ``configure_logging`` on the real stderr (captured by pytest) and
restores every process-wide setting it changes afterwards (handlers, levels, the record
factory, ``lastResort``, the warnings and exception hooks, structlog's configuration).
"""

from __future__ import annotations

import gc
import json
import logging
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

from nexus_mcp.observability import logs
from nexus_mcp.observability.logs import (
    LIBRARY_EVENT,
    UNCAUGHT_EVENT,
    configure_logging,
    enforce_one_handler,
)
from tests.support.logging_state import isolated_logging

CANARY = "CANARY-LOG-7f3e"
# Loggers that exist in the server process, their children, and names nobody has used yet.
FOREIGN_LOGGERS = [
    "sse_starlette.sse",
    "httpcore.http11",
    "httpcore.connection",
    "httpx",
    "httpx2._client",
    "httpcore2.http11",
    "uvicorn.error",
    "uvicorn.access",
    "fastmcp.server.server",
    "mcp.server.streamable_http",
    "mcp.server.lowlevel.server.brand_new_child",
    "starlette.middleware",
    "anyio",
    "asyncio",
    "pydantic",
    "some.new.lib",
    "py.warnings",
]
# Ways a library puts content into a record.
EMITTERS: dict[str, Callable[[logging.Logger], None]] = {
    "msg": lambda lg: lg.debug(f"chunk: {CANARY}"),
    "args": lambda lg: lg.debug("chunk: %s", CANARY),
    "mapping-args": lambda lg: lg.debug("%(body)s", {"body": CANARY}),
    "object-msg": lambda lg: lg.debug(ValueError(CANARY)),
    "bad-args": lambda lg: lg.debug("%d %d", CANARY),
    "extra": lambda lg: lg.debug("event", extra={"headers": {"authorization": CANARY}}),
    "stack": lambda lg: lg.debug(CANARY, stack_info=True),
    "exc-info": lambda lg: _log_exception(lg),
    "error-level": lambda lg: lg.error("failed on %s", CANARY),
}


def _log_exception(logger: logging.Logger) -> None:
    try:
        raise PermissionError(f"/home/{CANARY}/notes.md")
    except PermissionError:
        logger.exception("request failed: %s", CANARY)


@pytest.fixture
def configured() -> Iterator[Callable[[str], None]]:
    with isolated_logging():
        yield configure_logging


def lines(text: str) -> list[dict[str, Any]]:
    parsed: list[dict[str, Any]] = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    return parsed


def captured(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == ""  # stdout is the stdio protocol channel
    return err


@pytest.mark.parametrize("emit", list(EMITTERS), ids=list(EMITTERS))
@pytest.mark.parametrize("name", FOREIGN_LOGGERS)
def test_a_record_from_any_library_logger_at_debug_shows_only_that_it_happened(
    configured: Callable[[str], None],
    capsys: pytest.CaptureFixture[str],
    name: str,
    emit: str,
) -> None:
    configured("DEBUG")
    logger = logging.getLogger(name)
    logger.setLevel(logging.NOTSET)  # uvicorn.access is capped at WARNING on purpose
    # The canister backend filters httpx's request lines (they name the note) once any test
    # built one; here every record must come through, reduced (restored afterwards).
    logger.filters.clear()
    EMITTERS[emit](logger)
    err = captured(capsys)
    assert CANARY not in err
    (line,) = lines(err)
    expected_level = "error" if emit in ("exc-info", "error-level") else "debug"
    shape = {"event": LIBRARY_EVENT, "logger": name, "level": expected_level}
    if emit == "exc-info":
        shape["exc_type"] = "PermissionError"
    assert {k: v for k, v in line.items() if k != "timestamp"} == shape


@pytest.mark.parametrize("emit", list(EMITTERS), ids=list(EMITTERS))
def test_a_stdlib_call_in_our_own_namespace_is_reduced_too(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str], emit: str
) -> None:
    # Only structlog key-value events are ours; a plain stdlib message could hold anything.
    configured("DEBUG")
    EMITTERS[emit](logging.getLogger("nexus_mcp.tools.files"))
    err = captured(capsys)
    assert CANARY not in err
    assert [line["event"] for line in lines(err)] == [LIBRARY_EVENT]


def test_a_logger_that_does_not_propagate_and_has_no_handler_reaches_the_json_handler(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    configured("DEBUG")
    logger = logging.getLogger("isolated.lib.created.later")
    logger.propagate = False  # Python falls back to logging.lastResort
    logger.warning("token=%s", CANARY)
    err = captured(capsys)
    assert CANARY not in err
    assert [(ln["event"], ln["logger"]) for ln in lines(err)] == [
        (LIBRARY_EVENT, "isolated.lib.created.later")
    ]


@pytest.mark.parametrize(
    "fmt",
    ["%(message)s", "%(msg)s %(args)s", "%(message)s %(exc_text)s %(stack_info)s"],
)
def test_a_handler_a_library_adds_after_configuration_never_holds_content(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    configured("DEBUG")
    logger = logging.getLogger("late.lib")
    own = logging.StreamHandler(sys.stderr)
    own.setFormatter(logging.Formatter(fmt))
    logger.addHandler(own)
    logger.propagate = False
    for emit in EMITTERS.values():
        emit(logger)
    assert CANARY not in captured(capsys)


def test_fastmcps_own_rich_handler_is_content_free_and_then_removed(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    from fastmcp.utilities.logging import configure_logging as fastmcp_configure_logging

    configured("DEBUG")
    fastmcp_configure_logging(level="DEBUG")  # what FastMCP does at import and per run
    fastmcp_logger = logging.getLogger("fastmcp.server.context")
    fastmcp_logger.debug("tool result: %s", CANARY)
    _log_exception(fastmcp_logger)
    assert CANARY not in captured(capsys)
    enforce_one_handler()
    fastmcp_logger.info("tool result: %s", CANARY)
    err = captured(capsys)
    assert CANARY not in err
    assert [(ln["event"], ln["logger"]) for ln in lines(err)] == [
        (LIBRARY_EVENT, "fastmcp.server.context")
    ]
    assert logging.getLogger("fastmcp").handlers == []
    assert logging.getLogger("fastmcp").propagate is True


def test_handlers_installed_before_configuration_are_removed_and_propagation_restored(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    early = logging.getLogger("early.lib")
    early.addHandler(logging.StreamHandler(sys.stderr))
    early.propagate = False
    early.setLevel(logging.ERROR)
    configured("DEBUG")
    assert (early.handlers, early.propagate, early.level) == ([], True, logging.NOTSET)
    early.debug("body %s", CANARY)
    err = captured(capsys)
    assert CANARY not in err
    assert [ln["logger"] for ln in lines(err)] == ["early.lib"]


def test_a_record_built_without_the_factory_is_reduced_by_the_formatter(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    # logging.makeLogRecord, or a Logger subclass with its own makeRecord, bypasses the
    # record factory; the one handler's formatter applies the same allowlist.
    configured("DEBUG")
    try:
        raise RuntimeError(CANARY)
    except RuntimeError:
        exc_info = sys.exc_info()
    record = logging.makeLogRecord(
        {"name": "bypass.lib", "levelno": logging.INFO, "levelname": "INFO",
         "msg": "body %s", "args": (CANARY,), "exc_info": exc_info, "stack_info": CANARY,
         "secret_extra": CANARY}
    )  # fmt: skip
    logging.getLogger().handle(record)
    own_looking = logging.makeLogRecord(
        {"name": "nexus_mcp.fake", "levelno": logging.INFO, "levelname": "INFO",
         "msg": {"event": "x", "body": CANARY}}
    )  # fmt: skip
    logging.getLogger().handle(own_looking)  # a dict, but not from structlog
    err = captured(capsys)
    assert CANARY not in err
    assert [{k: v for k, v in ln.items() if k != "timestamp"} for ln in lines(err)] == [
        {
            "event": LIBRARY_EVENT,
            "logger": "bypass.lib",
            "level": "info",
            "exc_type": "RuntimeError",
        },
        {"event": LIBRARY_EVENT, "logger": "nexus_mcp.fake", "level": "info"},
    ]


def test_a_structlog_event_from_another_package_is_reduced(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    configured("DEBUG")
    structlog.get_logger("other.package").info("request", body=CANARY, headers={"x": CANARY})
    err = captured(capsys)
    assert CANARY not in err
    assert [(ln["event"], ln["logger"]) for ln in lines(err)] == [(LIBRARY_EVENT, "other.package")]


def test_our_own_events_keep_their_fields_and_reduce_exceptions_to_their_type(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    configured("DEBUG")
    log = logs.get_logger("nexus_mcp.tools.notes")
    log.debug("notes_tool", outcome="ok", section_count=3)
    try:
        raise OSError(f"/srv/{CANARY}")
    except OSError:
        log.exception("tool_call_internal_error", ref="r1")
    err = captured(capsys)
    assert CANARY not in err
    first, second = lines(err)
    assert {k: v for k, v in first.items() if k != "timestamp"} == {
        "event": "notes_tool",
        "level": "debug",
        "logger": "nexus_mcp.tools.notes",
        "outcome": "ok",
        "section_count": 3,
    }
    assert {k: v for k, v in second.items() if k != "timestamp"} == {
        "event": "tool_call_internal_error",
        "level": "error",
        "logger": "nexus_mcp.tools.notes",
        "ref": "r1",
        "exc_type": "OSError",
    }


@pytest.mark.parametrize("level", ["INFO", "WARNING", "ERROR"])
def test_the_configured_level_applies_to_library_records(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str], level: str
) -> None:
    configured(level)
    logger = logging.getLogger("some.new.lib")
    for method in (logger.debug, logger.info, logger.warning, logger.error):
        method("x %s", CANARY)
    err = captured(capsys)
    assert CANARY not in err
    # Below WARNING a library record says nothing but that it happened: only DEBUG keeps it.
    threshold = max(logging.getLevelName(level), logging.WARNING)
    expected = [
        name.lower()
        for name in ("DEBUG", "INFO", "WARNING", "ERROR")
        if logging.getLevelName(name) >= threshold
    ]
    assert [ln["level"] for ln in lines(err)] == expected


def test_at_info_our_own_info_events_stay_and_library_info_lines_go(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    configured("INFO")
    logging.getLogger("uvicorn.error").info("Started server process [%d]", 42)
    logging.getLogger("nexus_mcp.tools.files").info("a stdlib line of ours: %s", CANARY)
    logs.get_logger("nexus_mcp.transport.serve").info("server_started", address="stdio")
    assert [(ln["event"], ln["level"]) for ln in lines(captured(capsys))] == [
        ("server_started", "info")
    ]


def test_python_warnings_are_logged_without_their_text(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    configured("INFO")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn(
            f"serialized value may not be as expected [input_value={CANARY}]", stacklevel=1
        )
    err = captured(capsys)
    assert CANARY not in err
    assert [(ln["event"], ln["logger"]) for ln in lines(err)] == [(LIBRARY_EVENT, "py.warnings")]


def test_uncaught_exceptions_are_logged_by_type_only(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    configured("INFO")
    try:
        raise FileNotFoundError(f"/vault/{CANARY}.md")
    except FileNotFoundError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)

    def crash() -> None:
        raise KeyError(CANARY)

    thread = threading.Thread(target=crash)
    thread.start()
    thread.join()

    class Leaky:
        def __repr__(self) -> str:
            return CANARY

        def __del__(self) -> None:
            raise ValueError(CANARY)

    leaky: Leaky | None = Leaky()
    del leaky
    gc.collect()
    err = captured(capsys)
    assert CANARY not in err
    assert [(ln["event"], ln["where"], ln["exc_type"]) for ln in lines(err)] == [
        (UNCAUGHT_EVENT, "main", "FileNotFoundError"),
        (UNCAUGHT_EVENT, "thread", "KeyError"),
        (UNCAUGHT_EVENT, "unraisable", "ValueError"),
    ]


def test_configuring_twice_keeps_one_handler_and_one_factory(
    configured: Callable[[str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    configured("INFO")
    configured("DEBUG")
    factory = logging.getLogRecordFactory()
    assert isinstance(factory, logs.ContentFreeRecordFactory)
    assert not isinstance(factory.base, logs.ContentFreeRecordFactory)
    assert len(logging.getLogger().handlers) == 1
    logging.getLogger("httpcore.http11").debug("headers %s", CANARY)
    err = captured(capsys)
    assert CANARY not in err
    assert len(lines(err)) == 1
