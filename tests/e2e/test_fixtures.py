"""Issue 14 end to end: deterministic mode, ``serve --record DIR`` and ``serve --replay DIR``.

A session is recorded through the whole chain against real parts (a copy of the demo
workspace, its notes, the recording upstream test server as a stdio process), then the
workspace is deleted and the upstream left unstarted (or its command broken), and a
replaying server answers the same calls from the fixture files. What the caller receives
is compared byte for byte (the wire JSON of each result; only the tool effect's
``effect_id`` and ``tool_call_id``, new on every call, are left out). The upstream's own
request log proves no traffic reached it during the replay.

Also: refusals made by a tool replay as the same envelope and audit outcome; an unrecorded
call is ``FIXTURE_NOT_FOUND`` without a trace of its arguments; several answers for one
key replay in order and the last repeats (per session in the handshake era, per caller in
the 2026-07-28 era, which has no session); idempotency, grants and budgets judge a
replayed call as a live one; recording changes no answer; both protocol eras over a real
stdio subprocess; a contract version bump refuses start-up (in process and through the
CLI, whose hint, ``fixtures prune``, then works); ``--record`` with ``--replay`` is refused.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from fastmcp import Client
from pydantic import ValidationError

from nexus_mcp.contracts import nexus_tool
from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.policy.grants import grant_tool
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings, load_settings

from .conftest import DEMO_WORKSPACE, wire
from .servers import serve_command, server_env
from .test_protocol_edges import (
    LEGACY,
    MODERN,
    MODERN_META,
    handshake,
    log_lines,
    stdio_process,
)
from .upstream_harness import (
    REPO,
    Gateway,
    all_up_tools,
    make_gateway,
    read_record,
    run_cli,
    stdio_upstream,
)

EFFECT = "nexus.mcp/tool_effect"
VOLATILE_EFFECT_KEYS = ("effect_id", "tool_call_id")
# Audit fields that are new on every call (or name the session), not what the call did.
VOLATILE_AUDIT_KEYS = frozenset(
    {"tool_call_id", "correlation_id", "duration_ms", "ts", "effect_id", "session"}
)
LINE_SCHEMA = json.loads(
    (REPO / "schemas" / "mcp" / "fixture_line.schema.json").read_text(encoding="utf-8")
)
NATIVE_SERVER_ID = "nexus"
ZONE = "default"
CANARY = "CANARY-fx-3b9d"
NOTE = "notes/projects/atlas/plan.md"
WRITE_KEY = "fx-idempotency-key-0001"

# The recorded session of test 1: files, notes and the upstream, through the gateway.
NATIVE_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("nexus_read_file", {"path": "todo.txt"}),
    ("nexus_list_files", {"path": "."}),
    ("nexus_list_files", {"path": "notes", "recursive": True}),
    ("nexus_grep", {"pattern": "launch"}),
    ("nexus_glob", {"pattern": "**/*.md"}),
    ("nexus_file_info", {"path": "src/hello.py"}),
    (
        "nexus_write_file",
        {
            "path": "scratch/recorded.txt",
            "content": "written while recording\n",
            "idempotency_key": WRITE_KEY,
        },
    ),
    ("nexus_read_file", {"path": "scratch/recorded.txt"}),
    ("get_note_outline", {"path": NOTE}),
    ("get_section_source", {"path": NOTE}),
    ("get_document_tree", {"path": NOTE}),
    ("get_metadata_facets", {"path": NOTE}),
]
UPSTREAM_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("up_echo", {"text": "hello through the gateway"}),
    ("up_add", {"a": 2, "b": 40}),
    ("up_fail_tool", {}),  # the upstream tool's own isError result, recorded as received
    ("up_rpc_error", {}),  # a JSON-RPC error: the connector refuses, UPSTREAM_ERROR
    ("up_add", {"a": "two", "b": 40}),  # INVALID_INPUT from the chain: never reaches a tool
]
UPSTREAM_REACHED = ["echo", "add", "fail_tool", "rpc_error"]
SESSION_ERRORS = [False] * len(NATIVE_CALLS) + [False, False, True, True, True]


# -- helpers ---------------------------------------------------------------------------


def comparable(result: Any) -> str:
    """The wire JSON a caller received, key order kept, with only the tool effect's
    per-call ids taken out (and proven present): the bytes a replay must reproduce."""
    payload = wire(result)
    effect = (payload.get("_meta") or {}).get(EFFECT)
    if effect is not None:
        assert all(isinstance(effect.get(k), str) for k in VOLATILE_EFFECT_KEYS), effect
        payload["_meta"][EFFECT] = {
            k: v for k, v in effect.items() if k not in VOLATILE_EFFECT_KEYS
        }
    return json.dumps(payload, ensure_ascii=False)


def effect_ids(result: Any) -> tuple[str, str]:
    effect = wire(result)["_meta"][EFFECT]
    return effect["effect_id"], effect["tool_call_id"]


def answer_of(payload: dict[str, Any]) -> dict[str, Any]:
    """What a replay answers in any protocol era, from a wire result (``wire(result)`` or a
    JSON-RPC ``result``): content, structured content, isError, and the tool effect
    without its per-call ids (the result's other ``_meta`` is the era's own)."""
    effect = (payload.get("_meta") or {}).get(EFFECT)
    return {
        "content": payload["content"],
        "structuredContent": payload.get("structuredContent"),
        "isError": payload["isError"],
        "effect": {k: v for k, v in effect.items() if k not in VOLATILE_EFFECT_KEYS}
        if effect is not None
        else None,
    }


def envelope_of(result: Any) -> dict[str, Any]:
    payload = wire(result)
    assert payload["isError"] is True, payload
    assert "structuredContent" not in payload, payload
    parsed: dict[str, Any] = json.loads(payload["content"][0]["text"])
    return parsed


async def listing(client: Client[Any]) -> dict[str, dict[str, Any]]:
    return {
        tool.name: tool.model_dump(mode="json", by_alias=True, exclude_none=True)
        for tool in await client.list_tools()
    }


async def run_calls(client: Client[Any], calls: Iterable[tuple[str, dict[str, Any]]]) -> list[Any]:
    return [await client.call_tool_mcp(name, dict(arguments)) for name, arguments in calls]


async def replies(
    client: Client[Any], calls: Iterable[tuple[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    return [answer_of(wire(result)) for result in await run_calls(client, calls)]


def fixture_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="ascii").splitlines()]


def check_fixture_file(path: Path, server_id: str) -> list[dict[str, Any]]:
    """Every line is a fixture line of this server; call lines keep no per-call ids."""
    lines = fixture_lines(path)
    for line in lines:
        jsonschema.validate(line, LINE_SCHEMA)
        assert line["server_id"] == server_id
        if line["kind"] == "call":
            assert not set(line.get("effect", {})) & set(VOLATILE_EFFECT_KEYS)
    return lines


def calls_in(lines: list[dict[str, Any]]) -> list[str]:
    return [line["tool"] for line in lines if line["kind"] == "call"]


def stable_audit(sink: MemoryAuditSink) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in record.items() if k not in VOLATILE_AUDIT_KEYS}
        for record in sink.records()
    ]


@pytest.fixture
def built() -> Iterator[list[NexusServer]]:
    servers: list[NexusServer] = []
    yield servers
    for server in servers:
        server.close()


def build(
    built: list[NexusServer],
    *,
    audit: MemoryAuditSink | None = None,
    extra_tools: Iterable[Any] = (),
    **values: Any,
) -> NexusServer:
    settings = Settings(**{"mode": "dev", **values})
    server = build_server(
        settings, audit_sinks=[audit or MemoryAuditSink()], extra_tools=extra_tools
    )
    built.append(server)
    return server


def demo_copy(root: Path) -> Path:
    workspace = root / "ws"
    shutil.copytree(DEMO_WORKSPACE, workspace)
    return workspace


# -- 1. a whole session, live then replayed ----------------------------------------------


def upstream_gateway(tmp_path: Path) -> tuple[Gateway, Path]:
    """A dev gateway over a copy of the demo workspace (no write_policies section: dev's
    permissive policy) with the recording upstream test server as a stdio process."""
    record = tmp_path / "upstream-requests.jsonl"
    root = tmp_path / "gw"
    root.mkdir()
    demo_copy(root)
    gw = make_gateway(
        root, [stdio_upstream(record=record)], mode="dev", grant={"full": all_up_tools()}
    )
    assert gw.pin("up") == 0
    return gw, record


async def test_a_recorded_session_replays_byte_for_byte_without_workspace_or_upstream(
    tmp_path: Path,
) -> None:
    gw, upstream_log = upstream_gateway(tmp_path)
    fixtures = tmp_path / "fixtures"
    calls = [*NATIVE_CALLS, *UPSTREAM_CALLS]

    live_server = gw.build(record=fixtures)
    async with Client(live_server.mcp) as client:
        live_tools = await listing(client)
        live = await run_calls(client, calls)
    live_server.close()
    assert [wire(result)["isError"] for result in live] == SESSION_ERRORS
    assert [envelope_of(result)["code"] for result in live[-2:]] == [
        "UPSTREAM_ERROR",
        "INVALID_INPUT",
    ]
    assert (gw.workspace / "scratch" / "recorded.txt").read_text() == "written while recording\n"
    live_upstream_calls = [r for r in read_record(upstream_log) if r["method"] == "tools/call"]
    assert [r["tool"] for r in live_upstream_calls] == UPSTREAM_REACHED

    # The recording: one file per server, every line valid, every call kept, in order.
    assert sorted(p.name for p in fixtures.iterdir()) == ["nexus.jsonl", "up.jsonl"]
    native_lines = check_fixture_file(fixtures / "nexus.jsonl", NATIVE_SERVER_ID)
    upstream_lines = check_fixture_file(fixtures / "up.jsonl", "up")
    assert calls_in(native_lines) == [name for name, _ in NATIVE_CALLS]
    assert calls_in(upstream_lines) == ["up_" + name for name in UPSTREAM_REACHED]
    assert [line.get("error", {}).get("code") for line in upstream_lines if "result" in line] == [
        None,
        None,
        None,
        "UPSTREAM_ERROR",
    ]
    listed = {line["tool"] for line in native_lines + upstream_lines if line["kind"] == "tool"}
    assert listed == set(live_tools)
    assert {line["upstream_tool"] for line in upstream_lines if line["kind"] == "tool"} == {
        name.removeprefix("up_") for name in live_tools if name.startswith("up_")
    }
    everything = (fixtures / "nexus.jsonl").read_text() + (fixtures / "up.jsonl").read_text()
    assert WRITE_KEY not in everything  # plumbing is neither hashed nor written

    # The world goes away: no workspace, and the upstream is not running.
    shutil.rmtree(gw.workspace)
    assert not gw.workspace.exists()
    upstream_log_before = upstream_log.read_bytes()

    replay_server = gw.build(replay=fixtures, data_dir=tmp_path / "replay-data")
    async with Client(replay_server.mcp) as client:
        replay_tools = await listing(client)
        replayed = await run_calls(client, calls)
        unrecorded = await client.call_tool_mcp("up_echo", {"text": CANARY})

    # The same tools listed: names, schemas, annotations, descriptions, _meta, all of it.
    assert sorted(replay_tools) == sorted(live_tools)
    for name, tool in live_tools.items():
        assert replay_tools[name] == tool, name
    for (name, _), before, after in zip(calls, live, replayed, strict=True):
        assert comparable(after) == comparable(before), name
        if EFFECT in (wire(before).get("_meta") or {}):
            assert effect_ids(after) != effect_ids(before), name  # a new call, new ids
    assert envelope_of(unrecorded)["code"] == "FIXTURE_NOT_FOUND"
    assert CANARY not in json.dumps(wire(unrecorded))

    assert upstream_log.read_bytes() == upstream_log_before  # nothing reached it
    assert not gw.workspace.exists()  # and nothing recreated the workspace

    # The upstream's command may even be gone: a replay never starts it.
    config = yaml.safe_load(gw.config_file.read_text())
    config["upstreams"][0]["command"] = str(tmp_path / "no-such-upstream-binary")
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(config))
    settings = load_settings(
        broken,
        {"workspace": gw.workspace, "data_dir": tmp_path / "broken-data", "replay": fixtures},
    )
    broken_server = build_server(settings, config_file=broken, audit_sinks=[MemoryAuditSink()])
    try:
        async with Client(broken_server.mcp) as client:
            without_upstream = await run_calls(client, UPSTREAM_CALLS)
    finally:
        broken_server.close()
    for result, before in zip(without_upstream, live[len(NATIVE_CALLS) :], strict=True):
        assert comparable(result) == comparable(before)
    assert upstream_log.read_bytes() == upstream_log_before


# -- 2. refusals made by the tool ------------------------------------------------------


REFUSED_BY_TOOL: list[tuple[str, dict[str, Any], str]] = [
    ("nexus_read_file", {"path": "missing.txt"}, "NOT_FOUND"),
    ("nexus_read_file", {"path": "../outside.txt"}, "INVALID_PATH"),
    ("nexus_list_files", {"path": "no/such/folder"}, "NOT_FOUND"),
    # The notes backend answers a missing note with a 4xx, which the tool reports so.
    ("get_note_outline", {"path": "notes/none.md"}, "UPSTREAM_ERROR"),
]
# Refused by the policy chain before any tool: never recorded, refused again in replay.
REFUSED_BY_POLICY = (
    "nexus_write_file",
    {"path": ".git/config", "content": "x", "idempotency_key": "fx-policy-1"},
)


async def test_a_refusal_by_the_tool_replays_as_the_same_envelope_and_audit_outcome(
    tmp_path: Path, built: list[NexusServer]
) -> None:
    workspace = demo_copy(tmp_path)
    fixtures = tmp_path / "fixtures"
    calls = [(name, args) for name, args, _ in REFUSED_BY_TOOL] + [REFUSED_BY_POLICY]

    live_audit = MemoryAuditSink()
    live_server = build(
        built, audit=live_audit, workspace=workspace, data_dir=tmp_path / "d1", record=fixtures
    )
    async with Client(live_server.mcp) as client:
        live = await run_calls(client, calls)
    live_server.close()
    codes = [envelope_of(result)["code"] for result in live]
    policy_code = codes[-1]
    assert codes[:-1] == [code for _, _, code in REFUSED_BY_TOOL]
    assert policy_code not in ("FIXTURE_NOT_FOUND", "NOT_FOUND", "INVALID_PATH")

    lines = check_fixture_file(fixtures / "nexus.jsonl", NATIVE_SERVER_ID)
    recorded = [line for line in lines if line["kind"] == "call"]
    assert [line["tool"] for line in recorded] == [name for name, _, _ in REFUSED_BY_TOOL]
    assert [line["error"]["code"] for line in recorded] == [c for _, _, c in REFUSED_BY_TOOL]
    assert all(line["result"]["isError"] is True for line in recorded)
    assert all("effect" not in line for line in recorded)

    shutil.rmtree(workspace)
    replay_audit = MemoryAuditSink()
    replay_server = build(
        built, audit=replay_audit, workspace=workspace, data_dir=tmp_path / "d2", replay=fixtures
    )
    async with Client(replay_server.mcp) as client:
        replayed = await run_calls(client, calls)

    for (name, _), before, after in zip(calls, live, replayed, strict=True):
        assert comparable(after) == comparable(before), name
    # The audit says what it said live: the same events, outcomes, facts, digests.
    assert stable_audit(replay_audit) == stable_audit(live_audit)
    outcomes = [
        r["outcome"]
        for r in replay_audit.records()
        if r["event"] in ("tool_call_finished", "tool_call_blocked")
    ]
    assert outcomes == codes


# -- 3. an unrecorded call ---------------------------------------------------------------


async def test_an_unrecorded_call_is_fixture_not_found_naming_no_argument_value(
    tmp_path: Path, built: list[NexusServer]
) -> None:
    workspace = demo_copy(tmp_path)
    fixtures = tmp_path / "fixtures"
    live_server = build(built, workspace=workspace, data_dir=tmp_path / "d1", record=fixtures)
    async with Client(live_server.mcp) as client:
        (recorded,) = await run_calls(client, [("nexus_list_files", {"path": "."})])
    live_server.close()
    shutil.rmtree(workspace)

    audit = MemoryAuditSink()
    server = build(
        built, audit=audit, workspace=workspace, data_dir=tmp_path / "d2", replay=fixtures
    )
    unrecorded: list[tuple[str, dict[str, Any]]] = [
        ("nexus_read_file", {"path": f"{CANARY}.txt"}),
        ("nexus_list_files", {"path": CANARY}),  # a recorded tool, other arguments
        ("nexus_grep", {"pattern": CANARY, "glob": f"*{CANARY}*"}),
        (
            "nexus_write_file",
            {"path": f"scratch/{CANARY}.txt", "content": CANARY, "idempotency_key": CANARY},
        ),
        ("get_note_outline", {"path": f"notes/{CANARY}.md"}),
    ]
    async with Client(server.mcp) as client:
        answers = await run_calls(client, unrecorded)
        # The defaults spelled out are the same normalized arguments: the recorded answer.
        spelled = await client.call_tool_mcp("nexus_list_files", {"path": ".", "recursive": False})
    for (name, _), result in zip(unrecorded, answers, strict=True):
        payload = envelope_of(result)
        assert set(payload) == {"error", "code"}, name
        assert payload["code"] == "FIXTURE_NOT_FOUND", name
        assert CANARY not in json.dumps(wire(result)), name
    assert comparable(spelled) == comparable(recorded)
    # Audited as refused before the tool (nothing was answered), by the arguments' hash.
    # Only the contract's loggable arguments (a path) are named, as for any live call.
    records = audit.records()
    blocked = [r for r in records if r.get("outcome") == "FIXTURE_NOT_FOUND"]
    assert [r["tool"] for r in blocked] == [name for name, _ in unrecorded]
    assert {r["event"] for r in blocked} == {"tool_call_blocked"}
    assert all(set(r["facts"]) == {"args_sha256"} for r in blocked)
    started = [r["tool"] for r in records if r["event"] == "tool_call_started"]
    assert started == ["nexus_list_files"]  # the recorded call alone reached a tool
    unlogged = [{k: v for k, v in r.items() if k != "args"} for r in records]
    assert CANARY not in json.dumps(unlogged)


# -- 4. several answers for one key ------------------------------------------------------


async def test_several_answers_for_one_key_replay_in_order_then_the_last_repeats(
    tmp_path: Path, built: list[NexusServer]
) -> None:
    workspace = demo_copy(tmp_path)
    (workspace / "scratch" / "order.txt").write_text("v1\n")
    fixtures = tmp_path / "fixtures"
    read = ("nexus_read_file", {"path": "scratch/order.txt"})
    overwrite = (
        "nexus_write_file",
        {"path": "scratch/order.txt", "content": "v2\n", "idempotency_key": "fx-order-1"},
    )
    live_server = build(built, workspace=workspace, data_dir=tmp_path / "d1", record=fixtures)
    async with Client(live_server.mcp) as client:
        first, _written, second = await run_calls(client, [read, overwrite, read])
    live_server.close()
    assert wire(first)["structuredContent"]["content"] == "v1\n"
    assert wire(second)["structuredContent"]["content"] == "v2\n"
    shutil.rmtree(workspace)

    v1, v2 = answer_of(wire(first)), answer_of(wire(second))
    server = build(built, workspace=workspace, data_dir=tmp_path / "d2", replay=fixtures)

    # Sessions of the handshake era: each has its own position, a new one starts at v1.
    async with (
        Client(server.mcp, mode="legacy") as one,
        Client(server.mcp, mode="legacy") as two,
    ):
        assert await replies(one, [read, read]) == [v1, v2]
        assert await replies(two, [read]) == [v1]
        assert await replies(one, [read, read]) == [v2, v2]
        assert await replies(two, [read]) == [v2]
    async with Client(server.mcp, mode="legacy") as three:
        assert await replies(three, [read, read, read]) == [v1, v2, v2]

    # The 2026-07-28 era has no session: the position is the caller's (here the dev
    # principal), so a new connection of the same caller goes on where the last one was.
    async with Client(server.mcp) as modern:
        assert modern.protocol_version == MODERN
        assert await replies(modern, [read, read, read]) == [v1, v2, v2]
    async with Client(server.mcp) as again:
        assert await replies(again, [read]) == [v2]


async def test_idempotency_in_replay_works_as_live_and_never_matches_the_live_run(
    tmp_path: Path, built: list[NexusServer]
) -> None:
    """The chain's idempotency runs in replay too, against the recording as its target: a
    live run's records in the same data folder never answer a replayed write."""
    workspace = demo_copy(tmp_path)
    fixtures = tmp_path / "fixtures"
    data = tmp_path / "data"  # one data folder for both runs
    write = (
        "nexus_write_file",
        {"path": "scratch/once.txt", "content": "once\n", "idempotency_key": "fx-once-1"},
    )
    conflicting = (write[0], {**write[1], "content": "twice\n"})
    live_server = build(built, workspace=workspace, data_dir=data, record=fixtures)
    async with Client(live_server.mcp) as client:
        live, live_retry = await run_calls(client, [write, write])
    live_server.close()
    assert wire(live_retry)["_meta"].get("nexus.mcp/idempotent_replay") is True
    # The retry never reached the tool: one call recorded.
    assert calls_in(fixture_lines(fixtures / "nexus.jsonl")) == ["nexus_write_file"]
    shutil.rmtree(workspace)

    server = build(built, workspace=workspace, data_dir=data, replay=fixtures)
    async with Client(server.mcp) as client:
        replayed, retry, conflict = await run_calls(client, [write, write, conflicting])
    assert comparable(replayed) == comparable(live)  # not the live run's stored answer
    assert effect_ids(replayed) != effect_ids(live)
    assert "nexus.mcp/idempotent_replay" not in wire(replayed)["_meta"]
    assert wire(retry)["_meta"].get("nexus.mcp/idempotent_replay") is True
    assert effect_ids(retry) == effect_ids(replayed)
    assert envelope_of(conflict)["code"] == "IDEMPOTENCY_KEY_CONFLICT"


