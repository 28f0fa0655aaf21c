"""CODEOWNERS: who owns a repository path, read the way GitHub reads the file.

A repository write needs "an approval from someone who owns every touched path". This
module answers that from the text of a CODEOWNERS file and nothing else: the caller
reads the file (``find_codeowners`` only takes a ``read`` callable) and supplies team
memberships, so there is no I/O and no network here.

File: GitHub uses the first of ``CODEOWNERS_LOCATIONS`` that exists. It loads only
files *under* 3 MB, so a file of ``MAX_CODEOWNERS_BYTES`` or more counts as found and
has no rules; so does a file that is not UTF-8 (a leading BOM is dropped).

Lines (GitHub's "About code owners" page; gitignore patterns with its exceptions):

- A line is a pattern then zero or more owners, separated by spaces or tabs; leading
  whitespace is ignored. A ``#`` that starts a line or a token starts a comment, so
  ``*.js @js-owner # note`` is a rule (the docs' example has that inline comment); a
  ``#`` inside a token is an ordinary character.
- ``\\`` makes the next character literal (``path\\ with\\ spaces/``), except that the
  docs say escaping a leading ``#`` "doesn't work": a pattern starting with ``\\#`` is
  an invalid line, as are ``!`` negation and ``[ ]`` ranges (any unescaped ``[`` or
  ``]``), which the docs also list as not working.
- Owners are ``@user``, ``@org/team`` or an email address. GitHub skips a line with
  invalid syntax, so one malformed owner invalidates the *whole* line: its other owners
  are not applied. A line with no owners is valid and leaves its paths without owners.
- Also invalid: a trailing lone ``\\``, an escaped ``/``, an empty, ``.`` or ``..``
  segment, a pattern over ``MAX_PATTERN_CHARS``, and every rule after ``MAX_RULES``.
  Invalid lines are skipped and their 1-based numbers kept in ``invalid_lines``;
  parsing never raises. Skipping a line can hand its paths to an earlier, broader rule,
  exactly as on GitHub; a caller that wants to fail closed refuses when
  ``invalid_lines`` is not empty.

Patterns (case-sensitive, like GitHub's filesystem):

- ``*`` matches within one segment, ``?`` one character, neither crosses ``/``; both
  match a leading dot. ``**`` as a whole segment spans zero or more segments when it
  leads or sits in the middle, and one or more when it ends the pattern (``a/**`` is
  what is inside ``a``); ``**`` inside a segment is a plain ``*``.
- A pattern with no slash except a trailing one matches at any depth (``*.js``,
  ``apps/``); a leading or middle slash anchors it at the root (``/docs/``,
  ``docs/*``, ``apps/github``).
- A pattern that matches a directory owns everything below it: ``/build/logs`` owns
  ``build/logs/a/b.txt``, ``**/logs`` owns ``deeply/nested/logs/x``. A trailing ``/``
  matches directories only (``apps/`` owns ``apps/x`` but not a file named ``apps``).
  The one exception is GitHub's documented ``docs/*``: a pattern whose last segment is
  exactly ``*`` matches direct children only, so ``/*`` owns root files only.
- The last matching rule decides; ``owners_of`` returns its owners, or ``()``.

Paths are repository-relative with ``/`` separators. A path that is not (empty, a
leading or trailing ``/``, an empty, ``.`` or ``..`` segment, longer than
``MAX_PATH_CHARS``) matches no rule. ``unowned_paths`` counts a path without owners as
owned by nobody, so a ``require_codeowners`` check refuses it: no approver can be its
owner. (GitHub instead lets anyone with write access approve such a path; here the
least-privilege reading wins.)

Matching is segment by segment with no regular expression built from the pattern as a
whole. ``**`` splits a pattern into fixed-length runs of segments and ``*`` splits a
segment into fixed-length pieces; each run (or piece) is placed at its leftmost fit,
which is exact for globs and never backtracks, so one match costs at most
path-length x pattern-length steps: ``**/**/**/…`` and ``*a*a*a*b`` stay linear in the
path. (The ``codeowners`` package on PyPI was not used: its regex backtracks
catastrophically on ``*a*a*a*a*b``, it accepts ``!`` and ``[ ]`` patterns and drops
malformed owners instead of skipping the line, and it reports no invalid lines.)

``is_owner`` compares logins and emails ASCII-case-insensitively (GitHub logins are
case-insensitive) with one leading ``@`` optional on a login; non-ASCII never folds,
so the Kelvin sign cannot stand in for ``k``. A team owner matches the members the
caller lists in ``teams`` (flattened: nested teams are the caller's job).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

__all__ = [
    "CODEOWNERS_LOCATIONS",
    "MAX_CODEOWNERS_BYTES",
    "MAX_PATH_CHARS",
    "MAX_PATTERN_CHARS",
    "MAX_RULES",
    "CodeOwners",
    "Rule",
    "find_codeowners",
    "is_owner",
    "unowned_paths",
]

CODEOWNERS_LOCATIONS = (".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS")
MAX_CODEOWNERS_BYTES = 3 * 1024 * 1024  # the first size GitHub does not load
MAX_RULES = 10_000
MAX_PATTERN_CHARS = 4096
MAX_PATH_CHARS = 4096

_Tail = Literal["subtree", "directory", "exact"]

# A token is a run of escaped characters and anything but a separator or backslash;
# the alternatives start with different characters, so the scan is linear.
_TOKEN = re.compile(r"(?:\\.|[^ \t\\])+", re.DOTALL)
_LOGIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
_TEAM = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}/[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_EMAIL = re.compile(
    r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){1,126}"
)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_NO_TEAMS: Mapping[str, Collection[str]] = MappingProxyType({})
_LITERAL = "literal"
_DOT_SEGMENTS = ([(_LITERAL, ".")], [(_LITERAL, "."), (_LITERAL, ".")])


@dataclass(frozen=True)
class _Piece:
    """Literal characters and ``?`` between two ``*`` of one segment: a fixed width."""

    text: str  # the literal text when ``regex`` is None
    regex: re.Pattern[str] | None  # literals and ``.`` only: no quantifier to backtrack
    width: int

    def match_at(self, name: str, position: int) -> bool:
        if self.regex is None:
            return name.startswith(self.text, position)
        return self.regex.match(name, position) is not None

    def find(self, name: str, start: int, end: int) -> int:
        """The leftmost start of this piece wholly inside ``name[start:end]``, or -1."""
        if self.regex is None:
            return name.find(self.text, start, end)
        found = self.regex.search(name, start, end)
        return -1 if found is None else found.start()


@dataclass(frozen=True)
class _SegmentGlob:
    """One pattern segment: its pieces, split at ``*`` (one piece when it has none)."""

    pieces: tuple[_Piece, ...]
    min_width: int

    def matches(self, name: str) -> bool:
        pieces = self.pieces
        if len(pieces) == 1:
            return len(name) == pieces[0].width and pieces[0].match_at(name, 0)
        if len(name) < self.min_width:
            return False
        first, last = pieces[0], pieces[-1]
        if not first.match_at(name, 0):
            return False
        position, end = first.width, len(name) - last.width
        for piece in pieces[1:-1]:
            found = piece.find(name, position, end)
            if found < 0:
                return False
            position = found + piece.width
        return last.match_at(name, end)


_EMPTY_PIECE = _Piece("", None, 0)
_ANY_SEGMENT = _SegmentGlob((_EMPTY_PIECE, _EMPTY_PIECE), 0)

_Run = tuple[_SegmentGlob, ...]


@dataclass(frozen=True)
class _Matcher:
    """A compiled pattern: ``head`` at the root, then runs each preceded by ``**``."""

    head: _Run
    runs: tuple[_Run, ...]
    tail: _Tail  # subtree: the match may stop at an ancestor; directory: must; exact: not

    def matches(self, parts: Sequence[str]) -> bool:
        count = len(parts)
        if not _run_fits(self.head, parts, 0):
            return False
        position = len(self.head)
        for index, run in enumerate(self.runs):
            if self.tail == "exact" and index == len(self.runs) - 1:
                start = count - len(run)
                return start >= position and _run_fits(run, parts, start)
            start = _find_run(run, parts, position)
            if start < 0:
                return False
            position = start + len(run)
        if self.tail == "exact":
            return position == count
        if self.tail == "directory":
            return position < count
        return True


def _run_fits(run: _Run, parts: Sequence[str], start: int) -> bool:
    if start + len(run) > len(parts):
        return False
    return all(glob.matches(parts[start + offset]) for offset, glob in enumerate(run))


def _find_run(run: _Run, parts: Sequence[str], start: int) -> int:
    # Leftmost fit: every run has a fixed length, so the earliest end is never worse.
    for candidate in range(start, len(parts) - len(run) + 1):
        if _run_fits(run, parts, candidate):
            return candidate
    return -1


def _compile_segment(items: list[tuple[str, str]]) -> _SegmentGlob:
    groups: list[list[tuple[str, str]]] = [[]]
    for kind, char in items:
        if kind == "*":
            groups.append([])
        else:
            groups[-1].append((kind, char))
    if len(groups) > 2:
        # Consecutive stars leave empty middle pieces, which match anywhere.
        groups = [groups[0], *(group for group in groups[1:-1] if group), groups[-1]]
    pieces = tuple(_compile_piece(group) for group in groups)
    return _SegmentGlob(pieces, sum(piece.width for piece in pieces))


def _compile_piece(items: list[tuple[str, str]]) -> _Piece:
    text = "".join(char for _, char in items)
    if all(kind == _LITERAL for kind, _ in items):
        return _Piece(text, None, len(items))
    source = "".join("." if kind == "?" else re.escape(char) for kind, char in items)
    return _Piece(text, re.compile(source, re.DOTALL), len(items))


def _scan_pattern(pattern: str) -> list[list[tuple[str, str]]] | None:
    """The pattern's segments as (kind, character) items, or None when it is invalid."""
    segments: list[list[tuple[str, str]]] = [[]]
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            if index + 1 == len(pattern) or pattern[index + 1] == "/":
                return None
            segments[-1].append((_LITERAL, pattern[index + 1]))
            index += 2
            continue
        if char in "[]":
            return None
        if char == "/":
            segments.append([])
        else:
            segments[-1].append((char if char in "*?" else _LITERAL, char))
        index += 1
    return segments


