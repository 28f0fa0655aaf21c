"""Hostile arguments for every tool, generated from its input schema: never INTERNAL_ERROR.

Every tool the server lists gets arguments drawn from its own ``inputSchema`` (and a
request ``_meta`` with nexus-mcp's keys) with each value swapped, at random, for
something a careless or hostile client sends: huge and negative integers, floats where
integers belong, wrong types, deeply nested lists,
strings with NUL bytes, lone surrogates, 100k characters, path segments and whole paths
longer than the file system allows, Unicode normalization variants, catastrophic regular
expressions and globs made of ``**``. Each call goes through the in-memory client to a
server with a real workspace in ``tmp_path`` and a write policy that allows ``scratch/``
only. Whatever it sends, the answer is a result or a typed refusal (never
``INTERNAL_ERROR``, never ``TOOL_TIMEOUT``, never a JSON-RPC ``-32603``), and nothing
outside ``scratch/`` changes.

Non-finite numbers cannot cross the in-memory transport (its client writes them as
``null``); ``test_protocol_edges.py`` sends them over a real stdio pipe and HTTP socket.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import unicodedata
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from fastmcp import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.shared.exceptions import MCPError

from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings

from .conftest import DEMO_WORKSPACE, snapshot

# Bounded so the whole module runs in well under half a minute on two cores.
EXAMPLES_PER_TOOL = 30
TOOL_TIMEOUT_SECONDS = 10.0
SEARCH_SECONDS = 0.5
DEEP_FOLDERS = 30
# Deeper than this, the in-memory client itself refuses to serialize the request.
MAX_NESTING = 60
ALLOWED_WRITE_AREA = "scratch"
INTERNAL_JSONRPC_CODE = -32603
CALL_DEADLINE_SECONDS = 60.0
T = TypeVar("T")

# A line on which a backtracking regex engine takes exponential time for the patterns below.
BAIT_LINE = "a" * 48 + "!"
CATASTROPHIC_REGEXES = ["(a+)+$", "(a|a)*$", "(a*)*b", "(.*a){24}", "(?:a+a+)+$", "\\d*" * 12 + "x"]
CATASTROPHIC_GLOBS = ["**/" * 30 + "x", "*a" * 40 + "x", "**" * 100, "**/*a*a*a*a*a*a*a*a*b"]
NFC = unicodedata.normalize("NFC", "caf\u00e9.md")
NFD = unicodedata.normalize("NFD", "caf\u00e9.md")
HOSTILE_STRINGS = [
    "",
    " ",
    ".",
    "..",
    "../ws-evil/secret.txt",
    "escape-link/secret.txt",
    "/etc/passwd",
    "C:\\Windows",
    "\\\\server\\share",
    "a\x00b",
    "\x00",
    "scratch/\x00",
    "\ud800",
    "notes/\udcff.md",
    "scratch/a\udfffb",
    "x" * 300,
    "scratch/" + "x" * 300,
    "scratch/" + "/".join(["abcdefghi"] * 400),
    "/".join(["y" * 255] * 20),
    "z" * 100_000,
    NFC,
    NFD,
    "scratch/" + NFD,
    "notes\u2215inbox",
    "notes/../../etc",
    "%2e%2e/%2e%2e",
    "~/.ssh/id_rsa",
    "$HOME",
    ".git/config",
    ".GIT./config",
    "scratch/.git/hooks/pre-commit",
    "todo.txt",
    "notes/inbox/reading-list.md",
    "notes/bait.md",
    "scratch",
    "scratch/new.txt",
    "[",
    "]",
    "*",
    "**",
    "?",
    "[!",
    "\\",
    "(",
    ")" * 600,
    "\n",
    "\u202e",
    "\U0001f600" * 50,
    *CATASTROPHIC_REGEXES,
    *CATASTROPHIC_GLOBS,
]
HOSTILE_NUMBERS = [
    0,
    -1,
    -(2**63),
    2**63,
    2**64 + 1,
    10**400,
    10**5000,
    -(10**5000),
    0.5,
    -0.0,
    1e308,
    True,
]


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def hostile_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.sampled_from(HOSTILE_STRINGS),
        st.sampled_from(HOSTILE_NUMBERS),
        st.none(),
        st.booleans(),
        st.text(max_size=40),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
    )
    containers = st.one_of(
        st.integers(min_value=1, max_value=MAX_NESTING).map(nested),
        st.lists(scalars, max_size=5),
        st.dictionaries(st.text(max_size=8), scalars, max_size=4),
    )
    return st.one_of(scalars, containers)


def valid_value(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A plausible value for one property of a tool's input schema."""
    options = schema.get("anyOf")
    if options:
        return st.one_of([valid_value(option) for option in options])
    kind = schema.get("type")
    if kind == "string":
        return st.one_of(st.sampled_from(HOSTILE_STRINGS), st.text(max_size=30))
    if kind == "integer":
        low, high = schema.get("minimum"), schema.get("maximum")
        return st.integers(min_value=low, max_value=high)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(valid_value(schema.get("items", {})), max_size=6)
    if kind == "null":
        return st.none()
    return hostile_values()


