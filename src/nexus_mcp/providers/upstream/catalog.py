"""An upstream's prompts, resources and resource templates: listed, pinned, exposed, run.

The tools of an upstream are decided by ``pinning.py``; its other items by this layer,
with the same rules (``policy/catalog.py``):

- **listed within bounds** (``fetch_items``), each kind only when the upstream's
  capabilities announce it, page by page, at most ``MAX_ITEMS`` items, ``MAX_PAGES``
  pages and ``MAX_BYTES`` of canonical definitions per kind (the rest is cut, audited);
- **screened**: an item that breaks its kind's rules is never pinned nor exposed, and is
  reported by position and digest only;
- **pinned**: exposed only while its definition equals its pin in the lock file, on every
  session that listed it (the evidence: every digest any session showed under the pin,
  kept in this process and, on the shared backend, in the store every replica shares, so
  that a definition one caller's session or one replica saw quarantines the item for
  all); a changed or unpinned item is quarantined and audited (``upstream_item_changed``,
  ``upstream_item_unpinned``), in development mode an unpinned one is exposed;
- **allowed**: the upstream's ``prompts`` and ``resources`` allowlists;
- **run on the caller's own session**: a prompt's ``get`` and a resource's ``read`` go
  upstream on the caller's session (``UpstreamServer._session_for``), within the call
  timeout, after the item is checked again (the lock file, and the shared evidence); the
  answer is checked and bounded (``items.py``); a failure is ``UPSTREAM_ERROR`` with a
  fixed message.

A failed listing of one kind leaves that kind with nothing exposed (fail closed); the
upstream's tools are not affected.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fastmcp.prompts import PromptResult
from fastmcp.resources.base import ResourceResult

from nexus_mcp.calls import current_principal
from nexus_mcp.errors import PROBLEM_MISSING, InvalidInputError, UnavailableError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.catalog import (
    FIELDS,
    KEY_FIELD,
    MAX_URI_CHARS,
    Kind,
    canonical_item,
    exposed_uri,
    item_problem,
)
from nexus_mcp.policy.classification import DEV_MODE
from nexus_mcp.policy.hashing import sha256_hex
from nexus_mcp.policy.pins import PinState, renewed_items
from nexus_mcp.policy.quarantine import STORE_UPSTREAM_QUARANTINE, MemorySeenDigests
from nexus_mcp.policy.upstreams import UpstreamConfig
from nexus_mcp.providers.upstream.items import (
    ItemView,
    UpstreamPrompt,
    UpstreamResource,
    UpstreamTemplate,
    scanned_prompt,
    scanned_resource,
    to_prompt_result,
    to_resource_result,
)
from nexus_mcp.providers.upstream.sessions import UpstreamFailure

if TYPE_CHECKING:
    from nexus_mcp.providers.upstream.sessions import UpstreamSession

log = get_logger(__name__)

MAX_ITEMS = 1000  # per kind and listing
MAX_PAGES = 100
MAX_BYTES = 8 * 1024 * 1024
MAX_CURSOR_CHARS = 4096

EVENT_ITEM_CHANGED = "upstream_item_changed"
EVENT_ITEM_UNPINNED = "upstream_item_unpinned"
EVENT_ITEM_INVALID = "upstream_item_invalid"
EVENT_ITEMS_UNLISTED = "upstream_items_unlisted"

# How each kind is listed: the client method, the result's attribute, the capability.
_LISTERS: Mapping[Kind, tuple[str, str, str]] = {
    Kind.PROMPT: ("list_prompts_mcp", "prompts", "prompts"),
    Kind.RESOURCE: ("list_resources_mcp", "resources", "resources"),
    Kind.RESOURCE_TEMPLATE: ("list_resource_templates_mcp", "resource_templates", "resources"),
}


class KindListing:
    """One kind's bounded listing: wire definitions, their canonical bytes, the cut."""

    def __init__(self) -> None:
        self.wire: list[dict[str, Any]] = []
        self.canonical: list[bytes] = []
        self.size = 0
        self.pages = 0
        self.cut: str | None = None


def announced(client: Any) -> set[str] | None:
    """The capabilities the upstream announced (None: not known, list every kind)."""
    result = getattr(client, "initialize_result", None)
    capabilities = getattr(result, "capabilities", None)
    if capabilities is None:
        return None
    return {name for name in ("prompts", "resources") if getattr(capabilities, name, None)}


