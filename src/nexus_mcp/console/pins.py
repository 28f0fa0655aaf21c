"""Upstream pins: each upstream tool's pinned and current definition side by side, the
diff, the verdict, the quarantined tools and their evidence; re-pin by an approver.

What the page says of a tool is what ``nexus-mcp upstream check`` says ("pinned,
unchanged", "not pinned yet", "changed", "removed upstream"), from the same report
(``providers/upstream/review.py``); a re-pin is ``nexus-mcp upstream pin`` for that tool
(or every changed tool of one upstream), bound to the digest of what the page showed
(``providers/upstream/pins_view.py``): if the upstream shows anything else by then,
nothing is written and the page shows the new definition. Every re-pin is audited
(``upstream_repinned``, one record per tool), every refusal too.

Names, descriptions and schemas are the upstream's text: hostile. They reach the page
escaped and bounded line by line (``policy/definition_diff.py``), then through Jinja's
autoescape; they never reach a script, and attributes only as autoescaped values.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from nexus_mcp.console.pages import PREFIX, Console
from nexus_mcp.console.security import ConsoleUser
from nexus_mcp.policy.catalog import FIELDS, SINGULAR, Kind, key_ok
from nexus_mcp.policy.definition_diff import (
    INDENT,
    MAX_LINE_CHARS,
    SHOWN_FIELDS,
    escape,
    field_lines,
)
from nexus_mcp.policy.pins import PinState
from nexus_mcp.providers.upstream.pins_view import PinsView, RepinOutcome
from nexus_mcp.providers.upstream.review import (
    REMOVED_UPSTREAM,
    change_lines,
    selection_digest,
    to_pin,
    verdict,
)

UPSTREAM_REPINNED = "upstream_repinned"
UPSTREAM_ITEM_REPINNED = "upstream_item_repinned"
_DIGEST = re.compile(r"[0-9a-f]{64}")
_TOOL = re.compile(r"[A-Za-z0-9_.\-/]{1,128}")
_REASONS = {
    "tool_definition_changed": "its definition differs from its pin",
    "tool_unpinned": "it has no pin (prod exposes pinned tools only)",
    "pin_entry_invalid": "its entry in the lock file cannot be used",
    "upstream_item_changed": "its definition differs from its pin",
    "upstream_item_unpinned": "it has no pin (prod exposes pinned items only)",
    "allowlist": "not in the upstream's allowlist",
    "name_rule": "its name cannot be exposed",
}
_REFUSED = {
    "unreachable": (502, "the upstream could not be reached: nothing was pinned"),
    "pins_unusable": (
        409,
        "the upstream's lock file cannot be used: move it away, then pin again",
    ),
    "unlisted": (409, "the upstream does not list that tool (any more): nothing was pinned"),
    "evidence": (503, "the quarantine evidence could not be cleared: nothing was pinned"),
    "configuration": (409, "this upstream's configuration cannot be used here"),
    "write": (503, "the lock file could not be written: nothing was pinned"),
}


def routes(console: Console) -> list[Route]:
    async def page(request: Request) -> Response:
        user = await console.require(request, "read")
        if isinstance(user, Response):
            return user
        view = console.services.pins
        reports = await view.reports() if view is not None else []
        pinned = request.query_params.get("pinned", "")
        return console.render(
            request,
            "pins.html",
            user,
            page="pins",
            available=view is not None,
            servers=[server_model(r) for r in reports],
            pinned=int(pinned)
            if pinned.isascii() and pinned.isdigit() and len(pinned) < 6
            else None,
            moved=False,
        )

    async def repin(request: Request) -> Response:
        posted = await console.posted(request, "repin")
        if isinstance(posted, Response):
            return posted
        user, form = posted
        view = console.services.pins
        server_id = form.get("server", "")
        if view is None or server_id not in view.server_ids:
            return console.refuse(request, user, 404, "no such upstream", code="unknown_upstream")
        scope, tool, shown = form.get("scope"), form.get("tool") or None, form.get("sha256", "")
        if scope == "item":
            kind, key = form.get("kind", ""), form.get("key", "")
            if (
                kind not in {k.value for k in Kind}
                or not key_ok(Kind(kind), key)
                or not _DIGEST.fullmatch(shown)
            ):
                return console.refuse(
                    request, user, 400, "malformed re-pin form", code="repin_form"
                )
            item_outcome = await view.repin_item(server_id, Kind(kind), key, shown)
            return _answer(console, request, user, view, server_id, item_outcome)
        if (
            scope not in ("tool", "all")
            or (scope == "tool") != (tool is not None)
            or (tool is not None and not _TOOL.fullmatch(tool))
            or not _DIGEST.fullmatch(shown)
        ):
            return console.refuse(request, user, 400, "malformed re-pin form", code="repin_form")
        outcome = await view.repin(server_id, tool, shown)
        return _answer(console, request, user, view, server_id, outcome)

    return [
        Route(f"{PREFIX}/pins", page, methods=["GET"]),
        Route(f"{PREFIX}/pins/repin", repin, methods=["POST"]),
    ]


def _answer(
    console: Console,
    request: Request,
    user: ConsoleUser,
    view: PinsView,
    server_id: str,
    outcome: RepinOutcome,
) -> Response:
    if outcome.status == "refused":
        status, message = _REFUSED.get(outcome.why or "", (409, "nothing was pinned"))
        return console.refuse(request, user, status, message, code=f"repin_{outcome.why}")
    if outcome.status == "moved":
        # What was reviewed is not what the upstream shows now: refused, and the page
        # shows the new definition to review (a fixed notice, never the request's words).
        console.audit(
            "console_refused",
            user,
            tool="console",
            outcome="REFUSED",
            reason="repin_definition_moved",
            server_id=server_id,
            facts={"path": f"{PREFIX}/pins/repin", "method": "POST"},
        )
        assert outcome.report is not None
        return console.render(
            request,
            "pins.html",
            user,
            status=409,
            page="pins",
            available=True,
            servers=[server_model(outcome.report)],
            pinned=None,
            moved=True,
        )
    for kind, digests in outcome.items.items():
        for key, digest in digests.items():
            # The item's key is the upstream's text: the audit keeps its digest.
            console.audit(
                UPSTREAM_ITEM_REPINNED,
                user,
                tool="console",
                server_id=server_id,
                pinned_sha256=digest,
                outcome="OK",
                facts={
                    "kind": kind.value,
                    "item_sha256": hashlib.sha256(key.encode("utf-8")).hexdigest(),
                    "host": view.host,
                },
            )
    count = len(outcome.pinned) + sum(len(d) for d in outcome.items.values())
    for tool, digest in outcome.pinned.items():
        console.audit(
            UPSTREAM_REPINNED,
            user,
            tool=tool,
            server_id=server_id,
            pinned_sha256=digest,
            outcome="OK",
            facts={"definitions_kept": outcome.kept, "host": view.host},
        )
    return RedirectResponse(f"{PREFIX}/pins?pinned={count}#server-{server_id}", status_code=303)


def server_model(report: Mapping[str, Any]) -> dict[str, Any]:
    """What the template shows of one upstream's report (``review.server_report``)."""
    ready = report["state"] == "ready" and not report["pins_unusable"]
    kept = report["kept"]
    tools = [tool_model(tool, kept, pinnable=ready) for tool in report["tools"].values()]
    changes = to_pin(report, None)
    removed = []
    for name, pinned in sorted(report.get("pinned_missing", {}).items()):
        before = kept.for_pin(name, pinned)
        removed.append(
            {
                "name": name,
                "pinned": pinned,
                "verdict": REMOVED_UPSTREAM,
                "fields": [(f, _text(before.get(f)), None, False) for f in SHOWN_FIELDS]
                if before is not None
                else None,
            }
        )
    problems = [*report["pin_problems"], *kept.problems()]
    problems += [
        f"definition #{i['position']} skipped ({i['reason']}), sha256 {i['sha256']}"
        for i in report["invalid"]
    ]
    if report["cut"] is not None:
        reason, count = report["cut"]
        problems.append(f"listing cut after {count} definitions ({reason}): the rest is hidden")
    return {
        "id": report["server_id"],
        "state": report["state"],
        "isolation": _isolation(report.get("isolation")),
        "failure": report["failure"],
        "pins_unusable": report["pins_unusable"],
        "problems": problems,
        "tools": tools,
        "removed": removed,
        "quarantined": [t for t in tools if t["status"] == "quarantined"],
        "changes": len(changes),
        "all_digest": selection_digest(changes),
        "pinnable": ready and bool(changes),
        "catalog_items": [
            item_model(item, ready=ready, position=position)
            for position, item in enumerate(report.get("items", ()))
        ],
    }


