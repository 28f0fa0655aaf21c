"""``run_bounded`` under a ``GitWork``: a cancelled call's command dies (its whole process
group), a command past the call's deadline dies with ``GitDeadlineError``, and a command of
a call already cancelled never starts. A stand-in program (sh and a sleep) plays git."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from nexus_mcp.repos.git import (
    GitCancelledError,
    GitDeadlineError,
    GitRunner,
    GitTimeoutError,
    GitWork,
    bound_work,
    run_bounded,
)

MARK = "41.2793"


def sleepers() -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if MARK.encode() in cmdline:
                found.append(int(pid))
    return found


def gone(seconds: float = 3.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end and sleepers():
        time.sleep(0.02)
    return not sleepers()


def run(work: GitWork, tmp_path: Path) -> None:
    run_bounded(
        ["/bin/sh", "-c", f"sleep {MARK}; echo done"],
        env={"PATH": "/usr/bin:/bin"},
        cwd=str(tmp_path),
        stdin=None,
        max_output_bytes=1024,
        timeout_seconds=30,
        work=work,
    )


def test_cancelling_the_work_kills_the_process_group(tmp_path: Path) -> None:
    work = GitWork()
    threading.Timer(0.3, work.cancel).start()
    started = time.monotonic()
    with pytest.raises(GitCancelledError):
        run(work, tmp_path)
    assert time.monotonic() - started < 10  # far below the 30 s bound and the 41 s sleep
    assert gone()


def test_the_work_deadline_kills_the_command(tmp_path: Path) -> None:
    work = GitWork(deadline=time.monotonic() + 0.3)
    with pytest.raises(GitDeadlineError) as caught:
        run(work, tmp_path)
    assert isinstance(caught.value, GitTimeoutError)  # outside a scan: the call's timeout
    assert gone()


def test_a_cancelled_call_starts_no_git(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "git"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    runner = GitRunner(tmp_path, git=str(script))
    work = GitWork()
    work.cancel()
    try:
        with bound_work(work), pytest.raises(GitCancelledError):
            runner.run(["status"])
    finally:
        runner.close()
    assert not marker.exists()
