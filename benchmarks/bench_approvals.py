"""Approval and write-policy hot paths, each next to its baseline in the same run.

    python benchmarks/bench_approvals.py [--rounds N]

- ``verify_approval_token`` (header checks, kid lookup, HS256, every claim, constant-time
  binding compares, argument digest) against a bare ``jwt.decode`` of the same token;
- ``enforce_approval`` (verify + nonce consume) against ``verify_approval_token``;
- ``MemoryNonceStore.consume`` with 100,000 live nonces against a plain ``set`` add;
- ``check_write`` (5 allowed globs, defaults plus 2 disallowed entries, a rename) per call;
- ``count_changed_lines`` (linear trim) against ``difflib`` opcodes on the same edit
  (the reason the helper does not use difflib: its worst case grows quadratically).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import statistics
import time
from collections.abc import Callable
from typing import Any

import jwt

from nexus_mcp.policy.approvals import (
    ApprovalKeys,
    ApprovalSettings,
    enforce_approval,
    mint_approval_token,
    verify_approval_token,
)
from nexus_mcp.policy.write_policy import WritePolicy, check_write, count_changed_lines
from nexus_mcp.stores.nonces import MemoryNonceStore
from results import Row, progress, report

NAME = "bench_approvals"

SECRET = b"benchmark-secret-0123456789abcdef-0123456789"
KEYS = ApprovalKeys({"k1": SECRET}, "k1")
SETTINGS = ApprovalSettings()
ARGS: dict[str, Any] = {"path": "notes/daily/2025-01-01.md", "content": "x" * 4096}


def time_median(function: Callable[[], Any], rounds: int, inner: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(inner):
            function()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def row(name: str, measured: float, baseline_name: str, baseline: float) -> Row:
    """No target: these show what each check costs beside the bare primitive it wraps."""
    return Row(
        measure=name,
        baseline=baseline_name,
        baseline_value=baseline * 1e6,
        value=measured * 1e6,
        unit="µs",
    )


def mint() -> str:
    return mint_approval_token(
        KEYS, SETTINGS, approver="alice", subject="agent", tool="nexus_write_file",
        arguments=ARGS, host_id="bench",
    )  # fmt: skip


def bench_verify(rounds: int) -> Row:
    token = mint()

    def ours() -> None:
        verify_approval_token(
            KEYS, SETTINGS, token, subject="agent", tool="nexus_write_file", arguments=ARGS
        )

    def bare() -> None:
        jwt.decode(token, SECRET, algorithms=["HS256"], audience="nexus-mcp")

    return row("verify_approval_token", time_median(ours, rounds, 200),
               "bare jwt.decode", time_median(bare, rounds, 200))  # fmt: skip


def bench_enforce(rounds: int) -> Row:
    tokens = [mint() for _ in range(rounds * 100)]
    store = MemoryNonceStore(maxsize=len(tokens) + 1)
    feed = iter(tokens)

    async def ours() -> None:
        await enforce_approval(
            KEYS, SETTINGS, next(feed), subject="agent", tool="nexus_write_file",
            arguments=ARGS, nonce_store=store,
        )  # fmt: skip

    def run_ours() -> None:
        asyncio.run(_repeat(ours, 100))

    token = tokens[0]

    def verify_only() -> None:
        verify_approval_token(
            KEYS, SETTINGS, token, subject="agent", tool="nexus_write_file", arguments=ARGS
        )

    measured = time_median(run_ours, rounds, 1) / 100
    return row("enforce_approval (verify + spend nonce)", measured,
               "verify_approval_token", time_median(verify_only, rounds, 100))  # fmt: skip


async def _repeat(function: Callable[[], Any], times: int) -> None:
    for _ in range(times):
        await function()


def bench_nonces(rounds: int) -> Row:
    store = MemoryNonceStore(maxsize=200_000, clock=lambda: 0.0)
    for i in range(100_000):
        store.consume(f"live-{i}", 1e9)
    plain: set[str] = {f"live-{i}" for i in range(100_000)}
    counter = iter(range(10**9))

    def ours() -> None:
        store.consume(f"new-{next(counter)}", 1e9)

    def baseline() -> None:
        plain.add(f"new-{next(counter)}")

    return row("MemoryNonceStore.consume, 100k live", time_median(ours, rounds, 500),
               "set.add", time_median(baseline, rounds, 500))  # fmt: skip


def bench_write_policy(rounds: int) -> Row:
    policy = WritePolicy.model_validate(
        {
            "allowed_paths": ["notes/**", "src/**/*.py", "docs/*.md", "data/**/*.csv", "tmp/*"],
            "disallowed_paths": ["notes/private/", "src/secrets_*.py"],
            "allowed_operations": ["write", "edit", "rename"],
        }
    )
    paths = ["notes/projects/2025/plan.md", "notes/archive/2024/plan.md"]

    def ours() -> None:
        check_write(policy, operation="rename", paths=paths)

    def baseline() -> None:
        all(path.startswith("notes/") for path in paths)

    return row("check_write (rename, 5 globs)", time_median(ours, rounds, 500),
               "str.startswith", time_median(baseline, rounds, 500))  # fmt: skip


def bench_changed_lines(rounds: int) -> Row:
    old = [f"line {i}\n" for i in range(3000)]
    new = [f"line {i}\n" if i % 3 else f"edited {i}\n" for i in range(3000)]
    old_text, new_text = "".join(old), "".join(new)

    def ours() -> None:
        count_changed_lines(old_text, new_text)

    def baseline() -> None:
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        sum(max(i2 - i1, j2 - j1) for _, i1, i2, j1, j2 in matcher.get_opcodes())

    return row("count_changed_lines (3k lines)", time_median(ours, max(3, rounds // 5), 5),
               "difflib opcodes", time_median(baseline, max(3, rounds // 5), 1))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=15)
    rounds = parser.parse_args().rounds
    rows = []
    for bench in (bench_verify, bench_enforce, bench_nonces, bench_write_policy):
        progress(NAME, f"{bench.__name__}: {rounds} rounds")
        rows.append(bench(rounds))
    progress(NAME, "bench_changed_lines (difflib is slow: about 10 s)")
    rows.append(bench_changed_lines(rounds))
    report(NAME, rows)


if __name__ == "__main__":
    main()
