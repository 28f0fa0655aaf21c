"""The repo toolset's writes under attack: time, the forge, approvals and start-up.

``test_repo_hostile.py`` attacks the arguments and the repository; this file attacks what
happens around a write: a write that runs out of time (git made slow by a wrapper on
``PATH``, a forge that answers late), a forge whose answers change between the gate's
judgement and the merge or that lies, CODEOWNERS on merges, pull requests with hostile
text, approvals by token and by elicitation, idempotency across targets, and start-up
configurations that must be refused. The forge is ``tests/support/forge_app.FakeForge``
with one extra knob (hooks on chosen requests) served on a real loopback socket; nothing
of nexus-mcp is patched.

Each test checks the documented outcome and that a refusal leaves the repository (and the
forge's bare repository) as it was. The defects this file found are fixed; their tests
guard the fixes.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer
from tests.support.forge_app import CANARY, FakeForge, FakePull
from tests.support.git_repos import commit, git, init_bare, make_patch, make_repo, refs, rev, state
from tests.support.loopback import serve_in_thread

from .repo_harness import (
    APPROVER,
    POLICY,
    Builder,
    approved,
    build,
    call,
    code_of,
    envelope,
    finished,
    mint,
    ok,
    project,
)
from .test_repo_forge import (
    BRANCH,
    FORGE_TOKEN,
    forge_url,
    merge_args,
    pr_args,
    remote,
    work_on_branch,
)

__all__ = ["build", "forge_url", "project", "remote"]  # fixtures, re-exported for pytest

REPO = "proj"
FEATURE = "feature/work"
Hook = Callable[[Request], Awaitable[Response | None]]


# --- a forge with hooks ---------------------------------------------------------------------


@dataclass
class HostileForge(FakeForge):
    """``FakeForge`` plus ``hooks``: each sees every authenticated request to a known pull
    request before the endpoint answers; one may change the forge's state, wait, or
    answer itself (a response) instead of the endpoint."""

    hooks: list[Hook] = field(default_factory=list)

    def _guard(self, handler: Any) -> Any:
        async def hooked(request: Request) -> Response:
            for hook in list(self.hooks):
                answer = await hook(request)
                if answer is not None:
                    return answer
            response: Response = await handler(request)
            return response

        return super()._guard(hooked)

    def on(
        self,
        method: str,
        suffix: str,
        action: Callable[[Request], Awaitable[Response | None]],
        *,
        nth: int = 1,
    ) -> None:
        """Run ``action`` on the ``nth`` request whose method and path end match."""
        seen = 0

        async def hook(request: Request) -> Response | None:
            nonlocal seen
            if request.method != method or not request.url.path.endswith(suffix):
                return None
            seen += 1
            return await action(request) if seen == nth else None

        self.hooks.append(hook)

    def puts(self) -> list[str]:
        return [r.path for r in self.requests if r.method == "PUT"]


def later(seconds: float, then: Callable[[], None] = lambda: None) -> Hook:
    """An action that waits (the forge's own loop keeps serving), changes state, answers."""

    async def action(_request: Request) -> None:
        await asyncio.sleep(seconds)
        then()

    return action


def now(then: Callable[[], None]) -> Hook:
    return later(0, then)


@pytest.fixture
def forge(remote: Path) -> HostileForge:
    return HostileForge(remote, repository="octo/widgets", token=FORGE_TOKEN)


def forge_section(url: str, remote: Path, **extra: Any) -> dict[str, Any]:
    return {
        "base_url": url,
        "repository": "octo/widgets",
        "token": {"env": "FORGE_TOKEN"},
        "push_url": f"file://{remote}",
        "timeout_seconds": 5,
        **extra,
    }


def serve(
    build: Builder,
    url: str,
    remote: Path,
    *,
    forge: dict[str, Any] | None = None,
    merge: dict[str, Any] | None = None,
    policy: dict[str, Any] | None = None,
    repository: dict[str, Any] | None = None,
    **overrides: Any,
) -> NexusServer:
    return build(
        POLICY if policy is None else policy,
        repository={
            "forge": forge_section(url, remote, **(forge or {})),
            "merge": {"required_checks": ["ci"], "required_approvals": 1, **(merge or {})},
            **(repository or {}),
        },
        env={"FORGE_TOKEN": FORGE_TOKEN},
        **overrides,
    )


def plant_pull(
    forge: FakeForge,
    project: Path,
    remote: Path,
    head_ref: str,
    *,
    base_ref: str = "main",
    files: dict[str, str | bytes | None] | None = None,
) -> tuple[int, str]:
    """A pull request put straight into the forge (not through the tool): its head is a
    new commit pushed to the remote as ``head_ref``; green and approved by mallory."""
    start = rev(project, "HEAD")
    git(project, "checkout", "-q", "--detach")
    sha = commit(project, files or {"src/app.py": "def handler(event):\n    return 3\n"}, "x")
    git(project, "checkout", "-q", "main")
    assert rev(project, "main") == start
    git(project, "push", "-q", str(remote), f"{sha}:refs/heads/{head_ref}")
    number = len(forge.pulls) + 1
    forge.pulls[number] = FakePull(
        number=number,
        title="planted",
        draft=False,
        head_ref=head_ref,
        base_ref=base_ref,
        head_sha=sha,
        files=[{"filename": name, "status": "M"} for name in (files or {"src/app.py": ""})],
    )
    green(forge, number, sha)
    return number, sha


def green(forge: FakeForge, number: int, sha: str, reviewer: str = "mallory") -> None:
    forge.add_check_run(sha, "ci", "completed", "success")
    forge.add_review(number, reviewer, "APPROVED", sha)


async def open_ready_pr(client: Client[Any], server: NexusServer, forge: FakeForge) -> int:
    """Open BRANCH's pull request through the tool, then make it green and approved."""
    opened = ok(await approved(client, server, "open_pull_request", pr_args()))
    green(forge, opened["number"], opened["head_sha"])
    number: int = opened["number"]
    return number


async def merge(
    client: Client[Any], server: NexusServer, number: int, key: str, **extra: Any
) -> dict[str, Any]:
    approver = extra.pop("approver", APPROVER)
    return await approved(
        client, server, "merge_guarded", {**merge_args(number, key), **extra}, approver=approver
    )


def blocked(result: dict[str, Any], reason: str) -> None:
    assert envelope(result) == {"error": f"merge blocked: {reason}", "code": "MERGE_BLOCKED"}


# --- a slow git -------------------------------------------------------------------------------


class SlowGit:
    """A ``git`` first on ``PATH`` (so nexus-mcp finds it at start-up) that sleeps before
    running the real git when one of its arguments is a word made slow here."""

    def __init__(self, folder: Path) -> None:
        self.words = folder / "slow"
        self.words.mkdir(parents=True)
        real, sleep = shutil.which("git"), shutil.which("sleep")
        assert real and sleep
        script = folder / "git"
        script.write_text(
            "#!/bin/sh\n"
            'for a in "$@"; do\n'
            f'  if [ -f "{self.words}/$a" ]; then read s < "{self.words}/$a"; {sleep} "$s"; '
            "break; fi\n"
            "done\n"
            f'exec {real} "$@"\n'
        )
        script.chmod(0o755)
        self.folder = folder

    def slow(self, word: str, seconds: float) -> None:
        (self.words / word).write_text(f"{seconds}\n")

    def fast(self, word: str) -> None:
        (self.words / word).unlink(missing_ok=True)


@pytest.fixture
def slow_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SlowGit:
    wrapper = SlowGit(tmp_path / "slow-git")
    monkeypatch.setenv("PATH", f"{wrapper.folder}{os.pathsep}{os.environ.get('PATH', '')}")
    return wrapper


def apply_args(patch: str, key: str, branch: str = FEATURE) -> dict[str, Any]:
    return {
        "repo": REPO,
        "branch": branch,
        "patch": patch,
        "message": "change",
        "idempotency_key": key,
    }


def branch_args(branch: str, key: str) -> dict[str, Any]:
    return {"repo": REPO, "branch": branch, "idempotency_key": key}


def log(project: Path, ref: str) -> list[str]:
    return git(project, "rev-list", ref).split()


async def settle(seconds: float) -> None:
    """Give anything a timed-out call left running the time to land (it must not)."""
    await asyncio.sleep(seconds)


# --- 1. writes that run out of time ------------------------------------------------------------


@pytest.fixture
def feature(project: Path) -> str:
    git(project, "branch", FEATURE)
    return FEATURE


async def test_a_timed_out_apply_patch_never_lands_and_its_key_stays_unknown(
    build: Builder, project: Path, feature: str, tmp_path: Path, slow_git: SlowGit
) -> None:
    patch = make_patch(project, FEATURE, {"src/app.py": "x = 1\n"}, scratch=tmp_path)
    server = build(budgets={"tool_timeouts": {"apply_patch": 0.3}})
    args = apply_args(patch, "slow-1")
    before = refs(project)
    slow_git.slow("commit-tree", 1.0)  # the tool's own git work, after the gate's
    async with Client(server.mcp) as client:
        timed_out = await approved(client, server, "apply_patch", args)
        assert code_of(timed_out) == "TOOL_TIMEOUT"
        await settle(0.5)
        assert refs(project) == before
        slow_git.fast("commit-tree")
        # The same key: its outcome is unknown, so it never runs again (nor replays).
        retried = await approved(client, server, "apply_patch", args)
        assert envelope(retried)["code"] == "IDEMPOTENCY_KEY_CONFLICT"
        assert refs(project) == before
        # A new key runs once.
        landed = ok(
            await approved(client, server, "apply_patch", {**args, "idempotency_key": "k2"})
        )
    assert log(project, FEATURE) == [landed["commit_sha"], *log(project, "main")]


async def test_a_timed_out_create_branch_never_creates_it_later(
    build: Builder, project: Path, slow_git: SlowGit
) -> None:
    server = build(budgets={"tool_timeouts": {"create_branch": 0.2}})
    args = branch_args("feature/slow", "b-1")
    before = state(project)
    slow_git.slow("rev-parse", 0.45)  # the tool's last look before update-ref (and the gate's)
    async with Client(server.mcp) as client:
        timed_out = await approved(client, server, "create_branch", args)
        assert code_of(timed_out) == "TOOL_TIMEOUT"
        await settle(0.6)
        assert state(project) == before
        slow_git.fast("rev-parse")
        retried = await approved(client, server, "create_branch", args)
        assert envelope(retried)["code"] == "IDEMPOTENCY_KEY_CONFLICT"
    assert state(project) == before


async def test_a_write_timing_out_inside_its_ref_update_does_not_stall_the_server(
    build: Builder, project: Path, slow_git: SlowGit
) -> None:
    # update-ref itself is slow (a busy disk, a lock): the timeout fires while the worker
    # holds the commit guard. The call may report the branch as created-or-not, but the
    # event loop, which serves every other client, must stay live meanwhile.
    server = build(budgets={"tool_timeouts": {"create_branch": 0.3}})
    args = branch_args("feature/stall", "s-1")
    gaps: list[float] = []
    done = asyncio.Event()

    async def heartbeat() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.02)
            current = time.monotonic()
            gaps.append(current - last)
            last = current

    slow_git.slow("update-ref", 1.5)
    async with Client(server.mcp) as client:
        beat = asyncio.create_task(heartbeat())
        try:
            result = await approved(client, server, "create_branch", args)
        finally:
            done.set()
            await beat
        assert code_of(result) == "TOOL_TIMEOUT"
        slow_git.fast("update-ref")
        retried = await approved(client, server, "create_branch", args)
        assert envelope(retried)["code"] == "IDEMPOTENCY_KEY_CONFLICT"
    # Created before the cancel, or never: at main's tip either way.
    assert refs(project).get("refs/heads/feature/stall", rev(project, "main")) == rev(
        project, "main"
    )
    assert max(gaps) < 0.6, f"event loop stalled {max(gaps):.2f}s"


