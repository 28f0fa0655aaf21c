"""Target identities: a stable name for what a write acts on (a workspace, a vault).

An idempotency record replays a recorded result instead of running the tool again. That
is only right against the very target the first run changed: serve workspace A, write
with key ``k``, restart on workspace B with the same data directory, and a replay of ``k``
would claim a write B never received. So every idempotency scope names its target, and
each toolset says what its target is (``ToolTargets``, built by the composition root; the
gateway and repo toolsets add their own, an upstream server or a repository).

A local folder (the workspace, or a local vault) is named by the sha256 of its resolved
real path together with the device and inode numbers of that folder:

- stable across restarts: nothing is random, nothing is stored;
- two folders that exist side by side never share a name, and neither do two folders
  that held one path at different times unless the second got the first one's inode;
- a symlinked alias of the folder resolves to the same real path and inode, so it is
  the same target;
- nothing is written into the user's folder (no marker file to copy, leak or delete).

Edge cases, each failing towards running a retry again rather than replaying a write that
did not happen: a folder that is moved or renamed, restored from a backup, copied to
another machine, or reached through a bind mount is a new target; a file system whose
device numbers change between mounts (some network, overlay and btrfs-subvolume setups)
makes every folder on it a new target after a remount. The one opposite case: a folder
deleted and re-created at the same path often gets the freed inode back (ext4 hands it
straight out again), and is then the same target, so its records replay until they
expire. Treat a re-created workspace as the old one, or use new idempotency keys.

A hosted canister vault is named by the canister URL and the vault id; a principal with
no vault uses the workspace, so its notes target is the workspace's.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nexus_mcp.errors import NotFoundError, WritePolicyDeniedError
from nexus_mcp.principal import Principal

KIND_FOLDER = "folder"
KIND_CANISTER = "canister"
KIND_MISSING_VAULT = "missing-vault"
KIND_UPSTREAM = "upstream"
RULE_UNKNOWN_TARGET = "unknown_target"
REASON_TARGET_UNAVAILABLE = "target_unavailable"

# What a toolset acts on, for a caller and the call's arguments (a repository is named by
# its ``repo`` argument; a workspace or vault by the caller alone).
TargetOf = Callable[[Principal, Mapping[str, Any]], str]


def to_target_id(kind: str, *parts: str | int) -> str:
    """The sha256 of the parts as a JSON list: field boundaries cannot be shifted.

    ASCII-escaped JSON, so a path holding bytes that are not UTF-8 (surrogate-escaped by
    Python) still has a digest, distinct from every other path.
    """
    encoded = json.dumps([kind, *parts], separators=(",", ":"))
    return hashlib.sha256(encoded.encode("ascii")).hexdigest()


def identify_folder(folder: Path) -> str:
    """The identity of a local folder: its real path, device and inode (module docstring).

    A folder that no longer exists (or cannot be looked at) is ``NOT_FOUND``: no write can
    run against it, and no record can be matched to it.
    """
    try:
        real = folder.resolve(strict=True)
        status = os.stat(real)
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop on older Pythons
        raise NotFoundError(reason=REASON_TARGET_UNAVAILABLE) from None
    return to_target_id(KIND_FOLDER, str(real), status.st_dev, status.st_ino)


def identify_canister_vault(base_url: str, vault_id: str | None) -> str:
    """The identity of one vault on a hosted canister."""
    return to_target_id(KIND_CANISTER, base_url.rstrip("/"), vault_id or "")


def identify_upstream(server_id: str, endpoint: tuple[str, ...]) -> str:
    """An upstream MCP server: its id and what it is (URL, or command, args and folder)."""
    return to_target_id(KIND_UPSTREAM, server_id, *endpoint)


def identify_missing_vault(vault_id: str) -> str:
    """A vault that does not exist yet: named apart from every folder, so nothing matches."""
    return to_target_id(KIND_MISSING_VAULT, vault_id)


class ToolTargets:
    """Which target each tool acts on: its toolset's ``TargetOf``, asked per call.

    A tool whose toolset names no target (a mounted tool, a test toolset) cannot be made
    idempotent safely, so a write to it is refused (``WRITE_POLICY_DENIED``, rule
    ``unknown_target``) before any record is claimed.
    """

    def __init__(self, by_toolset: Mapping[str, TargetOf], toolset_of: Mapping[str, str]) -> None:
        """``toolset_of``: each tool's toolset, read per call (the tool book's live view,
        ``book.py``, so a tool that joins after start-up has its toolset's target)."""
        self._by_toolset = dict(by_toolset)
        self._toolset_of = toolset_of

    def add_toolset(self, toolset: str, target_of: TargetOf) -> None:
        """A toolset that joined after start-up (an upstream server's)."""
        self._by_toolset[toolset] = target_of

    def has_target(self, tool_name: str) -> bool:
        return self._toolset_of.get(tool_name) in self._by_toolset

    def target_of(self, tool_name: str, principal: Principal, arguments: Mapping[str, Any]) -> str:
        toolset = self._toolset_of.get(tool_name)
        target_of = self._by_toolset.get(toolset) if toolset is not None else None
        if target_of is None:
            raise WritePolicyDeniedError(rule=RULE_UNKNOWN_TARGET)
        return target_of(principal, arguments)


__all__ = [
    "RULE_UNKNOWN_TARGET",
    "TargetOf",
    "ToolTargets",
    "identify_canister_vault",
    "identify_folder",
    "identify_missing_vault",
    "identify_upstream",
    "to_target_id",
]
