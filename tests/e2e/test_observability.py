"""Traces and metrics of the real server: in-memory clients, a real HTTP socket, a real
upstream process.

Spans are captured with the OpenTelemetry SDK's ``InMemorySpanExporter`` behind the same
``RedactingSpanExporter`` the server's own exporters use; metrics are scraped from
``/metrics`` and parsed with prometheus-client's own parser.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import Client
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, SecretStr

from nexus_mcp.contracts import nexus_tool
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.observability.tracing import SPAN_TOOL_CALL, RedactingSpanExporter
from nexus_mcp.policy.grants import grant_tool
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import MetricsSettings, Settings
from nexus_mcp.transport.serve import http_options
from tests.support.loopback import serve_in_thread

from .upstream_harness import make_gateway, read_record, stdio_upstream

MARKER = "MARKER-7f3c1b-do-not-trace"
SCRAPE_TOKEN = "scrape-token-0123456789abcdef"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
ZONE = "default"


class _Gated(SimpleSpanProcessor):
    """Exports only while a test of this module is running (the provider is global)."""

    enabled = False

    def on_end(self, span: ReadableSpan) -> None:
        if _Gated.enabled:
            super().on_end(span)


EXPORTED = InMemorySpanExporter()  # what leaves through the redacting exporter
RAW = InMemorySpanExporter()  # the spans as recorded, to check our own attributes


def _install() -> None:
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        provider = current
    else:
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporters: Sequence[SpanExporter] = (RedactingSpanExporter(EXPORTED), RAW)
    for exporter in exporters:
        provider.add_span_processor(_Gated(exporter))


_install()


@pytest.fixture(autouse=True)
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTED.clear()
    RAW.clear()
    _Gated.enabled = True
    try:
        yield EXPORTED
    finally:
        _Gated.enabled = False


class Echoed(BaseModel):
    text: str


@nexus_tool(risk="read", toolset="test")
async def obs_explode(text: str) -> Echoed:
    """Read-only test tool: fails with an unexpected error quoting its argument."""
    raise RuntimeError(f"unexpected failure with {text}")


@pytest.fixture
def server(workspace: Path, tmp_path: Path) -> Iterator[NexusServer]:
    settings = Settings(
        mode="dev",
        transport="http",
        workspace=workspace,
        data_dir=tmp_path / "data",
        metrics=MetricsSettings(bearer_token=SecretStr(SCRAPE_TOKEN)),
    )
    built = build_server(settings, audit_sinks=[MemoryAuditSink()], extra_tools=(obs_explode,))
    grant_tool(built.runtime.grants, settings.dev_principal.subject, "obs_explode", ZONE)
    yield built
    built.close()


def server_spans(spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    """The spans the server made: every SERVER span and what descends from it (the test's
    own client spans are its parents)."""
    by_parent: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        if span.parent is not None:
            by_parent.setdefault(span.parent.span_id, []).append(span)
    found: list[ReadableSpan] = []
    todo = [s for s in spans if s.kind is SpanKind.SERVER]
    while todo:
        span = todo.pop()
        if span in found:
            continue
        found.append(span)
        todo.extend(by_parent.get(span.context.span_id, []))
    return found


def tool_spans(spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if s.name == SPAN_TOOL_CALL]


def request_span_of(tool_span: ReadableSpan, spans: Sequence[ReadableSpan]) -> ReadableSpan:
    assert tool_span.parent is not None
    (parent,) = [s for s in spans if s.context.span_id == tool_span.parent.span_id]
    return parent


def dumped(span: ReadableSpan) -> str:
    return json.dumps(json.loads(span.to_json()), sort_keys=True)


# -- traces -----------------------------------------------------------------------------


async def test_each_call_has_one_request_span_and_one_tool_call_span(
    server: NexusServer, spans: InMemorySpanExporter
) -> None:
    async with Client(server.mcp) as client:
        spans.clear()
        for _ in range(2):
            ok = await client.call_tool_mcp("nexus_read_file", {"path": "README.md"})
            assert ok.is_error is False
        refused = await client.call_tool_mcp("nexus_read_file", {"path": "../outside.txt"})
        assert refused.is_error is True
    exported = server_spans(spans.get_finished_spans())
    calls = tool_spans(exported)
    assert len(calls) == 3
    requests = [s for s in exported if s.kind is SpanKind.SERVER and s.name == "tools/call"]
    assert len(requests) == 3  # FastMCP's own span, no second one for the tool's execution
    for call in calls:
        request = request_span_of(call, exported)
        assert request in requests
        assert call.context.trace_id == request.context.trace_id
        assert call.kind is SpanKind.INTERNAL
    first, _second, third = sorted(calls, key=lambda s: s.start_time or 0)
    assert dict(first.attributes or {}) == {
        "mcp.tool.name": "nexus_read_file",
        "nexus.server_id": "nexus",
        "nexus.tool_class": "read",
        "nexus.outcome": "ok",
    }
    assert first.status.status_code.name == "UNSET"
    assert dict(third.attributes or {})["nexus.outcome"] == "INVALID_PATH"
    assert third.status.status_code.name == "ERROR"
    assert third.status.description is None


async def test_a_caller_in_a_trace_continues_it_through_meta(
    server: NexusServer, spans: InMemorySpanExporter
) -> None:
    """The caller's current span travels in ``_meta.traceparent`` (the MCP SDK injects it)."""
    parent = propagate.extract({"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"})
    async with Client(server.mcp) as client:
        spans.clear()
        token = otel_context.attach(parent)
        try:
            result = await client.call_tool_mcp("nexus_read_file", {"path": "README.md"})
        finally:
            otel_context.detach(token)
    assert result.is_error is False
    everything = spans.get_finished_spans()
    (call,) = tool_spans(everything)
    assert f"{call.context.trace_id:032x}" == TRACE_ID
    assert request_span_of(call, everything).kind is SpanKind.SERVER


