"""A document's exact byte size and sha256, made and hashed a piece at a time.

The bytes a document hash covers are a ``str``'s UTF-8 encoding or its strict base64
decoding (``policy/documents.py``). Making all of them at once and then hashing them
costs a second pass over memory that no longer fits the cache, and the page faults of a
fresh multi-megabyte allocation. Here a large value is encoded (or decoded) in pieces of
a few hundred kilobytes, and each piece is hashed while it is still in the cache.

Encoding non-ASCII text costs about as much as hashing it. On a machine with two cores
or more, a large value's pieces are hashed by one worker thread while the calling thread
makes the next piece: ``hashlib`` releases the GIL while it hashes a large buffer, so the
two overlap and the time approaches the slower of the two instead of their sum. The
hand-off is synchronous (the caller waits until the worker has taken the piece and is
hashing it): the caller blocking is what lets the worker take the GIL, so a piece never
waits behind the interpreter's switch interval. When other work keeps the second core
busy the hand-offs cost more than they save; once the caller has waited longer than the
worker has hashed, the rest is hashed on the calling thread. ASCII text (a copy) and
base64 (a SIMD decode) cost much less than the hash, and the overlap still repays the
hand-offs: on the 2-core machine a 5 MiB ASCII text went from 0.76x sha256's throughput
to 0.87-0.92x, its base64 from 0.68x to 0.85-0.91x (benchmarks/bench_documents.py). On one
core, pieces are made and hashed in turn, and only values long enough to fall out of the
cache are cut.

Results are exactly those of the one-shot forms, which the unit tests check property by
property: ``sha256(text.encode("utf-8"))`` and its length, and
``sha256(pybase64.b64decode(text, validate=True))``, with the same refusals (a lone
surrogate anywhere is a ``UnicodeEncodeError``; anything but canonical padded base64 is a
``binascii.Error``).
"""

from __future__ import annotations

import binascii
import hashlib
import os
import queue
import threading
import time
from collections.abc import Iterator

import pybase64

# Characters per piece: 256 Ki characters are at most 1 MiB of UTF-8 (256 KiB of ASCII,
# 768 KiB of text from the Basic Multilingual Plane) and 192 KiB of decoded base64 (a
# multiple of four characters, whole quanta), small enough to stay in the cache.
PIECE_CHARS = 1 << 18
# Below these lengths a value is encoded (decoded) and hashed in one go. Measured on the
# 2-core machine (benchmarks/bench_documents.py and its notes): on two cores, overlapping
# the making of pieces with their hashing pays off from about 1 Mi characters for every
# kind; on one core an ASCII copy or a SIMD base64 decode is cheap beside the hash, and
# pieces pay off only once the one-shot preimage is large enough to fall out of the cache.
ASCII_PIECEWISE_MIN_CHARS = 1 << 21
BASE64_PIECEWISE_MIN_CHARS = 1 << 22
THREADED_MIN_CHARS = 1 << 20
# Seconds of waiting on the worker a document may spend beyond the worker's own hashing
# time before its remaining pieces are hashed on the calling thread instead.
HAND_OFF_ALLOWANCE = 0.001


def digest_utf8(text: str, limit: int) -> tuple[int, str | None]:
    """``len`` and sha256 hex of ``text.encode("utf-8")``; the hash is None past ``limit``.

    Past ``limit`` nothing more is hashed, but the rest is still encoded: the size stays
    exact, and a lone surrogate anywhere is refused (``UnicodeEncodeError``) however
    large the text, as the one-shot encoding would.
    """
    overlapped = _CORES >= 2 or not text.isascii()
    minimum = THREADED_MIN_CHARS if overlapped else ASCII_PIECEWISE_MIN_CHARS
    if len(text) < minimum:
        data = text.encode("utf-8")
        return len(data), hashlib.sha256(data).hexdigest() if len(data) <= limit else None
    pieces = (
        text[start : start + PIECE_CHARS].encode("utf-8")
        for start in range(0, len(text), PIECE_CHARS)
    )
    # UTF-8 has at least one byte per character: a text longer than the limit is over it
    # from the start, so it is only counted.
    hashed = limit if len(text) <= limit else -1
    size, digest = _digest_pieces(pieces, hashed, threaded=True)
    return size, digest.hexdigest() if size <= limit else None