async def fetch_items(client: Any, kind: Kind) -> KindListing:
    """Every page of one kind's listing until the upstream ends it or a cap is reached."""
    method, attribute, _capability = _LISTERS[kind]
    listing = KindListing()
    cursor: str | None = None
    cursors: set[str] = set()
    while True:
        if listing.pages >= MAX_PAGES:
            listing.cut = "pages"
            return listing
        page = await getattr(client, method)(cursor=cursor)
        listing.pages += 1
        if not await asyncio.to_thread(_take, listing, kind, getattr(page, attribute) or []):
            return listing
        cursor = page.next_cursor
        if cursor is None:
            return listing
        if len(cursor) > MAX_CURSOR_CHARS or cursor in cursors:
            listing.cut = "cursor"
            return listing
        cursors.add(cursor)


def _take(listing: KindListing, kind: Kind, items: list[Any]) -> bool:
    for item in items:
        if len(listing.wire) >= MAX_ITEMS:
            listing.cut = "items"
            return False
        wire = item.model_dump(mode="json", by_alias=True, exclude_none=False)
        canonical = canonical_item(kind, wire)
        if listing.size + len(canonical) > MAX_BYTES:
            listing.cut = "bytes"
            return False
        listing.size += len(canonical)
        listing.wire.append(wire)
        listing.canonical.append(canonical)
    return True


def screen_items(
    kind: Kind, listing: KindListing
) -> tuple[dict[str, tuple[dict[str, Any], str]], list[dict[str, Any]]]:
    """(Worker thread.) The valid items by key with their digests, and the skipped ones
    by position and digest."""
    key_field = KEY_FIELD[kind]
    counts: dict[Any, int] = {}
    for wire in listing.wire:
        key = wire.get(key_field)
        if isinstance(key, str):
            counts[key] = counts.get(key, 0) + 1
    valid: dict[str, tuple[dict[str, Any], str]] = {}
    invalid: list[dict[str, Any]] = []
    for position, (wire, body) in enumerate(zip(listing.wire, listing.canonical, strict=True)):
        digest = sha256_hex(body)
        reason = item_problem(kind, wire, counts, body)
        if reason is None:
            definition = {name: wire.get(name) for name in FIELDS[kind]}
            valid[wire[key_field]] = (definition, digest)
        else:
            invalid.append({"position": position, "sha256": digest, "reason": reason})
    return valid, invalid


