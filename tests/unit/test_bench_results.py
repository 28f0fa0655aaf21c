"""The benchmark table's verdicts (benchmarks/results.py): what reads as MET or MISSED."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from results import RESULTS_ENV, Row, load_rows, report, table


def row(value: float, baseline: float | None, kind: str, target: float | None) -> Row:
    return Row("m", "b", baseline, value, "µs", target_kind=kind, target=target)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "baseline", "kind", "target", "status"),
    [
        (110.0, 100.0, "ratio_max", 1.10, "MET"),  # a bound is met on the bound
        (110.1, 100.0, "ratio_max", 1.10, "MISSED"),
        (90.0, 100.0, "ratio_min", 0.90, "MET"),
        (89.9, 100.0, "ratio_min", 0.90, "MISSED"),
        (99.9, None, "value_max", 100.0, "MET"),
        (100.0, None, "value_max", 100.0, "MISSED"),  # "< 100 µs" is strict
        (5.0, 0.0, "ratio_max", 1.10, "MISSED"),  # no baseline figure: never a pass
        (float("nan"), 100.0, "ratio_min", 0.9, "MISSED"),
        (5.0, 1.0, "none", None, "-"),
    ],
)
def test_each_row_is_met_or_missed_by_its_own_kind_of_target(
    value: float, baseline: float | None, kind: str, target: float | None, status: str
) -> None:
    assert row(value, baseline, kind, target).status == status


def test_a_missed_target_is_marked_at_the_start_of_its_line() -> None:
    lines = table([row(1.0, 1.0, "ratio_max", 1.1), row(2.0, 1.0, "ratio_max", 1.1)]).splitlines()
    assert lines[2].startswith("  ") and lines[2].rstrip().endswith("MET")
    assert lines[3].startswith("! ") and lines[3].rstrip().endswith("MISSED")


def test_rows_reach_run_all_through_the_file_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "rows.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(target))
    sent = [row(1.0, 1.0, "ratio_max", 1.1), row(3.0, None, "value_max", 2.0)]
    report("bench_x", sent)
    assert "MISSED" in capsys.readouterr().out
    received = load_rows(str(target))
    assert [r.status for r in received] == ["MET", "MISSED"]
    assert {r.benchmark for r in received} == {"bench_x"}
    assert all(json.loads(line) for line in target.read_text().splitlines())