def digest_base64(text: str) -> tuple[int, str]:
    """``len`` and sha256 hex of ``pybase64.b64decode(text, validate=True)``.

    The caller checks the decoded size before (it follows from the length). A piece
    before the last holds whole quanta and no padding, so it decodes on its own exactly
    as it does inside the whole; padding before the last piece is refused, as the whole's
    strict decoding refuses padding anywhere but at the end.
    """
    minimum = THREADED_MIN_CHARS if _CORES >= 2 else BASE64_PIECEWISE_MIN_CHARS
    if len(text) < minimum:
        data = pybase64.b64decode(text, validate=True)
        return len(data), hashlib.sha256(data).hexdigest()
    # Three bytes for four characters at most: never past len(text), so all is hashed.
    size, digest = _digest_pieces(_base64_pieces(text), len(text), threaded=True)
    return size, digest.hexdigest()


def _base64_pieces(text: str) -> Iterator[bytes]:
    last = len(text) - PIECE_CHARS
    for start in range(0, len(text), PIECE_CHARS):
        piece = text[start : start + PIECE_CHARS]
        if start < last and "=" in piece:
            raise binascii.Error("padding before the end of the base64 text")
        yield pybase64.b64decode(piece, validate=True)


def _digest_pieces(
    pieces: Iterator[bytes], limit: int, *, threaded: bool
) -> tuple[int, hashlib._Hash]:
    """Count all the pieces; hash them in order while their running size is within ``limit``.

    The hash returned covers the whole only if the size is within ``limit``.
    """
    digest = hashlib.sha256()
    stream = _Stream(digest) if threaded and limit >= 0 and _CORES >= 2 else None
    size = 0
    try:
        for piece in pieces:
            size += len(piece)
            if size > limit:
                continue
            if stream is None:
                digest.update(piece)
            elif not stream.feed(piece):
                # The other core is busy elsewhere: hash the rest on this thread.
                handed = stream
                stream = None
                handed.finish()
    finally:
        if stream is not None:
            stream.finish()
    return size, digest


class _Stream:
    """One document's hash, its pieces handed in order to the shared worker thread."""

    __slots__ = ("digest", "error", "hashed", "taken", "waited")

    def __init__(self, digest: hashlib._Hash) -> None:
        self.digest = digest
        self.error: BaseException | None = None
        self.taken = threading.Lock()
        self.taken.acquire()  # released by the worker each time it takes a piece
        self.waited = 0.0  # seconds the caller spent handing pieces over
        self.hashed = 0.0  # CPU seconds the worker spent hashing them

    def feed(self, piece: bytes) -> bool:
        """Hand ``piece`` over and return once the worker is hashing it.

        The worker takes pieces in order, one at a time, so when it takes this one the
        previous one is hashed: at most one piece of a stream is in flight. Returns
        whether handing over still pays: False once the caller has waited longer than
        hashing the pieces itself would have taken (plus the worker's first wake-up), as
        when other processes keep the second core busy.
        """
        started = time.perf_counter()
        self._hand(piece)
        self.waited += time.perf_counter() - started
        return self.waited <= self.hashed + HAND_OFF_ALLOWANCE

    def finish(self) -> None:
        """Wait until every piece handed over is hashed; raise what the worker raised."""
        self._hand(None)
        if self.error is not None:
            raise self.error

    def _hand(self, piece: bytes | None) -> None:
        _worker().jobs.put((self, piece))
        self.taken.acquire()


class _Worker:
    """The thread that hashes handed pieces; the caller encodes the next one meanwhile."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[_Stream, bytes | None]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="nexus-mcp-digests", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            stream, piece = self.jobs.get()
            stream.taken.release()
            if piece is None or stream.error is not None:
                continue
            started = time.thread_time()
            try:
                stream.digest.update(piece)  # releases the GIL while it hashes
                stream.hashed += time.thread_time() - started
            except BaseException as exc:  # noqa: BLE001 - raised in the caller, as futures do
                stream.error = exc


_WORKER: _Worker | None = None
_WORKER_LOCK = threading.Lock()


def _worker() -> _Worker:
    global _WORKER
    worker = _WORKER
    if worker is not None and worker.thread.is_alive():
        return worker
    with _WORKER_LOCK:
        if _WORKER is None or not _WORKER.thread.is_alive():
            _WORKER = _Worker()
        return _WORKER


def _forget_worker() -> None:
    # A forked child has no worker thread, only the parent's object: start a new one.
    global _WORKER, _WORKER_LOCK
    _WORKER = None
    _WORKER_LOCK = threading.Lock()


def _count_cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


_CORES = _count_cores()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_worker)


__all__ = [
    "ASCII_PIECEWISE_MIN_CHARS",
    "BASE64_PIECEWISE_MIN_CHARS",
    "HAND_OFF_ALLOWANCE",
    "PIECE_CHARS",
    "THREADED_MIN_CHARS",
    "digest_base64",
    "digest_utf8",
]
