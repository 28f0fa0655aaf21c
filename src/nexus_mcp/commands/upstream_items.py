"""``nexus-mcp upstream check`` and ``pin`` for an upstream's prompts, resource templates
and resources (``providers/upstream/catalog.py``): their table, drift and pins.

Everything shown is the upstream's text: keys and fields are written through
``definition_diff.escape`` and cut, as a tool's definition is.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nexus_mcp.commands import print_table
from nexus_mcp.policy.definition_diff import INDENT, MAX_LINE_CHARS, escape

if TYPE_CHECKING:
    from nexus_mcp.policy.catalog import Kind

ITEM_COLUMNS = ("server", "kind", "item", "exposed as", "pin", "status")
MAX_SHOWN_LINES = 40  # lines of one item's definition shown before it is pinned


def add_arguments(pin: argparse.ArgumentParser) -> None:
    pin.add_argument(
        "--prompt", action="append", default=None, metavar="P", help="only this prompt"
    )
    pin.add_argument(
        "--resource",
        action="append",
        default=None,
        metavar="URI",
        help="only this resource (its uri) or resource template (its uriTemplate)",
    )


def wanted_items(args: argparse.Namespace) -> dict[Kind, set[str]] | None:
    """What ``--prompt``/``--resource`` select; None: every allowed item (no selector at
    all); nothing when only ``--tool`` is given."""
    from nexus_mcp.policy.catalog import Kind

    prompts, resources = args.prompt or [], args.resource or []
    if not prompts and not resources:
        return None if not args.tool else {}
    return {
        Kind.PROMPT: set(prompts),
        Kind.RESOURCE: set(resources),
        Kind.RESOURCE_TEMPLATE: set(resources),
    }


def unknown_items(report: Mapping[str, Any], wanted: Mapping[Kind, set[str]] | None) -> int:
    """How many selected keys the upstream does not list (never echoed: hostile or not,
    a key the operator typed is theirs, but one count is enough)."""
    from nexus_mcp.policy.catalog import Kind

    if not wanted:
        return 0
    listed = {(item["kind"], item["key"]) for item in report.get("items", ())}
    prompts = wanted.get(Kind.PROMPT, set())
    resources = wanted.get(Kind.RESOURCE, set())
    missing = [p for p in prompts if (Kind.PROMPT, p) not in listed]
    missing += [
        r
        for r in resources
        if (Kind.RESOURCE, r) not in listed and (Kind.RESOURCE_TEMPLATE, r) not in listed
    ]
    return len(missing)


def item_rows(
    report: Mapping[str, Any],
    wanted: Mapping[Kind, set[str]] | None = None,
    *,
    verdicts: bool = False,
) -> list[Sequence[str]]:
    from nexus_mcp.policy.catalog import SINGULAR
    from nexus_mcp.providers.upstream.review import verdict

    rows: list[Sequence[str]] = []
    for item in report.get("items", ()):
        if wanted is not None and item["key"] not in wanted.get(item["kind"], ()):
            continue
        shown = verdict({**item, "seen": None}) if verdicts else str(item["pin"])
        rows.append(
            (
                report["server_id"],
                SINGULAR[item["kind"]],
                _cut(escape(item["key"])),
                _cut(escape(item["exposed"])),
                shown,
                item["status"],
            )
        )
    return rows


def print_items(report: Mapping[str, Any], wanted: Mapping[Kind, set[str]] | None = None) -> None:
    rows = item_rows(report, wanted, verdicts=True)
    if rows:
        print()
        print_table(ITEM_COLUMNS, rows)


def item_drift(report: Mapping[str, Any]) -> list[str]:
    """Allowed items not pinned as listed (their kind and position, never their text)."""
    from nexus_mcp.policy.catalog import SINGULAR
    from nexus_mcp.policy.pins import PinState

    return [
        f"{SINGULAR[item['kind']]} #{position}"
        for position, item in enumerate(report.get("items", ()))
        if item["allowed"] and (item["pin"] != PinState.PINNED or item["broken"])
    ]


def print_changes(report: Mapping[str, Any], changes: Mapping[Kind, Mapping[str, str]]) -> None:
    """Each item about to be pinned: its verdict, its digests and its definition."""
    from nexus_mcp.policy.catalog import SINGULAR
    from nexus_mcp.providers.upstream.review import verdict

    by_key = {(item["kind"], item["key"]): item for item in report.get("items", ())}
    for kind, digests in changes.items():
        for key, digest in digests.items():
            item = by_key[(kind, key)]
            before = item["pinned"] or "(none)"
            print(f"\n{SINGULAR[kind]} {_cut(escape(key))}: {verdict({**item, 'seen': None})}")
            print(f"{INDENT}to pin: {before} -> {digest}")
            for line in _definition_lines(item["definition"]):
                print(line)


def _definition_lines(definition: Mapping[str, Any]) -> list[str]:
    text = json.dumps(definition, indent=2, sort_keys=True, ensure_ascii=False)
    lines = [f"{INDENT}{_cut(escape(line))}" for line in text.splitlines()]
    if len(lines) > MAX_SHOWN_LINES:
        left = len(lines) - MAX_SHOWN_LINES
        lines = [*lines[:MAX_SHOWN_LINES], f"{INDENT}... {left} more line(s) not shown"]
    return lines


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "..."


__all__ = [
    "add_arguments",
    "item_drift",
    "item_rows",
    "print_changes",
    "print_items",
    "unknown_items",
    "wanted_items",
]
