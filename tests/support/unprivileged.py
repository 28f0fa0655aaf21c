"""Run commands as a user without privileges, the way a desktop client launches the server.

As root (CI containers run tests as root), ``setpriv`` from util-linux drops to ``nobody``;
as any other user, commands run as that user, who already lacks the privileges that
matter here (writing to ``/``). pytest's ``tmp_path`` under root is private to root, so
the folders such a user needs are made in the system temporary folder and handed over.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

NOBODY_UID = 65534
NOBODY_GID = 65534
PREFLIGHT_TIMEOUT_S = 60


@dataclass(frozen=True)
class Unprivileged:
    """A user without privileges and a private folder ``area`` that user owns."""

    uid: int
    gid: int
    prefix: tuple[str, ...]
    area: Path

    def command(self, argv: Sequence[str]) -> list[str]:
        return [*self.prefix, *argv]

    def make_dir(self, name: str) -> Path:
        """A folder in ``area`` owned by the user."""
        path = self.area / name
        path.mkdir(parents=True)
        self.give(path)
        return path

    def give(self, path: Path) -> None:
        if os.geteuid() == 0:
            for folder, dirs, files in os.walk(path):
                os.chown(folder, self.uid, self.gid)
                for name in [*dirs, *files]:
                    os.chown(os.path.join(folder, name), self.uid, self.gid, follow_symlinks=False)


def unavailable(reason: str) -> None:
    """Skip where the machine cannot drop privileges; in CI that is a failure."""
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(reason)
    pytest.skip(reason)


@contextmanager
def unprivileged_user(env: Mapping[str, str]) -> Iterator[Unprivileged]:
    """The user to run as; ``env`` is the environment the preflight check runs with."""
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            unavailable("setpriv (util-linux) is needed to run the server as a non-root user")
        prefix: tuple[str, ...] = (
            str(setpriv),
            f"--reuid={NOBODY_UID}",
            f"--regid={NOBODY_GID}",
            "--clear-groups",
        )
        uid, gid = NOBODY_UID, NOBODY_GID
    else:
        prefix, uid, gid = (), os.getuid(), os.getgid()
    area = Path(tempfile.mkdtemp(prefix="nexus-unprivileged-"))
    user = Unprivileged(uid=uid, gid=gid, prefix=prefix, area=area)
    try:
        user.give(area)
        check = subprocess.run(
            user.command([sys.executable, "-c", "import nexus_mcp.cli"]),
            env=dict(env), cwd="/", capture_output=True, timeout=PREFLIGHT_TIMEOUT_S, check=False,
        )  # fmt: skip
        if check.returncode != 0:
            tail = check.stderr.decode(errors="replace")[-500:]
            unavailable(f"the test interpreter cannot run as uid {uid}: {tail}")
        yield user
    finally:
        shutil.rmtree(area, ignore_errors=True)


def read_only_prefix(folder: Path) -> tuple[str, ...]:
    """A command prefix that runs the command with ``folder`` mounted read-only.

    A private mount namespace (``unshare --mount``) bind-mounts the folder over itself and
    remounts it read-only: a real read-only file system (EROFS), which even root cannot
    write, seen only by that command. Skips where mount namespaces are not allowed.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is needed for a read-only file system")
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    user_ns = () if os.geteuid() == 0 else ("--map-root-user",)
    prefix = (unshare, "--mount", *user_ns, "--", "sh", "-c", script, "sh", str(folder))
    probe = subprocess.run(
        [*prefix, "true"], capture_output=True, timeout=PREFLIGHT_TIMEOUT_S, check=False
    )
    if probe.returncode != 0:
        pytest.skip("this machine does not allow a private read-only mount (unshare --mount)")
    return prefix
