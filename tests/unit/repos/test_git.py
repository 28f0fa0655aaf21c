"""``GitRunner`` on its own: the environment it gives git, the configuration it forces,
and the bounds on output, time, stdin and stderr.

Real git, real repositories in tmp_path; a stand-in "git" script where a test needs a
program that misbehaves (sleeps, forks, floods stderr).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.repos import RepositoryConfig
from nexus_mcp.repos.git import (
    MAX_STDERR_BYTES,
    SAFE_CONFIG,
    GitError,
    GitOutputTooLargeError,
    GitRunner,
    GitTimeoutError,
    find_git,
    run_bounded,
)
from nexus_mcp.repos.repository import RunnerFactory, open_repository
from tests.support.git_repos import git, make_repo, rev

CANARY = "zqRUNNERCANARY7"
EXPECTED_ENV_KEYS = {
    "PATH",
    "HOME",
    "XDG_CONFIG_HOME",
    "LC_ALL",
    "LANG",
    "GIT_DIR",
    "GIT_CEILING_DIRECTORIES",
    "GIT_CONFIG_NOSYSTEM",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_ATTR_NOSYSTEM",
    "GIT_TERMINAL_PROMPT",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "GIT_OPTIONAL_LOCKS",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_GRAFT_FILE",
    "GIT_NO_LAZY_FETCH",
    "GIT_PROTOCOL_FROM_USER",
    "GIT_PAGER",
    "PAGER",
    "GIT_EDITOR",
}
HOOKS = (
    "pre-commit",
    "post-commit",
    "reference-transaction",
    "post-index-change",
    "pre-push",
    "post-checkout",
    "pre-auto-gc",
    "fsmonitor-watchman",
)


# --- helpers ------------------------------------------------------------------------------


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", {"a.txt": "alpha\n", "b/c.txt": "gamma\n"})


@pytest.fixture
def runner(repo: Path) -> Iterator[GitRunner]:
    made = GitRunner(repo / ".git", timeout_seconds=20)
    yield made
    made.close()


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def dead(pid: int, *, within: float = 3.0) -> bool:
    """The process is gone (or a zombie nobody reaped yet) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return True
        if "State:\tZ" in status:
            return True
        time.sleep(0.05)
    return False


def wait_for(path: Path, *, within: float = 5.0) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


def plant_hooks(repo: Path, tmp_path: Path) -> Path:
    """Hooks in .git/hooks and in a core.hooksPath folder, and an fsmonitor program."""
    marker = tmp_path / "ran.log"
    evil = script(tmp_path / "evil.sh", f'echo "evil $*" >> {marker}\nexit 0\n')
    other = tmp_path / "hooks-elsewhere"
    other.mkdir()
    for folder in (repo / ".git" / "hooks", other):
        for name in HOOKS:
            hook = folder / name
            hook.write_text(f'#!/bin/sh\necho "{name}" >> {marker}\nexit 0\n')
            hook.chmod(hook.stat().st_mode | stat.S_IEXEC)
    included = tmp_path / "included.gitconfig"
    included.write_text(f"[core]\n\thooksPath = {other}\n[commit]\n\tgpgSign = true\n")
    for key, value in {
        "core.hooksPath": str(other),
        "core.fsmonitor": evil,
        "core.pager": evil,
        "gpg.program": evil,
        "commit.gpgSign": "true",
        "credential.helper": f"!{evil}",
        "protocol.allow": "always",
        "include.path": str(included),
    }.items():
        git(repo, "config", key, value)
    return marker


# --- the environment ----------------------------------------------------------------------


