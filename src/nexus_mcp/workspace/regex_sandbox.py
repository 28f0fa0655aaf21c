"""A caller's regular expression, matched where it can be stopped: in a child process.

Python's ``re`` backtracks: ``(a+)+$`` takes time exponential in the length of a line of
``a``s, ``\\d*\\d*\\d*x`` polynomial, and nothing interrupts a match running in a worker
thread. The tool timeout only stops *waiting* for it; the thread runs on, holding one of
the few workers every file tool shares, until the process ends. So ``nexus_grep`` with
``regex=true`` hands its pattern to ``RegexSandbox``: a child process, started for the
call, fed one file's text at a time, and killed when the search's time budget runs out
(the result then says it was cut by ``max_seconds``). A literal search never comes here:
an escaped pattern matches in linear time.

The child is ``regex_child.py`` run by a bare interpreter (``-I -S``: no site packages,
no environment variables, no user site), so it imports nothing of nexus-mcp; it sees the
pattern and the text it is sent, never a path, a descriptor or a setting.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from nexus_mcp.workspace import regex_child
from nexus_mcp.workspace.regex_child import FRAME_HEADER, READY, decode_answer, encode_request

CHILD_SCRIPT = str(Path(regex_child.__file__).resolve())
# How long a child may take to start and compile the pattern before the search gives up;
# it is also bounded by the search's own deadline, whichever comes first.
CHILD_START_SECONDS = 10.0


class SandboxStopped(Exception):
    """The time budget ran out before the child answered; the child has been killed."""


class RegexSandbox:
    """One child process matching one pattern against texts, line by line.

    ``search`` answers with the 1-based numbers of the matching lines (at most
    ``max_matches``) and whether more lines matched, or raises ``SandboxStopped`` once
    ``deadline`` (a ``time.monotonic()`` value) has passed. Lines longer than
    ``max_line_chars`` are not searched, as in the in-process search.
    """

    def __init__(
        self,
        pattern: str,
        flags: int,
        *,
        max_matches: int,
        max_line_chars: int,
        deadline: float,
    ) -> None:
        self._request = encode_request(
            pattern, flags, max_matches=max_matches, max_line_chars=max_line_chars
        )
        self._deadline = deadline
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RegexSandbox:
        self._process = subprocess.Popen(  # noqa: S603 - our own interpreter and file
            [sys.executable, "-I", "-S", CHILD_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={},
            close_fds=True,
        )
        try:
            self._send(self._request)
            ready = self._receive(min(self._deadline, time.monotonic() + CHILD_START_SECONDS))
        except BaseException:
            self.close()
            raise
        if ready != READY:
            self.close()
            raise RuntimeError("the regex child did not start")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs (``None`` once it is stopped)."""
        return self._process.pid if self._process is not None else None

    def search(self, text: str) -> tuple[list[int], bool]:
        self._send(text.encode("utf-8", "surrogatepass"))
        return decode_answer(self._receive(self._deadline))

    def close(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                # A pipe the killed child left with unread data may fail to flush.
                with contextlib.suppress(OSError):
                    stream.close()
        process.wait()

    # -- framing -------------------------------------------------------------------------

    def _send(self, payload: bytes) -> None:
        # The child reads a whole frame before it matches, and the next frame is sent only
        # after its answer: a write never waits on a child stuck in a match.
        assert self._process is not None and self._process.stdin is not None
        stdin = self._process.stdin
        stdin.write(FRAME_HEADER.pack(len(payload)) + payload)
        stdin.flush()

    def _receive(self, deadline: float) -> bytes:
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        (size,) = FRAME_HEADER.unpack(self._read_exactly(fd, FRAME_HEADER.size, deadline))
        return self._read_exactly(fd, size, deadline)

    def _read_exactly(self, fd: int, size: int, deadline: float) -> bytes:
        chunks: list[bytes] = []
        remaining = size
        while remaining:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                self.close()
                raise SandboxStopped()
            chunk = os.read(fd, remaining)
            if not chunk:
                raise RuntimeError("the regex child ended unexpectedly")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)


__all__ = ["CHILD_START_SECONDS", "RegexSandbox", "SandboxStopped"]
