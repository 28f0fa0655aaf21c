"""Reviewing an upstream's tool definitions against their pins, and pinning them: what
``nexus-mcp upstream check`` and ``upstream pin`` (``commands/upstream.py``) and the
console's Upstream pins page (``console/pins.py``) share.

``inspect`` connects to one upstream the way ``serve`` would (the same ``UpstreamServer``),
as the gateway itself (no caller's identity), and lists its tools; nothing is called. It
reads the quarantine evidence ``serve`` keeps (the data directory's file on the embedded
backend, Redis on the shared one), so a definition that changed and was reverted shows as
changed. ``server_report`` says the same of any ``UpstreamServer`` (the console, inside a
running server, reads the gateway's own). ``pin_reviewed`` clears the evidence of the
tools it pins, then writes their pins with a new stamp (a running server forgets its own
copy of the evidence when it reads the new lock file), then keeps their definitions
beside the lock file for the next diff.

The report is a plain dict: ``server_id``, ``state``, ``isolation`` (sandboxed or not,
network or not: ``policy.sandbox.isolation``), ``failure``, ``tools`` (name ->
exposed, class, pin, pinned, sha256, status, allowed, definition, broken, seen,
evidence), ``missing`` (pinned, no longer listed), ``kept`` (the pinned definitions), and
what could not be used (``invalid``, ``cut``, ``pin_problems``, ``pins_unusable``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.catalog import Kind
from nexus_mcp.policy.definition_diff import definition_diff
from nexus_mcp.policy.pins import (
    PinnedDefinitions,
    PinState,
    load_pinned_definitions,
    load_pins,
    lock_path,
    write_pinned_definitions,
    write_pins,
)
from nexus_mcp.policy.quarantine import PersistedEvidence
from nexus_mcp.policy.registry import RegistrySet
from nexus_mcp.policy.sandbox import isolation
from nexus_mcp.policy.upstreams import (
    ResolvedSecrets,
    UpstreamConfig,
    UpstreamsConfig,
    resolve_secrets,
)
from nexus_mcp.settings import Settings
from nexus_mcp.stores.locations import upstream_quarantine_path
from nexus_mcp.stores.sqlite_quarantine import SqliteQuarantineEvidence

if TYPE_CHECKING:
    from nexus_mcp.providers.upstream.server import UpstreamServer
    from nexus_mcp.stores.redis_quarantine import RedisSeenDigests

# What ``check``, ``pin`` and the console say of a tool's pin.
PINNED_UNCHANGED = "pinned, unchanged"
NOT_PINNED_YET = "not pinned yet"
CHANGED = "changed"
REMOVED_UPSTREAM = "removed upstream"
PIN_UNUSABLE = "pin unusable"
ONLY_DIGEST = "(the lock file has only the digest, re-pin to see diffs next time)"


class ReviewContext:
    """One configuration's upstreams, their registries and lock files, and where the
    quarantine evidence is kept. ``secrets``, ``persisted`` and ``shared``: what a running
    server already holds (its resolved secrets, its evidence stores); without them they
    are resolved and opened as ``serve`` would (the CLI, the standalone console)."""

    def __init__(
        self,
        config: UpstreamsConfig,
        registry_dir: Path,
        mode: str,
        registry: RegistrySet,
        settings: Settings,
        *,
        secrets: Callable[[UpstreamConfig], ResolvedSecrets] | None = None,
        persisted: PersistedEvidence | None = None,
        shared: RedisSeenDigests | None = None,
    ) -> None:
        self.registry = registry
        self.config = config
        self.registry_dir = registry_dir
        self.mode = mode
        self.settings = settings
        self._secrets = secrets
        self._persisted = persisted
        self._shared = shared
        self._redis: Any = None

    def secrets_of(self, upstream: UpstreamConfig) -> ResolvedSecrets:
        if self._secrets is not None:
            return self._secrets(upstream)
        return resolve_secrets(upstream, os.environ)

    def persisted(self) -> PersistedEvidence | None:
        """The embedded backend's evidence file, when there is one (never created here)."""
        if self._persisted is not None:
            return self._persisted
        if self.settings.state.backend == "shared":
            return None
        path = upstream_quarantine_path(self.settings)
        return SqliteQuarantineEvidence(path) if path.exists() else None

    def shared(self) -> RedisSeenDigests | None:
        """The shared backend's evidence store (Redis), as ``serve`` opens it."""
        if self._shared is not None:
            return self._shared
        if self.settings.state.backend != "shared":
            return None
        from nexus_mcp.stores.backends import resolve_url
        from nexus_mcp.stores.redis_quarantine import RedisSeenDigests
        from nexus_mcp.stores.redis_state import redis_client

        state = self.settings.state
        if self._redis is None:
            url = resolve_url(state.redis_url, "state.redis_url", self.settings, os.environ)
            self._redis = redis_client(
                url,
                pool_size=1,
                connect_timeout=state.connect_timeout_seconds,
                timeout=state.timeout_seconds,
            )
        return RedisSeenDigests(self._redis, state.key_prefix)

    @property
    def server_ids(self) -> list[str]:
        return [s.server_id for s in self.config.servers]

    def lock_file(self, server_id: str) -> Path:
        return lock_path(self.registry_dir, server_id)


