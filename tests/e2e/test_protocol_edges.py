"""Malformed JSON-RPC and numbers JSON does not have, sent as raw bytes on a real pipe and
socket, next to a bare FastMCP server getting the same bytes.

The in-memory transport cannot send these: its client validates requests before they
leave and writes ``NaN`` as ``null``. Here each request is a hand-written JSON-RPC line on
the stdin of a real ``nexus-mcp serve --transport stdio`` (and of a bare FastMCP script),
or the body of a real HTTP POST, in both protocol eras: the handshake era (``initialize``,
then ``Mcp-Session-Id``) and the 2026-07-28 era (every request carries its envelope in
``_meta`` and its method in headers). A protocol violation gets FastMCP's own ``-32602``
with no trace of the value sent, and no ERROR log line; ``NaN``, ``Infinity``, ``1e999`` and
integers past Python's digit limit in arguments are ``INVALID_INPUT``, audited.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from fastmcp import FastMCP

from tests.support.loopback import serve_in_thread

from .servers import free_port, http_server, serve_command, server_env

pytestmark = pytest.mark.slow

CANARY = "CANARY-PARAM-7f3e"
ANSWER_DEADLINE_SECONDS = 20.0
INVALID_PARAMS = -32602
INVALID_PARAMS_MESSAGE = "Invalid request parameters"
PARSE_ERROR = -32700
LEGACY = "2025-11-25"
MODERN = "2026-07-28"
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}
HTTP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": LEGACY,
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}

# A bare FastMCP server with a tool of the same name and signature as ours.
BARE_SERVER = """
from fastmcp import FastMCP
mcp = FastMCP("bare")
@mcp.tool
def nexus_read_file(path: str) -> str:
    return path
mcp.run(show_banner=False)
"""


def bare_app() -> FastMCP[Any]:
    mcp: FastMCP[Any] = FastMCP("bare")

    @mcp.tool
    def nexus_read_file(path: str) -> str:
        return path

    return mcp


def malformed(meta: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Requests whose params break the protocol's schema; ``meta`` is the era's envelope."""
    envelope = {"_meta": meta} if meta else {}
    read = {"name": "nexus_read_file"}
    return [
        ("arguments is a string", {"method": "tools/call",
            "params": {**read, "arguments": CANARY, **envelope}}),
        ("arguments is a list", {"method": "tools/call",
            "params": {**read, "arguments": [CANARY], **envelope}}),
        ("name is missing", {"method": "tools/call",
            "params": {"arguments": {"path": CANARY}, **envelope}}),
        ("cursor is a number", {"method": "tools/list", "params": {"cursor": 31337, **envelope}}),
    ]  # fmt: skip


def legacy_only() -> list[tuple[str, dict[str, Any]]]:
    """Malformed in ways the 2026-07-28 era refuses before dispatch, with its own message."""
    read = {"name": "nexus_read_file", "arguments": {"path": CANARY}}
    return [
        ("params is null", {"method": "tools/call", "params": None}),
        (
            "name is a number",
            {"method": "tools/call", "params": {"name": 31337, "arguments": {"path": CANARY}}},
        ),
        ("_meta is a string", {"method": "tools/call", "params": {**read, "_meta": CANARY}}),
        ("_meta is a list", {"method": "tools/call", "params": {**read, "_meta": [CANARY]}}),
    ]


# Numbers Python's JSON reader accepts and JSON does not have; raw JSON text.
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]
# An integer past Python's digit limit (4,300): the SDK's readers cannot parse it (stdio
# drops the line, HTTP answers a parse error, as for bare FastMCP), so only the in-memory
# transport brings one to the chain (test_hostile_arguments.py).
HUGE_INTEGER = "9" * 5000
NUMBER_CASES = [
    ('{"path": %s}', "invalid input for field 'path'"),
    ('{"path": [%s]}', "invalid input for field 'path'"),
    ('{"path": {"deep": [[{"x": %s}]]}}', "invalid input for field 'path'"),
    ('{"path": "todo.txt", "extra": %s}', "unexpected argument; accepted: path"),
]


