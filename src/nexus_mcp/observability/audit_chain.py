"""The tamper-evident audit file: a hash chain over its records, with stored heads.

Every record the file sink writes carries ``prev_sha256`` (the ``sha256`` of the record
before it, or :data:`GENESIS` for the first) and, last, ``sha256``: the SHA-256 of the
line's own bytes up to that field (closed with ``}``). Hashing the bytes on disk, not a
canonical re-encoding, catches any changed byte and costs one encoding per record, not
two. Editing, removing, reordering or inserting a line breaks the chain at that line.

Beside the log ``audit.jsonl`` lies ``audit.jsonl.heads``: a small JSON object naming the
rotated segments in order (``audit.jsonl.1``, ``.2``, ...) with each one's last hash, and
the live segment's head (its last hash and its size in bytes). It catches what a chain
alone cannot: a removed whole segment and a truncated tail. It is also the lock: every
writer (``serve``, ``console``, ``inbox``, replicas sharing a data folder) takes an
exclusive ``flock`` on it around "read the previous hash, append, store the head", so
several processes appending to one file keep one chain. A head is stored, not signed: who
can rewrite both the log and its heads file can rewrite history; copy the heads elsewhere
(or keep the file on append-only storage) for that.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nexus_mcp.json_text import compact_json
from nexus_mcp.policy.hashing import sha256_hex

GENESIS = "0" * 64
HEADS_SUFFIX = ".heads"
HEADS_VERSION = 1
_TAIL_CHUNK = 65536
_SUFFIX_HEAD = b',"sha256":"'
_SUFFIX_LEN = len(_SUFFIX_HEAD) + 64 + 2
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEADS_OPEN = b'{"v":%d,"segments":' % HEADS_VERSION
_HEADS_LIVE = b',"live":{"last_sha256":"'
_HEADS_BYTES = b'","bytes":'
_SEGMENT = re.compile(r"\.[1-9][0-9]{0,8}")  # after the log's name: ".1", ".2", ...


def heads_path(log: Path) -> Path:
    return log.with_name(log.name + HEADS_SUFFIX)


def line_sha256(text: bytes) -> str | None:
    """The hash a chained line claims, when it is the hash of the line's own bytes.

    ``None`` when the line does not end in its ``sha256`` field or the bytes before it
    (closed with ``}``) do not hash to it: one changed byte anywhere is caught.
    """
    suffix = text[-_SUFFIX_LEN:]
    if len(text) <= _SUFFIX_LEN or not (suffix.startswith(_SUFFIX_HEAD) and suffix.endswith(b'"}')):
        return None
    claimed = suffix[len(_SUFFIX_HEAD) : -2].decode("ascii", "replace")
    return claimed if sha256_hex(text[:-_SUFFIX_LEN] + b"}") == claimed else None


def chain_line(record: Mapping[str, Any], prev: str) -> tuple[bytes, str]:
    """The line written for a record (with ``prev_sha256``, then ``sha256``) and its hash.

    The hash is over the exact bytes of the line without its ``sha256`` field, so verify
    hashes what is on disk and nothing is serialised twice.
    """
    chained = dict(record)  # a copy in C; a record the chain built carries neither field
    if "sha256" in chained or "prev_sha256" in chained:
        chained.pop("sha256", None)
        chained.pop("prev_sha256", None)
    chained["prev_sha256"] = prev
    body = compact_json(chained)
    digest = sha256_hex(body)
    return body[:-1] + _SUFFIX_HEAD + digest.encode("ascii") + b'"}\n', digest


def _last_chained(fd: int, size: int) -> tuple[str, bool]:
    """The ``sha256`` of the last chained record in the file, and whether it ends mid-line."""
    if size == 0:
        return GENESIS, False
    ends_mid_line = os.pread(fd, 1, size - 1) != b"\n"
    end, carry = size, b""
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        block = os.pread(fd, end - start, start) + carry
        lines = block.split(b"\n")
        carry = lines[0] if start > 0 else b""
        for line in reversed(lines if start == 0 else lines[1:]):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("sha256"), str):
                return record["sha256"], ends_mid_line
        end = start
    return GENESIS, ends_mid_line


def read_heads(path: Path) -> dict[str, Any] | None:
    """The heads file as JSON, or None when there is none. Raises ValueError if unreadable."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    if not text:
        return None  # created by a writer that has written nothing yet
    heads = json.loads(text)
    if not isinstance(heads, dict) or not isinstance(heads.get("segments"), list):
        raise ValueError("not a heads object")
    return heads


