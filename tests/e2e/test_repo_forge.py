"""Issue 13 end to end: open_pull_request and merge_guarded against a forge.

The forge is a true outside boundary, so it is a small GitHub-shaped app served on a real
loopback socket (``tests/support/forge_app.py``), backed by a real bare repository that
``open_pull_request`` really pushes to (``file://``). Nothing of nexus-mcp is patched.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer
from tests.support.forge_app import CANARY, FakeForge
from tests.support.git_repos import commit, git, init_bare, rev
from tests.support.loopback import serve_in_thread

from .repo_harness import (
    APPROVER,
    Builder,
    approved,
    build,
    call,
    code_of,
    effect_of,
    envelope,
    finished,
    mint,
    ok,
    project,
)

__all__ = ["build", "project"]  # fixtures

FORGE_TOKEN = "forge-token-SECRET-4d2c9a"
BRANCH = "feature/pr"


@pytest.fixture
def remote(tmp_path: Path, project: Path) -> Path:
    bare = init_bare(tmp_path / "remote.git")
    git(project, "push", "-q", str(bare), "main")
    return bare


@pytest.fixture
def forge(remote: Path) -> FakeForge:
    return FakeForge(remote, repository="octo/widgets", token=FORGE_TOKEN)


@pytest.fixture
def forge_url(forge: FakeForge) -> Iterator[str]:
    with serve_in_thread(forge.app, on_stop=forge.release) as url:
        yield url


@pytest.fixture
def served(build: Builder, forge_url: str, remote: Path) -> NexusServer:
    """The project with a forge: pushes to ``remote``, requires the ``ci`` check."""
    return build(
        repository={
            "forge": {
                "base_url": forge_url,
                "repository": "octo/widgets",
                "token": {"env": "FORGE_TOKEN"},
                "push_url": f"file://{remote}",
                "timeout_seconds": 5,
            },
            "merge": {"required_checks": ["ci"], "required_approvals": 1},
        },
        env={"FORGE_TOKEN": FORGE_TOKEN},
    )


def work_on_branch(project: Path) -> str:
    git(project, "checkout", "-q", "-b", BRANCH)
    sha = commit(project, {"src/app.py": "def handler(event):\n    return 2\n"}, "change")
    git(project, "checkout", "-q", "main")
    return sha


def pr_args(key: str = "pr-1") -> dict[str, Any]:
    return {
        "repo": "proj",
        "branch": BRANCH,
        "title": "Return two",
        "body": "Why: tests.",
        "idempotency_key": key,
    }


def merge_args(number: int, key: str = "m-1") -> dict[str, Any]:
    return {"repo": "proj", "pull_number": number, "idempotency_key": key}


async def open_pr(client: Client[Any], server: NexusServer) -> dict[str, Any]:
    return ok(await approved(client, server, "open_pull_request", pr_args()))


async def test_open_pull_request_pushes_the_branch_and_opens_it(
    served: NexusServer, project: Path, remote: Path, forge: FakeForge, audit: MemoryAuditSink
) -> None:
    head = work_on_branch(project)
    async with Client(served.mcp) as client:
        unapproved = await call(client, "open_pull_request", pr_args("pr-0"))
        result = await approved(client, served, "open_pull_request", pr_args())
    assert code_of(unapproved) == "APPROVAL_REQUIRED"
    opened = ok(result)
    assert (opened["number"], opened["head"], opened["base"]) == (1, BRANCH, "main")
    assert opened["head_sha"] == head == rev(remote, f"refs/heads/{BRANCH}")
    assert effect_of(result)["target_ref"] == head
    # The forge saw the gateway's own token, and only on its own requests.
    creates = [r for r in forge.requests if r.method == "POST"]
    assert len(creates) == 1
    assert creates[0].headers["authorization"] == f"Bearer {FORGE_TOKEN}"
    record = next(r for r in finished(audit, "open_pull_request") if r.get("outcome") == "OK")
    assert record["target_ref"] == head and record["approver"] == APPROVER


async def test_merge_guarded_refuses_until_checks_and_reviews_hold_then_merges(
    served: NexusServer, project: Path, remote: Path, forge: FakeForge
) -> None:
    head = work_on_branch(project)
    async with Client(served.mcp) as client:
        number = (await open_pr(client, served))["number"]
        args = merge_args(number)
        token = mint(served, "merge_guarded", args)

        async def merge() -> dict[str, Any]:
            return await call(client, "merge_guarded", {**args, "approval_token": token})

        missing = await merge()
        forge.add_check_run(head, "ci", "in_progress", None)
        pending = await merge()
        forge.add_check_run(head, "ci", "completed", "failure")
        failed = await merge()
        forge.add_check_run(head, "ci", "completed", "success")
        unreviewed = await merge()
        forge.add_review(number, "mallory", "CHANGES_REQUESTED", head)
        changes = await merge()
        forge.add_review(number, "mallory", "APPROVED", head)
        assert rev(remote, "refs/heads/main") != head
        merged = await merge()
    reasons = [envelope(r)["error"] for r in (missing, pending, failed, unreviewed, changes)]
    assert reasons == [
        "merge blocked: checks_missing",
        "merge blocked: checks_pending",
        "merge blocked: checks_failed",
        "merge blocked: reviews_missing",
        "merge blocked: changes_requested",
    ]
    assert {code_of(r) for r in (missing, pending, failed, unreviewed, changes)} == {
        "MERGE_BLOCKED"
    }
    # One token served every attempt: a refused merge spends no approval. mallory's review
    # is the approval the rules count; CODEOWNERS of src/app.py is met by the token's
    # approver, who owns it.
    done = ok(merged)
    assert done["merged"] is True and done["head_sha"] == head
    assert rev(remote, "refs/heads/main") == head
    assert effect_of(merged)["target_ref"] == head


async def test_merge_guarded_merges_only_the_head_it_judged(
    served: NexusServer, project: Path, forge: FakeForge, remote: Path
) -> None:
    head = work_on_branch(project)
    async with Client(served.mcp) as client:
        number = (await open_pr(client, served))["number"]
        forge.add_check_run(head, "ci", "completed", "success")
        forge.add_review(number, "alice", "APPROVED", head)
        pinned = await approved(
            client,
            served,
            "merge_guarded",
            {**merge_args(number, "m-2"), "expected_head_sha": "f" * 40},
        )
    assert envelope(pinned) == {"error": "merge blocked: head_changed", "code": "MERGE_BLOCKED"}
    assert rev(remote, "refs/heads/main") != head


async def test_codeowners_must_approve_a_merge_when_the_approver_owns_nothing(
    served: NexusServer, project: Path, forge: FakeForge
) -> None:
    head = work_on_branch(project)
    async with Client(served.mcp) as client:
        number = (await open_pr(client, served))["number"]
        forge.add_check_run(head, "ci", "completed", "success")
        forge.add_review(number, "mallory", "APPROVED", head)
        result = await approved(
            client, served, "merge_guarded", merge_args(number, "m-3"), approver="lead"
        )
    assert envelope(result) == {
        "error": "merge blocked: codeowners_missing",
        "code": "MERGE_BLOCKED",
    }


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("fail_500", "Upstream 500"),
        ("fail_404", "Upstream 404"),
        ("redirect", "Upstream error"),
        ("malformed", "Upstream error"),
    ],
)
async def test_forge_failures_are_sanitized(
    served: NexusServer, project: Path, forge: FakeForge, fault: str, message: str
) -> None:
    head = work_on_branch(project)
    async with Client(served.mcp) as client:
        number = (await open_pr(client, served))["number"]
        forge.add_check_run(head, "ci", "completed", "success")
        if fault.startswith("fail_"):
            forge.fail_next(int(fault.removeprefix("fail_")))
        elif fault == "redirect":
            forge.redirect_next(f"http://127.0.0.1:9/{CANARY}")
        else:
            forge.malformed_next()
        result = await approved(client, served, "merge_guarded", merge_args(number, "m-f"))
    assert envelope(result) == {"error": message, "code": "UPSTREAM_ERROR"}
    text = str(result)
    assert CANARY not in text and FORGE_TOKEN not in text and "127.0.0.1" not in text


async def test_without_a_forge_pull_requests_and_merges_are_denied(
    build: Builder, project: Path
) -> None:
    work_on_branch(project)
    server = build()
    async with Client(server.mcp) as client:
        opened = await approved(client, server, "open_pull_request", pr_args())
        merged = await approved(client, server, "merge_guarded", merge_args(1))
    assert code_of(opened) == "WRITE_POLICY_DENIED"
    assert code_of(merged) == "WRITE_POLICY_DENIED"


async def test_a_push_to_a_remote_branch_that_moved_is_a_conflict(
    served: NexusServer, project: Path, remote: Path
) -> None:
    work_on_branch(project)
    other = commit(project, {"README.md": "diverged\n"}, "elsewhere")
    git(project, "push", "-q", str(remote), f"{other}:refs/heads/{BRANCH}")
    before = rev(remote, f"refs/heads/{BRANCH}")
    async with Client(served.mcp) as client:
        result = await approved(client, served, "open_pull_request", pr_args())
    assert code_of(result) == "CONFLICT"
    assert rev(remote, f"refs/heads/{BRANCH}") == before