# -- stdio ---------------------------------------------------------------------------------


class RawStdio:
    """JSON-RPC lines on a subprocess's stdin and stdout, every read bounded."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.next_id = 100

    def send(self, request: dict[str, Any] | str) -> None:
        line = request if isinstance(request, str) else json.dumps(request)
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode("utf-8") + b"\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], ANSWER_DEADLINE_SECONDS)
        assert ready, "no answer within the deadline"
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def request(self, body: dict[str, Any] | str) -> dict[str, Any]:
        if isinstance(body, dict):
            self.next_id += 1
            body = {"jsonrpc": "2.0", "id": self.next_id, **body}
        self.send(body)
        return self.receive()


@contextmanager
def stdio_process(args: list[str], stderr: IO[bytes], env: dict[str, str]) -> Iterator[RawStdio]:
    proc = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=server_env(env)
    )
    try:
        yield RawStdio(proc)
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def nexus_stdio_args(workspace: Path, data: Path) -> list[str]:
    return serve_command(
        "--transport", "stdio", "--workspace", str(workspace), "--data-dir", str(data)
    )


PRINCIPAL_ENV = {"NEXUS_MCP_MODE": "prod", "NEXUS_MCP_SUBJECT": "alice", "NEXUS_MCP_ROLE": "editor"}


def handshake(channel: RawStdio) -> None:
    channel.send(INITIALIZE)
    assert channel.receive()["result"]["protocolVersion"] == LEGACY
    channel.send(INITIALIZED)


def log_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON log records of a server's stderr (the HTTP banner around them is text)."""
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith('{"') and line.endswith("}")]


def assert_quiet_and_clean(stderr_path: Path) -> list[dict[str, Any]]:
    text = stderr_path.read_text()
    assert CANARY not in text
    records = log_lines(stderr_path)
    assert [r for r in records if r.get("level") in ("error", "critical")] == []
    return records


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_malformed_params_over_stdio_get_fastmcps_invalid_params_without_the_value(
    workspace: Path, tmp_path: Path, era: str
) -> None:
    bare_script = tmp_path / "bare.py"
    bare_script.write_text(BARE_SERVER)
    errlog = tmp_path / "nexus.stderr"
    with (
        errlog.open("wb") as err,
        (tmp_path / "bare.stderr").open("wb") as bare_err,
        stdio_process(nexus_stdio_args(workspace, tmp_path / "data"), err, PRINCIPAL_ENV) as ours,
        stdio_process([sys.executable, str(bare_script)], bare_err, {}) as bare,
    ):
        cases = malformed(MODERN_META)
        if era == LEGACY:
            # An initialize whose protocolVersion is a number opens the session's story.
            params = {**INITIALIZE["params"], "protocolVersion": 20251125}
            cases = [("protocolVersion is a number", {"method": "initialize", "params": params})]
            answers = [channel.request(cases[0][1]) for channel in (ours, bare)]
            assert answers[0] == answers[1]
            assert answers[0]["error"]["code"] == INVALID_PARAMS
            for channel in (ours, bare):
                handshake(channel)
            cases = [*cases, *malformed({}), *legacy_only()]
        for label, body in cases[1:] if era == LEGACY else cases:
            theirs = bare.request(body)
            answer = ours.request(body)
            assert answer == theirs, label
            assert answer["error"]["code"] == INVALID_PARAMS, label
            assert CANARY not in json.dumps(answer), label
        # Not a JSON-RPC request at all (or a number Python cannot read): both drop the
        # line without an answer, so the next answer on the pipe is the probe's.
        huge = with_id(next(number_requests({}, numbers=[HUGE_INTEGER]))[0], 8)
        dropped = [f'{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":["{CANARY}"]}}',
                   CANARY + "{", huge]  # fmt: skip
        for channel in (ours, bare):
            for line in dropped:
                channel.send(line)
            # (The 2026-07-28 era has no ping: a listing answers as well.)
            probe = {"method": "tools/list", "params": {"_meta": MODERN_META}}
            answer = channel.request(probe if era == MODERN else {"method": "ping"})
            assert answer["id"] == channel.next_id and "error" not in answer
    records = assert_quiet_and_clean(errlog)
    warned = [r for r in records if r.get("event") == "request_invalid_params"]
    assert len(warned) == len(cases)
    assert {r["level"] for r in warned} == {"warning"}


