"""Where the server keeps its own state, and which of it must stay out of callers' reach."""

from __future__ import annotations

from pathlib import Path

from nexus_mcp.settings import Settings
from nexus_mcp.workspace import is_within

IDEMPOTENCY_DB = "idempotency.sqlite3"
NONCES_DB = "nonces.sqlite3"
GRANTS_DB = "grants.sqlite3"
VAULTS_DIR = "vaults"
SQLITE_SIDECARS = ("", "-wal", "-shm", "-journal")


def idempotency_path(settings: Settings) -> Path:
    return settings.data_dir / IDEMPOTENCY_DB


def nonces_path(settings: Settings) -> Path:
    return settings.data_dir / NONCES_DB


def grants_path(settings: Settings) -> Path:
    return settings.profiles.grants_db or settings.data_dir / GRANTS_DB


def server_state_paths(settings: Settings, served_root: Path) -> list[Path]:
    """What the file and notes tools must never reach if it lies inside ``served_root``.

    ``nexus-mcp serve --workspace .`` with the default data directory puts the audit log,
    the grants, the idempotency records and the used approval nonces inside the served
    folder; a caller must not read the audit trail, delete it, rewrite its own grants or
    forget a spent approval. That is the whole data
    directory, unless the served folder is itself inside it (``make run`` serves
    ``.nexus-data/demo-workspace``); then each state file (with SQLite's sidecar files)
    and the vault folders. Files configured elsewhere are always included. Callers keep
    only the paths inside the folder they serve.
    """
    data_dir = settings.data_dir.resolve()
    databases = [grants_path(settings), idempotency_path(settings), nonces_path(settings)]
    paths = [settings.audit_path, settings.data_dir / VAULTS_DIR]
    paths += [db.with_name(db.name + suffix) for db in databases for suffix in SQLITE_SIDECARS]
    if not is_within(data_dir, served_root.resolve()):
        paths.append(data_dir)
    return paths


__all__ = [
    "GRANTS_DB",
    "IDEMPOTENCY_DB",
    "NONCES_DB",
    "grants_path",
    "idempotency_path",
    "nonces_path",
    "server_state_paths",
]
