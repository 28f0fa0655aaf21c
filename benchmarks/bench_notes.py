"""Benchmark get_section_source on generated notes of 10 KB, 100 KB and 1,000,000 characters.

Runs the SectionSource builder in memory (frontmatter split + build on a string) and
through the local vault backend (a real file in a temp dir), side by side with the
baseline of a bare markdown-it-py CommonMark parse of the same text. Prints medians,
MB/s, the ratio to the baseline, and the cost per KB for each size: a flat per-KB cost
across sizes shows the time grows linearly with note size.

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
    print(
        f"{'size':>10} {'heads':>6} {'measure':<22} {'median ms':>10} "
        f"{'MB/s':>7} {'ms/KB':>7} {'x base':>7}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        backend = LocalVaultBackend(root)
        for chars, headings, runs in SIZES:
            content = generate_note(chars, headings)
            (root / f"note-{chars}.md").write_text(content, encoding="utf-8")
            _, body = parse_note_frontmatter(content)
            assert len(body) == chars
            megabytes = len(content.encode("utf-8")) / 1e6
            kilobytes = chars / 1000

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
            base = median_seconds(baseline, runs)
            for label, func in (
                ("baseline markdown-it", baseline),
                ("builder in memory", in_memory),
                ("local vault backend", through_vault),
            ):
                seconds = base if func is baseline else median_seconds(func, runs)
                print(
                    f"{chars:>10} {headings:>6} {label:<22} {seconds * 1000:>10.1f} "
                    f"{megabytes / seconds:>7.2f} {seconds * 1000 / kilobytes:>7.3f} "
                    f"{seconds / base:>7.2f}"
                )


if __name__ == "__main__":
    main()
