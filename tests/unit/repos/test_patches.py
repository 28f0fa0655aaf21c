"""The names a patch's header lines could give (``named_paths``): a superset of git's."""

from __future__ import annotations

import pytest

from nexus_mcp.repos.patches import MAX_NAMED_PATHS, moves_paths, named_paths, names_of_numstat


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (b"diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n", {b"x.py"}),
        (b"diff --git a/e b/e\nnew file mode 100644\n", {b"e"}),  # header only
        (b"diff --git a/o b/n\nrename from o\nrename to n\n", {b"o", b"n"}),
        (b"diff --git a/o b/n\ncopy from d/o\ncopy to d/n\n", {b"d/o", b"d/n"}),
        (b'diff --git "a/\\303\\251 x" "b/\\303\\251 x"\n', {"\u00e9 x".encode()}),
        (b"--- a/d//f.c\t2020-01-01 10:00:00\n+++ b/d/f.c\n", {b"d/f.c"}),
        (b"--- /dev/null\n+++ f.c\n", {b"f.c"}),  # no slash: git guesses -p0
        (b"--- a/f c\n+++ b/f c\n", {b"f c", b"f"}),  # a name with a space, or one cut there
    ],
)
def test_every_name_git_could_read_is_among_the_names(patch: bytes, expected: set[bytes]) -> None:
    names = named_paths(patch)
    assert names is not None and expected <= names


def test_dev_null_names_nothing() -> None:
    assert named_paths(b"--- /dev/null\n+++ b/x\n") == {b"x"}
    assert named_paths(b"--- a/x\n+++ /dev/null\t2020-01-01\n") == {b"x"}


def test_no_names_or_too_many_is_none() -> None:
    assert named_paths(b"no patch here\n") is None
    many = b"".join(b"--- a/f%d\n" % number for number in range(MAX_NAMED_PATHS + 1))
    assert named_paths(many) is None


def test_a_name_with_a_nul_or_an_absolute_name_is_left_out() -> None:
    assert named_paths(b"--- a/ok\n+++ /abs/x\n") == {b"ok", b"abs/x"}
    assert named_paths(b"rename from /abs\nrename to ok\n") == {b"ok"}


def test_rename_and_copy_sources_are_told_apart() -> None:
    assert moves_paths(b"diff --git a/o b/n\nrename from o\nrename to n\n")
    assert moves_paths(b"copy from o\n")
    assert not moves_paths(b"diff --git a/o b/o\n--- a/o\n+++ b/o\n")


def test_numstat_names_are_read_whole() -> None:
    assert names_of_numstat(b"1\t2\ta b\x000\t0\tc\x00") == {b"a b", b"c"}
    assert names_of_numstat(b"garbage\x00") is None
