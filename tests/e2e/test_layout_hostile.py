"""Issue 23 (layout) under attack: the refactor must not change what a caller, the audit log
or a recording observes. Each test pins one behaviour of the code before the refactor
(f800fb1) that the new structure (one connector, the tool book, construction-time
dependencies) could have changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client, FastMCP

from .conftest import ServerFactory, snapshot, wire
from .hostile_harness import hostile_stdio
from .test_fail_closed import LAYER_TYPES, chain_of
from .upstream_harness import Gateway, make_gateway

CLASSES = {"echo": "read", "add": "read"}
WRITE_ARGS = {"path": "layout.txt", "content": "CANARY-LAYOUT-91c"}


def _gateway(tmp_path: Path, upstreams: list[dict[str, Any]]) -> Gateway:
    registries = {u["server_id"]: CLASSES for u in upstreams}
    return make_gateway(
        tmp_path / "gw", upstreams, registries=registries, grant={"full": ["h_echo", "h_add"]}
    )


def _pin(gw: Gateway) -> None:
    from .upstream_harness import run_cli

    assert run_cli(["upstream", "pin", "h", "--yes", "--config", str(gw.config_file)]) == 0


@pytest.mark.slow
async def test_a_damaged_lock_file_is_audited_once_per_start(tmp_path: Path) -> None:
    """Before the refactor the upstream's audit log was bound after construction, so the
    lock file's problems found while constructing were only logged, and audited once when
    the upstream started. The gateway now gets the audit log at construction: the event
    must still be written once, not once at build and again at start."""
    gw = _gateway(tmp_path, [hostile_stdio("h", "plain", tmp_path / "r.jsonl")])
    _pin(gw)
    lock = gw.registry_dir / "h.lock.json"
    document = json.loads(lock.read_text())
    document["tools"]["add"]["sha256"] = "Z" * 64
    lock.write_text(json.dumps(document))
    server = gw.build()
    assert gw.events("upstream_pins_invalid") == []  # built, not started: nothing yet
    async with Client(server.mcp) as client:
        await client.list_tools()
    assert len(gw.events("upstream_pins_invalid")) == 1


# -- the unknown-tool answer, wherever it is given (envelope.unknown_tool) ----------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize(
    "kept",
    [
        # Only the connector: no call state at all.
        (),
        # The envelope and the audit open and record the call, no identity: the connector
        # (not a layer) is the one that must refuse.
        ("envelope", "audit"),
    ],
    ids=["connector-alone", "no-identity"],
)
async def test_the_connector_refuses_as_fastmcp_answers_a_missing_tool(
    make_server: ServerFactory, workspace: Path, mode: str, kept: tuple[str, ...]
) -> None:
    """The connector's fail-closed answer is byte for byte FastMCP's own for a tool that
    does not exist (never a masked internal error that would tell the tool exists)."""
    bare: FastMCP[Any] = FastMCP("nexus", version="0.1.0")
    async with Client(bare, mode=mode) as client:
        expected = wire(await client.call_tool_mcp("nexus_write_file", dict(WRITE_ARGS)))
    server = make_server(read_only=False)
    before = snapshot(workspace)
    chain = chain_of(server)
    chain.replace_layers(
        [m for m in chain.layers if any(isinstance(m, LAYER_TYPES[s]) for s in kept)]
    )
    async with Client(server.mcp, mode=mode) as client:
        actual = wire(await client.call_tool_mcp("nexus_write_file", dict(WRITE_ARGS)))
    assert actual == expected
    assert snapshot(workspace) == before


# -- start-up order: a refused upstream configuration touches nothing --------------------


def test_a_refused_upstream_configuration_opens_no_state(tmp_path: Path) -> None:
    """Before the refactor the gateway was built (its configuration checked, its secrets
    resolved) before the data directory, the state stores and the audit log were opened:
    a configuration refused for its upstreams left nothing behind and named that problem,
    not a store's. The gateway now takes the state's quarantine evidence, so it could be
    built after them."""
    gw = _gateway(tmp_path, [hostile_stdio("h", "plain", tmp_path / "r.jsonl")])
    (gw.registry_dir / "h.json").unlink()  # prod: every upstream tool would be unclassified
    from nexus_mcp.errors import ConfigError
    from nexus_mcp.settings import load_settings

    settings = load_settings(gw.config_file, {"workspace": gw.workspace, "data_dir": gw.data_dir})
    from nexus_mcp.server import build_server

    with pytest.raises(ConfigError, match="no registry file"):
        build_server(settings, config_file=gw.config_file)
    assert not gw.data_dir.exists()


# -- a replayed tool behind a chain missing layers ----------------------------------------


@pytest.mark.parametrize(
    "kept", [(), ("envelope", "audit")], ids=["connector-alone", "no-identity"]
)
async def test_a_replayed_tool_without_the_chain_answers_as_a_missing_one(
    tmp_path: Path, kept: tuple[str, ...]
) -> None:
    """A replay runs through the same connector: reached without the call state (or its
    principal) it gives the unknown-tool answer, never the recorded content."""
    from nexus_mcp.observability.audit import MemoryAuditSink
    from nexus_mcp.server import build_server
    from nexus_mcp.settings import Settings

    canary = "CANARY-REPLAY-LAYOUT-5d1"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "private.txt").write_text(canary)
    fixtures = tmp_path / "fixtures"
    args = {"path": "private.txt"}
    live = build_server(
        Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "d1", record=fixtures),
        audit_sinks=[MemoryAuditSink()],
    )
    try:
        async with Client(live.mcp) as client:
            recorded = wire(await client.call_tool_mcp("nexus_read_file", args))
    finally:
        live.close()
    assert canary in json.dumps(recorded)  # the recording holds it
    bare: FastMCP[Any] = FastMCP("nexus", version="0.1.0")
    async with Client(bare) as client:
        expected = wire(await client.call_tool_mcp("nexus_read_file", args))
    replay = build_server(
        Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "d2", replay=fixtures),
        audit_sinks=[MemoryAuditSink()],
    )
    try:
        async with Client(replay.mcp) as client:  # the whole chain: the recorded answer
            assert canary in json.dumps(wire(await client.call_tool_mcp("nexus_read_file", args)))
        chain = chain_of(replay)
        chain.replace_layers(
            [m for m in chain.layers if any(isinstance(m, LAYER_TYPES[s]) for s in kept)]
        )
        async with Client(replay.mcp) as client:
            actual = wire(await client.call_tool_mcp("nexus_read_file", args))
    finally:
        replay.close()
    assert actual == expected


# -- a connector check that fails with something that is not a refusal --------------------


class _Broken:
    """A connector check that crashes (not a typed refusal) before or after the tool."""

    def __init__(self, when: str) -> None:
        self.when = when

    def before(self, contract: Any, state: Any, arguments: Any) -> None:
        if self.when == "before":
            raise RuntimeError("CANARY-CHECK-CRASH")

    def after(self, contract: Any, state: Any, structured: Any) -> None:
        if self.when == "after":
            raise RuntimeError("CANARY-CHECK-CRASH")


def _checks_of(server: Any) -> list[Any]:
    runtime = server.runtime
    connector = getattr(runtime, "connector", None)
    checks: list[Any] = connector.checks if connector is not None else runtime.connector_checks
    return checks


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_crashing_connector_check_is_an_internal_error_recorded_as_live(
    tmp_path: Path, when: str
) -> None:
    """What the caller, the audit and the recording see when a connector check raises a
    plain exception: as before the refactor, an INTERNAL_ERROR envelope (never the text),
    the audit's outcome, and a recorded line only for a call that reached the tool."""
    from nexus_mcp.observability.audit import MemoryAuditSink
    from nexus_mcp.server import build_server
    from nexus_mcp.settings import Settings

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("hello")
    fixtures = tmp_path / "fixtures"
    audit = MemoryAuditSink()
    server = build_server(
        Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "d", record=fixtures),
        audit_sinks=[audit],
    )
    try:
        _checks_of(server).append(_Broken(when))
        async with Client(server.mcp) as client:
            result = wire(await client.call_tool_mcp("nexus_read_file", {"path": "a.txt"}))
    finally:
        server.close()
    text = json.dumps(result)
    assert "CANARY-CHECK-CRASH" not in text and "hello" not in text
    assert json.loads(result["content"][0]["text"])["code"] == "INTERNAL_ERROR"
    events = [(r["event"], r.get("outcome")) for r in audit.records()]
    calls = [
        json.loads(line)
        for line in (fixtures / "nexus.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "call"
    ]
    if when == "before":  # refused before it ran: blocked, and nothing to record
        assert events == [("tool_call_blocked", "INTERNAL_ERROR")]
        assert calls == []
    else:  # it ran: started, finished as an internal error, recorded as one
        assert events == [("tool_call_started", None), ("tool_call_finished", "INTERNAL_ERROR")]
        assert [c["error"]["code"] for c in calls] == ["INTERNAL_ERROR"]
        assert "CANARY-CHECK-CRASH" not in json.dumps(calls)


# -- the tool book as the gateway fills it (providers/upstream/gateway.publish) -----------


class _Host:
    """An upstream as the gateway and its tools see it, with the views it exposes now."""

    server_id = "h"
    max_result_bytes = 1_000_000
    connector = None

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.config = SimpleNamespace(endpoint=lambda: ("stdio", "cmd"))
        self.tools: dict[str, Any] = {}

    def expose(self, *views: Any) -> None:
        from nexus_mcp.providers.upstream.tools import UpstreamTool

        self.tools = {v.exposed_name: UpstreamTool.for_view(self, v) for v in views}  # type: ignore[arg-type]

    def visible_tools(self) -> dict[str, Any]:
        return self.tools

    def contract_for(self, view: Any) -> Any:
        from nexus_mcp.contracts import ToolContract

        return ToolContract(
            name=view.exposed_name,
            description=str(view.definition.get("description") or view.upstream_name),
            risk=view.tool_class,
            toolset="upstream:" + self.server_id,
            version=view.digest[:12],
        )


def _view(name: str, schema: dict[str, Any], digest: str) -> Any:
    from nexus_mcp.policy.pins import PinState
    from nexus_mcp.providers.upstream.tools import ToolView

    return ToolView(
        upstream_name=name,
        exposed_name="h_" + name,
        definition={"name": name, "description": f"{name} {digest}", "inputSchema": schema},
        digest=digest * 64,
        entry=None,  # unclassified: a write, as live
        pin_state=PinState.PINNED,
        status="exposed",
    )


def _bound_gateway(host: Any, book: Any, access: Any, targets: Any) -> Any:
    """An ``UpstreamGateway`` over the one stand-in upstream ``h``, bound to ``book``."""
    from nexus_mcp.providers.upstream.gateway import UpstreamGateway

    gateway = UpstreamGateway(
        config=None,  # type: ignore[arg-type]
        servers={"h": host},
        provider=None,  # type: ignore[arg-type]
        mode="prod",
        registry=None,  # type: ignore[arg-type]
    )
    gateway.bind(book, access, targets)
    return gateway


def test_the_book_follows_an_upstream_tool_republished_and_withdrawn() -> None:
    """As f800fb1's publish wrote them: a re-published tool's route, argument check and
    catalog entry are the new definition's; a withdrawn one leaves discovery only (its
    contract, route, check and idempotency target stay for a call already past the
    namespace). The idempotency target is the upstream's throughout."""
    from nexus_mcp.book import ToolBook
    from nexus_mcp.errors import InvalidInputError
    from nexus_mcp.policy.targets import ToolTargets, identify_upstream
    from nexus_mcp.principal import Principal

    class Access:
        write_tools: frozenset[str] = frozenset()

        def set_tools(self, *args: Any, **kwargs: Any) -> None:
            self.exposed = set(kwargs["upstream"])

    host, book, access = _Host(), ToolBook(), Access()
    targets = ToolTargets({}, book.toolsets)
    gateway = _bound_gateway(host, book, access, targets)
    alice = Principal(subject="alice", role="admin")
    upstream = identify_upstream("h", ("stdio", "cmd"))

    number = {"type": "object", "properties": {"n": {"type": "integer"}}}
    text = {"type": "object", "properties": {"n": {"type": "string"}}}
    host.expose(_view("add", number, "a"))
    gateway.publish(host)  # type: ignore[arg-type]
    assert book.routes["h_add"] == ("h", "add")
    book.argument_checks["h_add"]({"n": 1})
    with pytest.raises(InvalidInputError):
        book.argument_checks["h_add"]({"n": "one"})
    assert targets.target_of("h_add", alice, {}) == upstream
    assert book.catalog.get("h_add") is not None

    host.expose(_view("add", text, "b"))  # re-pinned with another schema
    gateway.publish(host)  # type: ignore[arg-type]
    book.argument_checks["h_add"]({"n": "one"})
    with pytest.raises(InvalidInputError):
        book.argument_checks["h_add"]({"n": 1})
    assert book.contracts["h_add"].version == "b" * 12
    entry = book.catalog.get("h_add")
    assert entry is not None and entry.input_schema == text

    host.expose()  # withdrawn (quarantined, or the upstream is down)
    gateway.publish(host)  # type: ignore[arg-type]
    assert book.catalog.get("h_add") is None
    assert book.routes["h_add"] == ("h", "add")
    assert "h_add" in book.contracts and "h_add" in book.argument_checks
    assert targets.target_of("h_add", alice, {}) == upstream
    assert access.exposed == set()


def test_a_tool_published_again_unchanged_is_not_registered_again() -> None:
    """Every listing of a huge upstream publishes its tools several times (tools, then
    each kind of item): the book is written only for a tool whose view changed, and a
    withdrawn tool shown again is registered again."""
    from nexus_mcp.book import ToolBook
    from nexus_mcp.policy.targets import ToolTargets

    class Access:
        write_tools: frozenset[str] = frozenset()
        told = 0

        def set_tools(self, *args: Any, **kwargs: Any) -> None:
            self.told += 1

    puts: list[str] = []

    class CountingBook(ToolBook):
        def put(self, contract: Any, **kwargs: Any) -> None:
            puts.append(contract.name)
            super().put(contract, **kwargs)

    host, book, access = _Host(), CountingBook(), Access()
    gateway = _bound_gateway(host, book, access, ToolTargets({}, book.toolsets))
    told = access.told
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    host.expose(_view("add", schema, "a"), _view("sub", schema, "a"))
    gateway.publish(host)  # type: ignore[arg-type]
    assert sorted(puts) == ["h_add", "h_sub"] and access.told == told + 1
    # The same tool set (its prompts changed), or the same tools with an equal view of
    # one listed again: nothing is written, the chain is still told.
    published: list[int] = []
    gateway.on_published = lambda: published.append(1)
    gateway.publish(host)  # type: ignore[arg-type]
    add, sub = host.tools["h_add"], host.tools["h_sub"]
    sub.view = _view("sub", schema, "a")
    host.tools = {"h_add": add, "h_sub": sub}
    gateway.publish(host)  # type: ignore[arg-type]
    assert sorted(puts) == ["h_add", "h_sub"] and access.told == told + 1
    assert published == [1, 1]
    # A changed view is registered again; so is a tool withdrawn and shown again.
    sub.view = _view("sub", schema, "b")
    host.tools = {"h_sub": sub}
    gateway.publish(host)  # type: ignore[arg-type]
    assert puts[2:] == ["h_sub"] and book.catalog.get("h_add") is None
    host.tools = {"h_add": add, "h_sub": sub}
    gateway.publish(host)  # type: ignore[arg-type]
    assert puts[3:] == ["h_add"] and book.catalog.get("h_add") is not None
    assert access.told == told + 3  # told of each change of the tool set, only


@pytest.mark.parametrize("arguments", [{}, {"path": 5}, {"path": "a.txt", "x": 1}])
async def test_arguments_the_tool_refuses_do_not_reveal_it_without_the_chain(
    make_server: ServerFactory, arguments: dict[str, Any]
) -> None:
    """Reached without the call state, a native tool is a missing tool whatever the
    arguments: its own argument check must not answer first (``invalid arguments`` would
    tell the tool exists, which a hidden tool never does)."""
    bare: FastMCP[Any] = FastMCP("nexus", version="0.1.0")
    async with Client(bare) as client:
        expected = wire(await client.call_tool_mcp("nexus_read_file", arguments))
    server = make_server()
    chain_of(server).replace_layers([])
    async with Client(server.mcp) as client:
        actual = wire(await client.call_tool_mcp("nexus_read_file", arguments))
    assert actual == expected
