"""The repo toolset under attack: hostile tool arguments and a hostile repository.

The attacker controls every argument an agent sends (repo, ref, path, branch, patch,
message, tokens, idempotency keys, timing) and, in some tests, the repository itself:
its hooks, its ``.git/config`` (and what it includes), its attributes and its refs. Each
test drives the real server through a real MCP client and checks the documented outcome,
that a refusal leaves the repository exactly as it was (``state``) and that nothing the
caller sent comes back in the error envelope.

The defects this suite found were fixed; each of their tests now guards its fix.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import stat
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.repos.git import GitRunner
from nexus_mcp.repos.remote import push_branch
from tests.support.git_repos import (
    commit,
    git,
    init_bare,
    make_patch,
    make_repo,
    refs,
    rev,
    state,
    tree_files,
)

from .conftest import snapshot
from .repo_harness import (
    APPROVER,
    POLICY,
    Builder,
    approved,
    build,
    call,
    envelope,
    finished,
    mint,
    ok,
    project,
)

__all__ = ["build", "project"]  # the harness's fixtures, re-exported for pytest

REPO = "proj"
FEATURE = "feature/work"
CANARY = "zqCANARY9x"  # planted in every hostile input; must never come back in an error
HOOKS = (
    "pre-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "reference-transaction",
    "post-index-change",
    "pre-push",
    "post-checkout",
    "post-merge",
    "post-rewrite",
    "pre-auto-gc",
    "pre-receive",
    "update",
    "post-update",
    "push-to-checkout",
    "fsmonitor-watchman",
)


# --- helpers ------------------------------------------------------------------------------


@pytest.fixture
def feature(project: Path) -> str:
    """``feature/work``: an allowed, unprotected branch at main's tip (not checked out)."""
    git(project, "branch", FEATURE)
    return FEATURE


def texts(result: Mapping[str, Any]) -> str:
    """Everything a client receives, as one string (to look for echoes)."""
    return json.dumps(result, ensure_ascii=False) + json.dumps(result)


def refused(result: Mapping[str, Any], *codes: str, echo: tuple[str, ...] = ()) -> str:
    """The call was refused with one of ``codes``; no canary (nor ``echo``) came back."""
    payload = envelope(result)
    assert payload["code"] in codes, payload
    assert len(result["content"]) == 1
    seen = texts(result)
    for value in (CANARY, *echo):
        assert value not in seen, (value, payload)
    for noise in ("fatal:", "error:", "Traceback", "git ", "stderr", "/tmp", "refs/heads"):
        assert noise not in payload["error"], payload
    return payload["code"]


def new_file(path: str, body: str = "evil\n", *, quoted: bool = False, mode: str = "100644") -> str:
    """A git patch creating ``path`` (``quoted``: git's C-quoted path syntax)."""
    a, b = (f'"a/{path}"', f'"b/{path}"') if quoted else (f"a/{path}", f"b/{path}")
    lines = body.splitlines()
    hunk = "".join(f"+{line}\n" for line in lines)
    if not body.endswith("\n"):
        hunk += "\\ No newline at end of file\n"
    return (
        f"diff --git {a} {b}\nnew file mode {mode}\nindex 0000000..1111111\n"
        f"--- /dev/null\n+++ {b}\n@@ -0,0 +1,{len(lines)} @@\n{hunk}"
    )


def binary_literal(path: str, data: bytes) -> str:
    """A ``GIT binary patch`` creating ``path`` with ``data`` (zlib + git's base85)."""
    packed = zlib.compress(data, 9)
    lines = []
    for start in range(0, len(packed), 52):
        chunk = packed[start : start + 52]
        size = len(chunk)
        prefix = chr(ord("A") + size - 1) if size <= 26 else chr(ord("a") + size - 27)
        lines.append(prefix + base64.b85encode(chunk, pad=True).decode("ascii"))
    sha = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\nindex {'0' * 40}..{sha}\n"
        f"GIT binary patch\nliteral {len(data)}\n" + "\n".join(lines) + "\n\nliteral 0\n"
        "HcmV?d00001\n\n"
    )


def apply_args(
    patch: str, *, branch: str = FEATURE, key: str = "key-1", message: str = "change"
) -> dict[str, Any]:
    return {
        "repo": REPO,
        "branch": branch,
        "patch": patch,
        "message": message,
        "idempotency_key": key,
    }


def branch_args(branch: str, *, key: str = "key-b", from_ref: str | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"repo": REPO, "branch": branch, "idempotency_key": key}
    if from_ref is not None:
        args["from_ref"] = from_ref
    return args


def edit_app(project: Path, tmp_path: Path, body: str = "x = 1\n") -> str:
    return make_patch(project, FEATURE, {"src/app.py": body}, scratch=tmp_path)


def log(project: Path, ref: str) -> list[str]:
    return git(project, "rev-list", ref).split()


async def propose(client: Client[Any], patch: str, branch: str = FEATURE) -> dict[str, Any]:
    return ok(await call(client, "propose_patch", {"repo": REPO, "branch": branch, "patch": patch}))


def rules(proposal: Mapping[str, Any]) -> set[str]:
    return {risk["rule"] for risk in proposal["risks"]}


# --- 1. a hostile repository: hooks and configured programs never run ---------------------