@pytest.fixture
def hostile_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The server's own environment is full of git settings that must not reach git."""
    home = tmp_path / "server-home"
    (home / ".config" / "git").mkdir(parents=True)
    (home / ".gitconfig").write_text(f"[user]\n\tname = {CANARY}-home\n[core]\n\tpager = false\n")
    (home / ".config" / "git" / "config").write_text(f"[user]\n\temail = {CANARY}@xdg\n")
    elsewhere = make_repo(tmp_path / "elsewhere", {"other.txt": "other\n"})
    values = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "GIT_DIR": str(elsewhere / ".git"),
        "GIT_WORK_TREE": str(elsewhere),
        "GIT_INDEX_FILE": str(tmp_path / f"{CANARY}.index"),
        "GIT_OBJECT_DIRECTORY": str(tmp_path / f"{CANARY}-objects"),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(elsewhere / ".git" / "objects"),
        "GIT_CONFIG_PARAMETERS": f"'user.name'='{CANARY}-params'",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "user.name",
        "GIT_CONFIG_VALUE_0": f"{CANARY}-count",
        "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"),
        "GIT_CONFIG": str(home / ".gitconfig"),
        "GIT_NAMESPACE": CANARY,
        "GIT_REPLACE_REF_BASE": f"refs/{CANARY}/",
        "GIT_GRAFT_FILE": str(tmp_path / f"{CANARY}-grafts"),
        "GIT_TRACE": str(tmp_path / "trace.log"),
        "GIT_TRACE2_EVENT": str(tmp_path / "trace2.log"),
        "GIT_SSH_COMMAND": f"{CANARY}-ssh",
        "GIT_EXEC_PATH": str(tmp_path / "no-exec-path"),
        "GIT_PAGER": "false",
        "GIT_EDITOR": "vi",
        "LD_PRELOAD": f"/{CANARY}.so",
        "LANG": "de_DE.UTF-8",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def test_the_environment_is_fixed_and_inherits_nothing(
    hostile_environ: dict[str, str], runner: GitRunner, repo: Path
) -> None:
    env = runner.base_env()
    assert set(env) == EXPECTED_ENV_KEYS
    for key, value in env.items():
        assert CANARY not in value, key
    for key, value in hostile_environ.items():
        assert env.get(key) != value, key
    assert env["GIT_DIR"] == str(repo / ".git")
    assert env["HOME"] == env["XDG_CONFIG_HOME"] != hostile_environ["HOME"]
    assert Path(env["HOME"]).is_dir() and not any(Path(env["HOME"]).iterdir())
    assert env["GIT_CONFIG_GLOBAL"] == env["GIT_CONFIG_SYSTEM"] == os.devnull
    assert env["GIT_CEILING_DIRECTORIES"] == "/"


def test_git_sees_none_of_the_server_environment(
    hostile_environ: dict[str, str], runner: GitRunner, repo: Path, tmp_path: Path
) -> None:
    listed = runner.run(["config", "--list", "--show-origin"]).stdout.decode()
    assert CANARY not in listed
    assert "server-home" not in listed
    git_dir = runner.run(["rev-parse", "--absolute-git-dir"]).stdout.decode().strip()
    assert git_dir == str(repo / ".git")
    head = runner.run(["rev-parse", "HEAD"]).stdout.decode().strip()
    assert head == rev(repo, "HEAD")  # not the repository GIT_DIR named
    assert runner.run(["var", "GIT_PAGER"]).stdout.decode().strip() == "cat"
    assert runner.run(["var", "GIT_EDITOR"]).stdout.decode().strip() == "false"
    assert not (tmp_path / "trace.log").exists()
    assert not (tmp_path / "trace2.log").exists()
    assert not (tmp_path / f"{CANARY}.index").exists()


def test_the_private_home_is_removed_on_close(repo: Path) -> None:
    made = GitRunner(repo / ".git")
    home = Path(made.base_env()["HOME"])
    assert home.is_dir()
    made.close()
    assert not home.exists()


def test_argv_puts_the_safe_configuration_before_the_command(runner: GitRunner) -> None:
    argv = runner.argv(["cat-file", "--batch"])
    assert Path(argv[0]).is_absolute()
    assert argv[1] == "--no-pager"
    assert argv[-2:] == ["cat-file", "--batch"]
    pairs = [argv[i + 1] for i in range(2, len(argv) - 2, 2) if argv[i] == "-c"]
    assert pairs == [f"{key}={value}" for key, value in SAFE_CONFIG]
    keys = {key for key, _ in SAFE_CONFIG}
    for key in ("core.hooksPath", "core.fsmonitor", "core.pager", "commit.gpgSign"):
        assert key in keys
    assert ("protocol.allow", "never") in SAFE_CONFIG


def test_find_git_is_an_absolute_resolved_program() -> None:
    found = find_git()
    assert Path(found).is_absolute()
    assert Path(found).resolve() == Path(found)
    assert os.access(found, os.X_OK)


