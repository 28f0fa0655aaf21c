"""Issue 6 end to end: approval tokens, the write policy, elicitation and the mint endpoint.

Every server here is built from a real YAML configuration file and talked to through a
real client (in-memory, or the HTTP app in-process for ``POST /approvals/mint``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from fastmcp.utilities.tests import asgi_server
from structlog.testing import capture_logs

from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.audit import TOOL_CALL_BLOCKED, TOOL_CALL_FINISHED, MemoryAuditSink
from nexus_mcp.observability.logs import ensure_logging
from nexus_mcp.policy.approvals import (
    APPROVAL_TOKEN_TYPE,
    ApprovalKeys,
    mint_approval_token,
)
from nexus_mcp.policy.write_policy import DEV_POLICY_WARNING, PROD_NO_POLICY_WARNING
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.server.startup import APPROVAL_REPLICAS_WARNING
from nexus_mcp.settings import Settings

from .conftest import ServerFactory, snapshot, wire

SECRET = "approval-secret-CANARY-5b1e-0123456789abcdef"
JWT_SECRET = "bearer-secret-for-http-tests-0123456789abcdef"
AUDIENCE = "nexus-approvals-test"
CONTENT = "CONTENT-CANARY-91c4 approved text\n"
META_TOKEN = "nexus.mcp/approval_token"
META_REPLAYED = "nexus.mcp/idempotent_replay"
ALL_OPERATIONS = ["write", "edit", "delete", "mkdir", "rmdir", "rename"]
POLICY: dict[str, Any] = {
    "workspace": {
        "allowed_paths": ["scratch/**", "notes/**"],
        "allowed_operations": ["write", "edit", "mkdir", "rmdir", "rename"],  # no delete
        "max_bytes_per_write": 2048,
        "max_changed_lines_per_edit": 5,
        "require_approval": True,
    }
}
REQUIRED_MESSAGE = (
    "this write requires approval: request {request_id} waits in the approvals inbox "
    "(nexus-mcp approvals show {request_id}); call again with the same arguments once it "
    "is approved, or pass an approval_token minted for this tool and these exact arguments"
)

Builder = Callable[..., NexusServer]


@pytest.fixture(autouse=True)
def _logging_configured() -> None:
    """Configure logging as the server would, before capture_logs or capsys replace anything."""
    ensure_logging()


@pytest.fixture
def build(workspace: Path, tmp_path: Path, audit: MemoryAuditSink) -> Iterator[Builder]:
    """Build a server from a YAML config file (``policies=None`` leaves the section out)."""
    built: list[NexusServer] = []
    counter = iter(range(1000))

    def factory(
        policies: Mapping[str, Any] | None = POLICY,
        *,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> NexusServer:
        number = next(counter)
        config = tmp_path / f"nexus-{number}.yaml"
        document = {} if policies is None else {"write_policies": dict(policies)}
        config.write_text(yaml.safe_dump(document), encoding="utf-8")
        values: dict[str, Any] = {
            "mode": "prod",
            "subject": "alice",
            "role": "editor",
            "workspace": workspace,
            "data_dir": tmp_path / f"data-{number}",
        }
        values.update(overrides)
        server = build_server(
            Settings(**values),
            config_file=config,
            audit_sinks=[audit],
            env={"NEXUS_MCP_APPROVAL_SECRET": SECRET} if env is None else env,
        )
        built.append(server)
        return server

    yield factory
    for server in built:
        server.close()


def mint(
    server: NexusServer,
    tool: str,
    arguments: Mapping[str, Any],
    *,
    subject: str = "alice",
    now: float | None = None,
    keys: ApprovalKeys | None = None,
) -> str:
    assert server.runtime.approval_keys is not None
    return mint_approval_token(
        keys or server.runtime.approval_keys,
        server.runtime.approval_settings,
        approver="bob-approver",
        subject=subject,
        tool=tool,
        arguments=arguments,
        host_id="ci-host",
        now=now,
    )


def envelope(result: dict[str, Any]) -> dict[str, str]:
    assert result["isError"] is True, result
    payload: dict[str, str] = json.loads(result["content"][0]["text"])
    assert "structuredContent" not in result
    assert set(payload) == {"error", "code"}
    return payload


def code_of(result: dict[str, Any]) -> str:
    return envelope(result)["code"]


def write_args(
    key: str, path: str = "scratch/approved.txt", content: str = CONTENT
) -> dict[str, Any]:
    return {"path": path, "content": content, "idempotency_key": key}


async def call(
    client: Client[Any], tool: str, args: dict[str, Any], meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    return wire(await client.call_tool_mcp(tool, args, meta=meta))


def jti_digest(token: str) -> str:
    claims = jwt.decode(token, options={"verify_signature": False})
    return hashlib.sha256(claims["jti"].encode()).hexdigest()


def last_event(audit: MemoryAuditSink) -> dict[str, Any]:
    records = [r for r in audit.records() if r["event"] != "tool_call_started"]
    return records[-1]


def assert_blocked(audit: MemoryAuditSink, code: str) -> dict[str, Any]:
    record = last_event(audit)
    assert (record["event"], record["outcome"]) == (TOOL_CALL_BLOCKED, code)
    assert "side_effects" not in record
    # Only a token that verified (a replay) names its approver; nothing else does.
    assert ("approver" in record) == (code == "APPROVAL_REPLAYED")
    return record


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def tamper_subject(token: str, subject: str) -> str:
    """Swap the payload's subject, keeping header and signature: a forged token."""
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["subject"] = subject
    forged = b64url(json.dumps(claims, separators=(",", ":")).encode())
    return f"{header}.{forged}.{signature}"


# -- tokens ------------------------------------------------------------------------------