CHAIN_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("nexus_read_file", {"path": "todo.txt"}),
    ("nexus_grep", {"pattern": "launch"}),
    ("nexus_write_file", {"path": "scratch/x.txt", "content": "x\n", "idempotency_key": "fx-k"}),
]


async def test_recording_changes_no_answer_and_the_chain_judges_a_replay_as_a_live_call(
    tmp_path: Path, built: list[NexusServer]
) -> None:
    fixtures = tmp_path / "fixtures"
    recorded_ws = demo_copy(tmp_path / "recorded")
    recording = build(built, workspace=recorded_ws, data_dir=tmp_path / "d-rec", record=fixtures)
    plain = build(built, workspace=demo_copy(tmp_path / "plain"), data_dir=tmp_path / "d-plain")
    async with Client(recording.mcp) as one, Client(plain.mcp) as two:
        with_recorder = [comparable(r) for r in await run_calls(one, CHAIN_CALLS)]
        without = [comparable(r) for r in await run_calls(two, CHAIN_CALLS)]
    assert with_recorder == without  # the recorder is invisible to the caller
    recording.close()
    shutil.rmtree(recorded_ws)

    # The same narrowing on a live server and on a replay: the same answers, the refusal
    # decided by the chain (a read-only caller has no write tool; a third call is over
    # the budget of two), never by the fixtures.
    narrowings: list[dict[str, Any]] = [
        {"read_only": True},
        {"budgets": {"max_calls_per_session": 2}},
    ]
    for number, narrowing in enumerate(narrowings):
        live = build(
            built,
            workspace=demo_copy(tmp_path / f"live-{number}"),
            data_dir=tmp_path / f"d-live-{number}",
            **narrowing,
        )
        replay = build(
            built,
            workspace=recorded_ws,
            data_dir=tmp_path / f"d-replay-{number}",
            replay=fixtures,
            **narrowing,
        )
        async with Client(live.mcp) as one, Client(replay.mcp) as two:
            live_answers = await run_calls(one, CHAIN_CALLS)
            replayed = await run_calls(two, CHAIN_CALLS)
        assert [comparable(r) for r in replayed] == [comparable(r) for r in live_answers]
        assert [wire(r)["isError"] for r in replayed] == [False, False, True]
        refused = replayed[2]
        text = wire(refused)["content"][0]["text"]
        if "read_only" in narrowing:
            assert text == "Unknown tool: 'nexus_write_file'"  # hidden, as live
        else:
            assert json.loads(text)["code"] == "BUDGET_EXCEEDED"


