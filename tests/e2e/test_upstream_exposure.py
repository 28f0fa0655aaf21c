"""What an upstream tool's name may reach, what the audit says of a hidden one, and what
the health routes tell whoever reaches the port (issue 22, items 12-14).

The upstream is the recording test server (``tests/support/upstream_server.py``) as a real
stdio subprocess; callers use FastMCP's in-memory client; the health routes are asked over
the server's real HTTP app (ASGI, in process).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastmcp import Client

from nexus_mcp.errors import ConfigError
from nexus_mcp.identity.access import GrantedTools
from nexus_mcp.policy.grants import DIRECT_RELATION
from nexus_mcp.policy.profiles import load_profiles
from nexus_mcp.policy.upstreams import UpstreamConfig
from nexus_mcp.principal import Principal
from nexus_mcp.server import NexusServer
from nexus_mcp.stores.grants import TOOLS_PREFIX, RelationTuple, SqliteTupleStore

from .conftest import wire
from .upstream_harness import (
    SHIPPED_PROFILES,
    UP_TOOLS,
    Gateway,
    all_up_tools,
    make_gateway,
    poll,
    run_cli,
    stdio_upstream,
)

OPERATOR_TOKEN = "operator-token-for-readyz-0123456789abcdef"
TOKEN_ENV = "NEXUS_TEST_HEALTH_TOKEN"


def gateway(tmp_path: Path, *, pin: bool = True, **upstream: Any) -> tuple[Gateway, Path]:
    record = tmp_path / "record.jsonl"
    registries = upstream.pop("registries", None)
    extra = upstream.pop("extra", None)
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream(record=record, **upstream)],
        registries=registries,
        grant={"full": all_up_tools()},
        extra=extra,
    )
    if pin:
        assert gw.pin("up") == 0
    return gw, record


def calls_of(record: Path, tool: str) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    lines = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    return [r for r in lines if r["method"] == "tools/call" and r["tool"] == tool]


def same_answer(hidden: Any, name: str, missing: Any, missing_name: str) -> None:
    """Byte for byte the answer a missing tool gets, once the names are swapped."""
    left = json.dumps(wire(hidden), sort_keys=True).replace(name, "<tool>")
    right = json.dumps(wire(missing), sort_keys=True).replace(missing_name, "<tool>")
    assert left == right


# -- item 12: an upstream tool never takes a native tool's name ------------------------


def refused_start(gw: Gateway) -> str:
    with pytest.raises(ConfigError) as caught:
        gw.build()
    return str(caught.value)


@pytest.mark.parametrize(
    ("server_id", "prefix", "native"),
    [
        ("search", None, "search_content"),  # the repo toolset, not mounted here
        ("Search", None, "search_content"),  # a case variant of it
        ("x", "SEARCH_CON", "search_content"),  # an explicit prefix, another case
        ("read", None, "read_repo_file"),
        ("merge", None, "merge_guarded"),
        ("notebook", "get_", "get_note_outline"),  # the notes toolset, mounted
        ("disco", "NEXUS_DISCOVERY_", "nexus_discovery_list_servers"),
        ("bare", "", "apply_patch"),  # no prefix at all: every native name
    ],
)
def test_a_name_that_could_be_a_native_tools_stops_start_up(
    tmp_path: Path, server_id: str, prefix: str | None, native: str
) -> None:
    options: dict[str, Any] = {"server_id": server_id}
    if prefix is not None:
        options["prefix"] = prefix
    gw = make_gateway(tmp_path, [stdio_upstream(**options)])
    message = refused_start(gw)
    assert f"server_id {server_id!r}" in message
    assert "shadow native tools" in message
    assert native in message


def test_the_cli_refuses_it_with_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gw = make_gateway(tmp_path, [stdio_upstream(server_id="search")])
    code = run_cli(
        ["serve", "--config", str(gw.config_file), "--workspace", str(gw.workspace),
         "--data-dir", str(gw.data_dir)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "'search'" in err and "search_content" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "pair",
    [
        ({"server_id": "a_b"}, {"server_id": "a"}),  # a_b_ + c == a_ + b_c
        ({"server_id": "Up"}, {"server_id": "up"}),  # case
        ({"server_id": "one", "prefix": "TWO_"}, {"server_id": "two"}),  # prefix vs id, case
        ({"server_id": "one", "prefix": "t"}, {"server_id": "two"}),  # one begins the other
    ],
)
def test_two_upstreams_whose_names_could_meet_stop_start_up(
    tmp_path: Path, pair: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    gw = make_gateway(tmp_path, [stdio_upstream(**options) for options in pair])
    message = refused_start(gw)
    assert "overlaps the prefix" in message
    assert f"`upstreams.{pair[1]['server_id']}" in message


def test_a_listed_name_ending_in_a_newline_is_never_exposed() -> None:
    config = UpstreamConfig(server_id="up", transport="stdio", command="x")
    assert config.exposed_name("echo") == "up_echo"
    for name in ("echo\n", "echo\r\n", "ec\nho", "\u00e9ch\u03bf"):
        assert config.exposed_name(name) is None


# -- item 12: a grant written for a native tool never reaches an upstream one ----------


@pytest.fixture
def access(tmp_path: Path) -> Iterator[GrantedTools]:
    store = SqliteTupleStore(tmp_path / "grants.sqlite3")
    granted = GrantedTools(store, load_profiles(SHIPPED_PROFILES), write_tools=())
    granted.grant_profiles()
    try:
        yield granted
    finally:
        store.close()


FULLWIDTH_T = "x_\uff54ool"  # NFKC: x_tool
EDITOR = Principal(subject="eve", role="editor", profile="repo")
NATIVE = frozenset({"nexus_read_file", "search_content", "read_repo_file"})


@pytest.mark.parametrize(
    "upstream",
    [
        ["search_content"],  # exactly the native name, however it came about
        ["search_content", "search_content"],  # and shared by two upstream tools
    ],
)
def test_a_native_grant_never_reaches_an_upstream_tool_of_the_same_name(
    access: GrantedTools, upstream: list[str]
) -> None:
    # The repo profile grants search_content; the repo toolset is not mounted: the only
    # tool of that name is an upstream's.
    access.set_tools(
        frozenset({"nexus_read_file", *upstream}),
        frozenset(),
        upstream=upstream,
        native=NATIVE,
    )
    visible = access.visible_tools(EDITOR)
    assert "nexus_read_file" in visible
    assert "search_content" not in visible


def test_upstream_names_two_tools_share_under_case_or_unicode_reach_no_grant(
    access: GrantedTools,
) -> None:
    # Direct grants of each name, written straight into the store (whatever route).
    names = ("x_tool", "X_TOOL", FULLWIDTH_T, "y_tool")
    access.store.write(
        [RelationTuple("eve", DIRECT_RELATION, TOOLS_PREFIX + n) for n in names], "default"
    )
    access.forget()
    upstream = ["x_tool", "X_TOOL", FULLWIDTH_T, "y_tool"]
    access.set_tools(frozenset(upstream), frozenset(), upstream=upstream, native=NATIVE)
    assert access.visible_tools(Principal(subject="eve", role="editor")) & set(upstream) == {
        "y_tool"
    }


# -- item 14: the audit tells the truth about a hidden upstream tool --------------------


def block_of(gw: Gateway, name: str) -> dict[str, Any]:
    (record,) = [
        e
        for e in gw.events("tool_call_blocked")
        if e.get("upstream_tool") == name or (name == "" and "server_id" not in e)
    ]
    return record


async def hidden_and_missing(server: NexusServer, name: str, arguments: dict[str, Any]) -> None:
    async with Client(server.mcp) as client:
        hidden = await client.call_tool_mcp(name, arguments)
        missing = await client.call_tool_mcp("up_nothing_here", arguments)
    same_answer(hidden, name, missing, "up_nothing_here")
    assert wire(hidden)["content"][0]["text"] == f"Unknown tool: {name!r}"


async def test_an_unclassified_tool_is_audited_as_unclassified_and_answered_as_unknown(
    tmp_path: Path,
) -> None:
    registry = {k: v for k, v in UP_TOOLS.items() if k != "add"}
    gw, record = gateway(tmp_path, registries={"up": registry})
    await hidden_and_missing(gw.build(), "up_add", {"a": 1, "b": 2})
    assert calls_of(record, "add") == []
    probe = block_of(gw, "add")
    assert probe["outcome"] == "TOOL_UNCLASSIFIED_DENIED"
    assert probe["reason"] == "TOOL_UNCLASSIFIED_DENIED"
    assert probe["server_id"] == "up"
    typo = block_of(gw, "")
    assert typo["outcome"] == "UNKNOWN_TOOL" and typo["reason"] == "unknown_tool"


async def test_an_unpinned_tool_is_audited_as_unpinned(tmp_path: Path) -> None:
    gw, record = gateway(tmp_path, pin=False)
    await hidden_and_missing(gw.build(), "up_echo", {"text": "x"})
    assert calls_of(record, "echo") == []
    probe = block_of(gw, "echo")
    assert (probe["outcome"], probe["reason"], probe["server_id"]) == (
        "UNKNOWN_TOOL",
        "tool_unpinned",
        "up",
    )


async def test_a_changed_tool_is_audited_as_changed(tmp_path: Path) -> None:
    gw, record = gateway(tmp_path)
    config = yaml.safe_load(gw.config_file.read_text())
    config["upstreams"][0]["args"] += ["--variant", "evil"]
    gw.config_file.write_text(yaml.safe_dump(config))
    await hidden_and_missing(gw.build(), "up_echo", {"text": "x"})
    assert calls_of(record, "echo") == []
    probe = block_of(gw, "echo")
    assert (probe["outcome"], probe["reason"]) == ("UNKNOWN_TOOL", "tool_definition_changed")


async def test_a_tool_left_out_by_the_allowlist_is_audited_as_such(tmp_path: Path) -> None:
    gw, record = gateway(tmp_path, tools=["echo"])
    await hidden_and_missing(gw.build(), "up_add", {"a": 1, "b": 2})
    assert calls_of(record, "add") == []
    assert block_of(gw, "add")["reason"] == "allowlist"


async def test_a_tool_quarantined_while_running_is_audited_as_changed(tmp_path: Path) -> None:
    gw, record = gateway(tmp_path)
    server = gw.build()
    upstreams = server.runtime.upstreams
    assert upstreams is not None
    async with Client(server.mcp) as client:
        assert not (await client.call_tool_mcp("up_echo", {"text": "a"})).is_error
        assert not (await client.call_tool_mcp("up_mutate", {})).is_error
        await poll(
            lambda: any(q["tool"] == "echo" for q in upstreams.summary()["up"]["quarantined"])
        )
        after = await client.call_tool_mcp("up_echo", {"text": "b"})
        missing = await client.call_tool_mcp("up_nothing_here", {"text": "b"})
    same_answer(after, "up_echo", missing, "up_nothing_here")
    assert [c["arguments"] for c in calls_of(record, "echo")] == [{"text": "a"}]
    probe = block_of(gw, "echo")
    assert (probe["outcome"], probe["reason"]) == ("UNKNOWN_TOOL", "tool_definition_changed")


# -- item 13: health routes name nothing to whoever reaches the port --------------------


async def get(server: NexusServer, path: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    transport = httpx.ASGITransport(app=server.mcp.http_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        return await http.get(path, headers=headers)


def operator_gateway(tmp_path: Path, **options: Any) -> Gateway:
    registry = {k: v for k, v in UP_TOOLS.items() if k != "add"}  # add: unclassified
    extra = {"health": {"bearer_token": {"env": TOKEN_ENV}}}
    gw, _record = gateway(tmp_path, pin=False, registries={"up": registry}, extra=extra)
    return gw


SECRET_WORDS = ("up", "echo", "add", "write_note", "sessions", "registry", "version")


def names_nothing(body: str) -> None:
    parsed = json.loads(body)
    assert set(parsed) <= {"status", "components", "reasons", "error"}
    for word in SECRET_WORDS:
        assert f'"{word}' not in body.replace('"upstreams"', ""), word


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", f"Basic {OPERATOR_TOKEN}", "Bearer ", f"Bearer {OPERATOR_TOKEN}x"],
)
async def test_readyz_names_no_tool_server_or_session_without_the_operator_token(
    tmp_path: Path, authorization: str | None
) -> None:
    gw = operator_gateway(tmp_path)
    server = gw.build(env={TOKEN_ENV: OPERATOR_TOKEN})
    upstreams = server.runtime.upstreams
    assert upstreams is not None
    async with Client(server.mcp) as client:
        await client.call_tool_mcp("up_echo", {"text": "x"})  # a session, and the list
        await poll(lambda: upstreams.summary()["up"]["state"] == "ready")
        headers = {"Authorization": authorization} if authorization is not None else {}
        transport = httpx.ASGITransport(app=server.mcp.http_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            anyone = await http.get("/readyz", headers=headers)
            health = await http.get("/healthz", headers=headers)
            operator = await http.get(
                "/readyz", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
            )
    names_nothing(anyone.text)
    assert OPERATOR_TOKEN not in anyone.text
    if authorization is None:
        assert anyone.status_code == 200
        # Ready or not, and which component: the quarantined tools make it degraded.
        assert anyone.json() == {
            "status": "degraded",
            "components": {"server": "ready", "state_store": "ready", "upstreams": "degraded"},
            "reasons": {"upstreams": "quarantined"},
        }
    else:
        assert anyone.status_code == 401
    assert health.json() == {"status": "ok"}
    # The operator sees the detail.
    detail = operator.json()
    assert operator.status_code == 200
    up = detail["upstreams"]["up"]
    assert "echo" in {q["tool"] for q in up["quarantined"]}
    assert up["unclassified"] == ["add"]
    assert detail["status"] == "degraded"
    # By id for the operator only: the plain answer named the component, not the server.
    assert detail["reasons"] == {"upstreams": "quarantined", "upstream:up": "quarantined"}


async def test_without_an_operator_token_readyz_has_no_detail_for_anyone(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path, pin=False)
    server = gw.build()
    plain = await get(server, "/readyz")
    guessed = await get(server, "/readyz", token="")
    assert plain.status_code == 200
    names_nothing(plain.text)
    assert guessed.status_code == 401
    names_nothing(guessed.text)


async def test_metrics_in_prod_without_a_token_are_not_served(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path, pin=False)
    server = gw.build(transport="http", auth={"jwt_secret": "j" * 40})
    assert (await get(server, "/metrics")).status_code == 404


def test_an_inline_operator_token_stops_a_prod_start_up(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path, pin=False, extra={"health": {"bearer_token": OPERATOR_TOKEN}})
    message = refused_start(gw)
    assert "health.bearer_token" in message
    assert OPERATOR_TOKEN not in message
