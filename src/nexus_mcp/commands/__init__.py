"""CLI subcommands, one module per noun; cli.py assembles them."""

from __future__ import annotations

from collections.abc import Sequence


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns padded to their widest cell, two spaces apart, no trailing blanks."""
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        cells = (str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())
