"""Glob translation, binary detection and workload caps."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexus_mcp.errors import Code, NexusError
from nexus_mcp.search import ScanBudget, bounded, compile_glob, compile_matcher, is_binary
from nexus_mcp.workspace import TreeFile, Workspace
from nexus_mcp.settings import SearchSettings


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
