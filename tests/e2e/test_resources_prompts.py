"""Issue 27 end to end: resources and prompts go through the chain's grants, namespace,
audit and error envelope, on a server built the normal way (``build_server``).

The resources, templates and prompts are registered on the built server's FastMCP object
under the URIs the gateway and the notes expose (``upstream://<server_id>/...``,
``nexus://notes/...``), so every request meets the real chain. Clients are FastMCP's
in-memory client in both protocol eras; a profile change comes from the ``nexus-mcp
profiles`` command writing the same grants file, as another process would.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from mcp.shared.exceptions import MCPError

from nexus_mcp.errors import DocSizeExceededError, UpstreamError
from nexus_mcp.observability.audit import MemoryAuditSink, check_audit_record
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings
from nexus_mcp.stores.postgres import PostgresPool, migrate

from .access_helpers import http_client, http_nexus, poll, run_cli, token
from .conftest import ServerFactory

MODES = ["auto", "legacy"]
CANARY = "CANARY-res-5d1e"
TTL = 0.5
PROFILES = """
default_profile: base
roles: {viewer: base, editor: reader, evaluator: base, admin: reader}
profiles:
  base:
    tools: [nexus_read_file]
  reader:
    extends: base
    resources: [x, notes]
    prompts: [x_greet, x_refuses, x_crashes]