# -- 5. both protocol eras over a real stdio subprocess ---------------------------------


def call_request(name: str, arguments: dict[str, Any], era: str) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if era == MODERN:
        params["_meta"] = MODERN_META
    return {"method": "tools/call", "params": params}


def list_request(era: str) -> dict[str, Any]:
    return {"method": "tools/list", "params": {"_meta": MODERN_META} if era == MODERN else {}}


def result_of(answer: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC tools/call result without its tool effect's per-call ids."""
    assert "result" in answer, answer
    result: dict[str, Any] = answer["result"]
    effect = (result.get("_meta") or {}).get(EFFECT)
    if effect is not None:
        assert all(isinstance(effect.get(k), str) for k in VOLATILE_EFFECT_KEYS), effect
        result["_meta"][EFFECT] = {k: v for k, v in effect.items() if k not in VOLATILE_EFFECT_KEYS}
    return result


STDIO_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("nexus_read_file", {"path": "todo.txt"}),
    ("get_note_outline", {"path": NOTE}),
    ("nexus_read_file", {"path": "missing.txt"}),
]


@pytest.mark.slow
def test_a_stdio_recording_replays_over_stdio_in_both_protocol_eras(tmp_path: Path) -> None:
    workspace = demo_copy(tmp_path)
    fixtures = tmp_path / "fixtures"
    errlog = tmp_path / "stderr.log"

    # Recorded by `nexus-mcp serve` itself (handshake era), the folder from NEXUS_MCP_RECORD.
    record_args = serve_command(
        "--transport", "stdio", "--mode", "dev", "--workspace", str(workspace),
        "--data-dir", str(tmp_path / "record-data"),
    )  # fmt: skip
    with (
        errlog.open("wb") as err,
        stdio_process(record_args, err, {"NEXUS_MCP_RECORD": str(fixtures)}) as live,
    ):
        handshake(live)
        live_tools = live.request(list_request(LEGACY))["result"]["tools"]
        recorded = [
            result_of(live.request(call_request(name, args, LEGACY))) for name, args in STDIO_CALLS
        ]
    assert [r["isError"] for r in recorded] == [False, False, True]
    lines = check_fixture_file(fixtures / "nexus.jsonl", NATIVE_SERVER_ID)
    assert calls_in(lines) == [name for name, _ in STDIO_CALLS]
    shutil.rmtree(workspace)

    replay_args = serve_command(
        "--transport", "stdio", "--mode", "dev", "--replay", str(fixtures),
        "--data-dir", str(tmp_path / "replay-data"),
    )  # fmt: skip
    answers: dict[str, list[dict[str, Any]]] = {}
    with (
        errlog.open("ab") as err,
        stdio_process(replay_args, err, {}) as legacy,
        stdio_process(replay_args, err, {}) as modern,
    ):
        handshake(legacy)
        for era, channel in ((LEGACY, legacy), (MODERN, modern)):
            tools = channel.request(list_request(era))["result"]["tools"]
            assert {t["name"]: t for t in tools} == {t["name"]: t for t in live_tools}, era
            answers[era] = [
                result_of(channel.request(call_request(name, args, era)))
                for name, args in STDIO_CALLS
            ]
    # In the era of the recording, the very same JSON-RPC results; in the 2026-07-28 era,
    # the same answers (its results carry that era's own _meta beside the tool effect).
    assert answers[LEGACY] == recorded
    assert [answer_of(r) for r in answers[MODERN]] == [answer_of(r) for r in recorded]
    assert not workspace.exists()
    assert not [r for r in log_lines(errlog) if r.get("level") in ("error", "critical")]


