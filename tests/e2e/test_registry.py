"""Issue 3 end to end: manifest-first classification, document checks, hashing, parity.

Everything goes through FastMCP's in-memory client against a server built by
``build_server``. Custom registries are copies of the shipped ``nexus.json`` with a few
limits lowered, written to ``tmp_path`` and loaded with ``registry={"directory": ...}``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from fastmcp import Client
from jsonschema import Draft202012Validator
from pydantic import BaseModel

from nexus_mcp.calls import CallState
from nexus_mcp.contracts import nexus_tool
from nexus_mcp.errors import ConfigError
from nexus_mcp.middleware.chain import PolicyChain
from nexus_mcp.middleware.classification import ClassificationMiddleware
from nexus_mcp.middleware.documents import DocumentsMiddleware
from nexus_mcp.observability.audit import (
    TOOL_CALL_BLOCKED,
    TOOL_CALL_FINISHED,
    TOOL_CALL_STARTED,
    MemoryAuditSink,
)
from nexus_mcp.policy.classification import (
    WARNING_DECLARATION_DIFFERS,
    WARNING_HINTS_CONFLICT,
    WARNING_UNCLASSIFIED,
    Classification,
)
from nexus_mcp.policy.grants import grant_tool
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings

from .conftest import snapshot, wire

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_REGISTRY = REPO_ROOT / "schemas" / "mcp" / "registries" / "nexus.json"
EFFECT_SCHEMA = REPO_ROOT / "schemas" / "mcp" / "tool_effect.schema.json"

META_EFFECT = "nexus.mcp/tool_effect"
META_CLASS = "nexus.mcp/tool_class"
META_KEY = "nexus.mcp/idempotency_key"
META_HASHES = "nexus.mcp/expected_document_hashes"
CANARY = "CANARY-93c1-DOCUMENT"
ZONE = "default"

# The limits of the custom registry most tests use (decoded bytes).
WRITE_LIMIT = 16
EDIT_LIMIT = 6
RENAME_ITEM_LIMIT = 16
RENAME_BATCH_LIMIT = 20
READ_LIMIT = 32
LIMITED_SPECS: dict[str, dict[str, Any]] = {
    "nexus_read_file": {"max_read_bytes": READ_LIMIT},
    "nexus_write_file": {"max_write_bytes": WRITE_LIMIT},
    # base64 for a write tool: the preimage is the decoded bytes.
    "nexus_edit_file": {"content_encoding": "base64", "max_write_bytes": EDIT_LIMIT},
    "nexus_rename_file": {
        "max_write_bytes": RENAME_ITEM_LIMIT,
        "max_batch_bytes": RENAME_BATCH_LIMIT,
    },
    # /parents is optional in the arguments: a call without it has a pointer that does not resolve.
    "nexus_mkdir": {"write_content_pointers": ["/path", "/parents"]},
}
SNEAKY_ENTRY = {"tool_name": "sneaky_reader", "tool_class": "write", "is_document_op": False}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


SHIPPED_DIGEST = sha(SHIPPED_REGISTRY.read_bytes())


# --- test tools --------------------------------------------------------------------------

RUNS: list[str] = []


class Done(BaseModel):
    ok: bool


@nexus_tool(risk="read", toolset="test")
async def peek_status() -> Done:
    """Unclassified; read by its hints and its name."""
    RUNS.append("peek_status")
    return Done(ok=True)


@nexus_tool(risk="read", toolset="test")
async def delete_cache_entry(name: str, idempotency_key: str | None = None) -> Done:
    """Unclassified; declared read, but its name says it writes."""
    RUNS.append("delete_cache_entry")
    return Done(ok=True)


@nexus_tool(risk="write", toolset="test")
async def stamp_record(name: str, idempotency_key: str | None = None) -> Done:
    """Unclassified; an innocent name, declared write."""
    RUNS.append("stamp_record")
    return Done(ok=True)


@nexus_tool(risk="read", toolset="test")
async def sneaky_reader(path: str, idempotency_key: str | None = None) -> Done:
    """Declared read; the custom registry classifies it write."""
    RUNS.append("sneaky_reader")
    return Done(ok=True)


async def raw_probe() -> dict[str, bool]:
    """A tool registered on FastMCP directly (a mounted upstream tool): no connector."""
    RUNS.append("raw_probe")
    return {"ok": True}


# --- helpers -----------------------------------------------------------------------------


def envelope(result: dict[str, Any]) -> dict[str, str]:
    assert result["isError"] is True
    payload: dict[str, str] = json.loads(result["content"][0]["text"])
    assert "structuredContent" not in result
    assert set(payload) == {"error", "code"}
    return payload


def code_of(result: dict[str, Any]) -> str:
    return envelope(result)["code"]


def effect_of(result: dict[str, Any]) -> dict[str, Any]:
    assert result["isError"] is False, result
    effect: dict[str, Any] = result["_meta"][META_EFFECT]
    return effect


def events(audit: MemoryAuditSink, kind: str) -> list[dict[str, Any]]:
    return [r for r in audit.records() if r["event"] == kind]


def write_registry(
    directory: Path,
    specs: Mapping[str, Mapping[str, Any]] | None = None,
    extra: Sequence[Mapping[str, Any]] = (),
) -> Path:
    """A copy of the shipped registry with some document specs changed and tools added."""
    document = json.loads(SHIPPED_REGISTRY.read_text(encoding="utf-8"))
    for tool in document["tools"]:
        change = (specs or {}).get(tool["tool_name"])
        if change:
            tool["document_spec"] = {**tool["document_spec"], **change}
    document["tools"].extend(dict(e) for e in extra)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nexus.json"
    path.write_text(json.dumps(document, indent=2), encoding="utf-8")
    return path


Builder = Callable[..., NexusServer]


@pytest.fixture(autouse=True)
def _clear_runs() -> None:
    RUNS.clear()


@pytest.fixture
def limited_dir(tmp_path: Path) -> Path:
    """Custom registry: lowered limits, base64 edit, an optional pointer, sneaky_reader as write."""
    directory = tmp_path / "registry"
    write_registry(directory, LIMITED_SPECS, [SNEAKY_ENTRY])
    return directory


@pytest.fixture
def build(workspace: Path, tmp_path: Path, audit: MemoryAuditSink) -> Iterator[Builder]:
    """``build(extra_tools=..., grant=..., **settings)``: a server whose extra tools are granted."""
    built: list[NexusServer] = []

    def factory(
        *, extra_tools: Sequence[Any] = (), grant: Sequence[str] = (), **overrides: Any
    ) -> NexusServer:
        values: dict[str, Any] = {
            "mode": "dev",
            "workspace": workspace,
            "data_dir": tmp_path / "data",
        }
        values.update(overrides)
        settings = Settings(**values)
        server = build_server(settings, audit_sinks=[audit], extra_tools=extra_tools)
        built.append(server)
        subject = settings.subject or settings.dev_principal.subject
        for name in grant:
            grant_tool(server.runtime.grants, subject, name, ZONE)
        return server

    yield factory
    for server in built:
        server.close()


async def call(
    server: NexusServer, tool: str, args: dict[str, Any], meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    async with Client(server.mcp) as client:
        return wire(await client.call_tool_mcp(tool, args, meta=meta))


def warnings_of(logs: list[dict[str, Any]], tool: str) -> set[str]:
    found: set[str] = set()
    for entry in logs:
        if entry.get("event") == "tool_classification_warning" and entry.get("tool") == tool:
            found.update(entry["warnings"])
    return found


def assert_never_ran(audit: MemoryAuditSink, before: dict[str, bytes], workspace: Path) -> None:
    assert RUNS == []
    assert events(audit, TOOL_CALL_STARTED) == []
    assert snapshot(workspace) == before


async def expect_denial(
    client: Client[Any],
    audit: MemoryAuditSink,
    workspace: Path,
    tool: str,
    args: dict[str, Any],
    code: str,
    meta: dict[str, Any] | None = None,
) -> None:
    """One refused call on an open client: its code, nothing run, nothing written, audited."""
    audit.clear()
    RUNS.clear()
    before = snapshot(workspace)
    result = wire(await client.call_tool_mcp(tool, args, meta=meta))
    label = f"{tool} {sorted(args)} {meta}"
    assert code_of(result) == code, label
    assert RUNS == [], label
    assert events(audit, TOOL_CALL_STARTED) == [], label
    assert snapshot(workspace) == before, label
    assert [e["outcome"] for e in events(audit, TOOL_CALL_BLOCKED)] == [code], label


# --- unclassified tools ------------------------------------------------------------------


async def test_unclassified_read_tool_runs_in_dev_with_a_warning_and_a_heuristic_read_class(
    build: Builder, audit: MemoryAuditSink
) -> None:
    with structlog.testing.capture_logs() as start_logs:
        server = build(extra_tools=[peek_status], grant=["peek_status"])
    assert any(
        e["event"] == "registry_risk_mismatch" and e["tools"] == ["peek_status"] for e in start_logs
    )
    with structlog.testing.capture_logs() as logs:
        result = await call(server, "peek_status", {})
    assert result["structuredContent"] == {"ok": True}
    assert effect_of(result)["tool_class"] == "read"
    assert WARNING_UNCLASSIFIED in warnings_of(logs, "peek_status")
    assert any(e["log_level"] == "warning" for e in logs if e.get("tool") == "peek_status")
    assert RUNS == ["peek_status"]
    (finished,) = events(audit, TOOL_CALL_FINISHED)
    assert finished["tool_class"] == "read" and finished["outcome"] == "OK"


async def test_an_unclassified_connector_tool_stops_a_production_start_up(
    workspace: Path, tmp_path: Path
) -> None:
    settings = Settings(
        mode="prod", workspace=workspace, data_dir=tmp_path / "d", subject="alice", role="editor"
    )
    with pytest.raises(ConfigError) as caught:
        build_server(settings, audit_sinks=[MemoryAuditSink()], extra_tools=[peek_status])
    assert "peek_status (declared read, registry unclassified)" in str(caught.value)


async def test_an_unclassified_tool_on_a_production_server_is_denied_before_it_runs(
    build: Builder, audit: MemoryAuditSink
) -> None:
    """A tool that reaches FastMCP without @nexus_tool (a mount) meets the gateway alone."""
    server = build(mode="prod", subject="alice", role="editor")
    server.mcp.tool(raw_probe, name="raw_probe")
    grant_tool(server.runtime.grants, "alice", "raw_probe", ZONE)
    result = await call(server, "raw_probe", {})
    assert code_of(result) == "TOOL_UNCLASSIFIED_DENIED"
    assert RUNS == []
    (blocked,) = events(audit, TOOL_CALL_BLOCKED)
    assert blocked["outcome"] == "TOOL_UNCLASSIFIED_DENIED"


@pytest.mark.parametrize("tool", ["delete_cache_entry", "stamp_record"])
async def test_unclassified_tools_that_look_like_writes_never_run_as_reads(
    build: Builder, audit: MemoryAuditSink, workspace: Path, tool: str
) -> None:
    before = snapshot(workspace)
    server = build(extra_tools=[delete_cache_entry, stamp_record], grant=[tool])
    with structlog.testing.capture_logs() as logs:
        no_key = await call(server, tool, {"name": "x"})
        declared_read = await call(server, tool, {"name": "x"}, meta={META_CLASS: "read"})
        keyed = await call(
            server, tool, {"name": "x", "idempotency_key": "k-1"}, meta={META_CLASS: "read"}
        )
    # A write needs a key, a "read" declaration changes nothing (a warning against a dev
    # guess), and with a key the call goes down the write path (the write policy knows no
    # such operation) instead of running.
    assert code_of(no_key) == "IDEMPOTENCY_KEY_REQUIRED"
    assert code_of(declared_read) == "IDEMPOTENCY_KEY_REQUIRED"
    assert code_of(keyed) == "WRITE_POLICY_DENIED"
    assert WARNING_UNCLASSIFIED in warnings_of(logs, tool)
    assert WARNING_DECLARATION_DIFFERS in warnings_of(logs, tool)
    if tool == "delete_cache_entry":
        assert WARNING_HINTS_CONFLICT in warnings_of(logs, tool)
    assert events(audit, TOOL_CALL_BLOCKED)[-1]["tool_class"] == "write"
    assert_never_ran(audit, before, workspace)


async def test_read_only_caller_cannot_run_an_unclassified_tool_that_looks_like_a_write(
    build: Builder, audit: MemoryAuditSink, workspace: Path
) -> None:
    before = snapshot(workspace)
    server = build(
        extra_tools=[delete_cache_entry],
        grant=["delete_cache_entry"],
        dev_principal={"read_only": True},
    )
    plain = await call(server, "delete_cache_entry", {"name": "x", "idempotency_key": "k"})
    declared = await call(server, "delete_cache_entry", {"name": "x"}, meta={META_CLASS: "read"})
    assert code_of(plain) == "TOOL_CLASS_MISMATCH"
    assert code_of(declared) == "TOOL_CLASS_MISMATCH"
    assert_never_ran(audit, before, workspace)


# --- TOOL_CLASS_MISMATCH -----------------------------------------------------------------


async def test_read_only_caller_cannot_run_a_tool_the_registry_classifies_write(
    build: Builder, audit: MemoryAuditSink, workspace: Path, limited_dir: Path
) -> None:
    before = snapshot(workspace)
    with structlog.testing.capture_logs() as start_logs:
        server = build(
            registry={"directory": limited_dir},
            extra_tools=[sneaky_reader],
            grant=["sneaky_reader"],
            dev_principal={"read_only": True},
        )
    # dev: the declared risk disagreeing with the registry only warns at start-up.
    assert any(
        e["event"] == "registry_risk_mismatch" and "sneaky_reader" in e["tools"] for e in start_logs
    )
    result = await call(server, "sneaky_reader", {"path": "todo.txt", "idempotency_key": "k"})
    assert code_of(result) == "TOOL_CLASS_MISMATCH"
    assert_never_ran(audit, before, workspace)
    (blocked,) = events(audit, TOOL_CALL_BLOCKED)
    assert blocked["outcome"] == "TOOL_CLASS_MISMATCH"


async def test_a_risk_that_disagrees_with_the_registry_stops_a_production_start_up(
    workspace: Path, tmp_path: Path, limited_dir: Path
) -> None:
    settings = Settings(
        mode="prod",
        workspace=workspace,
        data_dir=tmp_path / "d",
        subject="alice",
        role="editor",
        registry={"directory": limited_dir},
    )
    with pytest.raises(ConfigError) as caught:
        build_server(settings, audit_sinks=[MemoryAuditSink()], extra_tools=[sneaky_reader])
    assert "sneaky_reader (declared read, registry write)" in str(caught.value)


async def test_read_only_production_caller_cannot_run_a_mounted_tool_the_registry_classifies_write(
    build: Builder, audit: MemoryAuditSink, tmp_path: Path
) -> None:
    directory = tmp_path / "reg-raw"
    write_registry(
        directory,
        extra=[{"tool_name": "raw_probe", "tool_class": "write", "is_document_op": False}],
    )
    server = build(
        mode="prod",
        subject="rita",
        role="viewer",
        read_only=True,
        registry={"directory": directory},
    )
    server.mcp.tool(raw_probe, name="raw_probe")
    grant_tool(server.runtime.grants, "rita", "raw_probe", ZONE)
    result = await call(server, "raw_probe", {})
    assert code_of(result) == "TOOL_CLASS_MISMATCH"
    assert RUNS == []


# --- TOOL_CLASS_DECLARATION_MISMATCH ------------------------------------------------------


async def test_a_declared_class_that_differs_from_the_registry_is_refused(
    build: Builder, audit: MemoryAuditSink, workspace: Path
) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("nexus_read_file", {"path": "todo.txt"}, "write"),
        ("nexus_write_file", {"path": "new.txt", "content": "x", "idempotency_key": "k"}, "read"),
        ("nexus_write_file", {"path": "new.txt", "content": "x"}, "read"),  # and no key either
    ]
    async with Client(build().mcp) as client:
        for tool, args, declared in cases:
            await expect_denial(
                client,
                audit,
                workspace,
                tool,
                args,
                "TOOL_CLASS_DECLARATION_MISMATCH",
                meta={META_CLASS: declared},
            )


async def test_a_declared_class_never_authorizes_a_read_only_caller(
    build: Builder, audit: MemoryAuditSink, workspace: Path, limited_dir: Path
) -> None:
    before = snapshot(workspace)
    server = build(
        registry={"directory": limited_dir},
        extra_tools=[sneaky_reader],
        grant=["sneaky_reader"],
        dev_principal={"read_only": True},
    )
    claimed_read = await call(server, "sneaky_reader", {"path": "a"}, meta={META_CLASS: "read"})
    claimed_write = await call(
        server, "sneaky_reader", {"path": "a", "idempotency_key": "k"}, meta={META_CLASS: "write"}
    )
    assert code_of(claimed_read) == "TOOL_CLASS_DECLARATION_MISMATCH"
    assert code_of(claimed_write) == "TOOL_CLASS_MISMATCH"
    assert_never_ran(audit, before, workspace)


async def test_a_matching_declaration_passes_and_the_registry_class_is_what_is_recorded(
    build: Builder, audit: MemoryAuditSink, workspace: Path
) -> None:
    server = build()
    read = await call(server, "nexus_read_file", {"path": "todo.txt"}, meta={META_CLASS: "read"})
    write = await call(
        server,
        "nexus_write_file",
        {"path": "d.txt", "content": "d", "idempotency_key": "k"},
        meta={META_CLASS: "write"},
    )
    assert effect_of(read)["tool_class"] == "read"
    assert effect_of(write)["tool_class"] == "write"
    assert [e["tool_class"] for e in events(audit, TOOL_CALL_FINISHED)] == ["read", "write"]
    assert (workspace / "d.txt").read_bytes() == b"d"


async def test_a_declared_class_that_is_not_read_or_write_is_invalid_input(
    build: Builder, audit: MemoryAuditSink, workspace: Path
) -> None:
    write_args = {"path": "n.txt", "content": "n", "idempotency_key": "k"}
    async with Client(build().mcp) as client:
        for declared in ["admin", "READ", "", 1, ["read"]]:
            meta = {META_CLASS: declared}
            await expect_denial(
                client,
                audit,
                workspace,
                "nexus_read_file",
                {"path": "todo.txt"},
                "INVALID_INPUT",
                meta,
            )
            await expect_denial(
                client, audit, workspace, "nexus_write_file", write_args, "INVALID_INPUT", meta
            )


# --- IDEMPOTENCY_KEY_REQUIRED and the key's two channels ---------------------------------


def key_call(arg_key: Any, meta_key: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    args: dict[str, Any] = {"path": "k.txt", "content": "k"}
    if arg_key is not None:
        args["idempotency_key"] = arg_key
    return args, ({META_KEY: meta_key} if meta_key is not None else None)


async def test_a_write_without_a_usable_idempotency_key_is_refused(
    build: Builder, audit: MemoryAuditSink, workspace: Path
) -> None:
    missing = [(None, None), ("", None), ("   ", None), ("\t\n", None), (None, ""), (None, "  ")]
    async with Client(build().mcp) as client:
        for arg_key, meta_key in missing:
            args, meta = key_call(arg_key, meta_key)
            await expect_denial(
                client, audit, workspace, "nexus_write_file", args, "IDEMPOTENCY_KEY_REQUIRED", meta
            )


async def test_conflicting_or_malformed_idempotency_keys_are_invalid_input(
    build: Builder, audit: MemoryAuditSink, workspace: Path
) -> None:
    malformed = [
        ("k-arg", "k-meta"),
        ("", "k-meta"),
        ("k-arg", 7),
        (None, 7),
        ("x" * 257, None),
        (None, "x" * 257),
    ]
    async with Client(build().mcp) as client:
        for arg_key, meta_key in malformed:
            args, meta = key_call(arg_key, meta_key)
            await expect_denial(
                client, audit, workspace, "nexus_write_file", args, "INVALID_INPUT", meta
            )


async def test_an_idempotency_key_is_accepted_from_meta_from_both_channels_and_at_full_length(
    build: Builder, workspace: Path
) -> None:
    accepted = {
        "meta.txt": (None, "k-meta"),
        "both.txt": ("k-both", "k-both"),
        "long.txt": ("x" * 256, None),
        "long-meta.txt": (None, "y" * 256),
    }
    async with Client(build().mcp) as client:
        for name, (arg_key, meta_key) in accepted.items():
            args, meta = key_call(arg_key, meta_key)
            result = wire(
                await client.call_tool_mcp(
                    "nexus_write_file", {**args, "path": name, "content": name}, meta=meta
                )
            )
            assert result["isError"] is False, name
            assert (workspace / name).read_bytes() == name.encode()


# --- pre-exec write document checks ------------------------------------------------------

EDIT_SOURCE = "hello world\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def expected(pointer: str, digest: str) -> dict[str, Any]:
    return {META_HASHES: [{"pointer": pointer, "hash": digest}]}


CRLF_TEXT = "a\r\nb\r\n"
LF_TEXT = "a\nb\n"

PRE_EXEC_DENIALS: list[tuple[str, str, dict[str, Any], dict[str, Any] | None, str]] = [
    (
        "write-over-limit",
        "nexus_write_file",
        {"path": "w.txt", "content": "x" * (WRITE_LIMIT + 1)},
        None,
        "DOC_SIZE_EXCEEDED",
    ),
    (
        "write-multibyte-over-limit",
        "nexus_write_file",
        {"path": "w.txt", "content": "é" * 8 + "a"},
        None,
        "DOC_SIZE_EXCEEDED",
    ),
    (
        "rename-batch-over-limit",
        "nexus_rename_file",
        {"source": "todo.txt", "destination": "moved-123.txt"},
        None,
        "DOC_SIZE_EXCEEDED",
    ),
    (
        "rename-item-over-limit",
        "nexus_rename_file",
        {"source": "todo.txt", "destination": "x" * (RENAME_ITEM_LIMIT + 1)},
        None,
        "DOC_SIZE_EXCEEDED",
    ),
    (
        "pointer-does-not-resolve",
        "nexus_mkdir",
        {"path": "newdir"},
        None,
        "DOC_CONTENT_POINTER_INVALID",
    ),
    (
        "base64-bad-length",
        "nexus_edit_file",
        {"path": "edit.txt", "old_text": "world", "new_text": "abc"},
        None,
        "DOC_ENCODING_INVALID",
    ),
    (
        "base64-padding-inside",
        "nexus_edit_file",
        {"path": "edit.txt", "old_text": "world", "new_text": "ab=c"},
        None,
        "DOC_ENCODING_INVALID",
    ),
    (
        "base64-newline",
        "nexus_edit_file",
        {"path": "edit.txt", "old_text": "world", "new_text": "YWJj\n"},
        None,
        "DOC_ENCODING_INVALID",
    ),
    (
        "base64-url-safe",
        "nexus_edit_file",
        {"path": "edit.txt", "old_text": "world", "new_text": "-_-_"},
        None,
        "DOC_ENCODING_INVALID",
    ),
    (
        "base64-space",
        "nexus_edit_file",
        {"path": "edit.txt", "old_text": "world", "new_text": "YW Jj"},
        None,
        "DOC_ENCODING_INVALID",
    ),
    (
        "base64-non-ascii",
        "nexus_edit_file",
        {"path": "edit.txt", "old_text": "world", "new_text": "é==="},
        None,
        "DOC_ENCODING_INVALID",
    ),
    (
        "base64-decoded-over-limit",
        "nexus_edit_file",
        {"path": "edit.txt", "old_text": "world", "new_text": b64(b"x" * (EDIT_LIMIT + 1))},
        None,
        "DOC_SIZE_EXCEEDED",
    ),
    (
        "hash-wrong",
        "nexus_write_file",
        {"path": "w.txt", "content": "abc"},
        expected("/content", sha(b"abd")),
        "DOC_HASH_MISMATCH",
    ),
    (
        "hash-of-lf-twin",
        "nexus_write_file",
        {"path": "w.txt", "content": CRLF_TEXT},
        expected("/content", sha(LF_TEXT.encode())),
        "DOC_HASH_MISMATCH",
    ),
    (
        "hash-pointer-not-in-spec",
        "nexus_write_file",
        {"path": "w.txt", "content": "abc"},
        expected("/path", sha(b"w.txt")),
        "DOC_HASH_MISMATCH",
    ),
    (
        "hash-of-base64-text",
        "nexus_edit_file",
        {"path": "edit.txt", "old_text": "world", "new_text": b64(b"hi")},
        expected("/new_text", sha(b64(b"hi").encode())),
        "DOC_HASH_MISMATCH",
    ),
    (
        "hash-on-a-read-tool",
        "nexus_read_file",
        {"path": "todo.txt"},
        expected("/content", sha(b"x")),
        "DOC_HASH_MISMATCH",
    ),
    (
        "hash-uppercase",
        "nexus_write_file",
        {"path": "w.txt", "content": "abc"},
        expected("/content", sha(b"abc").upper()),
        "INVALID_INPUT",
    ),
    (
        "hash-not-a-list",
        "nexus_write_file",
        {"path": "w.txt", "content": "abc"},
        {META_HASHES: {"/content": sha(b"abc")}},
        "INVALID_INPUT",
    ),
]


def _keyed(tool: str, args: dict[str, Any], key: str = "k-doc") -> dict[str, Any]:
    return args if tool == "nexus_read_file" else {**args, "idempotency_key": key}


async def test_write_documents_are_checked_before_the_tool_runs(
    build: Builder, audit: MemoryAuditSink, workspace: Path, limited_dir: Path
) -> None:
    (workspace / "edit.txt").write_text(EDIT_SOURCE)
    async with Client(build(registry={"directory": limited_dir}).mcp) as client:
        for _name, tool, args, meta, code in PRE_EXEC_DENIALS:
            await expect_denial(client, audit, workspace, tool, _keyed(tool, args), code, meta)


async def test_content_that_is_not_encodable_as_utf8_is_doc_encoding_invalid(
    build: Builder, audit: MemoryAuditSink, workspace: Path
) -> None:
    before = snapshot(workspace)
    result = await call(
        build(),
        "nexus_write_file",
        {"path": "s.txt", "content": "a\ud800b", "idempotency_key": "k"},
    )
    assert code_of(result) == "DOC_ENCODING_INVALID"
    assert_never_ran(audit, before, workspace)


@dataclass(frozen=True)
class AtLimit:
    tool: str
    args: dict[str, Any]
    target: str
    target_bytes: bytes
    hashes: list[dict[str, Any]]


AT_LIMIT = {
    "write-ascii": AtLimit(
        "nexus_write_file",
        {"path": "w.txt", "content": "x" * WRITE_LIMIT},
        "w.txt",
        b"x" * WRITE_LIMIT,
        [{"pointer": "/content", "hash": sha(b"x" * WRITE_LIMIT), "size_bytes": WRITE_LIMIT}],
    ),
    "write-multibyte": AtLimit(
        "nexus_write_file",
        {"path": "w.txt", "content": "é" * 8},
        "w.txt",
        "é".encode() * 8,
        [{"pointer": "/content", "hash": sha("é".encode() * 8), "size_bytes": WRITE_LIMIT}],
    ),
    "rename-batch": AtLimit(
        "nexus_rename_file",
        {"source": "todo.txt", "destination": "moved-12.txt"},
        "moved-12.txt",
        (REPO_ROOT / "demo" / "workspace" / "todo.txt").read_bytes(),
        [
            {"pointer": "/source", "hash": sha(b"todo.txt"), "size_bytes": 8},
            {"pointer": "/destination", "hash": sha(b"moved-12.txt"), "size_bytes": 12},
        ],
    ),
    "edit-base64": AtLimit(
        "nexus_edit_file",
        {"path": "edit.txt", "old_text": "world", "new_text": b64(b"x" * EDIT_LIMIT)},
        "edit.txt",
        f"hello {b64(b'x' * EDIT_LIMIT)}\n".encode(),
        [{"pointer": "/new_text", "hash": sha(b"x" * EDIT_LIMIT), "size_bytes": EDIT_LIMIT}],
    ),
}


async def test_documents_exactly_at_the_limit_pass_and_are_hashed(
    build: Builder, workspace: Path, limited_dir: Path
) -> None:
    (workspace / "edit.txt").write_text(EDIT_SOURCE)
    async with Client(build(registry={"directory": limited_dir}).mcp) as client:
        for name, case in AT_LIMIT.items():
            result = wire(
                await client.call_tool_mcp(case.tool, _keyed(case.tool, case.args, key=f"k-{name}"))
            )
            effect = effect_of(result)
            assert effect["document_hashes"] == case.hashes, name
            assert effect["batch_total_bytes"] == sum(h["size_bytes"] for h in case.hashes), name
            assert (workspace / case.target).read_bytes() == case.target_bytes, name


async def test_matching_expected_hashes_let_the_write_through(
    build: Builder, workspace: Path, limited_dir: Path
) -> None:
    (workspace / "edit.txt").write_text(EDIT_SOURCE)
    server = build(registry={"directory": limited_dir})
    write = await call(
        server,
        "nexus_write_file",
        {"path": "h.txt", "content": CRLF_TEXT, "idempotency_key": "k1"},
        meta=expected("/content", sha(CRLF_TEXT.encode())),
    )
    edit = await call(
        server,
        "nexus_edit_file",
        {"path": "edit.txt", "old_text": "world", "new_text": b64(b"hi"), "idempotency_key": "k2"},
        meta=expected("/new_text", sha(b"hi")),
    )
    assert effect_of(write)["document_hashes"] == [
        {"pointer": "/content", "hash": sha(CRLF_TEXT.encode()), "size_bytes": 6}
    ]
    assert effect_of(edit)["document_hashes"] == [
        {"pointer": "/new_text", "hash": sha(b"hi"), "size_bytes": 2}
    ]
    assert (workspace / "h.txt").read_bytes() == CRLF_TEXT.encode()


# --- post-exec read checks and the tool effect -------------------------------------------


def effect_validator() -> Draft202012Validator:
    schema = json.loads(EFFECT_SCHEMA.read_text(encoding="utf-8"))
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def assert_uuid7(value: str) -> None:
    parsed = uuid.UUID(value)
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert str(parsed) == value


async def test_reads_are_measured_against_the_registry_read_limit_after_the_tool_returns(
    build: Builder, audit: MemoryAuditSink, workspace: Path, limited_dir: Path
) -> None:
    at_limit = (CANARY + "-" * READ_LIMIT)[:READ_LIMIT].encode()
    over = (CANARY + "-" * READ_LIMIT)[: READ_LIMIT + 1].encode()
    (workspace / "at.txt").write_bytes(at_limit)
    (workspace / "over.txt").write_bytes(over)
    server = build(registry={"directory": limited_dir})
    passed = await call(server, "nexus_read_file", {"path": "at.txt"})
    assert effect_of(passed)["document_hashes"] == [
        {"pointer": "/content", "hash": sha(at_limit), "size_bytes": READ_LIMIT}
    ]
    audit.clear()
    result = await call(server, "nexus_read_file", {"path": "over.txt"})
    assert code_of(result) == "DOC_SIZE_EXCEEDED"
    assert CANARY not in json.dumps(result)
    # Post-exec: the tool ran, its result was refused.
    assert len(events(audit, TOOL_CALL_STARTED)) == 1
    (finished,) = events(audit, TOOL_CALL_FINISHED)
    assert finished["outcome"] == "DOC_SIZE_EXCEEDED"
    assert CANARY not in json.dumps(audit.records())


READ_FILES = {
    "crlf-bom-non-ascii": "\ufeffline one — café\r\nline two\r\n".encode(),
    "lf-twin": "\ufeffline one — café\nline two\n".encode(),
    "no-final-newline": b"plain",
    "empty": b"",
}


async def test_a_read_effect_hashes_the_exact_file_bytes_and_validates_against_the_contract(
    build: Builder, workspace: Path
) -> None:
    for name, data in READ_FILES.items():
        (workspace / f"{name}.txt").write_bytes(data)
    hashes: set[str] = set()
    async with Client(build().mcp) as client:
        for name, data in READ_FILES.items():
            effect = effect_of(
                wire(await client.call_tool_mcp("nexus_read_file", {"path": f"{name}.txt"}))
            )
            assert list(effect_validator().iter_errors(effect)) == [], name
            assert_uuid7(effect["effect_id"])
            assert_uuid7(effect["tool_call_id"])
            assert effect["document_hashes"] == [
                {"pointer": "/content", "hash": sha(data), "size_bytes": len(data)}
            ]
            assert effect["batch_total_bytes"] == len(data)
            assert effect["content_hash_alg"] == "sha256"
            assert (effect["server_id"], effect["tool_name"], effect["tool_class"]) == (
                "nexus",
                "nexus_read_file",
                "read",
            )
            hashes.add(effect["document_hashes"][0]["hash"])
    assert len(hashes) == len(READ_FILES)  # the CRLF file and its LF twin differ


async def test_crlf_and_lf_twins_hash_differently_on_read_and_on_write(
    build: Builder, workspace: Path
) -> None:
    server = build()
    effects: dict[str, dict[str, Any]] = {}
    for name, text in (("crlf", CRLF_TEXT), ("lf", LF_TEXT)):
        written = await call(
            server,
            "nexus_write_file",
            {"path": f"{name}.txt", "content": text, "idempotency_key": f"k-{name}"},
        )
        read = await call(server, "nexus_read_file", {"path": f"{name}.txt"})
        effects[f"write-{name}"], effects[f"read-{name}"] = effect_of(written), effect_of(read)
        # No newline normalization anywhere: the bytes on disk are the argument's UTF-8.
        assert (workspace / f"{name}.txt").read_bytes() == text.encode()
        expected_hash = {"hash": sha(text.encode()), "size_bytes": len(text.encode())}
        assert effects[f"write-{name}"]["document_hashes"] == [
            {"pointer": "/content", **expected_hash}
        ]
        assert effects[f"read-{name}"]["document_hashes"] == [
            {"pointer": "/content", **expected_hash}
        ]
    assert effects["write-crlf"]["document_hashes"] != effects["write-lf"]["document_hashes"]
    for effect in effects.values():
        assert list(effect_validator().iter_errors(effect)) == []
        assert_uuid7(effect["effect_id"])
    assert len({e["effect_id"] for e in effects.values()}) == 4


# --- audit -------------------------------------------------------------------------------


async def test_finished_events_carry_class_hashes_effect_and_the_pinned_registry(
    build: Builder, audit: MemoryAuditSink, workspace: Path
) -> None:
    server = build()
    read = await call(server, "nexus_read_file", {"path": "todo.txt"})
    write = await call(
        server, "nexus_write_file", {"path": "a.txt", "content": "audit me", "idempotency_key": "k"}
    )
    blocked = await call(server, "nexus_write_file", {"path": "a.txt", "content": "no key"})
    assert code_of(blocked) == "IDEMPOTENCY_KEY_REQUIRED"
    registry = {"nexus": {"server_version": "0.1.0", "digest": SHIPPED_DIGEST}}
    finished = events(audit, TOOL_CALL_FINISHED)
    assert len(finished) == 2
    for event, result, tool_class in ((finished[0], read, "read"), (finished[1], write, "write")):
        effect = effect_of(result)
        assert event["tool_class"] == tool_class
        assert event["document_hashes"] == effect["document_hashes"]
        assert event["batch_total_bytes"] == effect["batch_total_bytes"]
        assert event["effect_id"] == effect["effect_id"]
        assert event["tool_call_id"] == effect["tool_call_id"]
        assert event["registry"] == registry
    todo = (workspace / "todo.txt").read_bytes()
    assert finished[0]["document_hashes"] == [
        {"pointer": "/content", "hash": sha(todo), "size_bytes": len(todo)}
    ]
    assert finished[1]["document_hashes"] == [
        {"pointer": "/content", "hash": sha(b"audit me"), "size_bytes": 8}
    ]
    assert all(e["registry"] == registry for e in audit.records())


# --- registry parity ---------------------------------------------------------------------


OPERATOR_TOKEN = "operator-token-for-the-registry-tests-0123456789"


def operator(tmp_path: Path) -> dict[str, Any]:
    """The ``health`` settings that let ``readyz`` ask as the operator."""
    token_file = tmp_path / "operator-token"
    token_file.write_text(OPERATOR_TOKEN)
    return {"bearer_token": {"file": str(token_file)}}


async def readyz(server: NexusServer) -> dict[str, Any]:
    """``/readyz`` as the operator sees it (``health.bearer_token``, set by ``operator``)."""
    transport = httpx.ASGITransport(app=server.mcp.http_app())
    headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        response = await http.get("/readyz", headers=headers)
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.parametrize(
    "pin",
    [
        {"digest": "0" * 64},
        {"version": "0.1.1"},
        {"version": "0.1.0", "digest": "f" * 64},
    ],
    ids=["wrong-digest", "wrong-version", "right-version-wrong-digest"],
)
async def test_a_pin_that_differs_from_the_loaded_registry_stops_start_up(
    workspace: Path, tmp_path: Path, pin: dict[str, str]
) -> None:
    settings = Settings(
        mode="dev", workspace=workspace, data_dir=tmp_path / "d", registry={"pins": {"nexus": pin}}
    )
    with pytest.raises(ConfigError) as caught:
        build_server(settings, audit_sinks=[MemoryAuditSink()])
    assert "registry parity check failed" in str(caught.value)


async def test_a_pin_for_a_server_without_a_registry_file_stops_start_up(
    workspace: Path, tmp_path: Path
) -> None:
    pins = {"nexus": {"digest": SHIPPED_DIGEST}, "elsewhere": {"version": "1.0.0"}}
    settings = Settings(
        mode="dev", workspace=workspace, data_dir=tmp_path / "d", registry={"pins": pins}
    )
    with pytest.raises(ConfigError) as caught:
        build_server(settings, audit_sinks=[MemoryAuditSink()])
    assert "'elsewhere' is pinned" in str(caught.value)


@pytest.mark.parametrize("digest", [SHIPPED_DIGEST, SHIPPED_DIGEST.upper()], ids=["lower", "upper"])
async def test_the_correct_pin_starts_and_readyz_reports_the_registry(
    build: Builder, digest: str, tmp_path: Path
) -> None:
    server = build(
        mode="prod",
        subject="alice",
        role="editor",
        registry={"pins": {"nexus": {"version": "0.1.0", "digest": digest}}},
        health=operator(tmp_path),
    )
    body = await readyz(server)
    assert body["registry"] == {"nexus": {"server_version": "0.1.0", "digest": SHIPPED_DIGEST}}
    assert body["status"] == "ready"


async def test_gateway_and_connector_hold_one_registry_object(build: Builder) -> None:
    server = build()
    runtime = server.runtime
    (chain,) = server.mcp.middleware
    gateway = [
        m
        for m in chain.layers  # type: ignore[attr-defined]
        if isinstance(m, ClassificationMiddleware | DocumentsMiddleware)
    ]
    assert len(gateway) == 2
    assert all(m.enforcer is runtime.enforcer for m in gateway)
    assert [type(c).__name__ for c in runtime.connector.checks] == [
        "RegistryConnectorCheck",
        "ToolCallRecordCheck",  # the seed's tool_call record (issue 22), same enforcer
    ]
    assert all(c.enforcer is runtime.enforcer for c in runtime.connector.checks)  # type: ignore[attr-defined]
    assert runtime.enforcer.registry is runtime.registry


async def test_a_custom_registry_is_reported_by_its_own_digest(
    build: Builder, audit: MemoryAuditSink, limited_dir: Path, tmp_path: Path
) -> None:
    digest = sha((limited_dir / "nexus.json").read_bytes())
    assert digest != SHIPPED_DIGEST
    server = build(
        registry={"directory": limited_dir, "pins": {"nexus": {"digest": digest}}},
        health=operator(tmp_path),
    )
    assert (await readyz(server))["registry"] == {
        "nexus": {"server_version": "0.1.0", "digest": digest}
    }
    await call(server, "nexus_read_file", {"path": "todo.txt"})
    assert {json.dumps(e["registry"]) for e in audit.records()} == {
        json.dumps({"nexus": {"server_version": "0.1.0", "digest": digest}})
    }


async def test_an_invalid_registry_file_stops_start_up_listing_every_error(
    workspace: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "bad-registry"
    write_registry(
        directory,
        extra=[
            {"tool_name": "t_class", "tool_class": "delete", "is_document_op": False},
            {"tool_name": "t_missing", "tool_class": "read"},
            {
                "tool_name": "t_spec",
                "tool_class": "write",
                "is_document_op": True,
                "document_spec": {"content_encoding": "utf8", "max_write_bytes": 0},
            },
            {"tool_name": "nexus_read_file", "tool_class": "write", "is_document_op": False},
        ],
    )
    settings = Settings(
        mode="dev", workspace=workspace, data_dir=tmp_path / "d", registry={"directory": directory}
    )
    with pytest.raises(ConfigError) as caught:
        build_server(settings, audit_sinks=[MemoryAuditSink()])
    message = str(caught.value)
    assert "is invalid (5 errors)" in message
    base = len(json.loads(SHIPPED_REGISTRY.read_text())["tools"])
    for position in range(base, base + 4):
        assert f"$.tools[{position}]" in message
    assert "duplicate tool name 'nexus_read_file'" in message
    assert "max_write_bytes" in message and "write_content_pointers" in message


@pytest.mark.parametrize(
    "text",
    ['{"schema_id": "talos.mcp.tool_registry", "schema_id": "x"}', "{not json", '{"tools": NaN}'],
    ids=["duplicate-key", "not-json", "nan"],
)
async def test_a_registry_file_that_is_not_strict_json_stops_start_up(
    workspace: Path, tmp_path: Path, text: str
) -> None:
    directory = tmp_path / "broken"
    directory.mkdir()
    (directory / "nexus.json").write_text(text)
    settings = Settings(
        mode="dev", workspace=workspace, data_dir=tmp_path / "d", registry={"directory": directory}
    )
    with pytest.raises(ConfigError):
        build_server(settings, audit_sinks=[MemoryAuditSink()])


# --- defense in depth: each layer alone -------------------------------------------------


def keep_connector_only(server: NexusServer) -> None:
    """Take the gateway's classification and documents layers out of the chain."""
    (chain,) = server.mcp.middleware
    assert isinstance(chain, PolicyChain)
    kept = [
        m for m in chain.layers if not isinstance(m, ClassificationMiddleware | DocumentsMiddleware)
    ]
    assert len(chain.layers) - len(kept) == 2
    chain.replace_layers(kept)


