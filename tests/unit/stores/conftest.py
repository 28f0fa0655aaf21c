"""Store tests run against every backend: SQLite files and a real PostgreSQL database.

``pg_pools`` opens pools (closed after the test, before its database is dropped);
``migrated_url`` is a fresh PostgreSQL database with this build's schema.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from nexus_mcp.stores.postgres import PostgresPool, migrate

BACKENDS = ["sqlite", "postgres"]

PoolFactory = Callable[..., PostgresPool]


@pytest.fixture
def pg_pools() -> Iterator[PoolFactory]:
    """``open(url, **options)``: a ``PostgresPool`` closed when the test ends."""
    opened: list[PostgresPool] = []

    def open_pool(url: str, **options: object) -> PostgresPool:
        settings: dict[str, object] = {"pool_size": 4, "timeout": 10.0, "connect_timeout": 2.0}
        settings.update(options)
        pool = PostgresPool(url, **settings)  # type: ignore[arg-type]
        opened.append(pool)
        return pool

    yield open_pool
    for pool in opened:
        pool.close()


@pytest.fixture
def migrated_url(postgres_url: str, pg_pools: PoolFactory) -> str:
    """A fresh database holding this build's schema."""
    migrate(pg_pools(postgres_url, pool_size=1))
    return postgres_url
