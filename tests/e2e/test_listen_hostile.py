"""``subscriptions/listen`` under attack (issue 27): what a hostile 2026-07-28 caller can
make a listen stream hold, reach or announce.

- a client that stops reading (a raw socket that never reads, behind a server whose
  socket buffers are small, so the backlog fills in a few events) has its stream ended,
  and its slot, its registration and its upstream subscriptions released;
- a bearer token that maps to no principal opens a stream that carries nothing and so
  holds nothing: it ends at once, instead of outliving the token;
- a template is no way around a quarantined resource, nor a carrier of a query it does
  not declare, for a subscription as for a read;
- a server with no upstream announces no resource subscriptions on the 2026-07-28 era,
  as it does on the handshake era;
- a stream the change notifier forgets to make room (a flood of handshake-era sessions)
  ends, instead of staying acknowledged and never told again.

Real parts throughout: the recording upstream as a stdio subprocess, the gateway built
the normal way, uvicorn on a real socket, bearer tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jwt
import pytest
import uvicorn
import yaml
from fastmcp import Client
from mcp.shared.exceptions import MCPError

from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.server.listen import ListenService
from nexus_mcp.settings import load_settings
from nexus_mcp.transport.serve import http_options

from .access_helpers import AUDIENCE, SECRET, TLS, token
from .test_change_notifications import (
    README,
    gateway,
    http_gateway,
    served,
    subscribe,
    subscribing_gateway,
)
from .test_listen import MODERN, Events, http_caller, listening
from .upstream_harness import make_gateway, poll, read_record

# An update frame of ~2 KB (a template URI may be 2,048 characters): the buffers fill fast.
ITEM = "test://items/" + "a" * 2000
SMALL_BUFFER = 4096


def service_of(server: NexusServer) -> ListenService:
    entry = server.mcp._mcp_server.get_request_handler("subscriptions/listen")
    assert entry is not None and isinstance(entry.handler, ListenService)
    return entry.handler


@contextlib.asynccontextmanager
async def small_buffers_served(gw: Any) -> AsyncIterator[tuple[NexusServer, str]]:
    """``served``, on a listening socket whose accepted connections get a small send
    buffer (the kernel's autotuning would otherwise absorb megabytes of an unread
    stream before the gateway's own backlog is reached)."""
    settings = load_settings(gw.config_file, {"workspace": gw.workspace, "data_dir": gw.data_dir})
    server = build_server(settings, audit_sinks=[gw.audit], config_file=gw.config_file)
    app = server.mcp.http_app(**http_options(server.runtime.settings))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    http = uvicorn.Server(uvicorn.Config(app, log_config=None, log_level="warning"))
    task = asyncio.create_task(http.serve(sockets=[sock]))
    try:
        deadline = time.monotonic() + 10
        while not http.started:
            assert not task.done() and time.monotonic() < deadline, "uvicorn did not start"
            await asyncio.sleep(0.01)
        yield server, f"http://127.0.0.1:{sock.getsockname()[1]}{settings.http_path}"
    finally:
        http.should_exit = True
        await asyncio.wait_for(task, timeout=10)
        server.close()
        sock.close()


def unread_listen(url: str, bearer: str, uris: list[str]) -> socket.socket:
    """A ``subscriptions/listen`` request on a raw socket that is then never read."""
    parts = urlsplit(url)
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "subscriptions/listen",
            "params": {"notifications": {"resourceSubscriptions": uris}, "_meta": meta},
        }
    ).encode()
    head = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Authorization: Bearer {bearer}\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\n"
        f"MCP-Protocol-Version: {MODERN}\r\nMcp-Method: subscriptions/listen\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
    assert parts.hostname is not None and parts.port is not None
    sock.connect((parts.hostname, parts.port))
    sock.sendall(head + body)
    return sock


async def test_a_client_that_stops_reading_loses_its_stream_and_everything_it_held(
    tmp_path: Path,
) -> None:
    gw = subscribing_gateway(tmp_path)
    async with small_buffers_served(gw) as (server, url):
        service = service_of(server)
        service.max_buffered = 8  # the backlog a few touches fill (256 by default)
        assert service.subscriptions is not None
        relay = service.subscriptions.relay
        sock = unread_listen(url, token("alice", role="admin"), [f"upstream://up/{ITEM}"])
        try:
            async with http_caller(url, "bob", "editor") as bob:
                await poll(lambda: relay.count() == 1)
                stream = next(iter(service._open))
                for _ in range(30):
                    if stream.overflowed:
                        break
                    touches = (bob.call_tool("up_touch", {"uri": ITEM}) for _ in range(10))
                    await asyncio.gather(*touches)
                assert stream.overflowed
                # Ended, though its last send is never read: the slot, the subject's
                # count and the upstream subscription are released.
                await poll(lambda: service.open_streams() == 0, seconds=10)
                assert dict(service._per_subject) == {}
                assert relay.count() == 0
        finally:
            sock.close()