def keep_gateway_only(server: NexusServer) -> None:
    """Empty the list the connector iterates (shared by reference with every bound tool)."""
    server.runtime.connector.checks.clear()


LAYERS: dict[str, Callable[[NexusServer], None]] = {
    "both": lambda server: None,
    "connector-only": keep_connector_only,
    "gateway-only": keep_gateway_only,
}


@dataclass(frozen=True)
class Denial:
    tool: str
    args: dict[str, Any]
    code: str
    meta: dict[str, Any] | None = None
    read_only: bool = False
    # A prod server refuses to start with an unclassified @nexus_tool, so the runtime rule
    # is reached by switching the enforcer both layers share to prod after start-up.
    enforce_prod: bool = False


DENIALS = {
    "unclassified-in-prod": Denial(
        "peek_status", {}, "TOOL_UNCLASSIFIED_DENIED", enforce_prod=True
    ),
    "read-only-vs-write": Denial(
        "sneaky_reader",
        {"path": "todo.txt", "idempotency_key": "k"},
        "TOOL_CLASS_MISMATCH",
        read_only=True,
    ),
    "declaration-mismatch": Denial(
        "nexus_write_file",
        {"path": "d.txt", "content": "d", "idempotency_key": "k"},
        "TOOL_CLASS_DECLARATION_MISMATCH",
        meta={META_CLASS: "read"},
    ),
    "missing-key": Denial(
        "nexus_write_file", {"path": "d.txt", "content": "d"}, "IDEMPOTENCY_KEY_REQUIRED"
    ),
    "oversize": Denial(
        "nexus_write_file",
        {"path": "d.txt", "content": "x" * (WRITE_LIMIT + 1), "idempotency_key": "k"},
        "DOC_SIZE_EXCEEDED",
    ),
    "batch-oversize": Denial(
        "nexus_rename_file",
        {"source": "todo.txt", "destination": "moved-123.txt", "idempotency_key": "k"},
        "DOC_SIZE_EXCEEDED",
    ),
    "hash-mismatch": Denial(
        "nexus_write_file",
        {"path": "d.txt", "content": "abc", "idempotency_key": "k"},
        "DOC_HASH_MISMATCH",
        meta=expected("/content", sha(b"abd")),
    ),
    # bad-pointer has its own test below (the connector-only variant is a known bug).
    "bad-encoding": Denial(
        "nexus_edit_file",
        {"path": "edit.txt", "old_text": "world", "new_text": "abc", "idempotency_key": "k"},
        "DOC_ENCODING_INVALID",
    ),
}


