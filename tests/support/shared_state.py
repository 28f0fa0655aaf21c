"""Real PostgreSQL and Redis for the shared-state tests (issue 15).

The machine provides PostgreSQL on 127.0.0.1:5432 (trust auth) and Redis on
127.0.0.1:6379. Every test that uses them gets its own database (``postgres_url``) or
key prefix (``redis_url`` + ``state_prefix``) and removes it afterwards, so tests never
see each other's state and the servers are left as they were found.

Where a server is not reachable the tests that need it are skipped and the run ends with
one line naming them and why; under CI (``CI`` set, as ``.ci/run`` does) a missing
server fails those tests instead, because a skip there would hide the shared backend.

``private_redis`` and ``private_postgres`` start throwaway servers of their own on free
loopback ports (the machine's binaries), for the tests that stop a store during load:
the machine's own servers are never stopped.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PG_ADMIN_URL = os.environ.get(
    "NEXUS_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("NEXUS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_BIN = Path("/usr/lib/postgresql")
SKIP_MARK = " not reachable: "


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def _unavailable(service: str, why: str, request: pytest.FixtureRequest) -> None:
    if in_ci():
        pytest.fail(f"{service} is required under CI and is not reachable: {why}")
    pytest.skip(f"{service}{SKIP_MARK}{why}")


def postgres_reachable(admin_url: str = PG_ADMIN_URL) -> str | None:
    """None when PostgreSQL answers, else why not (the exception's type only)."""
    try:
        import psycopg

        with psycopg.connect(admin_url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return type(exc).__name__
    return None


def redis_reachable(url: str = REDIS_URL) -> str | None:
    try:
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return type(exc).__name__
    return None


def create_database(admin_url: str = PG_ADMIN_URL) -> tuple[str, str]:
    """A new empty database; returns (its name, its URL)."""
    import psycopg

    name = "nexus_t_" + secrets.token_hex(6)
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0]
    return name, f"{base}/{name}"


def drop_database(name: str, admin_url: str = PG_ADMIN_URL) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def delete_prefix(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database on the machine's PostgreSQL, dropped after the test."""
    why = postgres_reachable()
    if why is not None:
        _unavailable("PostgreSQL", why, request)
    name, url = create_database()
    try:
        yield url
    finally:
        drop_database(name)


@pytest.fixture
def migrated_postgres(postgres_url: str) -> str:
    """``postgres_url`` with this build's schema applied (``nexus-mcp state migrate``)."""
    from nexus_mcp.stores.postgres import PostgresPool, migrate

    pool = PostgresPool(postgres_url, pool_size=2)
    try:
        migrate(pool)
    finally:
        pool.close()
    return postgres_url


@pytest.fixture
def redis_url(request: pytest.FixtureRequest) -> str:
    why = redis_reachable()
    if why is not None:
        _unavailable("Redis", why, request)
    return REDIS_URL


@pytest.fixture
def state_prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    """A key prefix no other test uses; its Redis keys are deleted after the test."""
    prefix = "nexus-t-" + secrets.token_hex(5)
    yield prefix
    if redis_reachable() is None:
        delete_prefix(REDIS_URL, prefix)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


@dataclass
class PrivateRedis:
    """A redis-server of the test's own that it may stop and start again."""

    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_port(self.port)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


@pytest.fixture
def private_redis(request: pytest.FixtureRequest) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        _unavailable("redis-server", "binary not installed", request)
    server = PrivateRedis(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _pg_bin() -> Path | None:
    versions = sorted(PG_BIN.glob("*/bin/pg_ctl")) if PG_BIN.is_dir() else []
    return versions[-1].parent if versions else None


def _as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: drop to the ``postgres`` user when root."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", *argv]


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (initdb in a temporary folder)."""

    port: int
    data: Path
    bin_dir: Path

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            _as_postgres(
                [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "30", *args]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start(self) -> None:
        self._ctl(
            "-o",
            f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off",
            "-l",
            str(self.data / "server.log"),
            "start",
        )

    def stop(self) -> None:
        self._ctl("-m", "immediate", "stop")


@pytest.fixture
def private_postgres(request: pytest.FixtureRequest) -> Iterator[PrivatePostgres]:
    bin_dir = _pg_bin()
    if bin_dir is None:
        _unavailable("PostgreSQL binaries", "initdb not installed", request)
        raise AssertionError  # unreachable: _unavailable skips or fails
    root = Path(tempfile.mkdtemp(prefix="nexus-pg-"))
    data = root / "data"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(data, "postgres", "postgres")
    subprocess.run(
        _as_postgres(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = PrivatePostgres(free_port(), data, bin_dir)
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


def report_skips(terminalreporter: pytest.TerminalReporter) -> None:
    """One line saying which shared-state tests were skipped and why. Read from the skip
    reports themselves, so it also counts what parallel workers (pytest-xdist) skipped."""
    counts: collections.Counter[str] = collections.Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else ""
        service, mark, why = str(text).removeprefix("Skipped: ").partition(SKIP_MARK)
        if mark:
            counts[f"{service} ({why})"] += 1
    if not counts:
        return
    parts = [f"{count} test(s) need {service}" for service, count in sorted(counts.items())]
    terminalreporter.write_line(
        "shared-state tests skipped: " + "; ".join(parts) + " (.ci/run requires them)",
        yellow=True,
    )