# -- 6. a contract version bump ----------------------------------------------------------


def probe_tool(version: str) -> Any:
    @nexus_tool(risk="read", toolset="extra", version=version)
    async def fixture_probe(word: str) -> dict[str, Any]:
        """Say a word back."""
        return {"word": word, "version": version}

    return fixture_probe


def build_with_probe(built: list[NexusServer], version: str, **values: Any) -> NexusServer:
    server = build(built, extra_tools=[probe_tool(version)], **values)
    subject = server.runtime.settings.dev_principal.subject
    grant_tool(server.runtime.grants, subject, "fixture_probe", ZONE)
    return server


async def test_a_version_bump_of_a_recorded_tool_refuses_start_up_naming_it(
    tmp_path: Path, built: list[NexusServer]
) -> None:
    workspace = demo_copy(tmp_path)
    fixtures = tmp_path / "fixtures"
    live_server = build_with_probe(
        built, "1.0.0", workspace=workspace, data_dir=tmp_path / "d1", record=fixtures
    )
    async with Client(live_server.mcp) as client:
        live = await client.call_tool_mcp("fixture_probe", {"word": "hi"})
    live_server.close()
    assert wire(live)["structuredContent"] == {"word": "hi", "version": "1.0.0"}
    probe_lines = [
        line
        for line in check_fixture_file(fixtures / "nexus.jsonl", NATIVE_SERVER_ID)
        if line["tool"] == "fixture_probe"
    ]
    assert [(line["kind"], line["version"]) for line in probe_lines] == [
        ("tool", "1.0.0"),
        ("call", "1.0.0"),
    ]

    # The same version replays (what is refused below is the bump, nothing else).
    same = build_with_probe(
        built, "1.0.0", workspace=workspace, data_dir=tmp_path / "d2", replay=fixtures
    )
    async with Client(same.mcp) as client:
        again = await client.call_tool_mcp("fixture_probe", {"word": "hi"})
    assert comparable(again) == comparable(live)

    with pytest.raises(ConfigError) as refused:
        build_with_probe(
            built, "2.0.0", workspace=workspace, data_dir=tmp_path / "d3", replay=fixtures
        )
    message = str(refused.value)
    assert "fixture_probe" in message
    assert "1.0.0" in message and "2.0.0" in message
    assert "nexus-mcp fixtures prune DIR --tool fixture_probe" in message