async def test_a_merge_timing_out_before_its_merge_request_never_merges_later(
    build: Builder, project: Path, remote: Path, forge: HostileForge, forge_url: str
) -> None:
    work_on_branch(project)
    server = serve(build, forge_url, remote, budgets={"tool_timeouts": {"merge_guarded": 0.4}})
    async with Client(server.mcp) as client:
        number = await open_ready_pr(client, server, forge)
        main = rev(remote, "refs/heads/main")
        # The gate's look at the pull request is the 1st GET; the tool's fresh look, the 2nd.
        forge.on("GET", f"/pulls/{number}", later(1.0), nth=2)
        timed_out = await merge(client, server, number, "m-slow")
        assert code_of(timed_out) == "TOOL_TIMEOUT"
        await settle(1.0)
        assert forge.puts() == []
        assert rev(remote, "refs/heads/main") == main
        retried = await merge(client, server, number, "m-slow")
        assert envelope(retried)["code"] == "IDEMPOTENCY_KEY_CONFLICT"
    assert forge.puts() == [] and rev(remote, "refs/heads/main") == main


@pytest.mark.parametrize("answer", ["late", "garbled"])
async def test_a_merge_whose_answer_is_lost_has_an_unknown_outcome(
    build: Builder, project: Path, remote: Path, forge: HostileForge, forge_url: str, answer: str
) -> None:
    head = work_on_branch(project)
    server = serve(build, forge_url, remote, forge={"timeout_seconds": 0.5})

    async def merge_then_garble(request: Request) -> Response:
        await forge._merge(request)  # the forge merges, then its answer is unreadable
        return JSONResponse({"merged": True, "sha": "not-a-sha"})

    async with Client(server.mcp) as client:
        number = await open_ready_pr(client, server, forge)
        suffix = f"/pulls/{number}/merge"
        # It merges, but answers after the forge timeout, or answers garbage.
        forge.on("PUT", suffix, later(0.8) if answer == "late" else merge_then_garble)
        first = await merge(client, server, number, "m-lost")
        assert code_of(first) in ("UPSTREAM_ERROR", "TOOL_TIMEOUT")
        await settle(0.6 if answer == "late" else 0)
        assert rev(remote, "refs/heads/main") == head  # the forge did merge
        retried = await merge(client, server, number, "m-lost")
    assert envelope(retried)["code"] == "IDEMPOTENCY_KEY_CONFLICT"