class ChainedJsonlWriter:
    """Appends chained lines to a log under an exclusive lock on its heads file.

    ``max_bytes``: once the live segment would grow past it, the segment is renamed to
    ``<log>.<n>`` and a new one starts whose first record chains to the last of the old.
    """

    def __init__(self, path: Path, *, fsync: bool = False, max_bytes: int | None = None) -> None:
        self.path = path
        self._heads_path = heads_path(path)
        self._fsync = fsync
        self._max_bytes = max_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        self._hfd: int | None = os.open(self._heads_path, os.O_RDWR | os.O_CREAT, 0o600)
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        self._lock = threading.Lock()
        # What this process last wrote: (inode, size, last hash). Another writer changes
        # the size (or the inode, by rotating), and the state is read again from the files.
        self._known: tuple[int, int, str] | None = None
        self._segments: list[dict[str, Any]] = []
        self._segments_json: bytes | None = None  # their JSON, until they change
        self._heads_size = 0
        self._inode = 0
        self._stored_head = GENESIS
        # Told each new head, under the lock (``audit_anchor.HeadAnchor.note``).
        self.on_head: Callable[[str], None] | None = None

    def write(self, records: list[Mapping[str, Any]]) -> None:
        with self._lock:
            if self._hfd is None:
                raise ValueError("the audit file is closed")
            fcntl.flock(self._hfd, fcntl.LOCK_EX)
            try:
                self._write_locked(records)
            finally:
                fcntl.flock(self._hfd, fcntl.LOCK_UN)

    def _write_locked(self, records: list[Mapping[str, Any]]) -> None:
        info = os.fstat(self._fd)
        try:
            moved = os.stat(self.path).st_ino != info.st_ino
        except FileNotFoundError:
            moved = True  # deleted: a new file starts, and verify finds its chain broken
        if moved:
            os.close(self._fd)  # another process rotated (or someone moved) the file
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            info = os.fstat(self._fd)
        size, self._inode = info.st_size, info.st_ino
        known = self._known
        if known is not None and known[0] == info.st_ino and known[1] == size:
            prev, prefix = known[2], b""
        else:
            self._load_segments()
            self._heads_size = os.fstat(self._hfd).st_size if self._hfd is not None else 0
            prev, mid_line = _last_chained(self._fd, size)
            if size == 0:  # a new segment, or the file was deleted: chain to the stored head
                prev = self._stored_head
            # A torn last line (a crash mid-write) stays on a line of its own.
            prefix = b"\n" if mid_line else b""
        lines = [prefix]
        for record in records:
            line, prev = chain_line(record, prev)
            lines.append(line)
        data = b"".join(lines)
        if self._max_bytes is not None and size > 0 and size + len(data) > self._max_bytes:
            self._rotate()
            size = 0
            if prefix:
                data = data[1:]
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        if self._fsync:
            os.fsync(self._fd)
        size += len(data)
        self._store_heads(prev, size)
        self._known = (self._inode, size, prev)
        if self.on_head is not None:
            self.on_head(prev)

    def _load_segments(self) -> None:
        assert self._hfd is not None
        try:
            raw = os.pread(self._hfd, 1 << 24, 0)
            heads = json.loads(raw) if raw else {}
            segments = heads.get("segments", []) if isinstance(heads, dict) else []
            self._segments = [s for s in segments if isinstance(s, dict)]
            self._segments_json = None
            live = heads.get("live") if isinstance(heads, dict) else None
            head = live.get("last_sha256") if isinstance(live, dict) else None
            self._stored_head = head if isinstance(head, str) else GENESIS
        except ValueError:
            self._segments = []  # a damaged heads file: verify reports it; keep writing
            self._segments_json = None
            self._stored_head = GENESIS

    def _rotate(self) -> None:
        last = _last_chained(self._fd, os.fstat(self._fd).st_size)[0]
        number = len(self._segments) + 1
        target = self.path.with_name(f"{self.path.name}.{number}")
        while target.exists():
            number += 1
            target = self.path.with_name(f"{self.path.name}.{number}")
        os.rename(self.path, target)
        self._segments.append({"file": target.name, "last_sha256": last})
        self._segments_json = None
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        self._inode = os.fstat(self._fd).st_ino

    def _store_heads(self, last: str, size: int) -> None:
        if _HEX64.fullmatch(last) is not None:
            # Every record: the object's bytes around the segments (which change only when a
            # segment is rotated out), the same bytes compact_json writes for the object.
            segments = self._segments_json
            if segments is None:
                segments = self._segments_json = compact_json(self._segments)
            data = b"".join(
                (_HEADS_OPEN, segments, _HEADS_LIVE, last.encode("ascii"), _HEADS_BYTES,
                 str(size).encode("ascii"), b"}}")
            )  # fmt: skip
        else:  # a stored head read back from a damaged heads file: whatever it holds
            heads = {
                "v": HEADS_VERSION,
                "segments": self._segments,
                "live": {"last_sha256": last, "bytes": size},
            }
            data = compact_json(heads)
        assert self._hfd is not None
        # The object only grows (hashes have one length, sizes and segments grow), so it
        # is rewritten in place; padding (JSON whitespace) covers a shorter one, and the
        # file is cut only then, which skips a metadata update on every record.
        if len(data) < self._heads_size:
            data += b" " * (self._heads_size - len(data))
        os.pwrite(self._hfd, data, 0)
        self._heads_size = len(data)
        if self._fsync:
            os.fsync(self._hfd)

    def close(self) -> None:
        with self._lock:
            if self._hfd is not None:
                os.close(self._fd)
                os.close(self._hfd)
                self._hfd = None


