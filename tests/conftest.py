"""Shared fixtures for the whole suite (owned by the spine; areas add their own conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"

if str(REPO_ROOT / "src") not in sys.path:  # pragma: no cover - editable install normally
    sys.path.insert(0, str(REPO_ROOT / "src"))