@st.composite
def arguments_for(draw: st.DrawFn, schema: dict[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    arguments: dict[str, Any] = {}
    for name, prop in properties.items():
        if name not in required and draw(st.booleans()):
            continue  # optional and left out
        if draw(st.integers(0, 3)) == 0:
            arguments[name] = draw(hostile_values())
        else:
            arguments[name] = draw(valid_value(prop))
    if draw(st.integers(0, 7)) == 0:
        arguments[draw(st.sampled_from(HOSTILE_STRINGS))] = draw(hostile_values())
    return arguments


# The request ``_meta`` keys nexus-mcp reads (DESIGN.md, "Tool calls on the wire"), and one
# it does not.
META_KEYS = [
    "nexus.mcp/idempotency_key",
    "nexus.mcp/approval_token",
    "nexus.mcp/expected_document_hashes",
    "nexus.mcp/tool_class",
    "nexus.mcp/correlation_id",
    "vendor.example/anything",
]


def metas() -> st.SearchStrategy[dict[str, Any] | None]:
    hashes = st.lists(
        st.fixed_dictionaries({"pointer": hostile_values(), "hash": hostile_values()}),
        max_size=2,
    )
    values = st.one_of(hostile_values(), hashes)
    return st.one_of(st.none(), st.dictionaries(st.sampled_from(META_KEYS), values, max_size=3))


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NexusServer, Path]]:
    base = tmp_path_factory.mktemp("hostile")
    workspace = base / "ws"
    shutil.copytree(DEMO_WORKSPACE, workspace)
    (workspace / "notes" / "bait.md").write_text(f"# Bait\n{BAIT_LINE}\n", encoding="utf-8")
    # A deep path of long names: what a backtracking glob or regex blows up on.
    deep = workspace / "notes" / "deep" / Path(*["a"] * DEEP_FOLDERS)
    deep.mkdir(parents=True)
    (deep / ("a" * 60 + ".md")).write_text(BAIT_LINE, encoding="utf-8")
    outside = base / "ws-evil"
    outside.mkdir()
    (outside / "secret.txt").write_text("CANARY-OUTSIDE-SECRET")
    (workspace / "escape-link").symlink_to(outside)
    config = base / "nexus.yaml"
    policy = {
        "workspace": {
            "allowed_paths": [f"{ALLOWED_WRITE_AREA}/**"],
            "allowed_operations": ["write", "edit", "delete", "mkdir", "rmdir", "rename"],
            "require_approval": False,
        }
    }
    config.write_text(yaml.safe_dump({"write_policies": policy}), encoding="utf-8")
    settings_ = Settings(
        mode="prod",
        subject="fuzzer",
        role="admin",
        workspace=workspace,
        data_dir=base / "data",
        budgets={
            "tool_timeout_seconds": TOOL_TIMEOUT_SECONDS,
            "max_calls_per_session": 10**6,
            "rate_limit_calls": 10**6,
        },
        search={"max_seconds": SEARCH_SECONDS},
    )
    server = build_server(settings_, config_file=config, audit_sinks=[MemoryAuditSink()])
    try:
        yield server, base
    finally:
        server.close()


def protected(base: Path) -> dict[str, bytes]:
    """Everything the write policy does not allow a write to touch."""
    files = snapshot(base / "ws")
    kept = {k: v for k, v in files.items() if not k.startswith(f"{ALLOWED_WRITE_AREA}/")}
    outside = snapshot(base / "ws-evil")
    return {**kept, **{f"../ws-evil/{k}": v for k, v in outside.items()}}