@pytest.mark.slow
def test_the_cli_refuses_a_stale_recording_with_exit_2_and_its_prune_hint_works(
    tmp_path: Path, built: list[NexusServer]
) -> None:
    """The CLI serves only the built-in tools, so the bump is the other way round: a
    recording whose nexus_read_file lines say 0.9.0, as an older build would have written."""
    workspace = demo_copy(tmp_path)
    fixtures = tmp_path / "fixtures"
    server = build(built, workspace=workspace, data_dir=tmp_path / "d1", record=fixtures)
    server.close()
    path = fixtures / "nexus.jsonl"
    lines = fixture_lines(path)
    current = next(line["version"] for line in lines if line["tool"] == "nexus_read_file")
    assert current != "0.9.0"
    path.write_text(
        "".join(
            json.dumps({**line, "version": "0.9.0"} if line["tool"] == "nexus_read_file" else line)
            + "\n"
            for line in lines
        )
    )
    replay_args = serve_command(
        "--transport", "stdio", "--mode", "dev", "--replay", str(fixtures),
        "--data-dir", str(tmp_path / "replay-data"),
    )  # fmt: skip
    done = subprocess.run(
        replay_args, env=server_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=60
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == b""
    stderr = done.stderr.decode()
    named = [line for line in stderr.splitlines() if "nexus_read_file" in line]
    assert named, stderr[-2000:]
    assert any("0.9.0" in line and current in line for line in named), named
    assert any("nexus-mcp fixtures prune DIR --tool nexus_read_file" in line for line in named)

    # Following the hint: the stale tool's lines go, and the server starts and serves.
    assert run_cli(["fixtures", "prune", str(fixtures), "--tool", "nexus_read_file"]) == 0
    assert "nexus_read_file" not in {line["tool"] for line in fixture_lines(path)}
    errlog = tmp_path / "stderr.log"
    with errlog.open("wb") as err, stdio_process(replay_args, err, {}) as channel:
        handshake(channel)
        names = {t["name"] for t in channel.request(list_request(LEGACY))["result"]["tools"]}
    assert "nexus_list_files" in names and "nexus_read_file" not in names


# -- 7. record and replay together -------------------------------------------------------


@pytest.mark.slow
def test_record_and_replay_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(mode="dev", record=tmp_path / "a", replay=tmp_path / "b")
    assert "'record' and 'replay' cannot both be set" in str(caught.value)

    (tmp_path / "b").mkdir()
    # Both spellings at once (flags; the flag with the environment), each its own process.
    processes = [
        subprocess.Popen(
            serve_command("--transport", "stdio", "--mode", "dev", *args),
            env=server_env(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for args, env in [
            (("--record", str(tmp_path / "a"), "--replay", str(tmp_path / "b")), None),
            (("--replay", str(tmp_path / "b")), {"NEXUS_MCP_RECORD": str(tmp_path / "a")}),
        ]
    ]
    for process in processes:
        out, err = process.communicate(timeout=60)
        stderr = err.decode()
        assert process.returncode == 2, stderr[-2000:]
        assert out == b""
        assert "'record' and 'replay' cannot both be set" in stderr
    assert not (tmp_path / "a").exists()  # nothing was recorded, not even a folder
