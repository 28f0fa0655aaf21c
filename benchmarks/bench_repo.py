"""propose_patch on a 400-line, 10-file patch in a 10,000-file repository, beside git itself.

    python benchmarks/bench_repo.py [--rounds 150] [--breakdown-calls 40]

Set-up (once, in a temporary folder, about 5-10 s): a real git repository of 10,000 text
files (100 folders of 100 files, 300 B to 4 KB each) plus ``.github/CODEOWNERS``, made
with ``git fast-import`` and checked out, one commit on ``main`` and the branch
``feature/bench`` at it; and a small one of 100 of those files (the 9 the patch edits
among them, same folders, same contents) made the same way. The patch is made by ``git
diff --cached`` in a scratch clone (the repository itself is never touched): 9 files
edited (+20/-20 lines each, in two hunks) and one new file of 40 lines, 400 changed lines
in 10 files. It applies to both repositories alike.

Sides, alternating each round (so machine drift hits all of them), each one's median:

- **read-tree + apply --check --cached**: the check against a temporary index read from
  ``feature/bench`` (two processes): the least git must do for a dry run that never
  touches the working tree, as ``propose_patch`` does. The target's baseline;
- **propose_patch**: the tool through nexus-mcp's whole chain, FastMCP's in-memory
  ``Client``, prod mode, a principal with the ``repo`` profile, a write policy whose
  limits let the patch pass, the JSONL audit file on. **Target: at most 2x** the side
  above (issue 29): the chain, the audit and the tool's own checks (the branch tip,
  CODEOWNERS, the new content read back) on top of the same git work;
- **propose_patch on the 100-file repository**, and read-tree + apply --check --cached
  there: **target: the 10,000-file call at most 1.2x the 100-file one**. Its scratch
  index holds the entries the patch reaches, not the tree (``repos/patches.py``), so
  nothing it does grows with the number of files; what still does is git's walk of the
  root and the touched folders (101 and 100 entries here against 11 and about 10) and
  its look-ups in a larger pack, a few hundred microseconds, plus the noise of two
  medians on a shared machine. An index of the whole tree costs about 2x there (the
  baseline's own ratio is shown beside it);
- **git apply --check**: ``git -C repo apply --check -`` as a subprocess, the patch on
  stdin, against the working tree: "git itself", the issue's first baseline, not the same
  work (no index, no tree, no object written); context, no target;
- **Repository.analyze_patch**: the measuring step alone, called directly (no MCP);
- **analyze_patch on tmpfs** (what-if, when ``/dev/shm`` exists): the same code with
  ``tempfile``'s folder pointed at tmpfs, so its scratch index and objects live there;
- **GitRunner.run**: ``git apply --numstat -`` through nexus-mcp's git runner beside the
  same command through ``subprocess.run``: what the runner's safe environment, its
  ``-c`` options and its bounded read loop add per git process.

After the timed rounds, a breakdown pass times every git process ``propose_patch`` runs
(by wrapping ``GitRunner.run`` and ``Repository.analyze_patch``) and prints each one's
median, then the time outside git: analyze_patch's own (its scratch folder, parsing) and
the rest (MCP, the chain, audit, the tool's Python). Only the two target rows have targets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from fastmcp import Client

from nexus_mcp.observability.logs import configure_logging
from nexus_mcp.repos.git import GitRunner
from nexus_mcp.repos.repository import PatchAnalysis, Repository
from nexus_mcp.server import build_server
from nexus_mcp.settings import BudgetSettings, Settings
from results import Row, progress, report

NAME = "bench_repo"
TARGET_RATIO = 2.0  # the issue: propose_patch at most 2x read-tree + apply --check --cached
SIZE_RATIO = 1.2  # 10,000 files against 100: the cost does not grow with the repository
SMALL_FILES = 100
WARMUP_ROUNDS = 10
FOLDERS = 100
FILES_PER_FOLDER = 100
EDITED_FILES = 9  # +20/-20 lines each
EDIT_LINES = 20
NEW_FILE_LINES = 40  # one new file: 9 * 40 + 40 = 400 changed lines in 10 files
BRANCH = "feature/bench"
TMPFS = "/dev/shm"  # noqa: S108 - a what-if side: analyze_patch's scratch folder on tmpfs
REPO_NAME = "bench"
SMALL_NAME = "small"
SECRET = "approval-secret-bench-0123456789abcdef-0123456789"
WORDS = (
    "alpha", "beta", "gamma", "delta", "value", "index", "result", "count", "total", "buffer",
    "record", "handler", "request", "response", "config", "option", "limit", "offset",
    "parse", "render", "update", "select", "commit",
)  # fmt: skip

GIT = shutil.which("git") or "git"


def git_env(home: Path) -> dict[str, str]:
    """The user's git configuration left out, so the baseline is git's defaults."""
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "LC_ALL": "C",
        "GIT_TERMINAL_PROMPT": "0",
    }


def git(
    repo: Path, *args: str, env: dict[str, str], stdin: bytes | None = None, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(
        [GIT, "-C", str(repo), *args], input=stdin, capture_output=True, env=env, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed: {done.stderr.decode(errors='replace')}")
    return done


# --- the repository and the patch ---------------------------------------------------------


def file_text(rng: random.Random, lines: int) -> str:
    out = []
    for number in range(lines):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7)))
        out.append(f"    {rng.choice(WORDS)}_{number} = {words!r}\n")
    return "".join(out)


def all_files() -> dict[str, str]:
    """The 10,000 files of the large repository and its CODEOWNERS, by path."""
    rng = random.Random(2026)
    files: dict[str, str] = {}
    for folder in range(FOLDERS):
        for number in range(FILES_PER_FOLDER):
            # 300 B to 4 KB: 6 to ~80 lines of about 50 bytes.
            files[f"pkg{folder:03d}/module_{number:03d}.py"] = file_text(rng, rng.randint(6, 80))
    files[".github/CODEOWNERS"] = (
        "*  @lead\n"
        + "".join(f"/pkg{f:03d}/  @team{f % 7}\n" for f in range(0, FOLDERS, 3))
        + "/pkg050/  @org/core\n"
    )
    return files


def make_repository(repo: Path, files: dict[str, str], env: dict[str, str]) -> None:
    """The files in one commit on main (fast-import, then a checkout), and the branch."""
    stream = bytearray(
        b"commit refs/heads/main\n"
        b"author Bench <bench@example.com> 1767225600 +0000\n"
        b"committer Bench <bench@example.com> 1767225600 +0000\n"
        b"data 7\ninitial\n"
    )
    for path, text in files.items():
        data = text.encode("utf-8")
        stream += f"M 100644 inline {path}\ndata {len(data)}\n".encode() + data + b"\n"
    stream += b"\n"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main", env=env)
    git(repo, "fast-import", "--quiet", env=env, stdin=bytes(stream))
    git(repo, "reset", "-q", "--hard", "main", env=env)  # the working tree and index
    git(repo, "branch", BRANCH, "main", env=env)


def small_subset(files: dict[str, str], patch: str) -> dict[str, str]:
    """``SMALL_FILES`` of the files: every one the patch edits, CODEOWNERS, then the first
    others (the new file's folder among them)."""
    kept = [path for path in files if f"\n--- a/{path}\n" in patch] + [".github/CODEOWNERS"]
    others = [path for path in files if path not in kept]
    chosen = kept + others[: SMALL_FILES - len(kept)]
    return {path: files[path] for path in sorted(chosen)}


def make_patch(repo: Path, files: dict[str, str], scratch: Path, env: dict[str, str]) -> str:
    """9 edited files and 1 new one, diffed in a scratch clone: the repository is untouched."""
    rng = random.Random(7)
    git(scratch.parent, "clone", "-q", "--no-checkout", "--shared", str(repo), scratch.name,
        env=env)  # fmt: skip
    git(scratch, "read-tree", "HEAD", env=env)
    long_enough = sorted(p for p, t in files.items() if t.count("\n") >= 60)
    chosen = rng.sample(long_enough, EDITED_FILES)
    changed: dict[str, str] = {}
    for path in chosen:
        lines = files[path].splitlines(keepends=True)
        # Two hunks of 10 replaced lines each, far enough apart to stay two hunks.
        for start in (5, 40):
            for offset in range(EDIT_LINES // 2):
                lines[start + offset] = f"    edited_{start + offset} = {rng.random()!r}\n"
        changed[path] = "".join(lines)
    changed["pkg000/added_by_patch.py"] = file_text(rng, NEW_FILE_LINES)
    for path, text in changed.items():
        sha = git(scratch, "hash-object", "-w", "--stdin", env=env, stdin=text.encode())
        cacheinfo = f"100644,{sha.stdout.decode().strip()},{path}"
        git(scratch, "update-index", "--add", "--cacheinfo", cacheinfo, env=env)
    diff = git(scratch, "diff", "--cached", "--no-color", "--no-ext-diff", "HEAD", env=env)
    return diff.stdout.decode("utf-8")


def check_patch_shape(repo: Path, patch: str, env: dict[str, str]) -> tuple[int, int]:
    stat = git(repo, "apply", "--numstat", "-", env=env, stdin=patch.encode()).stdout.decode()
    rows = [line.split("\t") for line in stat.splitlines()]
    lines = sum(int(added) + int(removed) for added, removed, _ in rows)
    if len(rows) != EDITED_FILES + 1 or lines != EDITED_FILES * 2 * EDIT_LINES + NEW_FILE_LINES:
        raise RuntimeError(f"unexpected patch shape: {len(rows)} files, {lines} lines")
    return len(rows), lines


def write_config(path: Path, root: Path, repos: dict[str, Path]) -> None:
    policy = {
        "allowed_branches": ["feature/.*"],
        "max_diff_size": 1024 * 1024,
        "max_changed_files": 100,
        "max_changed_lines": 10_000,
        "require_codeowners": True,
    }
    section = {
        "allowed_roots": [str(root)],
        "repositories": {
            name: {"path": str(repo), "write_policy": policy} for name, repo in repos.items()
        },
    }
    path.write_text(yaml.safe_dump({"repos": section}), encoding="utf-8")


# --- timing ---------------------------------------------------------------------------------


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def p95_ms(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))] * 1e3


