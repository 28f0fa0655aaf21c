"""The child side of ``regex_sandbox``: match one pattern against texts, line by line.

Run as a script by a bare interpreter (``python -I -S regex_child.py``); it imports only
what a match needs, so it starts fast, and nothing of nexus-mcp. Frames on stdin and
stdout are a 4-byte big-endian length and a payload. The first frame is the request:
``flags``, ``max_matches`` and ``max_line_chars`` as decimal lines, then the pattern
(UTF-8, lone surrogates passed through). The child answers ``ready`` once the pattern
compiled, then each text frame with ``<more>;<n>,<n>,...``: whether more lines matched
than reported, and the 1-based numbers of the matching lines.
"""

from __future__ import annotations

import re
import struct
import sys
from typing import BinaryIO

FRAME_HEADER = struct.Struct(">I")
READY = b"ready"
TEXT_ERRORS = "surrogatepass"


def read_frame(stream: BinaryIO) -> bytes | None:
    header = stream.read(FRAME_HEADER.size)
    if len(header) < FRAME_HEADER.size:
        return None
    (size,) = FRAME_HEADER.unpack(header)
    return stream.read(size)


def write_frame(stream: BinaryIO, payload: bytes) -> None:
    stream.write(FRAME_HEADER.pack(len(payload)) + payload)
    stream.flush()


def encode_request(pattern: str, flags: int, *, max_matches: int, max_line_chars: int) -> bytes:
    head = f"{int(flags)}\n{int(max_matches)}\n{int(max_line_chars)}\n".encode("ascii")
    return head + pattern.encode("utf-8", TEXT_ERRORS)


def decode_answer(payload: bytes) -> tuple[list[int], bool]:
    more, _, numbers = payload.decode("ascii").partition(";")
    return [int(n) for n in numbers.split(",") if n], more == "1"


def matching_lines(
    matcher: re.Pattern[str], text: str, *, max_matches: int, max_line_chars: int
) -> tuple[list[int], bool]:
    """Numbers of the lines of ``text`` that ``matcher`` finds something in (lines longer
    than ``max_line_chars`` are not searched), and whether more than ``max_matches`` did."""
    found: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if len(line) > max_line_chars:
            continue
        if matcher.search(line):
            if len(found) >= max_matches:
                return found, True
            found.append(number)
    return found, False


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    request = read_frame(stdin)
    if request is None:
        return
    flags, max_matches, max_line_chars, pattern = request.split(b"\n", 3)
    matcher = re.compile(pattern.decode("utf-8", TEXT_ERRORS), int(flags))
    write_frame(stdout, READY)
    while (frame := read_frame(stdin)) is not None:
        found, more = matching_lines(
            matcher,
            frame.decode("utf-8", TEXT_ERRORS),
            max_matches=int(max_matches),
            max_line_chars=int(max_line_chars),
        )
        answer = ("1" if more else "0") + ";" + ",".join(map(str, found))
        write_frame(stdout, answer.encode("ascii"))


if __name__ == "__main__":
    main()


__all__ = ["decode_answer", "encode_request", "matching_lines", "read_frame", "write_frame"]