def number_requests(
    meta: dict[str, Any], numbers: list[str] = NON_FINITE
) -> Iterator[tuple[str, str | None]]:
    """Raw ``tools/call`` bodies (no id) with a number JSON lacks, and the message due."""
    envelope = ', "_meta": ' + json.dumps(meta) if meta else ""
    for template, message in NUMBER_CASES:
        for number in numbers:
            arguments = template % number
            yield (
                '{"jsonrpc": "2.0", "method": "tools/call", "params": {"name": '
                f'"nexus_read_file", "arguments": {arguments}{envelope}}}}}',
                message,
            )


def with_id(raw: str, request_id: int) -> str:
    return raw.replace('{"jsonrpc": "2.0",', f'{{"jsonrpc": "2.0", "id": {request_id},', 1)


def envelope_of(answer: dict[str, Any]) -> dict[str, Any]:
    assert "result" in answer, answer
    result = answer["result"]
    assert result["isError"] is True
    assert "structuredContent" not in result or result["structuredContent"] is None
    payload: dict[str, Any] = json.loads(result["content"][0]["text"])
    return payload


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_numbers_json_does_not_have_are_invalid_input_over_stdio_and_audited(
    workspace: Path, tmp_path: Path, era: str
) -> None:
    errlog = tmp_path / "nexus.stderr"
    data = tmp_path / "data"
    envelope = MODERN_META if era == MODERN else {}
    sent = 0
    with (
        errlog.open("wb") as err,
        stdio_process(nexus_stdio_args(workspace, data), err, PRINCIPAL_ENV) as ours,
    ):
        if era == LEGACY:
            handshake(ours)
        for raw, message in number_requests(envelope):
            ours.next_id += 1
            answer = ours.request(with_id(raw, ours.next_id))
            expected = {"error": message or "invalid input", "code": "INVALID_INPUT"}
            assert envelope_of(answer) == expected, raw[:120]
            sent += 1
        # In _meta: a nexus key must be a string; a key nexus-mcp does not define is not read.
        for number in NON_FINITE:
            meta = json.dumps(envelope)[:-1].lstrip("{")
            meta = f'{{{meta + ", " if meta else ""}"nexus.mcp/idempotency_key": {number}}}'
            raw = (
                '{"jsonrpc": "2.0", "method": "tools/call", "params": {"name": '
                f'"nexus_read_file", "arguments": {{"path": "todo.txt"}}, "_meta": {meta}}}}}'
            )
            ours.next_id += 1
            answer = ours.request(with_id(raw, ours.next_id))
            assert envelope_of(answer)["code"] == "INVALID_INPUT"
            sent += 1
            ignored = raw.replace("nexus.mcp/idempotency_key", "vendor.example/weight")
            ours.next_id += 1
            assert ours.request(with_id(ignored, ours.next_id))["result"]["isError"] is False
    assert_quiet_and_clean(errlog)
    events = [json.loads(line) for line in (data / "audit.jsonl").read_text().splitlines()]
    refused = [e for e in events if e.get("outcome") == "INVALID_INPUT"]
    assert len(refused) == sent
    assert all(e["event"] == "tool_call_blocked" and e["args_digest"] for e in refused)
    assert len({e["args_digest"] for e in refused}) > 1


# -- HTTP ----------------------------------------------------------------------------------


