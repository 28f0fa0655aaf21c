"""Anchoring the audit head off the machine (issue 28): the head of the hash-chained
audit file, copied to a store its writer cannot roll back (on the shared backend,
PostgreSQL: ``stores/postgres_audit.py``).

The file sink tells the anchor each new head as it writes (``note``, a variable set
under a lock: nothing on the request path waits for the database). A thread of its own
writes the latest head at most every ``interval`` seconds, and once more at ``close``.
Records written after the last anchor are covered by the file's own chain and heads
only: who can rewrite the file may drop at most the last ``interval`` seconds of
records undetected, never anything behind the anchor. A store that is down is retried
at the next interval; the audit file itself never waits for it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from nexus_mcp.observability.logs import get_logger

log = get_logger(__name__)

DEFAULT_INTERVAL_SECONDS = 1.0


class HeadAnchor:
    """Copies the latest audit head to ``store(head)`` from a thread of its own."""

    def __init__(
        self, store: Callable[[str], None], *, interval: float = DEFAULT_INTERVAL_SECONDS
    ) -> None:
        self._store = store
        self._interval = interval
        self._lock = threading.Lock()
        self._latest: str | None = None
        self._anchored: str | None = None
        self._wake = threading.Event()
        self._closed = False
        self.failures = 0  # anchors that did not reach the store (tests, metrics)
        self._thread = threading.Thread(target=self._run, name="nexus-audit-anchor", daemon=True)
        self._thread.start()

    def note(self, head: str) -> None:
        """The file's new head (called by the writer, under its lock: must be cheap)."""
        with self._lock:
            self._latest = head

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._interval)
            self.flush()

    def flush(self) -> bool:
        """Anchor the latest head now, if it moved; False if the store did not take it."""
        with self._lock:
            latest = self._latest
        if latest is None or latest == self._anchored:
            return True
        try:
            self._store(latest)
        except Exception as exc:  # noqa: BLE001 - the store is down: the next round retries
            self.failures += 1
            log.warning("audit_anchor_failed", error=type(exc).__name__)
            return False
        self._anchored = latest
        return True

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=5.0)
        self.flush()


class HeadStore(Protocol):
    def anchor(self, replica: str, log: str, last_sha256: str) -> None: ...


def anchor_audit_sinks(sinks: Iterable[Any], store: HeadStore | None, *, replica: str) -> None:
    """Anchor the head of every audit file among ``sinks`` in ``store`` (the shared
    backend's ``PostgresAuditHeads``) under ``replica`` and the file's name; no store
    (the embedded backend): nothing to do."""
    if store is None:
        return
    for sink in sinks:
        anchor_with = getattr(sink, "anchor_with", None)
        path = getattr(sink, "path", None)
        if anchor_with is None or path is None:
            continue
        name = Path(path).name
        anchor_with(HeadAnchor(functools.partial(store.anchor, replica, name)))


__all__ = ["DEFAULT_INTERVAL_SECONDS", "HeadAnchor", "HeadStore", "anchor_audit_sinks"]