def item_model(item: Mapping[str, Any], *, ready: bool, position: int) -> dict[str, Any]:
    """What the template shows of one prompt, resource template or resource
    (``review.item_report``): all of it the upstream's text, escaped and bounded."""
    kind: Kind = item["kind"]
    changed = item["pin"] != PinState.PINNED or item["broken"]
    return {
        "position": position,
        "kind": kind.value,
        "kind_label": SINGULAR[kind],
        # The form's value (autoescaped; ``key_ok`` rules out controls and whitespace);
        # what a person reads is ``shown``, escaped and cut.
        "key": item["key"],
        "shown": _cut(escape(item["key"])),
        "exposed": _cut(escape(item["exposed"])),
        "verdict": verdict({**item, "seen": None}),
        "status": item["status"],
        "reason": _REASONS.get(item.get("reason") or "", item.get("reason") or ""),
        "pinned": item["pinned"],
        "sha256": item["sha256"],
        "fields": [(f, _text(item["definition"].get(f))) for f in FIELDS[kind]],
        "changed": changed,
        "can_pin": ready and changed and item["allowed"],
    }


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "..."


def tool_model(tool: Mapping[str, Any], kept: Any, *, pinnable: bool) -> dict[str, Any]:
    name, pinned, definition = tool["upstream_name"], tool["pinned"], tool["definition"]
    before = kept.for_pin(name, pinned) if pinned is not None else None
    fields: list[tuple[str, str | None, str, bool]] = []
    for f in SHOWN_FIELDS:
        now = _text(definition.get(f))
        if before is None:
            fields.append((f, None, now, False))
        else:
            fields.append((f, _text(before.get(f)), now, before.get(f) != definition.get(f)))
    changed = tool["pin"] != PinState.PINNED
    return {
        "name": name,
        "exposed": tool["exposed"],
        "tool_class": tool["class"],
        "status": tool["status"],
        "reason": _REASONS.get(tool.get("reason") or "", tool.get("reason") or ""),
        "verdict": verdict(tool),
        "pinned": pinned,
        "sha256": tool["sha256"],
        "evidence": [(d, d == pinned) for d in tool.get("evidence", ())],
        "seen": tool["seen"],
        "fields": fields,
        "pinned_known": before is not None,
        "diff": _diff(change_lines(tool, kept)) if changed else [],
        "changed": changed,
        "can_pin": pinnable and changed and tool["allowed"],
    }