def refusal_code(result: Any) -> str | None:
    if not result.is_error:
        return None
    text = result.content[0].text
    if text.startswith("Unknown tool"):
        return "UNKNOWN_TOOL"
    return str(json.loads(text)["code"])


def tool_names() -> list[str]:
    server = build_server(Settings(mode="dev", workspace=DEMO_WORKSPACE), audit_sinks=[])
    try:
        return sorted(server.runtime.book.contracts)
    finally:
        server.close()


TOOLS = tool_names()


class Session:
    """One client session for the whole module, on an event loop of its own thread, so
    hypothesis (synchronous) calls through it without reconnecting every example."""

    def __init__(self, server: NexusServer) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = Client(server.mcp)
        self._run(self._client.__aenter__())
        listed = self._run(self._client.list_tools())
        self.schemas = {tool.name: dict(tool.input_schema) for tool in listed}

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(CALL_DEADLINE_SECONDS)

    def call(self, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None) -> Any:
        return self._run(self._client.call_tool_mcp(tool, arguments, meta=meta))

    def close(self) -> None:
        self._run(self._client.__aexit__(None, None, None))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_DEADLINE_SECONDS)
        self._loop.close()


@pytest.fixture(scope="module")
def session(hostile_server: tuple[NexusServer, Path]) -> Iterator[Session]:
    opened = Session(hostile_server[0])
    try:
        yield opened
    finally:
        opened.close()


@pytest.mark.parametrize("tool", TOOLS)
def test_hostile_arguments_never_reach_an_internal_error(
    hostile_server: tuple[NexusServer, Path], session: Session, tool: str
) -> None:
    _, base = hostile_server
    before = protected(base)
    assert tool in session.schemas  # every tool is listed for this caller

    @settings(
        max_examples=EXAMPLES_PER_TOOL,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(arguments=arguments_for(session.schemas[tool]), meta=metas())
    def check(arguments: dict[str, Any], meta: dict[str, Any] | None) -> None:
        try:
            result = session.call(tool, arguments, meta)
        except MCPError as exc:
            assert exc.error.code != INTERNAL_JSONRPC_CODE, tool
            raise
        # A timeout would mean an input made a tool work past every cap of its own.
        assert refusal_code(result) not in ("INTERNAL_ERROR", "TOOL_TIMEOUT"), tool
        assert protected(base) == before, tool

    check()


# -- the classes the fuzzing found, one by one -------------------------------------------------

LONG_NAME = "x" * 300
SURROGATE_NAMES = ["a\ud800b", "\udfff", "notes/\udcff.md"]
FILE_PATH_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("nexus_read_file", {}),
    ("nexus_list_files", {}),
    ("nexus_file_info", {}),
    ("nexus_glob", {"pattern": "*"}),
    ("nexus_grep", {"pattern": "x"}),
    ("nexus_write_file", {"content": "x", "idempotency_key": "k-write"}),
    ("nexus_edit_file", {"old_text": "a", "new_text": "b", "idempotency_key": "k-edit"}),
    ("nexus_delete_file", {"idempotency_key": "k-delete"}),
    ("nexus_mkdir", {"parents": True, "idempotency_key": "k-mkdir"}),
    ("nexus_rmdir", {"recursive": True, "idempotency_key": "k-rmdir"}),
]
NOTE_TOOLS = ["get_note_outline", "get_document_tree", "get_metadata_facets", "get_section_source"]


