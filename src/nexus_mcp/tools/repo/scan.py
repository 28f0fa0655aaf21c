"""Reading a repository at a commit for the repo tools: git in a worker thread, and bounded
scans of its text blobs (the files toolset's workload caps, and a regex child killed when
its call is cancelled)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from nexus_mcp.errors import ConflictError, NotFoundError
from nexus_mcp.repos.git import (
    GitDeadlineError,
    current_work,
    git_timeouts_as_refusals,
    in_git_worker,
)
from nexus_mcp.repos.repository import MODE_EXECUTABLE, MODE_FILE, Repository, TreeEntry
from nexus_mcp.settings import SearchSettings
from nexus_mcp.workspace.search import (
    CAP_FILES_SCANNED,
    CAP_TIME,
    LineFinder,
    ScanBudget,
    is_binary,
    line_finder,
)

T = TypeVar("T")


async def git_read(work: Callable[[], T]) -> T:
    """Run a read's git work in a worker thread (``repos.git.in_git_worker``): a cancelled
    call's git is killed and its thread stopped before the caller is answered."""
    with git_timeouts_as_refusals():
        return await in_git_worker(work)


def scan_report(repository: Repository, commit: str, budget: ScanBudget) -> dict[str, Any]:
    return {
        "repo": repository.name,
        "commit_sha": commit,
        "files_scanned": budget.files_scanned,
        "truncated": bool(budget.cut_by),
        "caps_hit": budget.cut_by,
    }


def require_folder(repository: Repository, commit: str, folder: str) -> None:
    entry = repository.entry(commit, folder)
    if entry is None:
        raise NotFoundError(reason="path_not_found")
    if entry.type != "directory":
        raise ConflictError("not a folder", reason="not_a_folder")


def scan_texts(
    repository: Repository,
    commit: str,
    folder: str,
    budget: ScanBudget,
    keep: Callable[[TreeEntry], bool],
) -> Iterator[tuple[list[TreeEntry], str]]:
    """(entries, text) of each text blob below ``folder``, once per blob with every entry
    naming it, within the budget's caps.

    The time cap is asked between entries and blobs, and it is the deadline of every git
    command of the scan (``GitWork.deadline``): a listing or a batch of blobs still
    running at the cap is killed and the scan reports ``max_seconds``.
    """
    caps = budget.caps
    work = current_work()
    if work is not None:
        work.deadline = budget.deadline
    try:
        candidates: list[TreeEntry] = []
        for entry in repository.list_tree(commit, folder, recursive=True):
            if out_of_time(budget):
                return
            if entry.mode not in (MODE_FILE, MODE_EXECUTABLE) or not keep(entry):
                continue
            if entry.size is not None and entry.size > caps.max_file_bytes:
                continue
            if budget.files_scanned >= caps.max_files_scanned:
                budget.cut(CAP_FILES_SCANNED)
                break
            budget.files_scanned += 1
            candidates.append(entry)
        by_sha: dict[str, list[TreeEntry]] = {}
        for entry in candidates:
            by_sha.setdefault(entry.sha, []).append(entry)
        for blobs in repository.read_entries(candidates):
            for sha, data in blobs.items():
                if out_of_time(budget):
                    return
                if is_binary(data[: caps.binary_sniff_bytes]):
                    continue
                yield by_sha.get(sha, []), data.decode("utf-8", errors="replace")
    except GitDeadlineError:
        budget.cut(CAP_TIME)
    finally:
        if work is not None:
            work.deadline = None


def guarded_line_finder(
    matcher: re.Pattern[str], *, regex: bool, caps: SearchSettings, deadline: float
) -> contextlib.AbstractContextManager[LineFinder]:
    """``workspace/search.line_finder``; a caller's regex runs in a ``RegexSandbox`` child, which a
    cancelled call kills at once rather than at the scan's deadline."""
    work = current_work()

    def kill_on_cancel(pid: int) -> contextlib.AbstractContextManager[object]:
        assert work is not None
        return work.stopping(functools.partial(os.kill, pid, signal.SIGKILL))

    return line_finder(
        matcher,
        regex=regex,
        caps=caps,
        deadline=deadline,
        guard_child=None if work is None else kill_on_cancel,
    )


def out_of_time(budget: ScanBudget) -> bool:
    """The scan's time cap (reported as cut), or ``GitCancelledError`` once its call was
    cancelled: the worker stops even when nobody waits for its answer any more."""
    work = current_work()
    if work is not None:
        work.check_cancelled()
    return budget.out_of_time()
