"""Shared fixtures for the whole suite (owned by the spine; areas add their own conftest.py)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"
XDG_DATA_HOME = "XDG_DATA_HOME"
_SAVED_XDG = pytest.StashKey[str | None]()
_DATA_HOME = pytest.StashKey[Path]()

if str(REPO_ROOT / "src") not in sys.path:  # pragma: no cover - editable install normally
    sys.path.insert(0, str(REPO_ROOT / "src"))


def pytest_configure(config: pytest.Config) -> None:
    """Every server a test builds without ``data_dir`` (in process, at collection time too,
    or in a subprocess given this environment) keeps its state in the suite's own folder,
    never in the developer's ``~/.local/share/nexus-mcp``."""
    config.stash[_SAVED_XDG] = os.environ.get(XDG_DATA_HOME)
    config.stash[_DATA_HOME] = Path(tempfile.mkdtemp(prefix="nexus-tests-xdg-"))
    os.environ[XDG_DATA_HOME] = str(config.stash[_DATA_HOME])


def pytest_unconfigure(config: pytest.Config) -> None:
    if _DATA_HOME not in config.stash:
        return
    shutil.rmtree(config.stash[_DATA_HOME], ignore_errors=True)
    saved = config.stash[_SAVED_XDG]
    if saved is None:
        os.environ.pop(XDG_DATA_HOME, None)
    else:
        os.environ[XDG_DATA_HOME] = saved


# Real PostgreSQL and Redis (tests/support/shared_state.py): a database and a key prefix
# per test, private servers for the outage tests, one summary line for what was skipped.
from tests.support.shared_state import (  # noqa: E402
    migrated_postgres,
    postgres_url,
    private_postgres,
    private_redis,
    redis_url,
    report_skips,
    state_prefix,
)

__all__ = [
    "migrated_postgres",
    "postgres_url",
    "private_postgres",
    "private_redis",
    "redis_url",
    "state_prefix",
]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    report_skips(terminalreporter)