async def test_a_timed_out_pull_request_never_pushes_later(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    slow_git: SlowGit,
) -> None:
    work_on_branch(project)
    server = serve(build, forge_url, remote, budgets={"tool_timeouts": {"open_pull_request": 0.4}})
    slow_git.slow("push", 1.0)
    async with Client(server.mcp) as client:
        timed_out = await approved(client, server, "open_pull_request", pr_args())
        assert code_of(timed_out) == "TOOL_TIMEOUT"
        reported = refs(remote)
        await settle(1.2)
        slow_git.fast("push")
        retried = await approved(client, server, "open_pull_request", pr_args())
        assert envelope(retried)["code"] == "IDEMPOTENCY_KEY_CONFLICT"
    assert [r for r in forge.requests if r.method == "POST"] == []
    assert refs(remote) == reported  # nothing lands after the timeout was reported


# --- 2. merge_guarded against a forge that changes or lies ------------------------------------


@pytest.mark.parametrize(
    ("head_ref", "base_ref", "rule"),
    [
        ("release/1.0", "main", "branch_protected"),
        ("hotfix/urgent", "main", "branch_not_allowed"),
        ("main", "feature/pr", "branch_protected"),
    ],
)
async def test_a_pull_request_from_a_branch_agents_may_not_write_is_never_merged(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    head_ref: str,
    base_ref: str,
    rule: str,
    audit: MemoryAuditSink,
) -> None:
    number, _sha = plant_pull(forge, project, remote, head_ref, base_ref=base_ref)
    server = serve(build, forge_url, remote)
    before = refs(remote)
    async with Client(server.mcp) as client:
        result = await merge(client, server, number, "m-head")
    assert code_of(result) == "WRITE_POLICY_DENIED"
    assert forge.puts() == [] and refs(remote) == before
    denied = finished(audit, "merge_guarded")[-1]
    assert denied["policy_rule"] == rule


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("head_moved", "head_changed"),
        ("mergeable_unknown", "not_mergeable"),
        ("now_draft", "not_mergeable"),
        ("closed", "pull_not_open"),
        ("check_turned_red", "checks_failed"),
        ("check_rerun_pending", "checks_pending"),
        ("changes_requested", "changes_requested"),
        ("approval_dismissed", "reviews_missing"),
    ],
)
async def test_what_changes_between_the_gate_and_the_merge_blocks_it(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    change: str,
    reason: str,
) -> None:
    work_on_branch(project)
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        number = await open_ready_pr(client, server, forge)
        pull = forge.pulls[number]
        head = pull.head_sha
        other = rev(project, "main")  # another commit the head could move to
        changes: dict[str, Callable[[], None]] = {
            "head_moved": lambda: forge.set_head(number, other),
            "mergeable_unknown": lambda: forge.set_mergeable(number, None),
            "now_draft": lambda: setattr(pull, "draft", True),
            "closed": lambda: setattr(pull, "state", "closed"),
            "check_turned_red": lambda: forge.add_check_run(head, "lint", "completed", "failure"),
            "check_rerun_pending": lambda: forge.add_check_run(head, "ci", "queued", None),
            "changes_requested": lambda: forge.add_review(number, "zed", "CHANGES_REQUESTED", head),
            "approval_dismissed": lambda: forge.add_review(number, "mallory", "DISMISSED", head),
        }
        # The tool's own fresh look at the pull request (the gate's was the 1st GET).
        forge.on("GET", f"/pulls/{number}", now(changes[change]), nth=2)
        main = rev(remote, "refs/heads/main")
        result = await merge(client, server, number, "m-race")
    blocked(result, reason)
    assert forge.puts() == [] and rev(remote, "refs/heads/main") == main


