"""The stdio upstream reader: lines split wherever the chunks fall, each bounded, and the
cost linear in what the upstream writes (a long line dripped in small writes too)."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest
from mcp.client.stdio import StdioServerParameters

from nexus_mcp.providers.upstream.stdio import LineBuffer, bounded_stdio_client


def split(chunks: list[str], cap: int) -> tuple[list[str], bool]:
    buffer = LineBuffer(cap)
    lines = [line for chunk in chunks for line in buffer.feed(chunk)]
    return lines, buffer.overflowed


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        (["ab\ncd\n"], ["ab", "cd"]),
        (["a", "b", "\n", "c", "d\n"], ["ab", "cd"]),
        (["ab\n\ncd", "\n"], ["ab", "", "cd"]),
        (["\n"], [""]),
        (["abc"], []),  # no newline yet: nothing
        (["ab", "c\nd", "e\nf"], ["abc", "de"]),
    ],
)
def test_lines_come_out_whole_wherever_the_chunks_fall(
    chunks: list[str], expected: list[str]
) -> None:
    assert split(chunks, 16) == (expected, False)


@pytest.mark.parametrize(
    ("chunks", "overflowed"),
    [
        (["a" * 8 + "\n"], False),  # exactly the cap
        (["a" * 9 + "\n"], True),
        (["aaaa", "aaaa", "a"], True),  # over the cap before its newline
        (["aaaa", "aaaa", "\n"], False),
    ],
)
def test_a_line_over_the_cap_overflows(chunks: list[str], overflowed: bool) -> None:
    lines, over = split(chunks, 8)
    assert over is overflowed
    assert lines == ([] if overflowed else ["a" * 8])


def test_nothing_comes_out_after_an_overflow() -> None:
    buffer = LineBuffer(4)
    assert buffer.feed("ok\naaaaaa") == ["ok"]
    assert buffer.overflowed
    assert buffer.feed("\nnext\n") == []


DRIP = textwrap.dedent(
    """
    import os, sys, time
    piece = b"a" * 1024
    for _ in range(12_000):
        os.write(1, piece)
    os.write(1, b"\\n")
    sys.stdin.read()
    """
)


def test_a_long_line_dripped_in_small_writes_costs_linear_time(tmp_path: Path) -> None:
    """12 MB in 1 KB writes, under a 16 MB cap. The SDK's reader re-joined and re-split
    the pending line on every chunk: about 1.2 s of this process's CPU on the machine it
    was measured on, against under 0.1 s now. Measured as CPU time (not wall time), with
    a generous bound either way."""
    script = tmp_path / "drip.py"
    script.write_text(DRIP)
    params = StdioServerParameters(command=sys.executable, args=[str(script)])

    async def read_one() -> object:
        with (tmp_path / "err").open("w") as errlog:
            async with bounded_stdio_client(params, errlog, 16 * 1024 * 1024) as (read, _):
                with anyio.fail_after(60):
                    return await read.receive()

    started = time.process_time()
    message = anyio.run(read_one)
    spent = time.process_time() - started
    assert isinstance(message, Exception)  # 12 MB of "a": a parse error, as a value
    assert spent < 0.6
