"""Issue 13 end to end: the repo toolset on real git repositories, through the whole chain.

Each server is built from a real YAML file serving a repository the test made with git;
what a repository holds afterwards is read back with plain git (``tests/support``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.observability.audit import MemoryAuditSink
from tests.support.git_repos import commit, git, make_patch, refs, rev, state, tree_files

from .repo_harness import (
    APPROVER,
    POLICY,
    Builder,
    approved,
    build,
    call,
    code_of,
    commit_directly,
    effect_of,
    envelope,
    finished,
    mint,
    ok,
    project,
)

__all__ = ["build", "project"]  # fixtures

CANARY = "CANARY-repo-7f3a"


def feature_branch(project: Path, name: str = "feature/work") -> str:
    git(project, "branch", name, "main")
    return name


def patch_for(project: Path, tmp_path: Path, files: dict[str, str | bytes | None]) -> str:
    return make_patch(project, "main", files, scratch=tmp_path)


def apply_args(branch: str, patch: str, key: str, message: str = "Change it") -> dict[str, Any]:
    return {
        "repo": "proj",
        "branch": branch,
        "patch": patch,
        "message": message,
        "idempotency_key": key,
    }


# --- reads ------------------------------------------------------------------------------


async def test_reads_see_the_commit_not_the_working_tree(build: Builder, project: Path) -> None:
    (project / "src" / "app.py").write_text(f"uncommitted {CANARY}\n")
    (project / "scratch.txt").write_text("untracked\n")
    server = build()
    async with Client(server.mcp) as client:
        listing = ok(await call(client, "list_repo_files", {"repo": "proj", "path": "src"}))
        read = ok(await call(client, "read_repo_file", {"repo": "proj", "path": "src/app.py"}))
        found = ok(await call(client, "search_content", {"repo": "proj", "pattern": CANARY}))
    assert [e["path"] for e in listing["entries"]] == ["src/app.py", "src/billing", "src/util.ts"]
    assert [e["type"] for e in listing["entries"]] == ["file", "directory", "file"]
    assert read["content"].startswith("def handler(event):")
    assert read["commit_sha"] == rev(project, "HEAD")
    assert found["files"] == []


async def test_read_at_a_ref_and_the_read_document_hash(build: Builder, project: Path) -> None:
    first = rev(project, "HEAD")
    commit(project, {"src/app.py": "changed\n"}, "second")
    server = build()
    async with Client(server.mcp) as client:
        old = await call(
            client, "read_repo_file", {"repo": "proj", "path": "src/app.py", "ref": first}
        )
        new = await call(client, "read_repo_file", {"repo": "proj", "path": "src/app.py"})
    assert ok(old)["content"].startswith("def handler")
    assert ok(new)["content"] == "changed\n"
    hashes = effect_of(new)["document_hashes"]
    assert hashes[0]["pointer"] == "/content" and hashes[0]["hash"] == ok(new)["sha256"]


async def test_search_and_locate_are_bounded_and_find_definitions(
    build: Builder, project: Path
) -> None:
    commit(project, {f"many/f{i}.py": f"x = {i}\nhandler = 1\n" for i in range(30)}, "many")
    server = build(search={"max_files_scanned": 10, "max_results": 5})
    async with Client(server.mcp) as client:
        search = ok(await call(client, "search_content", {"repo": "proj", "pattern": "handler"}))
        regex = ok(
            await call(
                client,
                "search_content",
                {"repo": "proj", "pattern": "^def h\\w+", "regex": True, "path": "src"},
            )
        )
        located = ok(
            await call(
                client, "locate_component", {"repo": "proj", "name": "Widget", "path": "src"}
            )
        )
        by_file = ok(
            await call(
                client, "locate_component", {"repo": "proj", "name": "invoice", "path": "src"}
            )
        )
    assert search["truncated"] and "max_files_scanned" in search["caps_hit"]
    assert search["files_scanned"] == 10
    assert [f["path"] for f in regex["files"]] == ["src/app.py"]
    assert {(m["path"], m["kind"], m["line_number"]) for m in located["matches"]} == {
        ("src/app.py", "definition", 5)
    }
    assert by_file["matches"][0] == {
        "path": "src/billing/invoice.py",
        "kind": "file",
        "line_number": None,
        "text": None,
    }


async def test_links_and_submodules_are_listed_never_followed(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(CANARY)
    (project / "link").symlink_to(outside)
    commit(project, {}, "a link out")
    server = build()
    async with Client(server.mcp) as client:
        listing = ok(await call(client, "list_repo_files", {"repo": "proj"}))
        through = await call(client, "read_repo_file", {"repo": "proj", "path": "link/secret.txt"})
        link = await call(client, "read_repo_file", {"repo": "proj", "path": "link"})
        listed = await call(client, "list_repo_files", {"repo": "proj", "path": "link"})
    assert {"path": "link", "type": "symlink", "size_bytes": None} in listing["entries"]
    assert code_of(through) == "NOT_FOUND"
    assert code_of(link) == "CONFLICT"
    assert code_of(listed) == "CONFLICT"
    for result in (through, link, listed):
        assert CANARY not in str(result) and "secret" not in envelope(result)["error"]


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        ({"repo": "../etc", "path": "README.md"}, "INVALID_INPUT"),
        ({"repo": "proj/..", "path": "README.md"}, "INVALID_INPUT"),
        ({"repo": "..", "path": "README.md"}, "INVALID_INPUT"),
        ({"repo": "other", "path": "README.md"}, "NOT_FOUND"),
        ({"repo": "proj", "path": "../../etc/passwd"}, "INVALID_PATH"),
        ({"repo": "proj", "path": "/etc/passwd"}, "INVALID_PATH"),
        ({"repo": "proj", "path": "missing.txt"}, "NOT_FOUND"),
        ({"repo": "proj", "path": "src"}, "CONFLICT"),
        ({"repo": "proj", "path": "README.md", "ref": "HEAD:src/app.py"}, "INVALID_INPUT"),
        ({"repo": "proj", "path": "README.md", "ref": "--output=/tmp/x"}, "INVALID_INPUT"),
        ({"repo": "proj", "path": "README.md", "ref": "HEAD^{/handler}"}, "INVALID_INPUT"),
        ({"repo": "proj", "path": "README.md", "ref": "no-such-branch"}, "NOT_FOUND"),
    ],
)
async def test_hostile_read_arguments_are_refused_without_echo(
    build: Builder, arguments: dict[str, Any], code: str
) -> None:
    server = build()
    async with Client(server.mcp) as client:
        result = await call(client, "read_repo_file", arguments)
    payload = envelope(result)
    assert payload["code"] == code
    for value in arguments.values():
        if value not in ("proj",):
            assert str(value) not in payload["error"]


# --- propose_patch -------------------------------------------------------------------


async def test_propose_patch_reports_changes_risks_and_owners_and_changes_nothing(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    branch = feature_branch(project)
    patch = patch_for(
        project,
        tmp_path,
        {
            "src/app.py": "def handler(event):\n    return None\n",
            "docs/guide.md": "Guide, revised\n",
            ".github/workflows/ci.yml": "on: [push, pull_request]\n",
            "src/auth/login.py": "x = 1\n",
        },
    )
    before = state(project)
    server = build()
    async with Client(server.mcp) as client:
        result = await call(
            client, "propose_patch", {"repo": "proj", "branch": branch, "patch": patch}
        )
    review = ok(result)
    assert state(project) == before  # no ref, index, object or file changed
    assert review["applies"] is True and review["base_sha"] == rev(project, branch)
    assert review["diff"] == patch
    assert review["summary"]["files_changed"] == 4
    assert {f["path"] for f in review["summary"]["files"]} == {
        "src/app.py",
        "docs/guide.md",
        ".github/workflows/ci.yml",
        "src/auth/login.py",
    }
    rules = {risk["rule"]: risk for risk in review["risks"]}
    assert set(rules["path_disallowed"]["paths"]) == {
        ".github/workflows/ci.yml",
        "src/auth/login.py",
    }
    assert (rules["max_changed_files"]["limit"], rules["max_changed_files"]["actual"]) == (3, 4)
    assert review["codeowners"]["required"] is True
    assert set(review["codeowners"]["owners"]) == {
        "@lead",
        "@bob-approver",
        "@alice",
        "@org/writers",
    }
    # The diff's hash is in the effect: an approver can pin it for apply_patch.
    pointers = {h["pointer"] for h in effect_of(result)["document_hashes"]}
    assert pointers == {"/diff"}


async def test_propose_patch_names_protected_branches_and_patches_that_do_not_apply(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    patch = patch_for(project, tmp_path, {"README.md": "# Other\n"})
    commit(project, {"README.md": "# Moved on\n"}, "conflicting change")
    server = build()
    async with Client(server.mcp) as client:
        review = ok(
            await call(client, "propose_patch", {"repo": "proj", "branch": "main", "patch": patch})
        )
    assert review["applies"] is False
    assert {r["rule"] for r in review["risks"]} >= {"branch_protected", "does_not_apply"}


async def test_propose_patch_owners_follow_the_default_branch_and_missing_tips_are_not_found(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    branch = feature_branch(project)
    patch = patch_for(project, tmp_path, {"docs/guide.md": "Guide, revised\n"})
    # The branch cannot rewrite the rules it is judged by.
    git(project, "checkout", "-q", branch)
    commit(project, {".github/CODEOWNERS": "* @mallory\n"}, "own everything")
    git(project, "checkout", "-q", "main")
    args = {"repo": "proj", "branch": branch, "patch": patch}
    server = build()
    repository = server.runtime.repos.catalog.get("proj")  # type: ignore[union-attr]
    async with Client(server.mcp) as client:
        before = ok(await call(client, "propose_patch", args))
        commit(project, {".github/CODEOWNERS": "* @carol\n"}, "new owners")
        after = ok(await call(client, "propose_patch", args))
        missing = await call(client, "propose_patch", {**args, "branch": "feature/missing"})
        # One git process reads both tips; a missing one leaves each to be asked alone.
        assert repository.branch_and_default_tips(branch) == (
            rev(project, branch),
            rev(project, "main"),
        )
        assert repository.branch_and_default_tips("feature/missing") is None
        git(project, "checkout", "-q", "--detach")
        git(project, "update-ref", "-d", "refs/heads/main")
        assert repository.branch_and_default_tips(branch) is None
        no_default = await call(client, "propose_patch", args)
    assert before["codeowners"]["owners"] == ["@org/writers"]
    assert before["base_sha"] == after["base_sha"] == rev(project, branch)
    assert after["codeowners"]["owners"] == ["@carol"]
    assert code_of(missing) == "NOT_FOUND"
    assert code_of(no_default) == "NOT_FOUND"


# --- create_branch -------------------------------------------------------------------


async def test_create_branch_needs_approval_and_names_its_target(
    build: Builder, project: Path, audit: MemoryAuditSink
) -> None:
    server = build()
    args = {"repo": "proj", "branch": "feature/new", "idempotency_key": "b-1"}
    async with Client(server.mcp) as client:
        unapproved = await call(client, "create_branch", args)
        created = await approved(client, server, "create_branch", args)
        again = await call(client, "create_branch", {**args, "approval_token": "unused"})
    assert code_of(unapproved) == "APPROVAL_REQUIRED"
    assert ok(created) == {
        "repo": "proj",
        "branch": "feature/new",
        "commit_sha": rev(project, "main"),
    }
    assert rev(project, "feature/new") == rev(project, "main")
    assert effect_of(created)["target_ref"] == "refs/heads/feature/new"
    # A retry with the same key replays the record, whatever token it carries.
    assert again["_meta"]["nexus.mcp/idempotent_replay"] is True
    record = next(r for r in finished(audit, "create_branch") if r.get("outcome") == "OK")
    assert record["target_ref"] == "refs/heads/feature/new"
    assert record["side_effects"] is True
    assert record["approver"] == APPROVER and record["host_id"] == "review-console"
    assert record["correlation_id"]


@pytest.mark.parametrize(
    ("branch", "rule_code"),
    [
        ("main", "WRITE_POLICY_DENIED"),
        ("master", "WRITE_POLICY_DENIED"),
        ("release/1.0", "WRITE_POLICY_DENIED"),
        ("hotfix/x", "WRITE_POLICY_DENIED"),
        ("xfeature/x", "WRITE_POLICY_DENIED"),  # patterns are anchored at both ends
        ("feature/../main", "INVALID_INPUT"),
        ("-D", "INVALID_INPUT"),
        ("--upload-pack=x", "INVALID_INPUT"),
        ("feature/x.lock", "INVALID_INPUT"),
        ("feature/x y", "INVALID_INPUT"),
        ("HEAD", "INVALID_INPUT"),
    ],
)
async def test_create_branch_refuses_protected_unlisted_and_malformed_names(
    build: Builder, project: Path, branch: str, rule_code: str
) -> None:
    before = refs(project)
    server = build()
    args = {"repo": "proj", "branch": branch, "idempotency_key": "b-bad"}
    async with Client(server.mcp) as client:
        result = await approved(client, server, "create_branch", args)
    assert code_of(result) == rule_code
    assert branch not in envelope(result)["error"]
    assert refs(project) == before


async def test_create_branch_that_exists_is_a_conflict_and_spends_no_token(
    build: Builder, project: Path
) -> None:
    feature_branch(project, "feature/taken")
    server = build()
    args = {"repo": "proj", "branch": "feature/taken", "idempotency_key": "b-2"}
    token = mint(server, "create_branch", args)
    async with Client(server.mcp) as client:
        first = await call(client, "create_branch", {**args, "approval_token": token})
        git(project, "branch", "-D", "feature/taken")
        second = await call(client, "create_branch", {**args, "approval_token": token})
    assert code_of(first) == "CONFLICT"
    ok(second)  # the refused call did not burn the approval


# --- apply_patch ---------------------------------------------------------------------


async def test_apply_patch_commits_the_measured_tree_and_touches_nothing_else(
    build: Builder, project: Path, tmp_path: Path, audit: MemoryAuditSink
) -> None:
    branch = feature_branch(project)
    tip = rev(project, branch)
    patch = patch_for(project, tmp_path, {"src/app.py": "def handler(event):\n    return 1\n"})
    worktree_before = state(project)["worktree"]
    index_before = state(project)["index"]
    server = build()
    args = apply_args(branch, patch, "p-1", message=f"Return one\n\nBody {CANARY}\n")
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", args)
        replay = await call(client, "apply_patch", {**args, "approval_token": "ignored"})
    applied = ok(result)
    new = rev(project, branch)
    assert applied["commit_sha"] == new and applied["parent_sha"] == tip
    assert (applied["files_changed"], applied["lines_added"], applied["lines_removed"]) == (1, 1, 5)
    assert git(project, "rev-parse", f"{new}^").strip() == tip
    assert tree_files(project, new)["src/app.py"] != tree_files(project, tip)["src/app.py"]
    assert git(project, "show", f"{new}:src/app.py") == "def handler(event):\n    return 1\n"
    log = git(project, "log", "-1", "--format=%an <%ae>|%cn <%ce>|%B", new)
    author, committer, body = log.split("|", 2)
    assert author == "alice <alice@nexus-mcp.invalid>"
    assert committer == f"{APPROVER} <{APPROVER}@nexus-mcp.invalid>"
    assert f"Approved-by: {APPROVER}" in body and "Nexus-Tool-Call: " in body
    # The user's checkout is untouched: HEAD, index and files.
    assert git(project, "symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert state(project)["worktree"] == worktree_before
    assert state(project)["index"] == index_before
    # Retried with the same key: the recorded result, no second commit.
    assert replay["_meta"]["nexus.mcp/idempotent_replay"] is True
    assert ok(replay)["commit_sha"] == new and rev(project, branch) == new
    assert effect_of(result)["target_ref"] == new
    record = next(r for r in finished(audit, "apply_patch") if r.get("outcome") == "OK")
    assert record["target_ref"] == new and record["approver"] == APPROVER
    assert record["document_hashes"][0]["pointer"] == "/patch"


async def test_an_approval_is_bound_to_its_patch_branch_and_repository(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    branch = feature_branch(project)
    other = feature_branch(project, "feature/other")
    patch = patch_for(project, tmp_path, {"src/app.py": "one = 1\n"})
    tampered = patch_for(project, tmp_path, {"src/app.py": "two = 2\n"})
    server = build()
    args = apply_args(branch, patch, "p-2")
    token = mint(server, "apply_patch", args)
    before = refs(project)
    async with Client(server.mcp) as client:
        wrong_patch = await call(
            client, "apply_patch", {**apply_args(branch, tampered, "p-3"), "approval_token": token}
        )
        wrong_branch = await call(
            client, "apply_patch", {**apply_args(other, patch, "p-4"), "approval_token": token}
        )
        assert refs(project) == before
        used = await call(client, "apply_patch", {**args, "approval_token": token})
        # The branch is put back, so the same patch applies again: only the token stops it.
        git(project, "update-ref", f"refs/heads/{branch}", rev(project, "main"))
        replayed = await call(
            client, "apply_patch", {**args, "idempotency_key": "p-5", "approval_token": token}
        )
    assert code_of(wrong_patch) == "APPROVAL_INVALID"
    assert code_of(wrong_branch) == "APPROVAL_INVALID"
    ok(used)
    assert code_of(replayed) == "APPROVAL_REPLAYED"


LIMITS = {**POLICY, "require_codeowners": False}


@pytest.mark.parametrize(
    ("files", "expect"),
    [
        ({f"src/f{i}.py": "x\n" for i in range(3)}, None),  # max_changed_files: at the bound
        ({f"src/f{i}.py": "x\n" for i in range(4)}, "max_changed_files"),
        ({"src/big.py": "x\n" * 20}, None),  # max_changed_lines: at the bound
        ({"src/big.py": "x\n" * 21}, "max_changed_lines"),
    ],
)
async def test_policy_limits_hold_at_their_bound_and_refuse_one_over(
    build: Builder, project: Path, tmp_path: Path, files: dict[str, Any], expect: str | None
) -> None:
    branch = feature_branch(project)
    patch = patch_for(project, tmp_path, files)
    server = build(LIMITS)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", apply_args(branch, patch, "p-l"))
    if expect is None:
        ok(result)
    else:
        assert code_of(result) == "WRITE_POLICY_DENIED"
        assert rev(project, branch) == rev(project, "main")
        assert audit_rule(server) == expect


def audit_rule(server: Any) -> str:
    sink = server.runtime.audit_log.sinks[0]
    record = [r for r in sink.records() if r["event"] == "tool_call_blocked"][-1]
    return str(record["policy_rule"])


async def test_max_diff_size_is_measured_in_bytes_before_git_runs(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    branch = feature_branch(project)
    patch = patch_for(project, tmp_path, {"src/app.py": "y = 1\n"})
    size = len(patch.encode())
    at_bound = build({**LIMITS, "max_diff_size": size})
    over = build({**LIMITS, "max_diff_size": size - 1})
    async with Client(over.mcp) as client:
        refused = await approved(client, over, "apply_patch", apply_args(branch, patch, "p-o"))
    async with Client(at_bound.mcp) as client:
        accepted = await approved(client, at_bound, "apply_patch", apply_args(branch, patch, "p-a"))
    assert code_of(refused) == "WRITE_POLICY_DENIED"
    assert audit_rule(over) == "max_diff_size"
    ok(accepted)


@pytest.mark.parametrize(
    "path",
    [
        ".github/workflows/deploy.yml",
        ".GitHub/Workflows/deploy.yml",
        ".github/WORKFLOWS/deploy.yml",
        ".github/workflows./deploy.yml",
        "src/auth/token.py",
        "SRC/Auth/token.py",
    ],
)
async def test_disallowed_paths_hold_for_case_and_name_variants(
    build: Builder, project: Path, tmp_path: Path, path: str
) -> None:
    branch = feature_branch(project)
    patch = patch_for(project, tmp_path, {path: f"{CANARY}\n"})
    before = state(project)
    server = build(LIMITS)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", apply_args(branch, patch, "p-d"))
    assert code_of(result) == "WRITE_POLICY_DENIED"
    assert CANARY not in str(result) and path not in str(result)
    assert state(project) == before
    assert audit_rule(server) == "path_disallowed"


async def test_a_rename_into_a_disallowed_path_is_refused_on_both_ends(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    branch = feature_branch(project)
    patch = (
        "diff --git a/src/util.ts b/.github/workflows/util.yml\n"
        "similarity index 100%\n"
        "rename from src/util.ts\n"
        "rename to .github/workflows/util.yml\n"
    )
    before = state(project)
    server = build(LIMITS)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", apply_args(branch, patch, "p-r"))
        review = ok(
            await call(client, "propose_patch", {"repo": "proj", "branch": branch, "patch": patch})
        )
    assert code_of(result) == "WRITE_POLICY_DENIED"
    assert state(project) == before
    assert set(review["summary"]["files"][0].values()) >= {".github/workflows/util.yml"}
    disallowed = next(r for r in review["risks"] if r["rule"] == "path_disallowed")
    assert disallowed["paths"] == [".github/workflows/util.yml"]


@pytest.mark.parametrize(
    ("patch", "rule"),
    [
        (
            "diff --git a/evil b/evil\nnew file mode 120000\n--- /dev/null\n+++ b/evil\n"
            "@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n",
            "symlink",
        ),
        (
            "diff --git a/sub b/sub\nnew file mode 160000\nindex 0000000..1111111\n"
            "--- /dev/null\n+++ b/sub\n@@ -0,0 +1 @@\n"
            "+Subproject commit 1111111111111111111111111111111111111111\n",
            "submodule",
        ),
        ("binary", "binary_content"),
    ],
)
async def test_links_submodules_and_binary_content_are_refused(
    build: Builder, project: Path, tmp_path: Path, patch: str, rule: str
) -> None:
    branch = feature_branch(project)
    if patch == "binary":  # a GIT binary patch that git itself applies
        blob = {"blob.bin": bytes(range(256)) * 4}
        patch = make_patch(project, "main", blob, scratch=tmp_path, binary=True)
    before = state(project)
    server = build(LIMITS)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", apply_args(branch, patch, "p-x"))
    code = code_of(result)
    assert code in ("WRITE_POLICY_DENIED", "CONFLICT", "INVALID_INPUT")
    if code == "WRITE_POLICY_DENIED":
        assert audit_rule(server) == rule
    assert state(project) == before


@pytest.mark.parametrize(
    "target",
    ["../outside.txt", "/etc/evil", ".git/config", "sub/.git/hooks/post-commit", ".GIT/config"],
)
async def test_patch_paths_that_escape_or_reach_git_internals_never_land(
    build: Builder, project: Path, target: str
) -> None:
    branch = feature_branch(project)
    patch = (
        f"diff --git a/{target} b/{target}\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/{target}\n@@ -0,0 +1 @@\n+{CANARY}\n"
    )
    before = state(project)
    server = build(LIMITS)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", apply_args(branch, patch, "p-e"))
    assert code_of(result) in ("CONFLICT", "WRITE_POLICY_DENIED")
    assert CANARY not in str(result)
    assert state(project) == before
    assert not (project.parent / "outside.txt").exists()


async def test_writes_to_protected_and_checked_out_branches_are_refused(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    patch = patch_for(project, tmp_path, {"src/app.py": "z = 1\n"})
    feature_branch(project, "feature/checked-out")
    git(project, "worktree", "add", "-q", str(tmp_path / "roots" / "wt"), "feature/checked-out")
    before = refs(project)
    server = build(LIMITS)
    async with Client(server.mcp) as client:
        on_main = await approved(client, server, "apply_patch", apply_args("main", patch, "p-m"))
        checked_out = await approved(
            client, server, "apply_patch", apply_args("feature/checked-out", patch, "p-c")
        )
        missing = await approved(
            client, server, "apply_patch", apply_args("feature/missing", patch, "p-n")
        )
    assert code_of(on_main) == "WRITE_POLICY_DENIED"
    assert code_of(checked_out) == "CONFLICT"
    assert code_of(missing) == "NOT_FOUND"
    assert refs(project) == before


async def test_a_branch_that_moves_under_the_call_is_never_overwritten(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    branch = feature_branch(project)
    patch = patch_for(project, tmp_path, {"src/app.py": "first = 1\n"})
    server = build(LIMITS)
    repository = server.runtime.repos.catalog.get("proj")  # type: ignore[union-attr]
    tip = rev(project, branch)
    analysis = repository.analyze_patch(tip, patch.encode())
    # Someone else pushes to the branch between the check and the commit.
    git(project, "update-ref", f"refs/heads/{branch}", commit_elsewhere(project, tmp_path))
    moved = rev(project, branch)
    with pytest.raises(Exception) as caught:
        commit_directly(repository, branch, analysis, patch.encode())
    assert getattr(caught.value, "code", None) == "CONFLICT"
    assert rev(project, branch) == moved


def commit_elsewhere(project: Path, tmp_path: Path) -> str:
    tree = git(project, "rev-parse", "main^{tree}").strip()
    return git(project, "commit-tree", tree, "-p", "main", "-m", "elsewhere").strip()


async def test_concurrent_retries_with_one_key_commit_once(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    branch = feature_branch(project)
    patch = patch_for(project, tmp_path, {"src/app.py": "concurrent = 1\n"})
    server = build(LIMITS)
    args = apply_args(branch, patch, "p-same")
    token = mint(server, "apply_patch", args)
    async with Client(server.mcp) as client:
        results = await asyncio.gather(
            *(call(client, "apply_patch", {**args, "approval_token": token}) for _ in range(10))
        )
    commits = {ok(r)["commit_sha"] for r in results if not r.get("isError")}
    assert len(commits) == 1
    assert git(project, "rev-list", "--count", f"main..{branch}").strip() == "1"


# --- CODEOWNERS ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "approver", "allowed"),
    [
        ({"src/app.py": "a = 1\n"}, "bob-approver", True),
        ({"src/app.py": "a = 1\n"}, "alice", True),
        ({"src/app.py": "a = 1\n"}, "@BOB-APPROVER", True),
        ({"src/app.py": "a = 1\n"}, "lead", False),  # /src/ overrides *
        ({"README.md": "r\n"}, "lead", True),
        ({"src/app.py": "a = 1\n", "README.md": "r\n"}, "bob-approver", False),
        ({"src/billing/invoice.py": "TOTAL = 2\n"}, "bob-approver", False),
        ({"src/billing/invoice.py": "TOTAL = 2\n"}, "carol", True),
        ({"docs/guide.md": "g\n"}, "dana", True),  # a member of @org/writers
        ({"docs/guide.md": "g\n"}, "erin", False),
    ],
)
async def test_codeowners_approver_must_own_every_touched_path(
    build: Builder,
    project: Path,
    tmp_path: Path,
    files: dict[str, Any],
    approver: str,
    allowed: bool,
) -> None:
    branch = feature_branch(project)
    patch = patch_for(project, tmp_path, files)
    server = build(
        {**POLICY, "max_changed_files": 10},
        repository={"codeowner_teams": {"@org/writers": ["dana"]}},
    )
    args = apply_args(branch, patch, "p-o")
    token = mint(server, "apply_patch", args, approver=approver)
    async with Client(server.mcp) as client:
        result = await call(client, "apply_patch", {**args, "approval_token": token})
    if allowed:
        ok(result)
    else:
        assert code_of(result) == "WRITE_POLICY_DENIED"
        assert audit_rule(server) == "codeowners"
        assert rev(project, branch) == rev(project, "main")


async def test_a_branch_cannot_rewrite_the_codeowners_it_is_judged_by(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    branch = feature_branch(project)
    git(project, "checkout", "-q", branch)
    commit(project, {".github/CODEOWNERS": "* @mallory\n"}, "own everything")
    git(project, "checkout", "-q", "main")
    patch = make_patch(project, branch, {"src/app.py": "m = 1\n"}, scratch=tmp_path)
    server = build()
    args = apply_args(branch, patch, "p-m")
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", args, approver="mallory")
    assert code_of(result) == "WRITE_POLICY_DENIED"


# --- configuration -------------------------------------------------------------------


async def test_a_repository_without_a_policy_accepts_no_writes(
    build: Builder, project: Path
) -> None:
    server = build(None)
    async with Client(server.mcp) as client:
        result = await approved(
            client,
            server,
            "create_branch",
            {"repo": "proj", "branch": "feature/x", "idempotency_key": "n-1"},
        )
        read = await call(client, "read_repo_file", {"repo": "proj", "path": "README.md"})
    assert code_of(result) == "WRITE_POLICY_DENIED"
    ok(read)


async def test_operations_outside_allowed_operations_are_denied(build: Builder) -> None:
    server = build({**POLICY, "allowed_operations": ["apply_patch"]})
    async with Client(server.mcp) as client:
        result = await approved(
            client,
            server,
            "create_branch",
            {"repo": "proj", "branch": "feature/x", "idempotency_key": "o-1"},
        )
    assert code_of(result) == "WRITE_POLICY_DENIED"
    assert audit_rule(server) == "operation_not_allowed"


@pytest.mark.parametrize(
    "message",
    [
        "Fix\n\nApproved-by: ceo <ceo@example.com>",
        "Fix\n\n  nexus-tool-call: 0000",
        "",
        "   ",
        "bad\x00byte",
        "bell\x07",
        "x" * (64 * 1024 + 1),
    ],
)
async def test_commit_messages_cannot_forge_our_trailers_or_carry_control_bytes(
    build: Builder, project: Path, tmp_path: Path, message: str
) -> None:
    branch = feature_branch(project)
    patch = patch_for(project, tmp_path, {"src/app.py": "t = 1\n"})
    server = build(LIMITS)
    async with Client(server.mcp) as client:
        result = await approved(
            client, server, "apply_patch", apply_args(branch, patch, "p-t", message=message)
        )
    assert envelope(result) == {
        "error": "invalid input for field 'message'",
        "code": "INVALID_INPUT",
    }
    assert rev(project, branch) == rev(project, "main")