# --- the repository's configuration never names a program that runs -----------------------


def test_safe_configuration_outranks_the_repository_and_its_includes(
    runner: GitRunner, repo: Path, tmp_path: Path
) -> None:
    plant_hooks(repo, tmp_path)

    def value(key: str) -> str:
        return runner.run(["config", "--get", key]).stdout.decode().strip()

    assert value("core.hooksPath") == os.devnull
    assert value("core.fsmonitor") == "false"
    assert value("core.pager") == "cat"
    assert value("commit.gpgSign") == "false"
    assert value("protocol.allow") == "never"
    helpers = runner.run(["config", "--get-all", "credential.helper"]).stdout.decode()
    assert helpers.splitlines()[-1] == ""  # the empty entry resets the list


def test_hooks_fsmonitor_pager_and_signing_never_run(
    runner: GitRunner, repo: Path, tmp_path: Path
) -> None:
    marker = plant_hooks(repo, tmp_path)
    index = {"GIT_INDEX_FILE": str(tmp_path / "scratch-index")}
    head = rev(repo, "HEAD")
    runner.run(["read-tree", head], env=index)  # post-index-change
    patch = b"--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-alpha\n+beta\n"
    runner.run(["apply", "--cached", "-"], stdin=patch, env=index)
    tree = runner.run(["write-tree"], env=index).stdout.decode().strip()
    made = runner.run(
        ["commit-tree", tree, "-p", head, "-m", "signed?"],
        env={"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com"}
        | {"GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.com"},
    )
    commit = made.stdout.decode().strip()
    runner.run(["update-ref", "refs/heads/side", commit, "0" * 40])  # reference-transaction
    runner.run(["hook", "run", "--ignore-missing", "pre-commit"])
    runner.run(["log", "-1", "--format=%H"])  # the pager
    runner.run(["status", "--porcelain"], env={"GIT_WORK_TREE": str(repo)})  # fsmonitor
    assert not marker.exists(), marker.read_text()
    assert "gpgsig" not in git(repo, "cat-file", "commit", commit)
    assert git(repo, "rev-parse", "refs/heads/side").strip() == commit
    # Control: for plain git the planted hook and fsmonitor are live.
    git(repo, "hook", "run", "pre-commit")
    git(repo, "status", "--porcelain")
    assert "pre-commit" in marker.read_text()
    assert "evil" in marker.read_text()


def test_no_transport_is_allowed(runner: GitRunner, tmp_path: Path) -> None:
    marker = tmp_path / "transport-ran"
    result = runner.run(
        ["ls-remote", f"ext::sh -c touch% {marker}"], check=False, timeout_seconds=10
    )
    assert result.returncode != 0
    local = runner.run(["ls-remote", f"file://{tmp_path}"], check=False)
    assert local.returncode != 0
    assert not marker.exists()


def test_discovery_never_climbs_above_the_configured_folder(repo: Path) -> None:
    sub = repo / "b"
    factory = RunnerFactory(git=find_git(), timeout_seconds=10, max_output_bytes=1024 * 1024)
    with pytest.raises(ConfigError) as caught:
        open_repository("sub", RepositoryConfig(path=sub), factory)
    assert "not the top" in str(caught.value) or "not a git repository" in str(caught.value)


# --- bounds -------------------------------------------------------------------------------


def test_output_cap_stops_git_reading_a_big_blob(repo: Path) -> None:
    big = repo / "big.bin"
    big.write_bytes(os.urandom(4 * 1024 * 1024))
    sha = git(repo, "hash-object", "-w", str(big)).strip()
    capped = GitRunner(repo / ".git", max_output_bytes=64 * 1024)
    try:
        started = time.monotonic()
        with pytest.raises(GitOutputTooLargeError) as caught:
            capped.run(["cat-file", "blob", sha])
        assert time.monotonic() - started < 10
        assert sha not in str(caught.value)
        # A per-call bound narrows it further; a call within it still works.
        small = capped.run(["cat-file", "-s", sha]).stdout.decode().strip()
        assert small == str(4 * 1024 * 1024)
    finally:
        capped.close()