def unnameable_paths(workspace: Path) -> list[str]:
    """Names no file of this workspace can have: too long, past PATH_MAX, not Unicode."""
    room = 4096 - len(str(workspace.resolve())) - 1
    past_path_max = "scratch/" + "/".join(["abcdefgh"] * (room // 9 + 1))
    return [
        LONG_NAME,
        f"scratch/{LONG_NAME}",
        f"scratch/{LONG_NAME}/below",
        past_path_max,
        *SURROGATE_NAMES,
        f"scratch/{SURROGATE_NAMES[0]}",
    ]


def envelope_code(result: Any) -> tuple[str, str]:
    assert result.is_error is True
    payload = json.loads(result.content[0].text)
    return payload["code"], payload["error"]


async def test_every_file_tool_answers_a_name_no_file_can_have_as_invalid_path(
    make_server: Any, workspace: Path, audit: MemoryAuditSink
) -> None:
    before = snapshot(workspace)
    paths = unnameable_paths(workspace)
    async with Client(make_server().mcp) as client:
        for path in paths:
            for tool, extra in FILE_PATH_CALLS:
                result = await client.call_tool_mcp(tool, {"path": path, **extra})
                assert envelope_code(result) == ("INVALID_PATH", "path is not allowed"), tool
            for ends in ({"source": path, "destination": "scratch/z"},
                         {"source": "scratch/README.txt", "destination": path}):  # fmt: skip
                result = await client.call_tool_mcp(
                    "nexus_rename_file", {**ends, "idempotency_key": "k-rename"}
                )
                assert envelope_code(result)[0] == "INVALID_PATH"
            for tool in NOTE_TOOLS:  # the Knowtation notes envelope (specs/SECTION_SOURCE.md)
                result = await client.call_tool_mcp(tool, {"path": path})
                assert envelope_code(result) == ("UPSTREAM_ERROR", "Invalid path"), tool
    assert snapshot(workspace) == before
    outcomes = {r["outcome"] for r in audit.records() if r["event"] != "tool_call_started"}
    assert outcomes == {"INVALID_PATH", "UPSTREAM_ERROR"}
    assert "\\ud800" not in json.dumps(audit.records()) and LONG_NAME not in str(audit.records())


async def test_huge_integers_are_invalid_input_naming_only_a_declared_argument(
    make_server: Any, audit: MemoryAuditSink
) -> None:
    huge = 10**5000
    named = "invalid input for field '{}'".format
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("nexus_read_file", {"path": huge}, named("path")),
        ("nexus_list_files", {"path": ".", "recursive": [huge]}, named("recursive")),
        (
            "nexus_read_file",
            {"path": "todo.txt", "CANARY-ARG": {"x": [huge]}},
            "unexpected argument; accepted: path",
        ),
        ("nexus_discovery_search_tools", {"query": "read", "top_k": -huge}, named("top_k")),
        ("no_such_tool", {"x": huge}, "Unknown tool"),
    ]
    async with Client(make_server().mcp) as client:
        for tool, arguments, message in cases:
            result = await client.call_tool_mcp(tool, arguments)
            text = result.content[0].text
            assert result.is_error is True
            if message == "Unknown tool":
                assert text == f"Unknown tool: '{tool}'"
                continue
            assert json.loads(text) == {"error": message, "code": "INVALID_INPUT"}
    records = [r for r in audit.records() if r["event"] != "tool_call_started"]
    assert len(records) == len(cases)  # every refusal audited, each with a digest
    assert all(len(r["args_digest"]) == 64 for r in records)
    assert "CANARY-ARG" not in json.dumps(records)


async def test_a_catastrophic_regex_is_cut_by_the_search_time_cap(
    make_server: Any, workspace: Path
) -> None:
    (workspace / "notes" / "bait.md").write_text("a" * 40 + "!\nplain line\n")
    server = make_server(search={"max_seconds": SEARCH_SECONDS})
    async with Client(server.mcp) as client:
        slow = await client.call_tool_mcp("nexus_grep", {"pattern": "(a+)+$", "regex": True})
        fine = await client.call_tool_mcp("nexus_grep", {"pattern": "^plain", "regex": True})
    assert slow.is_error is False and fine.is_error is False
    assert slow.structured_content["truncated"] is True
    assert slow.structured_content["caps_hit"] == ["max_seconds"]
    assert [f["path"] for f in fine.structured_content["files"]] == ["notes/bait.md"]


async def test_a_catastrophic_glob_answers_and_a_bad_one_names_its_argument(
    make_server: Any, workspace: Path
) -> None:
    deep = workspace / "notes" / Path(*["a"] * DEEP_FOLDERS)
    deep.mkdir(parents=True)
    (deep / ("a" * 60 + ".md")).write_text("a\n")
    async with Client(make_server().mcp) as client:
        globbed = await client.call_tool_mcp(
            "nexus_glob", {"pattern": "**/" * 40 + "*a" * 30 + "b"}
        )
        found = await client.call_tool_mcp(
            "nexus_glob", {"pattern": "**/" * 40 + "*a" * 30 + ".md"}
        )
        bad = await client.call_tool_mcp("nexus_grep", {"pattern": "a", "glob": "x" * 5000})
    assert globbed.structured_content["matches"] == []
    assert len(found.structured_content["matches"]) == 1
    assert envelope_code(bad) == ("INVALID_INPUT", "invalid input for field 'glob'")
