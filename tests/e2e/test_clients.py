"""Refusals readable by every client: the official TypeScript SDK (1.x) and the MCP Inspector
CLI, installed from npm at pinned versions (tests/clients), get every refusal as a result,
over streamable HTTP and over stdio (issue 11).

Both list the tools first, as a host does, and validate a result's ``structuredContent``
against the tool's ``outputSchema`` even when ``isError`` is set: an envelope there made
the SDK throw ``-32602`` and the Inspector exit 1. The envelope is text content only;
success results keep ``structuredContent``, valid against the listed schema.

The plain messages a user acts on arrive intact (issue 24): a write-policy refusal naming its
rule, a write into a missing folder saying how to create it, a missing, mistyped or unexpected
argument (answered with the accepted names, never the one sent).

Codes a plain client reaches with arguments, ``_meta`` and the server's configuration, each
asserted here: INVALID_PATH, INVALID_INPUT, NOT_FOUND, CONFLICT, DOC_SIZE_EXCEEDED,
DOC_HASH_MISMATCH, TOOL_CLASS_DECLARATION_MISMATCH, TOOL_TIMEOUT (a read, and a write),
UPSTREAM_ERROR, IDEMPOTENCY_KEY_REQUIRED, IDEMPOTENCY_KEY_CONFLICT (other arguments; and
the retry of a write whose outcome is unknown, the one refusal the idempotency store
answers from a record), WRITE_POLICY_DENIED, APPROVAL_REQUIRED, APPROVAL_INVALID,
APPROVAL_EXPIRED, APPROVAL_REPLAYED, BUDGET_EXCEEDED, RATE_LIMITED, and FastMCP's
``Unknown tool`` for a hidden tool and for a missing one. Successes too: a read, an approved
write and its idempotent replay keep ``structuredContent``.

Not reachable with the shipped tools, so not here (their envelope is the same function,
covered in memory by test_envelope.py and test_registry.py): TOOL_UNCLASSIFIED_DENIED
(every shipped tool is classified), TOOL_CLASS_MISMATCH (a read-only caller is never shown
a write tool; it gets ``Unknown tool``), DOC_CONTENT_POINTER_INVALID (the registry's
pointers name required arguments), DOC_ENCODING_INVALID (no shipped tool takes base64, and
text without a UTF-8 form, a lone surrogate, is refused by the JSON-RPC parser first with
-32700), INTERNAL_ERROR (a defect by definition).

The TypeScript SDK runs every case in one session per transport. The Inspector CLI makes
one call per process (its default text output, as a user reads it), so: BUDGET_EXCEEDED
(per MCP session) is out of its reach; a tool it does not list ends in its own
``tool_not_found`` before any call (the same for a hidden and a missing tool); over HTTP it
runs one case per code, and over stdio, where each call starts a server, a sample (the
envelope is built the same way whatever the transport).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from nexus_mcp.policy.approvals import (
    load_approval_keys,
    load_approval_settings,
    mint_approval_token,
)

from .conftest import snapshot
from .node_clients import (
    INSPECTOR_EXIT_TOOL_ERROR,
    INSPECTOR_TOOL_IS_ERROR,
    INSPECTOR_TOOL_NOT_FOUND,
    InspectorRun,
    InspectorTarget,
    NodeClients,
    SessionRun,
    inspector_command,
    run_inspector,
    run_ts_plans,
)
from .servers import SRC, free_port, http_server, serve_command, server_env

pytestmark = pytest.mark.slow

SECRET = "client-tests-approval-secret-0123456789abcdef"
SUBJECT = "dev"  # the dev principal, which every call here runs as
READ_LIMIT = 4096
TINY_TIMEOUT_S = 1e-6  # expires at the tool's first await: a deterministic TOOL_TIMEOUT
HIDDEN_TOOL = "nexus_discovery_list_servers"  # a real tool the "coding" profile leaves out
ZERO_HASH = "0" * 64
META_HASHES = "nexus.mcp/expected_document_hashes"
META_CLASS = "nexus.mcp/tool_class"
META_REPLAYED = "nexus.mcp/idempotent_replay"
OK = "OK"
REPLAYED = "REPLAYED"  # OK, answered from the idempotency record
UNKNOWN = "UNKNOWN_TOOL"
INSPECTOR_WORKERS = 4
# Refusals read by a client as a user would (issue 24): the rule, never the value.
DENIED = "write denied by the write policy"
SHOULD_BE_TEXT = "argument 'path' should be text"
UNEXPECTED = "unexpected argument; accepted: path"
MKDIR_FIRST = (
    "the parent folder does not exist: create it first with nexus_mkdir "
    "(parents=true creates every missing level)"
)
HOSTILE_NAME = "<script>\x1b[31mCANARY-ARG"  # an argument name that must never be echoed
SERVER_ENV = {"PYTHONPATH": str(SRC)}  # what a stdio server the Inspector starts needs


@dataclass(frozen=True)
class Case:
    expect: str  # an error code, OK, REPLAYED or UNKNOWN
    tool: str
    arguments: dict[str, Any]
    meta: dict[str, Any] | None = None
    tool_args: tuple[str, ...] = ()  # the Inspector's key=value form instead
    message: str | None = None  # the envelope's exact message, where a case pins it

    def call(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.tool, "arguments": self.arguments}
        if self.meta is not None:
            out["meta"] = self.meta
        return out


Minter = Callable[..., str]


# --- server configuration -----------------------------------------------------------------


def config(**budgets: Any) -> dict[str, Any]:
    """Dev mode narrowed to the "coding" profile, small limits, a write policy that needs
    approval: every refusal below comes from this configuration and the call alone."""
    return {
        "mode": "dev",
        "profile": "coding",
        "log_level": "WARNING",
        "limits": {"max_read_bytes": READ_LIMIT},
        "budgets": {
            "tool_timeouts": {"nexus_glob": TINY_TIMEOUT_S, "nexus_mkdir": TINY_TIMEOUT_S},
            **budgets,
        },
        "write_policies": {
            "workspace": {
                "allowed_paths": ["scratch/**"],
                "allowed_operations": ["write", "mkdir"],
                "require_approval": True,
            }
        },
        "approvals": {"secret": SECRET},
    }


# Per-session budget and per-subject rate, small: each needs a server of its own.
BUDGET_ONLY = {"max_calls_per_session": 1}
RATE_ONLY = {"rate_limit_calls": 1, "rate_limit_window_seconds": 3600}
# One HTTP server for both: a session of three calls spends the budget (the third is
# BUDGET_EXCEEDED, yet counted by the rate), and the next session's first call is over
# the rate of three.
BUDGET_THEN_RATE = {
    "max_calls_per_session": 2,
    "rate_limit_calls": 3,
    "rate_limit_window_seconds": 3600,
}


@dataclass(frozen=True)
class Launch:
    """What every server of a test shares (workspace) and where its files go."""

    workspace: Path
    root: Path

    def server_args(self, name: str, **budgets: Any) -> list[str]:
        """``--config`` (written now), ``--workspace`` and a data dir of its own."""
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config(**budgets)), encoding="utf-8")
        data = self.root / f"data-{name}"
        return ["--config", str(path), "--workspace", str(self.workspace), "--data-dir", str(data)]

    def stdio_session(
        self, name: str, calls: Sequence[Mapping[str, Any]], **budgets: Any
    ) -> dict[str, Any]:
        command = serve_command("--transport", "stdio", *self.server_args(name, **budgets))
        return {
            "transport": "stdio",
            "command": command[0],
            "args": command[1:],
            "env": server_env(),
            "calls": list(calls),
        }


@pytest.fixture
def launch(workspace: Path, tmp_path: Path) -> Launch:
    (workspace / "big.txt").write_bytes(b"x" * (READ_LIMIT + 1))
    return Launch(workspace, tmp_path)


@pytest.fixture
def mint() -> Minter:
    """An approver's token for ``tool`` with exactly ``arguments``, signed as the server's
    ``approvals`` section says (the same loaders the server uses)."""
    section = {"approvals": {"secret": SECRET}}
    keys = load_approval_keys({}, section)
    settings = load_approval_settings({}, section)

    def mint(tool: str, arguments: Mapping[str, Any], *, now: float | None = None) -> str:
        return mint_approval_token(
            keys,
            settings,
            approver="ci-approver",
            subject=SUBJECT,
            tool=tool,
            arguments=arguments,
            host_id="ci-host",
            now=now,
        )

    return mint


@contextmanager
def http_servers(launch: Launch, **budgets_by_name: Mapping[str, Any]) -> Iterator[dict[str, str]]:
    """``serve --transport http`` per name (each with its budgets); yields name -> /mcp URL."""
    with ExitStack() as stack:
        urls: dict[str, str] = {}
        for name, budgets in budgets_by_name.items():
            port = free_port()
            errlog = stack.enter_context((launch.root / f"{name}.stderr").open("wb"))
            args = launch.server_args(name, **budgets)
            stack.enter_context(http_server(args, {}, port=port, stderr=errlog))
            urls[name] = f"http://127.0.0.1:{port}/mcp"
        yield urls


# --- the cases ------------------------------------------------------------------------------


WRITE = {"path": "scratch/approved.txt", "content": "approved text\n"}
SLOW_MKDIR = {"path": "scratch/slow"}


def stateless_cases() -> list[Case]:
    """Refusals that depend on nothing but the call: any order, any process."""
    return [
        Case(OK, "nexus_read_file", {"path": "todo.txt"}),
        Case("INVALID_PATH", "nexus_read_file", {"path": "../etc/passwd"}),
        Case("INVALID_PATH", "nexus_read_file", {"path": "escape-link/secret.txt"}),
        Case("INVALID_INPUT", "nexus_read_file", {"path": 5}, message=SHOULD_BE_TEXT),
        Case("INVALID_INPUT", "nexus_read_file", {"path": "todo.txt", "extra": True},
             message=UNEXPECTED),
        Case("INVALID_INPUT", "nexus_read_file", {}, message="missing argument 'path'"),
        Case("INVALID_INPUT", "nexus_read_file", {"pth": "todo.txt"},
             message=f"{UNEXPECTED}; did you mean 'path'?"),
        Case("INVALID_INPUT", "nexus_read_file", {"path": "todo.txt", HOSTILE_NAME: 1},
             message=UNEXPECTED),
        Case("NOT_FOUND", "nexus_read_file", {"path": "missing.txt"}),
        Case("CONFLICT", "nexus_read_file", {"path": "notes"}),
        Case("DOC_SIZE_EXCEEDED", "nexus_read_file", {"path": "big.txt"}),
        Case(
            "DOC_HASH_MISMATCH",
            "nexus_read_file",
            {"path": "todo.txt"},
            {META_HASHES: [{"pointer": "/content", "hash": ZERO_HASH}]},
        ),
        Case("TOOL_CLASS_DECLARATION_MISMATCH", "nexus_read_file", {"path": "todo.txt"}, {
            META_CLASS: "write"
        }),
        Case("TOOL_TIMEOUT", "nexus_glob", {"pattern": "**/*"}),
        Case("UPSTREAM_ERROR", "get_section_source", {"path": "../outside.md"}),
        Case("UPSTREAM_ERROR", "get_note_outline", {"path": "notes/absent.md"}),
        Case("IDEMPOTENCY_KEY_REQUIRED", "nexus_write_file", dict(WRITE)),
        Case(
            "WRITE_POLICY_DENIED",
            "nexus_write_file",
            {"path": "todo.txt", "content": "x", "idempotency_key": "k-policy"},
            message=f"{DENIED} (rule path_not_allowed): no allowed_paths entry matches this path",
        ),
        Case(
            "WRITE_POLICY_DENIED",
            "nexus_delete_file",
            {"path": "scratch/README.txt", "idempotency_key": "k-delete"},
            message=f"{DENIED} (rule operation_not_allowed): the operation 'delete' is not in "
            "allowed_operations",
        ),
    ]  # fmt: skip


def unknown_tool_cases() -> list[Case]:
    return [Case(UNKNOWN, HIDDEN_TOOL, {}), Case(UNKNOWN, "no_such_tool", {})]


def approval_cases(mint: Minter) -> list[Case]:
    """One approved write and what surrounds it: in this order, in one workspace."""
    keyed = {**WRITE, "idempotency_key": "k-1"}
    token = mint("nexus_write_file", WRITE)
    expired = mint("nexus_write_file", WRITE, now=time.time() - 3600)
    slow = {**SLOW_MKDIR, "idempotency_key": "k-slow"}
    slow_token = mint("nexus_mkdir", SLOW_MKDIR)
    nowhere = {"path": "scratch/missing/x.txt", "content": "x\n"}
    nowhere_token = mint("nexus_write_file", nowhere)
    return [
        Case("APPROVAL_REQUIRED", "nexus_write_file", keyed),
        Case("APPROVAL_INVALID", "nexus_write_file", {**keyed, "approval_token": "not-a-token"}),
        Case("APPROVAL_EXPIRED", "nexus_write_file", {**keyed, "approval_token": expired}),
        Case(OK, "nexus_write_file", {**keyed, "approval_token": token}),
        Case(REPLAYED, "nexus_write_file", {**keyed, "approval_token": token}),
        Case("IDEMPOTENCY_KEY_CONFLICT", "nexus_write_file", {**keyed, "content": "other\n"}),
        Case("APPROVAL_REPLAYED", "nexus_write_file", {
            **WRITE, "idempotency_key": "k-2", "approval_token": token
        }),
        # The write starts and times out: its outcome is unknown, so its key is refused.
        Case("TOOL_TIMEOUT", "nexus_mkdir", {**slow, "approval_token": slow_token}),
        Case("IDEMPOTENCY_KEY_CONFLICT", "nexus_mkdir", {**slow, "approval_token": slow_token}),
        # Approved, but its folder is missing: the refusal says how to create it.
        Case("NOT_FOUND", "nexus_write_file", {
            **nowhere, "idempotency_key": "k-nowhere", "approval_token": nowhere_token
        }, message=MKDIR_FIRST),
    ]  # fmt: skip


READ = Case(OK, "nexus_read_file", {"path": "todo.txt"})


def limit_cases(code: str, allowed: int) -> list[Case]:
    return [READ] * allowed + [Case(code, READ.tool, READ.arguments)]


# --- what a client must have received -------------------------------------------------------


def envelope_of(result: Mapping[str, Any]) -> dict[str, str]:
    """The envelope: isError, text content only, exactly ``{"error", "code"}``."""
    assert result.get("isError") is True, result
    assert "structuredContent" not in result, result
    payload: dict[str, str] = json.loads(result["content"][0]["text"])
    assert list(payload) == ["error", "code"], payload
    return payload


def check_result(case: Case, result: Mapping[str, Any], tools: Mapping[str, Any]) -> None:
    where = f"{case.expect} from {case.tool}"
    if case.expect == UNKNOWN:
        assert result.get("isError") is True, where
        assert "structuredContent" not in result, where
        assert result["content"] == [{"type": "text", "text": f"Unknown tool: '{case.tool}'"}]
        return
    if case.expect not in (OK, REPLAYED):
        payload = envelope_of(result)
        assert payload["code"] == case.expect, (where, result)
        if case.message is not None:  # the plain message arrives intact, byte for byte
            assert payload["error"] == case.message, (where, result)
        assert "CANARY-ARG" not in json.dumps(result) and "<script>" not in payload["error"]
        return
    assert not result.get("isError"), (where, result)
    structured = result["structuredContent"]
    assert json.loads(result["content"][0]["text"]) == structured, where
    if case.tool in tools:
        Draft202012Validator(tools[case.tool]["outputSchema"]).validate(structured)
    replayed = (result.get("_meta") or {}).get(META_REPLAYED) is True
    assert replayed == (case.expect == REPLAYED), (where, result)


def check_session(run: SessionRun, cases: Sequence[Case]) -> None:
    """The TypeScript SDK returned a result for every call: none threw."""
    assert len(run.calls) == len(cases)
    pairs = zip(cases, run.calls, strict=True)
    threw = [(c.expect, c.tool, r["threw"]) for c, r in pairs if "threw" in r]
    assert threw == [], threw
    # Not vacuous: the tools refused here declare an output schema the SDK validates with.
    assert all("outputSchema" in run.tools[c.tool] for c in cases if c.tool in run.tools)
    assert "outputSchema" in run.tools["nexus_read_file"]
    assert HIDDEN_TOOL not in run.tools
    for case, call in zip(cases, run.calls, strict=True):
        check_result(case, call["result"], run.tools)


def check_inspector(case: Case, run: InspectorRun) -> None:
    where = (case.expect, case.tool, run.returncode, run.stderr[-1500:])
    if case.expect == UNKNOWN:
        # It looks the tool up in its own listing and never sends the call.
        assert (run.returncode, run.error_code) == (
            INSPECTOR_EXIT_TOOL_ERROR,
            INSPECTOR_TOOL_NOT_FOUND,
        ), where
        assert run.result is None, where
        return
    assert run.result is not None, where
    if case.expect in (OK, REPLAYED):
        assert run.returncode == 0, where
    else:
        # A result with isError: printed, and the CLI's documented exit status for it.
        assert (run.returncode, run.error_code) == (
            INSPECTOR_EXIT_TOOL_ERROR,
            INSPECTOR_TOOL_IS_ERROR,
        ), where
    check_result(case, run.result, {})


def assert_only_the_approved_write_landed(workspace: Path, before: dict[str, bytes]) -> None:
    """Every refusal left the workspace's files as they were; the approved write landed.

    (The timed-out mkdir may or may not have made its folder before the timeout: its
    outcome is unknown by design, which is why its retry is refused.)"""
    assert snapshot(workspace) == {**before, WRITE["path"]: WRITE["content"].encode()}


def ts_session(url: str, cases: Sequence[Case]) -> dict[str, Any]:
    return {"transport": "http", "url": url, "calls": [c.call() for c in cases]}


# --- the TypeScript SDK -------------------------------------------------------------------


def test_the_typescript_sdk_returns_every_refusal_as_a_result_over_http(
    node_clients: NodeClients, launch: Launch, mint: Minter, tmp_path: Path
) -> None:
    before = snapshot(launch.workspace)
    main = stateless_cases() + unknown_tool_cases() + approval_cases(mint)
    first = limit_cases("BUDGET_EXCEEDED", 2)
    second = [Case("RATE_LIMITED", READ.tool, READ.arguments)]
    with http_servers(launch, main={}, limits=BUDGET_THEN_RATE) as urls:
        [runs] = run_ts_plans(
            node_clients,
            [
                [
                    ts_session(urls["main"], main),
                    ts_session(urls["limits"], first),
                    ts_session(urls["limits"], second),
                ]
            ],
            work=tmp_path,
        )
    for run, cases in zip(runs, [main, first, second], strict=True):
        check_session(run, cases)
    assert_only_the_approved_write_landed(launch.workspace, before)


def test_the_typescript_sdk_returns_every_refusal_as_a_result_over_stdio(
    node_clients: NodeClients, launch: Launch, mint: Minter, tmp_path: Path
) -> None:
    before = snapshot(launch.workspace)
    main = stateless_cases() + unknown_tool_cases() + approval_cases(mint)
    budget = limit_cases("BUDGET_EXCEEDED", 1)
    rate = limit_cases("RATE_LIMITED", 1)
    # Each session spawns its own server (one stdio session per process): three plans,
    # three node processes, run side by side.
    runs = run_ts_plans(
        node_clients,
        [
            [launch.stdio_session("main", [c.call() for c in main])],
            [launch.stdio_session("budget", [c.call() for c in budget], **BUDGET_ONLY)],
            [launch.stdio_session("rate", [c.call() for c in rate], **RATE_ONLY)],
        ],
        work=tmp_path,
    )
    for [run], cases in zip(runs, [main, budget, rate], strict=True):
        check_session(run, cases)
    assert_only_the_approved_write_landed(launch.workspace, before)


# --- the MCP Inspector CLI ------------------------------------------------------------------


def inspector_run(
    clients: NodeClients, case: Case, target: InspectorTarget, home: Path
) -> InspectorRun:
    arguments = None if case.tool_args else case.arguments
    command = inspector_command(
        clients, target, case.tool, arguments, meta=case.meta, tool_args=case.tool_args
    )
    return run_inspector(command, home=home)


# The form a user types (--tool-arg key=value), for a success and the refusal.
TYPED = [
    Case(OK, "nexus_read_file", {}, tool_args=("path=todo.txt",)),
    Case("INVALID_PATH", "nexus_read_file", {}, tool_args=("path=../etc/passwd",)),
]


Chain = list[tuple[Case, InspectorTarget]]


def run_inspector_chains(clients: NodeClients, chains: Sequence[Chain], home: Path) -> None:
    """Each chain's calls one after the other; the chains side by side."""

    def run(chain: Chain) -> list[InspectorRun]:
        return [inspector_run(clients, case, target, home) for case, target in chain]

    with ThreadPoolExecutor(max_workers=INSPECTOR_WORKERS) as pool:
        results = list(pool.map(run, chains))
    for chain, runs in zip(chains, results, strict=True):
        for (case, _), result in zip(chain, runs, strict=True):
            check_inspector(case, result)


