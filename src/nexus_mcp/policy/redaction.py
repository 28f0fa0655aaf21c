"""Cutting found secrets out of text: spans, markers, and the scanner's default limits.

What output scanning needs without the detectors themselves: ``secret_scan.py`` finds the
spans (and loads detect-secrets to do it); the configuration section, and everything that
only reads it (``settings.py``, each command), import this module instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_BASE64_LIMIT = 4.5  # detect-secrets' own defaults
DEFAULT_HEX_LIMIT = 3.0
MIN_SCANNED_CHARS = 8  # no detector matches fewer characters: shorter text is not scanned
REDACTED_PREFIX = "[REDACTED:"


def secret_slug(secret_type: str) -> str:
    """detect-secrets' type name as a marker word: ``AWS Access Key`` -> ``aws_access_key``."""
    return re.sub(r"[^a-z0-9]+", "_", secret_type.lower()).strip("_")


def marker(slug: str) -> str:
    return f"{REDACTED_PREFIX}{slug}]"


@dataclass(frozen=True, slots=True)
class Span:
    """One found secret: where it is in the text, and its kind (a ``secret_slug``)."""

    start: int
    end: int
    kind: str


def cut(text: str, spans: Iterable[Span]) -> str:
    """``text`` with each span replaced by its marker."""
    parts: list[str] = []
    position = 0
    for span in spans:
        parts.append(text[position : span.start])
        parts.append(marker(span.kind))
        position = span.end
    parts.append(text[position:])
    return "".join(parts)


__all__ = [
    "DEFAULT_BASE64_LIMIT",
    "DEFAULT_HEX_LIMIT",
    "MIN_SCANNED_CHARS",
    "REDACTED_PREFIX",
    "Span",
    "cut",
    "marker",
    "secret_slug",
]
