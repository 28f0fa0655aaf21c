"""Audit: search the audit log (``audit_path``, JSONL) and read one call's whole story.

Filters by time range, subject, tool, outcome code and correlation id; newest first, a page
at a time. The log's rotated segments (``audit_max_bytes``) are searched too, newest
first, as its heads file names them. The work is bounded: only the newest
``MAX_SCAN_BYTES`` of the log and its segments together (at most ``MAX_SCAN_LINES``
records) are read, and the page says when they hold more. A call's
story (``audit/call/<correlation id>``) is every record with that correlation id in the
same window, oldest first: started, blocked or finished, effects, approval decisions.
The pages show what the records hold and nothing more: the audit writer already redacts
arguments and hashes subjects that look like credentials. Every value is shown inert
(escaped, control and bidirectional characters made visible).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nexus_mcp.console.pages import PREFIX, Console
from nexus_mcp.observability.audit import AUDIT_FIELDS
from nexus_mcp.observability.audit_chain import heads_path, read_heads

MAX_SCAN_BYTES = 16 * 1024 * 1024
MAX_SCAN_LINES = 50_000
PAGE_SIZE = 100
MAX_PAGES = 50
MAX_STORY = 200
MAX_FILTER_CHARS = 256
FILTERS = ("subject", "tool", "outcome", "correlation_id")
_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_BAD_FILTER = f"a filter is at most {MAX_FILTER_CHARS} characters; times are YYYY-MM-DDTHH:MM (UTC)"


@dataclass(frozen=True)
class Scan:
    records: list[dict[str, Any]]  # newest first
    capped: bool  # the file holds older lines than were read
    missing: bool  # no audit file (yet)


def segments_newest_first(path: Path) -> list[Path]:
    """The live log, then its rotated segments newest first, as its heads file names them
    (``audit_max_bytes``); a name that is not one of the log's own segments is skipped."""
    try:
        heads = read_heads(heads_path(path))
    except (OSError, ValueError):
        heads = None
    names = [s.get("file") for s in (heads or {}).get("segments", []) if isinstance(s, dict)]
    own = re.compile(re.escape(path.name) + r"\.[1-9][0-9]{0,8}")
    rotated = [path.with_name(n) for n in names if isinstance(n, str) and own.fullmatch(n)]
    return [path, *reversed(rotated)]


def _tail(path: Path, budget: int) -> tuple[bytes, bool] | None:
    """The last ``budget`` bytes of a file and whether it holds more; None if unreadable."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - budget)
            handle.seek(start)
            return handle.read(size - start), start > 0
    except OSError:
        return None


def scan(path: Path, *, max_bytes: int = MAX_SCAN_BYTES, max_lines: int = MAX_SCAN_LINES) -> Scan:
    """The newest records of the log and, while the bounds allow, of its rotated segments,
    newest first (blocking: call it in a thread)."""
    records: list[dict[str, Any]] = []
    budget, lines_left, capped, found = max_bytes, max_lines, False, False
    for file in segments_newest_first(path):
        if budget <= 0 or lines_left <= 0:
            capped = True
            break
        tail = _tail(file, budget)
        if tail is None:
            continue  # the live log not written yet, or a segment removed
        found = True
        data, cut = tail
        budget -= len(data)
        lines = data.split(b"\n")
        if cut:
            lines, capped = lines[1:], True  # the first one is cut
        if lines and not lines[-1]:
            lines.pop()  # after the last newline
        for line in reversed(lines):
            if lines_left <= 0:  # every line read counts, a damaged one too
                capped = True
                break
            lines_left -= 1
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return Scan(records, capped=capped, missing=not found)


def _instant(text: str) -> str:
    """A form's time (UTC) in the records' own format, so they compare as text."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _filters(query: Mapping[str, str]) -> dict[str, str] | None:
    """The filters asked for (empty ones dropped), or None when one is not acceptable."""
    chosen: dict[str, str] = {}
    for name in (*FILTERS, "since", "until"):
        value = (query.get(name) or "").strip()
        if not value:
            continue
        if len(value) > MAX_FILTER_CHARS:
            return None
        chosen[name] = value
    for name in ("since", "until"):
        if name in chosen:
            try:
                chosen[f"{name}_ts"] = _instant(chosen[name])
            except ValueError:
                return None
    return chosen


def matches(record: Mapping[str, Any], chosen: Mapping[str, str]) -> bool:
    for name in FILTERS:
        if name in chosen and str(record.get(name) or "") != chosen[name]:
            return False
    ts = str(record.get("ts") or "")
    if "since_ts" in chosen and ts < chosen["since_ts"]:
        return False
    return not ("until_ts" in chosen and ts > chosen["until_ts"])


def fields_of(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A record's fields in the writer's order, nested values as compact JSON."""
    known = [name for name in AUDIT_FIELDS if name in record]
    others = sorted(name for name in record if name not in AUDIT_FIELDS and name != "v")
    out = []
    for name in (*known, *others):
        value = record[name]
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        out.append((str(name), text))
    return out


def routes(console: Console) -> list[Route]:
    path = console.services.settings.audit_path

    async def search(request: Request) -> Response:
        user = await console.require(request, "read")
        if isinstance(user, Response):
            return user
        chosen = _filters(request.query_params)
        if chosen is None:
            return console.refuse(request, user, 400, _BAD_FILTER, code="filter")
        page_text = request.query_params.get("page", "1")
        page = (
            int(page_text)
            if page_text.isascii() and page_text.isdigit() and len(page_text) < 4
            else 1
        )
        page = min(max(1, page), MAX_PAGES)
        found = await asyncio.to_thread(scan, path)
        hits = [r for r in found.records if matches(r, chosen)]
        start = (page - 1) * PAGE_SIZE
        rows = hits[start : start + PAGE_SIZE]
        more = len(hits) > start + PAGE_SIZE and page < MAX_PAGES
        query = {k: v for k, v in chosen.items() if not k.endswith("_ts")}
        return console.render(
            request,
            "audit.html",
            user,
            page="audit",
            rows=rows,
            chosen=query,
            number=page,
            more=more,
            total=len(hits),
            scanned=len(found.records),
            capped=found.capped,
            missing=found.missing,
            max_lines=MAX_SCAN_LINES,
            max_mib=MAX_SCAN_BYTES // (1024 * 1024),
        )

    async def story(request: Request) -> Response:
        user = await console.require(request, "read")
        if isinstance(user, Response):
            return user
        correlation_id = request.path_params.get("correlation_id", "")
        if not isinstance(correlation_id, str) or not _ID_RE.fullmatch(correlation_id):
            return console.refuse(request, user, 404, "no such call", code="unknown_call")
        found = await asyncio.to_thread(scan, path)
        records = [r for r in found.records if r.get("correlation_id") == correlation_id]
        records.reverse()  # oldest first: the story in order
        return console.render(
            request,
            "audit_call.html",
            user,
            page="audit",
            correlation_id=correlation_id,
            records=[fields_of(r) for r in records[:MAX_STORY]],
            more=len(records) > MAX_STORY,
            capped=found.capped,
        )

    return [
        Route(f"{PREFIX}/audit", search, methods=["GET"]),
        Route(f"{PREFIX}/audit/call/{{correlation_id}}", story, methods=["GET"]),
    ]


__all__ = [
    "MAX_SCAN_LINES",
    "Scan",
    "fields_of",
    "matches",
    "routes",
    "scan",
    "segments_newest_first",
]
