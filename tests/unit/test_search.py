"""Glob translation, binary detection and workload caps."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from nexus_mcp.errors import Code, InvalidInputError, NexusError
from nexus_mcp.settings import SearchSettings
from nexus_mcp.workspace.files import Workspace
from nexus_mcp.workspace.paths import TreeFile
from nexus_mcp.workspace.search import (
    MAX_GLOB_CHARS,
    ScanBudget,
    bounded,
    compile_glob,
    compile_matcher,
    is_binary,
)

BOUNDED_WAIT_SECONDS = 30.0


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("*.md", "a.md", True),
        ("*.md", "x/a.md", False),
        ("**/*.md", "a.md", True),
        ("**/*.md", "x/y/a.md", True),
        ("x/**", "x/y/z", True),
        ("?.py", "a.py", True),
        ("?.py", "ab.py", False),
        ("[ab].txt", "b.txt", True),
        ("[!ab].txt", "b.txt", False),
        ("a+b(c).txt", "a+b(c).txt", True),
    ],
)
def test_glob_semantics(pattern: str, path: str, matches: bool) -> None:
    assert bool(compile_glob(pattern).match(path)) is matches


@pytest.mark.parametrize("pattern", ["", "/abs/*", "../*", "a/../b", "x\x00"])
def test_glob_refuses_patterns_that_leave_the_folder(pattern: str) -> None:
    with pytest.raises(NexusError) as info:
        compile_glob(pattern)
    assert info.value.code == Code.INVALID_INPUT


def test_matcher_refuses_bad_regex_and_long_patterns() -> None:
    caps = SearchSettings(max_pattern_length=8)
    for pattern, regex in (("(", True), ("x" * 9, False), ("", False)):
        with pytest.raises(NexusError):
            compile_matcher(pattern, regex=regex, case_sensitive=True, caps=caps)
    assert compile_matcher("a.b", regex=False, case_sensitive=True, caps=caps).search("a.b")
    assert not compile_matcher("a.b", regex=False, case_sensitive=True, caps=caps).search("axb")


@pytest.mark.parametrize(
    ("sample", "binary"),
    [
        (b"plain text\n", False),
        (b"\x00\x01", True),
        (b"\xff\xfe\xfa" * 10, True),
        ("héllo".encode()[:2], False),
    ],
)
def test_binary_detection(sample: bytes, binary: bool) -> None:
    assert is_binary(sample) is binary


def test_walk_stops_at_the_files_scanned_cap_and_says_so(tmp_path: Path) -> None:
    for i in range(10):
        (tmp_path / f"f{i}.txt").write_text("x")
    budget = ScanBudget(SearchSettings(max_files_scanned=3))
    assert len(walk(tmp_path, budget)) == 3
    assert budget.cut_by == ["max_files_scanned"]


def test_walk_never_follows_symlinks(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "out"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("s")
    (root / "link").symlink_to(outside)
    (root / "file-link").symlink_to(outside / "secret.txt")
    (root / "ok.txt").write_text("ok")
    found = [f.relative for f in walk(root, ScanBudget(SearchSettings()))]
    assert found == ["ok.txt"]


def walk(root: Path, budget: ScanBudget) -> list[TreeFile]:
    workspace = Workspace(root)
    with workspace.open_dir(workspace.resolve(".")) as (fd, base):
        return list(bounded(workspace.walk_files(fd, base), budget))


# -- globs without backtracking ------------------------------------------------------------


def reference_glob(pattern: str) -> re.Pattern[str]:
    """The glob as the backtracking regex it used to be translated to (same semantics)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


GLOB_PIECES = ["a", "b", ".", "/", "*", "**", "**/", "?", "[ab]", "[!a]", "[a-c]"]
PATH_PIECES = ["a", "b", "c", ".", "/", "ab", "x.md"]


@given(
    st.lists(st.sampled_from(GLOB_PIECES), min_size=1, max_size=7).map("".join),
    st.lists(st.sampled_from(PATH_PIECES), max_size=9).map("".join),
)
def test_a_glob_matches_exactly_what_its_regex_translation_matches(pattern: str, path: str) -> None:
    assume(not pattern.startswith("/") and ".." not in pattern.split("/"))
    try:
        expected = bool(reference_glob(pattern).match(path))
    except re.error:
        with pytest.raises(NexusError):
            compile_glob(pattern)
        return
    assert compile_glob(pattern).match(path) is expected


DEEP_PATH = "a/" * 200 + "a" * 250
LONG_NAME = "a" * 250
# Globs a backtracking regex engine takes exponential or high-polynomial time on, each
# with a path it fails on only at the end (the worst case) and a path it matches.
CATASTROPHIC_GLOBS = [
    ("**/" * 40 + "b", DEEP_PATH, "a/" * 200 + "b"),  # nested (?:.*/)? groups
    ("*a" * 40 + "b", LONG_NAME, "a" * 60 + "b"),  # [^/]*a forty times over
    ("**" * 200 + "b", DEEP_PATH, DEEP_PATH + "b"),
    ("**/*a*a*a*a*a*a*a*a*b", DEEP_PATH, DEEP_PATH + "b"),
    ("**/" * 10 + "*a" * 20 + "[!a]", DEEP_PATH, DEEP_PATH + "c"),
]


@pytest.mark.parametrize(
    ("pattern", "missed", "matched"), CATASTROPHIC_GLOBS, ids=range(len(CATASTROPHIC_GLOBS))
)
def test_globs_that_make_a_regex_engine_backtrack_for_ever_answer_at_once(
    pattern: str, missed: str, matched: str
) -> None:
    answers: list[bool] = []
    glob = compile_glob(pattern)
    worker = threading.Thread(
        target=lambda: answers.extend([glob.match(missed), glob.match(matched)]), daemon=True
    )
    worker.start()
    worker.join(BOUNDED_WAIT_SECONDS)  # a bound on a hang, not a timing claim
    assert answers == [False, True]


def test_a_glob_too_long_or_malformed_names_the_argument_it_came_in() -> None:
    for pattern in ("x" * (MAX_GLOB_CHARS + 1), "../x", "[z-a]", "a\x00"):
        with pytest.raises(InvalidInputError) as info:
            compile_glob(pattern, field="glob")
        assert info.value.facts["field"] == "glob"
    assert compile_glob("x" * MAX_GLOB_CHARS).match("x" * MAX_GLOB_CHARS)


@pytest.mark.parametrize(
    "pattern",
    ["a{4294967296}", "x{99999999999999999999}", "(" * 600 + "a" + ")" * 600, "(?P<a>x)(?P=b)"],
    ids=["repeat-count", "repeat-count-huge", "nesting", "bad-group"],
)
def test_a_regex_the_engine_cannot_compile_is_invalid_input(pattern: str) -> None:
    caps = SearchSettings(max_pattern_length=2000)
    with pytest.raises(InvalidInputError) as info:
        compile_matcher(pattern, regex=True, case_sensitive=True, caps=caps)
    assert info.value.code == Code.INVALID_INPUT
