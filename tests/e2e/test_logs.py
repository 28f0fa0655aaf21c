"""No content in logs, at any level: hostile canaries through a real server at DEBUG.

A real ``nexus-mcp serve --log-level DEBUG`` subprocess, over stdio and over streamable
HTTP on a real socket, is driven through every tool type with a distinct canary planted in
every kind of input: file content written, read and searched, file and folder names, glob
and grep patterns, note paths, bodies, headings and frontmatter, discovery queries and
names, idempotency keys, approval tokens (real and forged), ``_meta`` values, refused
inputs, the bearer token, a custom HTTP header, a query string, the configured secrets,
and (HTTP) a loopback canister whose response carries a canary header and body. Then its
whole stderr and its audit file are scanned.

stderr may carry none of them. The audit file records, by design, only the arguments a
tool declares loggable (``loggable_args``: file paths, glob patterns, a discovery tool
name) and the client's correlation id, and never the arguments of a refused input
(``INVALID_INPUT``/``INVALID_PATH``); those canaries are the only ones allowed there.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import pytest
import yaml
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nexus_mcp.observability.logs import LIBRARY_EVENT
from nexus_mcp.policy.approvals import ApprovalSettings, load_approval_keys, mint_approval_token
from tests.support.loopback import serve_in_thread

from .servers import free_port, http_server, server_env
from .test_notes import PAYLOAD_CANARY, Canister, _canister_app

pytestmark = pytest.mark.slow

# -- canaries ------------------------------------------------------------------------------

# Allowed in the audit file by design (loggable arguments, the correlation id); never on
# stderr. Paths and globs are built from these.
NAME = "CANARY-NAME-3a9c"
GLOB = "CANARY-GLOB-6e21"
DETAILS_NAME = "CANARY-TOOLNAME-8d04"
CORRELATION = "CANARY-CORRELATION-51fa"
AUDIT_BY_DESIGN = (NAME, GLOB, DETAILS_NAME, CORRELATION)

# Allowed nowhere.
# A file path the tool then refuses: neither the started event (written before the tool
# judges it) nor the finished one (an input refusal) may name it.
ESCAPE_FILE = "CANARY-ESCAPE-FILE-d41e"
READ_CONTENT = "CANARY-READ-CONTENT-0b7e"
WRITTEN = "CANARY-WRITTEN-CONTENT-94d2"
EDIT_NEW = "CANARY-EDIT-NEW-2c5b"
GREP = "CANARY-GREP-PATTERN-7a13"
NOTE_PATH = "CANARY-NOTE-PATH-c81f"
NOTE_BODY = "CANARY-NOTE-BODY-5d3a"
NOTE_FM = "CANARY-NOTE-FRONTMATTER-e6b0"
NOTE_HEADING = "CANARY-NOTE-HEADING-19ac"
SEARCH = "CANARY-SEARCH-QUERY-4f8e"
LOAD = "CANARY-LOAD-NAME-a2d7"
IDEMPOTENCY = "CANARY-IDEMPOTENCY-70c9"
FORGED_APPROVAL = "CANARY-FORGED-APPROVAL-3be5"
ESCAPE_NOTE = "CANARY-ESCAPE-NOTE-7b2c"
BAD_VALUE = "CANARY-BAD-VALUE-8e62"
EXTRA_ARG = "CANARY-EXTRA-ARG-0f3d"
UNKNOWN_TOOL = "CANARY-UNKNOWN-TOOL-b7a1"
META_VALUE = "CANARY-META-VALUE-6c20"
META_CLASS = "CANARY-META-CLASS-d9f3"
META_HASH = "CANARY-META-HASH-27e8"
META_IDEMPOTENCY = "CANARY-META-IDEMPOTENCY-5a4b"
META_APPROVAL = "CANARY-META-APPROVAL-e01c"
OVERSIZE = "CANARY-OVERSIZE-93bd"
CLIENT_NAME = "CANARY-CLIENT-NAME-f27d"
JWT_SECRET = "CANARY-JWT-SECRET-1f6a-0123456789abcdef-0123456789"
APPROVAL_SECRET = "CANARY-APPROVAL-SECRET-4e9d-0123456789abcdef-0123"
# HTTP only.
CUSTOM_HEADER = "CANARY-CUSTOM-HEADER-b3c8"
BAD_BEARER = "CANARY-BAD-BEARER-71e4"
QUERY = "CANARY-QUERY-STRING-0d95"
MINT_CONTENT = "CANARY-MINT-BODY-c6f2"
CANISTER_TOKEN = "CANARY-CANISTER-TOKEN-8a31"
GATEWAY_SECRET = "CANARY-GATEWAY-SECRET-2d7f"
CANISTER_HEADER = "CANARY-CANISTER-HEADER-e5a0"
CANISTER_BODY = "CANARY-CANISTER-BODY-43b9"
CANISTER_FM = "CANARY-CANISTER-FRONTMATTER-9c1d"
NOWHERE = (
    READ_CONTENT, WRITTEN, EDIT_NEW, GREP, NOTE_PATH, NOTE_BODY, NOTE_FM, NOTE_HEADING,
    SEARCH, LOAD, IDEMPOTENCY, FORGED_APPROVAL, ESCAPE_NOTE, ESCAPE_FILE, BAD_VALUE, EXTRA_ARG,
    UNKNOWN_TOOL,
    META_VALUE, META_CLASS, META_HASH, META_IDEMPOTENCY, META_APPROVAL, OVERSIZE, CLIENT_NAME,
    JWT_SECRET,
    APPROVAL_SECRET, CUSTOM_HEADER, BAD_BEARER, QUERY, MINT_CONTENT, CANISTER_TOKEN,
    GATEWAY_SECRET, CANISTER_HEADER, CANISTER_BODY, CANISTER_FM, PAYLOAD_CANARY,
)  # fmt: skip

AUDIENCE = "nexus-logs-test"
ALL_OPERATIONS = ["write", "edit", "delete", "mkdir", "rmdir", "rename"]
CONFIG = {
    "write_policies": {
        "workspace": {
            "allowed_paths": ["scratch/**"],
            "allowed_operations": ALL_OPERATIONS,
            "max_bytes_per_write": 4096,
            "require_approval": True,
        }
    }
}
NOTE_FILE = f"notes/{NOTE_PATH}.md"
NOTE_TEXT = (
    f"---\ntitle: Plan\nauthor: {NOTE_FM}\ntags: [{NOTE_FM}-tag]\n---\n"
    f"# Heading {NOTE_HEADING}\n\n{NOTE_BODY} first paragraph.\n\n## Details\n\n- {NOTE_BODY}\n"
)
NOTE_TOOLS = ("get_section_source", "get_note_outline", "get_document_tree", "get_metadata_facets")
# The keys of a record a library logged, whatever it logged (logs.py).
LIBRARY_LINE_KEYS = {"event", "level", "logger", "timestamp", "exc_type"}

Mint = Callable[[str, dict[str, Any]], Awaitable[str]]
CLIENT_INFO = Implementation(name=CLIENT_NAME, version=CLIENT_NAME)


# -- the calls ---------------------------------------------------------------------------


def code(result: Any) -> str:
    """``OK``, the envelope's code, or ``UNKNOWN`` for FastMCP's unknown-tool answer."""
    if not result.is_error:
        return "OK"
    # The envelope is text content only (no structuredContent, DESIGN.md).
    assert result.structured_content is None
    try:
        payload = json.loads(result.content[0].text)
    except ValueError:
        return "UNKNOWN"
    return str(payload["code"])


def text_of(result: Any) -> str:
    return json.dumps(result.model_dump(mode="json"))


async def exercise(session: ClientSession, mint: Mint) -> dict[str, str]:
    """Every tool type with canaries in its inputs; returns the code of each call."""
    codes: dict[str, str] = {}

    async def call(label: str, tool: str, args: dict[str, Any], **meta: Any) -> Any:
        request_meta: Any = meta or None  # any keys: the SDK's type names only its own
        result = await session.call_tool(tool, args, meta=request_meta)
        codes[label] = code(result)
        return result

    async def approved(label: str, tool: str, args: dict[str, Any]) -> Any:
        return await call(label, tool, {**args, "approval_token": await mint(tool, args)})

    scratch = f"scratch/{NAME}"
    # Files: read, list, info, glob and grep over planted content.
    read = await call("read", "nexus_read_file", {"path": f"{scratch}-planted.txt"})
    assert READ_CONTENT in text_of(read)  # the canary really went through the result
    await call("list", "nexus_list_files", {"path": "scratch", "recursive": True})
    await call("info", "nexus_file_info", {"path": f"{scratch}-planted.txt"})
    await call("glob", "nexus_glob", {"pattern": f"**/*{GLOB}*", "path": "."})
    grep = await call(
        "grep", "nexus_grep", {"pattern": GREP, "path": "scratch", "glob": f"*{GLOB}*"}
    )
    grep_all = await call("grep_all", "nexus_grep", {"pattern": GREP, "path": "scratch"})
    assert GREP in text_of(grep_all) or GREP in text_of(grep)
    # Writes, each with a real approval token and a canary idempotency key.
    written = {
        "path": f"{scratch}.txt",
        "content": f"{WRITTEN}\n",
        "idempotency_key": f"{IDEMPOTENCY}-1",
    }
    await approved("write", "nexus_write_file", written)
    read_written = await call("read_written", "nexus_read_file", {"path": f"{scratch}.txt"})
    assert WRITTEN in text_of(read_written)
    edit = {"path": f"{scratch}.txt", "old_text": WRITTEN, "new_text": EDIT_NEW,
            "idempotency_key": f"{IDEMPOTENCY}-2"}  # fmt: skip
    await approved("edit", "nexus_edit_file", edit)
    renamed = {"source": f"{scratch}.txt", "destination": f"{scratch}-renamed.txt",
               "idempotency_key": f"{IDEMPOTENCY}-3"}  # fmt: skip
    await approved("rename", "nexus_rename_file", renamed)
    await approved(
        "mkdir", "nexus_mkdir", {"path": f"{scratch}-dir", "idempotency_key": f"{IDEMPOTENCY}-4"}
    )
    await approved(
        "rmdir", "nexus_rmdir", {"path": f"{scratch}-dir", "idempotency_key": f"{IDEMPOTENCY}-5"}
    )
    await approved(
        "delete",
        "nexus_delete_file",
        {"path": f"{scratch}-renamed.txt", "idempotency_key": f"{IDEMPOTENCY}-6"},
    )
    # Notes: a note whose path, body, heading and frontmatter are canaries.
    for tool in NOTE_TOOLS:
        await call(f"note:{tool}", tool, {"path": NOTE_FILE})
    await call("note_unsafe", "get_note_outline", {"path": f"../{ESCAPE_NOTE}.md"})
    # Discovery.
    await call("search", "nexus_discovery_search_tools", {"query": SEARCH, "top_k": 3})
    await call("servers", "nexus_discovery_list_servers", {})
    await call("details", "nexus_discovery_get_tool_details", {"name": DETAILS_NAME})
    await call("load", "nexus_discovery_load_tools", {"names": [LOAD]})
    # Refused inputs.
    await call("escape", "nexus_read_file", {"path": f"../{ESCAPE_FILE}/secret.txt"})
    await call("bad_value", "nexus_read_file", {"path": [BAD_VALUE]})
    await call("extra_arg", "nexus_read_file", {"path": "todo.txt", EXTRA_ARG: EXTRA_ARG})
    await call("unknown_tool", UNKNOWN_TOOL, {"path": BAD_VALUE})
    unapproved = {
        "path": f"{scratch}-x.txt",
        "content": WRITTEN,
        "idempotency_key": f"{IDEMPOTENCY}-7",
    }
    await call("unapproved", "nexus_write_file", unapproved)
    await call("forged", "nexus_write_file", {**unapproved, "approval_token": FORGED_APPROVAL})
    outside = {
        "path": f"notes/{NAME}.md",
        "content": WRITTEN,
        "idempotency_key": f"{IDEMPOTENCY}-8",
    }
    await approved("outside_policy", "nexus_write_file", outside)
    oversize = {"path": f"{scratch}-big.txt", "content": OVERSIZE * 400,
                "idempotency_key": f"{IDEMPOTENCY}-9"}  # fmt: skip
    await approved("oversize", "nexus_write_file", oversize)
    conflict = {**written, "content": f"{WRITTEN} again"}
    await approved("conflict", "nexus_write_file", conflict)
    # _meta: a foreign key, the declared class, expected hashes, plumbing and correlation.
    foreign_meta = {"x.example/note": META_VALUE, "nexus.mcp/correlation_id": CORRELATION}
    await call("meta_value", "nexus_read_file", {"path": "todo.txt"}, **foreign_meta)
    await call("meta_class", "nexus_read_file", {"path": "todo.txt"},
               **{"nexus.mcp/tool_class": META_CLASS})  # fmt: skip
    hashed = {
        "path": f"{scratch}-h.txt",
        "content": WRITTEN,
        "idempotency_key": f"{IDEMPOTENCY}-10",
    }
    expected = [{"pointer": "/content", "hash": META_HASH}]
    await call("meta_hash", "nexus_write_file", hashed,
               **{"nexus.mcp/expected_document_hashes": expected,
                  "nexus.mcp/approval_token": await mint("nexus_write_file", hashed)})  # fmt: skip
    mismatch = [{"pointer": "/content", "hash": "0" * 64}]  # well formed, wrong
    await call("hash_mismatch", "nexus_write_file", hashed,
               **{"nexus.mcp/expected_document_hashes": mismatch,
                  "nexus.mcp/approval_token": await mint("nexus_write_file", hashed)})  # fmt: skip
    await call("meta_plumbing", "nexus_write_file", unapproved,
               **{"nexus.mcp/idempotency_key": META_IDEMPOTENCY,
                  "nexus.mcp/approval_token": META_APPROVAL})  # fmt: skip
    return codes


# Outcomes that do not depend on the transport or the notes backend.
EXPECTED_CODES = {
    "read": "OK", "list": "OK", "info": "OK", "glob": "OK", "grep": "OK", "grep_all": "OK",
    "write": "OK", "read_written": "OK", "edit": "OK", "rename": "OK", "mkdir": "OK",
    "rmdir": "OK", "delete": "OK",
    "search": "OK", "servers": "OK", "details": "NOT_FOUND", "load": "OK",
    "escape": "INVALID_PATH", "bad_value": "INVALID_INPUT", "extra_arg": "INVALID_INPUT",
    "unknown_tool": "UNKNOWN", "unapproved": "APPROVAL_REQUIRED", "forged": "APPROVAL_INVALID",
    "outside_policy": "WRITE_POLICY_DENIED", "oversize": "WRITE_POLICY_DENIED",
    "conflict": "IDEMPOTENCY_KEY_CONFLICT", "meta_value": "OK",
    "meta_class": "INVALID_INPUT", "meta_hash": "INVALID_INPUT",
    "hash_mismatch": "DOC_HASH_MISMATCH",
    "meta_plumbing": "INVALID_INPUT",
    **{f"note:{tool}": "OK" for tool in NOTE_TOOLS},
    "note_unsafe": "UPSTREAM_ERROR",
}  # fmt: skip


# -- checks --------------------------------------------------------------------------------


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """The log lines of stderr (the HTTP start-up banner is plain text for the operator)."""
    return [json.loads(ln) for ln in stderr.splitlines() if ln.startswith('{"')]


def assert_nothing_leaked(stderr: str, audit: str, dynamic: list[str]) -> None:
    assert audit.count('"tool_call_') >= len(EXPECTED_CODES)  # the audit file was written
    for canary in (*NOWHERE, *dynamic):
        assert canary not in stderr, canary
        assert canary not in audit, canary
    for canary in AUDIT_BY_DESIGN:
        assert canary not in stderr, canary
    assert NAME in audit and CORRELATION in audit  # the scan reads what the audit records
    lines = json_lines(stderr)
    library = [ln for ln in lines if not str(ln.get("logger", "")).startswith("nexus_mcp")]
    assert any(ln["level"] == "debug" for ln in library)  # DEBUG was really on
    for line in library:
        assert line["event"] == LIBRARY_EVENT and set(line) <= LIBRARY_LINE_KEYS, line


def write_config(tmp_path: Path) -> Path:
    config = tmp_path / "nexus.yaml"
    config.write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    return config


def plant(workspace: Path) -> None:
    (workspace / "scratch" / f"{NAME}-planted.txt").write_text(
        f"{READ_CONTENT}\nline with {GREP} inside\n", encoding="utf-8"
    )


# -- stdio ---------------------------------------------------------------------------------


async def test_stdio_at_debug_logs_no_input_result_or_secret(
    workspace: Path, tmp_path: Path
) -> None:
    plant(workspace)
    note = workspace / NOTE_FILE
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(NOTE_TEXT, encoding="utf-8")
    data = tmp_path / "data"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nexus_mcp", "serve", "--transport", "stdio", "--log-level", "DEBUG",
              "--mode", "prod", "--subject", "alice", "--role", "admin",
              "--workspace", str(workspace), "--data-dir", str(data),
              "--config", str(write_config(tmp_path))],
        env=server_env({"NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET,
                        "NEXUS_MCP_AUTH__JWT_SECRET": JWT_SECRET}),
    )  # fmt: skip
    keys = load_approval_keys({"NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET}, None)
    minted: list[str] = []

    async def mint(tool: str, arguments: dict[str, Any]) -> str:
        token = mint_approval_token(
            keys, ApprovalSettings(), approver="root", subject="alice", tool=tool,
            arguments=arguments, host_id="ci-host",
        )  # fmt: skip
        minted.append(token)
        return token

    stderr_path = tmp_path / "stderr.log"
    with stderr_path.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, client_info=CLIENT_INFO) as session,
        ):
            await session.initialize()
            await session.list_tools()
            codes = await exercise(session, mint)
    assert codes == EXPECTED_CODES
    assert_nothing_leaked(
        stderr_path.read_text(), (data / "audit.jsonl").read_text(), dynamic=minted
    )


# -- streamable HTTP -----------------------------------------------------------------------


@pytest.fixture
def canister() -> Iterator[Canister]:
    canister = Canister()

    def note(_request: Request) -> Response:
        body = f"# Hosted {NOTE_HEADING}\n\n{CANISTER_BODY} and {NOTE_BODY}\n"
        payload = {"path": NOTE_FILE, "body": body,
                   "frontmatter": json.dumps({"title": "T", "author": CANISTER_FM})}  # fmt: skip
        return JSONResponse(payload, headers={"x-canary": CANISTER_HEADER})

    canister.serve(NOTE_FILE.replace("/", "%2F"), note)
    with serve_in_thread(_canister_app(canister)) as base_url:
        canister.base_url = base_url
        yield canister


def bearer(subject: str, role: str) -> str:
    now = int(time.time())
    claims = {"sub": subject, "aud": AUDIENCE, "iat": now, "exp": now + 600, "role": role,
              "vault_id": "vault-A", "user_id": "actor-a", "canister_user_id": "c-a"}  # fmt: skip
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


async def test_streamable_http_at_debug_logs_no_input_result_header_or_secret(
    workspace: Path, tmp_path: Path, canister: Canister
) -> None:
    plant(workspace)
    data = tmp_path / "data"
    env = {
        "NEXUS_MCP_MODE": "prod",
        "NEXUS_MCP_AUTH__JWT_SECRET": JWT_SECRET,
        "NEXUS_MCP_AUTH__AUDIENCE": AUDIENCE,
        "NEXUS_MCP_DATA_DIR": str(data),
        "NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET,
        "NEXUS_MCP_NOTES__BACKEND": "canister",
        "NEXUS_MCP_NOTES__CANISTER_URL": canister.base_url,
        "NEXUS_MCP_NOTES__CANISTER_TOKEN": CANISTER_TOKEN,
        "NEXUS_MCP_NOTES__GATEWAY_SECRET": GATEWAY_SECRET,
    }
    caller, approver = bearer("carol", "admin"), bearer("root", "admin")
    minted: list[str] = []
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--workspace", str(workspace), "--log-level", "DEBUG",
            "--config", str(write_config(tmp_path))]  # fmt: skip
    stderr_path = tmp_path / "stderr.log"
    with stderr_path.open("wb") as errlog, http_server(args, env, port=port, stderr=errlog):
        async with httpx2.AsyncClient(
            base_url=url, timeout=10,
            headers={"Authorization": f"Bearer {caller}", "X-Canary": CUSTOM_HEADER},
        ) as http:  # fmt: skip

            async def mint(tool: str, arguments: dict[str, Any]) -> str:
                response = await http.post(
                    "/approvals/mint",
                    json={"tool": tool, "arguments": arguments, "subject": "carol"},
                    headers={"Authorization": f"Bearer {approver}"},
                )
                assert response.status_code == 200, response.status_code
                token: str = response.json()["approval_token"]
                minted.append(token)
                return token

            async with (
                streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, client_info=CLIENT_INFO) as session,
            ):
                await session.initialize()
                await session.list_tools()
                codes = await exercise(session, mint)
            refused = await http_refusals(url)
    assert codes == EXPECTED_CODES
    assert refused == [401, 401, 400, 403]
    assert canister.requests  # the hosted backend was really called
    assert all(r.headers["authorization"] == f"Bearer {CANISTER_TOKEN}" for r in canister.requests)
    stderr = stderr_path.read_text()
    assert_nothing_leaked(stderr, (data / "audit.jsonl").read_text(), dynamic=[caller, *minted])
    loggers = {str(ln.get("logger")) for ln in json_lines(stderr)}
    # The libraries that printed content before: they still say *that* they did something.
    assert any(name.startswith("sse_starlette") for name in loggers), loggers
    assert any(name.startswith("httpcore") for name in loggers), loggers


async def http_refusals(url: str) -> list[int]:
    """Requests the transport or the mint route refuse, each carrying canaries."""
    accept = {"Accept": "application/json, text/event-stream", "X-Canary": CUSTOM_HEADER}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "nexus_read_file", "arguments": {"path": BAD_VALUE}}}  # fmt: skip
    statuses = []
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        for auth in (f"Bearer {BAD_BEARER}", f"Basic {BAD_BEARER}"):
            response = await http.post(
                f"/mcp?token={QUERY}", json=body, headers={**accept, "Authorization": auth}
            )
            statuses.append(response.status_code)
        response = await http.post(
            f"/approvals/mint?{QUERY}",
            content=json.dumps({"tool": "nexus_write_file", "arguments": {}, MINT_CONTENT: 1}),
            headers={"Authorization": f"Bearer {bearer('root', 'admin')}"},
        )
        statuses.append(response.status_code)
        response = await http.post(
            "/approvals/mint",
            json={"tool": "nexus_write_file", "arguments": {"content": MINT_CONTENT}},
            headers={"Authorization": f"Bearer {bearer('mallory', 'editor')}"},
        )
        statuses.append(response.status_code)
    return statuses
