"""``subscriptions/listen`` (issue 27): a 2026-07-28-era client, which has no lasting
session, is told the list changes and resource updates of what *it* may see through the
stream it opens, and nothing else.

The upstream is the recording test server as a real stdio subprocess behind a gateway
built the normal way; the clients are FastMCP clients on the 2026-07-28 era (their
default), driven by the MCP SDK's own ``listen`` (``mcp.client.subscriptions``), in
memory and over a real HTTP socket with two principals' bearer tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from mcp.client.subscriptions import Subscription, SubscriptionLost, listen
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

from nexus_mcp.cli import main as cli_main
from nexus_mcp.server.listen import MAX_STREAMS_PER_SUBJECT

from .access_helpers import TLS, token
from .servers import server_env
from .test_change_notifications import (
    BLOB,
    QUIET_SECONDS,
    README,
    gateway,
    http_gateway,
    served,
    subscribing_gateway,
)
from .upstream_harness import poll, read_record

MODERN = "2026-07-28"
NOTHING = "upstream://up/test://static/nothing"


class Events:
    """What one listen stream delivered, collected by a task of its own."""

    def __init__(self, sub: Subscription) -> None:
        self.sub = sub
        self.seen: list[ServerEvent] = []
        self.ended: str | None = None
        self._task = asyncio.ensure_future(self._collect())

    async def _collect(self) -> None:
        try:
            async for event in self.sub:
                self.seen.append(event)
            self.ended = "graceful"
        except SubscriptionLost:
            self.ended = "lost"

    async def wait_for(self, event: ServerEvent, count: int = 1, seconds: float = 15.0) -> None:
        deadline = time.monotonic() + seconds
        while self.seen.count(event) < count:
            assert time.monotonic() < deadline, f"{event} x{count} not received: {self.seen}"
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@contextlib.asynccontextmanager
async def listening(client: Client[Any], **filters: Any) -> AsyncIterator[Events]:
    async with listen(client.session, **filters) as sub:
        events = Events(sub)
        try:
            yield events
        finally:
            await events.stop()


def http_caller(url: str, subject: str, role: str, **claims: Any) -> Client[Any]:
    return Client(url, auth=token(subject, role=role, **claims), verify=TLS)


async def test_a_modern_client_is_told_through_its_listen_stream(tmp_path: Path) -> None:
    gw = gateway(tmp_path)
    server = gw.build()
    async with Client(server.mcp) as client:
        assert client.protocol_version == MODERN
        caps = server.mcp._mcp_server.get_capabilities(protocol_version=MODERN)
        assert caps.tools is not None and caps.tools.list_changed
        assert caps.prompts is not None and caps.prompts.list_changed
        # Only tool changes asked for: a prompt change is not delivered.
        async with listening(client, tools_list_changed=True) as events:
            assert events.sub.honored.tools_list_changed is True
            assert events.sub.honored.prompts_list_changed is None
            assert "up_echo" in {t.name for t in await client.list_tools()}
            await client.call_tool("up_mutate_prompt", {})
            await client.call_tool("up_mutate", {})
            await events.wait_for(ToolsListChanged())
            assert "up_echo" not in {t.name for t in await client.list_tools()}
            await asyncio.sleep(QUIET_SECONDS)
            assert events.seen == [ToolsListChanged()]
        # Closed: the stream's registration is gone.
        notifier = server.runtime.notifier
        assert notifier is not None
        await poll(lambda: notifier.live() == 0)


async def test_each_principal_is_told_only_what_it_may_see(tmp_path: Path) -> None:
    gw = http_gateway(tmp_path)
    kinds = {"tools_list_changed": True, "prompts_list_changed": True}
    async with served(gw) as (server, url):
        db = str(server.runtime.grants.path)
        async with (
            http_caller(url, "alice", "admin") as alice,
            http_caller(url, "bob", "editor") as bob,
            listening(alice, **kinds) as alice_events,
            listening(bob, **kinds) as bob_events,
        ):
            assert alice.protocol_version == MODERN
            # Echo is alice's only: its quarantine is told to alice, not bob.
            await bob.call_tool("up_mutate", {})
            await alice_events.wait_for(ToolsListChanged())
            # A grant to bob (another process writes the store) is told to bob only.
            await asyncio.to_thread(
                cli_main,
                ["profiles", "grant", "bob", "up_whoami", "--db", db, "--allow-unknown-tool"],
            )
            await bob_events.wait_for(ToolsListChanged())
            assert "up_whoami" in {t.name for t in await bob.list_tools()}
            await asyncio.sleep(QUIET_SECONDS)
            assert alice_events.seen == [ToolsListChanged()]
            assert bob_events.seen == [ToolsListChanged()]
    opened = gw.events("listen_opened")
    assert sorted(e["subject"] for e in opened) == ["alice", "bob"]
    assert all(
        e["facts"]["kinds"] == ["prompts_list_changed", "tools_list_changed"] for e in opened
    )


async def test_resource_subscriptions_are_honored_only_where_the_caller_may_read(
    tmp_path: Path,
) -> None:
    gw = subscribing_gateway(tmp_path)
    hidden_or_unknown = [README, NOTHING]
    async with served(gw) as (_server, url):
        async with (
            http_caller(url, "alice", "admin") as alice,
            http_caller(url, "bob", "editor") as bob,
            listening(alice, resource_subscriptions=[README, README, NOTHING]) as alice_events,
            listening(bob, resource_subscriptions=hidden_or_unknown) as bob_events,
        ):
            assert alice_events.sub.honored.resource_subscriptions == [README]
            # Bob may not read the upstream's resources: hidden is left out as unknown is.
            assert bob_events.sub.honored.resource_subscriptions is None
            # The update of what alice subscribed to reaches her under the exposed URI;
            # an update of what nobody subscribed to reaches no one.
            await bob.call_tool("up_touch", {"uri": "test://static/blob"})
            await bob.call_tool("up_touch", {"uri": "test://static/readme"})
            await alice_events.wait_for(ResourceUpdated(uri=README))
            await asyncio.sleep(QUIET_SECONDS)
            assert alice_events.seen == [ResourceUpdated(uri=README)]
            assert bob_events.seen == []
            assert BLOB not in json.dumps([str(e) for e in alice_events.seen])
    blocked = gw.events("resource_subscribe_blocked")
    # Bob's two (hidden and unknown alike: not granted), alice's unknown one.
    assert sorted((e["subject"], e["reason"]) for e in blocked) == [
        ("alice", "unknown_resource"),
        ("bob", "not_granted"),
        ("bob", "not_granted"),
    ]
    assert all("readme" not in json.dumps(e) for e in gw.events("listen_opened"))


async def test_a_closed_stream_unsubscribes_and_is_forgotten(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    gw = subscribing_gateway(tmp_path, http=False, record=record)
    server = gw.build()
    notifier = server.runtime.notifier
    assert notifier is not None
    async with Client(server.mcp) as client:
        async with listening(
            client, tools_list_changed=True, resource_subscriptions=[README]
        ) as events:
            assert events.sub.honored.resource_subscriptions == [README]
            assert notifier.live() == 1
        # The stream's end forgets it and unsubscribes the upstream.
        await poll(lambda: notifier.live() == 0)

        def unsubscribed() -> bool:
            methods = [r.get("method") for r in read_record(record)]
            return methods.count("resources/unsubscribe") == 1

        await poll(unsubscribed)


async def test_streams_per_subject_are_bounded(tmp_path: Path) -> None:
    gw = gateway(tmp_path)
    server = gw.build()
    async with Client(server.mcp) as client, contextlib.AsyncExitStack() as stack:
        for _ in range(MAX_STREAMS_PER_SUBJECT):
            await stack.enter_async_context(listening(client, tools_list_changed=True))
        with pytest.raises(MCPError) as refused:
            async with listening(client, tools_list_changed=True):
                pass
        error = refused.value.error
        assert error.code == -32050
        assert json.loads(error.message) == {
            "error": "too many open listen streams; retry later",
            "code": "RATE_LIMITED",
        }
    assert [e["reason"] for e in gw.events("listen_refused")] == ["stream_cap"]


async def test_a_stream_ends_gracefully_when_its_token_expires(tmp_path: Path) -> None:
    gw = http_gateway(tmp_path)
    async with served(gw) as (_server, url):
        soon = int(time.time()) + 3
        async with (
            http_caller(url, "alice", "admin", exp=soon) as alice,
            listening(alice, tools_list_changed=True) as events,
        ):
            deadline = time.monotonic() + 15
            while events.ended is None:
                assert time.monotonic() < deadline, "the stream outlived its token"
                await asyncio.sleep(0.1)
            assert events.ended == "graceful"


async def test_a_handshake_era_client_keeps_its_own_notifications(tmp_path: Path) -> None:
    """Serving listen changes nothing for a 2025-11-25 session: it is told on its session."""
    gw = gateway(tmp_path)
    server = gw.build()
    async with Client(server.mcp, mode="legacy") as client:
        caps = client.initialize_result.capabilities
        assert caps.tools is not None and caps.tools.list_changed
        assert client.protocol_version != MODERN


async def test_prompt_changes_reach_a_stream_that_asked_for_them(tmp_path: Path) -> None:
    gw = gateway(tmp_path)
    server = gw.build()
    async with Client(server.mcp) as client:
        async with listening(client, prompts_list_changed=True) as events:
            await client.call_tool("up_mutate_prompt", {})
            await events.wait_for(PromptsListChanged())
            await asyncio.sleep(QUIET_SECONDS)
            assert events.seen == [PromptsListChanged()]


async def test_over_a_real_stdio_server_a_listening_client_is_told(tmp_path: Path) -> None:
    gw = gateway(tmp_path)
    transport = StdioTransport(
        sys.executable,
        ["-m", "nexus_mcp", "serve", "--transport", "stdio", "--config", str(gw.config_file),
         "--workspace", str(gw.workspace), "--data-dir", str(gw.data_dir)],
        env=server_env(),
        keep_alive=False,
        log_file=tmp_path / "stderr.log",
    )  # fmt: skip
    async with Client(transport) as client:
        assert client.protocol_version == MODERN
        async with listening(client, tools_list_changed=True) as events:
            await client.call_tool("up_mutate", {})
            await events.wait_for(ToolsListChanged())
            assert "up_echo" not in {t.name for t in await client.list_tools()}
            await asyncio.sleep(QUIET_SECONDS)
            assert events.seen == [ToolsListChanged()]
