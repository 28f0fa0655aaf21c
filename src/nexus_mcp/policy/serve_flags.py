"""The ``serve`` command's options: flag, the setting it sets, help, argparse extras.

``commands/serve.py`` builds its parser from them, ``settings.py`` names a bad value by
its flag (``SERVE_FLAGS``), and the HTTP workers load settings with the same flags. Kept
apart from the settings models so ``nexus-mcp serve --help`` builds without pydantic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# (flag, settings field, help). Every flag also reads NEXUS_MCP_<FIELD> (pydantic-settings).
SERVE_OPTIONS: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("--transport", "transport", "stdio (default) or http", {"choices": ["stdio", "http"]}),
    ("--host", "host", "HTTP bind address (default 127.0.0.1)", {}),
    ("--port", "port", "HTTP port (default 8765)", {"type": int}),
    ("--http-path", "http_path", "HTTP endpoint path (default /mcp)", {}),
    (
        "--workers",
        "workers",
        "HTTP worker processes behind one socket (default 1); more than one needs "
        "state.backend: shared and --stateless-http",
        {"type": int},
    ),
    (
        "--workspace",
        "workspace",
        "folder the file and notes tools serve (required)",
        {"type": Path},
    ),
    ("--mode", "mode", "prod (default) or dev", {"choices": ["dev", "prod"]}),
    (
        "--data-dir",
        "data_dir",
        "state folder: audit log, SQLite stores (default: the per-user data directory, "
        "$XDG_DATA_HOME/nexus-mcp or ~/.local/share/nexus-mcp)",
        {"type": Path},
    ),
    (
        "--audit-file",
        "audit_file",
        "JSONL audit file (default <data-dir>/audit.jsonl)",
        {"type": Path},
    ),
    (
        "--audit-max-bytes",
        "audit_max_bytes",
        "rotate the audit file past this size (at least 65536; default: never)",
        {"type": int},
    ),
    (
        "--log-level",
        "log_level",
        "DEBUG, INFO (default), WARNING or ERROR",
        {"choices": ["DEBUG", "INFO", "WARNING", "ERROR"]},
    ),
    (
        "--log-format",
        "log_format",
        "text, json, or auto (default: text when stderr is a terminal, else json)",
        {"choices": ["auto", "text", "json"]},
    ),
    ("--subject", "subject", "stdio principal: subject", {}),
    ("--role", "role", "stdio principal: role (viewer, editor, evaluator, admin)", {}),
    ("--profile", "profile", "stdio principal: tool profile", {}),
    ("--vault-id", "vault_id", "stdio principal: vault id", {}),
    ("--user-id", "user_id", "stdio principal: user id", {}),
    ("--canister-user-id", "canister_user_id", "stdio principal: canister user id", {}),
    ("--scopes", "scopes", "stdio principal: scopes, comma or space separated", {}),
    (
        "--record",
        "record",
        "append every call that reaches a tool to fixture files in DIR "
        "(<server_id>.jsonl, one per server)",
        {"type": Path, "metavar": "DIR"},
    ),
    (
        "--replay",
        "replay",
        "answer every call from the fixtures in DIR: no workspace, vault, repository or "
        "upstream is touched (FIXTURE_NOT_FOUND for an unrecorded call)",
        {"type": Path, "metavar": "DIR"},
    ),
)


# The flag behind each setting, so a bad flag value is reported under the flag's name.
SERVE_FLAGS = {
    **{dest: flag for flag, dest, _, _ in SERVE_OPTIONS},
    "read_only": "--read-only",
    "stateless_http": "--stateless-http",
}


__all__ = ["SERVE_FLAGS", "SERVE_OPTIONS"]
