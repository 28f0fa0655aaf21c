"""The git runner: every git command nexus-mcp runs, with a fixed and safe environment.

A repository's own configuration must never make nexus-mcp run a program, and nothing the
caller sends reaches a shell. So git is run as the ``git`` program found on ``PATH`` at
start-up (an absolute path from then on), with an argument list, never a shell, and:

- a fixed environment, not the server's: ``PATH``, ``LC_ALL=C``, an empty ``HOME`` and
  ``XDG_CONFIG_HOME``, ``GIT_CONFIG_NOSYSTEM`` and ``GIT_CONFIG_GLOBAL=/dev/null`` (no
  system or user config), no terminal prompt, no askpass, no replace objects, no
  grafts and no ``shallow`` file (``GIT_GRAFT_FILE=/dev/null``, ``--shallow-file ""``:
  parents are the commits' own, so a history walk sees every commit a push sends; in a
  really shallow clone, a walk past its boundary fails instead), no optional locks,
  ``GIT_DIR`` set explicitly and ``GIT_CEILING_DIRECTORIES=/`` (no discovery),
  ``GIT_ATTR_NOSYSTEM``;
- command-line configuration, which outranks the repository's own ``.git/config`` (and
  anything it includes), for every key through which a repository can name a program:
  ``core.hooksPath=/dev/null`` (no hook runs, ``reference-transaction`` and
  ``post-index-change`` included), ``core.fsmonitor=false``, ``core.pager=cat``,
  ``core.askPass=``, ``credential.helper=`` (resets the list), ``diff.external=``,
  ``commit.gpgSign=false``, ``core.alternateRefsCommand=``, ``core.commitGraph=false``
  (its parents and trees are never trusted over the commits'), ``gc.auto=0``,
  ``maintenance.auto=false``, ``submodule.recurse=false``, and ``protocol.allow=never``
  (no transport at all, ``ext::`` included; the one push in ``repos/remote.py`` allows
  exactly the scheme the operator configured, from a scratch repository whose config is
  ours);
- only plumbing that never converts content (``cat-file`` without ``--filters``,
  ``ls-tree``, ``apply --cached``, ``read-tree``, ``write-tree``, ``commit-tree``,
  ``update-ref``, ``diff-tree --raw``): filter, textconv and diff drivers a repository
  declares are never invoked, and the working tree is never read or written;
- bounded output (the process is killed past ``max_output_bytes``) and a bounded run
  time (the whole process group is killed at ``timeout_seconds``).

git's own "dubious ownership" check stays on (``safe.directory`` is never set): a
repository owned by another user is refused at start-up rather than trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from nexus_mcp.errors import ConfigError, ToolTimeoutError

DEFAULT_TIMEOUT_SECONDS = 20.0
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024 * 1024
MAX_STDERR_BYTES = 64 * 1024  # kept for the operator's log only; never shown to a caller
_READ_CHUNK = 64 * 1024
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

# Configuration given on the command line outranks the repository's (git-config SCOPES).
SAFE_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("core.untrackedCache", "false"),
    ("core.pager", "cat"),
    ("core.askPass", ""),
    ("core.sshCommand", "false"),
    ("core.gitProxy", ""),
    ("core.alternateRefsCommand", ""),
    # The commit-graph is a cache in the store's own files that git trusts over the
    # commits themselves (parents, root tree) without checking its checksum: a forged one
    # would hide commits or changes from a range judged here yet pushed as they are.
    ("core.commitGraph", "false"),
    ("credential.helper", ""),
    ("diff.external", ""),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("submodule.recurse", "false"),
    ("protocol.allow", "never"),
    ("core.quotePath", "false"),
    ("advice.detachedHead", "false"),
)


class GitError(Exception):
    """A git command failed. ``stderr`` is for the operator's log: never for a caller."""

    def __init__(self, message: str, *, returncode: int | None = None, stderr: bytes = b"") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


class GitTimeoutError(GitError):
    """The command ran past its time bound and was killed."""


class GitOutputTooLargeError(GitError):
    """The command wrote more than its output bound and was killed."""


