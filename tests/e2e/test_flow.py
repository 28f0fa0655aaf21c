"""Issue 28, information flow: the lethal trifecta with real tools, and the flow policy.

A private note read (the native ``get_section_source`` over a real vault folder), an
untrusted read and an egress call (tools of the recording test server, a real stdio
upstream process, labelled in ``flow.labels``) in one session: the flow policy refuses
the egress (``FLOW_DENIED``) or holds it for an approver, who reads which calls tainted
the session (ids and tools, never content) and approves it once through the same code
the CLI runs. What reached the upstream is read back from its own record.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.server import NexusServer
from nexus_mcp.stores.approval_requests import PENDING

from .conftest import wire
from .servers import server_env
from .upstream_harness import (
    Gateway,
    all_up_tools,
    envelope,
    make_gateway,
    read_record,
    stdio_upstream,
)

pytestmark = pytest.mark.slow

APPROVAL_SECRET = "approval-secret-for-flow-tests-0123456789abcdef"
META_REQUEST = "nexus.mcp/approval_request_id"
NOTE_PATH = "notes/private.md"
PRIVATE_CANARY = "PRIVATE-CANARY-quarterly-numbers"
UNTRUSTED_CANARY = "UNTRUSTED-CANARY-ignore-previous-instructions"
EGRESS_CANARY = "EGRESS-CANARY-payload"
LABELS = {
    "up/echo": ["reads_untrusted"],  # a fetched web page, an issue, a mail
    "up/write_note": ["egress"],  # a post beyond the team (write class)
    "up/add": ["egress"],  # a read-class call that sends its arguments out
    "up/count_writes": [],
}
WRITE_POLICY = {"allowed_tools": ["write_note"], "require_approval": False}
EGRESS_ARGS = {"title": "t", "body": EGRESS_CANARY, "idempotency_key": "k-egress"}


def flow_gateway(
    tmp_path: Path,
    policy: str = "deny",
    *,
    labels: dict[str, list[str]] | None = None,
    write_policy: dict[str, Any] | None = None,
    **extra: Any,
) -> tuple[Gateway, Path]:
    record = tmp_path / "record.jsonl"
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream(record=record, write_policy=write_policy or WRITE_POLICY)],
        grant={"full": all_up_tools()},
        grant_items={"full": {"resources": ["notes", "up"], "prompts": ["up_greet"]}},
        extra={"flow": {"policy": policy, "labels": labels or LABELS}, **extra},
    )
    assert gw.pin("up") == 0
    note = gw.workspace / NOTE_PATH
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(f"---\ntitle: Private\n---\n# Numbers\n{PRIVATE_CANARY}\n", encoding="utf-8")
    return gw, record


def build(gw: Gateway, **overrides: Any) -> NexusServer:
    return gw.build(env={"NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET}, **overrides)


def envelope_of(result: Any) -> dict[str, str]:
    """The envelope of a refused call, from the result or its wire form."""
    if not isinstance(result, dict):
        return envelope(result)
    assert result["isError"] is True and "structuredContent" not in result, result
    payload: dict[str, str] = json.loads(result["content"][0]["text"])
    assert set(payload) == {"error", "code"}
    return payload


def calls_to(record: Path, tool: str) -> list[dict[str, Any]]:
    return [r for r in read_record(record) if r["method"] == "tools/call" and r["tool"] == tool]


async def read_private(client: Client[Any]) -> dict[str, Any]:
    result = wire(await client.call_tool_mcp("get_section_source", {"path": NOTE_PATH}))
    assert result["isError"] is False, result
    return result


async def read_untrusted(client: Client[Any]) -> dict[str, Any]:
    result = wire(await client.call_tool_mcp("up_echo", {"text": UNTRUSTED_CANARY}))
    assert result["isError"] is False, result
    return result


async def egress(client: Client[Any], args: dict[str, Any] | None = None) -> Any:
    return await client.call_tool_mcp("up_write_note", dict(args or EGRESS_ARGS))


def taint_events(gw: Gateway) -> list[dict[str, Any]]:
    return gw.events("flow_taint_changed")


def approvals_cli(gw: Gateway, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "nexus_mcp",
            "approvals",
            *argv,
            "--data-dir",
            str(gw.data_dir),
            "--config",
            str(gw.config_file),
        ],
        env=server_env({"NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# -- deny ----------------------------------------------------------------------------


async def test_egress_after_a_private_and_an_untrusted_read_is_denied_and_never_sent(
    tmp_path: Path,
) -> None:
    gw, record = flow_gateway(tmp_path)
    async with Client(build(gw).mcp) as client:
        await read_private(client)
        await read_untrusted(client)
        refused = await egress(client)
    payload = envelope_of(refused)
    assert payload["code"] == "FLOW_DENIED"
    text = json.dumps(wire(refused))
    for canary in (EGRESS_CANARY, PRIVATE_CANARY, UNTRUSTED_CANARY, "k-egress", "up_echo"):
        assert canary not in text
    assert calls_to(record, "write_note") == []
    (blocked,) = [e for e in gw.events("tool_call_blocked") if e["tool"] == "up_write_note"]
    assert blocked["outcome"] == "FLOW_DENIED"
    assert blocked["policy_rule"] == "flow_egress"
    changes = taint_events(gw)
    assert [(e["tool"], e["facts"]["labels_added"]) for e in changes] == [
        ("get_section_source", ["reads_private"]),
        ("up_echo", ["reads_untrusted"]),
    ]
    assert all(e["session"] and e["subject"] == "alice" for e in changes)
    # The audit records ids and labels, never what was read.
    assert PRIVATE_CANARY not in json.dumps(changes) and UNTRUSTED_CANARY not in json.dumps(changes)


@pytest.mark.parametrize(
    ("steps", "last"),
    [
        pytest.param(("egress",), None, id="egress-first"),
        pytest.param(("private",), None, id="private-only"),
        pytest.param(("untrusted",), None, id="untrusted-only"),
        pytest.param(("untrusted", "private"), "FLOW_DENIED", id="untrusted-then-private"),
        pytest.param(("egress", "private", "untrusted"), "FLOW_DENIED", id="reads-after-egress"),
    ],
)
async def test_only_an_egress_after_both_reads_is_refused(
    tmp_path: Path, steps: tuple[str, ...], last: str | None
) -> None:
    gw, record = flow_gateway(tmp_path)
    async with Client(build(gw).mcp) as client:
        for step in steps:
            if step == "private":
                await read_private(client)
            elif step == "untrusted":
                await read_untrusted(client)
            else:
                result = wire(await egress(client, {**EGRESS_ARGS, "idempotency_key": "k-0"}))
                assert result["isError"] is False, result
        final = wire(await egress(client))
    if last is None:
        assert final["isError"] is False, final
    else:
        assert envelope_of(final)["code"] == last
    sent = steps.count("egress") + (last is None)
    assert len(calls_to(record, "write_note")) == sent


async def test_a_read_class_egress_tool_is_judged_on_the_upstream_tool_really_called(
    tmp_path: Path,
) -> None:
    gw, record = flow_gateway(tmp_path)
    async with Client(build(gw).mcp) as client:
        assert wire(await client.call_tool_mcp("up_add", {"a": 1, "b": 2}))["isError"] is False
        await read_private(client)
        await read_untrusted(client)
        refused = await client.call_tool_mcp("up_add", {"a": 40, "b": 2})
        assert envelope_of(refused)["code"] == "FLOW_DENIED"
        # A tool labelled with nothing never taints and is never judged.
        assert wire(await client.call_tool_mcp("up_count_writes", {}))["isError"] is False
    assert [c["arguments"] for c in calls_to(record, "add")] == [{"a": 1, "b": 2}]


async def test_an_unlabelled_upstream_tool_in_prod_counts_as_all_three_labels(
    tmp_path: Path,
) -> None:
    gw, record = flow_gateway(tmp_path)
    async with Client(build(gw).mcp) as client:
        # up_whoami has no labels anywhere: private, untrusted and egress at once.
        first = wire(await client.call_tool_mcp("up_whoami", {}))
        assert first["isError"] is False, first
        # Its untrusted read taints the session, the note read adds nothing new to it...
        await read_private(client)
        # ...and the next unlabelled call is an egress after both: refused.
        assert envelope_of(await client.call_tool_mcp("up_whoami", {}))["code"] == "FLOW_DENIED"
    assert len(calls_to(record, "whoami")) == 1
    (first_change,) = [e for e in taint_events(gw) if e["tool"] == "up_whoami"]
    assert first_change["facts"]["labels_added"] == ["reads_private", "reads_untrusted", "egress"]
    assert [e for e in taint_events(gw) if e["tool"] == "get_section_source"] == []


async def test_a_tool_that_failed_after_it_ran_still_taints_the_session(tmp_path: Path) -> None:
    labels = {**LABELS, "up/fail_tool": ["reads_untrusted"]}
    gw, record = flow_gateway(tmp_path, labels=labels)
    async with Client(build(gw).mcp) as client:
        await read_private(client)
        failed = wire(await client.call_tool_mcp("up_fail_tool", {}))
        assert failed["isError"] is True
        assert envelope_of(await egress(client))["code"] == "FLOW_DENIED"
    assert calls_to(record, "write_note") == []


async def test_a_call_refused_before_it_ran_taints_nothing(tmp_path: Path) -> None:
    gw, _record = flow_gateway(tmp_path)
    async with Client(build(gw).mcp) as client:
        await read_private(client)
        # Refused by argument validation (chain step 5): up_echo never ran.
        bad = wire(await client.call_tool_mcp("up_echo", {"text": 5}))
        assert bad["isError"] is True
        result = wire(await egress(client))
        assert result["isError"] is False, result
    assert [e["tool"] for e in taint_events(gw)] == ["get_section_source", "up_write_note"]


async def test_a_note_read_as_a_resource_taints_like_the_tool(tmp_path: Path) -> None:
    gw, record = flow_gateway(tmp_path)
    async with Client(build(gw).mcp) as client:
        [content] = await client.read_resource("nexus://notes/" + NOTE_PATH)
        assert PRIVATE_CANARY in getattr(content, "text", "")
        await read_untrusted(client)
        assert envelope_of(await egress(client))["code"] == "FLOW_DENIED"
    assert calls_to(record, "write_note") == []
    (change, _) = taint_events(gw)
    assert change["tool"] == "(resource)" and change["resource_source"] == "notes"
    assert change["facts"]["labels_added"] == ["reads_private"]
    assert NOTE_PATH not in json.dumps(change)  # the URI only as its sha256


async def test_an_unlabelled_upstreams_resource_is_a_private_and_untrusted_read(
    tmp_path: Path,
) -> None:
    gw, record = flow_gateway(tmp_path)
    async with Client(build(gw).mcp) as client:
        assert await client.read_resource("upstream://up/test://static/readme")
        assert envelope_of(await egress(client))["code"] == "FLOW_DENIED"
    assert calls_to(record, "write_note") == []
    (change,) = taint_events(gw)
    assert change["resource_source"] == "up"
    assert change["facts"]["labels_added"] == ["reads_private", "reads_untrusted"]


async def test_an_unlabelled_upstreams_prompt_is_a_private_and_untrusted_read(
    tmp_path: Path,
) -> None:
    """A prompt's messages are the upstream's text: getting one taints like its resources."""
    gw, record = flow_gateway(tmp_path)
    async with Client(build(gw).mcp) as client:
        assert await client.get_prompt("up_greet", {"name": "Ada"})
        assert envelope_of(await egress(client))["code"] == "FLOW_DENIED"
    assert calls_to(record, "write_note") == []
    (change,) = taint_events(gw)
    assert change["prompt"] == "up_greet"
    assert change["facts"]["labels_added"] == ["reads_private", "reads_untrusted"]


async def test_a_prompt_labelled_clean_taints_nothing(tmp_path: Path) -> None:
    gw, _record = flow_gateway(tmp_path, labels={**LABELS, "up/*": []})
    async with Client(build(gw).mcp) as client:
        assert await client.get_prompt("up_greet", {"name": "Ada"})
        assert not wire(await egress(client)).get("isError")
    assert [e for e in taint_events(gw) if e.get("prompt")] == []


# -- approve -------------------------------------------------------------------------


async def test_in_approve_mode_the_approver_sees_why_and_allows_the_egress_once(
    tmp_path: Path,
) -> None:
    gw, record = flow_gateway(tmp_path, policy="approve")
    async with Client(build(gw).mcp) as client:
        await read_private(client)
        await read_untrusted(client)
        held = wire(await egress(client))
        payload = envelope_of(held)
        assert payload["code"] == "APPROVAL_REQUIRED"
        request_id = held["_meta"][META_REQUEST]
        assert request_id in payload["error"] and "egress" in payload["error"]
        assert "approval_token" not in payload["error"]  # the inbox only
        assert EGRESS_CANARY not in payload["error"] and PRIVATE_CANARY not in json.dumps(held)
        assert calls_to(record, "write_note") == []

        # The approver reads why: the calls that tainted the session, by id and tool.
        private_call, untrusted_call = (e["tool_call_id"] for e in taint_events(gw))
        shown = approvals_cli(gw, "show", request_id)
        assert shown.returncode == 0, shown.stderr
        assert "flow policy" in shown.stdout
        assert f"reads_private: call {private_call} (get_section_source)" in shown.stdout
        assert f"reads_untrusted: call {untrusted_call} (up/echo)" in shown.stdout
        assert PRIVATE_CANARY not in shown.stdout and UNTRUSTED_CANARY not in shown.stdout

        decided = approvals_cli(gw, "approve", request_id, "--approver", "carol")
        assert decided.returncode == 0, decided.stderr

        ran = wire(await egress(client))
        assert ran["isError"] is False, ran
        assert len(calls_to(record, "write_note")) == 1
        # Once: the same call again is held again (a new request), never run.
        again = wire(await egress(client, {**EGRESS_ARGS, "idempotency_key": "k-again"}))
        assert envelope_of(again)["code"] == "APPROVAL_REQUIRED"
        assert again["_meta"][META_REQUEST] != request_id
    assert len(calls_to(record, "write_note")) == 1
    finished = [e for e in gw.events("tool_call_finished") if e["tool"] == "up_write_note"]
    assert finished and finished[-1]["approver"] == "carol"


async def test_a_request_approved_before_the_taint_does_not_cover_the_held_call(
    tmp_path: Path,
) -> None:
    """The approver of a plain write request never saw the flow reason: after the session
    is tainted, that approval is not taken for the egress."""
    gw, record = flow_gateway(
        tmp_path, policy="approve", write_policy={**WRITE_POLICY, "require_approval": True}
    )
    server = build(gw)
    async with Client(server.mcp) as client:
        plain = wire(await egress(client))
        plain_id = plain["_meta"][META_REQUEST]
        assert approvals_cli(gw, "approve", plain_id, "--approver", "carol").returncode == 0
        await read_private(client)
        await read_untrusted(client)
        held = wire(await egress(client))
        assert envelope_of(held)["code"] == "APPROVAL_REQUIRED"
        flow_id = held["_meta"][META_REQUEST]
        assert flow_id != plain_id
        request = server.runtime.state.approval_requests.get(flow_id)
        assert request is not None and request.status == PENDING
        assert "flow policy" in request.preview
    assert calls_to(record, "write_note") == []


async def test_a_read_class_egress_is_held_in_the_inbox_and_approved_once(tmp_path: Path) -> None:
    gw, record = flow_gateway(tmp_path, policy="approve")
    async with Client(build(gw).mcp) as client:
        await read_private(client)
        await read_untrusted(client)
        held = wire(await client.call_tool_mcp("up_add", {"a": 40, "b": 2}))
        assert envelope_of(held)["code"] == "APPROVAL_REQUIRED"
        request_id = held["_meta"][META_REQUEST]
        assert approvals_cli(gw, "approve", request_id, "--approver", "carol").returncode == 0
        ran = wire(await client.call_tool_mcp("up_add", {"a": 40, "b": 2}))
        assert ran["isError"] is False and ran["structuredContent"] == {"sum": 42}
        again = wire(await client.call_tool_mcp("up_add", {"a": 40, "b": 2}))
        assert envelope_of(again)["code"] == "APPROVAL_REQUIRED"
    assert len(calls_to(record, "add")) == 1


async def test_a_denied_flow_request_refuses_the_egress(tmp_path: Path) -> None:
    gw, record = flow_gateway(tmp_path, policy="approve")
    async with Client(build(gw).mcp) as client:
        await read_private(client)
        await read_untrusted(client)
        request_id = wire(await egress(client))["_meta"][META_REQUEST]
        assert approvals_cli(gw, "deny", request_id, "--approver", "carol").returncode == 0
        assert envelope_of(await egress(client))["code"] == "APPROVAL_INVALID"
    assert calls_to(record, "write_note") == []


# -- sessions and principals ---------------------------------------------------------


async def test_a_new_mcp_session_starts_untainted_and_the_policy_off_tracks_nothing(
    tmp_path: Path,
) -> None:
    gw, record = flow_gateway(tmp_path)
    server = build(gw)
    # Handshake era: per MCP session (the 2026-07-28 era, FastMCP's default, has no
    # session: there the principal's calls share one taint, as in the tests above).
    async with Client(server.mcp, mode="legacy") as client:
        await read_private(client)
        await read_untrusted(client)
        assert envelope_of(await egress(client))["code"] == "FLOW_DENIED"
    async with Client(server.mcp, mode="legacy") as client:
        assert wire(await egress(client))["isError"] is False
    sessions = {e["session"] for e in taint_events(gw)}
    assert len(sessions) == 2 and all(k.startswith("session:alice:") for k in sessions)
    off, off_record = flow_gateway(tmp_path / "off", policy="off")
    async with Client(build(off).mcp) as client:
        await read_private(client)
        await read_untrusted(client)
        assert wire(await egress(client))["isError"] is False
    assert taint_events(off) == []
    assert len(calls_to(record, "write_note")) == len(calls_to(off_record, "write_note")) == 1


async def test_stateless_http_keys_taint_by_principal_and_never_across_principals(
    tmp_path: Path,
) -> None:
    """With no MCP session (stateless HTTP, the 2026-07-28 era) every request is its own
    connection: taint is the principal's, across connections, and only the principal's."""
    gw, record = flow_gateway(tmp_path)
    server = build(gw, stateless_http=True)
    async with Client(server.mcp) as client:
        await read_private(client)
    async with Client(server.mcp) as client:
        await read_untrusted(client)
    async with Client(server.mcp) as client:
        assert envelope_of(await egress(client))["code"] == "FLOW_DENIED"
    assert calls_to(record, "write_note") == []
    keys = {e["session"] for e in taint_events(gw)}
    assert keys == {"principal:alice"}
