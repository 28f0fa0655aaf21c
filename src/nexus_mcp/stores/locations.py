"""Where the server keeps its own state, which of it must stay out of callers' reach, and
whether it can be kept there at all.

Every command that touches state (``serve``, ``audit``, ``profiles``) finds it the same
way: ``Settings`` (flags, environment, ``NEXUS_MCP_CONFIG``, the per-user default), so an
operator's shell and a desktop client's launch agree on one data directory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from nexus_mcp.errors import ConfigError
from nexus_mcp.settings import ENV_PREFIX, Settings, load_settings, referenced_files
from nexus_mcp.workspace.paths import is_within

IDEMPOTENCY_DB = "idempotency.sqlite3"
NONCES_DB = "nonces.sqlite3"
GRANTS_DB = "grants.sqlite3"
UPSTREAM_QUARANTINE_DB = "upstream_quarantine.sqlite3"
APPROVAL_REQUESTS_DB = "approval_requests.sqlite3"
VAULTS_DIR = "vaults"
SQLITE_SIDECARS = ("", "-wal", "-shm", "-journal")
CONFIG_ENV = f"{ENV_PREFIX}CONFIG"
# The data directory holds the audit trail and the grants: its owner only. Parents made on
# the way (~/.local/share) get the usual mode, as any program creating them would.
DATA_DIR_MODE = 0o700
# How each setting that places state can be spelled by an operator, for error messages.
DATA_DIR_SETTING = f"'data_dir' ({ENV_PREFIX}DATA_DIR / --data-dir)"
AUDIT_FILE_SETTING = f"'audit_file' ({ENV_PREFIX}AUDIT_FILE / --audit-file)"
GRANTS_DB_SETTING = f"'profiles.grants_db' ({ENV_PREFIX}PROFILES__GRANTS_DB)"


OAUTH_DIR = "oauth"
# The operator console's signing key (console/security.py) when ``console.secret`` is not
# set: whoever reads it can sign in to the console as anyone.
CONSOLE_KEY = "console.key"


def console_key_path(settings: Settings) -> Path:
    return settings.data_dir / CONSOLE_KEY


def idempotency_path(settings: Settings) -> Path:
    return settings.data_dir / IDEMPOTENCY_DB


def nonces_path(settings: Settings) -> Path:
    return settings.data_dir / NONCES_DB


def approval_requests_path(settings: Settings) -> Path:
    """Approval requests waiting for (or decided by) an operator (embedded backend)."""
    return settings.data_dir / APPROVAL_REQUESTS_DB


def grants_path(settings: Settings) -> Path:
    return settings.profiles.grants_db or settings.data_dir / GRANTS_DB


def upstream_quarantine_path(settings: Settings) -> Path:
    """Upstream quarantine evidence kept across restarts (embedded backend)."""
    return settings.data_dir / UPSTREAM_QUARANTINE_DB


def oauth_state_path(settings: Settings) -> Path:
    """The front door's state (registered clients, codes, the provider's tokens, encrypted)
    on the embedded backend (``identity/oauth.py``)."""
    return settings.data_dir / OAUTH_DIR


def server_state_paths(settings: Settings, served_root: Path) -> list[Path]:
    """What the file and notes tools must never reach if it lies inside ``served_root``.

    The per-user data directory lies inside the served folder when that is the home folder
    (``~/.local/share/nexus-mcp``), and ``--data-dir`` may put it anywhere; then the audit
    log, the grants, the idempotency records, the used approval nonces, the approval
    requests and the console's signing key are in reach of the file tools. A caller must
    not read the audit trail,
    delete it, rewrite its own grants, forget a spent approval or approve its own pending
    request (nor read or forge the fixtures ``--record`` writes). That is the whole data
    directory, unless the served folder is itself inside it (``make run`` serves
    ``.nexus-data/demo-workspace``); then each state file (with SQLite's sidecar files)
    and the vault folders. Files configured elsewhere are always included. Callers keep
    only the paths inside the folder they serve.
    """
    data_dir = settings.data_dir.resolve()
    databases = [
        grants_path(settings),
        idempotency_path(settings),
        nonces_path(settings),
        upstream_quarantine_path(settings),
        approval_requests_path(settings),
    ]
    paths = [
        settings.audit_path,
        settings.data_dir / VAULTS_DIR,
        oauth_state_path(settings),
        console_key_path(settings),
    ]
    paths += [db.with_name(db.name + suffix) for db in databases for suffix in SQLITE_SIDECARS]
    if not is_within(data_dir, served_root.resolve()):
        paths.append(data_dir)
    if settings.record is not None:
        # A recording holds results, and a replay believes it: never readable or
        # writable by the tools whose calls it records.
        paths.append(settings.record)
    # What the server trusts as configuration: the configuration file, every secret it or
    # the environment gives by file (the fixture key that seals a recording, JWT, approval,
    # forge and upstream credentials, state keys: read, a caller could mint, re-seal or
    # impersonate; overwritten, the server would trust the caller's at its next start),
    # the profiles file (its grants) and the registries with their lock files (the
    # classification and pins of every tool).
    paths += settings.trusted_files
    paths += [path.absolute() for path in referenced_files(settings)]  # Settings made directly
    paths += [
        path
        for path in (
            settings.profiles.file,
            settings.registry.directory,
            settings.registry.upstream_directory,
        )
        if path is not None
    ]
    return paths


def load_state_settings(data_dir: Path | None = None) -> Settings:
    """The settings an operator command finds the server's state with, as ``serve`` does:
    environment, the ``NEXUS_MCP_CONFIG`` file, the per-user default; ``--data-dir`` wins.

    Raises ``ConfigError`` (one line, naming the setting) like ``serve`` would.
    """
    config = os.environ.get(CONFIG_ENV)
    return load_settings(
        Path(config) if config else None, {"data_dir": data_dir}, flags={"data_dir": "--data-dir"}
    )


def prepare_state(settings: Settings) -> None:
    """Create the folders the server keeps state in and check it can write there.

    Run before any state is opened, so that a data directory that cannot be created or
    written (permission denied, a file in the way, a read-only file system, a state file
    owned by someone else) stops start-up with one line naming the setting to change,
    instead of a traceback from whichever store opens first.
    """
    folders = {settings.data_dir: DATA_DIR_SETTING}
    if settings.audit_file is not None:
        folders.setdefault(settings.audit_file.parent, AUDIT_FILE_SETTING)
    if settings.profiles.grants_db is not None:
        folders.setdefault(settings.profiles.grants_db.parent, GRANTS_DB_SETTING)
    for folder, setting in folders.items():
        prepare_folder(folder, setting)
    grants_setting = GRANTS_DB_SETTING if settings.profiles.grants_db else DATA_DIR_SETTING
    databases = [
        (grants_path(settings), grants_setting),
        (idempotency_path(settings), DATA_DIR_SETTING),
        (nonces_path(settings), DATA_DIR_SETTING),
        (upstream_quarantine_path(settings), DATA_DIR_SETTING),
        (approval_requests_path(settings), DATA_DIR_SETTING),
    ]
    files = [(settings.audit_path, AUDIT_FILE_SETTING if settings.audit_file else DATA_DIR_SETTING)]
    files += [
        (db.with_name(db.name + suffix), setting)
        for db, setting in databases
        for suffix in SQLITE_SIDECARS
    ]
    for path, setting in files:
        _check_writable_file(path, setting)


def prepare_folder(folder: Path, setting: str = DATA_DIR_SETTING) -> None:
    """Create ``folder`` (owner-only) if needed and prove a file can be created in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=DATA_DIR_MODE)
    except FileExistsError:
        # mkdir(exist_ok=True) raises this only when something other than a folder is there.
        raise _unusable(f"state folder {folder}", "a file is in the way", setting) from None
    except OSError as exc:
        raise _unusable(f"state folder {folder}", _reason(exc), setting) from None
    try:
        # An unnamed temporary file where the system has them (O_TMPFILE): nothing is left.
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise _unusable(f"state folder {folder}", _reason(exc), setting) from None


def _check_writable_file(path: Path, setting: str) -> None:
    """An existing state file must open for appending; nothing is written or created."""
    # O_NONBLOCK: a FIFO planted in place of a state file fails (ENXIO) instead of hanging.
    flags = os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _unusable(f"state file {path}", _reason(exc), setting) from None
    os.close(fd)


def _unusable(what: str, reason: str, setting: str) -> ConfigError:
    return ConfigError(f"{what} cannot be used ({reason}): set {setting} to a folder you can write")


def _reason(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()


__all__ = [
    "APPROVAL_REQUESTS_DB",
    "AUDIT_FILE_SETTING",
    "CONSOLE_KEY",
    "DATA_DIR_SETTING",
    "GRANTS_DB",
    "GRANTS_DB_SETTING",
    "IDEMPOTENCY_DB",
    "NONCES_DB",
    "OAUTH_DIR",
    "approval_requests_path",
    "console_key_path",
    "grants_path",
    "idempotency_path",
    "load_state_settings",
    "nonces_path",
    "oauth_state_path",
    "prepare_folder",
    "prepare_state",
    "server_state_paths",
]