def _compile_pattern(pattern: str) -> _Matcher | None:
    if not pattern or len(pattern) > MAX_PATTERN_CHARS or pattern.startswith(("!", "\\#")):
        return None
    segments = _scan_pattern(pattern)
    if segments is None:
        return None
    anchored = not segments[0]
    if anchored:
        segments.pop(0)
    tail: _Tail = "subtree"
    if segments and not segments[-1]:
        tail = "directory"
        segments.pop()
    if not segments:
        return None
    anchored = anchored or len(segments) > 1
    if tail == "subtree" and segments[-1] == [("*", "*")]:
        tail = "exact"
    globs: list[_SegmentGlob | None] = []  # None is a whole-segment ``**``
    for items in segments:
        if not items or items in _DOT_SEGMENTS:
            return None
        if items == [("*", "*"), ("*", "*")]:
            if not globs or globs[-1] is not None:
                globs.append(None)
            continue
        globs.append(_compile_segment(items))
    if globs[-1] is None:
        globs[-1] = _ANY_SEGMENT  # a trailing ``**``: one segment, then the subtree
    if not anchored:
        globs.insert(0, None)
    runs: list[list[_SegmentGlob]] = [[]]
    for glob in globs:
        if glob is None:
            runs.append([])
        else:
            runs[-1].append(glob)
    return _Matcher(tuple(runs[0]), tuple(tuple(run) for run in runs[1:]), tail)