async def inspect(context: ReviewContext, server_id: str) -> dict[str, Any]:
    """Connect as the gateway, list, and say what serve would decide for every tool."""
    from nexus_mcp.providers.upstream.sandboxes import plan_upstream_sandboxes
    from nexus_mcp.providers.upstream.server import UpstreamServer  # FastMCP: only here

    upstream = context.config.get(server_id)
    if upstream is None:
        raise ConfigError(f"no upstream {server_id!r} in the configuration")
    server = UpstreamServer(
        upstream,
        secrets=context.secrets_of(upstream),
        registry=context.registry,
        registry_dir=context.registry_dir,
        mode=context.mode,
        on_change=lambda _server: None,
        seen=context.shared(),
        # The same bound on one message as serve's (``limits.max_read_bytes``): a listing
        # serve reads whole is reviewed whole.
        max_result_bytes=context.settings.limits.max_read_bytes,
    )
    # Opened as serve opens it: in its sandbox when it has one (refused without bwrap).
    server.sandbox = plan_upstream_sandboxes(
        context.config,
        settings=context.settings,
        registry_dir=context.registry_dir,
        environ=os.environ,
        warn=False,
    ).get(server_id)
    persisted = context.persisted()
    if persisted is not None:
        server.use_persisted(persisted)
    try:
        await server.start()
        await server.wait_first_attempt(upstream.timeouts.connect_seconds + 1)
        return server_report(server, context.registry_dir)
    finally:
        await server.close()


def server_report(server: UpstreamServer, registry_dir: Path) -> dict[str, Any]:
    """What ``server`` decided of every tool it lists, and what its pins hold."""
    tools = {
        name: {
            "exposed": view.exposed_name or "-",
            "class": view.entry.tool_class if view.entry is not None else "unclassified",
            "pin": view.pin_state,
            "pinned": server.pins.digests.get(name),
            "sha256": view.digest,
            "status": view.status,
            "reason": view.reason,
            "allowed": view.status != "not_allowed",
            "upstream_name": name,
            "definition": view.definition,
            "broken": name in server.pins.broken or server.pins.unusable is not None,
            "seen": server.other_digest(name),
            "evidence": sorted(server.seen_digests(name)),
        }
        for name, view in sorted(server.views.items())
    }
    missing = sorted(set(server.pins.digests) - set(server.views))
    return {
        "server_id": server.server_id,
        "state": server.state,
        "isolation": isolation(server.config.transport, server.sandbox),
        "failure": server.last_failure,
        "tools": tools,
        "missing": missing,
        "pinned_missing": {name: server.pins.digests[name] for name in missing},
        "kept": load_pinned_definitions(registry_dir, server.server_id),
        "invalid": [i.as_record() for i in server.invalid],
        "cut": server.listing_cut,
        "pin_problems": server.pins.problems(),
        "pins_unusable": server.pins.unusable is not None,
        "items": item_report(server),
        "item_problems": [
            *(
                f"{kind.value} listing cut ({server.catalog.cut[kind]}): the rest is not exposed"
                for kind in Kind
                if server.catalog.cut[kind] is not None
            ),
            *(
                f"{kind.value} #{i['position']} skipped ({i['reason']}), sha256 {i['sha256']}"
                for kind in Kind
                for i in server.catalog.invalid[kind]
            ),
        ],
    }


def item_report(server: UpstreamServer) -> list[dict[str, Any]]:
    """What ``server`` decided of every prompt, resource template and resource it lists
    (``catalog.py``), in the order of their kinds and keys."""
    rows = []
    for kind in Kind:
        for key, view in sorted(server.catalog.views[kind].items()):
            pinned = server.pins.item_pin(kind, key)
            rows.append(
                {
                    "kind": kind,
                    "key": key,
                    "exposed": view.exposed or "-",
                    "pin": view.pin_state,
                    "pinned": pinned,
                    "sha256": view.digest,
                    "status": view.status,
                    "reason": view.reason,
                    "allowed": view.status != "not_allowed",
                    "definition": view.definition,
                    "broken": server.pins.quarantines_item(kind, key),
                }
            )
    return rows


def items_to_pin(
    report: Mapping[str, Any], wanted: Mapping[Kind, Collection[str]] | None
) -> dict[Kind, dict[str, str]]:
    """The items of ``wanted`` (None: every allowed one) whose pin would change, by kind,
    with the digest each would be pinned by: the one listed now."""
    changes: dict[Kind, dict[str, str]] = {}
    for item in report.get("items", ()):
        kind, key = item["kind"], item["key"]
        chosen = item["allowed"] if wanted is None else key in wanted.get(kind, ())
        if chosen and (item["pin"] != PinState.PINNED or item["broken"]):
            changes.setdefault(kind, {})[key] = item["sha256"]
    return changes


