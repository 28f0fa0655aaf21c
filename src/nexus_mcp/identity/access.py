"""Which tools a principal may see: profiles and ReBAC grants behind the namespace layer.

The tuple store is the enforcement point (seed 004: config is policy, ReBAC enforces):

- every profile's tools are tuples ``(profile:<name>, viewer, /tools/<tool>)``, granted
  eagerly when the server starts (and re-synced only when the profile file changed);
- a subject's own tuples count only as *direct* grants (``direct_viewer``).

A principal sees the tools of the one profile selected for it (its ``profile`` claim,
else the stored assignment, else its role's default) plus its direct grants. Because the
profile is selected per principal and not written onto the subject, a token limited to
``minimal`` never sees what another token of the same subject was given, and a claim
keeps precedence over an assignment made meanwhile. A principal naming an unknown profile
sees nothing. Read-only callers never see write-class tools, and a tool whose contract
requires scopes is visible only to principals holding all of them.

Resource sources and prompts are granted by the same profile (its ``resources`` and
``prompts``) and by direct grants, and looked up through caches of their own, so the
tools' lookup (every call asks it) is unchanged. Both are reads: a read-only principal
keeps them.
"""

from __future__ import annotations

import fnmatch
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from cachetools import TTLCache

from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.grants import (
    DIRECT_RELATION,
    PROFILE_RELATION,
    ensure_principal_grants,
    to_tool_name,
)
from nexus_mcp.policy.profiles import ToolProfileConfig, select_profile
from nexus_mcp.policy.tuples import PROMPTS_PREFIX, RESOURCES_PREFIX, TOOLS_PREFIX, TupleStore
from nexus_mcp.policy.upstreams import name_key
from nexus_mcp.policy.visibility import VisibleToolsCache
from nexus_mcp.principal import Principal

log = get_logger(__name__)

DEFAULT_ZONE = "default"
PROFILE_SUBJECT_PREFIX = "profile:"
# How long a principal's profile selection is reused before the stored assignment is read
# again: an operator's `profiles assign` reaches live callers within this time.
SELECTION_TTL_SECONDS = 2.0
# How long one principal's visible set is reused without asking the cache again, and for
# how many principals at most.
RECENT_ANSWER_SECONDS = 0.1
RECENT_ANSWERS_KEPT = 10_000
_UNSELECTED = object()
MAX_SCOPE_ANSWERS = 100_000


def profile_subject(name: str) -> str:
    return PROFILE_SUBJECT_PREFIX + name


def lookup_tools(store: TupleStore, subject: str, zone: str) -> frozenset[str]:
    """A profile's tools, or a subject's direct grants (never its profile-written tuples)."""
    relation = PROFILE_RELATION if subject.startswith(PROFILE_SUBJECT_PREFIX) else DIRECT_RELATION
    return frozenset(
        to_tool_name(o) for o in store.list_objects(subject, relation, zone, TOOLS_PREFIX)
    )


def lookup_resource_sources(store: TupleStore, subject: str, zone: str) -> frozenset[str]:
    """``lookup_tools`` for resource sources."""
    return _lookup(store, subject, zone, RESOURCES_PREFIX)


def lookup_prompts(store: TupleStore, subject: str, zone: str) -> frozenset[str]:
    """``lookup_tools`` for prompt names."""
    return _lookup(store, subject, zone, PROMPTS_PREFIX)


def _lookup(store: TupleStore, subject: str, zone: str, prefix: str) -> frozenset[str]:
    relation = PROFILE_RELATION if subject.startswith(PROFILE_SUBJECT_PREFIX) else DIRECT_RELATION
    return frozenset(
        o.removeprefix(prefix) for o in store.list_objects(subject, relation, zone, prefix)
    )


def upstream_collisions(upstream: Sequence[str], native: Collection[str]) -> frozenset[str]:
    """The upstream names no grant may reach: a native tool's name, or one more than one
    upstream tool is exposed under, compared by ``name_key``."""
    if not upstream:
        return frozenset()
    native_keys = {name_key(name) for name in native}
    counts = Counter(name_key(name) for name in upstream)
    return frozenset(
        name for name in upstream if name_key(name) in native_keys or counts[name_key(name)] > 1
    )