def _tokenize(line: str) -> list[str] | None:
    """The line's tokens up to a comment, as written; None for a trailing lone ``\\``."""
    tokens: list[str] = []
    end = 0
    for found in _TOKEN.finditer(line):
        if found.group().startswith("#"):
            return tokens
        tokens.append(found.group())
        end = found.end()
    # Only a lone backslash at the very end is left outside every token.
    return None if "\\" in line[end:] else tokens


def _split_path(path: str) -> tuple[str, ...] | None:
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_CHARS:
        return None
    parts = tuple(path.split("/"))
    if any(part in ("", ".", "..") for part in parts):
        return None
    return parts


def _is_valid_owner(owner: str) -> bool:
    if not isinstance(owner, str):
        return False
    if owner.startswith("@"):
        name = owner[1:]
        return bool(_LOGIN.fullmatch(name) or _TEAM.fullmatch(name))
    return _EMAIL.fullmatch(owner) is not None


@dataclass(frozen=True)
class Rule:
    """One valid line: its pattern and owners as written (no owners is valid)."""

    pattern: str
    owners: tuple[str, ...]
    line: int
    _matcher: _Matcher = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        matcher = _compile_pattern(self.pattern)
        if matcher is None:
            raise ValueError("invalid CODEOWNERS pattern")
        if not all(_is_valid_owner(owner) for owner in self.owners):
            raise ValueError("invalid CODEOWNERS owner")
        object.__setattr__(self, "_matcher", matcher)

    def matches(self, path: str) -> bool:
        """Whether this rule's pattern covers ``path`` (itself or an ancestor directory)."""
        parts = _split_path(path)
        return parts is not None and self._matcher.matches(parts)


