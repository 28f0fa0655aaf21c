"""The reference Git MCP server (``mcp-server-git`` from PyPI, pinned in the test extra)
through the gateway as a real upstream process, on a real repository in tmp_path: its
read tools classified as reads by ``config/upstreams/git.json`` and answered; its write
tools only through the write path (the write policy, then an approval), and nothing
written to the repository until then."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from fastmcp import Client

from .conftest import wire
from .upstream_harness import (
    Gateway,
    approve,
    copy_registry,
    envelope,
    git_upstream,
    make_gateway,
    require_git_server,
)

APPROVAL_SECRET = "approval-secret-for-git-tests-0123456789abcdef"
READS = ["git_status", "git_log", "git_diff_unstaged", "git_diff_staged", "git_diff", "git_show"]
WRITES = ["git_add", "git_commit", "git_checkout"]
GIT = shutil.which("git") or "git"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV, "HOME": str(repo.parent)}
    done = subprocess.run(
        [GIT, "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout


def make_repo(repo: Path, message: str = "first: the notes") -> Path:
    """A repository with one commit and one unstaged change to ``notes.txt``."""
    require_git_server()
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "notes.txt").write_text("line one\n")
    git(repo, "add", "notes.txt")
    git(repo, "commit", "-q", "-m", message)
    (repo / "notes.txt").write_text("line one\nline two\n")
    return repo


def git_gateway(tmp_path: Path, repo: Path, **changes: Any) -> Gateway:
    upstream = git_upstream(
        repo,
        tools=READS + WRITES,
        write_policy={"allowed_tools": ["git_add", "git_commit"], "require_approval": True},
        **changes,
    )
    gw = make_gateway(
        tmp_path / "gw", [upstream], grant={"full": [f"git_{n}" for n in READS + WRITES]}
    )
    copy_registry(gw, "git")
    return gw


def text(result: Any) -> str:
    payload = wire(result)
    assert payload.get("isError") is False, payload
    value: str = payload["content"][0]["text"]
    return value


def effect(result: Any) -> dict[str, Any]:
    found: dict[str, Any] = wire(result)["_meta"]["nexus.mcp/tool_effect"]
    return found


async def test_the_reference_git_server_reads_through_the_gateway(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    gw = git_gateway(tmp_path, repo)
    assert gw.check("git") == 1  # nothing pinned yet
    assert gw.pin("git") == 0
    assert gw.check("git") == 0
    async with Client(gw.build().mcp) as client:
        listed = {t.name for t in await client.list_tools() if t.name.startswith("git_")}
        # The allowlist: git_reset, git_branch and git_create_branch are not exposed.
        assert listed == {f"git_{n}" for n in READS + WRITES}
        where = {"repo_path": str(repo)}

        status = await client.call_tool_mcp("git_git_status", where)
        assert "notes.txt" in text(status) and "modified" in text(status)
        log = await client.call_tool_mcp("git_git_log", where)
        assert "first: the notes" in text(log)
        unstaged = await client.call_tool_mcp("git_git_diff_unstaged", where)
        assert "+line two" in text(unstaged)
        head = await client.call_tool_mcp("git_git_diff", {**where, "target": "HEAD"})
        assert "+line two" in text(head)
        for result, tool in ((status, "git_status"), (log, "git_log"), (head, "git_diff")):
            assert effect(result)["tool_class"] == "read"
            assert (effect(result)["server_id"], effect(result)["tool_name"]) == ("git", tool)

        # The upstream's own refusals are its results: a path outside its repository, a
        # target that would be a flag. Passed through as the tool's output, nothing run.
        outside = await client.call_tool_mcp("git_git_status", {"repo_path": str(tmp_path)})
        assert wire(outside)["isError"] is True
        flag = await client.call_tool_mcp("git_git_diff", {**where, "target": "--output=/x"})
        assert wire(flag)["isError"] is True
        assert not Path("/x").exists()
    finished = [e for e in gw.events("tool_call_finished") if e.get("server_id") == "git"]
    assert {e["upstream_tool"] for e in finished} >= {"git_status", "git_log", "git_diff"}


async def test_its_writes_take_the_write_path(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    gw = git_gateway(tmp_path, repo)
    assert gw.pin("git") == 0
    server = gw.build(env={"NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET})
    head = git(repo, "rev-parse", "HEAD")
    async with Client(server.mcp) as client:
        add = {"repo_path": str(repo), "files": ["notes.txt"], "idempotency_key": "add-1"}
        unapproved = await client.call_tool_mcp("git_git_add", add)
        assert envelope(unapproved)["code"] == "APPROVAL_REQUIRED"
        assert git(repo, "diff", "--cached", "--name-only") == ""  # nothing staged

        # A write tool the policy does not list: denied, whatever approval comes with it.
        checkout = {"repo_path": str(repo), "branch_name": "main", "idempotency_key": "co-1"}
        denied = await client.call_tool_mcp(
            "git_git_checkout",
            {**checkout, "approval_token": approve(server, "git_git_checkout", checkout)},
        )
        assert envelope(denied)["code"] == "WRITE_POLICY_DENIED"

        token = approve(server, "git_git_add", add)
        staged = await client.call_tool_mcp("git_git_add", {**add, "approval_token": token})
        assert text(staged) == "Files staged successfully"
        assert effect(staged)["tool_class"] == "write"
        assert git(repo, "diff", "--cached", "--name-only") == "notes.txt\n"

        commit = {"repo_path": str(repo), "message": "second: via nexus", "idempotency_key": "c-1"}
        unapproved = await client.call_tool_mcp("git_git_commit", commit)
        assert envelope(unapproved)["code"] == "APPROVAL_REQUIRED"
        assert git(repo, "rev-parse", "HEAD") == head
        token = approve(server, "git_git_commit", commit)
        done = await client.call_tool_mcp("git_git_commit", {**commit, "approval_token": token})
        assert "Changes committed successfully" in text(done)
        # Another approval for other arguments does not carry over.
        other = {**commit, "message": "third", "idempotency_key": "c-2"}
        reused = await client.call_tool_mcp("git_git_commit", {**other, "approval_token": token})
        assert envelope(reused)["code"] == "APPROVAL_INVALID"
    assert git(repo, "log", "-1", "--format=%s") == "second: via nexus\n"
    assert git(repo, "rev-parse", "HEAD^") == head
    assert git(repo, "log", "--format=%s").splitlines() == ["second: via nexus", "first: the notes"]