def test_output_cap_kills_the_writer(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    with pytest.raises(GitOutputTooLargeError):
        run_bounded(
            ["/bin/sh", "-c", f"echo $$ > {pidfile}; exec yes {CANARY}"],
            env={"PATH": "/usr/bin:/bin"},
            cwd=str(tmp_path),
            stdin=None,
            max_output_bytes=256 * 1024,
            timeout_seconds=20,
        )
    assert time.monotonic() - started < 10
    assert dead(int(wait_for(pidfile)))


def test_time_cap_kills_the_whole_process_group(tmp_path: Path, repo: Path) -> None:
    pidfile = tmp_path / "child.pid"
    fake = script(tmp_path / "fake-git", f"sleep 60 &\necho $! > {pidfile}\nsleep 60\n")
    slow = GitRunner(repo / ".git", git=fake, timeout_seconds=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(GitTimeoutError):
            slow.run(["status"])
        assert time.monotonic() - started < 5
    finally:
        slow.close()
    assert dead(int(wait_for(pidfile)))


def test_time_cap_holds_when_git_closes_its_output_and_keeps_running(
    tmp_path: Path, repo: Path
) -> None:
    pidfile = tmp_path / "quiet.pid"
    fake = script(tmp_path / "quiet-git", f"echo $$ > {pidfile}\nexec >/dev/null 2>&1\nsleep 60\n")
    quiet = GitRunner(repo / ".git", git=fake, timeout_seconds=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(GitTimeoutError):
            quiet.run(["x"])
        assert time.monotonic() - started < 5
    finally:
        quiet.close()
    assert dead(int(wait_for(pidfile)))


def test_time_cap_holds_when_a_grandchild_keeps_the_output_open(tmp_path: Path, repo: Path) -> None:
    pidfile = tmp_path / "orphan.pid"
    fake = script(tmp_path / "forking-git", f"(sleep 60; true) &\necho $! > {pidfile}\nexit 0\n")
    forking = GitRunner(repo / ".git", git=fake, timeout_seconds=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(GitTimeoutError):
            forking.run(["x"])
        assert time.monotonic() - started < 5
    finally:
        forking.close()
    assert dead(int(wait_for(pidfile)))


def test_stdin_larger_than_a_pipe_buffer(runner: GitRunner) -> None:
    data = os.urandom(8 * 1024 * 1024)
    sha = runner.run(["hash-object", "--stdin"], stdin=data).stdout.decode().strip()
    expected = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
    assert sha == expected


def test_big_stdin_and_big_stdout_at_once_do_not_deadlock(runner: GitRunner, repo: Path) -> None:
    blob = git(repo, "rev-parse", "HEAD:a.txt").strip()
    lines = 40_000
    stdin = f"{blob}\n".encode() * lines  # ~1.6 MB in, ~2.4 MB out
    out = runner.run(["cat-file", "--batch"], stdin=stdin).stdout
    assert out.count(f"{blob} blob 6\nalpha\n\n".encode()) == lines


def test_empty_stdin_is_closed_not_left_open(runner: GitRunner) -> None:
    sha = runner.run(["hash-object", "--stdin"], stdin=b"", timeout_seconds=5).stdout
    assert sha.decode().strip() == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


def test_a_failure_raises_git_error_without_stderr_in_the_message(runner: GitRunner) -> None:
    with pytest.raises(GitError) as caught:
        runner.run(["cat-file", "-p", f"{CANARY}-object"])
    error = caught.value
    assert error.returncode == 128
    assert CANARY.encode() in error.stderr  # kept for the operator's log
    assert CANARY not in str(error)
    assert all(CANARY not in str(arg) for arg in error.args)
    assert CANARY not in repr(error)
    result = runner.run(["cat-file", "-p", f"{CANARY}-object"], check=False)
    assert result.returncode == 128 and result.stdout == b""


def test_stderr_is_bounded(tmp_path: Path, repo: Path) -> None:
    fake = script(
        tmp_path / "noisy-git",
        "head -c 2000000 /dev/zero | tr '\\0' e >&2\necho done\nexit 3\n",
    )
    noisy = GitRunner(repo / ".git", git=fake, timeout_seconds=10)
    try:
        with pytest.raises(GitError) as caught:
            noisy.run(["x"])
    finally:
        noisy.close()
    assert caught.value.returncode == 3
    assert 0 < len(caught.value.stderr) <= MAX_STDERR_BYTES