async def measure(rounds: int, breakdown_calls: int) -> tuple[list[Row], str]:
    with tempfile.TemporaryDirectory(prefix="nexus-bench-repo-") as tmp:
        base = Path(tmp)
        home = base / "home"
        home.mkdir()
        env = git_env(home)
        roots = base / "roots"
        repo, small = roots / "project", roots / "small"
        started = time.monotonic()
        files = all_files()
        make_repository(repo, files, env)
        patch = make_patch(repo, files, base / "scratch", env)
        patch_bytes = patch.encode("utf-8")
        count, lines = check_patch_shape(repo, patch, env)
        small_files = small_subset(files, patch)
        make_repository(small, small_files, env)
        check_patch_shape(small, patch, env)
        progress(NAME, f"set-up: {len(files):,} and {len(small_files)} files, a {count}-file "
                       f"{lines}-line patch ({len(patch_bytes):,} bytes) in "
                       f"{time.monotonic() - started:.1f} s")  # fmt: skip
        (base / "ws").mkdir()
        config = base / "nexus.yaml"
        write_config(config, roots, {REPO_NAME: repo, SMALL_NAME: small})
        budgets = BudgetSettings(rate_limit_calls=10**9, max_calls_per_session=10**9)
        server = build_server(
            Settings(
                mode="prod", subject="bench", role="editor", profile="repo",
                workspace=base / "ws", data_dir=base / "data", budgets=budgets,
            ),
            config_file=config,
            env={**os.environ, "NEXUS_MCP_APPROVAL_SECRET": SECRET},
        )  # fmt: skip
        try:
            assert server.runtime.repos is not None
            repository = server.runtime.repos.catalog.get(REPO_NAME)
            tip = repository.branch_tip(BRANCH)
            assert tip is not None
            arguments = {"repo": REPO_NAME, "branch": BRANCH, "patch": patch}
            small_arguments = {**arguments, "repo": SMALL_NAME}
            async with Client(server.mcp) as client:
                for args in (arguments, small_arguments):
                    first = await client.call_tool_mcp("propose_patch", args)
                    result = first.structuredContent or {}
                    if first.isError or not result.get("applies") or result.get("risks"):
                        raise RuntimeError(f"propose_patch did not pass cleanly: {first}")

                def plain() -> None:
                    git(repo, "apply", "--check", "-", env=env, stdin=patch_bytes)

                def cached_in(where: Path) -> None:
                    index = base / "bench-index"
                    index_env = {**env, "GIT_INDEX_FILE": str(index)}
                    try:
                        git(where, "read-tree", BRANCH, env=index_env)
                        git(where, "apply", "--check", "--cached", "-", env=index_env,
                            stdin=patch_bytes)  # fmt: skip
                    finally:
                        index.unlink(missing_ok=True)

                async def propose_to(args: dict[str, str]) -> None:
                    answer = await client.call_tool_mcp("propose_patch", args)
                    if answer.isError:
                        raise RuntimeError(f"propose_patch failed: {answer}")

                def analyze() -> None:
                    if not repository.analyze_patch(tip, patch_bytes).applies:
                        raise RuntimeError("analyze_patch: the patch does not apply")

                def analyze_tmpfs() -> None:
                    # What-if: the same code, its scratch folder (tempfile's) on tmpfs.
                    before, tempfile.tempdir = tempfile.tempdir, TMPFS
                    try:
                        analyze()
                    finally:
                        tempfile.tempdir = before

                def numstat_runner() -> None:
                    repository.runner.run(["apply", "--numstat", "-z", "-"], stdin=patch_bytes)

                def numstat_plain() -> None:
                    git(repo, "apply", "--numstat", "-z", "-", env=env, stdin=patch_bytes)

                sides: dict[str, Callable[[], Any]] = {
                    "plain": plain,
                    "cached": lambda: cached_in(repo),
                    "cached_small": lambda: cached_in(small),
                    "propose": lambda: propose_to(arguments),
                    "propose_small": lambda: propose_to(small_arguments),
                    "analyze": analyze,
                    **({"analyze_tmpfs": analyze_tmpfs} if Path(TMPFS).is_dir() else {}),
                    "numstat_runner": numstat_runner,
                    "numstat_plain": numstat_plain,
                }
                samples = await alternate(sides, rounds)
                progress(NAME, f"breakdown: {breakdown_calls} propose_patch calls, git timed")
                breakdown = await git_breakdown(
                    lambda: client.call_tool_mcp("propose_patch", arguments), breakdown_calls
                )
        finally:
            server.close()
    return rows_of(samples, rounds, count, lines), breakdown