class RawHttp:
    """JSON-RPC POSTs to one MCP endpoint, in one protocol era."""

    def __init__(self, client: httpx.Client, url: str, era: str) -> None:
        self.client = client
        self.url = url
        self.era = era
        self.headers = dict(HTTP_HEADERS)
        self.next_id = 100
        if era == LEGACY:
            response = client.post(url, json=INITIALIZE, headers=self.headers)
            assert response.status_code == 200
            self.headers["mcp-protocol-version"] = LEGACY
            session = response.headers.get("mcp-session-id")
            if session:
                self.headers["mcp-session-id"] = session
            client.post(url, json=INITIALIZED, headers=self.headers)

    def request(self, body: dict[str, Any] | str, *, name: str | None = None) -> tuple[int, Any]:
        headers = dict(self.headers)
        if isinstance(body, dict):
            self.next_id += 1
            body = {"jsonrpc": "2.0", "id": self.next_id, **body}
            params = body.get("params")
            name = params.get("name") if isinstance(params, dict) else None
            method = body["method"]
            raw = json.dumps(body)
        else:
            raw, method = body, "tools/call"
        if self.era == MODERN:
            headers.update({"mcp-protocol-version": MODERN, "mcp-method": method})
            if isinstance(name, str):
                headers["mcp-name"] = name
        response = self.client.post(self.url, content=raw, headers=headers)
        return response.status_code, parse_body(response.text)


def parse_body(text: str) -> Any:
    for line in text.splitlines():
        if line.startswith("data:"):
            return json.loads(line[len("data:") :])
    return json.loads(text)


