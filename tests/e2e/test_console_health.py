"""The console's Health page when the shared state store goes down and comes back.

A prod HTTP server on the shared backend (a Redis of the test's own, which it stops, and
PostgreSQL), on a real socket; a viewer signed in before the outage reads the page: the
store is unavailable (``unreachable``, ``/readyz``'s word), the status ``not_ready``, and
the page names no address or port; once Redis is back, ready again. A gateway whose
upstream process dies at once shows it degraded by id, never its output.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.observability.readiness import STORE_PROBE_INTERVAL_SECONDS
from nexus_mcp.settings import Settings, load_settings
from nexus_mcp.stores.postgres import PostgresPool, migrate

from .access_helpers import AUDIENCE, SECRET, serve_settings
from .test_console_pages import Served, client_for, sign_in
from .upstream_harness import make_gateway, poll

pytestmark = pytest.mark.slow

STATE_KEY = "request-state-key-console-health-0123456789ab"


@pytest.fixture
async def served(
    tmp_path: Path,
    workspace: Path,
    postgres_url: str,
    state_prefix: str,
    private_redis: Any,
) -> AsyncIterator[Served]:
    pool = PostgresPool(postgres_url, pool_size=1)
    try:
        migrate(pool)
    finally:
        pool.close()
    settings = Settings(
        mode="prod",
        transport="http",
        workspace=workspace,
        data_dir=tmp_path / "data",
        auth={"jwt_secret": SECRET, "audience": AUDIENCE},
        console={"viewer_roles": ["viewer"]},
        state={
            "backend": "shared",
            "postgres_url": {"env": "PG"},
            "redis_url": {"env": "RD"},
            "key_prefix": state_prefix,
            "request_state_keys": [{"env": "RSK"}],
            "timeout_seconds": 1.0,
            "connect_timeout_seconds": 1.0,
        },
        port=0,
    )
    env = {"PG": postgres_url, "RD": private_redis.url, "RSK": STATE_KEY}
    audit = MemoryAuditSink()
    async with serve_settings(settings, audit, env=env) as (server, url):
        yield Served(server, url, audit)  # type: ignore[arg-type]


def store_line(page: str) -> str:
    found = re.search(r'<dd id="store">(.*?)</dd>', page)
    assert found is not None, page
    return found.group(1)


async def test_health_shows_the_shared_store_down_and_back(
    served: Served, private_redis: Any
) -> None:
    async with client_for(served) as browser:
        await sign_in(browser, served.link("viewer"))
        up = (await browser.get("/console/health")).text
        assert store_line(up) == "ready · backend <code>shared</code>"
        private_redis.stop()
        await asyncio.sleep(STORE_PROBE_INTERVAL_SECONDS + 0.1)
        down = (await browser.get("/console/health")).text
        assert store_line(down) == "unavailable (unreachable) · backend <code>shared</code>"
        # Whether the session was signed out cannot be known now: other pages refuse
        # (fail closed); the health page, wanted most in an outage, still answers.
        inbox = await browser.get("/console/inbox")
        assert inbox.status_code == 503 and "unavailable" in inbox.text
        assert re.search(r'id="status">not_ready<', down)
        for word in (str(private_redis.port), "redis://", "postgresql://", "Error"):
            assert word not in down
        private_redis.start()
        deadline = time.monotonic() + 15
        while "ready · backend" not in store_line((await browser.get("/console/health")).text):
            assert time.monotonic() < deadline
            await asyncio.sleep(STORE_PROBE_INTERVAL_SECONDS)


DEAD_OUTPUT = "CANARY-CONSOLE-UPSTREAM-STDERR-5e1"


async def test_health_names_an_upstream_that_cannot_start(tmp_path: Path) -> None:
    dead = {
        "server_id": "dead",
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-c", f"import sys; sys.stderr.write('{DEAD_OUTPUT}'); sys.exit(3)"],
    }
    gw = make_gateway(tmp_path / "gw", [dead])
    settings = load_settings(
        gw.config_file,
        {
            "workspace": gw.workspace,
            "data_dir": gw.data_dir,
            "transport": "http",
            "subject": None,
            "role": None,
            "auth": {"jwt_secret": SECRET, "audience": AUDIENCE},
            "console": {"viewer_roles": ["viewer"]},
            "port": 0,
        },
    )
    audit = MemoryAuditSink()
    async with serve_settings(settings, audit, config_file=gw.config_file) as (server, url):
        served = Served(server, url, audit)  # type: ignore[arg-type]
        upstreams = server.runtime.upstreams
        assert upstreams is not None
        await poll(lambda: upstreams.summary()["dead"]["state"] == "degraded")
        async with client_for(served) as browser:
            await sign_in(browser, served.link("viewer"))
            page = (await browser.get("/console/health")).text
    assert re.search(r'id="upstreams-state">degraded<', page)
    row = re.search(r"<tr><td><code>dead</code></td>\s*<td>(.*?)</td>", page)
    assert row is not None and row.group(1) == "degraded (unreachable)"
    assert DEAD_OUTPUT not in page