"""
GRANTED_RESOURCES = {"upstream://x/doc", "upstream://x/broken", "upstream://x/crash"}
GRANTED_TEMPLATES = {"upstream://x/files/{name}", "nexus://notes/{path*}"}
GRANTED_PROMPTS = {"x_greet", "x_refuses", "x_crashes"}


def add_components(server: NexusServer) -> None:
    """What an upstream and the notes would expose, on the server the chain guards."""
    mcp = server.mcp

    @mcp.resource("upstream://x/doc")
    def x_doc() -> str:
        return "x doc"

    @mcp.resource("upstream://y/doc")
    def y_doc() -> str:
        return f"y secret {CANARY}"

    @mcp.resource("upstream://x/broken")
    def x_broken() -> str:
        raise UpstreamError(reason="error") from ValueError(f"upstream said {CANARY}")

    @mcp.resource("upstream://x/crash")
    def x_crash() -> str:
        raise RuntimeError(f"db password {CANARY}")

    @mcp.resource("upstream://x/files/{name}")
    def x_file(name: str) -> str:
        return f"x file {name}"

    @mcp.resource("upstream://y/files/{name}")
    def y_file(name: str) -> str:
        return f"y file {name} {CANARY}"

    @mcp.resource("nexus://notes/{path*}")
    def note(path: str) -> str:
        return f"note {path}"

    @mcp.resource("other://x/doc")
    def no_source() -> str:
        return f"never granted {CANARY}"

    @mcp.prompt(name="x_greet")
    def x_greet(who: str) -> str:
        return f"hello {who}"

    @mcp.prompt(name="y_secret")
    def y_secret() -> str:
        return f"y prompt {CANARY}"

    @mcp.prompt(name="x_refuses")
    def x_refuses() -> str:
        raise DocSizeExceededError(limit=10) from ValueError(CANARY)

    @mcp.prompt(name="x_crashes")
    def x_crashes() -> str:
        raise RuntimeError(CANARY)


@pytest.fixture
def profiles_file(tmp_path: Path) -> Path:
    path = tmp_path / "profiles.yaml"
    path.write_text(PROFILES, encoding="utf-8")
    return path


@pytest.fixture
def serve(make_server: ServerFactory, profiles_file: Path) -> Any:
    def build(**overrides: Any) -> NexusServer:
        values: dict[str, Any] = {
            "mode": "prod",
            "subject": "ed",
            "role": "editor",
            "profiles": {"file": profiles_file, "cache_ttl_seconds": TTL},
        }
        values.update(overrides)
        server = make_server(**values)
        add_components(server)
        return server

    return build


async def listed(client: Client[Any]) -> tuple[set[str], set[str], set[str]]:
    resources = {str(r.uri) for r in await client.list_resources()}
    templates = {t.uri_template for t in await client.list_resource_templates()}
    prompts = {p.name for p in await client.list_prompts()}
    return resources, templates, prompts


async def read_error(client: Client[Any], uri: str, **meta: Any) -> dict[str, Any]:
    with pytest.raises(MCPError) as caught:
        await client.read_resource_mcp(uri, meta=meta or None)
    return caught.value.error.model_dump(mode="json")


async def prompt_error(
    client: Client[Any], name: str, arguments: dict[str, Any] | None = None
) -> dict[str, Any]:
    with pytest.raises(MCPError) as caught:
        await client.get_prompt_mcp(name, arguments)
    return caught.value.error.model_dump(mode="json")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def audit_text(audit: MemoryAuditSink) -> str:
    return json.dumps(audit.records())


# --- listing -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_listings_keep_only_what_the_callers_profile_grants(serve: Any, mode: str) -> None:
    async with Client(serve().mcp, mode=mode) as client:
        assert await listed(client) == (GRANTED_RESOURCES, GRANTED_TEMPLATES, GRANTED_PROMPTS)


async def test_a_profile_without_resources_or_prompts_lists_none(serve: Any) -> None:
    async with Client(serve(subject="vi", role="viewer").mcp) as client:
        assert await listed(client) == (set(), set(), set())
        # Hidden: reading or getting is answered as missing.
        assert await read_error(client, "upstream://x/doc") == await read_error(
            client, "upstream://x/none"
        )
        assert await prompt_error(client, "x_greet", {"who": "a"}) == await prompt_error(
            client, "x_none"
        )


async def test_a_read_only_principal_keeps_its_resources_and_prompts(serve: Any) -> None:
    server = serve(read_only=True)
    async with Client(server.mcp) as client:
        assert await listed(client) == (GRANTED_RESOURCES, GRANTED_TEMPLATES, GRANTED_PROMPTS)
        read = await client.read_resource_mcp("nexus://notes/a/b.md")
        assert read.contents[0].text == "note a/b.md"  # type: ignore[union-attr]
        got = await client.get_prompt_mcp("x_greet", {"who": "ro"})
        assert got.messages[0].content.text == "hello ro"  # type: ignore[union-attr]
        # Tools still follow the read-only rule (no write tool is listed).
        assert {t.name for t in await client.list_tools()} == {"nexus_read_file"}


async def test_a_principal_naming_an_unknown_profile_sees_none(serve: Any) -> None:
    async with Client(serve(profile="no-such-profile").mcp) as client:
        assert await listed(client) == (set(), set(), set())


# --- hidden == unknown ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_hidden_resource_answers_byte_for_byte_as_a_missing_one(
    serve: Any, mode: str
) -> None:
    async with Client(serve().mcp, mode=mode) as client:
        granted = await client.read_resource_mcp("upstream://x/files/a.txt")
        assert granted.contents[0].text == "x file a.txt"  # type: ignore[union-attr]
        answers = {
            uri: await read_error(client, uri)
            for uri in (
                "upstream://y/doc",  # exists, source not granted
                f"upstream://y/files/{CANARY}",  # a template of a source not granted
                "other://x/doc",  # exists, no source: granted to no one
                f"upstream://x/{CANARY}",  # granted source, no such resource
                f"upstream://{CANARY}/doc",  # no such source
                f"nexus://other/{CANARY}",
                "upstream://notes/doc",  # an upstream posing as the notes
            )
        }
    expected = {"code": -32602, "message": "Resource not found", "data": None}
    assert all(answer == expected for answer in answers.values()), answers
    assert CANARY not in json.dumps(list(answers.values()))


@pytest.mark.parametrize("mode", MODES)
async def test_a_hidden_prompt_answers_byte_for_byte_as_a_missing_one(
    serve: Any, mode: str
) -> None:
    async with Client(serve().mcp, mode=mode) as client:
        hidden = await prompt_error(client, "y_secret", {"a": CANARY})
        missing = await prompt_error(client, f"x_{CANARY}", {"a": CANARY})
        outside = await prompt_error(client, "no such/prompt " + CANARY)
    assert (
        hidden == missing == outside == {"code": -32602, "message": "Unknown prompt", "data": None}
    )


# --- audit --------------------------------------------------------------------------------


async def test_reads_gets_and_refusals_are_audited_without_uris_or_arguments(
    serve: Any, audit: MemoryAuditSink
) -> None:
    secret_uri = f"nexus://notes/private/{CANARY}.md"
    async with Client(serve().mcp) as client:
        await client.read_resource_mcp(secret_uri, meta={"nexus.mcp/correlation_id": "corr-0001"})
        await read_error(client, f"upstream://y/files/{CANARY}")
        await read_error(client, f"other://{CANARY}")
        await client.get_prompt_mcp("x_greet", {"who": CANARY})
        await prompt_error(client, "y_secret")
        await prompt_error(client, f"nope_{CANARY}")
    records = audit.records()
    assert all(check_audit_record(r) is None for r in records)
    assert CANARY not in audit_text(audit)
    summary = [
        (r["event"], r.get("resource_source") or r.get("prompt"), r["outcome"], r.get("reason"))
        for r in records
    ]
    assert summary == [
        ("resource_read_finished", "notes", "OK", None),
        ("resource_read_blocked", "y", "UNKNOWN_RESOURCE", "not_granted"),
        ("resource_read_blocked", None, "UNKNOWN_RESOURCE", "unknown_resource"),
        ("prompt_get_finished", "x_greet", "OK", None),
        ("prompt_get_blocked", "y_secret", "UNKNOWN_PROMPT", "not_granted"),
        ("prompt_get_blocked", "(unregistered)", "UNKNOWN_PROMPT", "unknown_prompt"),
    ]
    first = records[0]
    assert first["uri_sha256"] == sha(secret_uri)
    assert first["correlation_id"] == "corr-0001"
    assert (first["subject"], first["role"], first["tool"]) == ("ed", "editor", "(resource)")
    assert records[1]["uri_sha256"] == sha(f"upstream://y/files/{CANARY}")
    assert records[3]["tool"] == "(prompt)" and len(records[3]["args_digest"]) == 64
    assert "args" not in records[3]


# --- the error envelope -----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_typed_refusal_of_a_read_or_get_carries_its_stable_code_and_nothing_else(
    serve: Any, audit: MemoryAuditSink, mode: str
) -> None:
    async with Client(serve().mcp, mode=mode) as client:
        broken = await read_error(client, "upstream://x/broken")
        crash = await read_error(client, "upstream://x/crash")
        refused = await prompt_error(client, "x_refuses")
        crashed = await prompt_error(client, "x_crashes")
    payload = UpstreamError(reason="error").to_payload()  # what the resource raised
    assert payload["code"] == "UPSTREAM_ERROR"
    assert broken == {
        "code": -32050,
        "message": json.dumps(payload, separators=(",", ":")),
        "data": payload,
    }
    assert refused["code"] == -32050 and refused["data"]["code"] == "DOC_SIZE_EXCEEDED"
    assert json.loads(refused["message"]) == refused["data"]
    for internal in (crash, crashed):
        assert internal["code"] == -32050 and internal["data"]["code"] == "INTERNAL_ERROR"
        assert json.loads(internal["message"]) == internal["data"]
    everything = json.dumps([broken, crash, refused, crashed])
    assert CANARY not in everything
    assert "upstream://" not in everything and "x_refuses" not in everything
    outcomes = [(r["event"], r["outcome"]) for r in audit.records()]
    assert outcomes == [
        ("resource_read_finished", "UPSTREAM_ERROR"),
        ("resource_read_finished", "INTERNAL_ERROR"),
        ("prompt_get_finished", "DOC_SIZE_EXCEEDED"),
        ("prompt_get_finished", "INTERNAL_ERROR"),
    ]
    assert CANARY not in audit_text(audit)


# --- grants change ---------------------------------------------------------------------------


async def test_assigning_then_revoking_a_profile_shows_then_hides_them(serve: Any) -> None:
    server = serve(subject="dana", role="viewer")  # no claim: the assignment decides
    db = str(server.runtime.grants.path)
    profiles = str(server.runtime.settings.profiles.file)
    async with Client(server.mcp) as client:
        assert await listed(client) == (set(), set(), set())
        run_cli("profiles", "assign", "dana", "reader", "--db", db, "--profiles", profiles)
        shown, _ = await poll(
            lambda: listed(client),
            lambda v: v == (GRANTED_RESOURCES, GRANTED_TEMPLATES, GRANTED_PROMPTS),
        )
        assert shown == (GRANTED_RESOURCES, GRANTED_TEMPLATES, GRANTED_PROMPTS)
        assert (await client.read_resource_mcp("upstream://x/doc")).contents[0].text == "x doc"  # type: ignore[union-attr]

        run_cli("profiles", "revoke", "dana", "--profile", "--db", db, "--profiles", profiles)
        hidden, _ = await poll(lambda: listed(client), lambda v: v == (set(), set(), set()))
        assert hidden == (set(), set(), set())
        assert await read_error(client, "upstream://x/doc") == await read_error(
            client, "upstream://x/none"
        )
        assert await prompt_error(client, "x_greet", {"who": "a"}) == await prompt_error(
            client, "x_none"
        )


# --- over HTTP, through the wire filter ---------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_over_http_hidden_equals_missing_and_a_refusal_keeps_its_code(
    workspace: Path, tmp_path: Path, audit: MemoryAuditSink, profiles_file: Path, mode: str
) -> None:
    profiles = {"file": profiles_file, "cache_ttl_seconds": TTL}
    async with http_nexus(workspace, tmp_path / "data", audit, profiles=profiles) as (
        server,
        url,
    ):
        add_components(server)
        async with http_client(url, token("bob", role="viewer"), mode=mode) as bob:
            assert await listed(bob) == (set(), set(), set())
            hidden = await read_error(bob, "upstream://x/doc")
            missing = await read_error(bob, f"upstream://x/{CANARY}")
            hidden_prompt = await prompt_error(bob, "x_greet", {"who": CANARY})
            missing_prompt = await prompt_error(bob, f"x_{CANARY}")
        async with http_client(url, token("ed", role="editor"), mode=mode) as ed:
            assert (await ed.read_resource_mcp("upstream://x/doc")).contents[0].text == "x doc"  # type: ignore[union-attr]
            broken = await read_error(ed, "upstream://x/broken")
            refused = await prompt_error(ed, "x_refuses")
    assert hidden == missing == {"code": -32602, "message": "Resource not found", "data": None}
    assert hidden_prompt == missing_prompt
    assert hidden_prompt == {"code": -32602, "message": "Unknown prompt", "data": None}
    assert broken["code"] == -32050 and broken["data"]["code"] == "UPSTREAM_ERROR"
    assert refused["code"] == -32050 and refused["data"]["code"] == "DOC_SIZE_EXCEEDED"
    assert CANARY not in json.dumps(
        [hidden, missing, hidden_prompt, missing_prompt, broken, refused]
    )


# --- the shared grants store down -----------------------------------------------------------


@pytest.mark.slow
async def test_with_postgres_down_reads_and_gets_are_unavailable_and_listings_empty(
    private_postgres: Any,
    redis_url: str,
    state_prefix: str,
    workspace: Path,
    tmp_path: Path,
    audit: MemoryAuditSink,
    profiles_file: Path,
) -> None:
    """The visible sources cannot be known: a read or get is refused with the typed,
    retryable UNAVAILABLE (never answered as missing, never read), listings are empty, and
    both recover with the store."""
    pool = PostgresPool(private_postgres.url, pool_size=1)
    try:
        migrate(pool)
    finally:
        pool.close()
    server = build_server(
        Settings(
            mode="prod",
            subject="ed",
            role="editor",
            workspace=workspace,
            data_dir=tmp_path / "data-pg",
            profiles={"file": profiles_file},
            state={
                "backend": "shared",
                "postgres_url": {"env": "PG"},
                "redis_url": {"env": "RD"},
                "key_prefix": state_prefix,
                "request_state_keys": [{"env": "RSK"}],
                "timeout_seconds": 1.0,
                "connect_timeout_seconds": 1.0,
            },
        ),
        audit_sinks=[audit],
        env={"PG": private_postgres.url, "RD": redis_url, "RSK": "k" * 40},
    )
    try:
        add_components(server)
        async with Client(server.mcp) as client:
            assert (await client.read_resource_mcp("upstream://x/doc")).contents[0].text == "x doc"  # type: ignore[union-attr]
            private_postgres.stop()
            server.runtime.access.forget()  # as the caches' refresh would, a moment later
            unavailable = await read_error(client, "upstream://x/doc")
            prompt = await prompt_error(client, "x_greet", {"who": "a"})
            assert await listed(client) == (set(), set(), set())
            private_postgres.start()
            deadline = time.monotonic() + 10
            while True:
                server.runtime.access.forget()
                try:
                    await client.read_resource_mcp("upstream://x/doc")
                    break
                except MCPError:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
    finally:
        server.close()
    payload = {"error": "the grants store is unavailable; retry later", "code": "UNAVAILABLE"}
    expected = {
        "code": -32050,
        "message": json.dumps(payload, separators=(",", ":")),
        "data": payload,
    }
    assert unavailable == prompt == expected
    blocked = [r for r in audit.records() if r["event"].endswith("_blocked")]
    assert [(r["event"], r["outcome"]) for r in blocked][:2] == [
        ("resource_read_blocked", "UNAVAILABLE"),
        ("prompt_get_blocked", "UNAVAILABLE"),
    ]
