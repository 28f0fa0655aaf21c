"""An upstream's quarantine evidence (``policy/quarantine.py``), kept and shared.

Every digest any session showed for a tool under its pin: ``_local`` is this process's
own copy (what it saw, and what it read from the shared store); ``evidence`` the store
every replica shares (``seen``), or the local copy itself on the embedded backend;
``persisted`` the copy kept across restarts (embedded backend). What the shared store
could not take yet waits in ``_unsent``. ``UpstreamServer`` is built on this layer
(``pinning.py`` decides on the evidence, ``server.py`` connects).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.pins import PinFile
from nexus_mcp.policy.quarantine import (
    MemorySeenDigests,
    Observation,
    PersistedEvidence,
    Proof,
    SeenDigests,
    proofs_in,
)
from nexus_mcp.providers.upstream.listing import MAX_TOOLS_PER_UPSTREAM

log = get_logger(__name__)

# Observations kept to send once the shared evidence store answers again.
MAX_UNSENT_OBSERVATIONS = 16 * MAX_TOOLS_PER_UPSTREAM

Unsent = tuple[str, str, str | None]  # (tool, digest, pin) the shared store has not got yet


class QuarantineEvidence:
    """The evidence layer of an ``UpstreamServer`` (its constructor sets these)."""

    server_id: str
    pins: PinFile
    _local: MemorySeenDigests
    evidence: SeenDigests
    _unsent: set[Unsent]
    persisted: PersistedEvidence | None
    _kept: set[Proof]

    @property
    def shares_evidence(self) -> bool:
        """The evidence is another store than this process's own copy (shared backend)."""
        return self.evidence is not self._local

    def seen_digests(self, name: str) -> frozenset[str]:
        """Every digest this process knows a session showed for ``name`` under its pin now
        in force (its own, and what it read from the shared or persisted store)."""
        return self._local.get(self.server_id, name, pinned=self.pins.digests.get(name))

    async def _offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A network store is asked from a worker thread (a slow store never stalls the
        event loop); process memory is answered inline."""
        if isinstance(self.evidence, MemorySeenDigests):
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    def _send(
        self, seen: Mapping[str, Observation], unsent: frozenset[Unsent]
    ) -> tuple[dict[str, frozenset[str]] | None, frozenset[Unsent]]:
        """(Worker thread on the shared backend.) Add what could not be sent before
        (``unsent``) and ``seen`` to the shared evidence, read it back. None: the store
        did not answer."""
        if not self.shares_evidence:
            return None, frozenset()
        try:
            self._flush(unsent)
            return self.evidence.observe(self.server_id, seen), unsent
        except Exception:  # noqa: BLE001 - UnavailableError, or a store's own failure
            return None, frozenset()

    def _flush(self, unsent: frozenset[Unsent]) -> None:
        """Send observations in rounds of one per tool (one round trip each)."""
        rounds: list[dict[str, Observation]] = []
        for name, digest, pinned in sorted(unsent, key=lambda o: (o[0], o[1], o[2] or "")):
            free = next((r for r in rounds if name not in r), None)
            if free is None:
                free = {}
                rounds.append(free)
            free[name] = (digest, pinned)
        for batch in rounds:
            self.evidence.observe(self.server_id, batch)

    def _gather(
        self,
        seen: Mapping[str, Observation],
        sent: tuple[dict[str, frozenset[str]] | None, frozenset[Unsent]],
    ) -> dict[str, frozenset[str]]:
        """The evidence for each listed tool: this process's own, and the replicas'. When
        the shared store did not answer, this process's own (the observations are sent
        later; meanwhile every call of the server's tools reads the store, and fails
        closed while it cannot)."""
        shared, flushed = sent
        local = self._local.observe(self.server_id, seen)
        if not self.shares_evidence:
            return local
        self._unsent -= flushed
        if shared is None:
            log.warning("upstream_quarantine_unavailable", server_id=self.server_id)
            for name, (digest, pinned) in seen.items():
                if len(self._unsent) < MAX_UNSENT_OBSERVATIONS:
                    self._unsent.add((name, digest, pinned))
            return local
        gathered: dict[str, frozenset[str]] = {}
        for name, (_digest, pinned) in seen.items():
            theirs = shared.get(name, frozenset())
            self._local.merge(self.server_id, name, theirs, pinned=pinned)
            gathered[name] = local[name] | theirs
        return gathered

    def _read(self, name: str, pinned: str, unsent: frozenset[Unsent]) -> frozenset[str]:
        """(Worker thread.) Send what could not be sent before; read one tool's evidence.

        An exposed tool's own digest is its pin, and it was sent when listed: a set
        without it means the store lost its data (a Redis restart without persistence).
        This process then sends back what it knows against the pins now in force, so the
        other replicas learn it again (once: the set holds the pin afterwards)."""
        self._flush(unsent)
        seen = self.evidence.get(self.server_id, name, pinned=pinned)
        if pinned in seen:
            return seen
        self._flush(self._reseed(name, pinned))
        return self.evidence.get(self.server_id, name, pinned=pinned)

    def _reseed(self, name: str, pinned: str) -> frozenset[Unsent]:
        pins = self.pins.digests
        known = {(name, pinned, pinned)}
        for tool, pin, digests in self._local.entries(self.server_id):
            if pin is not None and pins.get(tool) == pin and any(d != pin for d in digests):
                known.update((tool, digest, pin) for digest in digests)
        return frozenset(known)

    def _forget(self, tools: frozenset[str]) -> None:
        """Tools an operator re-pinned: this process forgets their evidence (the command
        cleared the persisted and shared copies first), then reads back what the persisted
        store still holds against them (nothing, unless it was not cleared)."""
        if not tools:
            return
        for tool in tools:
            self._local.forget(self.server_id, tool)
        self._unsent = {u for u in self._unsent if u[0] not in tools}
        self._kept = {k for k in self._kept if k[0] not in tools}
        if self.persisted is None:
            return
        try:
            proofs = [p for p in self.persisted.load(self.server_id) if p[0] in tools]
        except Exception:  # noqa: BLE001 - unreadable: the evidence in memory is gone
            log.warning("upstream_quarantine_unreadable", server_id=self.server_id)
            return
        self._remember(proofs)

    def use_persisted(self, persisted: PersistedEvidence) -> None:
        """Keep evidence against pins in ``persisted`` (embedded backend) and read back
        what it holds from before a restart; before start."""
        self.persisted = persisted
        self._remember(persisted.load(self.server_id))

    def _remember(self, proofs: list[Proof]) -> None:
        for tool, pinned, digest in proofs:
            self._local.add(self.server_id, tool, digest, pinned=pinned)
            self._kept.add((tool, pinned, digest))

    def _persist(self, seen: Mapping[str, Observation]) -> frozenset[Proof]:
        """(Worker thread.) Keep what this listing proved that is not kept yet; the proofs
        kept (none when the store failed: tried again at the next listing)."""
        persisted = self.persisted
        if persisted is None:
            return frozenset()
        new = proofs_in(seen) - self._kept
        if not new:
            return frozenset()
        try:
            persisted.record(self.server_id, new)
        except Exception:  # noqa: BLE001 - kept in memory: quarantined here all the same
            log.warning("upstream_quarantine_unpersisted", server_id=self.server_id)
            return frozenset()
        return new


__all__ = ["MAX_UNSENT_OBSERVATIONS", "QuarantineEvidence", "Unsent"]
