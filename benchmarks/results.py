"""Result rows every benchmark reports, the one table format, and progress lines.

A benchmark measures nexus-mcp beside a baseline in the same run and reports ``Row``s:
what was measured, the baseline's figure, nexus-mcp's, their ratio (always nexus-mcp
divided by the baseline, in the row's unit) and the target with MET or MISSED. Run alone,
a benchmark prints its rows as a table; under ``run_all.py`` it also writes them as JSON
to the file named by ``NEXUS_BENCH_RESULTS``, and run_all prints every row in one table.

Progress goes to stderr, so a long benchmark shows it is alive; tables go to stdout.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

RESULTS_ENV = "NEXUS_BENCH_RESULTS"

# How a row's target reads: the ratio at most / at least a bound, or nexus-mcp's own
# figure below a bound.
TargetKind = Literal["ratio_max", "ratio_min", "value_max", "none"]
Status = Literal["MET", "MISSED", "-"]

_STARTED = time.monotonic()


@dataclass(frozen=True)
class Row:
    measure: str
    baseline: str  # what the baseline is, e.g. "bare FastMCP, same tool work"
    baseline_value: float | None
    value: float
    unit: str  # "µs", "ms", "calls/s", "MiB/s", "ms/KB"
    target_kind: TargetKind = "none"
    target: float | None = None
    note: str = ""  # a short qualifier printed under the table (e.g. p99, CPU)
    benchmark: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline_value is None or not self.baseline_value:
            return None
        return self.value / self.baseline_value

    @property
    def status(self) -> Status:
        if self.target_kind == "none" or self.target is None:
            return "-"
        if self.target_kind == "value_max":
            return "MET" if self.value < self.target else "MISSED"
        ratio = self.ratio
        if ratio is None or math.isnan(ratio):
            return "MISSED"
        if self.target_kind == "ratio_max":
            return "MET" if ratio <= self.target else "MISSED"
        return "MET" if ratio >= self.target else "MISSED"

    def target_text(self) -> str:
        if self.target_kind == "ratio_max":
            return f"<= {self.target:.2f}x"
        if self.target_kind == "ratio_min":
            return f">= {self.target:.2f}x"
        if self.target_kind == "value_max":
            return f"< {format_value(self.target or 0.0, self.unit)}"
        return "-"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        return cls(**data)


def format_value(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 1000:
        text = f"{value:,.0f}"
    elif abs(value) >= 100:
        text = f"{value:.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}"


def format_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    # Three decimals, or three significant digits for a ratio far below one.
    return f"{ratio:.3f}x" if ratio >= 0.01 else f"{ratio:.3g}x"


HEADERS = ("measure", "baseline", "nexus-mcp", "ratio", "target", "result")


def table(rows: Sequence[Row]) -> str:
    """The rows as one aligned text table; a MISSED target is marked at the line's start."""
    cells = [
        (
            row.measure,
            "-"
            if row.baseline_value is None
            else f"{format_value(row.baseline_value, row.unit)} ({row.baseline})",
            format_value(row.value, row.unit),
            format_ratio(row.ratio),
            row.target_text(),
            row.status,
        )
        for row in rows
    ]
    widths = [
        max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(HEADERS)
    ]
    right = {2, 3}  # figures align right

    def line(values: Sequence[str], mark: str) -> str:
        parts = [
            v.rjust(widths[i]) if i in right else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return f"{mark} " + "  ".join(parts).rstrip()

    out = [line(HEADERS, " "), line(["-" * w for w in widths], " ")]
    out += [
        line(c, "!" if row.status == "MISSED" else " ") for c, row in zip(cells, rows, strict=True)
    ]
    notes = [f"  {row.measure}: {row.note}" for row in rows if row.note]
    if notes:
        out += ["", "notes:", *notes]
    return "\n".join(out)


def progress(benchmark: str, message: str) -> None:
    """One progress line on stderr, with the seconds since the benchmark started."""
    sys.stderr.write(f"[{benchmark} {time.monotonic() - _STARTED:5.0f}s] {message}\n")
    sys.stderr.flush()


def report(benchmark: str, rows: Iterable[Row]) -> list[Row]:
    """Print the benchmark's rows as a table; hand them to run_all when it asked for them."""
    tagged = [
        row if row.benchmark else Row(**{**row.to_json(), "benchmark": benchmark}) for row in rows
    ]
    print(table(tagged), flush=True)
    target = os.environ.get(RESULTS_ENV)
    if target:
        with open(target, "a", encoding="utf-8") as handle:
            for row in tagged:
                handle.write(json.dumps(row.to_json()) + "\n")
    return tagged


def load_rows(path: str) -> list[Row]:
    rows: list[Row] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    rows.append(Row.from_json(json.loads(line)))
    except FileNotFoundError:
        pass
    return rows


__all__ = [
    "RESULTS_ENV",
    "Row",
    "format_ratio",
    "format_value",
    "load_rows",
    "progress",
    "report",
    "table",
]