@pytest.mark.parametrize("layer", LAYERS.keys())
async def test_each_enforcement_point_alone_denies_with_the_same_code_before_the_tool_runs(
    build: Builder, audit: MemoryAuditSink, workspace: Path, limited_dir: Path, layer: str
) -> None:
    (workspace / "edit.txt").write_text(EDIT_SOURCE)
    servers: dict[bool, NexusServer] = {}
    for read_only in (False, True):
        servers[read_only] = build(
            registry={"directory": limited_dir},
            extra_tools=[peek_status, sneaky_reader],
            grant=["peek_status", "sneaky_reader"],
            dev_principal={"read_only": read_only},
            data_dir=workspace.parent / f"data-{read_only}",
        )
        LAYERS[layer](servers[read_only])
    for name, case in DENIALS.items():
        server = servers[case.read_only]
        enforcer = server.runtime.enforcer
        enforcer.mode = "prod" if case.enforce_prod else "dev"
        try:
            async with Client(server.mcp) as client:
                await expect_denial(
                    client, audit, workspace, case.tool, case.args, case.code, case.meta
                )
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc
        finally:
            enforcer.mode = "dev"


@pytest.mark.parametrize(
    "layer",
    [
        "both",
        "connector-only",
        "gateway-only",
    ],
)
async def test_each_enforcement_point_alone_refuses_a_pointer_the_request_does_not_have(
    build: Builder, audit: MemoryAuditSink, workspace: Path, limited_dir: Path, layer: str
) -> None:
    """The registry points at /parents, which the call leaves out (its default is False)."""
    server = build(registry={"directory": limited_dir})
    LAYERS[layer](server)
    async with Client(server.mcp) as client:
        await expect_denial(
            client,
            audit,
            workspace,
            "nexus_mkdir",
            {"path": "newdir", "idempotency_key": "k"},
            "DOC_CONTENT_POINTER_INVALID",
        )


