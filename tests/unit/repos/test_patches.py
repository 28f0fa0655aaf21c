"""The names a patch's header lines could give (``named_paths``): a superset of git's; and
the scratch index written without ``update-index`` (``write_plain_index``): its very bytes."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from nexus_mcp.repos.patches import (
    MAX_NAMED_PATHS,
    Entry,
    index_info,
    moves_paths,
    named_paths,
    names_of_numstat,
    write_plain_index,
)
from tests.support.git_repos import ENV, GIT, git


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


# --- the scratch index written by hand ------------------------------------------------------


def index_of_git(tmp_path: Path, repo: Path, entries: Mapping[bytes, Entry]) -> bytes:
    index = tmp_path / "git-index"
    subprocess.run(
        [GIT, "-C", str(repo), "update-index", "-z", "--index-info"],
        input=index_info(entries),
        env={**ENV, "GIT_INDEX_FILE": str(index)},
        check=True,
    )
    return index.read_bytes()


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_a_plain_index_is_the_very_bytes_update_index_writes(
    tmp_path: Path, object_format: str
) -> None:
    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", f"--object-format={object_format}", str(repo))
    blob = git(repo, "hash-object", "-w", "--stdin", stdin=b"x\n").strip().encode()
    names = [b"README.md", b"src/x.py", b"src-a/y", b"src/a", b".github/w.yml", b"a" * 300]
    entries = {name: (b"100644", b"blob", blob) for name in names}
    entries[b"bin/run.sh"] = (b"100755", b"blob", blob)
    mine = tmp_path / "index"
    assert write_plain_index(entries, mine)
    assert mine.read_bytes() == index_of_git(tmp_path, repo, entries)


@pytest.mark.parametrize(
    ("path", "entry"),
    [
        (b".git/config", None),
        (b"a/.GIT./b", None),
        (b"a/../b", None),
        (b"./b", None),
        (b"a//b", None),
        (b"git~1/b", None),
        (b"a b", None),
        ("\u00e9".encode(), None),
        (b"a\\b", None),
        (b"x" * 0xFFF, None),
        (b"link", (b"120000", b"blob")),
        (b"module", (b"160000", b"commit")),
        (b"dir", (b"040000", b"tree")),
        (b"a", (b"100644", b"blob")),  # beside a/b: a file and a folder of one name
    ],
)
def test_anything_but_plain_files_with_plain_names_is_left_to_git(
    tmp_path: Path, path: bytes, entry: tuple[bytes, bytes] | None
) -> None:
    sha = b"a" * 40
    mode, kind = entry or (b"100644", b"blob")
    entries = {b"a/b": (b"100644", b"blob", sha), path: (mode, kind, sha)}
    assert not write_plain_index(entries, tmp_path / "index")
    assert not (tmp_path / "index").exists()


def test_object_ids_of_two_lengths_or_not_hex_are_left_to_git(tmp_path: Path) -> None:
    mixed = {b"a": (b"100644", b"blob", b"a" * 40), b"b": (b"100644", b"blob", b"b" * 64)}
    upper = {b"a": (b"100644", b"blob", b"A" * 40)}
    assert not write_plain_index(mixed, tmp_path / "index")
    assert not write_plain_index(upper, tmp_path / "index")
    assert not write_plain_index({}, tmp_path / "index")
