"""Waiting for an approver (issue 26): a write refused for a pending request may wait.

With ``approvals.wait_seconds`` above 0, a client that declared elicitation on a
handshake-era connection is asked once whether to wait for the decision of the request
the inbox opened. On "wait" the call holds until an approver decides: approved, the write
runs once; denied, ``APPROVAL_INVALID``; the bound passing, the usual ``APPROVAL_REQUIRED``
naming the request. Real clients (in memory and a ``nexus-mcp serve`` subprocess over
stdio), a real SQLite inbox, real files; the approver is the store's ``decide`` or the
``nexus-mcp approvals approve`` subprocess.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from mcp.types import ElicitResult

from nexus_mcp.observability.audit import TOOL_CALL_FINISHED, MemoryAuditSink
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings
from nexus_mcp.stores.approval_requests import APPROVED, PENDING, ApprovalRequestStore

from .access_helpers import AUDIENCE, TLS, serve_settings, token
from .access_helpers import SECRET as JWT_SECRET
from .conftest import snapshot, wire
from .servers import server_env

SECRET = "inbox-wait-secret-0123456789abcdef-0123456789"
META_REQUEST = "nexus.mcp/approval_request_id"
POLICY = {
    "workspace": {
        "allowed_paths": ["scratch/**"],
        "allowed_operations": ["write", "edit", "delete"],
        "require_approval": True,
    }
}
ORIGINAL = "line one\nline two\n"
CONTENT = "line one\nline 2, approved after a wait\n"
WRITE = {"path": "scratch/plan.md", "content": CONTENT, "idempotency_key": "w-1"}
ID_IN_QUESTION = re.compile(r"request ([0-9A-Za-z_-]+) waits")
BOUND = 30.0  # every wait in these tests ends long before this, or the test fails

Build = Callable[..., NexusServer]


def write_config(path: Path, wait_seconds: int | None) -> Path:
    document: dict[str, Any] = {"write_policies": POLICY}
    if wait_seconds is not None:
        document["approvals"] = {"wait_seconds": wait_seconds}
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def build(
    workspace: Path, data_dir: Path, tmp_path: Path, audit: MemoryAuditSink
) -> Iterator[Build]:
    (workspace / "scratch").mkdir(exist_ok=True)
    (workspace / "scratch" / "plan.md").write_text(ORIGINAL, encoding="utf-8")
    built: list[NexusServer] = []

    def factory(wait_seconds: int | None = 30, **settings: Any) -> NexusServer:
        server = build_server(
            Settings(
                mode="prod",
                subject="agent-7",
                role="editor",
                workspace=workspace,
                data_dir=data_dir,
                **settings,
            ),
            config_file=write_config(tmp_path / "nexus.yaml", wait_seconds),
            audit_sinks=[audit],
            env={"NEXUS_MCP_APPROVAL_SECRET": SECRET},
        )
        built.append(server)
        return server

    yield factory
    for server in built:
        server.close()


class Asker:
    """An elicitation handler that answers every question with ``answer``."""

    def __init__(self, answer: str | None = "wait", *, slow: bool = False) -> None:
        self.answer = answer
        self.asked: list[str] = []
        self.ids: asyncio.Queue[str] = asyncio.Queue()
        self.release = asyncio.Event()  # a slow asker answers once this is set
        if not slow:
            self.release.set()

    async def __call__(self, message: str, response_type: Any, params: Any, context: Any) -> Any:
        self.asked.append(message)
        found = ID_IN_QUESTION.search(message)
        if found is not None:
            self.ids.put_nowait(found.group(1))
        await self.release.wait()
        if self.answer is None:
            return ElicitResult(action="decline")
        return ElicitResult(action="accept", content={"value": self.answer})


class Progress:
    """A progress handler: a notification proves the call is waiting on the server."""

    def __init__(self, past: float = 0.0) -> None:
        self.seen: list[tuple[float, float | None, str | None]] = []
        self.waiting = asyncio.Event()
        self.past = past  # ``waiting`` is set once the call has waited this long

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.seen.append((progress, total, message))
        if progress >= self.past:
            self.waiting.set()


def store_of(server: NexusServer) -> ApprovalRequestStore:
    store = server.runtime.state.approval_requests
    assert store is not None
    return store


async def decide_once_waiting(
    server: NexusServer, asker: Asker, progress: Progress, *, approve: bool
) -> str:
    """The approver: once the call asked and waits, decide its request."""
    request_id = await asyncio.wait_for(asker.ids.get(), BOUND)
    await asyncio.wait_for(progress.waiting.wait(), BOUND)
    found = store_of(server).get(request_id)
    assert found is not None and found.status == PENDING  # nothing taken while waiting
    await asyncio.to_thread(
        store_of(server).decide, request_id, approve=approve, approver="ops-lead"
    )
    return request_id


async def call(
    client: Client[Any], args: dict[str, Any], progress: Progress | None = None
) -> dict[str, Any]:
    result = await client.call_tool_mcp("nexus_write_file", args, progress_handler=progress)
    return wire(result)


def refusal(result: dict[str, Any]) -> tuple[str, str | None]:
    assert result["isError"] is True, result
    payload = json.loads(result["content"][0]["text"])
    return payload["code"], (result.get("_meta") or {}).get(META_REQUEST)


def finished_writes(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        r
        for r in records
        if r["event"] == TOOL_CALL_FINISHED and r.get("tool") == "nexus_write_file"
    ]


async def test_a_waiting_write_runs_once_when_an_approver_approves(
    build: Build, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build()
    asker, progress = Asker(), Progress()
    async with Client(server.mcp, mode="legacy", elicitation_handler=asker) as client:
        approver = asyncio.create_task(decide_once_waiting(server, asker, progress, approve=True))
        result = await asyncio.wait_for(call(client, dict(WRITE), progress), BOUND)
        request_id = await approver
    assert result["isError"] is False, result
    assert (workspace / "scratch/plan.md").read_text() == CONTENT
    # Asked once, naming the request and how to decide it; never the arguments.
    assert len(asker.asked) == 1
    question = asker.asked[0]
    assert request_id in question and f"nexus-mcp approvals approve {request_id}" in question
    assert "console" in question
    assert "scratch/plan.md" not in question and "approved after" not in question
    assert progress.seen and all(total == 30.0 for _, total, _ in progress.seen)
    finished = finished_writes(audit.records())
    assert len(finished) == 1
    assert (finished[0]["outcome"], finished[0]["approver"]) == ("OK", "ops-lead")
    assert store_of(server).get(request_id).status == "used"  # type: ignore[union-attr]


async def test_a_denial_while_waiting_refuses_and_writes_nothing(
    build: Build, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build()
    before = snapshot(workspace)
    asker, progress = Asker(), Progress()
    async with Client(server.mcp, mode="legacy", elicitation_handler=asker) as client:
        approver = asyncio.create_task(decide_once_waiting(server, asker, progress, approve=False))
        result = await asyncio.wait_for(call(client, dict(WRITE), progress), BOUND)
        request_id = await approver
    assert refusal(result) == ("APPROVAL_INVALID", request_id)
    assert snapshot(workspace) == before
    assert finished_writes(audit.records()) == []


async def test_the_wait_ends_at_its_bound_with_the_request_still_pending(
    build: Build, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build(wait_seconds=1)
    before = snapshot(workspace)
    asker, progress = Asker(), Progress()
    async with Client(server.mcp, mode="legacy", elicitation_handler=asker) as client:
        result = await asyncio.wait_for(call(client, dict(WRITE), progress), BOUND)
    code, request_id = refusal(result)
    assert code == "APPROVAL_REQUIRED" and request_id is not None
    assert len(asker.asked) == 1 and request_id in asker.asked[0]
    assert progress.seen  # it did wait
    assert store_of(server).get(request_id).status == PENDING  # type: ignore[union-attr]
    assert snapshot(workspace) == before
    assert finished_writes(audit.records()) == []


@pytest.mark.parametrize("answer", ["cancel", None], ids=["cancel", "decline"])
async def test_a_client_that_does_not_wait_is_refused_at_once(
    build: Build, workspace: Path, answer: str | None
) -> None:
    server = build(wait_seconds=3600)
    before = snapshot(workspace)
    asker, progress = Asker(answer), Progress()
    async with Client(server.mcp, mode="legacy", elicitation_handler=asker) as client:
        result = await asyncio.wait_for(call(client, dict(WRITE), progress), BOUND)
    code, request_id = refusal(result)
    assert code == "APPROVAL_REQUIRED" and request_id is not None
    assert len(asker.asked) == 1 and progress.seen == []
    assert snapshot(workspace) == before


async def test_without_wait_seconds_no_client_is_asked(build: Build, workspace: Path) -> None:
    server = build(wait_seconds=None)  # the default: 0
    asker = Asker()
    async with Client(server.mcp, mode="legacy", elicitation_handler=asker) as client:
        code, request_id = refusal(await asyncio.wait_for(call(client, dict(WRITE)), BOUND))
    assert code == "APPROVAL_REQUIRED" and request_id is not None
    assert asker.asked == []


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_client_without_elicitation_is_never_asked(
    build: Build, workspace: Path, audit: MemoryAuditSink, mode: str
) -> None:
    server = build(wait_seconds=3600)
    async with Client(server.mcp, mode=mode) as client:  # type: ignore[arg-type]
        code, request_id = refusal(await asyncio.wait_for(call(client, dict(WRITE)), BOUND))
    assert code == "APPROVAL_REQUIRED" and request_id is not None
    ends = [r for r in audit.records() if r["event"] != "tool_call_started"]
    assert [r["outcome"] for r in ends] == ["APPROVAL_REQUIRED"]  # no question was put


async def test_a_2026_client_answers_the_question_then_waits_and_the_write_runs_once(
    build: Build, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build()
    asker, progress = Asker(), Progress()
    async with Client(server.mcp, mode="auto", elicitation_handler=asker) as client:
        approver = asyncio.create_task(decide_once_waiting(server, asker, progress, approve=True))
        result = await asyncio.wait_for(call(client, dict(WRITE), progress), BOUND)
        request_id = await approver
    assert result["isError"] is False, result
    assert (workspace / "scratch/plan.md").read_text() == CONTENT
    assert len(asker.asked) == 1 and f"nexus-mcp approvals approve {request_id}" in asker.asked[0]
    ends = [r for r in audit.records() if r["event"] != "tool_call_started"]
    # The question leg is blocked, never a result: its key was freed, the answer ran it.
    assert [(r["event"], r["outcome"]) for r in ends] == [
        ("tool_call_blocked", "INPUT_REQUIRED"),
        (TOOL_CALL_FINISHED, "OK"),
    ]
    assert [r.get("idempotency") for r in ends] == ["abandoned", "executed"]
    assert ends[1]["approver"] == "ops-lead"


async def test_a_2026_client_that_cancels_is_refused_and_its_key_is_not_spent(
    build: Build, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build()
    before = snapshot(workspace)
    asker = Asker("cancel")
    async with Client(server.mcp, mode="auto", elicitation_handler=asker) as client:
        code, request_id = refusal(await asyncio.wait_for(call(client, dict(WRITE)), BOUND))
    assert code == "APPROVAL_REQUIRED" and request_id is not None and len(asker.asked) == 1
    assert snapshot(workspace) == before
    # Approved later, the agent's retry under the same key runs (nothing was recorded).
    store_of(server).decide(request_id, approve=True, approver="ops-lead")
    async with Client(server.mcp, mode="auto") as client:
        retry = await asyncio.wait_for(call(client, dict(WRITE)), BOUND)
    assert retry["isError"] is False, retry
    assert (workspace / "scratch/plan.md").read_text() == CONTENT
    assert len(finished_writes(audit.records())) == 1


async def test_two_waiting_calls_and_one_approval_write_once(
    build: Build, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build()
    asker, progress = Asker(), Progress()
    async with Client(server.mcp, mode="legacy", elicitation_handler=asker) as client:
        calls = [
            asyncio.create_task(call(client, {**WRITE, "idempotency_key": key}, progress))
            for key in ("w-a", "w-b")
        ]
        first = await asyncio.wait_for(asker.ids.get(), BOUND)
        second = await asyncio.wait_for(asker.ids.get(), BOUND)
        assert first == second  # the same arguments wait on the same request
        await asyncio.wait_for(progress.waiting.wait(), BOUND)
        await asyncio.to_thread(store_of(server).decide, first, approve=True, approver="ops-lead")
        results = await asyncio.wait_for(asyncio.gather(*calls), BOUND)
    ran = [r for r in results if r["isError"] is False]
    refused = [refusal(r) for r in results if r["isError"] is True]
    assert len(ran) == 1 and len(refused) == 1
    code, other = refused[0]
    # The loser is judged as a retry: the approval is spent, so a new request waits.
    assert code == "APPROVAL_REQUIRED" and other not in (None, first)
    assert len(finished_writes(audit.records())) == 1
    assert (workspace / "scratch/plan.md").read_text() == CONTENT


async def test_a_retry_under_the_same_key_waits_for_the_waiting_call_past_its_lease(
    build: Build, workspace: Path, audit: MemoryAuditSink
) -> None:
    # The idempotency claim's lease is twice the longest tool timeout: 2 s here. The
    # waiting call renews it, so a retry under its key waits for it and gets its result
    # instead of being refused as an earlier call of unknown outcome.
    server = build(budgets={"tool_timeout_seconds": 1.0})
    asker, progress = Asker(), Progress(past=3.0)
    async with Client(server.mcp, mode="legacy", elicitation_handler=asker) as client:
        first = asyncio.create_task(call(client, dict(WRITE), progress))
        request_id = await asyncio.wait_for(asker.ids.get(), BOUND)
        await asyncio.wait_for(progress.waiting.wait(), BOUND)  # past the first lease
        retry = asyncio.create_task(call(client, dict(WRITE)))
        ticks = len(progress.seen)
        await asyncio.wait_for(_until(lambda: len(progress.seen) >= ticks + 2), BOUND)
        await asyncio.to_thread(
            store_of(server).decide, request_id, approve=True, approver="ops-lead"
        )
        results = await asyncio.wait_for(asyncio.gather(first, retry), BOUND)
    assert [r["isError"] for r in results] == [False, False], results
    assert results[1]["_meta"]["nexus.mcp/idempotent_replay"] is True
    assert len(asker.asked) == 1  # the retry waited on the claim, never at the inbox
    assert len(finished_writes(audit.records())) == 2  # the run and its replay
    assert [r.get("idempotency") for r in finished_writes(audit.records())] == [
        "executed",
        "replayed",
    ]


async def test_a_slow_answer_to_the_question_keeps_the_claim_for_a_same_key_retry(
    build: Build, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build(budgets={"tool_timeout_seconds": 0.5})  # the claim's lease: 1 s
    asker, progress = Asker(slow=True), Progress()
    async with Client(server.mcp, mode="legacy", elicitation_handler=asker) as client:
        first = asyncio.create_task(call(client, dict(WRITE), progress))
        request_id = await asyncio.wait_for(asker.ids.get(), BOUND)
        retry = asyncio.create_task(call(client, dict(WRITE)))  # waits on the claim
        await asyncio.sleep(2.0)  # the person reads the question for two leases
        asker.release.set()
        await asyncio.wait_for(progress.waiting.wait(), BOUND)
        await asyncio.to_thread(
            store_of(server).decide, request_id, approve=True, approver="ops-lead"
        )
        results = await asyncio.wait_for(asyncio.gather(first, retry), BOUND)
    assert [r["isError"] for r in results] == [False, False], results
    assert results[1]["_meta"]["nexus.mcp/idempotent_replay"] is True
    assert len(finished_writes(audit.records())) == 2  # the run and its replay


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.05)


async def test_a_client_gone_mid_wait_leaves_the_approval_for_its_retry(
    build: Build, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build()
    asker, progress = Asker(), Progress()
    async with Client(server.mcp, mode="legacy", elicitation_handler=asker) as client:
        waiting = asyncio.create_task(call(client, dict(WRITE), progress))
        request_id = await asyncio.wait_for(asker.ids.get(), BOUND)
        await asyncio.wait_for(progress.waiting.wait(), BOUND)
        waiting.cancel()  # the client gives up: the server's call is cancelled with it
        with pytest.raises(asyncio.CancelledError):
            await waiting
    # The server's call ended with the client (blocked: it never ran), holding nothing.
    assert [r["event"] for r in audit.records()] == ["tool_call_blocked"]
    store = store_of(server)
    await asyncio.to_thread(store.decide, request_id, approve=True, approver="ops-lead")
    assert store.get(request_id).status == APPROVED  # type: ignore[union-attr]
    assert (workspace / "scratch/plan.md").read_text() == ORIGINAL
    async with Client(server.mcp, mode="legacy") as client:
        retry = await asyncio.wait_for(call(client, {**WRITE, "idempotency_key": "w-2"}), BOUND)
    assert retry["isError"] is False, retry
    assert (workspace / "scratch/plan.md").read_text() == CONTENT
    assert len(finished_writes(audit.records())) == 1


def approve_with_cli(request_id: str, data_dir: Path, config: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nexus_mcp", "approvals", "approve", request_id,
         "--approver", "ops-lead", "--data-dir", str(data_dir), "--config", str(config)],
        env=server_env({"NEXUS_MCP_APPROVAL_SECRET": SECRET}),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
async def test_a_stdio_client_waits_while_the_cli_approves(
    workspace: Path, tmp_path: Path, data_dir: Path
) -> None:
    (workspace / "scratch").mkdir(exist_ok=True)
    (workspace / "scratch" / "plan.md").write_text(ORIGINAL, encoding="utf-8")
    config = write_config(tmp_path / "nexus.yaml", 30)
    env = {"NEXUS_MCP_APPROVAL_SECRET": SECRET, "NEXUS_MCP_MODE": "prod"}
    env |= {"NEXUS_MCP_SUBJECT": "agent-7", "NEXUS_MCP_ROLE": "editor"}
    transport = StdioTransport(
        sys.executable,
        ["-m", "nexus_mcp", "serve", "--transport", "stdio", "--workspace", str(workspace),
         "--data-dir", str(data_dir), "--config", str(config)],
        env=server_env(env),
        keep_alive=False,
        log_file=tmp_path / "stderr.log",
    )  # fmt: skip
    asker, progress = Asker(), Progress()
    async with Client(transport, mode="legacy", elicitation_handler=asker) as client:
        waiting = asyncio.create_task(call(client, dict(WRITE), progress))
        request_id = await asyncio.wait_for(asker.ids.get(), BOUND)
        await asyncio.wait_for(progress.waiting.wait(), BOUND)
        await asyncio.to_thread(approve_with_cli, request_id, data_dir, config)
        result = await asyncio.wait_for(waiting, BOUND)
    assert result["isError"] is False, result
    assert (workspace / "scratch/plan.md").read_text() == CONTENT
    events = [json.loads(line) for line in (data_dir / "audit.jsonl").read_text().splitlines()]
    finished = finished_writes(events)
    assert len(finished) == 1 and finished[0]["approver"] == "ops-lead"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_http_client_waits_on_a_real_socket(
    workspace: Path, tmp_path: Path, data_dir: Path, audit: MemoryAuditSink, mode: str
) -> None:
    # Stateful HTTP: "legacy" answers ctx.elicit on its stream; "auto" negotiates
    # 2026-07-28 and answers the input_required question, its retry carrying the state.
    (workspace / "scratch").mkdir(exist_ok=True)
    (workspace / "scratch" / "plan.md").write_text(ORIGINAL, encoding="utf-8")
    settings = Settings(
        mode="prod",
        transport="http",
        workspace=workspace,
        data_dir=data_dir,
        auth={"jwt_secret": JWT_SECRET, "audience": AUDIENCE},
        port=0,
    )
    config = write_config(tmp_path / "nexus.yaml", 30)
    env = {"NEXUS_MCP_APPROVAL_SECRET": SECRET}
    asker, progress = Asker(), Progress()
    async with serve_settings(settings, audit, config_file=config, env=env) as (server, url):
        bearer = token("agent-7", role="editor")
        client = Client(url, auth=bearer, mode=mode, verify=TLS, elicitation_handler=asker)  # type: ignore[arg-type]
        async with client:
            approver = asyncio.create_task(
                decide_once_waiting(server, asker, progress, approve=True)
            )
            result = await asyncio.wait_for(call(client, dict(WRITE), progress), BOUND)
            await approver
    assert result["isError"] is False, result
    assert (workspace / "scratch/plan.md").read_text() == CONTENT
    assert len(asker.asked) == 1
    ends = [r for r in audit.records() if r.get("tool") == "nexus_write_file"]
    ends = [(r["event"], r["outcome"]) for r in ends if r["event"] != "tool_call_started"]
    question = [("tool_call_blocked", "INPUT_REQUIRED")] if mode == "auto" else []
    assert ends == [*question, (TOOL_CALL_FINISHED, "OK")]
