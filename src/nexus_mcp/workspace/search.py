"""Bounded search over the workspace: ``glob`` and ``grep`` with seed 003's workload caps.

Every cap that cuts the work is reported (``truncated`` plus the cap's name), never hidden:
max files scanned, matches per file, result files, file size, an extension allowlist,
binary detection by sniffing, and a wall-clock bound that holds even inside one match:
globs are matched without backtracking (``Glob``) and a caller's regex runs in a child
process killed at the deadline (``regex_sandbox``). Walking never follows symlinks, so
a link cannot lead the scan outside the workspace: the walk is ``Workspace.walk_files``
(folders opened on their parent's descriptor) and files are opened ``O_NOFOLLOW``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from nexus_mcp.errors import InvalidInputError
from nexus_mcp.settings import SearchSettings
from nexus_mcp.workspace.files import Workspace
from nexus_mcp.workspace.paths import TreeFile
from nexus_mcp.workspace.regex_child import matching_lines
from nexus_mcp.workspace.regex_sandbox import RegexSandbox, SandboxStopped

CAP_FILES_SCANNED = "max_files_scanned"
CAP_RESULTS = "max_results"
CAP_TIME = "max_seconds"
MAX_LINE_CHARS = 400
# Regex matching runs per line; lines longer than this are not searched, which bounds
# the cost of a pathological pattern on one line.
MAX_SEARCHED_LINE_CHARS = 20_000


# A glob longer than this is refused: matching costs up to its length per path character.
MAX_GLOB_CHARS = 1024
# Transitions of a glob's automaton remembered per compiled glob (per call).
MAX_GLOB_TRANSITIONS = 4096

# Glob tokens: what one position of the pattern does with the next path character.
_LITERAL, _ONE, _CLASS, _STAR, _ANY, _DIRS_ENTER, _DIRS_BODY = range(7)


class Glob:
    """A workspace glob, matched without backtracking.

    ``**/`` matches zero or more whole folders, any other ``**`` any text (``/``
    included), ``*`` any text within one name, ``?`` one character other than ``/``,
    ``[...]``/``[!...]`` one character of a class; the whole path must match. Translated
    to a backtracking regex, a glob such as ``**/**/**/x`` or ``*a*a*a*a*b`` takes time
    exponential in its wildcards on a deep or long path, and a match running in a worker
    thread cannot be stopped; here a path is read once, left to right, keeping the set of
    pattern positions it can be at (a Thompson automaton), so a match costs at most the
    path's length times the pattern's.
    """

    def __init__(self, tokens: list[tuple[int, Any]]) -> None:
        self._tokens = tokens
        self._end = len(tokens)
        self._start = self._closure({0})
        self._transitions: dict[tuple[frozenset[int], str], frozenset[int]] = {}

    def match(self, path: str) -> bool:
        states = self._start
        transitions = self._transitions
        for char in path:
            key = (states, char)
            following = transitions.get(key)
            if following is None:
                following = self._step(states, char)
                if len(transitions) < MAX_GLOB_TRANSITIONS:
                    transitions[key] = following
            if not following:
                return False
            states = following
        return self._end in states

    def _closure(self, states: set[int]) -> frozenset[int]:
        """``states`` plus every position reachable from them without reading a character."""
        pending = list(states)
        reached = set(states)
        while pending:
            index = pending.pop()
            if index >= self._end:
                continue
            kind = self._tokens[index][0]
            if kind in (_STAR, _ANY):
                targets: tuple[int, ...] = (index + 1,)
            elif kind == _DIRS_ENTER:
                targets = (index + 1, index + 2)  # into ``.*/``, or past it
            else:
                continue
            for target in targets:
                if target not in reached:
                    reached.add(target)
                    pending.append(target)
        return frozenset(reached)

    def _step(self, states: frozenset[int], char: str) -> frozenset[int]:
        following: set[int] = set()
        for index in states:
            if index >= self._end:
                continue
            kind, value = self._tokens[index]
            if kind == _LITERAL:
                if char == value:
                    following.add(index + 1)
            elif kind == _ONE:
                if char != "/":
                    following.add(index + 1)
            elif kind == _CLASS:
                if value.fullmatch(char):
                    following.add(index + 1)
            elif kind == _STAR:
                if char != "/":
                    following.add(index)
            elif kind == _ANY:
                following.add(index)
            elif kind == _DIRS_BODY:
                following.add(index)
                if char == "/":
                    following.add(index + 1)
        return self._closure(following)


def compile_glob(pattern: str, *, field: str = "pattern") -> Glob:
    """Parse a workspace glob (see ``Glob``); a malformed one is ``INVALID_INPUT`` naming
    ``field``, the argument it came in."""
    if (
        not pattern
        or len(pattern) > MAX_GLOB_CHARS
        or "\x00" in pattern
        or pattern.startswith("/")
        or ".." in pattern.split("/")
    ):
        raise InvalidInputError(field=field)
    tokens: list[tuple[int, Any]] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        previous = tokens[-1][0] if tokens else None
        if pattern.startswith("**/", i):
            # Runs of wildcards collapse: ``**/**/`` is ``**/``, as the regex form was.
            if previous != _DIRS_BODY:
                tokens += [(_DIRS_ENTER, None), (_DIRS_BODY, None)]
            i += 3
        elif pattern.startswith("**", i):
            if previous != _ANY:
                tokens.append((_ANY, None))
            i += 2
        elif c == "*":
            if previous not in (_STAR, _ANY):
                tokens.append((_STAR, None))
            i += 1
        elif c == "?":
            tokens.append((_ONE, None))
            i += 1
        elif c == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            source = "[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]"
            try:
                tokens.append((_CLASS, re.compile(source)))
            except (re.error, OverflowError, RecursionError):
                raise InvalidInputError(field=field) from None
            i = end + 1
        else:
            tokens.append((_LITERAL, c))
            i += 1
    return Glob(tokens)


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

    @property
    def deadline(self) -> float:
        """When the search must stop (a ``time.monotonic()`` value)."""
        return self.started + self.caps.max_seconds

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


# What finds the matching lines of one file's text: their numbers, and whether more matched.
LineFinder = Callable[[str], tuple[list[int], bool]]


def grep_file(
    workspace: Workspace, found: TreeFile, find: LineFinder, caps: SearchSettings
) -> tuple[list[LineMatch], bool] | None:
    """Matches in one file, or None when the file is skipped (binary, too large, or no
    longer a regular file when opened: it is opened on its folder's descriptor without
    following a link). ``SandboxStopped`` from ``find`` means the time budget ran out."""
    fd = workspace.open_file(found)
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
    numbers, more = find(text)
    if not numbers:
        return [], more
    lines = text.splitlines()
    return [LineMatch(n, lines[n - 1][:MAX_LINE_CHARS]) for n in numbers], more


def compile_matcher(
    pattern: str, *, regex: bool, case_sensitive: bool, caps: SearchSettings
) -> re.Pattern[str]:
    if not pattern or len(pattern) > caps.max_pattern_length or "\x00" in pattern:
        raise InvalidInputError(field="pattern")
    flags = 0 if case_sensitive else re.IGNORECASE
    try:
        return re.compile(pattern if regex else re.escape(pattern), flags)
    except (re.error, OverflowError, RecursionError):
        # OverflowError: a repeat count past the engine's maximum (``a{4294967296}``).
        raise InvalidInputError(field="pattern") from None


@contextlib.contextmanager
def line_finder(
    matcher: re.Pattern[str],
    *,
    regex: bool,
    caps: SearchSettings,
    deadline: float,
    guard_child: Callable[[int], contextlib.AbstractContextManager[object]] | None = None,
) -> Iterator[LineFinder]:
    """How to find lines for ``matcher``: in process for a literal (an escaped pattern
    matches in linear time), in a ``RegexSandbox`` child killed at ``deadline`` for a
    caller's regex (which may backtrack for ever). ``guard_child(pid)``, when given, is
    held while the child serves (the repo tools kill it there on cancellation)."""
    if not regex:
        yield functools.partial(
            matching_lines,
            matcher,
            max_matches=caps.max_matches_per_file,
            max_line_chars=MAX_SEARCHED_LINE_CHARS,
        )
        return
    with RegexSandbox(
        matcher.pattern,
        matcher.flags,
        max_matches=caps.max_matches_per_file,
        max_line_chars=MAX_SEARCHED_LINE_CHARS,
        deadline=deadline,
    ) as sandbox:
        pid = sandbox.pid
        if guard_child is None or pid is None:
            yield sandbox.search
            return
        with guard_child(pid):
            yield sandbox.search


def has_allowed_extension(relative: str, caps: SearchSettings) -> bool:
    suffix = os.path.splitext(relative)[1].lower()
    return suffix in caps.allowed_extensions


__all__ = [
    "CAP_FILES_SCANNED",
    "CAP_RESULTS",
    "CAP_TIME",
    "MAX_GLOB_CHARS",
    "MAX_SEARCHED_LINE_CHARS",
    "Glob",
    "LineFinder",
    "LineMatch",
    "SandboxStopped",
    "ScanBudget",
    "bounded",
    "compile_glob",
    "compile_matcher",
    "grep_file",
    "has_allowed_extension",
    "is_binary",
    "line_finder",
]
