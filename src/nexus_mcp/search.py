"""Bounded search over the workspace: ``glob`` and ``grep`` with seed 003's workload caps.

Every cap that cuts the work is reported (``truncated`` plus the cap's name), never hidden:
max files scanned, matches per file, result files, file size, an extension allowlist,
binary detection by sniffing, and a wall-clock bound. Walking never follows symlinks, so
a link cannot lead the scan outside the workspace: the walk is ``Workspace.walk_files``
(folders opened on their parent's descriptor) and files are opened ``O_NOFOLLOW``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from nexus_mcp.errors import InvalidInputError
from nexus_mcp.settings import SearchSettings
from nexus_mcp.workspace import TreeFile, Workspace

CAP_FILES_SCANNED = "max_files_scanned"
CAP_RESULTS = "max_results"
CAP_MATCHES_PER_FILE = "max_matches_per_file"
CAP_TIME = "max_seconds"
MAX_LINE_CHARS = 400
# Regex matching runs per line; lines longer than this are not searched, which bounds
# the cost of a pathological pattern on one line.
MAX_SEARCHED_LINE_CHARS = 20_000


def compile_glob(pattern: str) -> re.Pattern[str]:
    """Translate a workspace glob to a regex: ``**`` spans folders, ``*`` and ``?`` do not."""
    if not pattern or "\x00" in pattern or pattern.startswith("/") or ".." in pattern.split("/"):
        raise InvalidInputError(field="pattern")
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end == -1:
                out.append(re.escape(c))
                i += 1
                continue
            body = pattern[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    try:
        return re.compile("^" + "".join(out) + "$")
    except re.error:
        raise InvalidInputError(field="pattern") from None


def is_binary(sample: bytes) -> bool:
    """Binary when the sample has a NUL byte or is not UTF-8 (ignoring a cut last char)."""
    if b"\x00" in sample:
        return True
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(sample) - 4
    return False


@dataclass
class ScanBudget:
    """Counts work against the caps and remembers which cap cut it first."""

    caps: SearchSettings
    started: float = field(default_factory=time.monotonic)
    files_scanned: int = 0
    cut_by: list[str] = field(default_factory=list)

    def cut(self, cap: str) -> None:
        if cap not in self.cut_by:
            self.cut_by.append(cap)

    def out_of_time(self) -> bool:
        if time.monotonic() - self.started > self.caps.max_seconds:
            self.cut(CAP_TIME)
            return True
        return False


def bounded(files: Iterable[TreeFile], budget: ScanBudget) -> Iterator[TreeFile]:
    """The files of a walk, cut by the files-scanned and time caps (and saying so)."""
    for found in files:
        if budget.files_scanned >= budget.caps.max_files_scanned:
            budget.cut(CAP_FILES_SCANNED)
            return
        if budget.out_of_time():
            return
        budget.files_scanned += 1
        yield found


@dataclass(frozen=True)
class LineMatch:
    line_number: int
    text: str


@dataclass(frozen=True)
class FileMatches:
    path: str
    matches: tuple[LineMatch, ...]
    more_in_file: bool


def grep_file(
    found: TreeFile, matcher: re.Pattern[str], caps: SearchSettings
) -> tuple[list[LineMatch], bool] | None:
    """Matches in one file, or None when the file is skipped (binary, too large, or no
    longer a regular file when opened: it is opened on its folder's descriptor without
    following a link)."""
    fd = Workspace.open_file(found)
    if fd is None:
        return None
    try:
        if os.fstat(fd).st_size > caps.max_file_bytes:
            return None
        data = os.read(fd, caps.max_file_bytes)
    except OSError:
        return None
    finally:
        os.close(fd)
    if is_binary(data[: caps.binary_sniff_bytes]):
        return None
    text = data.decode("utf-8", errors="replace")
    found_lines: list[LineMatch] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if len(line) > MAX_SEARCHED_LINE_CHARS:
            continue
        if matcher.search(line):
            if len(found_lines) >= caps.max_matches_per_file:
                return found_lines, True
            found_lines.append(LineMatch(number, line[:MAX_LINE_CHARS]))
    return found_lines, False


def compile_matcher(
    pattern: str, *, regex: bool, case_sensitive: bool, caps: SearchSettings
) -> re.Pattern[str]:
    if not pattern or len(pattern) > caps.max_pattern_length or "\x00" in pattern:
        raise InvalidInputError(field="pattern")
    flags = 0 if case_sensitive else re.IGNORECASE
    try:
        return re.compile(pattern if regex else re.escape(pattern), flags)
    except re.error:
        raise InvalidInputError(field="pattern") from None


def has_allowed_extension(relative: str, caps: SearchSettings) -> bool:
    suffix = os.path.splitext(relative)[1].lower()
    return suffix in caps.allowed_extensions


__all__ = [
    "CAP_FILES_SCANNED",
    "CAP_MATCHES_PER_FILE",
    "CAP_RESULTS",
    "CAP_TIME",
    "FileMatches",
    "LineMatch",
    "ScanBudget",
    "bounded",
    "compile_glob",
    "compile_matcher",
    "grep_file",
    "has_allowed_extension",
    "is_binary",
]