class GitDeadlineError(GitTimeoutError):
    """The command ran past its call's work deadline (a scan's ``max_seconds``) and was
    killed; a scan reports the cap it hit, anything else the call's ``TOOL_TIMEOUT``."""


class GitCancelledError(GitError):
    """The call was cancelled (answered already): its command was killed, or not started."""


# How often a running command looks at its call's cancellation (seconds).
CANCEL_POLL_SECONDS = 0.05


@dataclass
class GitWork:
    """The git work of one tool call, run in a worker thread.

    A worker thread cannot be interrupted and a git child outlives a cancelled await, so
    the tool binds one ``GitWork`` (``bound_work``) and, when its call is cancelled (a
    ``TOOL_TIMEOUT`` being answered), calls ``cancel()``: every git command of the call
    kills its process group within ``CANCEL_POLL_SECONDS`` and a new one never starts,
    and the tool's own loops ask ``check_cancelled()``. ``deadline`` (a
    ``time.monotonic()`` value), when set, kills a command that runs past it
    (``GitDeadlineError``): a scan's time cap bounds the git it waits for, too.
    """

    cancelled: threading.Event = field(default_factory=threading.Event)
    deadline: float | None = None
    _stoppers: list[Callable[[], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled.set()
            stoppers = list(self._stoppers)
            # Called under the lock: ``stopping`` cannot end (and its child be reaped, its
            # pid reused) while a stopper runs.
            for stop in stoppers:
                with contextlib.suppress(Exception):
                    stop()

    @contextlib.contextmanager
    def stopping(self, stop: Callable[[], None]) -> Iterator[None]:
        """Within the block, cancelling the work also calls ``stop`` (it kills a child
        the worker waits on that is not git, such as a regex sandbox)."""
        with self._lock:
            if self.cancelled.is_set():
                stop()
            self._stoppers.append(stop)
        try:
            yield
        finally:
            with self._lock:
                self._stoppers.remove(stop)

    def check_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise GitCancelledError("the call was cancelled")


_work: ContextVar[GitWork | None] = ContextVar("nexus_git_work", default=None)


def current_work() -> GitWork | None:
    return _work.get()


@contextlib.contextmanager
def bound_work(work: GitWork) -> Iterator[GitWork]:
    token = _work.set(work)
    try:
        yield work
    finally:
        _work.reset(token)


T = TypeVar("T")

# How long a cancelled call waits for its worker to notice (it kills its git within
# ``CANCEL_POLL_SECONDS`` and its loops check between files and every few hundred lines).
CANCEL_WAIT_SECONDS = 10.0


async def in_git_worker(work: Callable[[], T]) -> T:
    """Run a call's git work in a worker thread, bound to a ``GitWork``.

    When the awaiting call is cancelled (its ``TOOL_TIMEOUT`` is being answered, or the
    client cancelled it), the work is cancelled too and awaited, shielded, before the
    cancellation goes on: by then no git child of the call is left and its thread has
    stopped. Every repo tool runs its git this way, and so does the write gate's decision
    (``repos/writes.py``), which runs before the tool.
    """
    scope = GitWork()

    def run() -> T:
        with bound_work(scope):
            return work()

    task = asyncio.ensure_future(asyncio.to_thread(run))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        scope.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(task), CANCEL_WAIT_SECONDS)
        raise


@dataclass(frozen=True)
class GitResult:
    returncode: int
    stdout: bytes
    stderr: bytes
    truncated: bool = False  # ``truncate=True`` and the output bound was reached


@contextlib.contextmanager
def git_timeouts_as_refusals() -> Iterator[None]:
    """A git command killed at its time bound is the call's ``TOOL_TIMEOUT`` (its outcome
    unknown for a write, as for any timed-out call); any other git failure stays an
    internal error, masked for the caller and named in the operator's log."""
    try:
        yield
    except GitTimeoutError:
        raise ToolTimeoutError(reason="git_timeout") from None


def find_git() -> str:
    """The absolute path of the ``git`` program, or a start-up error saying it is missing."""
    found = shutil.which("git", path=os.environ.get("PATH", SAFE_PATH))
    if found is None:
        raise ConfigError("the repo toolset needs the git program on PATH (install git)")
    return str(Path(found).resolve())


class GitRunner:
    """Runs git against one repository's git directory, safely (module docstring)."""

    def __init__(
        self,
        git_dir: Path,
        *,
        git: str | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        common_dir: Path | None = None,
    ) -> None:
        self.git_dir = git_dir
        self.common_dir = common_dir
        self.git = git or find_git()
        self.timeout_seconds = timeout_seconds
        self.max_output_bytes = max_output_bytes
        # Called before every command (``repos/store.py``): raises to refuse the command.
        self.guard: Callable[[], None] | None = None
        # An empty, private home: nothing in the server's own home is read by git.
        self._home = tempfile.mkdtemp(prefix="nexus-git-home-")

    def base_env(self) -> dict[str, str]:
        env = {
            "PATH": SAFE_PATH,
            "HOME": self._home,
            "XDG_CONFIG_HOME": self._home,
            "LC_ALL": "C",
            "LANG": "C",
            "GIT_DIR": str(self.git_dir),
            "GIT_CEILING_DIRECTORIES": "/",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_SYSTEM": os.devnull,
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ASKPASS": "",
            "SSH_ASKPASS": "",
            "GIT_OPTIONAL_LOCKS": "0",
            "GIT_NO_REPLACE_OBJECTS": "1",
            # ``info/grafts`` rewrites parents whatever GIT_NO_REPLACE_OBJECTS says: none.
            "GIT_GRAFT_FILE": os.devnull,
            "GIT_NO_LAZY_FETCH": "1",
            "GIT_PROTOCOL_FROM_USER": "0",
            "GIT_PAGER": "cat",
            "PAGER": "cat",
            "GIT_EDITOR": "false",
        }
        if self.common_dir is not None:
            # Pinned: a worktree's ``commondir`` file is never read again after start-up.
            env["GIT_COMMON_DIR"] = str(self.common_dir)
        return env

    def argv(self, args: Sequence[str], config: Sequence[tuple[str, str]] = ()) -> list[str]:
        # ``--shallow-file ""``: no ``shallow`` file is read, so a commit listed there
        # keeps its parents (git's own way to turn it off, as receive-pack does).
        command = [self.git, "--no-pager", "--shallow-file", ""]
        for key, value in (*SAFE_CONFIG, *config):
            command += ["-c", f"{key}={value}"]
        return [*command, *args]

    def run(
        self,
        args: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        config: Sequence[tuple[str, str]] = (),
        check: bool = True,
        max_output_bytes: int | None = None,
        timeout_seconds: float | None = None,
        truncate: bool = False,
    ) -> GitResult:
        """Run one git command; ``check`` raises ``GitError`` on a non-zero exit.

        With ``truncate``, output past the bound ends the command and what came before it
        is returned (``truncated``), for listings whose caller stops early anyway.
        """
        work = current_work()
        if work is not None:
            work.check_cancelled()
        if self.guard is not None:
            self.guard()
        full_env = self.base_env()
        if env:
            full_env.update(env)
        result = run_bounded(
            self.argv(args, config),
            env=full_env,
            cwd=self._home,
            stdin=stdin,
            max_output_bytes=max_output_bytes or self.max_output_bytes,
            timeout_seconds=timeout_seconds or self.timeout_seconds,
            truncate=truncate,
            work=work,
        )
        if check and result.returncode != 0 and not result.truncated:
            raise GitError(
                f"git {args[0] if args else ''} exited {result.returncode}",
                returncode=result.returncode,
                stderr=result.stderr,
            )
        return result

    def close(self) -> None:
        shutil.rmtree(self._home, ignore_errors=True)


def run_bounded(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    stdin: bytes | None,
    max_output_bytes: int,
    timeout_seconds: float,
    truncate: bool = False,
    work: GitWork | None = None,
) -> GitResult:
    """Run a program with bounded output and time; its whole process group dies past either
    (past the output bound, ``truncate`` returns what came before instead of raising), and
    when ``work`` is cancelled or its deadline passes (``GitWork``)."""
    process = subprocess.Popen(  # noqa: S603 - an argument list, no shell, a resolved program
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        close_fds=True,
    )
    deadline = time.monotonic() + timeout_seconds
    out, err = bytearray(), bytearray()
    pending = memoryview(stdin) if stdin is not None else None
    selector = selectors.DefaultSelector()
    assert process.stdout is not None and process.stderr is not None
    selector.register(process.stdout, selectors.EVENT_READ, out)
    selector.register(process.stderr, selectors.EVENT_READ, err)
    if process.stdin is not None:
        if pending is not None and len(pending):
            os.set_blocking(process.stdin.fileno(), False)
            selector.register(process.stdin, selectors.EVENT_WRITE, None)
        else:
            process.stdin.close()
    poll = CANCEL_POLL_SECONDS if work is not None else 1.0
    try:
        while selector.get_map():
            _stop_if_asked(process, work)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill(process)
                raise GitTimeoutError("git ran past its time bound")
            for key, _events in selector.select(timeout=min(remaining, poll)):
                if key.data is None:  # stdin is writable
                    assert pending is not None and process.stdin is not None
                    try:
                        written = os.write(process.stdin.fileno(), pending[:_READ_CHUNK])
                    except BrokenPipeError:
                        written = len(pending)
                    pending = pending[written:]
                    if not len(pending):
                        selector.unregister(process.stdin)
                        process.stdin.close()
                    continue
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer: bytearray = key.data
                if buffer is err:
                    if len(err) < MAX_STDERR_BYTES:
                        err += chunk[: MAX_STDERR_BYTES - len(err)]
                    continue
                if len(out) + len(chunk) > max_output_bytes:
                    _kill(process)
                    if truncate:
                        out += chunk[: max_output_bytes - len(out)]
                        return GitResult(-1, bytes(out), bytes(err), truncated=True)
                    raise GitOutputTooLargeError("git wrote more than its output bound")
                out += chunk
        returncode = _wait(process, deadline, work)
    finally:
        selector.close()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if process.returncode is None:
            _kill(process)
    return GitResult(returncode, bytes(out), bytes(err))


def _stop_if_asked(process: subprocess.Popen[bytes], work: GitWork | None) -> None:
    """Kill the command when its call was cancelled or ran past its work deadline."""
    if work is None:
        return
    if work.cancelled.is_set():
        _kill(process)
        raise GitCancelledError("the call was cancelled")
    if work.deadline is not None and time.monotonic() >= work.deadline:
        _kill(process)
        raise GitDeadlineError("git ran past its call's deadline")


def _wait(process: subprocess.Popen[bytes], deadline: float, work: GitWork | None = None) -> int:
    """The exit status, waiting at most until ``deadline`` (and while ``work`` goes on).

    ``Popen.wait(timeout=...)`` polls with growing sleeps, about a millisecond per git
    command here; a pidfd (Linux 5.3+) is woken by the exit itself.
    """
    code = process.poll()
    if code is not None:
        return code
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(process.pid)
    if pidfd is not None:
        try:
            while True:
                _stop_if_asked(process, work)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    _kill(process)
                    raise GitTimeoutError("git ran past its time bound")
                slice_ = min(remaining, CANCEL_POLL_SECONDS) if work is not None else remaining
                ready, _, _ = select.select([pidfd], [], [], slice_)
                if ready:
                    return process.wait()
        finally:
            os.close(pidfd)
    try:
        return process.wait(timeout=max(deadline - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
        _kill(process)
        raise GitTimeoutError("git ran past its time bound") from None


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


__all__ = [
    "CANCEL_POLL_SECONDS",
    "CANCEL_WAIT_SECONDS",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_TIMEOUT_SECONDS",
    "SAFE_CONFIG",
    "GitCancelledError",
    "GitDeadlineError",
    "GitError",
    "GitOutputTooLargeError",
    "GitResult",
    "GitRunner",
    "GitTimeoutError",
    "GitWork",
    "bound_work",
    "current_work",
    "find_git",
    "git_timeouts_as_refusals",
    "in_git_worker",
    "run_bounded",
]
