"""Which notes backend serves a principal: its local vault folder or the hosted canister.

Local (the embedded default): the principal's ``vault_id`` selects a folder from the
configured map, else ``<data_dir>/vaults/<vault_id>``; a principal without a vault uses the
served workspace itself. An unknown vault reads as a missing note (``Upstream 404``), so
nothing reveals which vaults exist. Hosted: one shared ``CanisterBackend`` (one reused
HTTP client); the canister itself scopes reads by the ``X-Vault-Id`` header.

``target_for`` names the vault a principal's notes calls act on (``policy/targets.py``), so a
write-class notes tool can never replay an idempotency record against another vault.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from nexus_mcp.errors import ConfigError, UpstreamError
from nexus_mcp.notes import LocalVaultBackend, NoteBackend
from nexus_mcp.policy.targets import (
    identify_canister_vault,
    identify_folder,
    identify_missing_vault,
)
from nexus_mcp.principal import Principal
from nexus_mcp.settings import Settings
from nexus_mcp.stores.locations import server_state_paths

if TYPE_CHECKING:
    from nexus_mcp.notes.canister import CanisterBackend

_VAULT_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
# The tool timeout starts before the canister request does (chain checks, token, connect
# pool), so a deadline only just under it could still lose the race to TOOL_TIMEOUT.
CANISTER_DEADLINE_MARGIN_SECONDS = 1.0
TOTAL_TIMEOUT_SETTING = "notes.total_timeout_seconds"
TOTAL_TIMEOUT_ENV = "NEXUS_MCP_NOTES__TOTAL_TIMEOUT_SECONDS"


def check_canister_deadline(settings: Settings, notes_tools: Iterable[str]) -> None:
    """Refuse a canister deadline that does not end before every notes tool's timeout.

    A reply drip-fed under the read timeout is ended by the total deadline as the spec's
    ``Runtime failure``; if the tool timeout came first, the caller would see
    ``TOOL_TIMEOUT`` instead. The notes tools' timeout is their ``budgets.tool_timeouts``
    override when there is one, else ``budgets.tool_timeout_seconds``. The local backend
    has no such deadline, so nothing is checked for it.
    """
    if settings.notes.backend != "canister":
        return
    budgets = settings.budgets
    timeouts = {
        tool: budgets.tool_timeouts.get(tool, budgets.tool_timeout_seconds) for tool in notes_tools
    }
    if not timeouts:
        return
    tool, shortest = min(timeouts.items(), key=lambda item: (item[1], item[0]))
    total = settings.notes.total_timeout_seconds
    if total + CANISTER_DEADLINE_MARGIN_SECONDS > shortest:
        source = (
            f"budgets.tool_timeouts.{tool}"
            if tool in budgets.tool_timeouts
            else "budgets.tool_timeout_seconds"
        )
        raise ConfigError(
            f"invalid setting '{TOTAL_TIMEOUT_SETTING}' ({TOTAL_TIMEOUT_ENV}): must be at "
            f"least {CANISTER_DEADLINE_MARGIN_SECONDS:g} s below the timeout of every notes "
            f"tool; {source} gives {tool} {shortest:g} s"
        )


class _MissingVault:
    async def read_note(self, path: str, caller: Principal) -> object:
        raise UpstreamError.status(404)

    async def read_note_bytes(self, path: str, caller: Principal, *, max_bytes: int) -> bytes:
        raise UpstreamError.status(404)


class VaultRouter:
    """Maps a principal to its notes backend; backends are built once and reused."""

    def __init__(self, settings: Settings) -> None:
        notes = settings.notes
        self.settings = settings
        self._canister: CanisterBackend | None = None
        if notes.backend == "canister":
            from nexus_mcp.notes.canister import CanisterBackend  # hosted vaults only

            assert notes.canister_url is not None  # settings validation guarantees it
            self._canister = CanisterBackend(
                notes.canister_url,
                token=notes.canister_token.get_secret_value() if notes.canister_token else "",
                gateway_secret=notes.gateway_secret.get_secret_value()
                if notes.gateway_secret
                else None,
                connect_timeout=notes.connect_timeout_seconds,
                read_timeout=notes.read_timeout_seconds,
                total_timeout=notes.total_timeout_seconds,
                max_response_bytes=notes.max_response_bytes,
            )
        self._local: dict[Path, LocalVaultBackend] = {}

    def backend_for(self, principal: Principal) -> NoteBackend:
        if self._canister is not None:
            return self._canister
        folder = self._folder_for(principal.vault_id)
        if folder is None or not folder.is_dir():
            return _MissingVault()  # type: ignore[return-value]
        backend = self._local.get(folder)
        if backend is None:
            hidden = server_state_paths(self.settings, folder)
            backend = self._local[folder] = LocalVaultBackend(folder, hidden=hidden)
        return backend

    def target_for(self, principal: Principal) -> str:
        """The identity of the vault ``backend_for`` serves this principal from."""
        notes = self.settings.notes
        if self._canister is not None:
            assert notes.canister_url is not None  # a canister backend was built from it
            return identify_canister_vault(notes.canister_url, principal.vault_id)
        folder = self._folder_for(principal.vault_id)
        if folder is None or not folder.is_dir():
            return identify_missing_vault(principal.vault_id or "")
        return identify_folder(folder)

    def _folder_for(self, vault_id: str | None) -> Path | None:
        notes = self.settings.notes
        if vault_id is None:
            return self.settings.workspace
        if not _VAULT_ID_RE.fullmatch(vault_id) or vault_id in (".", ".."):
            return None
        mapped = notes.vaults.get(vault_id)
        if mapped is not None:
            return mapped
        return self.settings.data_dir / "vaults" / vault_id

    async def aclose(self) -> None:
        if self._canister is not None:
            await self._canister.aclose()


__all__ = ["CANISTER_DEADLINE_MARGIN_SECONDS", "VaultRouter", "check_canister_deadline"]