async def alternate(sides: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    async def once(call: Callable[[], Any]) -> float:
        start = time.perf_counter()
        outcome = call()
        if asyncio.iscoroutine(outcome):
            await outcome
        return time.perf_counter() - start

    progress(NAME, f"warm-up: {WARMUP_ROUNDS} rounds of {len(sides)} sides")
    for _ in range(WARMUP_ROUNDS):
        for call in sides.values():
            await once(call)
    samples: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for done in range(1, rounds + 1):
        # Rotate the order each round: no side always runs right after the same one.
        shift = done % len(order)
        for name in order[shift:] + order[:shift]:
            samples[name].append(await once(sides[name]))
        if done % 50 == 0 and done < rounds:
            progress(NAME, f"{done}/{rounds} rounds")
    return samples


@dataclass
class Trace:
    """One propose_patch call: its git processes in order, and analyze_patch's share."""

    runs: list[tuple[str, float]] = field(default_factory=list)  # (command, seconds)
    analyze_seconds: float = 0.0
    analyze_runs: range = range(0)  # which of ``runs`` analyze_patch ran


@contextlib.contextmanager
def traced() -> Iterator[Trace]:
    """Time every ``GitRunner.run`` and ``Repository.analyze_patch`` while inside."""
    trace = Trace()
    run_git, analyze = GitRunner.run, Repository.analyze_patch

    def timed_run(self: GitRunner, args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return run_git(self, args, **kwargs)
        finally:
            trace.runs.append((describe(list(args)), time.perf_counter() - start))

    def timed_analyze(self: Repository, base_commit: str, patch: bytes) -> PatchAnalysis:
        first, start = len(trace.runs), time.perf_counter()
        try:
            return analyze(self, base_commit, patch)
        finally:
            trace.analyze_seconds += time.perf_counter() - start
            trace.analyze_runs = range(first, len(trace.runs))

    GitRunner.run = timed_run  # type: ignore[method-assign]
    Repository.analyze_patch = timed_analyze  # type: ignore[method-assign]
    try:
        yield trace
    finally:
        GitRunner.run = run_git  # type: ignore[method-assign]
        Repository.analyze_patch = analyze  # type: ignore[method-assign]


def describe(args: list[str]) -> str:
    flags = [a for a in args[1:] if a in ("--numstat", "--cached", "--batch", "--batch-check")]
    return " ".join([args[0], *flags]) if args else "?"


async def git_breakdown(call: Callable[[], Any], calls: int) -> str:
    """Each git process of a propose_patch call, by its place in the sequence: median ms."""
    traces: list[Trace] = []
    totals: list[float] = []
    for _ in range(calls):
        with traced() as trace:
            start = time.perf_counter()
            await call()
            totals.append(time.perf_counter() - start)
        traces.append(trace)
    shapes = {(tuple(name for name, _ in t.runs), t.analyze_runs) for t in traces}
    if len(shapes) != 1:
        return f"(no breakdown: the git sequence varied between calls: {shapes})"
    names, inside_analyze = next(iter(shapes))
    lines = [f"propose_patch, each git process it runs ({calls} calls, median ms each):"]
    for position, name in enumerate(names):
        figure = median_ms([t.runs[position][1] for t in traces])
        where = "analyze_patch" if position in inside_analyze else ""
        lines.append(f"  {position + 1:2d}. git {name:<26} {figure:6.2f} ms  {where}")
    in_git = [sum(seconds for _, seconds in t.runs) for t in traces]
    analyze_python = [t.analyze_seconds - sum(t.runs[i][1] for i in inside_analyze) for t in traces]
    rest = [
        total - git - own for total, git, own in zip(totals, in_git, analyze_python, strict=True)
    ]
    lines += [
        f"  {len(names)} git processes, together{median_ms(in_git):18.2f} ms",
        f"  analyze_patch outside git (scratch dir, parsing){median_ms(analyze_python):6.2f} ms",
        f"  the rest (MCP, chain, audit, the tool's Python){median_ms(rest):7.2f} ms",
        f"  propose_patch in all{median_ms(totals):27.2f} ms",
    ]
    return "\n".join(lines)


def rows_of(samples: dict[str, list[float]], rounds: int, files: int, lines: int) -> list[Row]:
    plain = median_ms(samples["plain"])
    shape = f"{lines}-line {files}-file patch, 10,000-file repo"

    def note(*names: str) -> str:
        parts = [f"{name} p95 {p95_ms(samples[name]):.1f} ms" for name in names]
        return f"median of {rounds} alternating rounds; " + ", ".join(parts)

    return [
        Row(
            measure=f"propose_patch in memory, {shape}",
            baseline="read-tree + apply --check --cached",
            baseline_value=median_ms(samples["cached"]),
            value=median_ms(samples["propose"]),
            unit="ms",
            target_kind="ratio_max",
            target=TARGET_RATIO,
            note=note("cached", "propose"),
        ),
        Row(
            measure=f"propose_patch, 10,000-file repo against {SMALL_FILES}-file repo, same patch",
            baseline=f"propose_patch, {SMALL_FILES} files",
            baseline_value=median_ms(samples["propose_small"]),
            value=median_ms(samples["propose"]),
            unit="ms",
            target_kind="ratio_max",
            target=SIZE_RATIO,
            note=note("propose_small"),
        ),
        Row(
            measure="read-tree + apply --check --cached, same two repos (context)",
            baseline=f"same, {SMALL_FILES} files",
            baseline_value=median_ms(samples["cached_small"]),
            value=median_ms(samples["cached"]),
            unit="ms",
            note=note("cached_small"),
        ),
        Row(
            measure="propose_patch, same (context: not the same work)",
            baseline="git apply --check",
            baseline_value=plain,
            value=median_ms(samples["propose"]),
            unit="ms",
            note=note("plain"),
        ),
        Row(
            measure="Repository.analyze_patch alone, same",
            baseline="read-tree + apply --check --cached",
            baseline_value=median_ms(samples["cached"]),
            value=median_ms(samples["analyze"]),
            unit="ms",
            note=note("analyze"),
        ),
        *(
            [
                Row(
                    measure="analyze_patch, its scratch folder on tmpfs (what-if)",
                    baseline="read-tree + apply --check --cached",
                    baseline_value=median_ms(samples["cached"]),
                    value=median_ms(samples["analyze_tmpfs"]),
                    unit="ms",
                    note=note("analyze_tmpfs"),
                )
            ]
            if "analyze_tmpfs" in samples
            else []
        ),
        Row(
            measure="one git process (apply --numstat) via GitRunner.run",
            baseline="subprocess.run",
            baseline_value=median_ms(samples["numstat_plain"]),
            value=median_ms(samples["numstat_runner"]),
            unit="ms",
            note=note("numstat_plain", "numstat_runner"),
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--breakdown-calls", type=int, default=40)
    args = parser.parse_args(argv)
    configure_logging("ERROR")  # the in-process server's JSON logs are not the result
    rows, breakdown = asyncio.run(measure(args.rounds, args.breakdown_calls))
    print(breakdown, flush=True)
    print(flush=True)
    report(NAME, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