def one_per_code(cases: Sequence[Case], skip: Sequence[Case] = ()) -> list[Case]:
    """The first case of each expected outcome not already in ``skip``: the Inspector costs
    a process per call, and the TypeScript SDK runs the variants."""
    seen = {c.expect for c in skip}
    out = []
    for case in cases:
        if case.expect not in seen:
            seen.add(case.expect)
            out.append(case)
    return out


def test_the_inspector_cli_prints_every_refusal_as_a_result_over_http(
    node_clients: NodeClients, launch: Launch, mint: Minter, tmp_path: Path
) -> None:
    before = snapshot(launch.workspace)
    with http_servers(launch, main={}, rate=RATE_ONLY) as urls:
        main = InspectorTarget.http(urls["main"])
        rate = InspectorTarget.http(urls["rate"])
        singles = [*TYPED, *one_per_code(stateless_cases(), TYPED), *unknown_tool_cases()]
        # The approval codes around one approved write (the TypeScript SDK runs the rest).
        approvals = [c for c in approval_cases(mint) if c.tool == "nexus_write_file"]
        chains = [
            [(case, main) for case in approvals if case.expect != REPLAYED],
            # Each Inspector call is an MCP session of its own: the per-subject rate counts.
            [(case, rate) for case in limit_cases("RATE_LIMITED", 1)],
            *([(case, main)] for case in singles),
        ]
        run_inspector_chains(node_clients, chains, tmp_path)
    assert_only_the_approved_write_landed(launch.workspace, before)


def test_the_inspector_cli_prints_refusals_as_results_over_stdio(
    node_clients: NodeClients, launch: Launch, tmp_path: Path
) -> None:
    # Every call starts a server of its own (own data dir), so a sample: the two
    # calls and a write tool's refusal.
    sample = [*TYPED, *[c for c in stateless_cases() if c.expect == "WRITE_POLICY_DENIED"]]
    chains = []
    for number, case in enumerate(sample):
        serve = serve_command("--transport", "stdio", *launch.server_args(f"stdio-{number}"))
        chains.append([(case, InspectorTarget.stdio(serve, SERVER_ENV))])
    run_inspector_chains(node_clients, chains, tmp_path)
