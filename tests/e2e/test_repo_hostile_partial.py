"""Patches aimed at the partial scratch index (``repos/patches.py``), judged as on the whole tree.

``analyze_patch`` applies a patch to an index holding only the entries it reaches: the
named paths, the first parent of each that is not a folder, and (by handing it to the
whole-tree index) whatever is below a named folder. A check git makes against an entry
left out would pass where the whole tree refuses. So each patch here aims at one: a new
path under a file, a link or a submodule; a new file over a folder; a rename into a
folder; a removal of a path that does not exist; a change to a submodule or a link;
modes that do not match; names written the way only git reads them. Each one is measured
twice, on the partial index and with the whole-tree index forced, and must be measured
alike; then ``apply_patch`` must refuse it with the very code the whole-tree index gives,
and leave the repository unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.repos import repository as repository_module
from nexus_mcp.repos.repository import PatchAnalysis, Repository
from tests.support.git_repos import git, plumb_commit, rev, state

from .repo_harness import Builder, approved, build, call, code_of, commit_directly, project

__all__ = ["build", "project"]  # fixtures, re-exported for pytest

BRANCH = "feature/partial"
SUBMODULE_AT = "2" * 40
# The branch tip: a file, a folder, a link, a submodule and an executable, all under src/
# (whose owner approves the writes, so that only git's checks can refuse them).
ENTRIES: dict[str, tuple[str, str | bytes] | None] = {
    "src/plain.txt": ("100644", "plain\n"),
    "src/dir/inner.txt": ("100644", "inner\n"),
    "src/link": ("120000", "plain.txt"),
    "src/sub": ("160000", SUBMODULE_AT),
    "src/tool.sh": ("100755", "echo tool\n"),
}


def new_file(path: str, text: str = "new\n", *, mode: str = "100644") -> str:
    return (
        f"diff --git a/{path} b/{path}\nnew file mode {mode}\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1 @@\n+{text}"
    )


def deleted(path: str, text: str, *, mode: str = "100644") -> str:
    return (
        f"diff --git a/{path} b/{path}\ndeleted file mode {mode}\n--- a/{path}\n+++ /dev/null\n"
        f"@@ -1 +0,0 @@\n-{text}"
    )


CASES: dict[str, tuple[str, str]] = {
    # name: (patch, which index decides: "partial" or "whole"); git refuses every one
    "new-path-under-a-file": (new_file("src/plain.txt/x"), "partial"),
    "new-path-deep-under-a-file": (new_file("src/plain.txt/a/b/c"), "partial"),
    "new-path-beyond-a-link": (new_file("src/link/x"), "partial"),
    "new-path-inside-a-submodule": (new_file("src/sub/x"), "partial"),
    "new-file-over-a-folder": (new_file("src/dir"), "whole"),
    "new-file-over-an-existing-file": (new_file("src/plain.txt"), "partial"),
    "new-link-over-an-existing-file": (new_file("src/plain.txt", mode="120000"), "partial"),
    "rename-into-an-existing-folder": (
        "diff --git a/src/plain.txt b/src/dir\nsimilarity index 100%\n"
        "rename from src/plain.txt\nrename to src/dir\n",
        "whole",
    ),
    "rename-onto-an-existing-file": (
        "diff --git a/src/tool.sh b/src/plain.txt\nsimilarity index 100%\n"
        "rename from src/tool.sh\nrename to src/plain.txt\n",
        "whole",  # a failing rename: its source is a name --numstat does not report
    ),
    "rename-from-a-path-that-does-not-exist": (
        "diff --git a/src/gone.txt b/src/new.txt\nsimilarity index 100%\n"
        "rename from src/gone.txt\nrename to src/new.txt\n",
        "whole",  # a failing rename: its source is a name --numstat does not report
    ),
    "delete-a-path-that-does-not-exist": (deleted("src/missing.txt", "x\n"), "partial"),
    "delete-a-folder-as-a-file": (deleted("src/dir", "inner\n"), "whole"),
    "change-a-submodule-from-the-wrong-commit": (
        "diff --git a/src/sub b/src/sub\nindex 3333333..4444444 160000\n--- a/src/sub\n"
        f"+++ b/src/sub\n@@ -1 +1 @@\n-Subproject commit {'3' * 40}\n"
        f"+Subproject commit {'4' * 40}\n",
        "partial",
    ),
    "traditional-diff-new-path-under-a-file": (
        "--- /dev/null\n+++ b/src/plain.txt/t\n@@ -0,0 +1 @@\n+new\n",
        "partial",
    ),
    "quoted-name-new-path-under-a-file": (
        'diff --git "a/src/plain.txt/\\303\\251" "b/src/plain.txt/\\303\\251"\n'
        'new file mode 100644\n--- /dev/null\n+++ "b/src/plain.txt/\\303\\251"\n'
        "@@ -0,0 +1 @@\n+new\n",
        "partial",
    ),
    "other-prefixes-new-path-under-a-file": (
        "diff --git x/src/plain.txt/p yy/src/plain.txt/p\nnew file mode 100644\n"
        "--- /dev/null\n+++ yy/src/plain.txt/p\n@@ -0,0 +1 @@\n+new\n",
        "partial",
    ),
}


@pytest.fixture
def tip(project: Path) -> str:
    commit = plumb_commit(project, [rev(project, "main")], ENTRIES, message="partial")
    git(project, "update-ref", f"refs/heads/{BRANCH}", commit)
    return commit


def measure(repository: Repository, tip: str, patch: str) -> tuple[PatchAnalysis, list[str]]:
    """The analysis, and which index decided it."""
    used: list[str] = []
    whole = Repository._analyze

    def spied(self: Repository, *args: Any) -> PatchAnalysis:
        used.append("whole")
        return whole(self, *args)

    with pytest.MonkeyPatch.context() as patcher:
        patcher.setattr(Repository, "_analyze", spied)
        analysis = repository.analyze_patch(tip, patch.encode())
    return analysis, used or ["partial"]


def measure_whole(repository: Repository, tip: str, patch: str) -> PatchAnalysis:
    with pytest.MonkeyPatch.context() as patcher:
        patcher.setattr(repository_module, "apply_partial", lambda *args, **kwargs: None)
        return repository.analyze_patch(tip, patch.encode())


def apply_args(patch: str, key: str) -> dict[str, Any]:
    return {
        "repo": "proj",
        "branch": BRANCH,
        "patch": patch,
        "message": "m",
        "idempotency_key": key,
    }


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_patch_aimed_at_an_entry_left_out_is_refused_as_on_the_whole_tree(
    build: Builder, project: Path, tip: str, case: str
) -> None:
    patch, decider = CASES[case]
    server = build()
    repository = server.runtime.repos.catalog.get("proj")  # type: ignore[union-attr]
    analysis, used = measure(repository, tip, patch)
    whole = measure_whole(repository, tip, patch)
    assert used == [decider]
    assert analysis == whole
    assert analysis.applies is False
    before = state(project)
    async with Client(server.mcp) as client:
        partial_result = await approved(client, server, "apply_patch", apply_args(patch, "k1"))
        with pytest.MonkeyPatch.context() as patcher:
            patcher.setattr(repository_module, "apply_partial", lambda *args, **kwargs: None)
            whole_result = await approved(client, server, "apply_patch", apply_args(patch, "k2"))
        review = await call(
            client, "propose_patch", {"repo": "proj", "branch": BRANCH, "patch": patch}
        )
    assert code_of(partial_result) == code_of(whole_result) == "CONFLICT"
    assert review["structuredContent"]["applies"] is False
    assert "does_not_apply" in {risk["rule"] for risk in review["structuredContent"]["risks"]}
    assert state(project) == before
    assert rev(project, BRANCH) == tip


REPLACEMENTS: dict[str, str] = {
    # A link's target changed by a patch with no mode line: git keeps the link.
    "link-changed-as-text": "diff --git a/src/link b/src/link\n--- a/src/link\n+++ b/src/link\n"
    "@@ -1 +1 @@\n-plain.txt\n\\ No newline at end of file\n+tool.sh\n"
    "\\ No newline at end of file\n",
    # A folder's last file removed and a file made in its place, in one patch.
    "folder-becomes-a-file": deleted("src/dir/inner.txt", "inner\n") + new_file("src/dir"),
    # A file removed and a folder made in its place.
    "file-becomes-a-folder": deleted("src/plain.txt", "plain\n") + new_file("src/plain.txt/x"),
    # A mode line whose old mode is not the file's: git warns and applies (no change).
    "mode-change-from-a-mode-it-does-not-have": (
        "diff --git a/src/plain.txt b/src/plain.txt\nold mode 100755\nnew mode 100644\n"
    ),
    # The executable's mode, as it really is.
    "mode-change": "diff --git a/src/tool.sh b/src/tool.sh\nold mode 100755\nnew mode 100644\n",
    # A rename whose source is not in the patch's other lines.
    "rename": "diff --git a/src/tool.sh b/src/t.sh\nsimilarity index 100%\n"
    "rename from src/tool.sh\nrename to src/t.sh\n",
}


@pytest.mark.parametrize("case", sorted(REPLACEMENTS))
async def test_a_patch_that_applies_is_measured_as_on_the_whole_tree_and_commits_that(
    build: Builder, project: Path, tip: str, case: str
) -> None:
    patch = REPLACEMENTS[case]
    server = build()
    repository = server.runtime.repos.catalog.get("proj")  # type: ignore[union-attr]
    analysis, _used = measure(repository, tip, patch)
    whole = measure_whole(repository, tip, patch)
    assert analysis == whole
    assert analysis.applies is True
    commit = commit_directly(repository, BRANCH, analysis, patch.encode())
    changed = git(project, "diff-tree", "-r", "--no-renames", "--name-only", tip, commit).split()
    assert sorted(changed) == sorted(analysis.facts.changed_paths)
    assert rev(project, BRANCH) == commit


async def test_a_commit_whose_tree_would_differ_from_the_measured_one_is_refused(
    build: Builder, project: Path, tip: str
) -> None:
    patch = new_file("src/fresh.txt")
    other = new_file("src/other.txt")
    server = build()
    repository = server.runtime.repos.catalog.get("proj")  # type: ignore[union-attr]
    analysis, _used = measure(repository, tip, patch)
    with pytest.raises(Exception) as caught:
        commit_directly(repository, BRANCH, analysis, other.encode())
    assert getattr(caught.value, "code", None) == "CONFLICT"
    assert rev(project, BRANCH) == tip