@dataclass(frozen=True)
class ChainProblem:
    """Where verification stopped: a file, a line (0: the file itself) and what is wrong."""

    file: str
    line: int
    problem: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.problem}"


@dataclass(frozen=True)
class ChainReport:
    records: int
    segments: int
    unchained: int
    problem: ChainProblem | None
    anchored: bool | None = None  # the anchored head is a record of the chain (None: none)


ANCHOR_MISSING = (
    "the head anchored in PostgreSQL is not a record of this chain (records removed "
    "from the end, or the log rewritten)"
)


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """``(line_number, text, complete)``; ``complete`` is False for a last line without newline."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            yield number, line.rstrip(b"\n"), line.endswith(b"\n")


def verify_chain(log: Path, anchored: str | None = None) -> ChainReport:
    """Check a log, its rotated segments and its stored heads; stop at the first problem.

    ``anchored``: a head kept out of reach (``audit_anchor.py``), which must be the hash
    of one of the chain's records."""
    records = unchained = 0
    seen_anchor = False

    def report(segments: int, file: str, line: int, problem: str) -> ChainReport:
        return ChainReport(records, segments, unchained, ChainProblem(file, line, problem))

    hpath = heads_path(log)
    try:
        heads = read_heads(hpath)
    except (ValueError, OSError):
        return report(0, hpath.name, 0, "the heads file is damaged")
    segments = [] if heads is None else heads["segments"]
    names = [s.get("file") if isinstance(s, dict) else None for s in segments]
    if not all(isinstance(n, str) and _SEGMENT.fullmatch(n, len(log.name)) for n in names):
        return report(0, hpath.name, 0, "the heads file is damaged")
    if any(not n.startswith(log.name) for n in names):  # type: ignore[union-attr]
        return report(0, hpath.name, 0, "the heads file is damaged")
    files = [(log.with_name(str(s.get("file"))), s.get("last_sha256")) for s in segments]
    live = heads.get("live") if heads is not None else None
    files.append((log, live.get("last_sha256") if isinstance(live, dict) else None))
    prev: str | None = None  # None: no chained record seen yet (legacy lines may come first)
    for index, (path, head) in enumerate(files):
        if not path.exists():
            return report(index, path.name, 0, "segment is missing (removed or renamed)")
        last_line = 0
        for number, text, complete in _lines(path):
            last_line = number
            if not complete:
                return report(
                    index, path.name, number,
                    "incomplete last line (a write cut short, e.g. a crash, or appended bytes)",
                )  # fmt: skip
            try:
                record = json.loads(text)
            except ValueError:
                return report(index, path.name, number, "not a JSON record (torn or inserted)")
            if not isinstance(record, dict):
                return report(index, path.name, number, "not a JSON record (torn or inserted)")
            digest = record.get("sha256")
            if digest is None and prev is None and "prev_sha256" not in record:
                unchained += 1  # written before the chain existed
                continue
            if not isinstance(digest, str) or line_sha256(text) != digest:
                return report(index, path.name, number, "record does not match its hash (edited)")
            expected = prev if prev is not None else GENESIS
            if record.get("prev_sha256") != expected:
                return report(
                    index, path.name, number,
                    "chain broken: a record before this one was removed, reordered or inserted",
                )  # fmt: skip
            prev = digest
            records += 1
            seen_anchor = seen_anchor or digest == anchored
        if head is not None and head != (prev or GENESIS):
            return report(
                index, path.name, last_line + 1,
                "the last record is not the stored head (records removed from the end, "
                "or the heads file edited)",
            )  # fmt: skip
        if head is None and heads is None and prev is not None:
            return report(index, hpath.name, 0, "heads file is missing (needed for a chain)")
    if anchored is not None and not seen_anchor:
        return ChainReport(
            records, len(files), unchained, ChainProblem(log.name, 0, ANCHOR_MISSING), False
        )
    return ChainReport(records, len(files), unchained, None, None if anchored is None else True)


__all__ = [
    "GENESIS",
    "ChainProblem",
    "ChainReport",
    "ChainedJsonlWriter",
    "chain_line",
    "heads_path",
    "line_sha256",
    "read_heads",
    "verify_chain",
]
