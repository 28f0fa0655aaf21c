"""``nexus-mcp state``: the shared state backend's schema, and moving grants between backends.

- ``state migrate``: create or upgrade the PostgreSQL schema (versioned migrations, safe
  to run from several replicas at once); servers refuse to start until it has run.
- ``state status``: the configured backend, the schema version against this build's, and
  whether PostgreSQL and Redis answer.
- ``state export`` / ``state import``: grants (tuples) and profile assignments of every
  zone as one JSON document, from one backend to the other (``--backend`` overrides
  ``state.backend``): e.g. ``export --backend embedded > grants.json`` on the old
  deployment, then ``import --backend shared grants.json``. An import replaces each zone
  it names, in one transaction per zone, and bumps its revision so caches notice.

Settings are found as ``serve`` finds them (``--config`` / ``NEXUS_MCP_CONFIG``, the
environment, ``--data-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nexus_mcp.errors import ConfigError, InvalidInputError, NexusError

if TYPE_CHECKING:  # settings and stores are imported by the functions that run
    from nexus_mcp.settings import Settings
    from nexus_mcp.stores.grants import TupleStore

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_CONFIG = 2
EXPORT_FORMAT = "nexus-mcp.grants-export"
EXPORT_VERSION = 1
MAX_IMPORT_BYTES = 256 * 1024 * 1024


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "state",
        help="shared state backend: migrate its schema, show its status, move grants",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, default=None, help="YAML configuration file")
    common.add_argument("--data-dir", type=Path, default=None, help="state folder")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    migrate = actions.add_parser(
        "migrate", parents=[common], help="create or upgrade the PostgreSQL schema"
    )
    migrate.set_defaults(func=run_migrate)
    status = actions.add_parser(
        "status", parents=[common], help="backend, schema version, store reachability"
    )
    status.set_defaults(func=run_status)
    for name, func, text in (
        ("export", run_export, "write grants and assignments as JSON"),
        ("import", run_import, "replace grants and assignments from an export"),
    ):
        sub = actions.add_parser(name, parents=[common], help=text)
        sub.add_argument(
            "--backend",
            choices=["embedded", "shared"],
            default=None,
            help="the backend to read or write (default: state.backend)",
        )
        if name == "export":
            sub.add_argument(
                "--output", "-o", type=Path, default=None, help="file to write (default stdout)"
            )
        else:
            sub.add_argument("file", type=Path, metavar="FILE", help="an export ('-': stdin)")
        sub.set_defaults(func=func)


def _settings(args: argparse.Namespace) -> Settings:
    config = args.config or (
        Path(os.environ["NEXUS_MCP_CONFIG"]) if os.environ.get("NEXUS_MCP_CONFIG") else None
    )
    from nexus_mcp.settings import load_settings

    return load_settings(config, {"data_dir": args.data_dir}, flags={"data_dir": "--data-dir"})


def _guarded(action: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return action(args)
        except ConfigError as exc:
            sys.stderr.write(f"nexus-mcp: {exc}\n")
            return EXIT_CONFIG
        except NexusError as exc:
            sys.stderr.write(f"nexus-mcp: {exc.message} ({exc.code})\n")
            return EXIT_PROBLEMS

    return run


@_guarded
def run_migrate(args: argparse.Namespace) -> int:
    from nexus_mcp.stores.backends import open_postgres
    from nexus_mcp.stores.postgres import migrate, schema_status

    settings = _settings(args)
    if settings.state.postgres_url is None:
        raise ConfigError("state migrate needs 'state.postgres_url'")
    pool = open_postgres(settings, os.environ)
    try:
        applied = migrate(pool)
        current, latest = schema_status(pool)
    finally:
        pool.close()
    if applied:
        print(f"applied migrations {', '.join(str(v) for v in applied)}; schema {current}")
    else:
        print(f"schema {current} is current (this build: {latest})")
    return EXIT_OK


@_guarded
def run_status(args: argparse.Namespace) -> int:
    from nexus_mcp.stores.backends import describe_address, resolve_url

    settings = _settings(args)
    print(f"backend: {settings.state.backend}")
    problems = 0
    if settings.state.postgres_url is not None:
        from nexus_mcp.stores.backends import open_postgres
        from nexus_mcp.stores.postgres import schema_status

        url = resolve_url(settings.state.postgres_url, "state.postgres_url", settings, os.environ)
        pool = open_postgres(settings, os.environ)
        try:
            current, latest = schema_status(pool)
            where = describe_address(url)
            state = "current" if current == latest else ("behind" if current < latest else "newer")
            print(f"postgresql: {where} schema {current} ({state}; this build {latest})")
            problems += current != latest
        except NexusError:
            print(f"postgresql: {describe_address(url)} unreachable")
            problems += 1
        finally:
            pool.close()
    if settings.state.redis_url is not None:
        from nexus_mcp.stores.redis_state import redis_client

        url = resolve_url(settings.state.redis_url, "state.redis_url", settings, os.environ)
        client = redis_client(
            url,
            pool_size=1,
            connect_timeout=settings.state.connect_timeout_seconds,
            timeout=settings.state.timeout_seconds,
        )
        try:
            client.ping()
            print(f"redis: {describe_address(url)} reachable")
        except Exception:  # noqa: BLE001 - any failure is "unreachable" here
            print(f"redis: {describe_address(url)} unreachable")
            problems += 1
        finally:
            client.close()
    return EXIT_PROBLEMS if problems else EXIT_OK


def _open(settings: Settings, backend: str) -> tuple[TupleStore, Callable[[], None]]:
    if backend == "shared":
        from nexus_mcp.stores.backends import open_shared_grants

        return open_shared_grants(settings, os.environ)
    from nexus_mcp.stores.grants import SqliteTupleStore
    from nexus_mcp.stores.locations import grants_path, prepare_state

    prepare_state(settings)
    store = SqliteTupleStore(grants_path(settings))
    return store, store.close


@_guarded
def run_export(args: argparse.Namespace) -> int:
    settings = _settings(args)
    store, close = _open(settings, args.backend or settings.state.backend)
    try:
        document = {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "zones": [store.export_zone(zone) for zone in store.zones()],
        }
    finally:
        close()
    text = json.dumps(document, indent=1, sort_keys=True, ensure_ascii=True) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        # Grants say who may do what: the export is private to its owner, like the database.
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        # The mode above only applies to a new file: an existing one is made private too.
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
    zones = document["zones"]
    assert isinstance(zones, list)
    sys.stderr.write(
        f"exported {len(zones)} zone(s), {sum(len(z['tuples']) for z in zones)} grant(s)\n"
    )
    return EXIT_OK


@_guarded
def run_import(args: argparse.Namespace) -> int:
    settings = _settings(args)
    zones = _read_export(args.file)
    store, close = _open(settings, args.backend or settings.state.backend)
    try:
        for zone in zones:
            store.import_zone(zone, zone["zone"])
    finally:
        close()
    sys.stderr.write(
        f"imported {len(zones)} zone(s), {sum(len(z['tuples']) for z in zones)} grant(s)\n"
    )
    return EXIT_OK


def _read_export(path: Path) -> list[Mapping[str, Any]]:
    """The zones of an export, checked whole before anything is written."""
    from nexus_mcp.stores.grants import check_text, parse_export

    try:
        if str(path) == "-":
            raw = sys.stdin.buffer.read(MAX_IMPORT_BYTES + 1)
        else:
            with path.open("rb") as handle:
                raw = handle.read(MAX_IMPORT_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({type(exc).__name__})") from None
    if len(raw) > MAX_IMPORT_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_IMPORT_BYTES} bytes")
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ConfigError(f"{path}: not JSON") from None
    if (
        not isinstance(document, dict)
        or document.get("format") != EXPORT_FORMAT
        or document.get("version") != EXPORT_VERSION
        or not isinstance(document.get("zones"), list)
    ):
        raise ConfigError(f"{path}: not a nexus-mcp grants export (version {EXPORT_VERSION})")
    zones: list[Mapping[str, Any]] = []
    seen: set[str] = set()
    for index, zone in enumerate(document["zones"]):
        # The stores' own checks, on every zone before the first is written: a bad zone
        # late in the file must not leave the earlier ones imported.
        try:
            if not isinstance(zone, dict):
                raise InvalidInputError(field="zone")
            check_text(zone.get("zone"), "zone")
            parse_export(zone)
        except InvalidInputError as exc:
            raise ConfigError(f"{path}: zone {index} is malformed ({exc.message})") from None
        if zone["zone"] in seen:
            raise ConfigError(f"{path}: zone {index} repeats an earlier zone")
        seen.add(zone["zone"])
        zones.append(zone)
    return zones


__all__ = ["add_parser", "run_export", "run_import", "run_migrate", "run_status"]