def plant_programs(project: Path, tmp_path: Path) -> Path:
    """Every hook and every configured program of ``project`` appends to a marker file."""
    marker = tmp_path / "markers" / "ran.log"
    marker.parent.mkdir()
    evil = tmp_path / "evil.sh"
    evil.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\ncat\nexit 0\n')
    evil.chmod(0o755)
    other_hooks = tmp_path / "other-hooks"
    other_hooks.mkdir()
    for folder in (project / ".git" / "hooks", other_hooks):
        for name in HOOKS:
            hook = folder / name
            hook.write_text(f'#!/bin/sh\necho "{name} $*" >> {marker}\nexit 0\n')
            hook.chmod(hook.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
    attributes = tmp_path / "attributes"
    attributes.write_text("* filter=x diff=x merge=x\n")
    included = tmp_path / "included.gitconfig"
    included.write_text(
        f"[core]\n\thooksPath = {other_hooks}\n\tpager = {evil}\n\teditor = {evil}\n"
        f"\tattributesFile = {attributes}\n"
        f"[pager]\n\tcat-file = {evil}\n\tls-tree = {evil}\n\tdiff-tree = {evil}\n"
    )
    settings = {
        "core.hooksPath": str(other_hooks),
        "core.fsmonitor": str(evil),
        "core.pager": str(evil),
        "core.sshCommand": str(evil),
        "core.askPass": str(evil),
        "core.alternateRefsCommand": str(evil),
        "core.untrackedCache": "true",
        "filter.x.clean": str(evil),
        "filter.x.smudge": str(evil),
        "filter.x.process": str(evil),
        "filter.x.required": "true",
        "diff.x.textconv": str(evil),
        "diff.x.command": str(evil),
        "diff.external": str(evil),
        "merge.x.driver": str(evil),
        "gpg.program": str(evil),
        "gpg.format": "openpgp",
        "user.signingKey": "ABCDEF",
        "commit.gpgSign": "true",
        "tag.gpgSign": "true",
        "credential.helper": f"!{evil}",
        "url.file:///evil-remote.insteadOf": "file:///",
        "url.file:///evil-remote.pushInsteadOf": "file:///",
        "remote.origin.url": f"ext::{evil} %S",
        "protocol.allow": "always",
        "gc.auto": "1",
        "gc.autoPackLimit": "1",
        "gc.autoDetach": "false",
        "maintenance.auto": "true",
        "sequence.editor": str(evil),
        "uploadpack.packObjectsHook": str(evil),
        "include.path": str(included),
    }
    for key, value in settings.items():
        git(project, "config", "--add", key, value)
    return marker


async def test_hostile_config_and_hooks_never_run_through_any_tool(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    # .gitattributes naming the hostile drivers is committed before they are configured.
    commit(project, {".gitattributes": "* filter=x diff=x merge=x\n"}, "attributes")
    git(project, "branch", FEATURE)
    patch = make_patch(project, FEATURE, {"src/app.py": "HOOKED = False\n"}, scratch=tmp_path)
    marker = plant_programs(project, tmp_path)
    server = build()
    assert not marker.exists(), marker.read_text()  # start-up ran nothing
    async with Client(server.mcp) as client:
        listing = ok(await call(client, "list_repo_files", {"repo": REPO, "recursive": True}))
        assert {"src/app.py", ".gitattributes"} <= {e["path"] for e in listing["entries"]}
        read = ok(await call(client, "read_repo_file", {"repo": REPO, "path": "src/app.py"}))
        assert read["content"].startswith("def handler(event):")  # no smudge, no textconv
        found = ok(await call(client, "search_content", {"repo": REPO, "pattern": "handler"}))
        assert [f["path"] for f in found["files"]] == ["src/app.py"]
        located = ok(await call(client, "locate_component", {"repo": REPO, "name": "Widget"}))
        assert any(m["kind"] == "definition" for m in located["matches"])
        assert (await propose(client, patch))["applies"] is True
        created = ok(await approved(client, server, "create_branch", branch_args("feature/new")))
        assert created["commit_sha"] == rev(project, "main")
        applied = ok(await approved(client, server, "apply_patch", apply_args(patch)))
    assert not marker.exists(), marker.read_text()
    assert rev(project, FEATURE) == applied["commit_sha"]
    blob = tree_files(project, applied["commit_sha"])["src/app.py"]
    assert git(project, "cat-file", "blob", blob) == "HOOKED = False\n"  # not "cleaned"
    signature = git(project, "cat-file", "commit", applied["commit_sha"])
    assert "gpgsig" not in signature
    # Control: the planted programs are live for a plain git in this repository.
    git(project, "hook", "run", "pre-commit")
    assert "pre-commit" in marker.read_text()


async def test_push_goes_to_the_configured_url_whatever_the_repository_config_says(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    git(project, "branch", FEATURE)
    marker = plant_programs(project, tmp_path)
    target = init_bare(tmp_path / "target.git")
    evil_remote = init_bare(tmp_path / "evil-remote.git")
    server = build()
    assert server.runtime.repos is not None
    repository = server.runtime.repos.catalog.get(REPO)
    tip = rev(project, FEATURE)
    await asyncio.to_thread(push_branch, repository, FEATURE, tip, f"file://{target}", None)
    assert refs(target) == {f"refs/heads/{FEATURE}": tip}
    assert refs(evil_remote) == {}
    assert not marker.exists(), marker.read_text()


def test_a_git_dir_outside_the_allowed_roots_is_refused_at_start_up(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    # The .git of the served folder is a file pointing outside repos.allowed_roots.
    outside = tmp_path / "elsewhere" / "real.git"
    outside.parent.mkdir()
    (project / ".git").rename(outside)
    (project / ".git").write_text(f"gitdir: {outside}\n")
    with pytest.raises(ConfigError) as caught:
        build()
    assert str(outside) not in str(caught.value)


# --- 2. patches that try to escape the policy ---------------------------------------------

TYPECHANGE = (
    "diff --git a/README.md b/README.md\ndeleted file mode 100644\nindex 0000000..1111111\n"
    "--- a/README.md\n+++ /dev/null\n@@ -1 +0,0 @@\n-# Project\n"
    "diff --git a/README.md b/README.md\nnew file mode 120000\nindex 0000000..2222222\n"
    "--- /dev/null\n+++ b/README.md\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n"
)
GITLINK = (
    "diff --git a/src/sub b/src/sub\nnew file mode 160000\nindex 0000000..1111111\n"
    "--- /dev/null\n+++ b/src/sub\n@@ -0,0 +1 @@\n"
    f"+Subproject commit {'1' * 40}\n"
)
RENAME_INTO_WORKFLOWS = (
    "diff --git a/src/app.py b/.github/workflows/app.yml\nsimilarity index 100%\n"
    "rename from src/app.py\nrename to .github/workflows/app.yml\n"
)
COPY_INTO_WORKFLOWS = (
    "diff --git a/src/app.py b/.github/workflows/app.yml\nsimilarity index 100%\n"
    "copy from src/app.py\ncopy to .github/workflows/app.yml\n"
)
RENAME_OUT_OF_WORKFLOWS = (
    "diff --git a/.github/workflows/ci.yml b/src/ci.yml\nsimilarity index 100%\n"
    "rename from .github/workflows/ci.yml\nrename to src/ci.yml\n"
)
DELETE_WORKFLOW = (
    "diff --git a/.github/workflows/ci.yml b/.github/workflows/ci.yml\ndeleted file mode 100644\n"
    "index 0000000..0000000\n--- a/.github/workflows/ci.yml\n+++ /dev/null\n"
    "@@ -1 +0,0 @@\n-on: push\n"
)
HEADER_MISMATCH = (
    "diff --git a/src/app.py b/src/app.py\n--- a/.github/workflows/ci.yml\n"
    "+++ b/.github/workflows/ci.yml\n@@ -1 +1 @@\n-on: push\n+on: pull_request\n"
)
TRADITIONAL = (
    "--- a/.github/workflows/ci.yml\n+++ b/.github/workflows/ci.yml\n"
    "@@ -1 +1 @@\n-on: push\n+on: pull_request\n"
)
EXECUTABLE_TO_LINK = (
    "diff --git a/src/l b/src/l\nnew file mode 120000\nindex 0000000..1111111\n"
    "--- /dev/null\n+++ b/src/l\n@@ -0,0 +1 @@\n+../../../../etc/passwd\n"
    "\\ No newline at end of file\n"
)
# Each: a patch, and the codes/rules an attempt must end in (git refusing to apply it, or
# the policy refusing what it does).
ESCAPES: dict[str, tuple[str, set[str]]] = {
    "dotdot": (new_file(f"../{CANARY}.txt"), {"does_not_apply"}),
    "dotdot-inner": (new_file(f"src/../../{CANARY}"), {"does_not_apply"}),
    "absolute": (new_file(f"/tmp/{CANARY}"), {"does_not_apply"}),
    "dot-git-config": (new_file(".git/config"), {"does_not_apply"}),
    "dot-GIT-hooks": (new_file(f".GIT/hooks/{CANARY}"), {"does_not_apply"}),
    "nested-dot-git": (new_file(f"sub/.git/{CANARY}"), {"does_not_apply"}),
    "dot-git-zwnj": (new_file(f".git\u200c/{CANARY}"), {"path_disallowed"}),
    "dot-git-trailing-dot": (new_file(f".git./{CANARY}"), {"path_disallowed", "does_not_apply"}),
    "workflows": (new_file(f".github/workflows/{CANARY}.yml"), {"path_disallowed"}),
    "workflows-case": (new_file(f".GitHub/Workflows/{CANARY}.yml"), {"path_disallowed"}),
    "workflows-upper": (new_file(f".github/WORKFLOWS/{CANARY}.yml"), {"path_disallowed"}),
    "workflows-dot": (new_file(f".github/workflows./{CANARY}"), {"path_disallowed"}),
    "workflows-space": (new_file(f".github/workflows /{CANARY}"), {"path_disallowed"}),
    "workflows-stream": (new_file(f".github/workflows::$DATA/{CANARY}"), {"path_disallowed"}),
    "workflows-zwj": (new_file(f".github/work\u200dflows/{CANARY}"), {"path_disallowed"}),
    "workflows-quoted": (new_file(".github/\\167orkflows/x.yml", quoted=True), {"path_disallowed"}),
    "configured-path": (new_file(f"src/auth/{CANARY}.py"), {"path_disallowed"}),
    "configured-path-case": (new_file(f"SRC/Auth/{CANARY}.py"), {"path_disallowed"}),
    "not-utf8-path": (new_file("src/\\377.txt", quoted=True), {"path_disallowed"}),
    "rename-into-workflows": (RENAME_INTO_WORKFLOWS, {"path_disallowed"}),
    "copy-into-workflows": (COPY_INTO_WORKFLOWS, {"path_disallowed"}),
    "rename-out-of-workflows": (RENAME_OUT_OF_WORKFLOWS, {"path_disallowed"}),
    "delete-workflow": (DELETE_WORKFLOW, {"path_disallowed"}),
    "header-mismatch": (HEADER_MISMATCH, {"path_disallowed", "does_not_apply"}),
    "traditional-diff": (TRADITIONAL, {"path_disallowed"}),
    "new-symlink": (new_file("src/l", "/etc/passwd", mode="120000"), {"symlink"}),
    "relative-symlink": (EXECUTABLE_TO_LINK, {"symlink"}),
    "typechange-to-symlink": (TYPECHANGE, {"symlink"}),
    "gitlink": (GITLINK, {"submodule"}),
    "binary-nul": (binary_literal(f"src/{CANARY}.bin", b"\x00\x01\x02" * 100), {"binary_content"}),
    "binary-latin1": (
        binary_literal("src/latin.txt", "caf\xe9\n".encode("latin-1")),
        {"binary_content"},
    ),
    "garbage": (f"this is not a patch {CANARY}\n", {"does_not_apply"}),
    "whitespace-only": ("\n \n", {"does_not_apply"}),
    "stale-context": (
        "diff --git a/src/app.py b/src/app.py\n--- a/src/app.py\n+++ b/src/app.py\n"
        f"@@ -1 +1 @@\n-{CANARY} not there\n+x\n",
        {"does_not_apply"},
    ),
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
async def test_hostile_patch_is_refused_and_changes_nothing(
    name: str, build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    patch, expected_rules = ESCAPES[name]
    outside = tmp_path / "outside-marker"
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        proposal = await propose(client, patch)
        assert rules(proposal) & expected_rules, proposal["risks"]
        result = await approved(client, server, "apply_patch", apply_args(patch))
    code = refused(result, "WRITE_POLICY_DENIED", "CONFLICT", echo=(patch,))
    assert code == ("CONFLICT" if "does_not_apply" in rules(proposal) else "WRITE_POLICY_DENIED")
    assert state(project) == before  # propose_patch and the refusal wrote no object, no ref
    assert not outside.exists()


@pytest.mark.parametrize("path", ["GITHUB~1/WORKFL~1/x.yml", ".github/WORKFL~1/x.yml"])
async def test_ntfs_short_names_of_disallowed_folders_are_disallowed(
    path: str, build: Builder, project: Path, feature: str
) -> None:
    patch = new_file(path, "on: push\n")
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        proposal = await propose(client, patch)
        result = await approved(client, server, "apply_patch", apply_args(patch))
    assert "path_disallowed" in rules(proposal)
    refused(result, "WRITE_POLICY_DENIED")
    assert state(project) == before


async def test_patch_through_a_committed_symlink_never_leaves_the_tree(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (project / "link").symlink_to(outside)
    commit(project, {}, "a link to outside")
    git(project, "branch", FEATURE)
    server = build()
    before = state(project)
    retarget = (
        "diff --git a/link b/link\nindex 0000000..1111111 120000\n--- a/link\n+++ b/link\n"
        f"@@ -1 +1 @@\n-{outside}\n\\ No newline at end of file\n+/etc\n"
        "\\ No newline at end of file\n"
    )
    async with Client(server.mcp) as client:
        # Reads never follow it.
        for tool, args in (
            ("read_repo_file", {"path": "link/secret.txt"}),
            ("list_repo_files", {"path": "link"}),
            ("read_repo_file", {"path": "link"}),
            ("search_content", {"pattern": "x", "path": "link"}),
        ):
            result = await call(client, tool, {"repo": REPO, **args})
            refused(result, "NOT_FOUND", "CONFLICT", echo=(str(outside),))
        for patch in (new_file(f"link/{CANARY}"), retarget):
            result = await approved(client, server, "apply_patch", apply_args(patch))
            refused(result, "CONFLICT", "WRITE_POLICY_DENIED", echo=(str(outside),))
    assert list(outside.iterdir()) == []
    assert state(project) == before


async def test_reads_never_reach_outside_the_tree(
    build: Builder, project: Path, workspace: Path
) -> None:
    server = build()
    hostile = {
        "../etc/passwd": "INVALID_PATH",
        f"src/../../{CANARY}": "INVALID_PATH",
        "/etc/passwd": "INVALID_PATH",
        f"src\\{CANARY}": "INVALID_PATH",
        f"C:/{CANARY}": "INVALID_PATH",
        f"src/\x00{CANARY}": "INVALID_PATH",
        ".git/config": "NOT_FOUND",
        ".git/HEAD": "NOT_FOUND",
        f":(top){CANARY}": "NOT_FOUND",
        "src/*.py": "NOT_FOUND",
        "src/app.p?": "NOT_FOUND",
    }
    async with Client(server.mcp) as client:
        for path, code in hostile.items():
            result = await call(client, "read_repo_file", {"repo": REPO, "path": path})
            refused(result, code, echo=(path,))
            result = await call(client, "list_repo_files", {"repo": REPO, "path": path})
            refused(result, code, echo=(path,))


@pytest.mark.parametrize(
    ("files", "lines", "allowed"),
    [
        pytest.param(3, 3, True, id="files-at-limit"),
        pytest.param(4, 4, False, id="files-over-limit"),
        pytest.param(1, 20, True, id="lines-at-limit"),
        pytest.param(1, 21, False, id="lines-over-limit"),
    ],
)
async def test_file_and_line_limits_exactly_at_and_one_over(
    files: int, lines: int, allowed: bool, build: Builder, project: Path, feature: str
) -> None:
    per_file = lines // files
    patch = "".join(
        new_file(f"src/new_{n}.py", "".join(f"v{i} = {i}\n" for i in range(per_file)))
        for n in range(files)
    )
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", apply_args(patch))
    if allowed:
        assert ok(result)["files_changed"] == files
        assert ok(result)["lines_added"] == lines
    else:
        refused(result, "WRITE_POLICY_DENIED")
        assert state(project) == before


@pytest.mark.parametrize("over", [0, 1], ids=["at-limit", "one-over"])
async def test_diff_size_exactly_at_and_one_over(
    over: int, build: Builder, project: Path, feature: str
) -> None:
    patch = new_file("src/sized.py", "size = 1\n")
    server = build({**POLICY, "max_diff_size": len(patch.encode()) - over})
    before = state(project)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", apply_args(patch))
    if over:
        refused(result, "WRITE_POLICY_DENIED")
        assert state(project) == before
    else:
        assert ok(result)["files_changed"] == 1


@pytest.mark.parametrize(
    ("patch", "code"),
    [
        pytest.param("", "INVALID_INPUT", id="empty"),
        pytest.param(new_file("src/nul.py", f"a\x00{CANARY}\n"), "INVALID_INPUT", id="nul-byte"),
        pytest.param(
            new_file("src/s.py", f"\ud800{CANARY}\n"), "DOC_ENCODING_INVALID", id="surrogate"
        ),
    ],
)
async def test_unusable_patch_text_is_invalid_input(
    patch: str, code: str, build: Builder, project: Path, feature: str
) -> None:
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        proposal = await call(
            client, "propose_patch", {"repo": REPO, "branch": FEATURE, "patch": patch}
        )
        refused(proposal, code)
        result = await approved(client, server, "apply_patch", apply_args(patch))
    refused(result, code)
    assert state(project) == before


async def test_a_patch_that_changes_nothing_is_an_empty_patch(
    build: Builder, project: Path, feature: str
) -> None:
    # Two patches of one file in one input, the second undoing the first: git applies both.
    there_and_back = (
        "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n"
        "@@ -1 +1 @@\n-# Project\n+# Changed\n"
        "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n"
        "@@ -1 +1 @@\n-# Changed\n+# Project\n"
    )
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        assert "empty_patch" in rules(await propose(client, there_and_back))
        result = await approved(client, server, "apply_patch", apply_args(there_and_back))
    refused(result, "WRITE_POLICY_DENIED")
    assert state(project) == before


async def test_a_detour_through_a_disallowed_path_is_refused(
    build: Builder, project: Path, feature: str
) -> None:
    # Create a workflow, then rename it away, in one patch.
    detour = new_file(".github/workflows/x.yml", "on: push\n") + (
        "diff --git a/.github/workflows/x.yml b/src/x.yml\nsimilarity index 100%\n"
        "rename from .github/workflows/x.yml\nrename to src/x.yml\n"
    )
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", apply_args(detour))
    refused(result, "WRITE_POLICY_DENIED", "CONFLICT")
    assert state(project) == before


async def test_quoted_path_with_a_newline_lands_as_one_literal_name(
    build: Builder, project: Path, feature: str
) -> None:
    patch = new_file("src/a\\nb.py", "v = 1\n", quoted=True)
    server = build()
    async with Client(server.mcp) as client:
        applied = ok(await approved(client, server, "apply_patch", apply_args(patch)))
    assert applied["files_changed"] == 1
    assert "src/a\nb.py" in tree_files(project, applied["commit_sha"])


async def test_copying_a_big_file_counts_its_lines(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    commit(project, {"src/big.py": "".join(f"b{i} = {i}\n" for i in range(500))}, "big")
    git(project, "branch", FEATURE)
    copy = (
        "diff --git a/src/big.py b/src/big_copy.py\nsimilarity index 100%\n"
        "copy from src/big.py\ncopy to src/big_copy.py\n"
    )
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        proposal = await propose(client, copy)
        result = await approved(client, server, "apply_patch", apply_args(copy))
    assert "max_changed_lines" in rules(proposal), proposal["summary"]
    refused(result, "WRITE_POLICY_DENIED")
    assert state(project) == before


async def test_text_smuggled_in_a_binary_literal_counts_its_lines(
    build: Builder, project: Path, feature: str
) -> None:
    body = b'print("payload")\n' * 5000
    patch = binary_literal("src/smuggled.py", body)
    assert len(patch) < POLICY["max_diff_size"]
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        proposal = await propose(client, patch)
        result = await approved(client, server, "apply_patch", apply_args(patch))
    # A binary literal is refused before git reads it: it could never land anyway.
    assert proposal["applies"] is False
    assert "binary_content" in rules(proposal), proposal["summary"]
    refused(result, "WRITE_POLICY_DENIED")
    assert state(project) == before


async def test_propose_patch_writes_no_object_and_no_ref(
    build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    patches = [
        edit_app(project, tmp_path),
        new_file("src/brand_new.py", "fresh = 1\n"),
        binary_literal("src/blob.bin", b"\x00" * 64),
    ]
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        for patch in patches:
            await propose(client, patch)
            await propose(client, patch, branch="main")
    assert state(project) == before


# --- 3. branch, ref and repository names --------------------------------------------------

BAD_BRANCHES: dict[str, str] = {
    "-D": "INVALID_INPUT",
    f"--upload-pack={CANARY}": "INVALID_INPUT",
    f"-{CANARY}": "INVALID_INPUT",
    "HEAD": "INVALID_INPUT",
    f"feature/../{CANARY}": "INVALID_INPUT",
    f"feature/{CANARY}.lock": "INVALID_INPUT",
    f"feature/{CANARY}@{{0}}": "INVALID_INPUT",
    f"feature/{CANARY}~1": "INVALID_INPUT",
    f"feature/{CANARY}^": "INVALID_INPUT",
    f"feature/{CANARY}:x": "INVALID_INPUT",
    f"feature/{CANARY}?": "INVALID_INPUT",
    f"feature/{CANARY}*": "INVALID_INPUT",
    f"feature/{CANARY}[": "INVALID_INPUT",
    f"feature/{CANARY}\\x": "INVALID_INPUT",
    f"feature/ {CANARY}": "INVALID_INPUT",
    f"feature/{CANARY} ": "INVALID_INPUT",
    f"feature/{CANARY}\t": "INVALID_INPUT",
    f"feature/é{CANARY}": "INVALID_INPUT",
    f"feature/{CANARY}\u200b": "INVALID_INPUT",
    f"feature//{CANARY}": "INVALID_INPUT",
    f"feature/.{CANARY}": "INVALID_INPUT",
    f"feature/{CANARY}.": "INVALID_INPUT",
    f"feature/{CANARY}/": "INVALID_INPUT",
    "": "INVALID_INPUT",
    "feature/" + "x" * 300: "INVALID_INPUT",
    "main": "WRITE_POLICY_DENIED",
    "master": "WRITE_POLICY_DENIED",
    "trunk": "WRITE_POLICY_DENIED",
    "develop": "WRITE_POLICY_DENIED",
    "release/1": "WRITE_POLICY_DENIED",
    "refs/heads/main": "WRITE_POLICY_DENIED",
    f"refs/heads/feature/{CANARY}": "WRITE_POLICY_DENIED",
    f"Feature/{CANARY}": "WRITE_POLICY_DENIED",
    f"{CANARY}": "WRITE_POLICY_DENIED",
}


async def test_hostile_branch_names_are_refused_by_every_tool(
    build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    patch = edit_app(project, tmp_path)
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        for number, (branch, code) in enumerate(BAD_BRANCHES.items()):
            echo = (branch,) if len(branch) > 3 else ()
            created = await approved(
                client, server, "create_branch", branch_args(branch, key=f"b{number}")
            )
            assert refused(created, code, echo=echo) == code, branch
            applied = await approved(
                client, server, "apply_patch", apply_args(patch, branch=branch, key=f"a{number}")
            )
            expected = {code, "NOT_FOUND"} if code == "WRITE_POLICY_DENIED" else {code}
            refused(applied, *expected, echo=echo)
            if code == "INVALID_INPUT":
                proposal = await call(
                    client, "propose_patch", {"repo": REPO, "branch": branch, "patch": patch}
                )
                refused(proposal, code, echo=echo)
    assert state(project) == before


async def test_trailing_newline_names_are_invalid_input(
    build: Builder, project: Path, feature: str
) -> None:
    server = build()
    async with Client(server.mcp) as client:
        created = await approved(client, server, "create_branch", branch_args("feature/x\n"))
        read = await call(
            client, "read_repo_file", {"repo": REPO, "path": "README.md", "ref": "HEAD\n"}
        )
        repo = await call(client, "list_repo_files", {"repo": "proj\n"})
    assert [code for code in map(lambda r: envelope(r)["code"], (created, read, repo))] == [
        "INVALID_INPUT"
    ] * 3


async def test_a_component_ending_in_lock_is_invalid_input(build: Builder, project: Path) -> None:
    server = build()
    async with Client(server.mcp) as client:
        result = await approved(client, server, "create_branch", branch_args("feature/x.lock/y"))
    assert not any(name.startswith("refs/heads/feature/x.lock") for name in refs(project))
    refused(result, "INVALID_INPUT")


async def test_hostile_refs_are_refused_and_run_nothing(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    output = tmp_path / f"out-{CANARY}"
    hostile = [
        "HEAD:src/app.py",
        f"--output={output}",
        f"-{CANARY}",
        "HEAD^{/handler}",
        "HEAD^{tree}",
        "@{-1}",
        "HEAD@{0}",
        "main@{upstream}",
        f"main..{CANARY}",
        f":/{CANARY}",
        "HEAD~100000",
        f"{CANARY}.lock",
        f"refs/heads/{CANARY}/",
        "",
        "x" * 300,
        "HEAD\t",
        f"HEAD {CANARY}",
    ]
    server = build()
    async with Client(server.mcp) as client:
        for ref in hostile:
            for tool, args in (
                ("read_repo_file", {"path": "README.md"}),
                ("list_repo_files", {}),
                ("search_content", {"pattern": "x"}),
                ("locate_component", {"name": "Widget"}),
            ):
                result = await call(client, tool, {"repo": REPO, "ref": ref, **args})
                refused(result, "INVALID_INPUT", echo=(ref,) if ref else ())
            if not ref:
                continue  # an empty from_ref means the default branch
            created = await approved(
                client, server, "create_branch", branch_args("feature/r", from_ref=ref, key=ref)
            )
            refused(created, "INVALID_INPUT", echo=(ref,) if len(ref) > 3 else ())
        # Well-formed refs that name no commit: NOT_FOUND, never the name.
        for ref in (f"{CANARY}", f"refs/tags/{CANARY}", "0" * 40, f"{CANARY}~2"):
            result = await call(client, "read_repo_file", {"repo": REPO, "path": "x", "ref": ref})
            refused(result, "NOT_FOUND", echo=(ref,))
    assert not output.exists()
    assert "feature/r" not in refs(project)


async def test_a_ref_naming_a_tree_or_blob_is_not_a_commit(build: Builder, project: Path) -> None:
    tree = git(project, "rev-parse", "HEAD^{tree}").strip()
    blob = tree_files(project, "HEAD")["README.md"]
    git(project, "tag", "blob-tag", blob)
    server = build()
    async with Client(server.mcp) as client:
        for ref in (tree, blob, "blob-tag"):
            result = await call(client, "list_repo_files", {"repo": REPO, "ref": ref})
            refused(result, "NOT_FOUND", echo=(ref,))


async def test_hostile_repository_names(build: Builder, project: Path) -> None:
    names = {
        "..": "INVALID_INPUT",
        ".": "INVALID_INPUT",
        "../etc": "INVALID_INPUT",
        "proj/..": "INVALID_INPUT",
        f"proj/{CANARY}": "INVALID_INPUT",
        str(project): "INVALID_INPUT",
        "pr\u043ej": "INVALID_INPUT",  # Cyrillic o
        "proj\u200b": "INVALID_INPUT",
        " proj": "INVALID_INPUT",
        "": "INVALID_INPUT",
        "x" * 101: "INVALID_INPUT",
        "PROJ": "NOT_FOUND",
        "...": "NOT_FOUND",
        f"{CANARY}": "NOT_FOUND",
    }
    server = build()
    async with Client(server.mcp) as client:
        for name, code in names.items():
            echo = (name,) if len(name) > 4 else ()
            result = await call(client, "list_repo_files", {"repo": name})
            refused(result, code, echo=echo)
            result = await approved(
                client, server, "create_branch", branch_args("feature/n") | {"repo": name}
            )
            refused(result, code, echo=echo)


async def test_existing_and_missing_branches(
    build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        again = await approved(client, server, "create_branch", branch_args(FEATURE))
        refused(again, "CONFLICT")
        missing = f"feature/{CANARY}"
        patch = edit_app(project, tmp_path)
        result = await approved(client, server, "apply_patch", apply_args(patch, branch=missing))
        refused(result, "NOT_FOUND", echo=(missing,))
        result = await call(
            client, "propose_patch", {"repo": REPO, "branch": missing, "patch": patch}
        )
        refused(result, "NOT_FOUND", echo=(missing,))
    assert state(project) == before


async def test_protected_and_default_branch_writes_are_refused_before_any_approval(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    git(project, "branch", "release/7")
    git(project, "branch", "feature/work")
    patch = edit_app(project, tmp_path)
    server = build({**POLICY, "allowed_branches": [".*"]})  # even when every name is allowed
    before = state(project)
    async with Client(server.mcp) as client:
        for branch in ("main", "release/7", "master", "trunk"):
            # No token at all: the policy refuses first, so no approval is asked for.
            result = await call(client, "apply_patch", apply_args(patch, branch=branch))
            refused(result, "WRITE_POLICY_DENIED", "NOT_FOUND")
            result = await approved(client, server, "apply_patch", apply_args(patch, branch=branch))
            refused(result, "WRITE_POLICY_DENIED", "NOT_FOUND")
            result = await approved(client, server, "create_branch", branch_args(branch))
            refused(result, "WRITE_POLICY_DENIED")
    assert state(project) == before


async def test_a_symbolic_ref_branch_cannot_move_the_branch_it_points_at(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    git(project, "symbolic-ref", "refs/heads/feature/alias", "refs/heads/main")
    patch = make_patch(project, "main", {"src/app.py": "moved = True\n"}, scratch=tmp_path)
    main = rev(project, "main")
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        result = await approved(
            client, server, "apply_patch", apply_args(patch, branch="feature/alias")
        )
    moved = rev(project, "main")
    assert moved == main, "main moved"
    refused(result, "WRITE_POLICY_DENIED", "CONFLICT", "INVALID_INPUT")
    assert state(project) == before


async def test_create_branch_through_a_dangling_symbolic_ref(build: Builder, project: Path) -> None:
    git(project, "symbolic-ref", "refs/heads/feature/alias", "refs/heads/release/9")
    server = build()
    async with Client(server.mcp) as client:
        result = await approved(client, server, "create_branch", branch_args("feature/alias"))
    assert "refs/heads/release/9" not in refs(project)
    refused(result, "WRITE_POLICY_DENIED", "CONFLICT", "INVALID_INPUT")


async def test_a_branch_checked_out_in_any_worktree_is_refused(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    git(project, "branch", "feature/linked")
    git(project, "worktree", "add", "-q", str(tmp_path / "linked"), "feature/linked")
    git(project, "branch", "feature/head")
    git(project, "symbolic-ref", "HEAD", "refs/heads/feature/head")  # the main worktree's
    server = build()
    before = state(project)
    linked = snapshot(tmp_path / "linked")
    async with Client(server.mcp) as client:
        for branch in ("feature/linked", "feature/head"):
            patch = make_patch(project, branch, {"src/app.py": "y = 2\n"}, scratch=tmp_path)
            result = await approved(client, server, "apply_patch", apply_args(patch, branch=branch))
            refused(result, "CONFLICT")
    assert state(project) == before
    assert snapshot(tmp_path / "linked") == linked


async def test_a_branch_being_rebased_in_a_worktree_is_refused(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    git(project, "branch", "feature/rb")
    linked = tmp_path / "rebasing"
    git(project, "worktree", "add", "-q", str(linked), "feature/rb")
    git(linked, "commit", "-q", "--allow-empty", "-m", "wip")
    git(
        linked, "-c", "sequence.editor=sed -i 1ibreak", "rebase", "-q", "-i", "--keep-empty", "main"
    )
    tip = rev(project, "feature/rb")
    server = build()
    patch = make_patch(project, "feature/rb", {"src/app.py": "y = 2\n"}, scratch=tmp_path)
    async with Client(server.mcp) as client:
        result = await approved(
            client, server, "apply_patch", apply_args(patch, branch="feature/rb")
        )
    assert rev(project, "feature/rb") == tip, "the branch moved under the rebase"
    refused(result, "CONFLICT")


@pytest.mark.parametrize(
    ("policy", "tools"),
    [
        pytest.param(None, ("create_branch", "apply_patch"), id="no-policy"),
        pytest.param(
            {**POLICY, "allowed_operations": ["create_branch"]},
            ("apply_patch",),
            id="op-not-allowed",
        ),
        pytest.param(POLICY, ("open_pull_request", "merge_guarded"), id="no-forge"),
    ],
)
async def test_writes_the_policy_does_not_allow(
    policy: dict[str, Any] | None,
    tools: tuple[str, ...],
    build: Builder,
    project: Path,
    feature: str,
    tmp_path: Path,
) -> None:
    server = build(policy)
    patch = edit_app(project, tmp_path)
    every = {
        "create_branch": branch_args(f"feature/{CANARY}"),
        "apply_patch": apply_args(patch),
        "open_pull_request": {
            "repo": REPO,
            "branch": FEATURE,
            "title": f"title {CANARY}",
            "idempotency_key": "pr",
        },
        "merge_guarded": {"repo": REPO, "pull_number": 1, "idempotency_key": "merge"},
    }
    before = state(project)
    async with Client(server.mcp) as client:
        for tool in tools:
            refused(await approved(client, server, tool, every[tool]), "WRITE_POLICY_DENIED")
            refused(await call(client, tool, every[tool]), "WRITE_POLICY_DENIED")
        if policy is None:
            assert "no_policy" in rules(await propose(client, patch))
    assert state(project) == before


# --- 4. approvals: binding, replay, idempotency, races ------------------------------------


@pytest.fixture
def two_repos(project: Path, tmp_path: Path) -> dict[str, Any]:
    other = make_repo(tmp_path / "roots" / "other", {"src/app.py": "def handler(event):\n"})
    git(other, "branch", FEATURE)
    policy = {**POLICY, "require_codeowners": False}
    return {
        "repositories": {
            "proj": {"path": str(project), "write_policy": policy},
            "other": {"path": str(other), "write_policy": policy},
        }
    }


async def test_a_token_is_bound_to_its_repo_branch_patch_message_tool_and_caller(
    build: Builder, project: Path, feature: str, tmp_path: Path, two_repos: dict[str, Any]
) -> None:
    git(project, "branch", "feature/other")
    patch = edit_app(project, tmp_path)
    server = build(repos=two_repos)
    args = apply_args(patch)
    variants = {
        "repo": {**args, "repo": "other"},
        "branch": {**args, "branch": "feature/other"},
        "patch": {**args, "patch": edit_app(project, tmp_path, "x = 2\n")},
        "message": {**args, "message": "another message"},
    }
    before = state(project)
    async with Client(server.mcp) as client:
        for signed in variants.values():
            token = mint(server, "apply_patch", signed)
            result = await call(client, "apply_patch", {**args, "approval_token": token})
            refused(result, "APPROVAL_INVALID", echo=(token,))
        for token in (
            mint(server, "create_branch", args),  # another tool
            mint(server, "apply_patch", args, subject="mallory"),  # another caller
            f"not-a-token-{CANARY}",
            "",
        ):
            result = await call(client, "apply_patch", {**args, "approval_token": token})
            refused(result, "APPROVAL_INVALID", "APPROVAL_REQUIRED", echo=(token,) if token else ())
        refused(await call(client, "apply_patch", args), "APPROVAL_REQUIRED")
    assert state(project) == before


async def test_token_replay_and_idempotent_retry(
    build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    patch = edit_app(project, tmp_path)
    server = build()
    args = apply_args(patch, key="first")
    token = mint(server, "apply_patch", args)
    async with Client(server.mcp) as client:
        first = ok(await call(client, "apply_patch", {**args, "approval_token": token}))
        # The same key: the recorded result, no second commit.
        again = ok(await call(client, "apply_patch", {**args, "approval_token": token}))
        assert again == first
        assert log(project, FEATURE)[0] == first["commit_sha"]
        assert log(project, FEATURE)[1:] == log(project, "main")
        # Someone resets the branch, so the patch applies again: the token is spent.
        git(project, "update-ref", f"refs/heads/{FEATURE}", rev(project, "main"))
        replay = {**args, "idempotency_key": "second", "approval_token": token}
        refused(await call(client, "apply_patch", replay), "APPROVAL_REPLAYED", echo=(token,))
    assert rev(project, FEATURE) == rev(project, "main")


async def test_twenty_concurrent_calls_with_one_key_make_one_commit(
    build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    patch = edit_app(project, tmp_path)
    server = build()
    args = apply_args(patch, key="same-key")
    token = mint(server, "apply_patch", args)
    async with Client(server.mcp) as client:
        results = await asyncio.gather(
            *(call(client, "apply_patch", {**args, "approval_token": token}) for _ in range(20))
        )
    successes = [r for r in results if not r.get("isError")]
    assert successes, [envelope(r) for r in results]
    assert {r["structuredContent"]["commit_sha"] for r in successes} == {rev(project, FEATURE)}
    for result in results:
        if result.get("isError"):
            refused(result, "IDEMPOTENCY_KEY_CONFLICT", "CONFLICT", echo=(token,))
    assert len(log(project, FEATURE)) == len(log(project, "main")) + 1


async def test_racing_writes_with_their_own_keys_never_lose_a_commit(
    build: Builder, project: Path, feature: str
) -> None:
    server = build({**POLICY, "require_codeowners": False, "max_changed_files": 10})
    base = rev(project, FEATURE)
    calls = []
    for n in range(8):
        args = apply_args(new_file(f"src/race_{n}.py", f"n = {n}\n"), key=f"race-{n}")
        calls.append({**args, "approval_token": mint(server, "apply_patch", args)})
    async with Client(server.mcp) as client:
        results = await asyncio.gather(*(call(client, "apply_patch", args) for args in calls))
    landed = {}
    for n, result in enumerate(results):
        if result.get("isError"):
            refused(result, "CONFLICT")
        else:
            landed[n] = result["structuredContent"]
    assert landed
    history = git(project, "rev-list", "--first-parent", f"{base}..{FEATURE}").split()
    assert len(history) == len(landed)  # the branch moved once per accepted call
    assert {c["commit_sha"] for c in landed.values()} == set(history)
    parents = {c["parent_sha"] for c in landed.values()}
    assert len(parents) == len(landed)  # each on its own tip: compare-and-swap
    files = tree_files(project, FEATURE)
    assert {p for p in files if p.startswith("src/race_")} == {f"src/race_{n}.py" for n in landed}


async def test_a_refused_write_spends_no_approval(
    build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    server = build()
    patch = edit_app(project, tmp_path)
    args = apply_args(patch, key="k1")
    token = mint(server, "apply_patch", args)
    git(project, "worktree", "add", "-q", str(tmp_path / "wt"), FEATURE)
    async with Client(server.mcp) as client:
        refused(await call(client, "apply_patch", {**args, "approval_token": token}), "CONFLICT")
        git(project, "worktree", "remove", "--force", str(tmp_path / "wt"))
        result = await call(
            client, "apply_patch", {**args, "idempotency_key": "k2", "approval_token": token}
        )
    assert ok(result)["commit_sha"] == rev(project, FEATURE)


async def test_forged_trailers_in_the_message_are_not_the_commit_trailers(
    build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    message = (
        "fix\n\nApproved-by: The CEO <ceo@example.com>\nNexus-Tool-Call: forged\n"
        "Signed-off-by: someone <s@example.com>\n"
    )
    server = build()
    args = apply_args(edit_app(project, tmp_path), message=message)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", args)
    if result.get("isError"):  # refusing a message that carries our trailers is fine too
        refused(result, "INVALID_INPUT", echo=("The CEO",))
        return
    applied = ok(result)
    trailers = git(project, "log", "-1", "--format=%(trailers:unfold)", applied["commit_sha"])
    lines = [line for line in trailers.splitlines() if line]
    assert lines[0] == f"Approved-by: {APPROVER} <{APPROVER}@nexus-mcp.invalid>"
    assert lines[1].startswith("Nexus-Tool-Call: ") and "forged" not in lines[1]
    assert len(lines) == 2


async def test_idempotency_key_conflict_and_missing_key(
    build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    server = build({**POLICY, "require_codeowners": False, "require_approval": False})
    async with Client(server.mcp) as client:
        ok(await call(client, "create_branch", branch_args("feature/a", key="shared")))
        other = await call(client, "create_branch", branch_args(f"feature/{CANARY}", key="shared"))
        refused(other, "IDEMPOTENCY_KEY_CONFLICT", echo=(f"feature/{CANARY}",))
        missing = {k: v for k, v in branch_args("feature/b").items() if k != "idempotency_key"}
        refused(await call(client, "create_branch", missing), "IDEMPOTENCY_KEY_REQUIRED")
    assert "refs/heads/feature/b" not in refs(project)
    assert f"refs/heads/feature/{CANARY}" not in refs(project)


# --- 5. CODEOWNERS ------------------------------------------------------------------------


async def test_an_approver_owning_only_some_paths_is_refused_and_the_token_survives(
    build: Builder, project: Path, feature: str, tmp_path: Path, audit: MemoryAuditSink
) -> None:
    patch = make_patch(
        project, FEATURE, {"src/app.py": "x = 1\n", "docs/guide.md": "New\n"}, scratch=tmp_path
    )
    server = build()
    args = apply_args(patch, key="k1")
    token = mint(server, "apply_patch", args)  # bob owns /src/, not /docs/
    before = state(project)
    async with Client(server.mcp) as client:
        result = await call(client, "apply_patch", {**args, "approval_token": token})
        refused(result, "WRITE_POLICY_DENIED", echo=(token,))
        assert state(project) == before
        denied = [r for r in finished(audit, "apply_patch") if r.get("policy_rule") == "codeowners"]
        assert denied and denied[-1]["policy_decision"] == "denied"
        # The default branch now gives bob /docs/ too: the very same token still works.
        commit(
            project,
            {".github/CODEOWNERS": "*  @lead\n/src/ @bob-approver\n/docs/ @bob-approver\n"},
            "own",
        )
        result = await call(
            client, "apply_patch", {**args, "idempotency_key": "k2", "approval_token": token}
        )
    assert ok(result)["commit_sha"] == rev(project, FEATURE)


async def test_codeowners_on_the_feature_branch_do_not_change_who_must_approve(
    build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    git(project, "checkout", "-q", FEATURE)
    commit(project, {".github/CODEOWNERS": "* @mallory\n", "CODEOWNERS": "* @mallory\n"}, "mine")
    git(project, "checkout", "-q", "main")
    patch = edit_app(project, tmp_path)
    rewrite = make_patch(
        project,
        FEATURE,
        {
            ".github/CODEOWNERS": "* @mallory\n",
            "docs/CODEOWNERS": "* @mallory\n",
            "src/app.py": "z\n",
        },
        scratch=tmp_path,
    )
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        for candidate in (patch, rewrite):
            proposal = await propose(client, candidate)
            assert "@mallory" not in proposal["codeowners"]["owners"]
            result = await approved(
                client, server, "apply_patch", apply_args(candidate), approver="mallory"
            )
            refused(result, "WRITE_POLICY_DENIED")
    assert state(project) == before


@pytest.mark.parametrize(
    ("files", "approver", "allowed"),
    [
        pytest.param({"docs/guide.md": "New\n"}, "dana", True, id="team-member"),
        pytest.param({"docs/guide.md": "New\n"}, "erin", False, id="not-a-member"),
        pytest.param({"docs/guide.md": "New\n"}, "@org/writers", False, id="team-name-itself"),
        pytest.param({"src/billing/invoice.py": "TOTAL = 2\n"}, APPROVER, False, id="last-match"),
        pytest.param({"src/billing/invoice.py": "TOTAL = 2\n"}, "carol", True, id="owner"),
        pytest.param({"docs/guide.md": None}, APPROVER, False, id="deletion"),
        pytest.param({"src/app.py": "x\n"}, "Bob-Approver", True, id="logins-ignore-case"),
        pytest.param({"src/app.py": "x\n"}, f"{APPROVER} ", False, id="trailing-space"),
    ],
)
async def test_codeowners_decide_on_every_touched_path(
    files: dict[str, str | None],
    approver: str,
    allowed: bool,
    build: Builder,
    project: Path,
    feature: str,
    tmp_path: Path,
) -> None:
    patch = make_patch(project, FEATURE, files, scratch=tmp_path)
    server = build(repository={"codeowner_teams": {"@org/writers": ["dana"]}})
    before = state(project)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", apply_args(patch), approver=approver)
    if allowed:
        assert ok(result)["commit_sha"] == rev(project, FEATURE)
    else:
        refused(result, "WRITE_POLICY_DENIED")
        assert state(project) == before


async def test_a_rename_needs_the_owner_of_both_ends(
    build: Builder, project: Path, feature: str
) -> None:
    rename = (
        "diff --git a/src/app.py b/docs/app.py\nsimilarity index 100%\n"
        "rename from src/app.py\nrename to docs/app.py\n"
    )
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", apply_args(rename))
    refused(result, "WRITE_POLICY_DENIED")
    assert state(project) == before


# --- 6. nothing the caller sent comes back ------------------------------------------------


async def test_refusals_echo_nothing_the_caller_sent(
    build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    server = build()
    canary_patch = new_file(f".github/workflows/{CANARY}.yml", f"run: {CANARY}\n")
    attempts: list[tuple[str, dict[str, Any]]] = [
        ("apply_patch", apply_args(canary_patch)),
        ("apply_patch", apply_args(edit_app(project, tmp_path), message=f"{CANARY}\x07bell")),
        ("apply_patch", apply_args(edit_app(project, tmp_path), message=" \n ")),
        ("apply_patch", {**apply_args(edit_app(project, tmp_path)), "message": 7}),
        ("apply_patch", {**apply_args(edit_app(project, tmp_path)), "branch": [CANARY]}),
        ("apply_patch", {**apply_args(edit_app(project, tmp_path)), CANARY: CANARY}),
        ("create_branch", {**branch_args(f"feature/{CANARY}"), "from_ref": f"{CANARY}-missing"}),
        ("create_branch", {**branch_args(f"feature/{CANARY}"), "idempotency_key": None}),
        ("propose_patch", {"repo": REPO, "branch": f"feature/{CANARY}", "patch": canary_patch}),
        ("read_repo_file", {"repo": REPO, "path": f"src/{CANARY}.py"}),
        ("list_repo_files", {"repo": REPO, "path": f"{CANARY}/x"}),
        ("search_content", {"repo": REPO, "pattern": f"({CANARY}", "regex": True}),
        ("locate_component", {"repo": REPO, "name": f"{CANARY}!"}),
    ]
    before = state(project)
    async with Client(server.mcp) as client:
        for tool, args in attempts:
            if tool in ("apply_patch", "create_branch") and args.get("idempotency_key"):
                result = await approved(client, server, tool, args)
            else:
                result = await call(client, tool, args)
            assert result.get("isError") is True, (tool, args)
            assert CANARY not in texts(result), (tool, result)
            assert "structuredContent" not in result
    assert state(project) == before


# --- 7. resource bounds -------------------------------------------------------------------


async def test_huge_patch_is_refused_before_git(
    build: Builder, project: Path, feature: str
) -> None:
    body = "".join(f"{CANARY} {i}\n" for i in range(20_000))
    patch = new_file("src/huge.py", body)
    server = build()
    before = state(project)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "apply_patch", apply_args(patch))
    refused(result, "WRITE_POLICY_DENIED")
    assert state(project) == before


async def test_propose_patch_never_feeds_git_more_than_max_diff_size(
    build: Builder, project: Path, feature: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed: list[int] = []
    original = GitRunner.run

    def spy(self: GitRunner, args: Any, **kwargs: Any) -> Any:
        stdin = kwargs.get("stdin")
        if args and args[0] == "apply" and stdin is not None:
            fed.append(len(stdin))
        return original(self, args, **kwargs)

    monkeypatch.setattr(GitRunner, "run", spy)
    bomb = binary_literal("src/bomb.bin", bytes(100 * 1024 * 1024))  # ~130 KB of patch
    assert len(bomb) > 10 * POLICY["max_diff_size"]
    server = build()
    async with Client(server.mcp) as client:
        result = await call(
            client, "propose_patch", {"repo": REPO, "branch": FEATURE, "patch": bomb}
        )
    if not result.get("isError"):
        assert "max_diff_size" in rules(ok(result))
    assert max(fed, default=0) <= POLICY["max_diff_size"], fed


async def test_a_git_failure_does_not_leak_git_output(build: Builder, project: Path) -> None:
    # Every file holds the canary; a 1 KiB output bound is below each file's size.
    commit(project, {f"src/f{n}.py": f"{CANARY} {n}\n" * 100 for n in range(20)}, "many")
    server = build(repos={"git": {"max_output_bytes": 1024}})
    async with Client(server.mcp) as client:
        result = await call(client, "read_repo_file", {"repo": REPO, "path": "src/f1.py"})
        search = ok(await call(client, "search_content", {"repo": REPO, "pattern": CANARY}))
    # Files git could not hand over within its bound are skipped, never an error.
    assert search["files"] == []
    payload = envelope(result)
    assert CANARY not in texts(result)
    assert "output bound" not in payload["error"]
    assert "git" not in payload["error"].lower()


async def test_search_stays_within_the_git_output_bound(build: Builder, project: Path) -> None:
    commit(project, {f"src/f{n}.py": f"needle {n}\n" + "x = 1\n" * 400 for n in range(40)}, "big")
    server = build(repos={"git": {"max_output_bytes": 64 * 1024}})
    async with Client(server.mcp) as client:
        result = await call(client, "search_content", {"repo": REPO, "pattern": "needle"})
    found = ok(result)
    assert len(found["files"]) == 40 or found["truncated"]
