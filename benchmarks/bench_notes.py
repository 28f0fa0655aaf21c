"""Benchmark get_section_source on generated notes of 10 KB, 100 KB and 1,000,000 characters.

Runs the SectionSource builder in memory (frontmatter split + build on a string) and
through the local vault backend (a real file in a temp dir), side by side with the
baseline of a bare markdown-it-py CommonMark parse of the same text. Reports medians
and the ratio to the baseline for each size, and the builder's cost per KB at the
largest size against the smallest: a flat per-KB cost shows the time grows linearly.

    python benchmarks/bench_notes.py
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from markdown_it import MarkdownIt

from nexus_mcp.notes import LocalVaultBackend, NoteSource, build_section_source, read_note_view
from nexus_mcp.notes.frontmatter import parse_note_frontmatter
from nexus_mcp.principal import Principal
from results import Row, progress, report

NAME = "bench_notes"
# Linear: the builder's cost per KB at 100x the size stays within this factor of its cost
# per KB on the smallest note (quadratic growth would be ~100x).
LINEAR_TOLERANCE = 2.0

SIZES = ((10_000, 50, 15), (100_000, 500, 7), (1_000_000, 5_000, 5))  # chars, headings, runs
CALLER = Principal(subject="bench", vault_id="bench-vault", user_id="bench-user")
WORDS = [
    *("note", "vault", "section", "heading", "context", "agent", "policy", "audit"),
    *("review", "draft", "idea", "link", "summary", "method", "result", "source"),
    *("evidence", "plan", "timeline", "budget", "risk", "owner"),
]


def generate_note(chars: int, headings: int, seed: int = 7) -> str:
    """A realistic note: frontmatter, nested headings, prose with inline markup, lists, code."""
    rnd = random.Random(seed)
    parts = ["---\ntitle: Benchmark Note\ntags: [bench, notes]\ndate: 2026-01-05\n---\n"]
    per_section = max(1, (chars - 80) // headings)
    for index in range(headings):
        level = 1 if index % 25 == 0 else rnd.choice((2, 2, 3, 3, 4))
        heading = f"{'#' * level} {rnd.choice(WORDS).title()} {index} **{rnd.choice(WORDS)}**\n\n"
        section = [heading]
        size = len(heading)
        while size < per_section:
            kind = rnd.random()
            if kind < 0.6:
                words = [rnd.choice(WORDS) for _ in range(rnd.randint(8, 30))]
                words[rnd.randrange(len(words))] = f"[{words[0]}](https://example.org/{index})"
                words[rnd.randrange(len(words))] = f"`{rnd.choice(WORDS)}()`"
                block = " ".join(words).capitalize() + ".\n\n"
            elif kind < 0.85:
                block = (
                    "".join(f"- {rnd.choice(WORDS)} *{rnd.choice(WORDS)}*\n" for _ in range(3))
                    + "\n"
                )
            else:
                block = "```python\n# not a heading\nprint('x')\n```\n\n"
            section.append(block)
            size += len(block)
        parts.append("".join(section))
    text = "".join(parts)
    frontmatter_end = text.index("---\n", 4) + 4
    body = text[frontmatter_end:][: chars - 1].rstrip() + "."
    body += "x" * (chars - len(body))  # exactly `chars` characters of body
    return text[:frontmatter_end] + body


def median_seconds(func: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    baseline_parser = MarkdownIt("commonmark")
    rows: list[Row] = []
    per_kb: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        backend = LocalVaultBackend(root)
        for chars, headings, runs in SIZES:
            progress(NAME, f"{chars:,} characters, {headings:,} headings: {runs} runs each")
            content = generate_note(chars, headings)
            (root / f"note-{chars}.md").write_text(content, encoding="utf-8")
            _, body = parse_note_frontmatter(content)
            assert len(body) == chars

            def in_memory(content: str = content) -> object:
                fm, text = parse_note_frontmatter(content)
                return build_section_source("bench/note.md", NoteSource(text, fm))

            def through_vault(chars: int = chars) -> object:
                return asyncio.run(
                    read_note_view(backend, "section_source", f"note-{chars}.md", CALLER)
                )

            def baseline(body: str = body) -> object:
                return baseline_parser.parse(body)

            result = in_memory()
            assert isinstance(result, dict) and result["sections"]
            base_ms = median_seconds(baseline, runs) * 1000
            memory_ms = median_seconds(in_memory, runs) * 1000
            vault_ms = median_seconds(through_vault, runs) * 1000
            size = f"{chars:,} chars, {headings:,} headings"
            for label, value in (("in memory", memory_ms), ("through the local vault", vault_ms)):
                rows.append(
                    Row(
                        measure=f"get_section_source {label}, {size}",
                        baseline="bare markdown-it parse",
                        baseline_value=base_ms,
                        value=value,
                        unit="ms",
                    )
                )
            per_kb[chars] = memory_ms / (chars / 1000)
    smallest, largest = min(per_kb), max(per_kb)
    rows.append(
        Row(
            measure=f"builder cost per KB, {largest:,} vs {smallest:,} chars (linear)",
            baseline=f"{smallest:,} chars",
            baseline_value=per_kb[smallest],
            value=per_kb[largest],
            unit="ms/KB",
            target_kind="ratio_max",
            target=LINEAR_TOLERANCE,
            note="linear in note size: the cost per KB stays flat as the note grows 100x",
        )
    )
    report(NAME, rows)


if __name__ == "__main__":
    main()
