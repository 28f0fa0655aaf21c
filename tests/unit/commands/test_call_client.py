"""``nexus-mcp call``'s own MCP client against scripted HTTP servers that misbehave.

Each server is a real loopback HTTP server (the standard library's, in a thread) that
answers ``initialize`` and ``notifications/initialized`` as an MCP server does, then
``tools/call`` as the test scripts it: an SSE stream with a ping first, a redirect to
another origin, an event past the bound, a body that is not JSON, a long JSON-RPC error.
What is checked is what a script sees from ``main``: stdout, one stderr line, the exit.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from nexus_mcp.cli import main
from nexus_mcp.commands.call_client import MAX_EVENT_BYTES

TOKEN = "CANARY-token-5d2a"
RESULT = {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"ok": True}}

Script = Callable[["Handler", dict[str, Any]], None]


class Handler(BaseHTTPRequestHandler):
    server: Scripted

    def log_message(self, *_: Any) -> None:  # quiet
        pass

    def answer(self, status: int, body: bytes, kind: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def json_answer(self, message: dict[str, Any], **headers: str) -> None:
        self.answer(200, json.dumps(message).encode(), "application/json", **headers)

    def do_POST(self) -> None:
        self.server.seen.append(dict(self.headers.items()))
        message = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.messages.append(message)
        method = message.get("method")
        if method == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {}}
            self.json_answer({"jsonrpc": "2.0", "id": message["id"], "result": result},
                             **{"mcp-session-id": "s-1"})  # fmt: skip
        elif method == "tools/call":
            self.server.script(self, message)
        else:  # the initialized notification, or the client's answer to a ping
            self.answer(202, b"", "application/json")

    def do_DELETE(self) -> None:
        self.server.deleted = True
        self.answer(200, b"", "application/json")


class Scripted(ThreadingHTTPServer):
    def __init__(self, script: Script) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.script = script
        self.seen: list[dict[str, str]] = []
        self.messages: list[dict[str, Any]] = []
        self.deleted = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/mcp"


@contextlib.contextmanager
def serve(script: Script) -> Iterator[Scripted]:
    server = Scripted(script)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def run(capsys: pytest.CaptureFixture[str], url: str, *extra: str) -> tuple[int, str, list[str]]:
    code = main(["call", "--url", url, "--token", TOKEN, "--timeout", "10", *extra, "t", "a=1"])
    out, err = capsys.readouterr()
    assert TOKEN not in out + err
    return code, out, err.splitlines()


def sse(*messages: dict[str, Any]) -> bytes:
    return b"".join(b"event: message\ndata: " + json.dumps(m).encode() + b"\n\n" for m in messages)


def test_a_result_after_a_ping_and_a_progress_note_on_the_stream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def script(handler: Handler, call: dict[str, Any]) -> None:
        progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}
        ping = {"jsonrpc": "2.0", "id": "srv-1", "method": "ping"}
        sampling = {"jsonrpc": "2.0", "id": "srv-2", "method": "sampling/createMessage"}
        done = {"jsonrpc": "2.0", "id": call["id"], "result": RESULT}
        handler.answer(200, sse(progress, ping, sampling, done), "text/event-stream")

    with serve(script) as server:
        code, out, err = run(capsys, server.url)
        assert (code, json.loads(out), err) == (0, {"ok": True}, [])
        answers = {m.get("id"): m for m in server.messages if "method" not in m}
        assert answers["srv-1"]["result"] == {}
        assert answers["srv-2"]["error"]["code"] == -32601
        calls = [m for m in server.messages if m.get("method") == "tools/call"]
        assert [m["params"] for m in calls] == [{"name": "t", "arguments": {"a": "1"}}]
        # Every request after initialize carries the session and the negotiated version.
        assert all(h.get("mcp-session-id") == "s-1" for h in server.seen[1:])
        assert all(h.get("mcp-protocol-version") == "2025-11-25" for h in server.seen[1:])
        assert server.deleted


def test_a_redirect_to_another_origin_is_not_followed_and_the_token_stays_home(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serve(lambda handler, call: handler.json_answer(RESULT)) as elsewhere:

        def script(handler: Handler, call: dict[str, Any]) -> None:
            handler.answer(307, b"", "text/plain", location=elsewhere.url)

        with serve(script) as server:
            code, out, err = run(capsys, server.url)
            assert (code, out) == (2, "")
            assert err == [f"error: {server.url} answered HTTP 307"]
        assert elsewhere.seen == []  # nothing, and so no token, reached the other origin


def test_a_redirect_within_the_origin_is_followed(capsys: pytest.CaptureFixture[str]) -> None:
    def script(handler: Handler, call: dict[str, Any]) -> None:
        if handler.path == "/mcp":
            handler.answer(308, b"", "text/plain", location="/mcp/v2")
        else:
            handler.json_answer({"jsonrpc": "2.0", "id": call["id"], "result": RESULT})

    with serve(script) as server:
        code, out, _ = run(capsys, server.url)
        assert (code, json.loads(out)) == (0, {"ok": True})


@pytest.mark.parametrize(
    "body",
    [
        (b"not json at all", "application/json"),
        (b"data: " + b"x" * (MAX_EVENT_BYTES + 10) + b"\n\n", "text/event-stream"),
        (b"<html>CANARY-page</html>", "text/html"),
        (sse({"jsonrpc": "2.0", "id": 999, "result": RESULT}), "text/event-stream"),
    ],
    ids=["not-json", "event-past-the-bound", "not-mcp", "another-id"],
)
def test_an_answer_that_is_not_mcp_is_one_line_and_echoes_nothing(
    capsys: pytest.CaptureFixture[str], body: tuple[bytes, str]
) -> None:
    with serve(lambda handler, call: handler.answer(200, *body)) as server:
        code, out, err = run(capsys, server.url)
        assert (code, out) == (2, "")
        assert err == [f"error: {server.url} did not answer as an MCP server"]


def test_a_json_rpc_error_is_shown_on_one_short_line(capsys: pytest.CaptureFixture[str]) -> None:
    message = "line one\nline two " + "y" * 1000

    def script(handler: Handler, call: dict[str, Any]) -> None:
        error = {"code": -32602, "message": message}
        handler.json_answer({"jsonrpc": "2.0", "id": call["id"], "error": error})

    with serve(script) as server:
        code, out, err = run(capsys, server.url)
        assert (code, out, len(err)) == (2, "", 1)
        assert err[0].startswith(f"error: {server.url} answered with error -32602: line one line")
        assert len(err[0]) < 300


def test_a_result_without_content_or_is_error_gets_their_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def script(handler: Handler, call: dict[str, Any]) -> None:
        handler.json_answer({"jsonrpc": "2.0", "id": call["id"], "result": {}})

    with serve(script) as server:
        code, out, _ = run(capsys, server.url, "--full")
        assert (code, json.loads(out)) == (0, {"content": [], "isError": False})
