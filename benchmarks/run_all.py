"""Run every benchmark in this folder, one after another, each beside its own baseline.

python benchmarks/run_all.py        (or: make bench)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = [
    "bench_chain.py",
    "bench_list_tools.py",
    "bench_namespace.py",
    "bench_documents.py",
    "bench_approvals.py",
    "bench_notes.py",
]


def main() -> int:
    failed = []
    for name in SCRIPTS:
        print(f"\n=== {name} ===", flush=True)
        started = time.monotonic()
        # Operational logs go to stderr; the tables go to stdout.
        done = subprocess.run(
            [sys.executable, str(HERE / name)], stderr=subprocess.DEVNULL, check=False
        )
        print(f"({time.monotonic() - started:.0f} s)", flush=True)
        if done.returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
