"""Upstreams over streamable HTTP: no token passthrough, per-principal sessions, health.

nexus runs as a real HTTP server process with bearer tokens; the upstream is the
recording test server over HTTP (or HTTPS with client certificates); what the upstream
received is read back from its own record.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO, Any

import httpx
import httpx2
import jwt
import pytest
from fastmcp import Client
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from .servers import free_port, http_server
from .upstream_harness import (
    Gateway,
    all_up_tools,
    http_upstream,
    http_upstream_process,
    make_gateway,
    poll,
    read_record,
    stdio_upstream,
    wait_listening,
)

pytestmark = pytest.mark.slow

JWT_SECRET = "jwt-secret-for-upstream-http-tests-0123456789"
AUDIENCE = "nexus-upstream-test"
SERVICE_TOKEN = "svc-token-CANARY-7f3a"
API_KEY = "api-key-CANARY-19bc"
CALLER_HEADER = "caller-header-CANARY-55d1"
CALLER_COOKIE = "caller-cookie-CANARY-0a9e"
ENV_CANARY = "env-canary-CANARY-3c2b"
WRITE_POLICY = {"allowed_tools": ["remember"], "require_approval": False}


def bearer(subject: str, role: str = "admin") -> str:
    now = int(time.time())
    claims = {"sub": subject, "aud": AUDIENCE, "iat": now, "exp": now + 600, "role": role}
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


@asynccontextmanager
async def caller(url: str, subject: str) -> AsyncIterator[ClientSession]:
    """A caller with its bearer token and other headers nexus must never pass on."""
    headers = {
        "Authorization": f"Bearer {bearer(subject)}",
        "X-Caller-Secret": CALLER_HEADER,
        "Cookie": f"session={CALLER_COOKIE}",
    }
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(f"{url}/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


OPERATOR_TOKEN = "operator-token-for-the-upstream-http-tests-0123"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


@contextmanager
def nexus_http(
    gw: Gateway, env: dict[str, str] | None = None, stderr: IO[bytes] | None = None
) -> Iterator[str]:
    port = free_port()
    settings_env = {
        "NEXUS_MCP_AUTH__JWT_SECRET": JWT_SECRET,
        "NEXUS_MCP_AUTH__AUDIENCE": AUDIENCE,
        # /readyz's detail is the operator's (health.py)
        "NEXUS_MCP_HEALTH__BEARER_TOKEN": json.dumps({"env": "NEXUS_TEST_OPERATOR_TOKEN"}),
        "NEXUS_TEST_OPERATOR_TOKEN": OPERATOR_TOKEN,
        **(env or {}),
    }
    args = [
        "--config",
        str(gw.config_file),
        "--workspace",
        str(gw.workspace),
        "--data-dir",
        str(gw.data_dir),
    ]
    with http_server(args, settings_env, port=port, timeout=40, stderr=stderr or subprocess.PIPE):
        yield f"http://127.0.0.1:{port}"


def make_certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    crypto = pytest.importorskip("cryptography")
    del crypto
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def write_key(key: Any, path: Path) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("nexus-test-ca"))
        .issuer_name(name("nexus-test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def issue(common: str, *, server: bool) -> tuple[Any, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(common))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        return key, builder.sign(ca_key, hashes.SHA256())

    paths = {name: folder / f"{name}.pem" for name in ("ca", "cert", "key", "ccert", "ckey")}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_key, server_cert = issue("upstream", server=True)
    client_key, client_cert = issue("nexus-gateway", server=False)
    paths["cert"].write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    write_key(server_key, paths["key"])
    paths["ccert"].write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
    write_key(client_key, paths["ckey"])
    return paths


CREDENTIALS: dict[str, dict[str, Any]] = {
    "none": {"type": "none"},
    "bearer": {"type": "bearer", "token": {"env": "UP_SERVICE_TOKEN"}},
    "header": {"type": "header", "header": "X-Api-Key", "value": {"env": "UP_API_KEY"}},
    "mtls": {"type": "mtls"},
}
SECRETS_ENV = {"UP_SERVICE_TOKEN": SERVICE_TOKEN, "UP_API_KEY": API_KEY}


@pytest.mark.parametrize("mode", list(CREDENTIALS))
async def test_the_upstream_never_sees_the_callers_token_or_headers(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "record.jsonl"
    credentials = dict(CREDENTIALS[mode])
    tls = None
    if mode == "mtls":
        certs = make_certificates(tmp_path)
        tls = {"cert": certs["cert"], "key": certs["key"], "client_ca": certs["ca"]}
        credentials.update(
            cert_file=str(certs["ccert"]), key_file=str(certs["ckey"]), ca_file=str(certs["ca"])
        )
    with http_upstream_process(record, tls=tls) as (url, _proc):
        gw = make_gateway(
            tmp_path / "gw",
            [http_upstream("up", url, credentials=credentials)],
            grant={"full": all_up_tools()},
        )
        for name, value in SECRETS_ENV.items():
            monkeypatch.setenv(name, value)  # what `upstream pin` resolves the secrets from
        assert gw.pin("up") == 0
        with nexus_http(gw, SECRETS_ENV) as base:
            async with caller(base, "alice") as session:
                result = await session.call_tool("up_whoami", {})
                assert result.is_error is False
                echoed = await session.call_tool("up_echo", {"text": "hi"})
                assert echoed.structured_content == {"text": "hi"}
            ready = httpx.get(f"{base}/readyz", headers=OPERATOR, timeout=5).json()
    assert ready["upstreams"]["up"]["state"] == "ready"
    received = read_record(record)
    calls = [r for r in received if r["method"] == "tools/call"]
    assert [c["tool"] for c in calls] == ["whoami", "echo"]
    everything = json.dumps(received)
    caller_token = "Bearer ey"
    for canary in (CALLER_HEADER, CALLER_COOKIE, caller_token):
        assert canary not in everything
    for entry in received:
        headers = entry["headers"]
        assert "x-caller-secret" not in headers
        assert "cookie" not in headers
        if mode == "bearer":
            assert headers["authorization"] == f"Bearer {SERVICE_TOKEN}"
        else:
            assert "authorization" not in headers
        if mode == "header":
            assert headers["x-api-key"] == API_KEY
        else:
            assert "x-api-key" not in headers
    if mode != "bearer":
        assert SERVICE_TOKEN not in everything


async def test_mtls_without_the_client_certificate_is_refused(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path)
    tls = {"cert": certs["cert"], "key": certs["key"], "client_ca": certs["ca"]}
    with http_upstream_process(tls=tls) as (url, _proc):
        gw = make_gateway(
            tmp_path / "gw",
            [http_upstream("up", url, credentials={"type": "none", "ca_file": str(certs["ca"])})],
            mode="dev",
            grant={"full": all_up_tools()},
        )
        server = gw.build()
        async with Client(server.mcp) as client:
            listed = {t.name for t in await client.list_tools()}
        assert not {n for n in listed if n.startswith("up_")}
        upstreams = server.runtime.upstreams
        assert upstreams is not None
        assert upstreams.summary()["up"]["state"] == "degraded"


async def test_each_principal_gets_its_own_upstream_session(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    with http_upstream_process(record) as (url, _proc):
        gw = make_gateway(
            tmp_path / "gw",
            [http_upstream("up", url, write_policy=WRITE_POLICY)],
            grant={"full": all_up_tools()},
        )
        assert gw.pin("up") == 0
        with nexus_http(gw) as base:
            async with caller(base, "alice") as alice, caller(base, "bob") as bob:
                await alice.call_tool("up_remember", {"value": "A", "idempotency_key": "a1"})
                await bob.call_tool("up_remember", {"value": "B", "idempotency_key": "b1"})
                seen_by_alice = await alice.call_tool("up_recall", {})
                seen_by_bob = await bob.call_tool("up_recall", {})
    assert seen_by_alice.structured_content == {"value": "A"}
    assert seen_by_bob.structured_content == {"value": "B"}
    sessions: dict[str, set[str]] = {}
    for entry in read_record(record):
        if entry["method"] == "tools/call":
            value = (entry["arguments"] or {}).get("value", "recall")
            sessions.setdefault(value, set()).add(entry["headers"].get("mcp-session-id", ""))
    (alice_session,) = sessions["A"]
    (bob_session,) = sessions["B"]
    assert alice_session != bob_session


async def test_a_shared_upstream_uses_one_session_for_everyone(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    with http_upstream_process(record) as (url, _proc):
        gw = make_gateway(
            tmp_path / "gw",
            [http_upstream("up", url, shared=True, write_policy=WRITE_POLICY)],
            grant={"full": all_up_tools()},
        )
        assert gw.pin("up") == 0
        with nexus_http(gw) as base:
            async with caller(base, "alice") as alice, caller(base, "bob") as bob:
                await alice.call_tool("up_remember", {"value": "A", "idempotency_key": "a1"})
                seen_by_bob = await bob.call_tool("up_recall", {})
    assert seen_by_bob.structured_content == {"value": "A"}  # documented: stateless only
    ids = {
        e["headers"].get("mcp-session-id")
        for e in read_record(record)
        if e["method"] == "tools/call"
    }
    assert len(ids) == 1


async def test_identity_goes_upstream_only_as_configured_meta(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    with http_upstream_process(record) as (url, _proc):
        gw = make_gateway(
            tmp_path / "gw",
            [
                http_upstream(
                    "up",
                    url,
                    identity_meta={"subject": "example.com/subject", "role": "example.com/role"},
                )
            ],
            grant={"full": all_up_tools()},
        )
        assert gw.pin("up") == 0
        server = gw.build()
        async with Client(server.mcp) as client:
            await client.call_tool_mcp(
                "up_echo",
                {"text": "hi"},
                meta={"nexus.mcp/correlation_id": "corr-CANARY", "custom/key": "meta-CANARY"},
            )
    (call,) = [e for e in read_record(record) if e["method"] == "tools/call"]
    meta = call["meta"] or {}
    assert meta.get("example.com/subject") == "alice", call
    assert meta["example.com/role"] == "admin"
    assert "CANARY" not in json.dumps(call)


async def test_the_stdio_upstream_inherits_no_secret_of_nexus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("NEXUS_TEST_CANARY", ENV_CANARY)
    gw = make_gateway(
        tmp_path / "gw", [stdio_upstream(record=record)], grant={"full": all_up_tools()}
    )
    assert gw.pin("up") == 0
    async with Client(gw.build().mcp) as client:
        await client.call_tool_mcp("up_echo", {"text": "hi"})
    assert {e["env_canary"] for e in read_record(record)} == {None}

    given = tmp_path / "given.jsonl"
    monkeypatch.setenv("GIVEN_VALUE", "handed-on-on-purpose")
    gw2 = make_gateway(
        tmp_path / "gw2",
        [stdio_upstream(record=given, secret_env={"NEXUS_TEST_CANARY": {"env": "GIVEN_VALUE"}})],
        grant={"full": all_up_tools()},
    )
    assert gw2.pin("up") == 0
    async with Client(gw2.build().mcp) as client:
        await client.call_tool_mcp("up_echo", {"text": "hi"})
    assert {e["env_canary"] for e in read_record(given)} == {"handed-on-on-purpose"}


@pytest.mark.parametrize("when_down", ["refuse", "hide"])
async def test_an_upstream_that_is_down_recovers_and_never_blocks(
    tmp_path: Path, when_down: str
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    gw = make_gateway(
        tmp_path / "gw",
        [
            http_upstream(
                "up",
                url,
                when_down=when_down,
                reconnect={"initial_seconds": 0.2, "max_seconds": 0.5},
                retry={"attempts": 1},
            )
        ],
        mode="dev",  # nothing pinned: the upstream is not there to pin yet
        grant={"full": all_up_tools()},
    )
    server = gw.build()
    upstreams = server.runtime.upstreams
    assert upstreams is not None
    async with Client(server.mcp) as client:
        started = time.monotonic()
        listed = {t.name for t in await client.list_tools()}
        native = await client.call_tool_mcp("nexus_list_files", {"path": "."})
        assert time.monotonic() - started < 5
        assert not native.is_error
        assert not {n for n in listed if n.startswith("up_")}
        assert upstreams.summary()["up"]["state"] == "degraded"
        with http_upstream_process(port=port) as (_url, proc):
            wait_listening(port, proc)
            await poll(lambda: upstreams.summary()["up"]["state"] == "ready")
            assert "up_echo" in {t.name for t in await client.list_tools()}
            ok = await client.call_tool_mcp("up_echo", {"text": "up"})
            assert ok.structured_content == {"text": "up"}
        # Killed after it was up.
        refused = await client.call_tool_mcp("up_echo", {"text": "down"})
        assert refused.is_error
        assert json.loads(refused.content[0].text) == {
            "error": "Upstream unavailable",
            "code": "UPSTREAM_ERROR",
        }
        await poll(lambda: upstreams.summary()["up"]["state"] == "degraded")
        started = time.monotonic()
        again = await client.call_tool_mcp("up_echo", {"text": "down"})
        assert time.monotonic() - started < 2  # refused at once while reconnecting
        listed = {t.name for t in await client.list_tools()}
    if when_down == "hide":
        assert "up_echo" not in listed
        assert again.content[0].text == "Unknown tool: 'up_echo'"
    else:
        assert "up_echo" in listed
        assert json.loads(again.content[0].text)["code"] == "UPSTREAM_ERROR"
    assert gw.events("upstream_down") and gw.events("upstream_up")


async def test_idle_sessions_close_and_reopen(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    with http_upstream_process(record) as (url, _proc):
        gw = make_gateway(
            tmp_path / "gw",
            [http_upstream("up", url, idle_timeout_seconds=0.5)],
            grant={"full": all_up_tools()},
        )
        assert gw.pin("up") == 0
        server = gw.build()
        upstreams = server.runtime.upstreams
        assert upstreams is not None
        async with Client(server.mcp) as client:
            await client.call_tool_mcp("up_echo", {"text": "1"})
            assert upstreams.servers["up"].session_count() == 1
            await poll(lambda: upstreams.servers["up"].session_count() == 0, seconds=10)
            again = await client.call_tool_mcp("up_echo", {"text": "2"})
            assert again.structured_content == {"text": "2"}
    ids = [
        e["headers"].get("mcp-session-id")
        for e in read_record(record)
        if e["method"] == "tools/call"
    ]
    assert len(ids) == 2 and ids[0] != ids[1]


async def test_new_callers_over_http_share_one_listing_of_a_huge_upstream(tmp_path: Path) -> None:
    """Issue 22, item 9, end to end: three callers' first calls open three upstream
    sessions at once on a 3 MB listing while a fourth caller's native calls go on; the
    upstream is listed once (the gateway's own session), not once per new session."""
    record = tmp_path / "record.jsonl"
    upstream = stdio_upstream(record=record, timeouts={"connect_seconds": 60})
    upstream["args"] += ["--big", "600"]
    gw = make_gateway(
        tmp_path / "gw", [upstream], grant={"full": [*all_up_tools(), "nexus_list_files"]}
    )
    assert gw.pin("up") == 0
    pinned = [r for r in read_record(record) if r["method"] == "tools/list"]
    # A file for the server's log: its warnings about 600 unclassified tools would fill a
    # pipe nobody reads.
    log_file = (tmp_path / "nexus.log").open("wb")
    with log_file, nexus_http(gw, stderr=log_file) as base:
        await poll(
            lambda: (
                httpx.get(f"{base}/readyz", headers=OPERATOR, timeout=5).json()["upstreams"]["up"][
                    "state"
                ]
                == "ready"
            ),
            seconds=60,
        )
        async with caller(base, "watcher") as watcher:
            slowest = 0.0

            async def first_call(subject: str) -> Any:
                async with caller(base, subject) as session:
                    return await session.call_tool("up_echo", {"text": subject})

            opened = asyncio.gather(*(first_call(f"p{i}") for i in range(3)))
            while not opened.done():
                started = time.perf_counter()
                native = await watcher.call_tool("nexus_list_files", {"path": "."})
                slowest = max(slowest, time.perf_counter() - started)
                assert native.is_error is False
                await asyncio.sleep(0.05)
            results = await opened
    assert [r.structured_content for r in results] == [{"text": f"p{i}"} for i in range(3)]
    listed = [r for r in read_record(record) if r["method"] == "tools/list"]
    assert len(listed) - len(pinned) == 1
    assert slowest < 3.0, slowest


async def test_progress_reaches_each_principal_only_on_a_shared_session(tmp_path: Path) -> None:
    """Issue 27: two principals' calls in flight on one shared upstream session, both over
    HTTP both ways, each asking for progress (under the same token value: each client
    numbers its own requests): each gets its own call's progress only."""
    record = tmp_path / "record.jsonl"
    with http_upstream_process(record) as (url, _proc):
        gw = make_gateway(
            tmp_path / "gw", [http_upstream("up", url, shared=True)], grant={"full": all_up_tools()}
        )
        assert gw.pin("up") == 0
        got: dict[str, list[tuple[float, float | None]]] = {"alice": [], "bob": []}

        async def call(session: ClientSession, subject: str, steps: int) -> Any:
            async def on_progress(progress: float, total: float | None, _message: Any) -> None:
                got[subject].append((progress, total))

            return await session.call_tool(
                "up_progress",
                {"steps": steps, "delay": 0.15},
                progress_callback=on_progress,
            )

        with nexus_http(gw) as base:
            async with caller(base, "alice") as alice, caller(base, "bob") as bob:
                results = await asyncio.gather(call(alice, "alice", 4), call(bob, "bob", 6))
    assert not any(r.is_error for r in results)
    assert got["alice"] == [(float(n), 4.0) for n in range(1, 5)]
    assert got["bob"] == [(float(n), 6.0) for n in range(1, 7)]
    calls = [e for e in read_record(record) if e["method"] == "tools/call"]
    assert len({e["headers"].get("mcp-session-id") for e in calls}) == 1
    tokens = [(e["meta"] or {}).get("progressToken") for e in calls]
    assert len(set(tokens)) == 2, tokens