class UpstreamCatalog:
    """The prompts, resources and resource templates of one ``UpstreamServer``."""

    def __init__(self, server: Any) -> None:
        # ``server``: its ``UpstreamServer`` (not imported: the server module imports
        # this one); its pins, sessions, evidence, audit and configuration.
        self.server = server
        self.server_id = server.server_id
        self.views: dict[Kind, dict[str, ItemView]] = {kind: {} for kind in Kind}
        self.prompts: dict[str, UpstreamPrompt] = {}
        self.resources: dict[str, UpstreamResource] = {}
        self.templates: dict[str, UpstreamTemplate] = {}
        self._local = MemorySeenDigests()
        # Proofs against item pins kept across restarts (embedded backend: the server's
        # ``persisted``, the same store as its tools' under ``<kind>:<key>`` names, which
        # no tool name can be): read once, at the first listing.
        self._kept: set[tuple[str, str, str]] | None = None
        self._reported: dict[tuple[Kind, str], str] = {}  # (kind, what) -> digest of it
        # The last authoritative listing's skipped items and cut, per kind (``check``).
        self.invalid: dict[Kind, list[dict[str, Any]]] = {kind: [] for kind in Kind}
        self.cut: dict[Kind, str | None] = {kind: None for kind in Kind}

    # -- listing and deciding -----------------------------------------------------------

    def evidence_name(self, kind: Kind, key: str) -> str:
        return f"{kind.value}:{key}"

    def pin_tag(self, kind: Kind, key: str) -> str | None:
        """The pin evidence is kept under: its digest and its stamp (a re-pin after review
        stamps anew, so the evidence against the old stamp no longer counts)."""
        pins = self.server.pins
        digest = pins.item_pin(kind, key)
        if digest is None:
            return None
        return f"{digest}.{sha256_hex((pins.item_stamp(kind, key) or '').encode())[:16]}"

    async def list_on(self, session: UpstreamSession, *, authoritative: bool) -> None:
        """List every announced kind on ``session`` and decide again (the caller holds the
        server's list gate)."""
        kinds = announced(session.client)
        for kind in Kind:
            if kinds is not None and _LISTERS[kind][2] not in kinds:
                if authoritative:
                    self._decide(kind, {})
                continue
            try:
                listing = await asyncio.wait_for(
                    fetch_items(session.client, kind),
                    self.server.config.timeouts.connect_seconds,
                )
            except Exception:  # noqa: BLE001 - an upstream's failure, never its text
                if authoritative:
                    self.invalid[kind], self.cut[kind] = [], "list_failed"
                    self._report(kind, EVENT_ITEMS_UNLISTED, "failed", reason="list_failed")
                    self._decide(kind, {})
                continue
            valid, invalid = await asyncio.to_thread(screen_items, kind, listing)
            if authoritative:
                self.invalid[kind], self.cut[kind] = invalid, listing.cut
                if listing.cut is not None:
                    self._report(
                        kind, EVENT_ITEMS_UNLISTED, listing.cut, reason=listing.cut, kept=len(valid)
                    )
                if invalid:
                    self._report(
                        kind,
                        EVENT_ITEM_INVALID,
                        str(invalid),
                        count=len(invalid),
                        items=invalid[:50],
                    )
            await self._observe(kind, valid)
            if authoritative:
                self._decide(kind, valid)
            else:
                known = {k: (v.definition, v.digest) for k, v in self.views[kind].items()}
                self._decide(kind, known)

    async def _observe(self, kind: Kind, valid: Mapping[str, tuple[dict[str, Any], str]]) -> None:
        """Add what this session showed to the evidence (local, kept across restarts on
        the embedded backend, and shared when the backend shares it)."""
        await self._load_kept()
        seen = {}
        for key, (_definition, digest) in valid.items():
            tag = self.pin_tag(kind, key)
            if tag is not None:
                seen[self.evidence_name(kind, key)] = (digest, tag)
        if not seen:
            return
        self._local.observe(self.server_id, seen)
        await self._keep(seen)
        if self.server.shares_evidence:
            with contextlib.suppress(Exception):  # a read of it at use decides, fail closed
                found = await asyncio.to_thread(self.server.evidence.observe, self.server_id, seen)
                for name, digests in found.items():
                    self._local.merge(self.server_id, name, digests, pinned=seen[name][1])

    async def _load_kept(self) -> None:
        if self._kept is not None:
            return
        self._kept = set()
        persisted = getattr(self.server, "persisted", None)
        if persisted is None:
            return
        try:
            proofs = await asyncio.to_thread(persisted.load, self.server_id)
        except Exception:  # noqa: BLE001 - the tools' own load said so; memory only
            return
        prefixes = tuple(f"{kind.value}:" for kind in Kind)
        for name, tag, digest in proofs:
            if name.startswith(prefixes):
                self._local.add(self.server_id, name, digest, pinned=tag)
                self._kept.add((name, tag, digest))

    async def _keep(self, seen: Mapping[str, tuple[str, str]]) -> None:
        """Persist what proves a change (a digest other than the pin's) and is not kept."""
        persisted = getattr(self.server, "persisted", None)
        if persisted is None or self._kept is None:
            return
        new = frozenset(
            (name, tag, digest)
            for name, (digest, tag) in seen.items()
            if digest != tag.split(".", 1)[0] and (name, tag, digest) not in self._kept
        )
        if not new:
            return
        try:
            await asyncio.to_thread(persisted.record, self.server_id, new)
        except Exception:  # noqa: BLE001 - kept in memory: quarantined here all the same
            log.warning("upstream_quarantine_unpersisted", server_id=self.server_id)
            return
        self._kept |= new

    def redecide(self) -> None:
        """The lock file changed: decide every kind again on what was last listed."""
        for kind in Kind:
            known = {k: (v.definition, v.digest) for k, v in self.views[kind].items()}
            self._decide(kind, known)

    def forget(self, before: Any) -> None:
        """Items re-pinned since ``before`` (a PinFile): their evidence is keyed by the new
        stamp already; nothing to clear but the reports."""
        for kind_value, key in renewed_items(before, self.server.pins):
            self._reported.pop((Kind(kind_value), key), None)

    def _decide(self, kind: Kind, valid: Mapping[str, tuple[Mapping[str, Any], str]]) -> None:
        views: dict[str, ItemView] = {}
        before = self.views[kind]
        for key, (definition, digest) in valid.items():
            view = self._view(kind, key, definition, digest)
            views[key] = view
            old = before.get(key)
            if view.status == "quarantined" and (
                old is None or old.digest != view.digest or old.status != "quarantined"
            ):
                event = (
                    EVENT_ITEM_CHANGED
                    if view.pin_state is PinState.CHANGED
                    else EVENT_ITEM_UNPINNED
                )
                log.warning(event, server_id=self.server_id, kind=kind.value)
                self.server._emit(
                    event,
                    kind=kind.value,
                    item_sha256=sha256_hex(key.encode("utf-8", "surrogatepass")),
                    pinned_sha256=self.server.pins.item_pin(kind, key),
                    seen_sha256=view.digest,
                )
        self.views[kind] = views
        self._publish(kind)

    def _view(self, kind: Kind, key: str, definition: Mapping[str, Any], digest: str) -> ItemView:
        pins = self.server.pins
        pin_state = pins.item_state(kind, key, digest)
        tag = self.pin_tag(kind, key)
        if tag is not None:
            seen = self._local.get(self.server_id, self.evidence_name(kind, key), pinned=tag)
            if any(d != pins.item_pin(kind, key) for d in seen):
                pin_state = PinState.CHANGED
        exposed = self._exposed(kind, key)

        def view(status: Any, reason: str | None = None) -> ItemView:
            return ItemView(kind, key, exposed, definition, digest, pin_state, status, reason)

        if not self.server.config.allows_item(kind.value, key):
            return view("not_allowed", "allowlist")
        if exposed is None:
            return view("bad_name", "name_rule")
        if pins.quarantines_item(kind, key):
            return view("quarantined", "pin_entry_invalid")
        if pin_state is PinState.CHANGED:
            return view("quarantined", EVENT_ITEM_CHANGED)
        if pin_state is PinState.UNPINNED and self.server.mode != DEV_MODE:
            return view("quarantined", EVENT_ITEM_UNPINNED)
        return view("exposed")

    def _exposed(self, kind: Kind, key: str) -> str | None:
        if kind is Kind.PROMPT:
            config: UpstreamConfig = self.server.config
            return config.exposed_name(key)
        return exposed_uri(self.server_id, key)

    def _publish(self, kind: Kind) -> None:
        exposed = [v for v in self.views[kind].values() if v.status == "exposed" and v.exposed]
        built: dict[str, Any] = {}
        for view in exposed:
            try:
                if kind is Kind.PROMPT:
                    built[view.exposed] = UpstreamPrompt.for_view(self, view)  # type: ignore[index]
                elif kind is Kind.RESOURCE:
                    built[view.exposed] = UpstreamResource.for_view(self, view)  # type: ignore[index]
                else:
                    built[view.exposed] = UpstreamTemplate.for_view(self, view)  # type: ignore[index]
            except Exception:  # noqa: BLE001 - one the library refuses is not exposed
                log.warning("upstream_item_unbuildable", server_id=self.server_id, kind=kind.value)
        if kind is Kind.PROMPT:
            self.prompts = built
        elif kind is Kind.RESOURCE:
            self.resources = built
        else:
            self.templates = built
        self.server.on_change(self.server)

    def _report(self, kind: Kind, event: str, what: str, **fields: Any) -> None:
        """Audit a cut, failed or screened listing once per change, never per listing."""
        digest = sha256_hex(what.encode())
        if self._reported.get((kind, event)) == digest:
            return
        self._reported[(kind, event)] = digest
        log.warning(event, server_id=self.server_id, kind=kind.value)
        self.server._emit(event, kind=kind.value, **fields)

    # -- what callers see ---------------------------------------------------------------

    def _down(self) -> bool:
        return bool(self.server.state == "degraded" and self.server.config.when_down == "hide")

    def visible_prompts(self) -> dict[str, UpstreamPrompt]:
        return {} if self._down() else self.prompts

    def visible_resources(self) -> dict[str, UpstreamResource]:
        return {} if self._down() else self.resources

    def template_may_read(self, backend: str, template: str) -> bool:
        """Whether a read through a template may reach ``backend`` (the upstream's URI):
        never a URI that names one of its resources which is not exposed (quarantined,
        unpinned, not allowed: the template must not be a way around its pin), and never
        a query or fragment the template does not declare (it would travel upstream
        unchecked)."""
        static = self.views[Kind.RESOURCE].get(backend)
        if static is not None and static.status != "exposed":
            return False
        if ("?" in backend or "#" in backend) and not any(
            marker in template for marker in ("{?", "{&", "{#")
        ):
            return False
        return len(backend) <= MAX_URI_CHARS

    def visible_templates(self) -> dict[str, UpstreamTemplate]:
        return {} if self._down() else self.templates

    def summary(self) -> dict[str, Any]:
        """For ``upstream list`` and /readyz: counts, and what is quarantined (prompt names;
        resources by the sha256 of their URI, never the upstream's text)."""
        out: dict[str, Any] = {}
        for kind in Kind:
            views = self.views[kind].values()
            quarantined = [
                {
                    "item": v.key if kind is Kind.PROMPT else sha256_hex(v.key.encode())[:16],
                    "reason": v.reason,
                }
                for v in sorted(views, key=lambda v: v.key)
                if v.status == "quarantined"
            ]
            out[kind.value] = {
                "exposed": sum(1 for v in views if v.status == "exposed"),
                "quarantined": quarantined,
            }
        return out

    # -- running them -------------------------------------------------------------------

    async def _still_exposed(self, view: ItemView) -> None:
        """Checked again at use: a new lock file, and on the shared backend the evidence
        every replica adds to (one round trip; an unreachable store refuses)."""
        await self.server.refresh_pins()
        current = self.views[view.kind].get(view.key)
        if current is None or current.status != "exposed" or current.digest != view.digest:
            raise UpstreamFailure("unavailable", "item_quarantined").to_error()
        tag = self.pin_tag(view.kind, view.key)
        if tag is None or not self.server.shares_evidence:
            return
        name = self.evidence_name(view.kind, view.key)
        try:
            seen = await asyncio.to_thread(
                self.server.evidence.get, self.server_id, name, pinned=tag
            )
        except Exception as exc:  # noqa: BLE001 - a store's own failure: fail closed
            raise UnavailableError(
                store=STORE_UPSTREAM_QUARANTINE, error=type(exc).__name__
            ) from None
        pinned = self.server.pins.item_pin(view.kind, view.key)
        if any(d != pinned for d in seen):
            self._local.merge(self.server_id, name, seen, pinned=tag)
            self.redecide()
            raise UpstreamFailure("unavailable", "item_quarantined").to_error()

    async def _forward(self, call: Any) -> Any:
        """``call(client, meta)`` on the caller's own session, as a tools/call goes
        (``forwarding.py``), its failure as the error envelope."""
        server = self.server
        principal = current_principal()
        try:
            if principal is None:
                raise UpstreamFailure("unavailable", "no_principal")
            server.refuse_while_down()
            key = server.session_key(principal)
            meta = server.identity_meta(principal)
            # The caller's own credential where the upstream takes one (never the
            # caller's token itself: ``credentials.py``), and the session it fits.
            credential = await server.caller_credential(key, principal)
            return await server.on_session(key, credential, lambda client: call(client, meta))
        except UpstreamFailure as failure:
            raise failure.to_error() from None

    async def read_resource(self, view: ItemView, backend: str) -> ResourceResult:
        await self._still_exposed(view)
        if view.kind is Kind.RESOURCE_TEMPLATE and not self.template_may_read(backend, view.key):
            raise UpstreamFailure("unavailable", "item_quarantined").to_error()
        raw = await self._forward(lambda client, meta: client.read_resource_mcp(backend, meta=meta))
        result = to_resource_result(raw, self.server.max_result_bytes)
        self._still_current(view)  # quarantined while the read was in flight: refused
        return scanned_resource(result, self._scan(view))

    def _still_current(self, view: ItemView) -> None:
        current = self.views[view.kind].get(view.key)
        if current is None or current.status != "exposed" or current.digest != view.digest:
            raise UpstreamFailure("unavailable", "item_quarantined").to_error()

    async def render_prompt(self, view: ItemView, arguments: dict[str, Any]) -> PromptResult:
        await self._still_exposed(view)
        declared_args = [a for a in view.definition.get("arguments") or [] if isinstance(a, dict)]
        declared = {a.get("name") for a in declared_args}
        for argument in declared_args:
            # A required argument the caller left out is the caller's mistake, told before
            # anything goes upstream (named only as the pinned definition declares it).
            name = argument.get("name")
            required = argument.get("required") is True and isinstance(name, str)
            if required and name not in arguments:
                raise InvalidInputError(field=name, problem=PROBLEM_MISSING)
        # Only the arguments the pinned definition declares travel upstream, as strings.
        sent = {k: str(v) for k, v in arguments.items() if k in declared}
        raw = await self._forward(
            lambda client, meta: client.get_prompt_mcp(view.key, sent, meta=meta)
        )
        result = to_prompt_result(raw, self.server.max_result_bytes)
        self._still_current(view)
        return scanned_prompt(result, self._scan(view))

    def _scan(self, view: ItemView) -> Callable[[list[str]], list[str]]:
        """Output scanning of this item's texts, by its server and the name callers see."""
        connector = self.server.connector
        scanner = connector.scanner if connector is not None else None
        name = view.exposed or view.key
        if scanner is None:
            return lambda texts: texts
        return lambda texts: scanner.texts(self.server_id, name, texts)


__all__ = ["UpstreamCatalog", "announced", "fetch_items", "screen_items"]