async def test_a_head_pushed_between_the_last_look_and_the_merge_is_not_merged(
    build: Builder, project: Path, remote: Path, forge: HostileForge, forge_url: str
) -> None:
    work_on_branch(project)
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        number = await open_ready_pr(client, server, forge)
        judged = forge.pulls[number].head_sha
        pushed = commit(project, {"README.md": "pushed late\n"}, "late")
        git(project, "push", "-q", str(remote), f"{pushed}:refs/heads/{BRANCH}", "--force")
        forge.on("PUT", f"/pulls/{number}/merge", now(lambda: forge.set_head(number, pushed)))
        main = rev(remote, "refs/heads/main")
        result = await merge(client, server, number, "m-late-push")
    blocked(result, "head_changed")
    assert rev(remote, "refs/heads/main") == main
    put = next(r for r in forge.requests if r.method == "PUT")
    assert judged.encode() in put.body and pushed.encode() not in put.body


@pytest.mark.parametrize(
    "case",
    ["stale_run_of_another_sha", "author_self_review", "author_self_review_other_case"],
)
async def test_checks_and_reviews_that_do_not_count(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    case: str,
) -> None:
    work_on_branch(project)
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        opened = ok(await approved(client, server, "open_pull_request", pr_args()))
        number, head = opened["number"], opened["head_sha"]
        if case == "stale_run_of_another_sha":
            # ci passed on the commit before; the head itself was never checked.
            forge.add_check_run(rev(project, "main"), "ci", "completed", "success")
            forge.add_review(number, "mallory", "APPROVED", head)
            expected = "checks_missing"
        else:
            forge.add_check_run(head, "ci", "completed", "success")
            login = forge.author if case == "author_self_review" else forge.author.upper()
            forge.add_review(number, login, "APPROVED", head)
            expected = "reviews_missing"
        main = rev(remote, "refs/heads/main")
        result = await merge(client, server, number, "m-count")
    blocked(result, expected)
    assert forge.puts() == [] and rev(remote, "refs/heads/main") == main


@pytest.mark.parametrize(("items", "merged"), [(30, True), (31, False)])
async def test_reviews_past_the_page_cap_fail_closed(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    items: int,
    merged: bool,
) -> None:
    head = work_on_branch(project)
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        opened = ok(await approved(client, server, "open_pull_request", pr_args()))
        number = opened["number"]
        forge.add_check_run(head, "ci", "completed", "success")
        for n in range(items - 1):
            forge.add_review(number, f"reviewer{n}", "APPROVED", head)
        # The last page hides a change request: a truncated list would miss it.
        forge.add_review(number, "zed", "APPROVED" if merged else "CHANGES_REQUESTED", head)
        forge.page_size = 1
        main = rev(remote, "refs/heads/main")
        result = await merge(client, server, number, "m-pages")
    if merged:
        assert ok(result)["merged"] is True and rev(remote, "refs/heads/main") == head
    else:
        assert envelope(result) == {"error": "Upstream error", "code": "UPSTREAM_ERROR"}
        assert forge.puts() == [] and rev(remote, "refs/heads/main") == main


async def test_pull_files_past_the_page_cap_fail_closed(
    build: Builder, project: Path, remote: Path, forge: HostileForge, forge_url: str
) -> None:
    work_on_branch(project)
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        number = await open_ready_pr(client, server, forge)
        # 31 pages of one file: the last one is a path the approver does not own.
        forge.pulls[number].files = [
            *({"filename": "src/app.py", "status": "M"} for _ in range(30)),
            {"filename": "docs/guide.md", "status": "M"},
        ]
        forge.page_size = 1
        main = rev(remote, "refs/heads/main")
        result = await merge(client, server, number, "m-files")
    assert envelope(result) == {"error": "Upstream error", "code": "UPSTREAM_ERROR"}
    assert forge.puts() == [] and rev(remote, "refs/heads/main") == main


async def test_two_merges_of_one_pull_request_merge_it_once(
    build: Builder, project: Path, remote: Path, forge: HostileForge, forge_url: str
) -> None:
    head = work_on_branch(project)
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        number = await open_ready_pr(client, server, forge)
        results = await asyncio.gather(
            *(merge(client, server, number, f"m-both-{n}") for n in range(3))
        )
    merged = [r for r in results if not r.get("isError")]
    assert len(merged) == 1 and ok(merged[0])["head_sha"] == head
    for result in results:
        if result.get("isError"):
            assert code_of(result) == "MERGE_BLOCKED"
    assert len(forge.puts()) <= 3 and rev(remote, "refs/heads/main") == head