async def test_a_write_without_a_token_says_how_to_get_one_and_changes_nothing(
    build: Builder, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build()
    before = snapshot(workspace)
    async with Client(server.mcp) as client:
        result = await call(client, "nexus_write_file", write_args("k-none"))
    payload = envelope(result)
    assert payload["code"] == "APPROVAL_REQUIRED"
    # The request it opened in the approvals inbox, named, and the token way still told.
    request_id = result["_meta"]["nexus.mcp/approval_request_id"]
    assert payload["error"] == REQUIRED_MESSAGE.format(request_id=request_id)
    assert snapshot(workspace) == before
    record = assert_blocked(audit, "APPROVAL_REQUIRED")
    assert (record["policy_decision"], record["policy_rule"]) == ("allowed", "allowed")
    assert record["tool_class"] == "write"


async def test_a_valid_token_approves_exactly_one_write_and_a_same_key_retry_replays(
    build: Builder, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build()
    args = write_args("k-1")
    token = mint(server, "nexus_write_file", args)
    async with Client(server.mcp, mode="legacy") as client:
        first = await call(client, "nexus_write_file", {**args, "approval_token": token})
        assert first["isError"] is False, first
        assert (workspace / "scratch/approved.txt").read_text() == CONTENT
        finished = last_event(audit)
        after_write = snapshot(workspace)

        # Same token, new idempotency key: the token was spent.
        second = await call(
            client, "nexus_write_file", {**write_args("k-2"), "approval_token": token}
        )
        assert code_of(second) == "APPROVAL_REPLAYED"
        assert_blocked(audit, "APPROVAL_REPLAYED")
        assert snapshot(workspace) == after_write

        # Same idempotency key: the recorded result, not a second approval check.
        retry = await call(client, "nexus_write_file", {**args, "approval_token": token})
    assert retry["isError"] is False, retry
    assert retry["structuredContent"] == first["structuredContent"]
    assert retry["_meta"][META_REPLAYED] is True
    assert snapshot(workspace) == after_write

    assert finished["event"] == TOOL_CALL_FINISHED and finished["outcome"] == "OK"
    assert finished["approver"] == "bob-approver"
    assert finished["host_id"] == "ci-host"
    assert finished["approval_jti_digest"] == jti_digest(token)
    assert (finished["policy_decision"], finished["policy_rule"]) == ("allowed", "allowed")
    assert finished["side_effects"] is True
    assert finished["tool_class"] == "write"
    content_hash = hashlib.sha256(CONTENT.encode()).hexdigest()
    assert [h["hash"] for h in finished["document_hashes"]] == [content_hash]


async def test_a_token_in_meta_approves_the_write(
    build: Builder, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build()
    args = write_args("k-meta")
    token = mint(server, "nexus_write_file", args)
    async with Client(server.mcp) as client:
        result = await call(client, "nexus_write_file", args, meta={META_TOKEN: token})
    assert result["isError"] is False, result
    assert (workspace / "scratch/approved.txt").read_text() == CONTENT
    assert last_event(audit)["approval_jti_digest"] == jti_digest(token)


async def test_different_tokens_in_arguments_and_meta_are_invalid_input(
    build: Builder, workspace: Path
) -> None:
    server = build()
    args = write_args("k-both")
    one, other = mint(server, "nexus_write_file", args), mint(server, "nexus_write_file", args)
    before = snapshot(workspace)
    async with Client(server.mcp) as client:
        both = await call(
            client, "nexus_write_file", {**args, "approval_token": one}, meta={META_TOKEN: other}
        )
        # Neither token was spent by the refused call.
        ok = await call(client, "nexus_write_file", {**args, "approval_token": one})
    assert code_of(both) == "INVALID_INPUT"
    assert one not in json.dumps(both) and other not in json.dumps(both)
    assert ok["isError"] is False, ok
    assert snapshot(workspace) != before


OTHER_KEYS = ApprovalKeys({"k1": b"another-approval-secret-0123456789abcdef"}, "k1")


def _other_arguments(server: NexusServer, args: dict[str, Any]) -> str:
    return mint(server, "nexus_write_file", {**args, "content": "something else"})


def _other_tool(server: NexusServer, args: dict[str, Any]) -> str:
    return mint(server, "nexus_edit_file", args)


def _other_subject(server: NexusServer, args: dict[str, Any]) -> str:
    return mint(server, "nexus_write_file", args, subject="mallory")


def _wrong_secret(server: NexusServer, args: dict[str, Any]) -> str:
    return mint(server, "nexus_write_file", args, keys=OTHER_KEYS)


def _tampered(server: NexusServer, args: dict[str, Any]) -> str:
    return tamper_subject(mint(server, "nexus_write_file", args, subject="mallory"), "alice")


def _not_yet_valid(server: NexusServer, args: dict[str, Any]) -> str:
    return mint(server, "nexus_write_file", args, now=time.time() + 120)


def _alg_none(server: NexusServer, args: dict[str, Any]) -> str:
    genuine = jwt.decode(
        mint(server, "nexus_write_file", args), options={"verify_signature": False}
    )
    headers = {"kid": "k1", "typ": APPROVAL_TOKEN_TYPE}
    return jwt.encode(genuine, None, algorithm="none", headers=headers)  # type: ignore[arg-type]


def _garbage(server: NexusServer, args: dict[str, Any]) -> str:
    return "not-a-token-" + SECRET[:4]


def _expired(server: NexusServer, args: dict[str, Any]) -> str:
    # exp = now - 100, which is beyond the 30 s leeway
    return mint(server, "nexus_write_file", args, now=time.time() - 400)


BAD_TOKENS: list[tuple[str, Callable[[NexusServer, dict[str, Any]], str], str]] = [
    ("other-arguments", _other_arguments, "APPROVAL_INVALID"),
    ("other-tool", _other_tool, "APPROVAL_INVALID"),
    ("other-subject", _other_subject, "APPROVAL_INVALID"),
    ("wrong-secret", _wrong_secret, "APPROVAL_INVALID"),
    ("tampered-payload", _tampered, "APPROVAL_INVALID"),
    ("not-yet-valid", _not_yet_valid, "APPROVAL_INVALID"),
    ("alg-none", _alg_none, "APPROVAL_INVALID"),
    ("garbage", _garbage, "APPROVAL_INVALID"),
    ("expired", _expired, "APPROVAL_EXPIRED"),
]


@pytest.mark.parametrize(
    ("make_token", "code"), [c[1:] for c in BAD_TOKENS], ids=[c[0] for c in BAD_TOKENS]
)
async def test_a_token_not_for_this_exact_call_is_refused_and_changes_nothing(
    build: Builder,
    workspace: Path,
    audit: MemoryAuditSink,
    make_token: Callable[[NexusServer, dict[str, Any]], str],
    code: str,
) -> None:
    server = build()
    args = write_args("k-bad")
    token = make_token(server, args)
    before = snapshot(workspace)
    async with Client(server.mcp) as client:
        result = await call(client, "nexus_write_file", {**args, "approval_token": token})
        assert code_of(result) == code
        assert token not in json.dumps(result) and SECRET not in json.dumps(result)
        assert snapshot(workspace) == before
        assert_blocked(audit, code)
        # The refused token spent nothing: a genuine token for the call still works.
        genuine = mint(server, "nexus_write_file", args)
        ok = await call(client, "nexus_write_file", {**args, "approval_token": genuine})
    assert ok["isError"] is False, ok


async def test_a_forged_copy_of_a_valid_token_does_not_spend_its_nonce(
    build: Builder, workspace: Path
) -> None:
    server = build()
    args = write_args("k-forge")
    token = mint(server, "nexus_write_file", args)
    forged = tamper_subject(token, "alice ")
    async with Client(server.mcp) as client:
        assert (
            code_of(await call(client, "nexus_write_file", {**args, "approval_token": forged}))
            == "APPROVAL_INVALID"
        )
        ok = await call(client, "nexus_write_file", {**args, "approval_token": token})
    assert ok["isError"] is False, ok


async def test_fifty_concurrent_uses_of_one_token_write_exactly_once(
    build: Builder, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build()
    base = {"path": "scratch/race.txt", "content": CONTENT}
    token = mint(server, "nexus_write_file", base)
    async with Client(server.mcp, mode="legacy") as client:
        results = await asyncio.gather(
            *(
                call(
                    client,
                    "nexus_write_file",
                    {**base, "idempotency_key": f"race-{n}", "approval_token": token},
                )
                for n in range(50)
            )
        )
    ok = [r for r in results if not r["isError"]]
    refused = [code_of(r) for r in results if r["isError"]]
    assert len(ok) == 1
    assert refused == ["APPROVAL_REPLAYED"] * 49
    assert (workspace / "scratch/race.txt").read_text() == CONTENT
    finished = [r for r in audit.records() if r["event"] == TOOL_CALL_FINISHED]
    blocked = [r for r in audit.records() if r["event"] == TOOL_CALL_BLOCKED]
    assert len(finished) == 1 and len(blocked) == 49
    assert {r["outcome"] for r in blocked} == {"APPROVAL_REPLAYED"}


@pytest.mark.parametrize("shift", [-320, 20], ids=["expired-within-leeway", "early-within-leeway"])
async def test_clock_skew_within_the_leeway_is_tolerated(
    build: Builder, workspace: Path, shift: int
) -> None:
    """exp 20 s ago, or nbf 20 s ahead, is within the 30 s leeway."""
    server = build()
    args = write_args("k-skew")
    token = mint(server, "nexus_write_file", args, now=time.time() + shift)
    async with Client(server.mcp) as client:
        result = await call(client, "nexus_write_file", {**args, "approval_token": token})
    assert result["isError"] is False, result
    assert (workspace / "scratch/approved.txt").read_text() == CONTENT


async def test_concurrent_retries_with_one_key_write_once_and_all_get_the_result(
    build: Builder, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build()
    args = write_args("k-same")
    token = mint(server, "nexus_write_file", args)
    async with Client(server.mcp, mode="legacy") as client:
        results = await asyncio.gather(
            *(
                call(client, "nexus_write_file", {**args, "approval_token": token})
                for _ in range(20)
            )
        )
    assert [r["isError"] for r in results] == [False] * 20
    assert len({json.dumps(r["structuredContent"], sort_keys=True) for r in results}) == 1
    assert sum(1 for r in results if r["_meta"].get(META_REPLAYED)) == 19
    executed = [
        r
        for r in audit.records()
        if r["event"] == TOOL_CALL_FINISHED and r.get("idempotency") != "replayed"
    ]
    assert len(executed) == 1 and executed[0]["approval_jti_digest"] == jti_digest(token)
    assert (workspace / "scratch/approved.txt").read_text() == CONTENT


# -- write policy ------------------------------------------------------------------------


def _prepare_nested_git(workspace: Path) -> None:
    (workspace / "scratch/proj/.git").mkdir(parents=True)
    (workspace / "scratch/proj/.git/HEAD").write_text("ref: refs/heads/main\n")
    (workspace / "scratch/proj/readme.md").write_text("proj\n")


POLICY_DENIALS: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "outside-allowed",
        "nexus_write_file",
        {"path": "src/new.py", "content": "x"},
        "path_not_allowed",
    ),
    (
        "top-level-file",
        "nexus_write_file",
        {"path": "todo.txt", "content": "x"},
        "path_not_allowed",
    ),
    (
        "nested-git",
        "nexus_write_file",
        {"path": "scratch/.git/config", "content": "x"},
        "path_disallowed",
    ),
    ("operation", "nexus_delete_file", {"path": "scratch/README.txt"}, "operation_not_allowed"),
    (
        "max-bytes",
        "nexus_write_file",
        {"path": "scratch/big.txt", "content": "y" * 2049},
        "max_bytes",
    ),
    (
        "max-lines",
        "nexus_edit_file",
        {"path": "scratch/README.txt", "old_text": "x", "new_text": "a\nb\nc\nd\ne\nf\n"},
        "max_changed_lines",
    ),
    (
        "rename-dest",
        "nexus_rename_file",
        {"source": "scratch/README.txt", "destination": "src/README.txt"},
        "path_not_allowed",
    ),
    (
        "rename-into-git",
        "nexus_rename_file",
        {"source": "scratch/README.txt", "destination": "scratch/.git"},
        "path_disallowed",
    ),
    (
        "rmdir-nested-git",
        "nexus_rmdir",
        {"path": "scratch/proj", "recursive": True},
        "disallowed_subtree",
    ),
    (
        "move-nested-git",
        "nexus_rename_file",
        {"source": "scratch/proj", "destination": "notes/proj"},
        "disallowed_subtree",
    ),
]


# What each denial says: the rule and the setting that decided, never the path (issue 24).
DENIAL_MESSAGES = {
    rule: f"write denied by the write policy (rule {rule}): {text}"
    for rule, text in (
        ("path_not_allowed", "no allowed_paths entry matches this path"),
        (
            "path_disallowed",
            "this path is under a built-in disallowed path (.git or .github/workflows)",
        ),
        ("operation_not_allowed", "the operation 'delete' is not in allowed_operations"),
        ("max_bytes", "the content is over max_bytes_per_write (2048 bytes)"),
        (
            "max_changed_lines",
            "the edit changes more lines than max_changed_lines_per_edit (5 lines)",
        ),
        (
            "disallowed_subtree",
            "a folder moved or removed holds a path under a built-in disallowed path "
            "(.git or .github/workflows)",
        ),
    )
}


@pytest.mark.parametrize(
    ("tool", "args", "rule"), [c[1:] for c in POLICY_DENIALS], ids=[c[0] for c in POLICY_DENIALS]
)
async def test_the_write_policy_denies_before_approval_and_changes_nothing(
    build: Builder,
    workspace: Path,
    audit: MemoryAuditSink,
    tool: str,
    args: dict[str, Any],
    rule: str,
) -> None:
    _prepare_nested_git(workspace)
    server = build()
    call_args = {**args, "idempotency_key": "k-policy"}
    token = mint(server, tool, call_args)  # a valid approval does not override the policy
    before = snapshot(workspace)
    async with Client(server.mcp) as client:
        result = await call(client, tool, {**call_args, "approval_token": token})
    assert envelope(result) == {"error": DENIAL_MESSAGES[rule], "code": "WRITE_POLICY_DENIED"}
    assert snapshot(workspace) == before
    record = assert_blocked(audit, "WRITE_POLICY_DENIED")
    assert (record["policy_decision"], record["policy_rule"]) == ("denied", rule)


async def test_writes_at_the_limits_pass_the_policy(build: Builder, workspace: Path) -> None:
    """The limits are inclusive: 2048 bytes and 5 changed lines are allowed."""
    (workspace / "scratch/edit.txt").write_text("one\ntwo\nthree\n")
    server = build()
    write = {"path": "notes/exact.txt", "content": "z" * 2048, "idempotency_key": "k-exact"}
    edit = {
        "path": "scratch/edit.txt",
        "old_text": "two\n",
        "new_text": "2\n2\n2\n2\n",
        "idempotency_key": "k-e",
    }
    async with Client(server.mcp) as client:
        wrote = await call(
            client,
            "nexus_write_file",
            {**write, "approval_token": mint(server, "nexus_write_file", write)},
        )
        edited = await call(
            client,
            "nexus_edit_file",
            {**edit, "approval_token": mint(server, "nexus_edit_file", edit)},
        )
    assert wrote["isError"] is False, wrote
    assert edited["isError"] is False, edited
    assert (workspace / "scratch/edit.txt").read_text() == "one\n2\n2\n2\n2\nthree\n"


GIT_AND_WORKFLOW_PATHS = [
    ".git/config",
    ".GIT/config",
    ".git./config",
    "src/.git/hooks/pre-commit",
    ".github/workflows/ci.yml",
    ".GitHub/Workflows/ci.yml",
]


@pytest.mark.parametrize("path", GIT_AND_WORKFLOW_PATHS)
async def test_git_and_workflow_paths_are_denied_even_when_allowed_paths_match_everything(
    build: Builder, workspace: Path, path: str
) -> None:
    (workspace / ".github/workflows").mkdir(parents=True)
    (workspace / ".git").mkdir()
    policy = {
        "workspace": {
            "allowed_paths": ["**"],
            "allowed_operations": ALL_OPERATIONS,
            "require_approval": False,
        }
    }
    server = build(policy)
    before = snapshot(workspace)
    async with Client(server.mcp) as client:
        denied = await call(
            client, "nexus_write_file", {"path": path, "content": "x", "idempotency_key": "k"}
        )
        control = await call(
            client,
            "nexus_write_file",
            {"path": ".github/CODEOWNERS", "content": "x", "idempotency_key": "k2"},
        )
    assert code_of(denied) == "WRITE_POLICY_DENIED"
    assert control["isError"] is False, control
    after = snapshot(workspace)
    assert after.pop(".github/CODEOWNERS") == b"x"
    assert after == before


async def test_prod_without_a_write_policy_denies_every_write(
    build: Builder, workspace: Path, audit: MemoryAuditSink
) -> None:
    with capture_logs() as logs:
        server = build(None, env={})  # no policy: no approval secret needed either
    assert {
        "event": "write_policy",
        "message": PROD_NO_POLICY_WARNING,
        "log_level": "warning",
    } in logs
    before = snapshot(workspace)
    calls = [
        ("nexus_write_file", {"path": "scratch/a.txt", "content": "x"}),
        ("nexus_mkdir", {"path": "scratch/new"}),
        ("nexus_delete_file", {"path": "scratch/README.txt"}),
    ]
    async with Client(server.mcp) as client:
        codes = [
            code_of(await call(client, tool, {**args, "idempotency_key": tool}))
            for tool, args in calls
        ]
        read = await call(client, "nexus_read_file", {"path": "scratch/README.txt"})
    assert codes == ["WRITE_POLICY_DENIED"] * 3
    assert read["isError"] is False
    assert snapshot(workspace) == before
    blocked = [r for r in audit.records() if r["event"] == TOOL_CALL_BLOCKED]
    assert [r["policy_rule"] for r in blocked] == ["no_policy"] * 3


async def test_dev_without_config_is_permissive_but_still_protects_git_and_warns(
    make_server: ServerFactory, workspace: Path
) -> None:
    with capture_logs() as logs:
        server = make_server()
    assert {"event": "write_policy", "message": DEV_POLICY_WARNING, "log_level": "warning"} in logs
    async with Client(server.mcp) as client:
        ok = await call(
            client,
            "nexus_write_file",
            {"path": "src/dev.txt", "content": "dev", "idempotency_key": "k"},
        )
        git = await call(
            client,
            "nexus_write_file",
            {"path": ".git/config", "content": "x", "idempotency_key": "k2"},
        )
        workflow = await call(
            client,
            "nexus_write_file",
            {"path": ".github/workflows/x.yml", "content": "x", "idempotency_key": "k3"},
        )
    assert ok["isError"] is False, ok
    assert (workspace / "src/dev.txt").read_text() == "dev"
    assert code_of(git) == code_of(workflow) == "WRITE_POLICY_DENIED"
    assert not (workspace / ".git").exists()


# -- start-up validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("allowed", "location"),
    [
        (["scratch/**", "notes/[abc"], "write_policies.workspace.allowed_paths[1]"),
        (["scratch/**x"], "write_policies.workspace.allowed_paths[0]"),
        (["/etc/**"], "write_policies.workspace.allowed_paths[0]"),
        (["scratch/../**"], "write_policies.workspace.allowed_paths[0]"),
    ],
)
def test_a_malformed_pattern_stops_start_up_naming_its_location(
    build: Builder, allowed: list[str], location: str
) -> None:
    policy = {"workspace": {**POLICY["workspace"], "allowed_paths": allowed}}
    with pytest.raises(ConfigError) as raised:
        build(policy)
    assert location in str(raised.value)


def test_an_unknown_policy_field_stops_start_up(build: Builder) -> None:
    policy = {"workspace": {**POLICY["workspace"], "max_byte_per_write": 5}}
    with pytest.raises(ConfigError, match=r"write_policies\.workspace\.max_byte_per_write"):
        build(policy)


def test_a_policy_requiring_approval_without_a_secret_stops_start_up(build: Builder) -> None:
    with pytest.raises(ConfigError, match="requires approval but no approval secret"):
        build(env={})


def test_a_short_approval_secret_stops_start_up(build: Builder) -> None:
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        build(env={"NEXUS_MCP_APPROVAL_SECRET": "short"})


def test_an_approval_secret_equal_to_the_jwt_secret_stops_start_up(build: Builder) -> None:
    with pytest.raises(ConfigError, match=r"must differ from auth\.jwt_secret") as raised:
        build(auth={"jwt_secret": SECRET, "audience": AUDIENCE})
    assert SECRET not in str(raised.value)


# -- elicitation -------------------------------------------------------------------------

ELICIT_POLICY = {"workspace": {**POLICY["workspace"], "approval_mode": "elicit"}}


def elicitation(answer: Any) -> tuple[Callable[..., Any], list[str]]:
    asked: list[str] = []

    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        asked.append(message)
        return answer

    return handler, asked


async def test_an_approving_elicitation_lets_the_write_through(
    build: Builder, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = build(ELICIT_POLICY)
    handler, asked = elicitation(ElicitResult(action="accept", content={"value": "approve"}))
    async with Client(server.mcp, mode="legacy", elicitation_handler=handler) as client:
        result = await call(client, "nexus_write_file", write_args("k-el"))
    assert result["isError"] is False, result
    assert (workspace / "scratch/approved.txt").read_text() == CONTENT
    assert len(asked) == 1 and "scratch/approved.txt" in asked[0] and CONTENT not in asked[0]
    record = last_event(audit)
    assert (record["approver"], record["host_id"]) == ("alice", "elicitation")


@pytest.mark.parametrize(
    "answer",
    [
        ElicitResult(action="decline"),
        ElicitResult(action="cancel"),
        ElicitResult(action="accept", content={"value": "deny"}),
    ],
    ids=["decline", "cancel", "accept-deny"],
)
async def test_a_refused_elicitation_means_approval_required(
    build: Builder, workspace: Path, audit: MemoryAuditSink, answer: Any
) -> None:
    server = build(ELICIT_POLICY)
    handler, asked = elicitation(answer)
    before = snapshot(workspace)
    async with Client(server.mcp, mode="legacy", elicitation_handler=handler) as client:
        result = await call(client, "nexus_write_file", write_args("k-el"))
    assert code_of(result) == "APPROVAL_REQUIRED"
    assert len(asked) == 1
    assert snapshot(workspace) == before
    assert_blocked(audit, "APPROVAL_REQUIRED")


@pytest.mark.parametrize("mode", ["auto", "legacy-without-handler"])
async def test_elicitation_without_a_back_channel_fails_closed(
    build: Builder, workspace: Path, mode: str
) -> None:
    server = build(ELICIT_POLICY)
    handler, asked = elicitation(ElicitResult(action="accept", content={"value": "approve"}))
    client = (
        Client(server.mcp, mode="auto", elicitation_handler=handler)
        if mode == "auto"
        else Client(server.mcp, mode="legacy")
    )
    before = snapshot(workspace)
    async with client:
        result = await call(client, "nexus_write_file", write_args("k-el"))
    assert code_of(result) == "APPROVAL_REQUIRED"
    assert asked == []
    assert snapshot(workspace) == before


# -- POST /approvals/mint ----------------------------------------------------------------


def bearer(subject: str, role: str) -> str:
    now = int(time.time())
    claims = {"sub": subject, "aud": AUDIENCE, "iat": now, "exp": now + 300, "role": role}
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


@asynccontextmanager
async def http_app(build: Builder) -> AsyncIterator[Any]:
    server = build(
        transport="http",
        auth={"jwt_secret": JWT_SECRET, "audience": AUDIENCE},
        subject=None,
        role=None,
    )
    async with asgi_server(server.mcp) as running:
        yield running


async def test_an_admin_mints_a_token_over_http_that_approves_the_write(
    build: Builder, workspace: Path, audit: MemoryAuditSink, log_output: io.StringIO
) -> None:
    args = write_args("k-http")
    async with http_app(build) as running:
        async with running.http_client(
            headers={"Authorization": f"Bearer {bearer('root', 'admin')}"}
        ) as http:
            response = await http.post(
                "/approvals/mint",
                json={
                    "tool": "nexus_write_file",
                    "arguments": args,
                    "subject": "carol",
                    "host_id": "ops-console",
                },
            )
        assert response.status_code == 200, response.text
        assert response.headers["cache-control"] == "no-store"
        body = response.json()
        assert set(body) == {"approval_token", "expires_in"}
        assert SECRET not in response.text
        token = body["approval_token"]
        async with running.client(auth=bearer("carol", "editor")) as client:
            result = wire(
                await client.call_tool_mcp("nexus_write_file", {**args, "approval_token": token})
            )
            again = wire(
                await client.call_tool_mcp(
                    "nexus_write_file", {**write_args("k-http-2"), "approval_token": token}
                )
            )
        async with running.client(auth=bearer("dave", "editor")) as client:
            stolen = wire(
                await client.call_tool_mcp(
                    "nexus_write_file", {**write_args("k-http-3"), "approval_token": token}
                )
            )
    assert result["isError"] is False, result
    assert (workspace / "scratch/approved.txt").read_text() == CONTENT
    assert code_of(again) == "APPROVAL_REPLAYED"
    assert code_of(stolen) == "APPROVAL_INVALID"
    finished = [r for r in audit.records() if r["event"] == TOOL_CALL_FINISHED]
    assert [(r["subject"], r["approver"], r["host_id"]) for r in finished] == [
        ("carol", "root", "ops-console")
    ]
    logged = log_output.getvalue()
    assert "approval_minted" in logged
    for canary in (SECRET, token, "CONTENT-CANARY"):
        assert canary not in logged and canary not in json.dumps(audit.records())


async def test_the_mint_endpoint_refuses_everyone_but_approvers_and_bad_requests(
    build: Builder,
) -> None:
    good = {"tool": "nexus_write_file", "arguments": write_args("k")}
    admin = {"Authorization": f"Bearer {bearer('root', 'admin')}"}
    cases: list[tuple[dict[str, str], Any, int, str]] = [
        ({}, json.dumps(good), 401, "APPROVAL_INVALID"),
        ({"Authorization": "Bearer not-a-jwt"}, json.dumps(good), 401, "APPROVAL_INVALID"),
        (
            {"Authorization": f"Bearer {bearer('vic', 'viewer')}"},
            json.dumps(good),
            403,
            "APPROVAL_INVALID",
        ),
        (
            {"Authorization": f"Bearer {bearer('ed', 'editor')}"},
            json.dumps(good),
            403,
            "APPROVAL_INVALID",
        ),
        (admin, "{not json", 400, "INVALID_INPUT"),
        # Numbers Python's JSON reader accepts and JSON has not: no token binds them.
        (admin, '{"tool": "nexus_write_file", "arguments": {"x": NaN}}', 400, "INVALID_INPUT"),
        (admin, '{"tool": "nexus_write_file", "arguments": {"n": [1e999]}}', 400, "INVALID_INPUT"),
        (
            admin,
            json.dumps({"tool": "nexus_read_file", "arguments": {"path": "todo.txt"}}),
            400,
            "INVALID_INPUT",
        ),
        (admin, json.dumps({"tool": "no_such_tool", "arguments": {}}), 400, "INVALID_INPUT"),
        (admin, json.dumps({"tool": "nexus_write_file"}), 400, "INVALID_INPUT"),
        (admin, json.dumps({**good, "extra": SECRET[:3]}), 400, "INVALID_INPUT"),
    ]
    async with http_app(build) as running:
        for headers, body, status, code in cases:
            async with running.http_client(headers=headers) as http:
                response = await http.post("/approvals/mint", content=body)
            assert (response.status_code, response.json()["code"]) == (status, code), (
                headers,
                body,
            )
            assert response.headers["cache-control"] == "no-store"
            assert set(response.json()) == {"error", "code"}
            assert SECRET not in response.text and "approval_token" not in response.json()


async def test_the_mint_endpoint_answers_503_when_approvals_are_not_configured(
    build: Builder,
) -> None:
    server = build(
        None, env={}, transport="http", auth={"jwt_secret": JWT_SECRET, "audience": AUDIENCE}
    )
    async with (
        asgi_server(server.mcp) as running,
        running.http_client(headers={"Authorization": f"Bearer {bearer('root', 'admin')}"}) as http,
    ):
        response = await http.post(
            "/approvals/mint", json={"tool": "nexus_write_file", "arguments": {}}
        )
    assert response.status_code == 503
    assert response.json()["code"] == "APPROVAL_INVALID"
    assert response.headers["cache-control"] == "no-store"


# -- canaries ----------------------------------------------------------------------------


async def test_secret_tokens_and_content_never_reach_envelopes_audit_or_logs(
    build: Builder,
    audit: MemoryAuditSink,
    log_output: io.StringIO,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level("DEBUG")
    server = build()
    args = write_args("k-canary")
    token = mint(server, "nexus_write_file", args)
    bad = mint(server, "nexus_write_file", args, keys=OTHER_KEYS)
    expired = mint(server, "nexus_write_file", args, now=time.time() - 400)
    async with Client(server.mcp) as client:
        results = [
            await call(client, "nexus_write_file", args),
            await call(client, "nexus_write_file", {**args, "approval_token": bad}),
            await call(client, "nexus_write_file", {**args, "approval_token": expired}),
            await call(client, "nexus_write_file", {**args, "approval_token": token}),
            await call(client, "nexus_write_file", {**args, "approval_token": token}),
            await call(client, "nexus_write_file", {**write_args("k-2"), "approval_token": token}),
            await call(client, "nexus_write_file", write_args("k-3"), meta={META_TOKEN: token}),
        ]
    assert [r["isError"] for r in results] == [True, True, True, False, False, True, True]
    seen = {
        "envelopes": json.dumps(results),
        "audit": json.dumps(audit.records()),
        "structlog": log_output.getvalue(),
        "stdlib": caplog.text + repr([r.__dict__ for r in caplog.records]),
        "stderr": capsys.readouterr().err,
    }
    assert "server_built" in seen["structlog"]  # the capture works
    for where, text in seen.items():
        for canary in (SECRET, token, bad, expired, "CONTENT-CANARY"):
            assert canary not in text, where


# -- audit CLI ---------------------------------------------------------------------------


def table_cells(line: str, widths: list[int]) -> list[str]:
    cells, start = [], 0
    for width in widths:
        cells.append(line[start : start + width].strip())
        start += width + 2
    return cells


async def test_audit_tail_and_verify_read_the_jsonl_trail(
    workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from nexus_mcp.cli import main

    data = tmp_path / "cli-data"
    server = build_server(
        Settings(mode="dev", workspace=workspace, data_dir=data), audit_sinks=None
    )
    try:
        async with Client(server.mcp) as client:
            await call(
                client,
                "nexus_write_file",
                {"path": "scratch/cli.txt", "content": "x", "idempotency_key": "k"},
            )
            await call(
                client,
                "nexus_write_file",
                {"path": ".git/x", "content": "x", "idempotency_key": "k2"},
            )
    finally:
        server.close()
    trail = data / "audit.jsonl"
    capsys.readouterr()

    assert main(["audit", "tail", "--file", str(trail)]) == 0
    header, rule, *lines = capsys.readouterr().out.splitlines()
    assert header.split() == [
        "ts",
        "event",
        "tool",
        "subject",
        "outcome",
        "duration_ms",
        "correlation_id",
    ]
    assert set(rule) == {"-", " "}
    columns = [len(dashes) for dashes in rule.split("  ")]
    rows = [table_cells(line, columns)[1:5] for line in lines]
    assert rows == [
        ["tool_call_started", "nexus_write_file", "dev", ""],
        ["tool_call_finished", "nexus_write_file", "dev", "OK"],
        ["tool_call_blocked", "nexus_write_file", "dev", "WRITE_POLICY_DENIED"],
    ]

    assert main(["audit", "verify", "--file", str(trail)]) == 0
    # The records and then the hash chain (issue 28) across its one segment.
    assert capsys.readouterr().out.strip().splitlines() == [
        "3 events, 0 problems",
        "chain intact: 3 records in 1 segments",
    ]

    with trail.open("a", encoding="utf-8") as handle:
        handle.write('{"v": 1, "event": "tool_call_finished", "tool_call_id": \n')
    assert main(["audit", "verify", "--file", str(trail)]) == 1
    out = capsys.readouterr().out
    assert "line 4: not valid JSON" in out and "4 events, 1 problems" in out


async def test_a_call_refused_after_approval_does_not_burn_the_token(
    build: Builder, workspace: Path
) -> None:
    """The nonce is spent only when the tool is about to run (every other check passed)."""
    server = build()
    args = write_args("k-burn")
    token = mint(server, "nexus_write_file", args)
    wrong = {"nexus.mcp/expected_document_hashes": [{"pointer": "/content", "hash": "0" * 64}]}
    async with Client(server.mcp) as client:
        refused = await call(
            client, "nexus_write_file", {**args, "approval_token": token}, meta=wrong
        )
        assert code_of(refused) == "DOC_HASH_MISMATCH"
        assert not (workspace / "scratch/approved.txt").exists()
        accepted = await call(client, "nexus_write_file", {**args, "approval_token": token})
    assert accepted["isError"] is False
    assert (workspace / "scratch/approved.txt").read_text() == CONTENT


def test_elicitation_policies_need_no_approval_secret(build: Builder) -> None:
    policy = {**POLICY["workspace"], "approval_mode": "elicit"}
    server = build({"workspace": policy}, env={})
    assert server.runtime.approval_keys is None


async def test_an_operator_can_choose_elicitation_for_one_profile(
    build: Builder, workspace: Path, audit: MemoryAuditSink
) -> None:
    """approvals_elicit_profiles: callers of those profiles confirm instead of using tokens."""
    server = build(approvals_elicit_profiles=("coding",))  # alice is an editor -> coding
    handler, asked = elicitation(ElicitResult(action="accept", content={"value": "approve"}))
    async with Client(server.mcp, mode="legacy", elicitation_handler=handler) as client:
        result = await call(client, "nexus_write_file", write_args("k-prof"))
    assert result["isError"] is False, result
    assert len(asked) == 1
    assert last_event(audit)["host_id"] == "elicitation"
    other = build(approvals_elicit_profiles=("coding",), profile="full")  # a different profile
    async with Client(other.mcp, mode="legacy", elicitation_handler=handler) as client:
        result = await call(client, "nexus_write_file", write_args("k-prof-2"))
    assert code_of(result) == "APPROVAL_REQUIRED"  # tokens still apply to everyone else
    assert len(asked) == 1


# -- single use across restarts (issue 10, item 3) ----------------------------------------

EDIT_FILE = "scratch/edit-me.txt"
EDIT_BEFORE = "alpha OLD omega\n"


def edit_args(key: str) -> dict[str, Any]:
    return {"path": EDIT_FILE, "old_text": "OLD", "new_text": "NEW", "idempotency_key": key}


APPROVED_CALLS: list[tuple[str, Callable[[str], dict[str, Any]], str, str]] = [
    # (tool, arguments for a key, file, what a person wrote there after the approved call)
    ("nexus_write_file", write_args, "scratch/approved.txt", "a person's own text\n"),
    ("nexus_edit_file", edit_args, EDIT_FILE, EDIT_BEFORE),  # reverted: a rerun would show
]


@pytest.mark.parametrize(
    ("tool", "args_for", "path", "changed"), APPROVED_CALLS, ids=["write", "edit"]
)
async def test_a_token_spent_before_a_restart_is_replayed_after_it_and_changes_nothing(
    build: Builder,
    workspace: Path,
    tmp_path: Path,
    audit: MemoryAuditSink,
    tool: str,
    args_for: Callable[[str], dict[str, Any]],
    path: str,
    changed: str,
) -> None:
    data_dir = tmp_path / "data-restart"
    (workspace / EDIT_FILE).write_text(EDIT_BEFORE, encoding="utf-8")
    before = build(data_dir=data_dir)
    token = mint(before, tool, args_for("k-first"))
    async with Client(before.mcp) as client:
        first = await call(client, tool, {**args_for("k-first"), "approval_token": token})
    assert first["isError"] is False, first
    before.close()  # the process stops; the token has minutes of life left
    (workspace / path).write_text(changed, encoding="utf-8")
    untouched = snapshot(workspace)

    after = build(data_dir=data_dir)
    async with Client(after.mcp) as client:
        in_arguments = await call(client, tool, {**args_for("k-second"), "approval_token": token})
        assert_blocked(audit, "APPROVAL_REPLAYED")
        in_meta = await call(client, tool, args_for("k-third"), meta={META_TOKEN: token})
        # The first call's own key still answers with its recorded result, not a rerun.
        retry = await call(client, tool, {**args_for("k-first"), "approval_token": token})
    assert code_of(in_arguments) == code_of(in_meta) == "APPROVAL_REPLAYED"
    assert retry["isError"] is False and retry["_meta"][META_REPLAYED] is True
    assert retry["structuredContent"] == first["structuredContent"]
    assert snapshot(workspace) == untouched


async def test_servers_sharing_a_data_dir_accept_one_token_once_between_them(
    build: Builder, workspace: Path, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data-shared"
    servers = [build(data_dir=data_dir), build(data_dir=data_dir)]
    base = {"path": "scratch/race.txt", "content": CONTENT}
    token = mint(servers[0], "nexus_write_file", base)
    async with Client(servers[0].mcp) as one, Client(servers[1].mcp) as two:
        results = await asyncio.gather(
            *(
                call(
                    (one, two)[n % 2],
                    "nexus_write_file",
                    {**base, "idempotency_key": f"shared-{n}", "approval_token": token},
                )
                for n in range(20)
            )
        )
    assert [r["isError"] for r in results].count(False) == 1
    assert sorted(code_of(r) for r in results if r["isError"]) == ["APPROVAL_REPLAYED"] * 19
    assert (workspace / "scratch/race.txt").read_text() == CONTENT


async def test_a_nonce_store_that_cannot_record_refuses_without_writing_or_spending(
    build: Builder, workspace: Path, tmp_path: Path, audit: MemoryAuditSink
) -> None:
    data_dir = tmp_path / "data-broken"
    broken = build(data_dir=data_dir)
    args = write_args("k-broken")
    token = mint(broken, "nexus_write_file", args)
    broken.runtime.nonces.close()  # the store can no longer be read or written
    before = snapshot(workspace)
    async with Client(broken.mcp) as client:
        refused = await call(client, "nexus_write_file", {**args, "approval_token": token})
    assert code_of(refused) == "INTERNAL_ERROR"
    assert token not in json.dumps(refused)
    assert snapshot(workspace) == before
    record = last_event(audit)
    assert (record["event"], record["outcome"]) == (TOOL_CALL_BLOCKED, "INTERNAL_ERROR")
    assert record["idempotency"] == "abandoned"
    broken.close()
    # Nothing was recorded: neither the token nor the key. A working server accepts both.
    repaired = build(data_dir=data_dir)
    async with Client(repaired.mcp) as client:
        accepted = await call(client, "nexus_write_file", {**args, "approval_token": token})
    assert accepted["isError"] is False, accepted
    assert (workspace / "scratch/approved.txt").read_text() == CONTENT


@pytest.mark.parametrize(
    ("stateless", "env", "warned"),
    [
        (True, None, True),
        (False, None, False),
        (True, {}, False),  # no approval keys: no tokens to replay
    ],
    ids=["stateless-with-keys", "sessions-with-keys", "stateless-without-keys"],
)
def test_stateless_http_with_approval_tokens_warns_that_replicas_need_the_shared_store(
    build: Builder, stateless: bool, env: dict[str, str] | None, warned: bool
) -> None:
    policies = POLICY if env is None else None
    with capture_logs() as logs:
        build(policies, env=env, stateless_http=stateless)
    warning = {
        "event": "approval_nonces_not_shared",
        "message": APPROVAL_REPLICAS_WARNING,
        "log_level": "warning",
    }
    assert (warning in logs) is warned