def pin_items(
    context: ReviewContext, server_id: str, changes: Mapping[Kind, Mapping[str, str]]
) -> Path:
    """Write the item pins ``changes``, each stamped anew: the evidence of every session
    and replica is kept under a pin's digest and stamp (``catalog.py``), so a new stamp
    starts with none, and nothing is cleared first."""
    pins = load_pins(context.registry_dir, server_id)
    for kind, digests in changes.items():
        pins = pins.with_item_pins(kind, digests, renew=True)
    return write_pins(pins)


def verdict(tool: Mapping[str, Any]) -> str:
    """What ``check`` says of a listed tool's pin."""
    if tool["broken"]:
        return PIN_UNUSABLE
    if tool["pin"] == PinState.PINNED:
        return PINNED_UNCHANGED
    if tool["pin"] == PinState.UNPINNED:
        return NOT_PINNED_YET
    return CHANGED


def change_lines(tool: Mapping[str, Any], kept: PinnedDefinitions) -> list[str]:
    """How a tool about to be pinned, or that changed, differs from its pin (indented)."""
    pinned = tool["pinned"]
    if pinned is None:
        return definition_diff(None, tool["definition"])
    if tool["sha256"] == pinned:
        if tool["seen"] is None:
            return []
        return [
            "    the listing matches the pin again, but a session was shown another "
            f"definition (sha256 {tool['seen']}): re-pin once that is understood"
        ]
    before = kept.for_pin(tool["upstream_name"], pinned)
    if before is None:
        return [f"    {ONLY_DIGEST}"]
    return definition_diff(before, tool["definition"])


def to_pin(report: Mapping[str, Any], wanted: Collection[str] | None) -> dict[str, str]:
    """The tools of ``wanted`` (None: every allowed tool) whose pin would change, and the
    digest each would be pinned by: the one listed now."""
    tools: Mapping[str, Any] = report["tools"]
    names = set(wanted) if wanted is not None else {n for n, t in tools.items() if t["allowed"]}
    return {
        name: tools[name]["sha256"]
        for name in sorted(names)
        if name in tools and tools[name]["pin"] != PinState.PINNED
    }


def selection_digest(changes: Mapping[str, str]) -> str:
    """One digest of the tools about to be pinned and their definitions' digests: what a
    person reviewed, so that a pin is written only of exactly that."""
    text = "\n".join(f"{name} {digest}" for name, digest in sorted(changes.items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def pin_reviewed(
    context: ReviewContext, server_id: str, report: Mapping[str, Any], changes: Mapping[str, str]
) -> Path:
    """Write the pins ``changes`` (tool -> digest, from ``report``); the lock file.

    First the evidence is cleared (under each tool's old pin and its new one), then the
    lock file written with a new stamp: a server that reads the new pins finds no evidence
    left against them. ``ConfigError`` or ``UnavailableError``: the evidence could not be
    cleared, nothing was written. The definitions are kept afterwards (``keep_definitions``).
    """
    tools: Mapping[str, Any] = report["tools"]
    clear_evidence(context, server_id, {n: tools[n]["pinned"] for n in changes}, changes)
    pins = load_pins(context.registry_dir, server_id).with_pins(dict(changes), renew=True)
    return write_pins(pins)


def keep_definitions(
    context: ReviewContext,
    server_id: str,
    tools: Mapping[str, Mapping[str, Any]],
    kept: PinnedDefinitions,
    *,
    always: bool = True,
) -> Path | None:
    """Keep the listed definitions of the pinned tools beside the lock file (only those
    that hash to their pin), for the next diff; the file, or None when nothing was to be
    kept (``always`` False: only when some pinned tool's definition is not kept yet).
    ``OSError``: not kept (the pins hold; the next change is shown without a diff)."""
    pins = load_pins(context.registry_dir, server_id)
    if pins.unusable is not None:
        return None
    listed = {name: tool["definition"] for name, tool in tools.items()}
    missing = [
        name
        for name, digest in pins.digests.items()
        if kept.for_pin(name, digest) is None and name in listed
    ]
    if not always and not missing:
        return None
    return write_pinned_definitions(context.registry_dir, pins, listed)


def clear_evidence(
    context: ReviewContext,
    server_id: str,
    pinned: Mapping[str, str | None],
    digests: Mapping[str, str],
) -> None:
    """Forget the quarantine evidence against the tools about to be pinned, under their
    old pin and their new one, in the store ``serve`` keeps it in."""
    persisted = context.persisted()
    if persisted is not None:
        persisted.clear(server_id, frozenset(digests))
    shared = context.shared()
    if shared is not None:
        for name, digest in digests.items():
            shared.clear(server_id, name, (pinned.get(name), digest))


__all__ = [
    "CHANGED",
    "NOT_PINNED_YET",
    "ONLY_DIGEST",
    "PINNED_UNCHANGED",
    "PIN_UNUSABLE",
    "REMOVED_UPSTREAM",
    "ReviewContext",
    "change_lines",
    "clear_evidence",
    "inspect",
    "item_report",
    "items_to_pin",
    "keep_definitions",
    "pin_items",
    "pin_reviewed",
    "selection_digest",
    "server_report",
    "to_pin",
    "verdict",
]
