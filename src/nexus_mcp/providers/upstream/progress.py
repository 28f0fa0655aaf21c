"""An upstream's notifications beside its results: progress (relayed to the caller whose
call it is) and log messages (the gateway's own log, at debug).

Progress. When the caller's tools/call carries ``_meta.progressToken``, the upstream call
carries a token of the gateway's own (the SDK's request id on that upstream session, never
the caller's value), and each ``notifications/progress`` for it reaches this call's
``ProgressRelay``, which sends it on to the caller under the caller's own token. The SDK
routes a progress notification by its token to the one request in flight with it: a token
the upstream was never given, or one of a call that has finished, reaches no relay; on a
shared session each caller's call has a token of its own. The relay then keeps to the
spec and to the gateway's terms:

- numbers only by default (``forward.progress: numbers``); with ``messages``, the
  upstream's message escaped (control, bidi and other unprintable characters written as
  their escapes) and cut at ``MAX_MESSAGE_CHARS``. Why not the text by default: every
  other piece of upstream text a caller gets passed the chain (sized, hashed, audited);
  a progress message would not, so it is the operator's choice;
- increasing: a progress that is not above the last one relayed is dropped (the spec
  requires progress to increase with each notification), and so is one that is not a
  finite number;
- at most ``MAX_PER_SECOND`` a second per call (the rest dropped), so an upstream cannot
  flood a caller through the gateway;
- nothing once the call has finished (``close``), nor on a relay that was never opened.

Log messages (``notifications/message``). An upstream must not choose the level of a line
in the gateway's log nor what it says: each is one ``upstream_log`` event at debug (an
upstream that logs a lot cannot fill the operator's log), with the server id, the
upstream's level as a field (one of the spec's eight, else ``other``), its logger name
when that is a plain identifier, and the length and a digest of its text, never the text:
the gateway's log carries no content at any level (``observability/logs.py``), and an
upstream's log text is its content (the paths, arguments and results it handles).
FastMCP's default handler would log "Received ERROR from server: <text>" at the
upstream's level. They are not relayed to callers: an upstream log is not tied to a
call, and on a shared session to no caller at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.definition_diff import safe_line


class Caller(Protocol):
    """What a relay needs of ``relay.Caller`` (not imported: relay.py imports sessions.py,
    which imports this module): the caller's session, its token and its request."""

    @property
    def session(self) -> Any: ...

    @property
    def progress_token(self) -> str | int | None: ...

    @property
    def request_id(self) -> Any: ...


log = get_logger(__name__)

MAX_PER_SECOND = 10
MAX_MESSAGE_CHARS = 200
# A logger name shown as it is: a plain identifier (no path, no space, no escape).
_LOGGER_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
LOG_LEVELS = frozenset(
    {"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"}
)

ProgressMode = Literal["off", "numbers", "messages"]
# A progress message as output scanning lets it leave (redacted), or None (withheld).
MessageScan = Callable[[str], str | None]
# What of a message is scanned: more than is relayed, so a token across the cut is whole.
_SCANNED_CHARS = 4 * MAX_MESSAGE_CHARS


async def ignore_progress(progress: float, total: float | None, message: str | None) -> None:
    """The progress handler of a call whose caller asked for none: nothing is kept, nothing
    logged (FastMCP's default would log the upstream's message)."""
    return None


class ProgressRelay:
    """One upstream call's progress, on its way to the caller (module docstring)."""

    def __init__(
        self,
        caller: Caller,
        server_id: str,
        *,
        messages: bool,
        clock: Callable[[], float] = time.monotonic,
        scan: MessageScan | None = None,
    ) -> None:
        self._caller = caller
        self._server_id = server_id
        self._messages = messages
        # Output scanning of a message's text: what may leave (redacted), None if withheld.
        self._scan = scan
        self._clock = clock
        self._last: float | None = None
        self._sent_at: float | None = None
        # FIFO: notifications accepted in order leave in that order (the SDK runs each
        # upstream notification's handler on a task of its own).
        self._lock = asyncio.Lock()
        self.closed = False
        self.relayed = 0
        self.dropped: Counter[str] = Counter()

    def _refusal(self, progress: float, total: float | None) -> str | None:
        if self.closed:
            return "finished"
        if not math.isfinite(progress) or (total is not None and not math.isfinite(total)):
            return "not_a_number"
        if self._last is not None and progress <= self._last:
            return "not_increasing"
        now = self._clock()
        if self._sent_at is not None and now - self._sent_at < 1.0 / MAX_PER_SECOND:
            return "rate"
        self._sent_at = now
        self._last = progress
        return None

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        reason = self._refusal(progress, total)
        if reason is not None:
            self.dropped[reason] += 1
            return
        text = None
        if self._messages and message:
            # Scanned before it is cut, so a token the cut splits is still found whole.
            # Only its head is ever shown; the rest keeps the length the cut reports.
            head = message[:_SCANNED_CHARS]
            scanned = self._scan(head) if self._scan is not None else head
            if scanned is not None:
                text = safe_line(scanned + message[_SCANNED_CHARS:], MAX_MESSAGE_CHARS)
        async with self._lock:
            if self.closed:  # finished while this one waited its turn
                self.dropped["finished"] += 1
                return
            try:
                await self._caller.session.send_progress_notification(
                    progress_token=self._caller.progress_token,
                    progress=progress,
                    total=total,
                    message=text,
                    related_request_id=self._caller.request_id,
                )
            except Exception:  # noqa: BLE001 - the caller went away: its call ends anyway
                self.dropped["undeliverable"] += 1
                return
            self.relayed += 1

    def close(self) -> None:
        """The call has finished: nothing more reaches the caller."""
        if self.closed:
            return
        self.closed = True
        if self.dropped:
            log.info(
                "upstream_progress_dropped",
                server_id=self._server_id,
                relayed=self.relayed,
                **{f"dropped_{reason}": n for reason, n in sorted(self.dropped.items())},
            )


def progress_relay(
    caller: Caller | None, server_id: str, mode: ProgressMode, scan: MessageScan | None = None
) -> ProgressRelay | None:
    """The relay of one call, when the caller asked for progress and the upstream's
    ``forward.progress`` is not ``off``; ``scan``: output scanning of its messages."""
    if mode == "off" or caller is None or caller.progress_token is None:
        return None
    return ProgressRelay(caller, server_id, messages=mode == "messages", scan=scan)


def upstream_log(server_id: str) -> Callable[[Any], Awaitable[None]]:
    """The log handler of one upstream's sessions (module docstring)."""

    async def handle(message: Any) -> None:
        level = str(getattr(message, "level", ""))
        data = getattr(message, "data", None)
        try:
            text = data if isinstance(data, str) else json.dumps(data, default=str)
        except (ValueError, TypeError, RecursionError):
            text = ""
        fields: dict[str, Any] = {
            "server_id": server_id,
            "upstream_level": level if level in LOG_LEVELS else "other",
            "chars": len(text),
            "digest": hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16],
        }
        logger = getattr(message, "logger", None)
        if isinstance(logger, str) and _LOGGER_NAME.fullmatch(logger):
            fields["upstream_logger"] = logger
        log.debug("upstream_log", **fields)

    return handle


__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_PER_SECOND",
    "ProgressRelay",
    "ignore_progress",
    "progress_relay",
    "upstream_log",
]