class GrantedTools:
    """The ``Namespace`` of the namespace middleware, backed by profiles and grants."""

    def __init__(
        self,
        store: TupleStore,
        profiles: ToolProfileConfig,
        *,
        write_tools: Iterable[str],
        required_scopes: Mapping[str, frozenset[str]] | None = None,
        tool_scopes: Mapping[str, Iterable[str]] | None = None,
        zone: str = DEFAULT_ZONE,
        cache_ttl_seconds: float = 300.0,
    ) -> None:
        self.store = store
        self.cache = VisibleToolsCache(store, ttl_seconds=cache_ttl_seconds, lookup=lookup_tools)
        # Resource sources and prompts: caches of their own, the tools' one untouched.
        self.resource_cache = VisibleToolsCache(
            store, ttl_seconds=cache_ttl_seconds, lookup=lookup_resource_sources
        )
        self.prompt_cache = VisibleToolsCache(
            store, ttl_seconds=cache_ttl_seconds, lookup=lookup_prompts
        )
        self.profiles = profiles
        self.write_tools = frozenset(write_tools)
        # Tools whose contract requires scopes (seed 002): hidden from callers without them.
        self.required_scopes = {k: v for k, v in (required_scopes or {}).items() if v}
        # ``auth.tool_scopes``: a name or fnmatch pattern, for native and upstream tools.
        self.scope_rules = tuple(
            (pattern, frozenset(scopes)) for pattern, scopes in (tool_scopes or {}).items()
        )
        self._scopes_of: dict[str, frozenset[str]] = {}
        self.zone = zone
        self._selections: TTLCache[tuple[str, str | None, str], str | None] = TTLCache(
            maxsize=10_000, ttl=min(SELECTION_TTL_SECONDS, cache_ttl_seconds)
        )
        self._recent: dict[tuple[Any, ...], tuple[float, int, frozenset[str]]] = {}
        self._lock = threading.Lock()
        self._errors = 0
        # The tools that exist now (native ones and the upstream tools exposed at this
        # moment); None: every granted name. A grant never makes a tool exist.
        self._available: frozenset[str] | None = None

    def set_tools(
        self,
        available: frozenset[str],
        write_tools: frozenset[str],
        *,
        upstream: Sequence[str] = (),
        native: Collection[str] = (),
    ) -> None:
        """The tools that exist and which of them write, after an upstream's list changed.

        ``upstream``: the names upstream tools are exposed under (one per tool, so a name
        two upstreams share appears twice); ``native``: every native tool name, mounted or
        not. A grant names a tool by its exposed name, so an upstream name that is a native
        tool's, or another upstream tool's, under ``name_key`` (case, Unicode forms) is not
        a tool any grant reaches: it is left out of what exists (start-up refuses the
        configurations that make one; this holds whatever made it).
        """
        available = available - upstream_collisions(upstream, native)
        if available == self._available and write_tools == self.write_tools:
            return
        self._available = available
        self.write_tools = write_tools
        self.cache.new_generation()  # no recent visible set is reused

    def grant_profiles(self) -> None:
        """Write every profile's tool tuples (only where they differ): eager, at start-up."""
        for name in sorted(self.profiles.profiles):
            ensure_principal_grants(
                self.store, self.profiles, profile_subject(name), name, self.zone
            )
        self._invalidate_all()

    def select(self, principal: Principal) -> str | None:
        """The profile this principal gets (None: no tools at all)."""
        if principal.subject.startswith(PROFILE_SUBJECT_PREFIX):
            return None  # a subject may never pose as a profile's own grant holder
        key = (principal.subject, principal.profile, principal.effective_role)
        with self._lock:
            cached = self._selections.get(key, _UNSELECTED)
        if cached is not _UNSELECTED:
            return cached  # type: ignore[return-value]
        selection = select_profile(
            self.profiles,
            principal_profile=principal.profile,
            stored_assignment=self.store.get_assignment(principal.subject, self.zone),
            role=principal.effective_role,
        )
        name = None if selection.is_denied else selection.name
        if name is None:
            log.warning(
                "profile_denied", subject=principal.log_subject, source=str(selection.source)
            )
        with self._lock:
            self._selections[key] = name
        return name

    def visible_tools(self, principal: Principal) -> frozenset[str]:
        """The tools this principal may see and call.

        Every call asks this. The answer is reused for ``RECENT_ANSWER_SECONDS`` unless the
        cache was invalidated in between (a grant change through this server), so a change made
        elsewhere reaches live callers at most that much later than the cache alone would
        let it (``SELECTION_TTL_SECONDS``, the cache's revision refresh).
        """
        key = (
            principal.subject,
            principal.profile,
            principal.effective_role,
            principal.read_only,
            principal.scopes,
        )
        now = time.monotonic()
        recent = self._recent.get(key)
        generation = self.cache.generation
        if recent is not None and recent[0] > now and recent[1] == generation:
            self.cache.record_hit()
            return recent[2]
        visible = self._visible_tools(principal)
        if len(self._recent) >= RECENT_ANSWERS_KEPT:
            self._recent.clear()
        self._recent[key] = (now + RECENT_ANSWER_SECONDS, generation, visible)
        return visible

    def visible_resource_sources(self, principal: Principal) -> frozenset[str]:
        """The resource sources (``notes``, upstream server ids) this principal may list
        and read: its profile's and its direct grants; read-only principals keep them."""
        return self._granted_in(principal, self.resource_cache)

    def visible_prompts(self, principal: Principal) -> frozenset[str]:
        """The exposed prompt names this principal may list and get (read-only keeps them)."""
        return self._granted_in(principal, self.prompt_cache)

    def _granted_in(self, principal: Principal, cache: VisibleToolsCache) -> frozenset[str]:
        """The profile's and the direct grants in ``cache`` (tools, resource sources or
        prompts), before any other rule."""
        try:
            name = self.select(principal)
        except Exception:
            # Reading the assignment failed: count it (the cache counts its own failures).
            with self._lock:
                self._errors += 1
            raise
        if name is None:
            return frozenset()
        return cache.get(profile_subject(name), self.zone) | cache.get(principal.subject, self.zone)

    def _visible_tools(self, principal: Principal) -> frozenset[str]:
        return self._with_scopes(self._granted(principal), principal.scopes)

    def _granted(self, principal: Principal) -> frozenset[str]:
        """What the profile, grants and read-only flag give, before any scope is asked."""
        granted = self._granted_in(principal, self.cache)
        if not granted:
            return granted
        if self._available is not None:
            granted &= self._available
        return granted - self.write_tools if principal.read_only else granted

    def _with_scopes(self, visible: frozenset[str], held: frozenset[str]) -> frozenset[str]:
        if self.scope_rules:
            return frozenset(t for t in visible if self.scopes_for(t) <= held)
        missing = [t for t, s in self.required_scopes.items() if not s <= held]
        return visible.difference(missing) if missing else visible

    def scopes_for(self, tool: str) -> frozenset[str]:
        """The scopes a call of ``tool`` needs: its contract's and every matching rule's."""
        known = self._scopes_of.get(tool)
        if known is not None:
            return known
        needed = self.required_scopes.get(tool, frozenset())
        for pattern, scopes in self.scope_rules:
            if pattern == tool or fnmatch.fnmatchcase(tool, pattern):
                needed = needed | scopes
        if len(self._scopes_of) < MAX_SCOPE_ANSWERS:
            self._scopes_of[tool] = needed
        return needed

    def missing_scopes(self, principal: Principal, tool: str) -> frozenset[str]:
        """The scopes ``tool`` needs that ``principal`` lacks, when its profile grants the tool.

        Empty when the tool is not granted at all: the namespace hides it, and a scope
        challenge would tell a caller that a tool it may never see exists.
        """
        needed = self.scopes_for(tool)
        if not needed or needed <= principal.scopes or tool not in self._granted(principal):
            return frozenset()
        return needed - principal.scopes

    def forget(self, subject: str | None = None) -> None:
        """After a grant change through this server: the next request sees it."""
        with self._lock:
            if subject is None:
                self._selections.clear()
            else:
                for key in [k for k in self._selections if k[0] == subject]:
                    del self._selections[key]
        self._invalidate_all(subject)

    def _invalidate_all(self, subject: str | None = None) -> None:
        for cache in (self.cache, self.resource_cache, self.prompt_cache):
            cache.invalidate(subject)

    def metrics(self) -> dict[str, int]:
        counters = self.cache.metrics()
        with self._lock:
            counters["errors"] = counters.get("errors", 0) + self._errors
        return counters

    def record_filtered(self, count: int) -> None:
        self.cache.record_filtered(count)

    def record_rejected(self) -> None:
        self.cache.record_rejected()

    def record_error(self) -> None:
        return None  # counted where the failure happened (visible_tools or the cache)


__all__ = [
    "DEFAULT_ZONE",
    "PROFILE_SUBJECT_PREFIX",
    "GrantedTools",
    "lookup_prompts",
    "lookup_resource_sources",
    "lookup_tools",
    "profile_subject",
    "upstream_collisions",
]