async def test_a_token_without_a_principal_holds_no_stream(tmp_path: Path) -> None:
    gw = http_gateway(tmp_path)
    async with served(gw) as (server, url):
        service = service_of(server)
        now = int(time.time())
        claims = {"aud": AUDIENCE, "iat": now, "exp": now + 600, "role": "admin"}  # no sub
        nobody = jwt.encode(claims, SECRET, algorithm="HS256")
        async with Client(url, auth=nobody, verify=TLS) as client:
            for _ in range(3):
                async with listening(client, tools_list_changed=True) as events:
                    assert events.sub.honored.tools_list_changed is None
                    # Nothing can ever reach it: it ends at once, gracefully.
                    deadline = time.monotonic() + 10
                    while events.ended is None:
                        assert time.monotonic() < deadline, "a stream for no one stayed open"
                        await asyncio.sleep(0.05)
                    assert events.ended == "graceful"
            assert service.open_streams() == 0
    opened = gw.events("listen_opened")
    assert [(e.get("subject"), e["facts"]["kinds"]) for e in opened] == [(None, [])] * 3


async def test_a_template_is_no_way_around_a_quarantined_resource_for_a_subscription(
    tmp_path: Path,
) -> None:
    record = tmp_path / "record.jsonl"
    gw = subscribing_gateway(tmp_path, http=False, record=record)
    config = yaml.safe_load(gw.config_file.read_text())
    config["upstreams"][0]["args"] += ["--item-variant", "evil"]  # quarantines items/secret
    gw.config_file.write_text(yaml.safe_dump(config))
    server = gw.build()
    secret = "upstream://up/test://items/secret"
    query = "upstream://up/test://items/5?admin=true"
    plain = "upstream://up/test://items/5"
    async with Client(server.mcp) as client:
        async with listening(client, resource_subscriptions=[secret, query, plain]) as events:
            assert events.sub.honored.resource_subscriptions == [plain]
            await client.call_tool("up_touch", {"uri": "test://items/secret"})
            await asyncio.sleep(0.5)
            assert isinstance(events, Events) and events.seen == []
    async with Client(server.mcp, mode="legacy") as legacy:
        refusals = []
        for uri in (secret, query, "upstream://up/test://nothing/here"):
            with pytest.raises(MCPError) as refused:
                await subscribe(legacy, uri)
            refusals.append(str(refused.value))
        assert len(set(refusals)) == 1  # answered exactly like an unknown resource
    sent = [json.dumps(r) for r in read_record(record) if r.get("method") == "resources/subscribe"]
    assert sent and not any("secret" in line or "admin" in line for line in sent)


async def test_without_an_upstream_no_resource_subscription_is_announced(
    tmp_path: Path,
) -> None:
    bare = make_gateway(tmp_path / "bare", []).build()
    caps = bare.mcp._mcp_server.get_capabilities(protocol_version=MODERN)
    assert caps.resources is not None and not caps.resources.subscribe
    assert caps.resources.list_changed and caps.tools is not None and caps.tools.list_changed
    async with Client(bare.mcp) as client:
        assert client.protocol_version == MODERN
        async with listening(client, resource_subscriptions=[README]) as events:
            assert events.sub.honored.resource_subscriptions is None
    async with Client(bare.mcp, mode="legacy") as legacy:
        announced = legacy.initialize_result.capabilities.resources
        assert announced is not None and not announced.subscribe
    # With an upstream that supports them, both eras announce them.
    gw = subscribing_gateway(tmp_path, http=False)
    caps = gw.build().mcp._mcp_server.get_capabilities(protocol_version=MODERN)
    assert caps.resources is not None and caps.resources.subscribe


async def test_a_stream_the_notifier_forgets_to_make_room_ends_instead_of_going_deaf(
    tmp_path: Path,
) -> None:
    """The notifier keeps at most ``MAX_SESSIONS`` connections and listen streams, the
    oldest forgotten first: a forgotten stream would stay acknowledged and never be told
    again, so it ends and its client listens again."""
    gw = gateway(tmp_path)
    server = gw.build()
    notifier = server.runtime.notifier
    assert notifier is not None
    notifier.max_sessions = 1  # the room a flood of handshake-era sessions would take
    async with Client(server.mcp) as modern:
        async with listening(modern, tools_list_changed=True) as events:
            assert notifier.live() == 1
            async with Client(server.mcp, mode="legacy") as legacy:
                await legacy.list_tools()  # tracked: the stream is forgotten for it
                deadline = time.monotonic() + 10
                while events.ended is None:
                    assert time.monotonic() < deadline, "a forgotten stream stayed open"
                    await asyncio.sleep(0.05)
                assert events.ended == "graceful"
        assert service_of(server).open_streams() == 0