# --- 3. CODEOWNERS on merges --------------------------------------------------------------------


async def test_a_pull_request_touching_a_path_nobody_owns_is_never_merged(
    build: Builder, project: Path, remote: Path, forge: HostileForge, forge_url: str
) -> None:
    # No catch-all rule any more: README.md has no owner at all.
    commit(project, {".github/CODEOWNERS": "/src/ @bob-approver\n/docs/ @carol\n"}, "owners")
    files: dict[str, str | bytes | None] = {"README.md": "# Hi\n", "src/app.py": "y = 2\n"}
    number, _sha = plant_pull(forge, project, remote, "feature/unowned", files=files)
    for login in ("bob-approver", "carol", "lead"):
        forge.add_review(number, login, "APPROVED", forge.pulls[number].head_sha)
    server = serve(build, forge_url, remote)
    before = refs(remote)
    async with Client(server.mcp) as client:
        result = await merge(client, server, number, "m-unowned")
    blocked(result, "codeowners_missing")
    assert forge.puts() == [] and refs(remote) == before


@pytest.mark.parametrize(
    ("approver", "reviewer", "merges"),
    [
        pytest.param("@org/writers", None, False, id="approver-is-the-team-name"),
        pytest.param("org/writers", None, False, id="approver-is-the-team-slug"),
        pytest.param("lead", "org/writers", False, id="reviewer-login-is-the-team-slug"),
        pytest.param("lead", "erin", False, id="reviewer-not-a-member"),
        pytest.param("lead", "Dana", True, id="reviewer-is-a-member"),
    ],
)
async def test_a_team_owns_a_path_only_through_its_members(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    approver: str,
    reviewer: str | None,
    merges: bool,
) -> None:
    files: dict[str, str | bytes | None] = {"docs/guide.md": "New guide\n"}
    number, head = plant_pull(forge, project, remote, "feature/docs", files=files)
    if reviewer is not None:
        forge.add_review(number, reviewer, "APPROVED", head)
    server = serve(
        build, forge_url, remote, repository={"codeowner_teams": {"@org/writers": ["dana"]}}
    )
    before = refs(remote)
    async with Client(server.mcp) as client:
        result = await merge(client, server, number, "m-team", approver=approver)
    if merges:
        assert ok(result)["merged"] is True and rev(remote, "refs/heads/main") == head
    else:
        blocked(result, "codeowners_missing")
        assert forge.puts() == [] and refs(remote) == before


async def test_an_owner_approval_of_an_older_commit_does_not_count(
    build: Builder, project: Path, remote: Path, forge: HostileForge, forge_url: str
) -> None:
    number, first = plant_pull(forge, project, remote, "feature/stale")
    forge.add_review(number, APPROVER, "APPROVED", first)  # the owner of src/, on `first`
    git(project, "checkout", "-q", "--detach", first)
    second = commit(project, {"src/app.py": "def handler(event):\n    return 4\n"}, "more")
    git(project, "checkout", "-q", "main")
    git(project, "push", "-q", str(remote), f"{second}:refs/heads/feature/stale")
    forge.set_head(number, second)
    green(forge, number, second)  # ci and mallory's approval on the new head
    server = serve(build, forge_url, remote)
    before = refs(remote)
    async with Client(server.mcp) as client:
        result = await merge(client, server, number, "m-stale", approver="lead")
        assert forge.puts() == [] and refs(remote) == before
        blocked(result, "codeowners_missing")
        # The owner approves the current head: now it merges.
        forge.add_review(number, APPROVER, "APPROVED", second)
        merged = ok(await merge(client, server, number, "m-fresh", approver="lead"))
    assert merged["head_sha"] == second == rev(remote, "refs/heads/main")


async def test_an_owner_approval_dismissed_before_the_merge_no_longer_counts(
    build: Builder, project: Path, remote: Path, forge: HostileForge, forge_url: str
) -> None:
    number, head = plant_pull(forge, project, remote, "feature/dismiss")
    forge.add_review(number, APPROVER, "APPROVED", head)  # the owner; mallory approved too
    # The tool's own fresh look at the reviews (the gate's was the 1st): dismissed.
    dismiss = now(lambda: forge.add_review(number, APPROVER, "DISMISSED", head))
    forge.on("GET", f"/pulls/{number}/reviews", dismiss, nth=2)
    server = serve(build, forge_url, remote)
    before = refs(remote)
    async with Client(server.mcp) as client:
        result = await merge(client, server, number, "m-dismissed", approver="lead")
    assert refs(remote) == before and forge.puts() == []
    blocked(result, "codeowners_missing")


