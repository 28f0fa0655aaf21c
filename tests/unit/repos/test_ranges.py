"""``repos/ranges.py`` on real repositories: what a published range holds, and its bounds.

The end-to-end tests (``tests/e2e/test_repo_hostile_publish.py``) drive the tools; these
measure ranges directly: a long history is cut at ``MAX_PUBLISHED_COMMITS`` (made in one
``git fast-import``, so the test stays fast), an evil merge is seen through ``-c``, a
clean merge is not, and measuring writes nothing to the repository.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nexus_mcp.errors import ConflictError
from nexus_mcp.policy.repos import (
    RULE_PATH_DISALLOWED,
    RULE_RANGE_TOO_LARGE,
    RepositoryConfig,
    WritePolicy,
    publish_risks,
)
from nexus_mcp.repos.git import find_git
from nexus_mcp.repos.ranges import MAX_PUBLISHED_COMMITS, analyze_range
from nexus_mcp.repos.repository import (
    REASON_UNSAFE_REPOSITORY,
    Repository,
    RunnerFactory,
    open_repository,
)
from tests.support.git_repos import git, make_repo, plumb_commit, rev, state

FILE = "100644"
POLICY = WritePolicy()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", {"README.md": "# r\n", "src/a.py": "a = 1\n"})


@pytest.fixture
def repository(repo: Path) -> Iterator[Repository]:
    factory = RunnerFactory(git=find_git(), timeout_seconds=20, max_output_bytes=16 * 1024 * 1024)
    opened = open_repository("r", RepositoryConfig(path=repo), factory)
    yield opened
    opened.close()


def long_history(repo: Path, count: int) -> str:
    """``count`` commits on top of main, each changing src/a.py, made by one fast-import."""
    stream = []
    for number in range(1, count + 1):
        data = f"a = {number}\n".encode()
        stream.append(
            b"commit refs/heads/long\n"
            b"committer T <t@example.com> 1700000000 +0000\n"
            b"data 1\nx\n"
            + (b"from refs/heads/main\n" if number == 1 else b"")
            + b"M 100644 inline src/a.py\n"
            b"data " + str(len(data)).encode() + b"\n" + data + b"\n"
        )
    git(repo, "fast-import", "--quiet", stdin=b"".join(stream))
    return rev(repo, "long")


def risks(repository: Repository, head: str, target: str | None) -> list[str]:
    measured = analyze_range(repository, head, target, max_diff_bytes=POLICY.max_diff_size)
    found = publish_risks(
        POLICY, measured.facts, history=measured.history, too_large=measured.too_large
    )
    return [risk.rule for risk in found]


def test_a_range_past_the_commit_bound_is_refused_whole(repo: Path, repository: Repository) -> None:
    tip = long_history(repo, MAX_PUBLISHED_COMMITS + 1)
    main = rev(repo, "main")
    at_bound = analyze_range(repository, rev(repo, "long~1"), main, max_diff_bytes=10_000)
    past = analyze_range(repository, tip, main, max_diff_bytes=10_000)
    assert (at_bound.commits, at_bound.too_large) == (MAX_PUBLISHED_COMMITS, False)
    assert past.too_large is True
    assert risks(repository, tip, main) == [RULE_RANGE_TOO_LARGE]


def test_an_evil_merge_is_seen_and_a_clean_merge_is_not(repo: Path, repository: Repository) -> None:
    main = rev(repo, "main")
    side = plumb_commit(repo, [main], {"src/b.py": (FILE, "b = 1\n")})
    clean = plumb_commit(repo, [main, side], {}, base=side)
    evil = plumb_commit(
        repo, [main, side], {".github/workflows/x.yml": (FILE, "on: push\n")}, base=side
    )
    reverted = plumb_commit(repo, [evil], {".github/workflows/x.yml": None})
    before = state(repo)
    assert risks(repository, clean, main) == []
    assert risks(repository, reverted, main) == [RULE_PATH_DISALLOWED]
    measured = analyze_range(repository, reverted, main, max_diff_bytes=10_000)
    # Tree to tree the workflow is gone; the merge's own content still counts.
    assert measured.facts.changed_paths == ("src/b.py",)
    assert ".github/workflows/x.yml" in measured.history.changed_paths
    assert state(repo) == before  # measuring wrote nothing, not even an object


def test_the_diff_size_is_read_at_most_one_byte_past_the_bound(
    repo: Path, repository: Repository
) -> None:
    main = rev(repo, "main")
    big = plumb_commit(repo, [main], {"src/big.py": (FILE, "x = 1\n" * 5000)})
    measured = analyze_range(repository, big, main, max_diff_bytes=100)
    assert measured.facts.diff_bytes == 101
    small = analyze_range(repository, big, main, max_diff_bytes=1_000_000)
    assert 30_000 < small.facts.diff_bytes < 40_000


def test_an_unrelated_history_is_judged_whole(repo: Path, repository: Repository) -> None:
    orphan = plumb_commit(repo, [], {"src/a.py": (FILE, "a = 2\n")})
    measured = analyze_range(repository, orphan, rev(repo, "main"), max_diff_bytes=10_000)
    assert measured.base is None
    assert measured.facts.changed_paths == ("src/a.py",)
    assert git(repo, "cat-file", "-t", orphan).strip() == "commit"


def hidden_workflow(repo: Path) -> tuple[str, str, str]:
    """main -> added (a workflow) -> removed (it goes, src/a.py changes): what a push of
    ``removed`` sends holds the workflow, the tree-to-tree change does not."""
    main = rev(repo, "main")
    added = plumb_commit(repo, [main], {".github/workflows/x.yml": (FILE, "on: push\n")})
    removed = plumb_commit(
        repo, [added], {".github/workflows/x.yml": None, "src/a.py": (FILE, "a = 2\n")}
    )
    return main, added, removed


@pytest.mark.parametrize(
    "how",
    ["grafts", "grafts-skip-to-main", "shallow", "shallow-and-merge-back"],
)
def test_grafts_and_shallow_files_hide_no_commit_of_a_range(
    repo: Path, repository: Repository, how: str
) -> None:
    # Whoever writes .git can rewrite parents without replace refs: ``info/grafts`` (which
    # GIT_NO_REPLACE_OBJECTS does not turn off) or a ``shallow`` file. The push runs from
    # a scratch repository that reads neither, so it sends the true parents: the judge
    # must walk those too.
    main, added, removed = hidden_workflow(repo)
    head = removed
    git_dir = repo / ".git"
    if how == "grafts":
        (git_dir / "info").mkdir(exist_ok=True)
        (git_dir / "info" / "grafts").write_text(f"{removed} {main}\n")
    elif how == "grafts-skip-to-main":
        (git_dir / "info").mkdir(exist_ok=True)
        (git_dir / "info" / "grafts").write_text(f"{added} {main}\n{removed} {main}\n")
    elif how == "shallow":
        (git_dir / "shallow").write_text(f"{removed}\n{main}\n")
    else:
        head = plumb_commit(repo, [removed, main], {}, base=removed, message="merge back")
        (git_dir / "shallow").write_text(f"{removed}\n")
    measured = analyze_range(repository, head, main, max_diff_bytes=10_000)
    assert ".github/workflows/x.yml" in measured.history.changed_paths
    assert RULE_PATH_DISALLOWED in risks(repository, head, main)
    assert measured.base == main


def forge_commit_graph(
    repo: Path, commit: str, *, parent: str | None = None, tree: str | None = None
) -> None:
    """Write the repository's commit-graph, then rewrite ``commit``'s entry in it: its
    first parent and/or its root tree (git trusts the file's CDAT chunk over the commit
    object, and does not check the file's checksum when it reads it)."""
    git(repo, "commit-graph", "write", "--reachable")
    path = repo / ".git" / "objects" / "info" / "commit-graph"
    data = bytearray(path.read_bytes())
    assert data[:4] == b"CGPH"
    chunks = {}
    for number in range(data[6] + 1):
        at = 8 + 12 * number
        chunks[bytes(data[at : at + 4])] = int.from_bytes(data[at + 4 : at + 12], "big")
    oids_at, cdat_at = chunks[b"OIDL"], chunks[b"CDAT"]
    count = (cdat_at - oids_at) // 20
    oids = [bytes(data[oids_at + 20 * i : oids_at + 20 * i + 20]).hex() for i in range(count)]
    entry = cdat_at + 36 * oids.index(commit)
    if tree is not None:
        data[entry : entry + 20] = bytes.fromhex(tree)
    if parent is not None:
        data[entry + 20 : entry + 24] = oids.index(parent).to_bytes(4, "big")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("lie", ["parent", "tree", "both"])
def test_a_forged_commit_graph_hides_nothing_of_a_range(
    repo: Path, repository: Repository, lie: str
) -> None:
    # The commit-graph is a cache in the object store's own files, so whoever writes .git
    # can make it say another parent (a commit skipped by the walk) or another tree (the
    # tree-to-tree change made empty) for a commit the push sends as it really is.
    main, added, removed = hidden_workflow(repo)
    tip = plumb_commit(repo, [removed], {"src/c.py": (FILE, "c = 1\n")})
    git(repo, "branch", "tip", tip)  # the commit-graph is written for commits of refs
    if lie in ("parent", "both"):
        forge_commit_graph(
            repo,
            tip,
            parent=main,
            tree=git(repo, "rev-parse", f"{main}^{{tree}}").strip() if lie == "both" else None,
        )
    else:
        forge_commit_graph(repo, added, tree=git(repo, "rev-parse", f"{main}^{{tree}}").strip())
    measured = analyze_range(repository, tip, main, max_diff_bytes=10_000)
    assert ".github/workflows/x.yml" in measured.paths
    assert RULE_PATH_DISALLOWED in risks(repository, tip, main)


def forge_pack_index(repo: Path, *swaps: tuple[str, str]) -> None:
    """Pack every object of the repository's refs into one pack, then swap, in its ``.idx``
    (version 2: header, fanout, sorted ids, CRCs, 4-byte offsets), the offsets of each pair
    of objects: git then reads one object's content under the other's id. Nothing is
    recomputed: git checks neither the index's checksum nor an object's hash on a read."""
    git(repo, "repack", "-a", "-d", "-q")
    (index,) = (repo / ".git" / "objects" / "pack").glob("*.idx")
    data = bytearray(index.read_bytes())
    assert data[:8] == b"\xfftOc\x00\x00\x00\x02"
    count = int.from_bytes(data[8 + 255 * 4 : 8 + 256 * 4], "big")
    ids = [bytes(data[1032 + 20 * i : 1052 + 20 * i]).hex() for i in range(count)]
    offsets = 1032 + 24 * count
    for one, other in swaps:
        a, b = offsets + 4 * ids.index(one), offsets + 4 * ids.index(other)
        data[a : a + 4], data[b : b + 4] = data[b : b + 4], data[a : a + 4]
    index.chmod(0o644)
    index.write_bytes(bytes(data))


def forged(repo: Path, lie: str) -> tuple[str, str]:
    """A range (head, target) that holds a workflow, and a forged pack index that hides it
    from a reader that trusts git's object lookup (the push, from a scratch repository
    fed real objects, would send it). Each decoy sits on a ref so that it is packed."""
    main, added, removed = hidden_workflow(repo)
    workflow = {".github/workflows/x.yml": (FILE, "on: push\n")}
    if lie == "commit":
        # A commit inside the range read as a harmless sibling: the walk and the
        # per-commit diff see the sibling's parent and tree, never the workflow.
        decoy = plumb_commit(repo, [main], {"src/a.py": (FILE, "a = 3\n")})
        git(repo, "branch", "decoy", decoy)
        git(repo, "branch", "head", removed)
        forge_pack_index(repo, (added, decoy))
        return removed, main
    if lie == "loose":
        # No pack at all: a loose object's file holding another object's (compressed)
        # content; git does not hash a loose object it reads either.
        decoy = plumb_commit(repo, [main], {"src/a.py": (FILE, "a = 3\n")})
        objects = repo / ".git" / "objects"
        hidden = objects / added[:2] / added[2:]
        hidden.chmod(0o644)
        hidden.write_bytes((objects / decoy[:2] / decoy[2:]).read_bytes())
        return removed, main
    if lie == "head":
        # The head commit itself read as another commit (the tip of the range).
        tip = plumb_commit(repo, [main], workflow)
        decoy = plumb_commit(repo, [main], {"src/a.py": (FILE, "a = 3\n")})
        git(repo, "branch", "decoy", decoy)
        git(repo, "branch", "head", tip)
        forge_pack_index(repo, (tip, decoy))
        return tip, main
    if lie == "subtree":
        # A tree below the head's root read as a harmless one: .github holds no workflow.
        tip = plumb_commit(repo, [main], workflow)
        decoy = plumb_commit(repo, [main], {".github/dependabot.yml": (FILE, "v: 2\n")})
        git(repo, "branch", "decoy", decoy)
        git(repo, "branch", "head", tip)
        forge_pack_index(repo, (rev(repo, f"{tip}:.github"), rev(repo, f"{decoy}:.github")))
        return tip, main
    if lie == "target-history":
        # A commit of the target's history read as a child of ``removed``: the merge-base
        # becomes ``removed`` (a true commit, hashed fine), and the range is the tip alone.
        tip = plumb_commit(repo, [removed], {"src/c.py": (FILE, "c = 1\n")})
        first = plumb_commit(repo, [main], {"src/m.py": (FILE, "m = 1\n")})
        target = plumb_commit(repo, [first], {"src/m.py": (FILE, "m = 2\n")})
        decoy = plumb_commit(repo, [removed], {"src/d.py": (FILE, "d = 1\n")})
        for name, sha in (("head", tip), ("target", target), ("decoy", decoy)):
            git(repo, "branch", name, sha)
        forge_pack_index(repo, (first, decoy))
        return tip, target
    # lie == "base-tree": the merge-base's root tree read as one that already holds the
    # workflow (and one more file), so the change and the commit add nothing disallowed.
    tip = plumb_commit(repo, [main], workflow)
    decoy = plumb_commit(repo, [main], {**workflow, "src/z.py": (FILE, "z = 1\n")})
    git(repo, "branch", "decoy", decoy)
    git(repo, "branch", "head", tip)
    forge_pack_index(repo, (rev(repo, f"{main}^{{tree}}"), rev(repo, f"{decoy}^{{tree}}")))
    return tip, main


@pytest.mark.parametrize(
    "lie", ["commit", "loose", "head", "subtree", "base-tree", "target-history"]
)
def test_a_forged_object_lookup_is_refused_not_read(
    repo: Path, repository: Repository, lie: str
) -> None:
    head, target = forged(repo, lie)
    before = state(repo)
    with pytest.raises(ConflictError) as refused:
        analyze_range(repository, head, target, max_diff_bytes=10_000)
    assert refused.value.facts["reason"] == REASON_UNSAFE_REPOSITORY
    message = str(refused.value)
    assert head not in message and target not in message and ".github" not in message
    assert state(repo) == before


def test_an_honest_packed_range_is_measured_as_before(repo: Path, repository: Repository) -> None:
    main, _added, removed = hidden_workflow(repo)
    git(repo, "branch", "head", removed)
    git(repo, "repack", "-a", "-d", "-q")
    assert RULE_PATH_DISALLOWED in risks(repository, removed, main)


def test_an_honest_edge_deep_in_the_target_is_proven(repo: Path, repository: Repository) -> None:
    # The range's edge: the merge-base, and an older commit of the target merged in long
    # ago (an ancestor of the merge-base): both are proven by walking the target's side.
    main = rev(repo, "main")
    older = plumb_commit(repo, [main], {"src/m.py": (FILE, "m = 1\n")})
    newer = plumb_commit(repo, [older], {"src/m.py": (FILE, "m = 2\n")})
    side = plumb_commit(repo, [main], {"src/s.py": (FILE, "s = 1\n")})
    merged_old = plumb_commit(repo, [side, older], {}, base=side)
    tip = plumb_commit(repo, [merged_old, newer], {"src/t.py": (FILE, "t = 1\n")}, base=newer)
    target = plumb_commit(repo, [newer], {"src/m.py": (FILE, "m = 3\n")})
    git(repo, "branch", "head", tip)
    git(repo, "branch", "target", target)
    git(repo, "repack", "-a", "-d", "-q")
    measured = analyze_range(repository, tip, target, max_diff_bytes=10_000)
    assert (measured.base, measured.commits, measured.too_large) == (newer, 3, False)
    behind = analyze_range(repository, older, target, max_diff_bytes=10_000)  # an ancestor
    assert (behind.base, behind.commits, behind.paths) == (older, 0, ())
