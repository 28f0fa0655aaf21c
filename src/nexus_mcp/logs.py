"""Operational logging: structlog JSON lines on stderr, never stdout (stdout is stdio's channel).

Records from the standard library (FastMCP, uvicorn, httpx) are rendered through the same
JSON pipeline. Exception tracebacks are reduced to the exception type: exception text can
hold note bodies, paths or secrets, and operators get the correlation id instead.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_FOREIGN_LOGGERS = ("fastmcp", "mcp", "uvicorn", "uvicorn.error", "uvicorn.access", "httpx")


def _drop_exception_text(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    exc_info = event_dict.pop("exc_info", None)
    event_dict.pop("exception", None)
    if exc_info:
        if exc_info is True:
            exc_info = sys.exc_info()
        if isinstance(exc_info, BaseException):
            event_dict["exc_type"] = type(exc_info).__name__
        elif isinstance(exc_info, tuple) and exc_info[0] is not None:
            event_dict["exc_type"] = exc_info[0].__name__
    return event_dict


_SHARED_PROCESSORS: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    _drop_exception_text,
]


def configure_logging(level: str = "INFO") -> None:
    """Route structlog and stdlib logging to JSON on stderr. Safe to call more than once."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED_PROCESSORS,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for existing in root.handlers[:]:
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(numeric)
    # FastMCP installs its own (rich) handler on "fastmcp" and stops propagation; undo that
    # so every line is JSON on stderr.
    for name in _FOREIGN_LOGGERS:
        foreign = logging.getLogger(name)
        for existing in foreign.handlers[:]:
            foreign.removeHandler(existing)
        foreign.propagate = True
    logging.getLogger("uvicorn.access").setLevel(max(numeric, logging.WARNING))
    structlog.configure(
        processors=[
            *_SHARED_PROCESSORS,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


def ensure_logging() -> None:
    """Send structlog to stderr as JSON when nobody configured it (library and test use).

    structlog's default prints to stdout, which on stdio is the protocol channel.
    """
    if structlog.is_configured():
        return
    structlog.configure(
        processors=json_processors(),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def json_processors() -> list[Any]:
    """The JSON pipeline for structlog on its own (no stdlib logger behind it)."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _drop_exception_text,
        structlog.processors.JSONRenderer(sort_keys=True),
    ]


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)


__all__ = ["configure_logging", "ensure_logging", "get_logger"]