def _isolation(how: Mapping[str, Any] | None) -> dict[str, str] | None:
    """How the upstream runs (``policy.sandbox.isolation``), in the page's words."""
    if how is None:
        return None
    network = {True: "on", False: "off"}.get(how["network"], "-")
    words = {
        "bubblewrap": f"Runs in a bubblewrap sandbox (its own folders only), network {network}.",
        "none": (
            "Runs unsandboxed: with the gateway's user's rights over its files and the"
            " network. Give it a sandbox: section to confine it."
        ),
        "remote": "A remote (HTTP) server: not a process this gateway runs.",
    }
    return {"sandbox": how["sandbox"], "network": network, "words": words[how["sandbox"]]}


def _text(value: Any) -> str:
    """One field as the page shows it: escaped and bounded lines (``field_lines``)."""
    return "\n".join(field_lines(value))


def _diff(lines: list[str]) -> list[tuple[str, str]]:
    """Each diff line without its terminal indent, with its kind (for its colour)."""
    out = []
    for line in lines:
        text = line.removeprefix(INDENT)
        if text.startswith("  +"):
            kind = "add"
        elif text.startswith("  -"):
            kind = "del"
        elif text.startswith("  @@"):
            kind = "hunk"
        else:
            kind = "field"
        out.append((kind, text))
    return out


__all__ = ["UPSTREAM_ITEM_REPINNED", "UPSTREAM_REPINNED", "item_model", "routes", "server_model"]