# --- 4. open_pull_request -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "code"),
    [
        pytest.param({"title": "Two\nlines"}, "INVALID_INPUT", id="title-newline"),
        pytest.param({"title": "carriage\rreturn"}, "INVALID_INPUT", id="title-cr"),
        pytest.param({"title": "bell\x07"}, "INVALID_INPUT", id="title-bell"),
        pytest.param({"title": "\x1b[31mred"}, "INVALID_INPUT", id="title-escape"),
        pytest.param({"title": "nul\x00"}, "INVALID_INPUT", id="title-nul"),
        pytest.param({"title": "del\x7f"}, "INVALID_INPUT", id="title-del"),
        pytest.param({"title": "   "}, "INVALID_INPUT", id="title-blank"),
        pytest.param({"title": "t" * 257}, "INVALID_INPUT", id="title-too-long"),
        pytest.param({"body": "b" * (64 * 1024 + 1)}, "INVALID_INPUT", id="body-too-long"),
        pytest.param({"body": "esc\x1b]8;;https://evil/\x07"}, "INVALID_INPUT", id="body-osc"),
        pytest.param({"branch": "feature/missing"}, "NOT_FOUND", id="head-missing"),
        pytest.param({"base": "nowhere"}, "NOT_FOUND", id="base-missing"),
        pytest.param({"base": "-main"}, "INVALID_INPUT", id="base-option"),
        pytest.param({"branch": "main"}, "WRITE_POLICY_DENIED", id="head-protected"),
        pytest.param({"branch": "hotfix/x"}, "WRITE_POLICY_DENIED", id="head-not-allowed"),
    ],
)
async def test_a_pull_request_with_hostile_fields_pushes_and_opens_nothing(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    change: dict[str, Any],
    code: str,
) -> None:
    work_on_branch(project)
    git(project, "branch", "hotfix/x")
    server = serve(build, forge_url, remote)
    before, local = refs(remote), state(project)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "open_pull_request", {**pr_args(), **change})
    assert code_of(result) == code
    assert forge.requests == [] and refs(remote) == before and state(project) == local


@pytest.mark.parametrize(
    "title",
    [
        pytest.param("one\x85two", id="nel"),
        pytest.param("one\u2028two", id="line-separator"),
        pytest.param("csi\x9b31m red", id="c1-csi"),
    ],
)
async def test_a_title_with_a_unicode_line_break_or_c1_control_is_refused(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    title: str,
) -> None:
    work_on_branch(project)
    server = serve(build, forge_url, remote)
    before = refs(remote)
    async with Client(server.mcp) as client:
        result = await approved(client, server, "open_pull_request", {**pr_args(), "title": title})
    assert code_of(result) == "INVALID_INPUT"
    assert forge.requests == [] and refs(remote) == before


async def test_a_body_at_its_limit_is_sent_whole(
    build: Builder, project: Path, remote: Path, forge: HostileForge, forge_url: str
) -> None:
    work_on_branch(project)
    server = serve(build, forge_url, remote)
    body = "\u00e9" * (64 * 1024)  # characters, not bytes: 128 KiB of UTF-8
    async with Client(server.mcp) as client:
        result = await approved(client, server, "open_pull_request", {**pr_args(), "body": body})
    assert ok(result)["number"] == 1
    (posted,) = [r for r in forge.requests if r.method == "POST"]
    assert json.loads(posted.body)["body"] == body


async def test_a_pull_request_that_exists_is_a_conflict_and_the_key_is_free(
    build: Builder, project: Path, remote: Path, forge: HostileForge, forge_url: str
) -> None:
    head = work_on_branch(project)
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        first = ok(await approved(client, server, "open_pull_request", pr_args("pr-a")))
        again = await approved(client, server, "open_pull_request", pr_args("pr-b"))
        assert envelope(again)["code"] == "CONFLICT"
        assert CANARY not in str(again)
        # The forge said no and changed nothing: the key of the refused call is free.
        forge.pulls[first["number"]].state = "closed"
        reopened = ok(await approved(client, server, "open_pull_request", pr_args("pr-b")))
    assert reopened["number"] == 2 and reopened["head_sha"] == head
    assert rev(remote, f"refs/heads/{BRANCH}") == head


