"""Output secret scanning's cost: a scanned read beside the same read unscanned.

    python benchmarks/bench_output_scan.py [--rounds N]

Two servers over one workspace, built the normal way (dev mode, the whole chain, the JSONL
audit file in a temporary folder), differ only in ``output_scanning.mode``: ``redact`` (the
default) and ``off`` (the baseline). Each reads the same file with ``nexus_read_file``
through FastMCP's in-memory client, round by round in turn so drift hits both. The files
are realistic text cut to 4 KB, 64 KB and 1 MiB: this repository's own Python sources and
docs, which hold quoted strings, digests, URLs and ids (what a scanner must not flag),
and one 64 KB file with a planted secret every 8 KB (the redacting path: every secret is
cut, the hashes made again). The detector alone (``SecretScanner.spans``) on the 1 MiB
text is reported as throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fastmcp import Client

from nexus_mcp.observability.audit import JsonlAuditSink
from nexus_mcp.policy.secret_scan import SecretScanner
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings
from results import Row, progress, report

NAME = "bench_output_scan"
KIB = 1024
MIB = 1024 * KIB
REPO = Path(__file__).resolve().parents[1]
SIZES = ((4 * KIB, 200), (64 * KIB, 40), (MIB, 4))  # bytes, calls per round
PLANTED = (
    "aws_access_key_id = AKIAIOSFODNN7Q2WZX4M\n",
    "export GITHUB_TOKEN=ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8\n",
    'slack = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"\n',
    'signing_secret = "c2VjcmV0IGtleSB3aXRoIGVudHJvcHkgWjl4UTd2TjJwTDhr"\n',
)


def corpus(size: int) -> str:
    """This repository's own sources and docs, repeated and cut to ``size`` bytes (ASCII
    kept, so bytes and characters agree)."""
    files = sorted((REPO / "src" / "nexus_mcp").rglob("*.py")) + sorted(
        (REPO / "docs").glob("*.md")
    )
    text = "".join(path.read_text(encoding="utf-8") for path in files)
    text = text.encode("ascii", "ignore").decode("ascii")
    return (text * (size // len(text) + 1))[:size]


def leaky(size: int) -> str:
    text = corpus(size)
    step = 8 * KIB
    parts = [text[i : i + step] + PLANTED[(i // step) % len(PLANTED)] for i in range(0, size, step)]
    return "".join(parts)[:size]


def build(root: Path, mode: str) -> NexusServer:
    settings = Settings(
        mode="dev",
        workspace=root / "ws",
        data_dir=root / f"data-{mode}",
        output_scanning={"mode": mode},
        budgets={"rate_limit_calls": 10**9, "max_calls_per_session": 10**9},
    )
    return build_server(settings, audit_sinks=[JsonlAuditSink(root / f"audit-{mode}.jsonl")])


async def per_call(client: Client[Any], path: str, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        result = await client.call_tool_mcp("nexus_read_file", {"path": path})
        assert not result.is_error
    return (time.perf_counter() - start) / calls


async def measure(root: Path, rounds: int) -> list[Row]:
    cases = [(f"{size // KIB} KB" if size < MIB else "1 MiB", f"f{size}.txt", size, calls)
             for size, calls in SIZES]  # fmt: skip
    cases.append(("64 KB, 8 planted secrets", "leaky.txt", 64 * KIB, 40))
    (root / "ws").mkdir()
    for _label, name, size, _calls in cases:
        text = leaky(size) if name == "leaky.txt" else corpus(size)
        (root / "ws" / name).write_text(text, encoding="utf-8")
    scanned, plain = build(root, "redact"), build(root, "off")
    times: dict[tuple[str, str], list[float]] = {}
    async with Client(scanned.mcp) as on, Client(plain.mcp) as off:
        check = await on.call_tool_mcp("nexus_read_file", {"path": "leaky.txt"})
        assert "[REDACTED:github_token]" in str(check.structured_content)
        clean = await on.call_tool_mcp("nexus_read_file", {"path": f"f{MIB}.txt"})
        clean_text = (root / "ws" / f"f{MIB}.txt").read_text(encoding="utf-8")
        assert clean.structured_content is not None
        assert clean.structured_content["content"] == clean_text, "a false positive"
        for number in range(rounds):
            progress(NAME, f"round {number + 1}/{rounds}")
            for label, name, _size, calls in cases:
                times.setdefault((label, "off"), []).append(await per_call(off, name, calls))
                times.setdefault((label, "on"), []).append(await per_call(on, name, calls))
    scanned.close()
    plain.close()
    rows = [
        Row(measure=f"nexus_read_file {label}, scanned (redact)",
            baseline="same read, output_scanning off",
            baseline_value=statistics.median(times[(label, "off")]) * 1e3,
            value=statistics.median(times[(label, "on")]) * 1e3, unit="ms")
        for label, _name, _size, _calls in cases
    ]  # fmt: skip
    scanner = SecretScanner()
    text = corpus(MIB)
    samples = []
    for _ in range(max(3, rounds)):
        start = time.perf_counter()
        scanner.spans(text, whole=True)
        samples.append(time.perf_counter() - start)
    rows.append(
        Row(measure="detector alone, 1 MiB of code and docs", baseline="-", baseline_value=None,
            value=1 / statistics.median(samples), unit="MiB/s")
    )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(measure(Path(tmp), args.rounds))
    report(NAME, rows)


if __name__ == "__main__":
    main()
