"""The embedded backend's persisted upstream quarantine evidence (issue 22, item 15)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.quarantine import proofs_in
from nexus_mcp.settings import Settings
from nexus_mcp.stores.sqlite_quarantine import SqliteQuarantineEvidence, open_quarantine_evidence

PIN = "a" * 64
EVIL = "b" * 64
OTHER = "c" * 64


def test_proofs_survive_a_reopen_and_are_cleared_per_tool(tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite3"
    first = SqliteQuarantineEvidence(path)
    first.record("up", frozenset({("echo", PIN, EVIL), ("add", PIN, OTHER)}))
    first.record("up", frozenset({("echo", PIN, EVIL)}))  # idempotent
    first.record("other", frozenset({("echo", PIN, EVIL)}))
    again = SqliteQuarantineEvidence(path)  # a restart
    assert again.load("up") == [("add", PIN, OTHER), ("echo", PIN, EVIL)]
    again.clear("up", frozenset({"echo"}))
    assert again.load("up") == [("add", PIN, OTHER)]
    assert again.load("other") == [("echo", PIN, EVIL)]  # another upstream's: untouched


def test_only_a_digest_that_differs_from_its_pin_is_a_proof() -> None:
    seen = {"echo": (EVIL, PIN), "add": (PIN, PIN), "new": (OTHER, None)}
    assert proofs_in(seen) == frozenset({("echo", PIN, EVIL)})


def test_an_evidence_file_that_cannot_be_opened_stops_start_up(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    (data_dir / "upstream_quarantine.sqlite3").mkdir(parents=True)  # a folder in the way
    settings = Settings(workspace=tmp_path, data_dir=data_dir)
    with pytest.raises(ConfigError) as raised:
        open_quarantine_evidence(settings)
    assert "data_dir" in str(raised.value)
