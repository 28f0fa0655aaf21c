"""Run ``configure_logging`` inside a test process and put everything back afterwards.

``configure_logging`` configures the whole process (it is what ``nexus-mcp serve`` calls
first): the root handler, every logger's handlers, levels and propagation, the LogRecord
factory, ``logging.lastResort`` and ``raiseExceptions``, warnings capture, the uncaught
exception hooks and structlog. Left in place, it would reduce the records later tests
inspect with ``caplog`` and replace the hooks through which pytest reports unraisable
exceptions and exceptions in threads.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog

from nexus_mcp.observability import logs


@contextmanager
def isolated_logging() -> Iterator[None]:
    loggers = {
        name: (lg.handlers[:], lg.filters[:], lg.propagate, lg.level, lg.disabled)
        for name, lg in logging.Logger.manager.loggerDict.items()
        if isinstance(lg, logging.Logger)
    }
    root = logging.getLogger()
    root_state = (root.handlers[:], root.level)
    factory = logging.getLogRecordFactory()
    last_resort, raise_exceptions = logging.lastResort, logging.raiseExceptions
    hooks = (sys.excepthook, threading.excepthook, sys.unraisablehook)
    structlog_config: dict[str, Any] = structlog.get_config()
    handler = logs._handler
    try:
        yield
    finally:
        logging.captureWarnings(False)
        for name, lg in logging.Logger.manager.loggerDict.items():
            if not isinstance(lg, logging.Logger):
                continue
            handlers, filters, propagate, level, disabled = loggers.get(
                name, ([], [], True, logging.NOTSET, False)
            )
            lg.handlers[:], lg.filters[:] = handlers, filters
            lg.propagate, lg.disabled = propagate, disabled
            lg.setLevel(level)  # also clears the loggers' cached levels
        root.handlers[:] = root_state[0]
        root.setLevel(root_state[1])
        logging.setLogRecordFactory(factory)
        logging.lastResort, logging.raiseExceptions = last_resort, raise_exceptions
        sys.excepthook, threading.excepthook, sys.unraisablehook = hooks
        structlog.configure(**structlog_config)
        logs._handler = handler


__all__ = ["isolated_logging"]
