"""The front door's state is the fleet's: a sign-in begun on one replica ends on another.

Two ``nexus-mcp serve`` replicas on the shared backend (the machine's PostgreSQL and
Redis, a fresh database and key prefix) with one ``auth.oidc_proxy`` configuration and
one signing key, in front of a real OpenID provider. A client registers with replica A,
its user consents and signs in through A, and the code is redeemed at B; the token B
issued works on A, B refreshes it, and the state sits in Redis under the deployment's
prefix, encrypted: no client secret, code or token is readable there.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.support.oidc import Browser, OidcProvider, oidc_provider_fixture
from tests.support.shared_state import REDIS_URL

from .test_oauth_front_door import ACCOUNTS as FRONT_ACCOUNTS
from .test_oauth_front_door import (
    CALLBACK,
    FRONT_SECRET,
    SIGNING_KEY,
    approve_consent,
    authorize_url,
    code_in,
    exchange,
    front_door_config,
    pkce,
    provider_config,
    register,
)
from .test_oauth_signin import post_init
from .test_replicas import (
    ENV_PG,
    ENV_REDIS,
    ENV_REQUEST_STATE,
    Replica,
    Stores,
    migrated_stores,
    start_replica,
    write_yaml,
)

pytestmark = pytest.mark.slow


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    return _port(), _port()


@pytest.fixture(scope="module")
def nexus_port(ports: tuple[int, int]) -> int:
    """The fleet's public address is replica A's (the balancer's, in a real fleet)."""
    return ports[0]


oidc = oidc_provider_fixture(provider_config)


@pytest.fixture(scope="module")
def stores(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stores]:
    with migrated_stores(request, tmp_path_factory.mktemp("oauth-replicas")) as migrated:
        yield migrated


@pytest.fixture(scope="module")
def fleet(
    stores: Stores, oidc: OidcProvider, ports: tuple[int, int]
) -> Iterator[tuple[Replica, Replica]]:
    public = f"http://127.0.0.1:{ports[0]}"
    replicas = []
    for name, port in zip(("a", "b"), ports, strict=True):
        root = stores.root / f"replica-{name}"
        root.mkdir()
        document = front_door_config(public, oidc.issuer)
        document.update(
            {
                "workspace": str(stores.workspace),
                "data_dir": str(root / "data"),
                "state": {
                    "backend": "shared",
                    "postgres_url": {"env": ENV_PG},
                    "redis_url": {"env": ENV_REDIS},
                    "request_state_keys": [{"env": ENV_REQUEST_STATE}],
                    "key_prefix": stores.prefix,
                },
            }
        )
        replica = Replica(
            name,
            port,
            write_yaml(root / "nexus.yaml", document),
            root / "data",
            root / "stderr.log",
        )
        replicas.append(replica)
    # The store URLs and keys, without the replica tests' own bearer-token settings.
    env = {
        **{k: v for k, v in stores.env.items() if not k.startswith("NEXUS_MCP_AUTH__")},
        "FRONT_SECRET": FRONT_SECRET,
        "NEXUS_OAUTH_SIGNING_KEY": SIGNING_KEY,
    }
    for replica in replicas:
        start_replica(replica, env)
    try:
        yield replicas[0], replicas[1]
    finally:
        for replica in replicas:
            if replica._stop is not None:
                replica._stop()


def test_a_sign_in_begun_on_one_replica_ends_on_another(
    fleet: tuple[Replica, Replica], oidc: OidcProvider, stores: Stores
) -> None:
    a, b = fleet
    registered = register(a.url, [CALLBACK])
    assert registered.status_code == 201, registered.text
    client_id = registered.json()["client_id"]
    verifier, challenge = pkce()
    redirect = Browser().sign_in(
        authorize_url(a.url, client_id, challenge),
        login="alice",
        password=FRONT_ACCOUNTS["alice"]["password"],
        stop_at_prefix=CALLBACK,
        on_page=approve_consent(a.url),
        provider_origin=oidc.issuer,
    )
    code = code_in(redirect)
    # The code was issued by A; B redeems it (the resource is the fleet's public one).
    answer = httpx.post(
        f"{b.url}/token",
        data={
            "grant_type": "authorization_code",
            "client_id": client_id,
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": CALLBACK,
            "resource": f"{a.url}/mcp",
        },
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    tokens = answer.json()
    # Spent on B means spent on A too.
    replay = exchange(a.url, client_id, code, verifier)
    assert replay.status_code in (400, 401) and replay.json()["error"] == "invalid_grant"
    for replica in (a, b):
        assert post_init(f"{replica.url}/mcp", tokens["access_token"]).status_code == 200
    # B refreshes the tokens A's client got.
    refreshed = httpx.post(
        f"{b.url}/token",
        data={
            "grant_type": "refresh_token",
            "client_id": client_id,
            "refresh_token": tokens["refresh_token"],
        },
        timeout=10,
    )
    assert refreshed.status_code == 200, refreshed.text
    new_token = refreshed.json()["access_token"]
    assert post_init(f"{a.url}/mcp", new_token).status_code == 200
    # Everything lives under the deployment's prefix, and none of it is readable.
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{stores.prefix}:oauth*", count=1000))
        assert keys, "the front door kept nothing in Redis"
        stored = b"".join(keys) + b"".join(client.get(k) or b"" for k in keys)
    finally:
        client.close()
    # (Client ids are public identifiers and name keys; values are encrypted.)
    for secret in (code, tokens["access_token"], tokens["refresh_token"], "alice"):
        assert secret.encode() not in stored