class Decoy:
    """Another loopback service: anything sent to it is recorded (it must get nothing)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

        async def record(request: Request) -> Response:
            self.seen.append({k.lower(): v for k, v in request.headers.items()})
            return JSONResponse([])

        self.app = Starlette(routes=[Route("/{path:path}", record, methods=["GET", "PUT", "POST"])])


@pytest.fixture
def decoy_url() -> Iterator[tuple[Decoy, str]]:
    decoy = Decoy()
    with serve_in_thread(decoy.app) as url:
        yield decoy, url


@pytest.mark.parametrize("lure", ["redirect_create", "redirect_merge", "next_link", "localhost"])
async def test_the_forge_token_goes_to_the_forge_and_nowhere_else(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    decoy_url: tuple[Decoy, str],
    lure: str,
) -> None:
    decoy, elsewhere = decoy_url
    work_on_branch(project)
    server = serve(build, forge_url, remote)
    async with Client(server.mcp) as client:
        if lure == "redirect_create":
            forge.redirect_next(f"{elsewhere}/repos/octo/widgets/pulls")
            result = await approved(client, server, "open_pull_request", pr_args())
        else:
            number = await open_ready_pr(client, server, forge)
            if lure == "redirect_merge":
                forge.redirect_next(f"{elsewhere}/x")
            else:
                forge.page_size = 1
                forge.add_review(number, "zed", "COMMENTED", forge.pulls[number].head_sha)
                # Same port, another name for the loopback: another origin all the same.
                port = forge_url.rsplit(":", 1)[1]
                forge.link_base = elsewhere if lure == "next_link" else f"http://localhost:{port}"
            main = rev(remote, "refs/heads/main")
            result = await merge(client, server, number, "m-lure")
            assert rev(remote, "refs/heads/main") == main and forge.puts() == []
    assert envelope(result) == {"error": "Upstream error", "code": "UPSTREAM_ERROR"}
    assert decoy.seen == []
    assert FORGE_TOKEN not in str(result)
    for request in forge.requests:
        assert request.headers.get("authorization") == f"Bearer {FORGE_TOKEN}"


# --- 5. approvals: tokens offered where they do not belong, and elicitation ------------------


async def test_a_token_offered_to_a_read_or_another_tool_is_never_spent(
    build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    patch = make_patch(project, FEATURE, {"src/app.py": "x = 1\n"}, scratch=tmp_path)
    server = build()
    args = apply_args(patch, "k-read")
    token = mint(server, "apply_patch", args)
    review = {"repo": REPO, "branch": FEATURE, "patch": patch}
    before = state(project)
    async with Client(server.mcp) as client:
        as_argument = await call(client, "propose_patch", {**review, "approval_token": token})
        assert code_of(as_argument) == "INVALID_INPUT"
        as_meta = await call(
            client, "propose_patch", review, meta={"nexus.mcp/approval_token": token}
        )
        assert ok(as_meta)["applies"] is True
        wrong = {**branch_args("feature/other", "k-b"), "approval_token": token}
        assert code_of(await call(client, "create_branch", wrong)) == "APPROVAL_INVALID"
        assert state(project) == before
        landed = ok(await call(client, "apply_patch", {**args, "approval_token": token}))
    assert rev(project, FEATURE) == landed["commit_sha"]


ELICIT = {**POLICY, "approval_mode": "elicit"}


def elicitation(action: str, value: str | None = None) -> tuple[Any, list[str]]:
    asked: list[str] = []

    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        asked.append(message)
        return ElicitResult(action=action, content={"value": value} if value else None)

    return handler, asked


@pytest.mark.parametrize(
    ("answer", "files", "outcome"),
    [
        pytest.param(("accept", "approve"), {"src/app.py": "x = 1\n"}, "OK", id="owner-accepts"),
        pytest.param(
            ("accept", "approve"),
            {"docs/guide.md": "New\n"},
            "WRITE_POLICY_DENIED",
            id="caller-owns-nothing-there",
        ),
        pytest.param(
            ("decline", None), {"src/app.py": "x = 1\n"}, "APPROVAL_REQUIRED", id="decline"
        ),
        pytest.param(
            ("accept", "deny"), {"src/app.py": "x = 1\n"}, "APPROVAL_REQUIRED", id="accept-deny"
        ),
    ],
)
async def test_elicited_approval_is_the_callers_and_codeowners_apply_to_the_caller(
    build: Builder,
    project: Path,
    feature: str,
    tmp_path: Path,
    audit: MemoryAuditSink,
    answer: tuple[str, str | None],
    files: dict[str, str | bytes | None],
    outcome: str,
) -> None:
    patch = make_patch(project, FEATURE, files, scratch=tmp_path)
    server = build(ELICIT)
    handler, asked = elicitation(*answer)
    before = state(project)
    async with Client(server.mcp, mode="legacy", elicitation_handler=handler) as client:
        result = await call(client, "apply_patch", apply_args(patch, "k-el"))
    # A write the caller could not approve is refused before anyone is asked.
    expected_questions = 0 if outcome == "WRITE_POLICY_DENIED" else 1
    assert len(asked) == expected_questions
    assert all(patch not in q and REPO in q and FEATURE in q for q in asked)
    if outcome != "OK":
        assert code_of(result) == outcome
        assert state(project) == before
        return
    landed = ok(result)
    assert rev(project, FEATURE) == landed["commit_sha"]
    who = git(
        project, "log", "-1", "--format=%an|%cn|%(trailers:key=Approved-by,valueonly)", FEATURE
    )
    assert who.strip() == "alice|alice|alice <alice@nexus-mcp.invalid>"
    record = next(r for r in finished(audit, "apply_patch") if r.get("outcome") == "OK")
    assert (record["approver"], record["host_id"]) == ("alice", "elicitation")


async def test_an_elicited_approval_needs_a_client_that_can_answer(
    build: Builder, project: Path, feature: str, tmp_path: Path
) -> None:
    patch = make_patch(project, FEATURE, {"src/app.py": "x = 1\n"}, scratch=tmp_path)
    server = build(ELICIT)
    args = apply_args(patch, "k-el")
    before = state(project)
    async with Client(server.mcp) as client:  # no elicitation handler; a token does not help
        result = await approved(client, server, "apply_patch", args)
    assert code_of(result) == "APPROVAL_REQUIRED"
    assert state(project) == before


# --- 6. idempotency: a record belongs to the target it acted on ------------------------------


async def test_one_key_on_two_repositories_runs_on_each(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    other = make_repo(tmp_path / "roots" / "other", {"README.md": "other\n"})
    policy = {**POLICY, "require_codeowners": False}
    server = build(
        repos={
            "repositories": {
                "proj": {"path": str(project), "write_policy": policy},
                "other": {"path": str(other), "write_policy": policy},
            }
        }
    )
    async with Client(server.mcp) as client:
        first = await approved(client, server, "create_branch", branch_args("feature/k", "same"))
        second = await approved(
            client, server, "create_branch", {**branch_args("feature/k", "same"), "repo": "other"}
        )
    assert ok(first)["commit_sha"] == rev(project, "feature/k")
    assert ok(second)["commit_sha"] == rev(other, "feature/k")
    assert "nexus.mcp/idempotent_replay" not in second["_meta"]


async def test_one_key_after_the_name_moved_to_another_repository_runs_there(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    moved = make_repo(tmp_path / "roots" / "moved", {"README.md": "moved\n"})
    shared = tmp_path / "shared-data"
    first = build(data_dir=shared)
    second = build(data_dir=shared, repository={"path": str(moved)})
    args = branch_args("feature/k", "same")
    async with Client(first.mcp) as client:
        ok(await approved(client, first, "create_branch", args))
    async with Client(second.mcp) as client:
        result = await approved(client, second, "create_branch", args)
    assert "nexus.mcp/idempotent_replay" not in result["_meta"]
    assert ok(result)["commit_sha"] == rev(moved, "feature/k")


async def test_one_merge_key_on_another_forge_is_not_a_replay(
    build: Builder,
    project: Path,
    remote: Path,
    forge: HostileForge,
    forge_url: str,
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared-data"
    number, head = plant_pull(forge, project, remote, "feature/one")
    first = serve(build, forge_url, remote, data_dir=shared)
    async with Client(first.mcp) as client:
        assert ok(await merge(client, first, number, "same"))["merged"] is True
    assert rev(remote, "refs/heads/main") == head
    # The operator points the repository at another forge repository; its pull request 1.
    other_remote = init_bare(tmp_path / "other.git")
    git(project, "push", "-q", str(other_remote), "main")
    other = HostileForge(other_remote, repository="octo/gadgets", token=FORGE_TOKEN)
    other_number, other_head = plant_pull(other, project, other_remote, "feature/one")
    assert other_number == number
    with serve_in_thread(other.app, on_stop=other.release) as other_url:
        second = serve(
            build,
            other_url,
            other_remote,
            forge={"repository": "octo/gadgets"},
            data_dir=shared,
        )
        async with Client(second.mcp) as client:
            result = await merge(client, second, number, "same")
    assert "nexus.mcp/idempotent_replay" not in result["_meta"]
    assert ok(result)["merged"] is True and rev(other_remote, "refs/heads/main") == other_head


# --- 7. start-up refusals ----------------------------------------------------------------------

SECRET_VALUE = "ghp_STARTUP-CANARY-7f3a"


def startup_case(case: str, project: Path, tmp_path: Path) -> tuple[dict[str, Any], str]:
    """``(build arguments, the location the refusal must name)`` for one bad configuration."""
    outside = tmp_path / "elsewhere"
    forge = {"base_url": "https://forge.example.com", "repository": "octo/widgets"}
    token = {"token": {"env": "FORGE_TOKEN"}}
    env = {"FORGE_TOKEN": SECRET_VALUE}
    where = "repos.repositories.proj"
    if case == "path-outside-roots":
        repo = make_repo(outside / "repo", {"a.txt": "a\n"})
        return {"repository": {"path": str(repo)}}, where
    if case == "symlink-to-outside":
        repo = make_repo(outside / "repo", {"a.txt": "a\n"})
        link = tmp_path / "roots" / "link"
        link.symlink_to(repo)
        return {"repository": {"path": str(link)}}, where
    if case == "worktree-of-outside-repo":
        repo = make_repo(outside / "repo", {"a.txt": "a\n"})
        tree = tmp_path / "roots" / "tree"
        git(repo, "worktree", "add", "-q", str(tree), "-b", "wt")
        return {"repository": {"path": str(tree)}}, where
    if case == "dev-allow-all-in-prod":
        return {"repos": {"dev_allow_all_repos": True}}, "repos.dev_allow_all_repos"
    if case == "bad-protected-regex":
        return {"repository": {"protected_branches": ["release/(" + SECRET_VALUE]}}, (
            f"{where}.protected_branches[0]"
        )
    if case == "forge-http-not-loopback":
        forge = {**forge, "base_url": "http://forge.example.com", **token}
        return {"repository": {"forge": forge}, "env": env}, f"{where}.forge"
    if case == "forge-url-credentials":
        forge = {**forge, "base_url": f"https://x:{SECRET_VALUE}@forge.example.com", **token}
        return {"repository": {"forge": forge}, "env": env}, f"{where}.forge"
    if case == "forge-url-query":
        forge = {**forge, "base_url": f"https://forge.example.com/?t={SECRET_VALUE}"}
        return {"repository": {"forge": forge}}, f"{where}.forge.base_url"
    if case == "forge-token-unset":
        return {"repository": {"forge": {**forge, **token}}}, f"{where}.forge"
    if case == "forge-token-not-a-header":
        bad = {"FORGE_TOKEN": f"{SECRET_VALUE}\r\nX-Evil: 1"}
        return {"repository": {"forge": {**forge, **token}}, "env": bad}, f"{where}.forge"
    if case == "forge-token-inline":
        forge = {**forge, "token": SECRET_VALUE}
        return {"repository": {"forge": forge}}, f"{where}.forge.token"
    if case == "forge-repository-dots":
        forge = {**forge, "repository": "octo/..", **token}
        return {"repository": {"forge": forge}, "env": env}, f"{where}.forge"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "path-outside-roots",
        "symlink-to-outside",
        "worktree-of-outside-repo",
        "dev-allow-all-in-prod",
        "bad-protected-regex",
        "forge-http-not-loopback",
        "forge-url-credentials",
        "forge-url-query",
        "forge-token-unset",
        "forge-token-not-a-header",
        "forge-token-inline",
        "forge-repository-dots",
    ],
)
def test_bad_configurations_stop_start_up_naming_the_place_not_the_secret(
    build: Builder, project: Path, tmp_path: Path, case: str
) -> None:
    arguments, where = startup_case(case, project, tmp_path)
    before = state(project)
    with pytest.raises(ConfigError) as caught:
        build(**arguments)
    message = str(caught.value)
    assert where in message, message
    assert SECRET_VALUE not in message and str(tmp_path / "elsewhere") not in message
    assert state(project) == before


def test_inline_credentials_in_the_push_url_are_refused_in_prod(build: Builder) -> None:
    forge = {
        "base_url": "https://forge.example.com",
        "repository": "octo/widgets",
        "token": {"env": "FORGE_TOKEN"},
        "push_url": f"https://x-access-token:{SECRET_VALUE}@forge.example.com/octo/widgets.git",
    }
    with pytest.raises(ConfigError) as caught:
        build(repository={"forge": forge}, env={"FORGE_TOKEN": "t0ken"})
    assert "repos.repositories.proj.forge.push_url" in str(caught.value)
    assert SECRET_VALUE not in str(caught.value)