@pytest.fixture(scope="module")
def http_urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(nexus URL, bare FastMCP URL, nexus stderr log): a real socket for each."""
    base = tmp_path_factory.mktemp("edges-http")
    workspace = base / "ws"
    workspace.mkdir()
    (workspace / "todo.txt").write_text("todo")
    errlog = base / "nexus.stderr"
    port = free_port()
    env = {"NEXUS_MCP_MODE": "dev", "NEXUS_MCP_DATA_DIR": str(base / "data")}
    with (
        errlog.open("wb") as err,
        http_server(["--workspace", str(workspace)], env, port=port, stderr=err),
        serve_in_thread(bare_app().http_app(), lifespan="on") as bare_base,
    ):
        yield f"http://127.0.0.1:{port}/mcp", f"{bare_base}/mcp", errlog


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_malformed_params_over_http_get_fastmcps_invalid_params_without_the_value(
    http_urls: tuple[str, str, Path], era: str
) -> None:
    ours_url, bare_url, errlog = http_urls
    cases = malformed({} if era == LEGACY else MODERN_META)
    if era == LEGACY:
        cases += legacy_only()
    with httpx.Client(timeout=ANSWER_DEADLINE_SECONDS) as client:
        if era == LEGACY:  # an initialize whose protocolVersion is a number opens no session
            params = {**INITIALIZE["params"], "protocolVersion": 20251125}
            answers = [
                parse_body(client.post(url, json={**INITIALIZE, "params": params},
                                       headers=HTTP_HEADERS).text)
                for url in (ours_url, bare_url)
            ]  # fmt: skip
            assert answers[0] == answers[1]
            assert answers[0]["error"] == {
                "code": INVALID_PARAMS, "message": INVALID_PARAMS_MESSAGE, "data": ""
            }  # fmt: skip
        ours, bare = RawHttp(client, ours_url, era), RawHttp(client, bare_url, era)
        for label, body in cases:
            bare.next_id = ours.next_id
            status, answer = ours.request(body)
            bare_status, bare_answer = bare.request(body)
            assert (status, answer) == (bare_status, bare_answer), label
            assert answer["error"]["code"] == INVALID_PARAMS, (label, answer)
            assert CANARY not in json.dumps(answer), label
        # Not a JSON-RPC request: the transport refuses it before dispatch, with the code
        # bare FastMCP uses, but never with the body quoted back (the SDK's text does).
        for raw in (f'{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":["{CANARY}"]}}',
                    f'{{"jsonrpc":"2.0","id":8,"method":"tools/call","params":"{CANARY}"}}',
                    CANARY + "{"):  # fmt: skip
            status, answer = ours.request(raw)
            bare_status, bare_answer = bare.request(raw)
            assert status == bare_status == 400
            assert answer["error"]["code"] == bare_answer["error"]["code"]
            assert CANARY not in json.dumps(answer)
            assert answer["error"]["message"] in (INVALID_PARAMS_MESSAGE, "Parse error") or (
                answer == bare_answer
            )
    assert_quiet_and_clean(errlog)


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_numbers_json_does_not_have_are_invalid_input_over_http(
    http_urls: tuple[str, str, Path], era: str
) -> None:
    ours_url, _, errlog = http_urls
    meta = {} if era == LEGACY else MODERN_META
    with httpx.Client(timeout=ANSWER_DEADLINE_SECONDS) as client:
        ours = RawHttp(client, ours_url, era)
        for raw, message in number_requests(meta):
            ours.next_id += 1
            status, answer = ours.request(with_id(raw, ours.next_id), name="nexus_read_file")
            assert status == 200
            expected = {"error": message or "invalid input", "code": "INVALID_INPUT"}
            assert envelope_of(answer) == expected, raw[:120]
        for raw, _ in number_requests(meta, numbers=[HUGE_INTEGER]):
            # The transport cannot read it (as for bare FastMCP); the in-memory transport
            # can, and test_hostile_arguments.py sends it there.
            status, answer = ours.request(raw, name="nexus_read_file")
            assert status == 400
            assert answer["error"] == {"code": PARSE_ERROR, "message": "Parse error"}
    assert_quiet_and_clean(errlog)


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_a_well_formed_call_still_reads_after_the_edge_cases(
    http_urls: tuple[str, str, Path], era: str
) -> None:
    ours_url, _, _ = http_urls
    arguments = {"path": "todo.txt"}
    if era == MODERN:
        body = {"name": "nexus_read_file", "arguments": arguments, "_meta": MODERN_META}
    else:
        body = {"name": "nexus_read_file", "arguments": arguments}
    with httpx.Client(timeout=ANSWER_DEADLINE_SECONDS) as client:
        status, answer = RawHttp(client, ours_url, era).request(
            {"method": "tools/call", "params": body}
        )
    assert status == 200 and answer["result"]["isError"] is False


# -- results the transport must be able to carry -------------------------------------------


def test_names_and_notes_that_are_not_utf8_never_end_the_stdio_server(
    workspace: Path, tmp_path: Path
) -> None:
    """A file name that is not UTF-8 comes back through ``surrogateescape`` as a lone
    surrogate, and so does a YAML ``"\\ud800"`` escape in a note's title; neither can be
    encoded on the wire, and on stdio a failed write ended the whole server."""
    raw_root = os.fsencode(workspace)
    os.mkdir(raw_root + b"/odd-\xfe")
    (Path(os.fsdecode(raw_root + b"/odd-\xfe/\xff.txt"))).write_bytes(b"needle\n")
    (workspace / "notes" / "surrogate.md").write_text(
        '---\ntitle: "a\\ud800b"\n---\n# Head\nbody\n', encoding="utf-8"
    )
    calls = [
        ("nexus_list_files", {"path": ".", "recursive": True}),
        ("nexus_glob", {"pattern": "**/*.txt"}),
        ("nexus_grep", {"pattern": "needle"}),
        ("get_section_source", {"path": "notes/surrogate.md"}),
        ("get_note_outline", {"path": "notes/surrogate.md"}),
    ]
    errlog = tmp_path / "nexus.stderr"
    with (
        errlog.open("wb") as err,
        stdio_process(nexus_stdio_args(workspace, tmp_path / "data"), err, PRINCIPAL_ENV) as ours,
    ):
        handshake(ours)
        results = [
            ours.request({"method": "tools/call", "params": {"name": name, "arguments": args}})
            for name, args in calls
        ]
        assert "result" in ours.request({"method": "ping"})
    for (name, _), answer in zip(calls, results, strict=True):
        assert answer["result"]["isError"] is False, name
    listed = json.dumps(results[0]["result"]["structuredContent"])
    assert "odd-\\ufffd/\\ufffd.txt" in listed
    assert results[3]["result"]["structuredContent"]["title"] == "a\ufffdb"
    assert_quiet_and_clean(errlog)
