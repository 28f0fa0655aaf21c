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
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import SecretStr

from nexus_mcp.errors import ConflictError, UpstreamError
from nexus_mcp.repos.git import GitError, GitRunner
from nexus_mcp.repos.repository import Repository, check_branch_name, committing
from nexus_mcp.workspace import CommitGuard

PUSH_TIMEOUT_SECONDS = 120.0


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
    scheme = urlsplit(push_url).scheme
    if scheme not in ("https", "file"):  # the configuration allows only these
        raise UpstreamError("Upstream error", outcome="push_scheme")
    scratch = Path(tempfile.mkdtemp(prefix="nexus-push-"))
    runner = GitRunner(
        scratch,
        git=repository.runner.git,
        timeout_seconds=PUSH_TIMEOUT_SECONDS,
        max_output_bytes=1024 * 1024,
    )
    try:
        runner.run(["init", "--quiet", "--bare", str(scratch)])
        alternates = scratch / "objects" / "info" / "alternates"
        alternates.write_text(f"{repository.objects_dir}\n", encoding="utf-8")
        runner.run(["update-ref", f"refs/heads/{branch}", commit])
        ref = f"refs/heads/{branch}"
        # The scratch repository borrows the served one's objects (and would follow its
        # alternates): what is pushed must be the served repository's own (repos/store.py).
        repository.check_store()
        with committing(guard):
            result = runner.run(
                ["push", "--quiet", "--porcelain", "--no-verify", push_url, f"{ref}:{ref}"],
                env=_credentials(scheme, token),
                config=[
                    (f"protocol.{scheme}.allow", "always"),
                    ("http.followRedirects", "false"),
                    ("push.recurseSubmodules", "no"),
                ],
                check=False,
            )
    except GitError:
        raise UpstreamError("Upstream unavailable", outcome="push_failed") from None
    finally:
        runner.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(scratch)
    if result.returncode != 0:
        if b"[rejected]" in result.stdout or b"non-fast-forward" in result.stderr:
            raise ConflictError("the remote branch moved", reason="push_rejected")
        raise UpstreamError("Upstream unavailable", outcome="push_failed")


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


__all__ = ["push_branch"]
