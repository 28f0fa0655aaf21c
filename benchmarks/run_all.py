"""Run every benchmark in this folder, each beside its own baseline, and end with one table.

    python benchmarks/run_all.py [--strict] [--only NAME ...]      (or: make bench)

Each benchmark prints its progress (stderr) and its own rows (stdout) as it goes; their
output is shown as it comes, never thrown away. The rows are collected (``results.py``)
and printed again at the end in one table: measure, baseline, nexus-mcp, ratio, target
and MET or MISSED, with a ``!`` in front of every missed target. The exit status is 0
unless a benchmark failed to run, or ``--strict`` is given and a target was missed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import RESULTS_ENV, Row, load_rows, table

HERE = Path(__file__).resolve().parent
SCRIPTS = [
    "bench_chain.py",
    "bench_http_load.py",
    "bench_list_tools.py",
    "bench_namespace.py",
    "bench_documents.py",
    "bench_approvals.py",
    "bench_notes.py",
    "bench_upstream.py",
    "bench_listing_fairness.py",
    "bench_repo.py",
    "bench_replicas.py",
    "bench_audit_chain.py",
    "bench_output_scan.py",
    "bench_startup.py",
]


def run(name: str, results_file: Path) -> bool:
    print(f"\n=== {name} ===", flush=True)
    started = time.monotonic()
    env = {**os.environ, RESULTS_ENV: str(results_file)}
    # stdout and stderr are the terminal's: progress and tables show as they come.
    done = subprocess.run([sys.executable, str(HERE / name)], env=env, check=False)
    print(f"({name}: {time.monotonic() - started:.0f} s)", flush=True)
    return done.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--strict", action="store_true", help="exit 1 if any target is missed")
    parser.add_argument("--only", nargs="+", choices=SCRIPTS, metavar="NAME", help="these only")
    args = parser.parse_args(argv)
    failed: list[str] = []
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="nexus-bench-results-") as tmp:
        for name in args.only or SCRIPTS:
            results_file = Path(tmp) / f"{name}.jsonl"
            if not run(name, results_file):
                failed.append(name)
            rows += load_rows(str(results_file))
    missed = [row for row in rows if row.status == "MISSED"]
    met = [row for row in rows if row.status == "MET"]
    print("\n=== summary: every benchmark, nexus-mcp beside its baseline in the same run ===")
    print(table(rows))
    print(f"\ntargets: {len(met)} met, {len(missed)} missed", end="")
    print(f"; benchmarks that failed to run: {', '.join(failed)}" if failed else "")
    if failed:
        return 1
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
