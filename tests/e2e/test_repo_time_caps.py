"""The repo read tools' time caps bound the work, and a timed-out call's work stops.

A scan (``search_content``, ``locate_component``) checks ``search.max_seconds`` inside its
loops and kills the git it waits for at that cap, reporting ``max_seconds`` in
``caps_hit``; a call answered ``TOOL_TIMEOUT`` leaves no git child and no working thread
behind. The assertions are on what is left running and on bounds many times the cap, never
on tight wall-clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from tests.support.git_repos import GIT, commit, git

from .repo_harness import Builder, build, call, code_of, ok, project

__all__ = ["build", "project"]  # the harness's fixtures, re-exported for pytest

REPO = "proj"
SLEEP_MARK = "59.7315"  # the stand-in git's sleep: found in /proc while it runs
# About 0.2 s of definition matching per copy (2 MiB of lines the pattern must look into),
# with one real definition at the end.
HEAVY_LINE = "function (" + "x" * 180 + ") function\n"
COPIES = 2 * 1024 * 1024 // len(HEAVY_LINE) - 2


def heavy(tag: int) -> str:
    return f"// {tag}\n" + HEAVY_LINE * COPIES + "class Widget:\n"


def git_children() -> list[str]:
    """Processes of the stand-in git (or its sleep) still running, by command line."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if SLEEP_MARK.encode() in cmdline or b"slow-git" in cmdline:
            found.append(cmdline.decode(errors="replace"))
    return found


def working_threads() -> list[str]:
    """Threads (other than this one) whose stack is in the repo toolset's code."""
    busy = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        current: Any = frame
        while current is not None:
            name = current.f_code.co_filename
            if f"nexus_mcp{os.sep}tools{os.sep}repo.py" in name or f"{os.sep}repos{os.sep}" in name:
                busy.append(name)
                break
            current = current.f_back
    return busy


async def settled(check: Any, seconds: float = 3.0) -> Any:
    """``check()`` after at most ``seconds`` of letting things finish (generous)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and check():
        await asyncio.sleep(0.05)
    return check()


@pytest.fixture
def slow_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A stand-in ``git`` first on PATH: real git, except that while ``slow-<command>``
    exists next to it, that command sleeps first (in its own process group, as git)."""
    folder = tmp_path / "slow-git"
    folder.mkdir()
    script = folder / "git"
    real = shutil.which(GIT) or GIT
    script.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do\n'
        '  case "$arg" in cat-file|ls-tree)\n'
        f'    if [ -e "{folder}/slow-$arg" ]; then sleep {SLEEP_MARK}; fi; break;;\n'
        "  esac\n"
        "done\n"
        f'exec {real} "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    yield folder
    for name in ("slow-cat-file", "slow-ls-tree"):
        (folder / name).unlink(missing_ok=True)


async def test_many_paths_to_one_large_blob_are_searched_once(
    build: Builder, project: Path
) -> None:
    # 120 paths, one 2 MiB blob: the definition search runs once for the blob, not once
    # per path (which took ~0.2 s each, far past the 1 s cap, with no cap reported).
    body = heavy(0)
    commit(project, {f"src/copy{n:03}.ts": body for n in range(120)}, "copies")
    server = build(search={"max_seconds": 1.0})
    async with Client(server.mcp) as client:
        started = time.monotonic()
        located = ok(await call(client, "locate_component", {"repo": REPO, "name": "Widget"}))
        located_in = time.monotonic() - started
        started = time.monotonic()
        searched = ok(await call(client, "search_content", {"repo": REPO, "pattern": "Widget"}))
        searched_in = time.monotonic() - started
    for result, took in ((located, located_in), (searched, searched_in)):
        assert took < 8.0, (took, result["caps_hit"])
        if "max_seconds" not in result["caps_hit"]:
            assert result["files_scanned"] >= 120
    if "max_seconds" not in located["caps_hit"]:
        paths = {m["path"] for m in located["matches"] if m["kind"] == "definition"}
        assert {p for p in paths if "copy" in p} == {f"src/copy{n:03}.ts" for n in range(99)}


async def test_the_cap_stops_a_scan_of_many_large_blobs(build: Builder, project: Path) -> None:
    # Twelve distinct 2 MiB blobs, ~0.2 s of matching each, all in one git batch: the cap
    # is asked between blobs and inside each, not only before the batch.
    commit(project, {f"src/big{n:02}.ts": heavy(n) for n in range(12)}, "big")
    server = build(search={"max_seconds": 0.5})
    async with Client(server.mcp) as client:
        started = time.monotonic()
        located = ok(await call(client, "locate_component", {"repo": REPO, "name": "Widget"}))
        took = time.monotonic() - started
    assert "max_seconds" in located["caps_hit"], located["caps_hit"]
    assert located["truncated"] is True
    assert took < 6.0


@pytest.mark.parametrize(
    ("tool", "args", "slow"),
    [
        ("search_content", {"pattern": "handler"}, "cat-file"),
        ("locate_component", {"name": "Widget"}, "cat-file"),
        ("search_content", {"pattern": "handler"}, "ls-tree"),
    ],
)
async def test_the_cap_kills_the_git_a_scan_waits_for(
    build: Builder, project: Path, slow_git: Path, tool: str, args: dict[str, Any], slow: str
) -> None:
    # git hangs (here: sleeps) inside a scan; the cap (1 s) ends it, long before git's own
    # time bound (20 s), and the call reports the cap.
    server = build(search={"max_seconds": 1.0})
    (slow_git / f"slow-{slow}").touch()
    async with Client(server.mcp) as client:
        started = time.monotonic()
        result = ok(await call(client, tool, {"repo": REPO, **args}))
        took = time.monotonic() - started
    assert "max_seconds" in result["caps_hit"], result
    assert took < 10.0
    assert await settled(git_children) == []