@dataclass(frozen=True)
class CodeOwners:
    """A parsed CODEOWNERS file: its valid rules in file order and the skipped lines."""

    rules: tuple[Rule, ...] = ()
    invalid_lines: tuple[int, ...] = ()  # 1-based

    @classmethod
    def parse(cls, text: str) -> CodeOwners:
        """Parse the file's text; bad lines land in ``invalid_lines``, never an error."""
        rules: list[Rule] = []
        invalid: list[int] = []
        for number, raw_line in enumerate(text.split("\n"), start=1):
            tokens = _tokenize(raw_line.removesuffix("\r"))
            if tokens is None:
                invalid.append(number)
                continue
            if not tokens:
                continue
            if len(rules) >= MAX_RULES:
                invalid.append(number)
                continue
            try:
                rules.append(Rule(tokens[0], tuple(tokens[1:]), number))
            except ValueError:
                invalid.append(number)
        return cls(tuple(rules), tuple(invalid))

    def rule_for(self, path: str) -> Rule | None:
        """The last rule matching ``path``, or None."""
        parts = _split_path(path)
        if parts is None:
            return None
        for rule in reversed(self.rules):
            if rule._matcher.matches(parts):
                return rule
        return None

    def owners_of(self, path: str) -> tuple[str, ...]:
        """The owners of the last matching rule; ``()`` when none matches or it lists none."""
        rule = self.rule_for(path)
        return () if rule is None else rule.owners


def find_codeowners(read: Callable[[str], bytes | None]) -> tuple[str, CodeOwners] | None:
    """The first CODEOWNERS file ``read`` returns, in GitHub's order, parsed; None if none.

    ``read(path)`` returns the file's bytes at that repository path, or None when it does
    not exist. A file GitHub would not load (``MAX_CODEOWNERS_BYTES`` or more, or not
    UTF-8) still wins the search, with no rules: GitHub does not fall back to the next.
    """
    for location in CODEOWNERS_LOCATIONS:
        data = read(location)
        if data is None:
            continue
        if len(data) >= MAX_CODEOWNERS_BYTES:
            return location, CodeOwners()
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            return location, CodeOwners()
        return location, CodeOwners.parse(text.removeprefix("\ufeff"))
    return None


def is_owner(
    approver: str,
    owners: Iterable[str],
    *,
    teams: Mapping[str, Collection[str]] = _NO_TEAMS,
) -> bool:
    """Whether ``approver`` (a login, ``@`` optional, or an email) is one of ``owners``.

    Users and emails compare ASCII-case-insensitively; a team ``@org/team`` matches when
    the approver is among ``teams["@org/team"]`` (key ``@`` optional, ASCII case ignored;
    a member list given as a bare string is ignored). A malformed approver, owner or
    member matches nothing. Never raises on malformed input.
    """
    identity = _to_identity(approver)
    if identity is None:
        return False
    if isinstance(owners, str):
        owners = (owners,)
    if not isinstance(owners, Iterable):
        return False
    return any(_is_owner_entry(identity, owner, teams) for owner in owners)


def unowned_paths(
    approver: str,
    paths: Iterable[str],
    codeowners: CodeOwners,
    *,
    teams: Mapping[str, Collection[str]] = _NO_TEAMS,
) -> list[str]:
    """The paths ``approver`` does not own, in input order without repeats.

    A path no rule gives an owner (including one whose last match lists none, and a
    path that is not repository-relative) is owned by nobody, so it is always listed:
    a ``require_codeowners`` check built on this refuses it.
    """
    if isinstance(paths, str):
        paths = (paths,)
    seen: set[str] = set()
    unowned: list[str] = []
    for path in paths:
        if path in seen:
            continue
        seen.add(path)
        if not is_owner(approver, codeowners.owners_of(path), teams=teams):
            unowned.append(path)
    return unowned


def _to_identity(value: object) -> str | None:
    """A login (one leading ``@`` dropped) or email, ASCII-lowercased; None if malformed."""
    if not isinstance(value, str):
        return None
    if value.startswith("@"):
        login = value[1:]
        return login.translate(_ASCII_LOWER) if _LOGIN.fullmatch(login) else None
    if _LOGIN.fullmatch(value) or _EMAIL.fullmatch(value):
        return value.translate(_ASCII_LOWER)
    return None


def _is_owner_entry(identity: str, owner: object, teams: object) -> bool:
    if not isinstance(owner, str):
        return False
    if owner.startswith("@") and _TEAM.fullmatch(owner[1:]):
        return _is_team_member(identity, owner[1:].translate(_ASCII_LOWER), teams)
    return _is_valid_owner(owner) and _to_identity(owner) == identity


def _is_team_member(identity: str, team: str, teams: object) -> bool:
    if not isinstance(teams, Mapping):
        return False
    for key, members in teams.items():
        if not isinstance(key, str) or key.removeprefix("@").translate(_ASCII_LOWER) != team:
            continue
        if isinstance(members, str) or not isinstance(members, Iterable):
            continue
        if any(_to_identity(member) == identity for member in members):
            return True
    return False
