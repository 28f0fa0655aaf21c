"""Issue 4 end to end: every caller sees and calls exactly its granted tools (seed 004).

Real clients only: the in-memory client for launch principals (both protocol eras) and
streamable HTTP on a real uvicorn socket with bearer tokens when several subjects must be
served at the same time. Profile changes come from the ``nexus-mcp profiles`` command
writing the same grants file, like another process. Expected tool sets are computed in
this file from ``config/tool_profiles.yaml`` and the registry file, never from the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client, FastMCP
from pydantic import BaseModel
from structlog.testing import capture_logs

from nexus_mcp._version import __version__
from nexus_mcp.contracts import nexus_tool
from nexus_mcp.observability.audit import TOOL_CALL_BLOCKED, TOOL_CALL_STARTED, MemoryAuditSink
from nexus_mcp.policy.grants import grant_tool, revoke_tool
from nexus_mcp.principal import ROLES
from nexus_mcp.server import build_server
from nexus_mcp.settings import Settings

from .access_helpers import (
    MISSING_TOOL,
    TTL_SECONDS,
    grants_db,
    http_client,
    http_nexus,
    json_text,
    list_as,
    poll,
    registered,
    registry_write_tools,
    renamed,
    resolved_profiles,
    role_profiles,
    run_cli,
    token,
    tool_names,
    tuples_table_missing,
)
from .conftest import ServerFactory, snapshot, wire

MODES = ["auto", "legacy"]
PROFILES = resolved_profiles()
ROLE_DEFAULTS = role_profiles()
WRITE_TOOLS = registry_write_tools()
CANARY = "CANARY-ns-41b7"
TTL = TTL_SECONDS
# The visible-tools cache entry expires after TTL; allow generous scheduling slack on CI.
TTL_BOUND = TTL + 1.5


def visible(profile: str, server_tools: frozenset[str]) -> frozenset[str]:
    return PROFILES[profile] & server_tools


def blocked(audit: MemoryAuditSink) -> list[dict[str, Any]]:
    return [r for r in audit.records() if r["event"] == TOOL_CALL_BLOCKED]


async def bare_unknown_tool_answer(name: str, args: dict[str, Any], mode: str) -> dict[str, Any]:
    bare: FastMCP[Any] = FastMCP("nexus", version=__version__)
    async with Client(bare, mode=mode) as client:
        return wire(await client.call_tool_mcp(name, args))


def test_the_fixture_profiles_differ_where_the_tests_rely_on_it() -> None:
    """Guards the expectations below: a profile edit that makes them vacuous fails here."""
    assert PROFILES["minimal"] < PROFILES["coding"] < PROFILES["full"]
    assert PROFILES["coding"] & WRITE_TOOLS and not PROFILES["minimal"] & WRITE_TOOLS
    assert ROLE_DEFAULTS == {
        "viewer": "minimal",
        "editor": "coding",
        "evaluator": "search",
        "admin": "full",
    }


# --- seed 004 phase 6: several subjects at once, over HTTP ------------------------------


async def test_subjects_with_different_profiles_see_different_tools_at_the_same_time(
    workspace: Path, tmp_path: Path, audit: MemoryAuditSink
) -> None:
    async with http_nexus(workspace, tmp_path / "data", audit) as (server, url):
        tools = registered(server)
        bearers = {
            "alice": token("alice", profile="coding"),
            "bob": token("bob", role="viewer"),
            "root": token("root", role="admin"),
            "eve": token("eve", role="evaluator"),
            "rory": token("rory", role="admin", read_only=True),
        }
        expected = {
            "alice": visible("coding", tools),
            "bob": visible("minimal", tools),
            "root": tools,  # admin: every registered tool
            "eve": visible("search", tools),
            "rory": tools - WRITE_TOOLS,
        }
        assert len(set(expected.values())) == len(expected)
        # Interleave: every subject lists several times, all requests in flight together.
        order = [s for _ in range(4) for s in bearers]
        seen = await asyncio.gather(*(list_as(url, bearers[s]) for s in order))
        for subject, names in zip(order, seen, strict=True):
            assert names == expected[subject], subject


async def test_a_hidden_tool_over_http_answers_like_a_missing_one_and_does_nothing(
    workspace: Path, tmp_path: Path, audit: MemoryAuditSink
) -> None:
    before = snapshot(workspace)
    args = {"path": "new.txt", "content": CANARY, "idempotency_key": "k-http"}
    async with http_nexus(workspace, tmp_path / "data", audit) as (_server, url):
        async with http_client(url, token("bob", role="viewer")) as bob:
            hidden = wire(await bob.call_tool_mcp("nexus_write_file", args))
            missing = wire(await bob.call_tool_mcp(MISSING_TOOL, args))
        async with http_client(url, token("alice", role="editor")) as alice:
            granted = wire(await alice.call_tool_mcp("nexus_read_file", {"path": "todo.txt"}))
    assert renamed(hidden, "nexus_write_file") == renamed(missing, MISSING_TOOL)
    assert hidden["content"] == [{"type": "text", "text": "Unknown tool: 'nexus_write_file'"}]
    assert CANARY not in json_text(hidden)
    assert granted["isError"] is False
    assert snapshot(workspace) == before
    assert [r["reason"] for r in blocked(audit)] == ["not_granted", "unknown_tool"]


async def test_assigning_minimal_through_the_cli_shrinks_the_list_within_the_cache_ttl(
    workspace: Path, tmp_path: Path, audit: MemoryAuditSink
) -> None:
    async with http_nexus(workspace, tmp_path / "data", audit) as (server, url):
        tools, db = registered(server), str(grants_db(server))
        bearer = token("dana", role="viewer")  # no profile claim: the assignment decides
        run_cli("profiles", "assign", "dana", "coding", "--db", db)
        assert await list_as(url, bearer) == visible("coding", tools)

        run_cli("profiles", "assign", "dana", "minimal", "--db", db)
        names, elapsed = await poll(
            lambda: list_as(url, bearer), lambda n: n == visible("minimal", tools)
        )
        assert names == visible("minimal", tools)
        assert elapsed < TTL_BOUND
        async with http_client(url, bearer) as dana:
            result = wire(
                await dana.call_tool_mcp(
                    "nexus_write_file", {"path": "a.txt", "content": "x", "idempotency_key": "k"}
                )
            )
        assert result["content"] == [{"type": "text", "text": "Unknown tool: 'nexus_write_file'"}]


async def test_a_direct_grant_and_its_revocation_through_the_cli_reach_the_server(
    workspace: Path, tmp_path: Path, audit: MemoryAuditSink
) -> None:
    async with http_nexus(workspace, tmp_path / "data", audit) as (server, url):
        tools, db = registered(server), str(grants_db(server))
        bearer = token("gus", role="viewer")
        assert "nexus_grep" not in await list_as(url, bearer)

        run_cli("profiles", "grant", "gus", "nexus_grep", "--db", db)
        names, elapsed = await poll(lambda: list_as(url, bearer), lambda n: "nexus_grep" in n)
        assert names == visible("minimal", tools) | {"nexus_grep"}
        assert elapsed < TTL_BOUND

        run_cli("profiles", "revoke", "gus", "--tool", "nexus_grep", "--db", db)
        names, elapsed = await poll(lambda: list_as(url, bearer), lambda n: "nexus_grep" not in n)
        assert names == visible("minimal", tools)
        assert elapsed < TTL_BOUND
        async with http_client(url, bearer) as gus:
            result = wire(await gus.call_tool_mcp("nexus_grep", {"pattern": "TODO"}))
        assert result["content"] == [{"type": "text", "text": "Unknown tool: 'nexus_grep'"}]


async def test_a_profile_claim_keeps_precedence_over_an_assignment_made_during_its_session(
    workspace: Path, tmp_path: Path, audit: MemoryAuditSink
) -> None:
    async with http_nexus(workspace, tmp_path / "data", audit) as (server, url):
        tools, db = registered(server), str(grants_db(server))
        bearer = token("erin", role="viewer", profile="minimal")
        assert await list_as(url, bearer) == visible("minimal", tools)
        run_cli("profiles", "assign", "erin", "coding", "--db", db)
        # Watch past the cache TTL: a leak shows up as soon as the cached entry expires.
        names, _ = await poll(
            lambda: list_as(url, bearer),
            lambda n: n != visible("minimal", tools),
            timeout=TTL + 0.5,
        )
        assert names == visible("minimal", tools)


async def test_a_restricted_token_never_sees_the_tools_of_a_wider_token_of_the_same_subject(
    workspace: Path, tmp_path: Path, audit: MemoryAuditSink
) -> None:
    async with http_nexus(workspace, tmp_path / "data", audit) as (server, url):
        tools = registered(server)
        narrow, wide = token("frank", profile="minimal"), token("frank", profile="full")
        assert await list_as(url, narrow) == visible("minimal", tools)
        assert await list_as(url, wide) == visible("full", tools)
        assert await list_as(url, narrow) == visible("minimal", tools)
        async with http_client(url, narrow) as client:
            result = wire(
                await client.call_tool_mcp(
                    "nexus_delete_file", {"path": "todo.txt", "idempotency_key": "k"}
                )
            )
        assert result["content"] == [{"type": "text", "text": "Unknown tool: 'nexus_delete_file'"}]


# --- invisible is indistinguishable from unknown (both protocol eras) --------------------

HIDDEN_CALLS = [
    pytest.param({"path": "new.txt", "content": CANARY, "idempotency_key": "k1"}, id="valid-args"),
    pytest.param({}, id="missing-args"),
    pytest.param({"path": 7, CANARY: CANARY}, id="invalid-args"),
]


@pytest.mark.parametrize("args", HIDDEN_CALLS)
@pytest.mark.parametrize("mode", MODES)
async def test_calling_a_hidden_tool_is_indistinguishable_from_calling_a_missing_one(
    make_server: ServerFactory,
    workspace: Path,
    audit: MemoryAuditSink,
    mode: str,
    args: dict[str, Any],
) -> None:
    before = snapshot(workspace)
    server = make_server(mode="prod", subject="vic", role="viewer")
    async with Client(server.mcp, mode=mode) as client:
        assert "nexus_write_file" not in await tool_names(client)
        hidden = wire(await client.call_tool_mcp("nexus_write_file", args))
        missing = wire(await client.call_tool_mcp(MISSING_TOOL, args))
    bare = await bare_unknown_tool_answer(MISSING_TOOL, args, mode)

    assert renamed(hidden, "nexus_write_file") == renamed(missing, MISSING_TOOL)
    assert missing == bare
    assert hidden["content"] == [{"type": "text", "text": "Unknown tool: 'nexus_write_file'"}]
    assert CANARY not in json_text(hidden)
    assert snapshot(workspace) == before
    events = [r for r in audit.records() if r["event"] != "tool_call_finished"]
    assert [(r["event"], r["reason"], r["outcome"]) for r in events] == [
        (TOOL_CALL_BLOCKED, "not_granted", "UNKNOWN_TOOL"),
        (TOOL_CALL_BLOCKED, "unknown_tool", "UNKNOWN_TOOL"),
    ]
    assert not any(r["event"] == TOOL_CALL_STARTED for r in audit.records())
    assert CANARY not in json_text(audit.records())


@pytest.mark.parametrize("mode", MODES)
async def test_an_admin_with_no_profile_claim_sees_every_registered_tool(
    make_server: ServerFactory, mode: str
) -> None:
    server = make_server(mode="prod", subject="root", role="admin")
    async with Client(server.mcp, mode=mode) as client:
        assert await tool_names(client) == registered(server)


# --- read-only callers ----------------------------------------------------------------


async def _assert_read_only_view(server: Any, workspace: Path, audit: MemoryAuditSink) -> None:
    before = snapshot(workspace)
    tools = registered(server)
    assert WRITE_TOOLS & visible("coding", tools)
    async with Client(server.mcp) as client:
        assert await tool_names(client) == visible("coding", tools) - WRITE_TOOLS
        args = {"path": "todo.txt", "idempotency_key": "k-ro"}
        hidden = wire(await client.call_tool_mcp("nexus_delete_file", args))
        missing = wire(await client.call_tool_mcp(MISSING_TOOL, args))
        readable = wire(await client.call_tool_mcp("nexus_read_file", {"path": "todo.txt"}))
    assert renamed(hidden, "nexus_delete_file") == renamed(missing, MISSING_TOOL)
    assert readable["isError"] is False
    assert snapshot(workspace) == before
    assert [r["reason"] for r in blocked(audit)] == ["not_granted", "unknown_tool"]


async def test_a_read_only_launch_principal_neither_sees_nor_calls_write_tools(
    make_server: ServerFactory, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = make_server(mode="prod", subject="rita", role="editor", read_only=True)
    await _assert_read_only_view(server, workspace, audit)


async def test_nexus_mcp_read_only_in_the_environment_hides_write_tools(
    make_server: ServerFactory,
    workspace: Path,
    audit: MemoryAuditSink,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NEXUS_MCP_READ_ONLY", "true")
    server = make_server(mode="prod", subject="rita", role="editor")
    await _assert_read_only_view(server, workspace, audit)


# --- which profile applies ---------------------------------------------------------------

SELECTION_CASES = [
    # (principal profile, role, stored assignment, expected profile or None for nothing)
    pytest.param("minimal", "admin", "coding", "minimal", id="claim-beats-assignment-and-role"),
    pytest.param(None, "admin", "search", "search", id="assignment-beats-role"),
    pytest.param(None, "editor", None, "coding", id="role-default"),
    pytest.param(None, "evaluator", None, "search", id="evaluator-role"),
    pytest.param(None, "superuser", None, "minimal", id="unknown-role-gets-viewer-profile"),
    pytest.param(None, None, None, "minimal", id="no-role-is-viewer"),
    pytest.param("no-such-profile", "admin", "full", None, id="unknown-claim-sees-nothing"),
]


@pytest.mark.parametrize(("claim", "role", "assignment", "expected"), SELECTION_CASES)
async def test_the_profile_is_the_claim_else_the_assignment_else_the_role_default(
    make_server: ServerFactory,
    claim: str | None,
    role: str | None,
    assignment: str | None,
    expected: str | None,
) -> None:
    server = make_server(mode="prod", subject="pat", role=role, profile=claim)
    if assignment is not None:
        run_cli("profiles", "assign", "pat", assignment, "--db", str(grants_db(server)))
    async with Client(server.mcp) as client:
        names = await tool_names(client)
        read = wire(await client.call_tool_mcp("nexus_read_file", {"path": "todo.txt"}))
    assert names == (visible(expected, registered(server)) if expected else frozenset())
    if expected is None:
        assert read["content"] == [{"type": "text", "text": "Unknown tool: 'nexus_read_file'"}]


async def test_an_assignment_to_a_profile_removed_from_the_file_sees_nothing(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(
        "profiles:\n  minimal:\n    tools: [nexus_read_file]\n  retired:\n    tools: [nexus_glob]\n"
    )
    new.write_text("profiles:\n  minimal:\n    tools: [nexus_read_file]\n")
    server = make_server(mode="prod", subject="olga", role="viewer", profiles={"file": new})
    run_cli(
        "profiles",
        "assign",
        "olga",
        "retired",
        "--db",
        str(grants_db(server)),
        "--profiles",
        str(old),
    )
    async with Client(server.mcp) as client:
        assert await tool_names(client) == frozenset()
    # Control: the same server shows the role default to a subject without that assignment.
    control = make_server(mode="prod", subject="otto", role="viewer", profiles={"file": new})
    async with Client(control.mcp) as client:
        assert await tool_names(client) == {"nexus_read_file"}


@pytest.mark.parametrize("mode", MODES)
async def test_prod_without_a_subject_sees_nothing_and_calls_nothing(
    make_server: ServerFactory, audit: MemoryAuditSink, mode: str
) -> None:
    server = make_server(mode="prod")
    async with Client(server.mcp, mode=mode) as client:
        assert await tool_names(client) == frozenset()
        hidden = wire(await client.call_tool_mcp("nexus_read_file", {"path": "todo.txt"}))
        missing = wire(await client.call_tool_mcp(MISSING_TOOL, {"path": "todo.txt"}))
    assert renamed(hidden, "nexus_read_file") == renamed(missing, MISSING_TOOL)
    assert hidden["content"] == [{"type": "text", "text": "Unknown tool: 'nexus_read_file'"}]


# --- fail closed when the grants store fails ----------------------------------------------


async def test_a_failing_grants_lookup_shows_nothing_and_is_never_cached(
    make_server: ServerFactory, audit: MemoryAuditSink
) -> None:
    server = make_server(
        mode="prod", subject="fay", role="editor", profiles={"cache_ttl_seconds": TTL}
    )
    expected = visible("coding", registered(server))
    metrics = server.runtime.access.cache.metrics
    async with Client(server.mcp) as client:
        assert await tool_names(client) == expected  # session started, cache warm
        errors_before = metrics()["errors"]
        with tuples_table_missing(grants_db(server)):
            names, elapsed = await poll(lambda: tool_names(client), lambda n: not n)
            assert names == frozenset() and elapsed < TTL_BOUND
            hidden = wire(await client.call_tool_mcp("nexus_read_file", {"path": "todo.txt"}))
            missing = wire(await client.call_tool_mcp(MISSING_TOOL, {"path": "todo.txt"}))
            assert await tool_names(client) == frozenset()
            assert metrics()["errors"] >= errors_before + 3
        # Not cached: the very next request after the fault sees the tools again.
        assert await tool_names(client) == expected
        read = wire(await client.call_tool_mcp("nexus_read_file", {"path": "todo.txt"}))
    assert renamed(hidden, "nexus_read_file") == renamed(missing, MISSING_TOOL)
    assert read["isError"] is False
    assert [r["reason"] for r in blocked(audit)] == ["not_granted", "unknown_tool"]


async def test_a_grants_failure_on_the_first_request_fails_closed_and_recovers(
    make_server: ServerFactory,
) -> None:
    server = make_server(
        mode="prod", subject="finn", role="editor", profiles={"cache_ttl_seconds": TTL}
    )
    async with Client(server.mcp) as client:
        with tuples_table_missing(grants_db(server)):
            assert await tool_names(client) == frozenset()
            result = wire(await client.call_tool_mcp("nexus_read_file", {"path": "todo.txt"}))
        assert await tool_names(client) == visible("coding", registered(server))
    assert result["content"] == [{"type": "text", "text": "Unknown tool: 'nexus_read_file'"}]


async def test_a_grants_failure_on_the_first_request_is_counted_in_the_metrics(
    make_server: ServerFactory,
) -> None:
    server = make_server(mode="prod", subject="finn", role="editor")
    async with Client(server.mcp) as client:
        with tuples_table_missing(grants_db(server)):
            assert await tool_names(client) == frozenset()
    assert server.runtime.access.cache.metrics()["errors"] >= 1


# --- grants written through the server ------------------------------------------------------


async def test_grants_written_through_the_server_are_visible_on_the_next_request(
    make_server: ServerFactory,
) -> None:
    # Default cache TTL (minutes): only the server's own invalidation can explain the change.
    server = make_server(mode="prod", subject="hal", role="viewer")
    runtime = server.runtime
    zone = runtime.settings.profiles.zone
    minimal = visible("minimal", registered(server))
    async with Client(server.mcp) as client:
        assert await tool_names(client) == minimal
        grant_tool(runtime.grants, "hal", "nexus_grep", zone)
        runtime.access.forget("hal")
        assert await tool_names(client) == minimal | {"nexus_grep"}
        grep = wire(await client.call_tool_mcp("nexus_grep", {"pattern": "TODO"}))
        revoke_tool(runtime.grants, "hal", "nexus_grep", zone)
        runtime.access.forget()  # everyone
        assert await tool_names(client) == minimal
    assert grep["isError"] is False


# --- cross-check against an independent model ------------------------------------------------


async def test_random_subjects_see_exactly_what_the_profile_file_and_their_grants_allow(
    workspace: Path, tmp_path: Path, audit: MemoryAuditSink
) -> None:
    rng = random.Random(4004)
    roles = [*ROLES, "intern", None]
    claims = [*PROFILES, "ghost", None, None, None]
    async with http_nexus(workspace, tmp_path / "data", audit) as (server, url):
        tools, db = registered(server), str(grants_db(server))
        grantable = sorted(tools | {"nexus_python", "nexus_bash"})  # some are not mounted
        cases: list[tuple[str, str, frozenset[str]]] = []
        for i in range(30):
            subject, role, claim = f"subject-{i}", rng.choice(roles), rng.choice(claims)
            assignment = rng.choice([*PROFILES, None, None])
            direct = frozenset(rng.sample(grantable, rng.randint(0, 3)))
            read_only = rng.random() < 0.25
            if assignment is not None:
                run_cli("profiles", "assign", subject, assignment, "--db", db)
            for tool in sorted(direct):
                # A tool no server here has needs the explicit flag (an upstream to come).
                unknown = () if tool in tools else ("--allow-unknown-tool",)
                run_cli("profiles", "grant", subject, tool, "--db", db, *unknown)
            if claim is not None:
                profile: str | None = claim if claim in PROFILES else None
            elif assignment is not None:
                profile = assignment
            else:
                profile = ROLE_DEFAULTS[role if role in ROLES else "viewer"]
            want = frozenset() if profile is None else (PROFILES[profile] | direct) & tools
            if read_only:
                want -= WRITE_TOOLS
            bearer = token(subject, role=role, profile=claim, read_only=read_only or None)
            cases.append((subject, bearer, want))
        assert len({want for _, _, want in cases}) >= 8  # the sample is actually varied

        async def observe(bearer: str, want: frozenset[str]) -> tuple[frozenset[str], list[bool]]:
            async with http_client(url, bearer) as client:
                names = await tool_names(client)
                probes = sorted(tools - want)[:2]
                unknown = [
                    wire(await client.call_tool_mcp(p, {}))["content"]
                    == [{"type": "text", "text": f"Unknown tool: {p!r}"}]
                    for p in probes
                ]
            return names, unknown

        observed = await asyncio.gather(*(observe(b, w) for _, b, w in cases))
    for (subject, _, want), (names, unknown) in zip(cases, observed, strict=True):
        assert names == want, subject
        assert all(unknown), subject


# --- secrets never leave in clear ------------------------------------------------------------

SECRET_SUBJECT = "sk-live-" + CANARY + "-9f8e7d6c5b4a39281706"
HASHED_SUBJECT = "sha256:" + hashlib.sha256(SECRET_SUBJECT.encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    "mode",
    [
        "auto",
        "legacy",
    ],
)
async def test_a_secret_looking_subject_is_hashed_in_every_audit_record(
    make_server: ServerFactory, audit: MemoryAuditSink, mode: str
) -> None:
    server = make_server(mode="prod", subject=SECRET_SUBJECT, role="viewer")
    async with Client(server.mcp, mode=mode) as client:
        await client.call_tool_mcp("nexus_read_file", {"path": "todo.txt"})
        await client.call_tool_mcp(
            "nexus_write_file", {"path": "a.txt", "content": "x", "idempotency_key": "k"}
        )
        await client.call_tool_mcp(MISSING_TOOL, {})
    records = audit.records()
    assert len(records) >= 3
    assert {r["subject"] for r in records} == {HASHED_SUBJECT}
    assert CANARY not in json_text(records)


async def test_a_secret_looking_subject_is_hashed_in_logs_and_cli_output(
    make_server: ServerFactory, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    denied = make_server(mode="prod", subject=SECRET_SUBJECT, profile="no-such-profile")
    failing = make_server(mode="prod", subject=SECRET_SUBJECT, role="viewer")
    with capture_logs() as logs:
        async with Client(denied.mcp) as client:
            assert await tool_names(client) == frozenset()
        async with Client(failing.mcp) as client:
            with tuples_table_missing(grants_db(failing)):
                assert await tool_names(client) == frozenset()
    run_cli("profiles", "assign", SECRET_SUBJECT, "minimal", "--db", str(grants_db(failing)))
    out = capsys.readouterr()
    events = {e["event"]: e for e in logs}
    assert events["profile_denied"]["subject"] == HASHED_SUBJECT
    assert events["namespace_lookup_failed"]["subject"] == HASHED_SUBJECT
    assert HASHED_SUBJECT in out.out
    everything = json_text(logs) + out.out + out.err + caplog.text
    assert CANARY not in everything


class Done(BaseModel):
    ok: bool


@nexus_tool(risk="read", toolset="test", required_scopes=("reports:read",))
async def scoped_report() -> Done:
    """A tool only callers holding reports:read may use."""
    return Done(ok=True)


async def test_a_tool_requiring_scopes_is_visible_only_with_them(
    tmp_path: Path, workspace: Path
) -> None:
    seen: dict[str, bool] = {}
    for scopes in ("", "reports:read other"):
        server = build_server(
            Settings(mode="dev", workspace=workspace, data_dir=tmp_path / f"d{len(seen)}",
                     subject="sam", role="admin", scopes=scopes),
            audit_sinks=[],
            extra_tools=[scoped_report],
        )  # fmt: skip
        grant_tool(server.runtime.grants, "sam", "scoped_report", "default")
        async with Client(server.mcp) as client:
            names = {t.name for t in await client.list_tools()}
            result = await client.call_tool_mcp("scoped_report", {})
        seen[scopes] = "scoped_report" in names and not result.is_error
        server.close()
    assert seen == {"": False, "reports:read other": True}
