"""Operational logging on stderr (never stdout, stdio's channel), never content.

Two renderings of the same events (``log_format``): ``json``, one object a line, for
collectors; ``text``, one readable line an event for a terminal (``10:04:05 INFO
server_started address=http://127.0.0.1:8765/mcp mode=dev``). ``auto`` (the default)
is text when stderr is a terminal, else JSON. Library records below WARNING say
nothing but that a library did something, so they are dropped unless the level is DEBUG.

The guarantee: at every level, DEBUG included, no log line carries tool arguments, tool
results, file or note content, paths, HTTP headers, tokens or exception text, whichever
library emits it. Libraries log strings built from what they handle (``sse_starlette``
logs every response chunk it sends, ``httpcore`` the headers of every request and
response, ``mcp`` the session id), and a filter keyed by logger name misses their child
loggers and every logger created later. So the rule is by origin, not by name:

- Our own events keep their fields: structlog key-value events from the ``nexus_mcp``
  namespace, written for operators (ids, codes, counts, digests, tool names), with
  exception text reduced to the exception type (operators get the correlation id).
- Every other record (any stdlib logger of any library, a stdlib call in our own
  namespace, a structlog event from another package, Python warnings, uncaught
  exceptions) is reduced to a fixed shape: ``{"event": "library_log", "logger",
  "level", "timestamp"}`` plus ``exc_type`` when it carried an exception. Message,
  arguments, extras, exception and stack are dropped, so DEBUG still shows *that* a
  library did something, never *what* it handled.

How the reduction reaches every record, including loggers that have their own handlers,
``propagate=False`` or do not exist yet:

1. At creation. ``configure_logging`` installs a LogRecord factory, through which every
   stdlib ``Logger`` builds its records: a foreign record is born without its message,
   arguments, exception or stack, so no handler anywhere (FastMCP's rich handler, one
   from a uvicorn ``log_config``, ``logging.lastResort``) can print them.
   ``logging.raiseExceptions`` is off because ``Handler.handleError`` prints a failing
   record's message and arguments.
2. At rendering. The one handler's formatter rebuilds every foreign event from the same
   allowlist, for records that bypass the factory (``logging.makeLogRecord``, a
   ``Logger`` subclass with its own ``makeRecord``).
3. One handler. Every other logger's handlers are removed and propagation restored, at
   ``configure_logging`` and again by ``enforce_one_handler`` right before the transport
   serves (after FastMCP and uvicorn set up their loggers); ``logging.lastResort`` is the
   same handler. Every stderr line from logging is then one JSON object.
4. Outside logging. Python warnings are captured into logging (pydantic's serialization
   warnings quote the input value), and uncaught exceptions (main thread, other threads,
   "exception ignored") are logged as ``uncaught_exception`` with their type instead of
   Python's traceback print, which ends with the exception text.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from collections.abc import Callable, MutableMapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TextIO, cast

import structlog

OWN_NAMESPACE = "nexus_mcp"
# The event of every record that is not one of our own structlog events.
LIBRARY_EVENT = "library_log"
UNCAUGHT_EVENT = "uncaught_exception"
# Set by the record factory on a reduced record that carried an exception.
_EXC_TYPE_ATTR = "_nexus_exc_type"
_RECORD_META_KEYS = ("_record", "_from_structlog")

EventDict = MutableMapping[str, Any]


def is_own_logger(name: str) -> bool:
    return name == OWN_NAMESPACE or name.startswith(OWN_NAMESPACE + ".")


def _exc_type_name(exc_info: Any) -> str | None:
    if exc_info is True:
        exc_info = sys.exc_info()
    if isinstance(exc_info, BaseException):
        return type(exc_info).__name__
    if isinstance(exc_info, tuple) and exc_info and isinstance(exc_info[0], type):
        return exc_info[0].__name__
    return None


def _drop_exception_text(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
    exc_info = event_dict.pop("exc_info", None)
    event_dict.pop("exception", None)
    event_dict.pop("stack_info", None)
    if exc_info and (name := _exc_type_name(exc_info)) is not None:
        event_dict["exc_type"] = name
    return event_dict


class ContentFreeRecordFactory:
    """Builds every stdlib record; a record that is not one of our own structlog events
    is built already reduced (fixed message, no arguments, exception or stack)."""

    def __init__(self, base: Callable[..., logging.LogRecord]) -> None:
        self.base = base

    def __call__(
        self,
        name: str,
        level: int,
        fn: str,
        lno: int,
        msg: Any,
        args: Any,
        exc_info: Any,
        func: str | None = None,
        sinfo: str | None = None,
        **kwargs: Any,
    ) -> logging.LogRecord:
        if isinstance(msg, dict) and is_own_logger(name):
            return self.base(name, level, fn, lno, msg, args, exc_info, func, sinfo, **kwargs)
        # A structlog event keeps the dict type ProcessorFormatter expects of it.
        reduced = {"event": LIBRARY_EVENT} if isinstance(msg, dict) else LIBRARY_EVENT
        record = self.base(name, level, fn, lno, reduced, (), None, func, None, **kwargs)
        exc_type = _exc_type_name(exc_info)
        if exc_type is not None:
            setattr(record, _EXC_TYPE_ATTR, exc_type)
        return record


def _timestamp(created: float) -> str:
    # The same form as structlog's TimeStamper(fmt="iso", utc=True).
    return datetime.fromtimestamp(created, tz=UTC).isoformat().replace("+00:00", "Z")


def _reduce_foreign(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
    """Keep our own structlog events; rebuild everything else from the allowlist."""
    record = event_dict.get("_record")
    if not isinstance(record, logging.LogRecord):
        record = None  # never inside ProcessorFormatter; then nothing but the event is kept
    if record is not None and event_dict.get("_from_structlog") and is_own_logger(record.name):
        return event_dict
    reduced: dict[str, Any] = {k: event_dict[k] for k in _RECORD_META_KEYS if k in event_dict}
    reduced["event"] = LIBRARY_EVENT
    if record is not None:
        reduced.update(
            logger=record.name,
            level=record.levelname.lower(),
            timestamp=_timestamp(record.created),
        )
        exc_type = getattr(record, _EXC_TYPE_ATTR, None)
        if exc_type is None:
            exc_type = _exc_type_name(event_dict.get("exc_info"))
        if isinstance(exc_type, str):
            reduced["exc_type"] = exc_type
    return reduced


_SHARED_PROCESSORS: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    _drop_exception_text,
]

LOG_FORMATS = ("auto", "text", "json")
# A value printed bare in a text line; anything else is quoted and escaped as JSON.
_BARE_VALUE = re.compile(r"[A-Za-z0-9_.,:/@+\-]{1,200}")
_CLOCK = re.compile(r"\d\d:\d\d:\d\d")
_LEVEL_LABELS = {"warning": "WARN", "critical": "CRIT", "exception": "ERROR"}


def resolve_log_format(log_format: str, stream: Any = None) -> str:
    """``text`` or ``json``: ``auto`` is text when ``stream`` (stderr) is a terminal."""
    if log_format in ("text", "json"):
        return log_format
    stream = sys.stderr if stream is None else stream
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return "json"


def _text_value(value: Any) -> str:
    if isinstance(value, str) and _BARE_VALUE.fullmatch(value):
        return value
    # ensure_ascii: no control character, newline or bidirectional override reaches the
    # terminal as itself, so a value can never forge a line or hide part of one.
    return json.dumps(value, ensure_ascii=True, sort_keys=True, separators=(",", ":"), default=str)


def render_text(_logger: Any, _method: str, event_dict: EventDict) -> str:
    """One line for a terminal: ``HH:MM:SS LEVEL event message key=value ...`` (UTC time,
    keys sorted). The logger name is shown for library records only."""
    fields = dict(event_dict)
    timestamp = str(fields.pop("timestamp", ""))
    clock = timestamp[11:19]
    if not _CLOCK.fullmatch(clock):
        clock = "--:--:--"
    level = str(fields.pop("level", "info"))
    # A library names its own levels (logging.addLevelName): quoted unless plain.
    label = _text_value(_LEVEL_LABELS.get(level, level.upper()))
    event = fields.pop("event", "")
    if event != LIBRARY_EVENT and is_own_logger(str(fields.get("logger", ""))):
        fields.pop("logger", None)
    parts = [clock, f"{label:<5}", _text_value(str(event))]
    message = fields.pop("message", None)
    if isinstance(message, str):
        # Bare when it cannot pass for a field or another line: printable ASCII, no '='.
        plain = message.isascii() and message.isprintable() and "=" not in message
        parts.append(message if plain and message.strip() else _text_value(message))
    elif message is not None:
        fields["message"] = message
    parts.extend(f"{_text_value(str(key))}={_text_value(fields[key])}" for key in sorted(fields))
    return " ".join(parts)


class _QuietLibraries(logging.Filter):
    """Drops library records below WARNING: reduced to their logger's name, they would be
    lines that say nothing (uvicorn's start-up chatter). ``--log-level DEBUG`` keeps them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return isinstance(record.msg, dict) and is_own_logger(record.name)


_handler: logging.Handler | None = None


def configure_logging(level: str = "INFO", log_format: str = "json") -> None:
    """Route every log record of the process to stderr, reduced as the module docstring
    says, as JSON lines or text lines (``log_format``: auto, text or json). Safe to call
    more than once."""
    global _handler
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    renderer: Any = (
        render_text
        if resolve_log_format(log_format) == "text"
        else structlog.processors.JSONRenderer(sort_keys=True)
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        # Foreign records are rebuilt by _reduce_foreign; str(msg), never getMessage(),
        # so a record's arguments are not even formatted.
        foreign_pre_chain=[],
        use_get_message=False,
        processors=[
            _reduce_foreign,
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    if numeric > logging.DEBUG:
        handler.addFilter(_QuietLibraries())
    _handler = handler
    base = logging.getLogRecordFactory()
    if isinstance(base, ContentFreeRecordFactory):
        base = base.base
    logging.setLogRecordFactory(ContentFreeRecordFactory(base))
    logging.raiseExceptions = False
    logging.lastResort = handler
    logging.captureWarnings(True)
    logging.getLogger().setLevel(numeric)
    enforce_one_handler()
    # Access lines name every request; they stay off below WARNING.
    logging.getLogger("uvicorn.access").setLevel(max(numeric, logging.WARNING))
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread
    sys.unraisablehook = _log_unraisable
    structlog.configure(
        processors=[
            *_SHARED_PROCESSORS,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


def enforce_one_handler() -> None:
    """Make the root handler of ``configure_logging`` the only one: remove every other
    logger's handlers and restore propagation. A library that installed handlers of its
    own (FastMCP's rich handler) also set a level of its own; that level is reset so that
    ``--log-level`` decides. No-op before ``configure_logging``."""
    handler = _handler
    if handler is None:
        return
    root = logging.getLogger()
    for existing in root.handlers[:]:
        if existing is not handler:
            root.removeHandler(existing)
    if handler not in root.handlers:
        root.addHandler(handler)
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if not isinstance(logger, logging.Logger):  # a PlaceHolder has no handlers
            continue
        if logger.handlers:
            for existing in logger.handlers[:]:
                logger.removeHandler(existing)
            logger.setLevel(logging.NOTSET)
        logger.propagate = True


def _log_uncaught(
    exc_type: type[BaseException],
    _exc: BaseException | None = None,
    _tb: TracebackType | None = None,
) -> None:
    get_logger(__name__).critical(UNCAUGHT_EVENT, where="main", exc_type=exc_type.__name__)


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:  # threading's default hook ignores it too
        return
    get_logger(__name__).critical(UNCAUGHT_EVENT, where="thread", exc_type=args.exc_type.__name__)


def _log_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    # The default hook prints repr() of the object involved, which can hold content.
    get_logger(__name__).error(
        UNCAUGHT_EVENT, where="unraisable", exc_type=unraisable.exc_type.__name__
    )


def ensure_logging() -> None:
    """Send structlog to stderr as JSON when nobody configured it (library and test use).

    structlog's default prints to stdout, which on stdio is the protocol channel.
    """
    if structlog.is_configured():
        return
    structlog.configure(
        processors=json_processors(),
        # PrintLogger only calls write and flush, which is all _CurrentStderr has.
        logger_factory=structlog.PrintLoggerFactory(cast(TextIO, _CurrentStderr())),
        cache_logger_on_first_use=False,
    )


class _CurrentStderr:
    """Whatever ``sys.stderr`` is when a line is written, not when logging was set up: an
    embedding application (or a test harness) may replace and close the stream it had."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


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


__all__ = [
    "LIBRARY_EVENT",
    "LOG_FORMATS",
    "UNCAUGHT_EVENT",
    "ContentFreeRecordFactory",
    "configure_logging",
    "enforce_one_handler",
    "ensure_logging",
    "get_logger",
    "is_own_logger",
    "render_text",
    "resolve_log_format",
]
