"""Servers nobody here wrote, run in the bubblewrap sandbox (issue 27) through the gateway:
the reference filesystem server (npm) and the reference Git server (PyPI), each with only
its own folder writable. Each is configured as loosely as its own options allow (the
filesystem server given the whole test folder, the Git server no ``--repository``), so
that what keeps it from the gateway's data directory and configuration, and from the
other upstream's folder, is the sandbox alone; an unsandboxed Git server beside them
reaches the very same paths, which proves they are there to reach."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from .conftest import wire
from .test_upstream_fs import node_and_server
from .test_upstream_git import git, make_repo
from .test_upstream_sandbox import bwrap_present  # noqa: F401 - the fixture, by name
from .upstream_harness import (
    FS_SERVER,
    NODE_MODULES,
    Gateway,
    approve,
    copy_registry,
    git_upstream,
    make_gateway,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("bwrap_present")]

APPROVAL_SECRET = "approval-secret-for-sandbox-tests-0123456789ab"
DATA_CANARY = "GATEWAY-DATA-CANARY-7f3a"
FS_CANARY = "FS-UPSTREAM-CANARY-91c2"
GIT_CANARY = "GIT-UPSTREAM-CANARY-5d0e"
FS_TOOLS = ["read_text_file", "list_directory", "write_file"]
GIT_TOOLS = ["git_status", "git_log", "git_add"]


class Layout:
    """The gateway under ``tmp/gw`` (its data directory holds a file and a Git repository
    of its own), the filesystem server's folder ``tmp/served`` (a Git repository too) and
    the Git server's repository ``tmp/repo``; both servers sandboxed, plus ``plain``: the
    same Git server unsandboxed."""

    def __init__(self, tmp_path: Path) -> None:
        node = node_and_server()
        self.repo = make_repo(tmp_path / "repo", message=GIT_CANARY)
        self.served = make_repo(tmp_path / "served", message=FS_CANARY)
        (self.served / "notes.txt").write_text("served notes\n")
        fs = {
            "server_id": "fs",
            "transport": "stdio",
            "command": node,
            # Its own confinement: the whole test folder (the gateway's files included).
            "args": [str(FS_SERVER), str(tmp_path)],
            "tools": FS_TOOLS,
            "write_policy": {"allowed_tools": ["write_file"], "require_approval": True},
            "sandbox": {"writable": [str(self.served)], "readable": [str(NODE_MODULES)]},
        }
        boxed_git = git_upstream(
            None,
            tools=GIT_TOOLS,
            write_policy={"allowed_tools": ["git_add"], "require_approval": True},
            sandbox={"writable": [str(self.repo)]},
        )
        plain = git_upstream(None, server_id="plain", tools=["git_log"])
        grant = [f"fs_{n}" for n in FS_TOOLS] + [f"git_{n}" for n in GIT_TOOLS]
        self.gw: Gateway = make_gateway(
            tmp_path / "gw", [fs, boxed_git, plain], grant={"full": [*grant, "plain_git_log"]}
        )
        shutil.copy(Path(__file__).parents[2] / "config/upstreams/fs.json", self.gw.registry_dir)
        copy_registry(self.gw, "git")
        copy_registry(self.gw, "plain", "git")
        self.data_file = self.gw.data_dir / "state.txt"
        self.gw.data_dir.mkdir()
        self.data_file.write_text(DATA_CANARY)
        self.mirror = make_repo(self.gw.data_dir / "mirror", message=DATA_CANARY)
        for server_id in ("fs", "git", "plain"):
            assert self.gw.pin(server_id) == 0


def result(answer: Any) -> tuple[bool, str]:
    payload = wire(answer)
    return bool(payload.get("isError")), payload["content"][0]["text"]


async def test_the_git_server_sandboxed_reaches_only_its_repository(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    server = lay.gw.build(env={"NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET})
    async with Client(server.mcp) as client:

        async def log(tool: str, repo: Path) -> tuple[bool, str]:
            return result(await client.call_tool_mcp(tool, {"repo_path": str(repo)}))

        # Its own repository: read, and written through the write path.
        failed, shown = await log("git_git_log", lay.repo)
        assert not failed and GIT_CANARY in shown
        add = {"repo_path": str(lay.repo), "files": ["notes.txt"], "idempotency_key": "a-1"}
        token = approve(server, "git_git_add", add)
        staged = await client.call_tool_mcp("git_git_add", {**add, "approval_token": token})
        assert result(staged) == (False, "Files staged successfully")
        assert git(lay.repo, "diff", "--cached", "--name-only") == "notes.txt\n"

        # The other upstream's repository and the gateway's own: the unsandboxed server
        # reads them (they are there), the sandboxed one finds nothing.
        for repo, canary in ((lay.served, FS_CANARY), (lay.mirror, DATA_CANARY)):
            failed, reached = await log("plain_git_log", repo)
            assert not failed and canary in reached
            failed, shown = await log("git_git_log", repo)
            assert failed and canary not in shown
            failed, shown = await log("git_git_status", repo)
            assert failed and canary not in shown
        # Writes elsewhere: nothing of theirs changes.
        away = {"repo_path": str(lay.served), "files": ["notes.txt"], "idempotency_key": "a-2"}
        token = approve(server, "git_git_add", away)
        refused = await client.call_tool_mcp("git_git_add", {**away, "approval_token": token})
        assert result(refused)[0] is True
    assert git(lay.served, "diff", "--cached", "--name-only") == ""


async def test_the_filesystem_server_sandboxed_reaches_only_its_folder(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    server = lay.gw.build(env={"NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET})
    async with Client(server.mcp) as client:

        async def read(path: Path) -> tuple[bool, str]:
            answer = await client.call_tool_mcp("fs_read_text_file", {"path": str(path)})
            return result(answer)

        assert await read(lay.served / "notes.txt") == (False, "served notes\n")
        # Inside its own confinement (the whole test folder), outside its sandbox: the
        # gateway's data and configuration, the other upstream's repository.
        kept = (lay.data_file, lay.gw.config_file, lay.repo / "notes.txt", lay.mirror / "notes.txt")
        for path in kept:
            assert path.is_file()
            failed, shown = await read(path)
            assert failed and DATA_CANARY not in shown and "line one" not in shown
        listing = await client.call_tool_mcp("fs_list_directory", {"path": str(tmp_path)})
        failed, shown = result(listing)
        # Its sandbox shows it the test folder with only its own folder in it.
        assert (failed, shown) == (False, "[DIR] served")
        assert {p.name for p in tmp_path.iterdir()} >= {"gw", "repo", "served"}

        # A write it is approved for, outside its folder: it lands in the sandbox's own
        # scratch space at most, never on the host.
        escape = tmp_path / "escape.txt"
        arguments = {"path": str(escape), "content": "escaped", "idempotency_key": "w-1"}
        token = approve(server, "fs_write_file", arguments)
        await client.call_tool_mcp("fs_write_file", {**arguments, "approval_token": token})
        assert not escape.exists()
        inside = {"path": str(lay.served / "new.txt"), "content": "kept", "idempotency_key": "w-2"}
        token = approve(server, "fs_write_file", inside)
        written = await client.call_tool_mcp("fs_write_file", {**inside, "approval_token": token})
        assert result(written)[0] is False
    assert (lay.served / "new.txt").read_text() == "kept"