@pytest.mark.parametrize(
    ("tool", "args", "slow"),
    [
        ("read_repo_file", {"path": "README.md"}, "cat-file"),
        ("list_repo_files", {"recursive": True}, "ls-tree"),
        ("search_content", {"pattern": "handler"}, "cat-file"),
        ("locate_component", {"name": "Widget"}, "ls-tree"),
    ],
)
async def test_a_timed_out_call_leaves_no_git_and_no_working_thread(
    build: Builder, project: Path, slow_git: Path, tool: str, args: dict[str, Any], slow: str
) -> None:
    server = build(search={"max_seconds": 25.0}, budgets={"tool_timeouts": {tool: 1.0}})
    (slow_git / f"slow-{slow}").touch()
    async with Client(server.mcp) as client:
        started = time.monotonic()
        result = await call(client, tool, {"repo": REPO, **args})
        took = time.monotonic() - started
        assert code_of(result) == "TOOL_TIMEOUT"
        assert took < 10.0
        # Answered: the thread has stopped, and git's whole process group was sent SIGKILL
        # (the kernel may take a moment to tear a killed grandchild down: settled()).
        assert working_threads() == []
        assert await settled(git_children) == []
        await asyncio.sleep(0.5)  # and nothing starts later
        assert git_children() == []
        assert working_threads() == []
        # The server still answers, and git works again once it is fast.
        (slow_git / f"slow-{slow}").unlink()
        again = await call(client, tool, {"repo": REPO, **args})
        assert again.get("isError") is not True, again


def regex_children() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"regex_child.py" in cmdline and str(os.getpid()).encode() in _ppid(pid):
                found.append(pid)
    return found


def _ppid(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1]
    except (OSError, IndexError):
        return b""


async def test_a_timed_out_regex_search_stops_its_sandbox_at_once(
    build: Builder, project: Path
) -> None:
    # A backtracking regex on a long line: the sandbox child would run to the scan's cap
    # (25 s here); the call's timeout (1 s) kills it, and the answer does not wait for it.
    commit(project, {"src/slow.ts": "a" * 5000 + "!\n"}, "slow")
    server = build(search={"max_seconds": 25.0}, budgets={"tool_timeouts": {"search_content": 1.0}})
    async with Client(server.mcp) as client:
        started = time.monotonic()
        result = await call(
            client, "search_content", {"repo": REPO, "pattern": "(a+)+$", "regex": True}
        )
        took = time.monotonic() - started
        assert code_of(result) == "TOOL_TIMEOUT"
        assert working_threads() == []
        assert await settled(regex_children) == []
    assert took < 8.0


# --- the write tools' reads: the decision's git work stops with its call too -------------------


def side_branch(project: Path) -> None:
    """A branch one text commit ahead of main: judging it reads a blob (``cat-file``)."""
    start = git(project, "rev-parse", "HEAD").strip()
    commit(project, {"src/side.py": "side = 1\n"}, "side")
    git(project, "branch", "-f", "side", "HEAD")
    git(project, "reset", "-q", "--hard", start)


PATCH = (
    "diff --git a/src/new.py b/src/new.py\nnew file mode 100644\n--- /dev/null\n"
    "+++ b/src/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
)


@pytest.mark.parametrize(
    ("tool", "args", "slow"),
    [
        (
            "create_branch",
            {"branch": "feature/x", "from_ref": "side", "idempotency_key": "k"},
            "cat-file",  # the range's new blob, read to judge it
        ),
        (
            "apply_patch",
            {"branch": "side", "patch": PATCH, "message": "m", "idempotency_key": "k"},
            "ls-tree",  # the patch's entries, looked up for its scratch index
        ),
    ],
)
async def test_a_write_cancelled_in_its_decision_leaves_no_git_and_no_working_thread(
    build: Builder, project: Path, slow_git: Path, tool: str, args: dict[str, Any], slow: str
) -> None:
    # The approval layer judges what the write would publish or commit (its range, its
    # patch) before the tool runs. The client goes away while that git hangs: the call is
    # cancelled, and its git and thread must stop with it, not run on to git's own bound.
    side_branch(project)
    policy = {
        "allowed_branches": ["feature/.*", "side"],
        "require_approval": False,
        "require_codeowners": False,
        "allowed_operations": ["create_branch", "apply_patch"],
    }
    server = build(policy)
    (slow_git / f"slow-{slow}").touch()
    async with Client(server.mcp) as client:
        running = asyncio.ensure_future(call(client, tool, {"repo": REPO, **args}))
        assert await settled(lambda: not git_children(), 10.0) is False  # git is hanging
        running.cancel()
        with contextlib.suppress(BaseException):
            await running
    # The session is closed: its calls are cancelled.
    assert await settled(git_children) == []
    assert await settled(working_threads) == []
    (slow_git / f"slow-{slow}").unlink()
    async with Client(server.mcp) as client:
        again = await call(client, tool, {"repo": REPO, **args, "idempotency_key": "k2"})
        assert again.get("isError") is not True, again