async def test_a_raw_traceparent_in_meta_over_http_parents_the_request(
    http_url: str, spans: InMemorySpanExporter
) -> None:
    """A client with no tracing of its own sends ``_meta.traceparent`` by hand."""
    traceparent = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
    answers = legacy_session(
        http_url,
        [
            {
                "method": "tools/call",
                "params": {
                    "name": "nexus_read_file",
                    "arguments": {"path": "README.md"},
                    "_meta": {"traceparent": traceparent},
                },
            }
        ],
    )
    assert answers[0]["result"]["isError"] is False
    everything = spans.get_finished_spans()
    (call,) = tool_spans(everything)
    assert f"{call.context.trace_id:032x}" == TRACE_ID
    request = request_span_of(call, everything)
    assert request.kind is SpanKind.SERVER and request.parent is not None
    assert f"{request.parent.span_id:016x}" == PARENT_SPAN_ID


def legacy_session(url: str, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Raw JSON-RPC over streamable HTTP on the 2025-11-25 handshake: the answers."""
    headers = {"Accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=url, headers=headers, timeout=10) as http:
        init = http.post(
            "/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            },
        )
        assert init.status_code == 200, init.text
        session = {
            "mcp-session-id": init.headers["mcp-session-id"],
            "mcp-protocol-version": "2025-11-25",
        }
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert http.post("/mcp", json=note, headers=session).status_code == 202
        answers = []
        for number, request in enumerate(requests, start=1):
            response = http.post(
                "/mcp", json={"jsonrpc": "2.0", "id": number, **request}, headers=session
            )
            answers.append(json_rpc_answer(response))
        return answers


def json_rpc_answer(response: httpx.Response) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("application/json"):
        answer: dict[str, Any] = response.json()
        return answer
    for line in response.text.splitlines():
        if line.startswith("data:") and '"id"' in line:
            parsed: dict[str, Any] = json.loads(line[5:])
            return parsed
    raise AssertionError(f"no JSON-RPC answer in {response.text[:200]!r}")


async def test_unknown_tools_and_refusals_carry_codes_not_names(
    server: NexusServer, spans: InMemorySpanExporter
) -> None:
    async with Client(server.mcp) as client:
        spans.clear()
        await client.call_tool_mcp(f"no_such_tool_{MARKER}", {"text": MARKER})
        await client.call_tool_mcp("nexus_write_file", {"path": "a.txt", "content": MARKER})
    outcomes = {
        (s.attributes or {}).get("mcp.tool.name"): (s.attributes or {}).get("nexus.outcome")
        for s in tool_spans(spans.get_finished_spans())
    }
    assert outcomes == {
        "unknown": "UNKNOWN_TOOL",
        "nexus_write_file": "IDEMPOTENCY_KEY_REQUIRED",
    }


async def test_no_argument_token_or_content_reaches_any_span(
    server: NexusServer, spans: InMemorySpanExporter, workspace: Path
) -> None:
    (workspace / "notes").mkdir(exist_ok=True)
    (workspace / "notes" / "secret.md").write_text(f"# Heading\n\nnote body {MARKER}\n")
    async with Client(server.mcp) as client:
        spans.clear()
        calls: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
            ("nexus_read_file", {"path": "notes/secret.md"}, None),  # content in the result
            ("nexus_read_file", {"path": f"../{MARKER}"}, None),  # refused input
            ("nexus_grep", {"pattern": MARKER, "path": "."}, None),
            (
                "nexus_write_file",
                {
                    "path": f"{MARKER}.txt",
                    "content": MARKER,
                    "idempotency_key": f"key-{MARKER}",
                    "approval_token": f"token-{MARKER}",
                },
                {"nexus.mcp/approval_token": f"token-{MARKER}"},
            ),
            ("obs_explode", {"text": MARKER}, None),  # an unexpected exception's text
            ("nexus_read_file", {"path": 5}, None),  # a type error pydantic would echo
        ]
        for name, arguments, meta in calls:
            await client.call_tool_mcp(name, arguments, meta=meta)
    exported = server_spans(spans.get_finished_spans())
    assert len(tool_spans(exported)) == len(calls)
    outcomes = [(s.attributes or {}).get("nexus.outcome") for s in tool_spans(exported)]
    assert "INTERNAL_ERROR" in outcomes  # obs_explode failed as it should
    for span in exported:
        assert MARKER not in dumped(span), span.name
    # Our own spans are clean before any redaction, too.
    for span in tool_spans(server_spans(RAW.get_finished_spans())):
        assert MARKER not in dumped(span)
        assert not span.events
        assert {"enduser.id", "enduser.scope", "mcp.session.id"}.isdisjoint(span.attributes or {})


# -- upstream propagation ---------------------------------------------------------------


async def test_an_upstream_call_continues_the_trace(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    record = tmp_path / "record.jsonl"
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream(record=record)],
        grant={"full": ["up_echo"]},
        extra={"transport": "http", "mode": "dev"},
    )
    assert gw.pin("up", "echo") == 0
    server = gw.build()
    try:
        async with Client(server.mcp) as client:
            spans.clear()
            result = await client.call_tool_mcp("up_echo", {"text": "hello"})
            assert result.is_error is False
            scraped = server.runtime.observability
            assert scraped is not None and scraped.metrics is not None
            exposition = scraped.metrics.exposition().decode()
    finally:
        server.close()
    (call,) = tool_spans(spans.get_finished_spans())
    assert (call.attributes or {})["nexus.server_id"] == "up"
    assert (call.attributes or {})["mcp.tool.name"] == "up_echo"
    (received,) = [r for r in read_record(record) if r["method"] == "tools/call"]
    traceparent = received["meta"]["traceparent"]
    _version, trace_id, parent_id, _flags = traceparent.split("-")
    assert trace_id == f"{call.context.trace_id:032x}"
    # The upstream's parent is our tool-call span or a span under it (the SDK's send).
    descendants = {s.context.span_id for s in server_spans(spans.get_finished_spans())}
    assert int(parent_id, 16) in descendants
    assert samples(exposition, "nexus_upstream_up") == {(("server_id", "up"),): 1.0}


# -- metrics over a real socket ----------------------------------------------------------


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


@pytest.fixture
def http_url(server: NexusServer) -> Iterator[str]:
    app = server.mcp.http_app(**http_options(server.runtime.settings))
    with serve_in_thread(app, lifespan="on") as url:
        yield url


async def test_metrics_count_calls_over_http(http_url: str) -> None:
    async with Client(f"{http_url}/mcp") as client:
        for _ in range(3):
            ok = await client.call_tool_mcp("nexus_read_file", {"path": "README.md"})
            assert ok.is_error is False
        refused = await client.call_tool_mcp("nexus_read_file", {"path": "../outside.txt"})
        assert refused.is_error is True
    auth = {"Authorization": f"Bearer {SCRAPE_TOKEN}"}
    response = httpx.get(f"{http_url}/metrics", headers=auth, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    text = response.text
    calls = samples(text, "nexus_tool_calls_total")
    assert calls == {
        (("outcome", "ok"), ("tool", "nexus_read_file")): 3.0,
        (("outcome", "INVALID_PATH"), ("tool", "nexus_read_file")): 1.0,
    }
    assert samples(text, "nexus_refusals_total") == {(("code", "INVALID_PATH"),): 1.0}
    assert samples(text, "nexus_tool_call_seconds_count") == {(("tool", "nexus_read_file"),): 4.0}
    assert samples(text, "nexus_rate_limit_hits_total") == {(): 0.0}
    assert set(samples(text, "nexus_approvals_total")) == {
        (("event", e),) for e in ("minted", "spent", "replayed")
    }
    stores = {dict(k)["store"] for k in samples(text, "nexus_store_seconds_count")}
    assert {"grants", "limits"} <= stores
    assert samples(text, "nexus_visible_tools_cache_hits_total")
    assert samples(text, "nexus_visible_tools_cache_misses_total")
    assert "nexus_upstream_up" not in text  # no upstream configured
    assert MARKER not in text


def test_metrics_need_the_bearer_token_when_one_is_configured(http_url: str) -> None:
    url = f"{http_url}/metrics"
    assert httpx.get(url, timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert httpx.get(url, headers=wrong, timeout=10).status_code == 401
    basic = {"Authorization": f"Basic {SCRAPE_TOKEN}"}
    assert httpx.get(url, headers=basic, timeout=10).status_code == 401
    right = {"Authorization": f"Bearer {SCRAPE_TOKEN}"}
    assert httpx.get(url, headers=right, timeout=10).status_code == 200


def test_metrics_refuse_a_foreign_host_like_the_mcp_endpoint(http_url: str) -> None:
    headers = {"Authorization": f"Bearer {SCRAPE_TOKEN}", "Host": "evil.example:80"}
    metrics = httpx.get(f"{http_url}/metrics", headers=headers, timeout=10)
    mcp = httpx.post(
        f"{http_url}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={**headers, "Accept": "application/json, text/event-stream"},
        timeout=10,
    )
    assert metrics.status_code == mcp.status_code == 421


def test_metrics_are_off_on_stdio_and_when_disabled(workspace: Path, tmp_path: Path) -> None:
    for overrides in ({"transport": "stdio"}, {"transport": "http", "metrics": {"enabled": False}}):
        built = build_server(
            Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "d", **overrides),
            audit_sinks=[MemoryAuditSink()],
        )
        try:
            observability = built.runtime.observability
            assert observability is not None and observability.metrics is None
            app = built.mcp.http_app(**http_options(built.runtime.settings))
            with serve_in_thread(app, lifespan="on") as url:
                assert httpx.get(f"{url}/metrics", timeout=10).status_code == 404
        finally:
            built.close()


async def test_an_exception_on_the_request_span_is_exported_without_its_text(
    http_url: str, spans: InMemorySpanExporter
) -> None:
    """FastMCP records a failed request's exception (message, stack trace and every
    chained cause) on its span; here the cause is pydantic's, which quotes the input."""
    answers = legacy_session(
        http_url,
        [{"method": "tools/call", "params": {"name": "nexus_read_file", "arguments": MARKER}}],
    )
    assert answers[0]["error"]["code"] == -32602
    assert MARKER not in json.dumps(answers)
    (request,) = [
        s
        for s in spans.get_finished_spans()
        if s.kind is SpanKind.SERVER and s.name == "tools/call"
    ]
    assert request.status.status_code.name == "ERROR" and request.status.description is None
    assert request.events
    for event in request.events:  # FastMCP and the SDK may each record it
        assert dict(event.attributes or {}) == {
            "exception.type": "mcp.shared.exceptions.MCPError",
            "exception.escaped": "False",
        }
    for span in server_spans(spans.get_finished_spans()):
        assert MARKER not in dumped(span)
    (raw,) = [s for s in RAW.get_finished_spans() if s.context == request.context]
    assert MARKER in dumped(raw)  # what the redaction removed