@pytest.mark.parametrize("layer", LAYERS.keys())
async def test_each_enforcement_point_alone_refuses_an_oversized_read_and_passes_a_valid_write(
    build: Builder, workspace: Path, limited_dir: Path, layer: str
) -> None:
    (workspace / "big.txt").write_text(CANARY * 4)
    server = build(registry={"directory": limited_dir})
    LAYERS[layer](server)
    async with Client(server.mcp) as client:
        read = wire(await client.call_tool_mcp("nexus_read_file", {"path": "big.txt"}))
        write = wire(
            await client.call_tool_mcp(
                "nexus_write_file", {"path": "ok.txt", "content": "fine", "idempotency_key": "k"}
            )
        )
    assert code_of(read) == "DOC_SIZE_EXCEEDED"
    assert CANARY not in json.dumps(read)
    assert effect_of(write)["document_hashes"] == [
        {"pointer": "/content", "hash": sha(b"fine"), "size_bytes": 4}
    ]
    assert (workspace / "ok.txt").read_bytes() == b"fine"


@pytest.mark.parametrize(
    "layer",
    [
        "both",
        "connector-only",
        "gateway-only",
    ],
)
async def test_each_enforcement_point_alone_serves_a_read_with_its_hashes(
    build: Builder, workspace: Path, layer: str
) -> None:
    server = build()
    LAYERS[layer](server)
    result = await call(server, "nexus_read_file", {"path": "todo.txt"})
    todo = (workspace / "todo.txt").read_bytes()
    assert effect_of(result)["document_hashes"] == [
        {"pointer": "/content", "hash": sha(todo), "size_bytes": len(todo)}
    ]


class MisclassifyingCheck:
    """A connector check that goes wrong after the real one: a different registry entry."""

    def before(self, contract: Any, state: CallState, arguments: dict[str, Any]) -> None:
        real = state.connector_classification
        assert isinstance(real, Classification)
        state.connector_classification = Classification(real.tool_class, None, heuristic=True)

    def after(self, contract: Any, state: CallState, structured: dict[str, Any]) -> None:
        return None


async def test_a_connector_that_disagrees_with_the_gateway_on_a_read_is_an_internal_error(
    build: Builder, audit: MemoryAuditSink
) -> None:
    server = build()
    server.runtime.connector.checks.append(MisclassifyingCheck())
    result = await call(server, "nexus_read_file", {"path": "todo.txt"})
    assert code_of(result) == "INTERNAL_ERROR"
    assert "todo" not in json.dumps(result)  # no content leaves on a split brain
    (finished,) = events(audit, TOOL_CALL_FINISHED)
    assert finished["outcome"] == "INTERNAL_ERROR"
