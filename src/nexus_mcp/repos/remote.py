"""Push one branch to the forge, from a scratch repository whose configuration is ours.

``git push`` is the one git command that talks to the outside, and a repository's own
configuration could redirect it (``url.<x>.insteadOf``, ``pushInsteadOf``, a remote's
``receivepack``, ``core.sshCommand``) or run programs through it. So the push is never
run in the user's repository: a throwaway bare repository borrows its objects
(``objects/info/alternates``), holds the one branch, and pushes it to the URL the operator
configured (``forge.push_url``), with ``protocol.allow=never`` except that URL's scheme.
The token (https) travels in an ``http.extraHeader`` passed through ``GIT_CONFIG_*``
environment variables, never on the command line, and only to that URL. No force: a
remote branch that moved is a ``CONFLICT``.

``remote_branch`` asks the same URL, the same way (``ls-remote``), where a branch is:
what the push target already holds is what a push does not publish.
"""

from __future__ import annotations

import base64
import contextlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import SecretStr

from nexus_mcp.errors import ConflictError, UpstreamError
from nexus_mcp.repos.git import GitError, GitRunner
from nexus_mcp.repos.repository import Repository, check_branch_name, committing
from nexus_mcp.workspace.commits import CommitGuard

PUSH_TIMEOUT_SECONDS = 120.0
LS_REMOTE_TIMEOUT_SECONDS = 30.0
_LS_REMOTE_LINE = re.compile(rb"^([0-9a-f]{40}(?:[0-9a-f]{24})?)\t(\S+)$")


def push_branch(
    repository: Repository,
    branch: str,
    commit: str,
    push_url: str,
    token: SecretStr | None,
    guard: CommitGuard | None = None,
) -> None:
    """Make ``refs/heads/<branch>`` on ``push_url`` point at ``commit`` (fast-forward only).

    The push is the write's commit point: under ``guard``, a call already cancelled never
    starts it, and one cancelled meanwhile is reported only once it has ended.
    """
    check_branch_name(branch)
    scheme = _scheme(push_url)
    try:
        with _scratch_remote(repository, PUSH_TIMEOUT_SECONDS) as runner:
            runner.run(["update-ref", f"refs/heads/{branch}", commit])
            ref = f"refs/heads/{branch}"
            repository.check_store()  # again, right before the push reads the store
            with committing(guard):
                result = runner.run(
                    ["push", "--quiet", "--porcelain", "--no-verify", push_url, f"{ref}:{ref}"],
                    env=_credentials(scheme, token),
                    config=_config(scheme),
                    check=False,
                )
    except GitError:
        raise UpstreamError("Upstream unavailable", outcome="push_failed") from None
    if result.returncode != 0:
        if b"[rejected]" in result.stdout or b"non-fast-forward" in result.stderr:
            raise ConflictError("the remote branch moved", reason="push_rejected")
        raise UpstreamError("Upstream unavailable", outcome="push_failed")


def remote_branch(
    repository: Repository, branch: str, push_url: str, token: SecretStr | None
) -> str | None:
    """The commit ``refs/heads/<branch>`` points at on ``push_url``, or None if it has none."""
    check_branch_name(branch)
    scheme = _scheme(push_url)
    ref = f"refs/heads/{branch}"
    try:
        with _scratch_remote(repository, LS_REMOTE_TIMEOUT_SECONDS) as runner:
            result = runner.run(
                ["ls-remote", "--heads", push_url, ref],
                env=_credentials(scheme, token),
                config=_config(scheme),
            )
    except GitError:
        raise UpstreamError("Upstream unavailable", outcome="ls_remote_failed") from None
    for line in result.stdout.splitlines():
        found = _LS_REMOTE_LINE.match(line)
        if found is not None and found.group(2) == ref.encode():
            return found.group(1).decode("ascii")
    return None


def _scheme(push_url: str) -> str:
    scheme = urlsplit(push_url).scheme
    if scheme not in ("https", "file"):  # the configuration allows only these
        raise UpstreamError("Upstream error", outcome="push_scheme")
    return scheme


def _config(scheme: str) -> list[tuple[str, str]]:
    return [
        (f"protocol.{scheme}.allow", "always"),
        ("http.followRedirects", "false"),
        ("push.recurseSubmodules", "no"),
    ]


@contextlib.contextmanager
def _scratch_remote(repository: Repository, timeout_seconds: float) -> Iterator[GitRunner]:
    """A throwaway bare repository borrowing the repository's objects (module docstring)."""
    scratch = Path(tempfile.mkdtemp(prefix="nexus-push-"))
    runner = GitRunner(
        scratch,
        git=repository.runner.git,
        timeout_seconds=timeout_seconds,
        max_output_bytes=1024 * 1024,
    )
    try:
        runner.run(["init", "--quiet", "--bare", str(scratch)])
        alternates = scratch / "objects" / "info" / "alternates"
        alternates.write_text(f"{repository.objects_dir}\n", encoding="utf-8")
        # The scratch repository borrows the served one's objects (and would follow its
        # alternates): what it pushes or compares must be the served repository's own
        # (repos/store.py), checked as late as the scratch repository is ready.
        repository.check_store()
        yield runner
    finally:
        runner.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(scratch)


def _credentials(scheme: str, token: SecretStr | None) -> dict[str, str]:
    """The token as an ``http.extraHeader`` in git's environment, never on its command line."""
    if scheme != "https" or token is None:
        return {}
    basic = base64.b64encode(f"x-access-token:{token.get_secret_value()}".encode()).decode()
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
    }


__all__ = ["push_branch", "remote_branch"]
