"""Change notifications (issue 27): each connected caller is told when, and only when, the
tools, prompts or resources *it* may see change, and nothing else.

The upstream is the recording test server (``tests/support/upstream_server.py``) as a real
stdio subprocess behind a gateway built the normal way; callers are FastMCP clients on the
handshake era (a lasting session the server may speak on), each collecting what the
server sends it. Two callers with different grants are two principals over HTTP with
bearer tokens.
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
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    EmptyResult,
    SubscribeRequest,
    SubscribeRequestParams,
    UnsubscribeRequest,
    UnsubscribeRequestParams,
)

from nexus_mcp.cli import main as cli_main
from nexus_mcp.policy.grants import grant_tool
from nexus_mcp.server import NexusServer
from nexus_mcp.server.runtime import grants_changed
from nexus_mcp.settings import load_settings

from .access_helpers import AUDIENCE, SECRET, TLS, serve_settings, token
from .servers import server_env
from .upstream_harness import (
    UP_TOOLS,
    Gateway,
    all_up_tools,
    make_gateway,
    poll,
    read_record,
    stdio_upstream,
)

GRANTS: dict[str, Any] = {"resources": ["up"], "prompts": ["up_greet", "up_review"]}
QUIET_SECONDS = 1.0  # how long a caller owed nothing is watched (debounce is 0.15 s)
TOOLS = "notifications/tools/list_changed"
PROMPTS = "notifications/prompts/list_changed"
RESOURCES = "notifications/resources/list_changed"


class Inbox:
    """What the server sent one client, in order (methods only: they carry nothing)."""

    def __init__(self) -> None:
        self.methods: list[str] = []
        self.params: list[Any] = []

    async def __call__(self, message: Any) -> None:
        method = getattr(message, "method", None)
        if isinstance(method, str) and method.startswith("notifications/"):
            self.methods.append(method)
            self.params.append(getattr(message, "params", None))

    async def wait_for(self, method: str, count: int = 1, seconds: float = 15.0) -> None:
        deadline = time.monotonic() + seconds
        while self.methods.count(method) < count:
            assert time.monotonic() < deadline, f"{method} x{count} not received: {self.methods}"
            await asyncio.sleep(0.02)


def gateway(tmp_path: Path, **kwargs: Any) -> Gateway:
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream()],
        grant={"full": all_up_tools()},
        grant_items={"full": GRANTS},
        **kwargs,
    )
    assert gw.pin("up") == 0
    return gw


async def test_a_quarantined_tool_is_told_as_a_tool_list_change_only(tmp_path: Path) -> None:
    gw = gateway(tmp_path)
    server = gw.build()
    inbox = Inbox()
    async with Client(server.mcp, mode="legacy", message_handler=inbox) as client:
        caps = client.initialize_result.capabilities
        assert caps.tools.list_changed and caps.prompts.list_changed
        assert caps.resources.list_changed
        assert "up_echo" in {t.name for t in await client.list_tools()}
        await client.call_tool("up_mutate", {})
        await inbox.wait_for(TOOLS)
        assert "up_echo" not in {t.name for t in await client.list_tools()}
        await asyncio.sleep(QUIET_SECONDS)
        assert inbox.methods == [TOOLS]
        assert inbox.params == [None]


# --- two principals on one server (HTTP, bearer tokens) ---------------------------------

BOB_TOOLS = ["up_add", "up_mutate", "up_mutate_prompt"]  # never up_echo


def http_gateway(tmp_path: Path) -> Gateway:
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream()],
        grant={"full": all_up_tools(), "coding": BOB_TOOLS},
        grant_items={"full": GRANTS, "coding": {"prompts": ["up_review"]}},
        extra={
            "transport": "http",
            "port": 0,
            "auth": {"jwt_secret": SECRET, "audience": AUDIENCE},
        },
    )
    assert gw.pin("up") == 0
    return gw


def caller(url: str, subject: str, role: str, inbox: Inbox) -> Client[Any]:
    return Client(
        url, auth=token(subject, role=role), mode="legacy", verify=TLS, message_handler=inbox
    )


@contextlib.asynccontextmanager
async def served(gw: Gateway) -> AsyncIterator[tuple[NexusServer, str]]:
    settings = load_settings(gw.config_file, {"workspace": gw.workspace, "data_dir": gw.data_dir})
    async with serve_settings(settings, gw.audit, config_file=gw.config_file) as pair:
        yield pair


async def test_a_quarantine_and_its_re_pin_are_told_only_to_the_caller_who_sees_the_tool(
    tmp_path: Path,
) -> None:
    gw = http_gateway(tmp_path)
    alice_box, bob_box = Inbox(), Inbox()
    async with served(gw) as (_server, url):
        async with (
            caller(url, "alice", "admin", alice_box) as alice,
            caller(url, "bob", "editor", bob_box) as bob,
        ):
            assert "up_echo" in {t.name for t in await alice.list_tools()}
            bob_tools = {t.name for t in await bob.list_tools()}
            assert "up_echo" not in bob_tools and "up_add" in bob_tools
            await alice.call_tool("up_mutate", {})
            await alice_box.wait_for(TOOLS)
            assert "up_echo" not in {t.name for t in await alice.list_tools()}
            # The approver looks and pins echo again: it comes back, and alice is told.
            assert gw.pin("up", "echo") == 0
            await alice_box.wait_for(TOOLS, 2)
            await asyncio.sleep(QUIET_SECONDS)
            assert bob_box.methods == []
            assert set(alice_box.methods) == {TOOLS}


async def test_a_grant_change_is_told_to_its_subject_only(tmp_path: Path) -> None:
    gw = http_gateway(tmp_path)
    alice_box, bob_box = Inbox(), Inbox()
    async with served(gw) as (server, url):
        db = str(server.runtime.grants.path)
        async with (
            caller(url, "alice", "admin", alice_box) as alice,
            caller(url, "bob", "editor", bob_box) as bob,
        ):
            await alice.list_tools()
            assert "up_whoami" not in {t.name for t in await bob.list_tools()}
            # Another process (the operator's CLI) writes the grants store.
            await asyncio.to_thread(
                cli_main,
                ["profiles", "grant", "bob", "up_whoami", "--db", db, "--allow-unknown-tool"],
            )
            await bob_box.wait_for(TOOLS)
            assert "up_whoami" in {t.name for t in await bob.list_tools()}
            await asyncio.to_thread(
                cli_main,
                [
                    "profiles",
                    "grant",
                    "bob",
                    "--prompt",
                    "up_greet",
                    "--db",
                    db,
                    "--allow-unknown-tool",
                ],
            )
            await bob_box.wait_for(PROMPTS)
            assert "up_greet" in {p.name for p in await bob.list_prompts()}
            await asyncio.sleep(QUIET_SECONDS)
            assert alice_box.methods == []
            assert bob_box.methods == [TOOLS, PROMPTS]


# --- bursts are coalesced; what did not change is not told -----------------------------


async def test_a_burst_of_changes_is_one_notification(tmp_path: Path) -> None:
    gw = gateway(tmp_path)
    server = gw.build()
    runtime = server.runtime
    notifier = runtime.notifier
    assert notifier is not None
    inbox = Inbox()
    async with Client(server.mcp, mode="legacy", message_handler=inbox) as client:
        before = {t.name for t in await client.list_tools()}
        # Twenty list_changed from the upstream at once (each mutate says it): echo is
        # quarantined by the first; the caller is told once.
        await asyncio.gather(*(client.call_tool("up_mutate", {}) for _ in range(20)))
        await inbox.wait_for(TOOLS)
        await asyncio.sleep(QUIET_SECONDS)  # the upstream's listings settle
        # Ten grant changes through this server (as the console makes them), in a burst.
        zone = runtime.settings.profiles.zone
        rounds = notifier.rounds
        for name in ("nexus_grep", "up_whoami", "up_count_writes"):
            grant_tool(runtime.grants, "alice", name, zone)
        for _ in range(10):
            grants_changed(runtime, zone)
        await asyncio.sleep(QUIET_SECONDS)
        # One round for the burst (and at most one more: the embedded store's revision
        # moved, which the notifier's own poll sees as well).
        assert notifier.rounds - rounds <= 2
        after = {t.name for t in await client.list_tools()}
        assert "up_echo" in before and "up_echo" not in after
        # The grants gave alice (admin: the full profile) nothing new: nothing is told.
        assert inbox.methods == [TOOLS]


async def test_a_changed_prompt_is_told_as_a_prompt_list_change(tmp_path: Path) -> None:
    gw = gateway(tmp_path)
    server = gw.build()
    inbox = Inbox()
    async with Client(server.mcp, mode="legacy", message_handler=inbox) as client:
        assert "up_greet" in {p.name for p in await client.list_prompts()}
        await client.call_tool("up_mutate_prompt", {})
        await inbox.wait_for(PROMPTS)
        assert "up_greet" not in {p.name for p in await client.list_prompts()}
        await asyncio.sleep(QUIET_SECONDS)
        assert inbox.methods == [PROMPTS]


async def test_a_modern_era_client_is_not_tracked_and_told_nothing_unless_it_listens(
    tmp_path: Path,
) -> None:
    """2026-07-28 has no lasting session: its requests are not tracked, and changes reach
    such a client only through a ``subscriptions/listen`` stream (``test_listen.py``),
    which the server announces."""
    gw = gateway(tmp_path)
    server = gw.build()
    inbox = Inbox()
    notifier = server.runtime.notifier
    assert notifier is not None
    async with Client(server.mcp, message_handler=inbox) as client:
        await client.list_tools()
        assert notifier.live() == 0
        await client.call_tool("up_mutate", {})
        await asyncio.sleep(QUIET_SECONDS)
        assert inbox.methods == []
    caps = server.mcp._mcp_server.get_capabilities(protocol_version="2026-07-28")
    assert caps.tools is not None and caps.tools.list_changed


# --- resource subscriptions, relayed per caller -----------------------------------------

README = "upstream://up/test://static/readme"
BLOB = "upstream://up/test://static/blob"
UPDATED = "notifications/resources/updated"


async def subscribe(client: Client[Any], uri: str, *, unsubscribe: bool = False) -> None:
    """``resources/subscribe`` (or ``/unsubscribe``) as a handshake-era client sends it."""
    if unsubscribe:
        request: Any = UnsubscribeRequest(params=UnsubscribeRequestParams(uri=uri))
    else:
        request = SubscribeRequest(params=SubscribeRequestParams(uri=uri))
    await client.session.send_request(request, EmptyResult)


def subscribing_gateway(
    tmp_path: Path, *, http: bool = True, record: Path | None = None
) -> Gateway:
    """Alice (full) may read the upstream's resources; bob (coding) may not. Over HTTP the
    upstream is ``shared``: one session for every caller, whose updates still reach only
    those who subscribed."""
    upstream = stdio_upstream(record=record, **({"shared": True} if http else {}))
    upstream["args"] = [*upstream["args"], "--subscribe"]
    auth = {"jwt_secret": SECRET, "audience": AUDIENCE}
    gw = make_gateway(
        tmp_path / "gw",
        [upstream],
        registries={"up": {**UP_TOOLS, "touch": "read"}},
        grant={"full": [*all_up_tools(), "up_touch"], "coding": [*BOB_TOOLS, "up_touch"]},
        grant_items={"full": GRANTS},
        extra={"transport": "http", "port": 0, "auth": auth} if http else None,
    )
    assert gw.pin("up") == 0
    return gw


async def test_a_subscription_is_relayed_to_its_subscriber_only(tmp_path: Path) -> None:
    gw = subscribing_gateway(tmp_path)
    alice_box, bob_box = Inbox(), Inbox()
    async with served(gw) as (_server, url):
        async with (
            caller(url, "alice", "admin", alice_box) as alice,
            caller(url, "bob", "editor", bob_box) as bob,
        ):
            caps = alice.initialize_result.capabilities
            assert caps.resources is not None and caps.resources.subscribe
            await subscribe(alice, README)
            # Bob may not read the upstream's resources: hidden answers as unknown.
            with pytest.raises(MCPError) as hidden:
                await subscribe(bob, README)
            with pytest.raises(MCPError) as unknown:
                await subscribe(alice, "upstream://up/test://static/nothing")
            assert (hidden.value.error.code, hidden.value.error.message) == (
                unknown.value.error.code,
                unknown.value.error.message,
            )
            # The upstream's update of what alice subscribed to reaches alice, under the
            # exposed URI; an update of what nobody subscribed to reaches no one.
            await bob.call_tool("up_touch", {"uri": "test://static/readme"})
            await bob.call_tool("up_touch", {"uri": "test://static/blob"})
            await alice_box.wait_for(UPDATED)
            assert alice_box.params[alice_box.methods.index(UPDATED)].uri == README
            await subscribe(alice, unsubscribe=True, uri=README)
            await bob.call_tool("up_touch", {"uri": "test://static/readme"})
            await asyncio.sleep(QUIET_SECONDS)
            assert alice_box.methods.count(UPDATED) == 1
            assert bob_box.methods == []
    blocked = gw.events("resource_subscribe_blocked")
    assert {e["reason"] for e in blocked} == {"not_granted", "unknown_resource"}
    assert all("readme" not in json.dumps(e) for e in blocked)
    assert [e["subject"] for e in gw.events("resource_subscribed")] == ["alice"]


async def test_a_revoked_reader_is_relayed_nothing_and_a_closed_caller_unsubscribes(
    tmp_path: Path,
) -> None:
    record = tmp_path / "record.jsonl"
    gw = subscribing_gateway(tmp_path, http=False, record=record)
    server = gw.build()
    runtime = server.runtime
    zone = runtime.settings.profiles.zone
    inbox = Inbox()
    async with Client(server.mcp, mode="legacy", message_handler=inbox) as client:
        await subscribe(client, README)
        await subscribe(client, "upstream://up/test://items/7")  # through the template
        await client.call_tool("up_touch", {"uri": "test://items/7"})
        await inbox.wait_for(UPDATED)
        assert inbox.params[inbox.methods.index(UPDATED)].uri == "upstream://up/test://items/7"
        # The operator moves alice to a profile without the upstream's resources: what
        # she subscribed to is hidden now, and its updates are relayed to no one.
        runtime.grants.set_assignment("alice", "coding", zone)
        grants_changed(runtime, zone)
        await inbox.wait_for(RESOURCES)
        await client.call_tool("up_touch", {"uri": "test://static/readme"})
        await asyncio.sleep(QUIET_SECONDS)
        assert inbox.methods.count(UPDATED) == 1
        notifier = runtime.notifier
        assert notifier is not None and notifier.live() == 1
    # The caller is gone: the notifier forgot it, the upstream was unsubscribed.
    assert notifier.live() == 0

    def unsubscribed() -> bool:
        return sum(r.get("method") == "resources/unsubscribe" for r in read_record(record)) == 2

    await poll(unsubscribed)


async def test_over_a_real_stdio_server_the_caller_is_told(tmp_path: Path) -> None:
    gw = gateway(tmp_path)
    inbox = Inbox()
    command = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nexus_mcp", "serve", "--transport", "stdio", "--config",
              str(gw.config_file), "--workspace", str(gw.workspace), "--data-dir",
              str(gw.data_dir)],
        env=server_env(),
    )  # fmt: skip
    with (tmp_path / "stderr.log").open("w") as errlog:
        async with stdio_client(command, errlog=errlog) as (read, write):
            async with ClientSession(read, write, message_handler=inbox) as session:
                init = await session.initialize()
                assert init.capabilities.tools is not None
                assert init.capabilities.tools.list_changed
                assert "up_echo" in {t.name for t in (await session.list_tools()).tools}
                await session.call_tool("up_mutate", {})
                await inbox.wait_for(TOOLS)
                assert "up_echo" not in {t.name for t in (await session.list_tools()).tools}
                await asyncio.sleep(QUIET_SECONDS)
                assert inbox.methods == [TOOLS]


async def test_the_registry_is_bounded_and_the_oldest_caller_is_forgotten(
    tmp_path: Path,
) -> None:
    gw = make_gateway(tmp_path / "gw", [])
    server = gw.build()
    runtime = server.runtime
    notifier = runtime.notifier
    assert notifier is not None
    notifier.max_sessions = 2
    zone = runtime.settings.profiles.zone
    boxes = [Inbox(), Inbox(), Inbox()]
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for box in boxes:
            client = Client(server.mcp, mode="legacy", message_handler=box)
            clients.append(await stack.enter_async_context(client))
            await client.list_tools()
        assert notifier.live() == 2
        # The operator moves alice (admin: the full profile) to minimal: fewer tools.
        runtime.grants.set_assignment("alice", "minimal", zone)
        grants_changed(runtime, zone)
        await boxes[2].wait_for(TOOLS)
        await boxes[1].wait_for(TOOLS)
        await asyncio.sleep(QUIET_SECONDS)
        assert boxes[0].methods == []  # forgotten: the oldest, at the bound
        # A forgotten caller is tracked again on its next request.
        await clients[0].list_tools()
        assert notifier.live() == 2
