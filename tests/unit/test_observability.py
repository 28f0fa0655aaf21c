"""observability.py: when tracing turns on, the redacting exporter, the metrics and the
store timing proxy, with the real OpenTelemetry SDK, OTLP exporter and prometheus-client."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nexus_mcp.calls import CallState
from nexus_mcp.errors import ConfigError, IdempotencyKeyConflictError, UnavailableError
from nexus_mcp.observability.telemetry import (
    CallTelemetry,
    Measured,
    Metrics,
    Observability,
    measured,
    timed,
)
from nexus_mcp.observability.tracing import (
    RedactingSpanExporter,
    build_tracer_provider,
    configure_tracing,
    requested_exporters,
)
from nexus_mcp.stores.nonces import SqliteNonceStore
from tests.support.loopback import serve_in_thread

MARKER = "MARKER-unit-8d1e"
SRC = Path(__file__).resolve().parents[2] / "src"


def samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


# -- when tracing is on -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, ()),
        ({"OTEL_SERVICE_NAME": "x"}, ()),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "console, otlp"}, ("console", "otlp")),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, ()),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, ()),
    ],
)
def test_tracing_is_off_unless_the_otel_environment_asks(
    environ: dict[str, str], expected: tuple[str, ...]
) -> None:
    assert requested_exporters(environ) == expected


def test_an_unsupported_exporter_stops_start_up_by_name() -> None:
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER: zipkin"):
        requested_exporters({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_configure_tracing_installs_nothing_by_default() -> None:
    before = trace.get_tracer_provider()
    assert configure_tracing({}) is None
    assert build_tracer_provider({}) is None
    assert trace.get_tracer_provider() is before


def test_the_resource_names_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    provider = build_tracer_provider({}, exporters=[InMemorySpanExporter()])
    assert provider is not None
    assert provider.resource.attributes["service.name"] == "nexus-mcp"
    provider.shutdown()
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,team=a%20b")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-7")
    provider = build_tracer_provider({}, exporters=[InMemorySpanExporter()])
    assert provider is not None
    attributes = provider.resource.attributes
    assert attributes["service.name"] == "gateway-7"
    assert attributes["deployment.environment"] == "test"
    assert attributes["team"] == "a b"
    provider.shutdown()


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """A loopback OTLP/HTTP receiver that keeps what it is sent."""
    received: list[tuple[str, bytes]] = []

    async def traces(request: Request) -> Response:
        received.append((request.headers.get("content-type", ""), await request.body()))
        return Response(b"", media_type="application/x-protobuf")

    app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])
    with serve_in_thread(app) as url:
        yield url, received


def test_spans_go_to_the_otlp_endpoint_the_environment_names(
    monkeypatch: pytest.MonkeyPatch, collector: tuple[str, list[tuple[str, bytes]]]
) -> None:
    url, received = collector
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": url}
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)  # the exporter reads it itself
    provider = build_tracer_provider(environ)
    assert provider is not None
    with provider.get_tracer("t").start_as_current_span("exported-span") as span:
        span.set_attribute("nexus.outcome", "ok")
        span.record_exception(ValueError(MARKER))
    assert provider.force_flush(10_000)
    provider.shutdown()
    assert len(received) == 1
    content_type, body = received[0]
    assert content_type == "application/x-protobuf"
    assert b"exported-span" in body and b"nexus-mcp" in body
    assert MARKER.encode() not in body


def test_the_redacting_exporter_drops_exception_text_and_identity() -> None:
    inner = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(RedactingSpanExporter(inner)))
    with provider.get_tracer("t").start_as_current_span("s") as span:
        span.set_attributes({"enduser.id": MARKER, "mcp.session.id": MARKER, "kept": "yes"})
        try:
            try:
                raise KeyError(MARKER)
            except KeyError as cause:
                raise RuntimeError("wrapped") from cause
        except RuntimeError as exc:
            span.record_exception(exc)
        span.add_event("other", {"note": "stays"})
        span.set_status(Status(StatusCode.ERROR, MARKER))
    (exported,) = inner.get_finished_spans()
    assert MARKER not in exported.to_json()
    assert dict(exported.attributes or {}) == {"kept": "yes"}
    assert exported.status.status_code is StatusCode.ERROR
    exception, other = exported.events
    assert dict(exception.attributes or {}) == {
        "exception.type": "RuntimeError",
        "exception.escaped": "False",
    }
    assert dict(other.attributes or {}) == {"note": "stays"}


# -- metrics --------------------------------------------------------------------------------


def test_two_metrics_objects_do_not_share_a_registry() -> None:
    first, second = Metrics(), Metrics()
    first.bind_tools({"t"})
    first.record_call("t", "ok", 0.01)
    assert samples(first, "nexus_tool_calls_total") == {(("outcome", "ok"), ("tool", "t")): 1.0}
    assert samples(second, "nexus_tool_calls_total") == {}


def state_for(name: str, **fields: Any) -> CallState:
    state = CallState(tool_name=name, arguments={"x": MARKER}, meta={}, transport=None)
    for key, value in fields.items():
        setattr(state, key, value)
    return state


def test_a_call_record_counts_outcomes_refusals_and_approvals() -> None:
    metrics = Metrics()
    telemetry = CallTelemetry(metrics, tracing=False, native_server_id="nexus")
    telemetry.known = {"nexus_write_file"}
    outcomes: list[tuple[str, str, dict[str, Any]]] = [
        ("nexus_write_file", "OK", {"approval": {"jti_digest": "d"}}),
        ("nexus_write_file", "APPROVAL_REPLAYED", {"approval": {"jti_digest": "d"}}),
        ("nexus_write_file", "WRITE_POLICY_DENIED", {"approval": {"jti_digest": "d"},
                                                     "pending_approval": object()}),
        ("nexus_write_file", "OK", {"approval": {"host_id": "elicitation"}}),
        (f"made_up_{MARKER}", "UNKNOWN_TOOL", {}),
        ("nexus_write_file", "RATE_LIMITED", {}),
        ("nexus_write_file", "TOOL_ERROR", {}),
    ]  # fmt: skip
    for name, outcome, fields in outcomes:
        with telemetry.call(state_for(name, **fields)) as record:
            record.finish(outcome)
    calls = samples(metrics, "nexus_tool_calls_total")
    assert calls[(("outcome", "ok"), ("tool", "nexus_write_file"))] == 2.0
    assert calls[(("outcome", "UNKNOWN_TOOL"), ("tool", "unknown"))] == 1.0
    assert samples(metrics, "nexus_refusals_total") == {
        (("code", "APPROVAL_REPLAYED"),): 1.0,
        (("code", "WRITE_POLICY_DENIED"),): 1.0,
        (("code", "UNKNOWN_TOOL"),): 1.0,
        (("code", "RATE_LIMITED"),): 1.0,
    }
    assert samples(metrics, "nexus_rate_limit_hits_total") == {(): 1.0}
    assert samples(metrics, "nexus_approvals_total") == {
        (("event", "minted"),): 0.0,
        (("event", "spent"),): 1.0,  # not the refused one, whose approval was not spent
        (("event", "replayed"),): 1.0,
    }
    assert MARKER not in metrics.exposition().decode()


def test_timed_times_and_counts_store_errors() -> None:
    metrics = Metrics()
    with timed(metrics, "nonces", "consume"):
        pass
    for exc in (UnavailableError(store="nonces"), OSError("disk"), IdempotencyKeyConflictError()):
        with pytest.raises(type(exc)), timed(metrics, "nonces", "consume"):
            raise exc
    assert samples(metrics, "nexus_store_seconds_count") == {
        (("operation", "consume"), ("store", "nonces")): 4.0
    }
    # Unavailable and unexpected errors count; a refusal the store decides does not.
    assert samples(metrics, "nexus_store_errors_total") == {(("store", "nonces"),): 2.0}
    with timed(None, "nonces", "consume"):  # metrics off: nothing to do
        pass


def test_timed_decorates_sync_and_async_functions() -> None:
    metrics = Metrics()

    @metrics.timed("grants", "lookup")
    def lookup(value: int) -> int:
        return value + 1

    @metrics.timed("grants", "alookup")
    async def alookup(value: int) -> int:
        await asyncio.sleep(0)
        return value + 2

    assert lookup(1) == 2
    assert asyncio.run(alookup(1)) == 3
    assert samples(metrics, "nexus_store_seconds_count") == {
        (("operation", "alookup"), ("store", "grants")): 1.0,
        (("operation", "lookup"), ("store", "grants")): 1.0,
    }


def test_measured_times_every_public_method_of_a_real_store(tmp_path: Path) -> None:
    metrics = Metrics()
    store = SqliteNonceStore(tmp_path / "nonces.sqlite3")
    wrapped = measured(store, "nonces", metrics)
    assert isinstance(wrapped, Measured) and wrapped.measured_store is store
    assert measured(store, "nonces", None) is store
    try:
        assert wrapped.consume("jti-1", 4_102_444_800.0) is True
        assert wrapped.consume("jti-1", 4_102_444_800.0) is False
        assert wrapped.consume is wrapped.consume  # wrapped once
    finally:
        wrapped.close()
    counts = samples(metrics, "nexus_store_seconds_count")
    assert counts[(("operation", "consume"), ("store", "nonces"))] == 2.0
    assert counts[(("operation", "close"), ("store", "nonces"))] == 1.0


def test_custom_collectors_report_the_cache_and_upstreams() -> None:
    metrics = Metrics()
    observability = Observability(metrics=metrics, telemetry=None)
    states = {"up": True, "down": False}
    observability.bind(
        tools=set(),
        cache=lambda: {"hits": 7, "misses": 3, "errors": 0, "entries": 2},
        upstreams=lambda: states,
    )
    assert samples(metrics, "nexus_visible_tools_cache_hits_total") == {(): 7.0}
    assert samples(metrics, "nexus_visible_tools_cache_misses_total") == {(): 3.0}
    assert samples(metrics, "nexus_upstream_up") == {
        (("server_id", "down"),): 0.0,
        (("server_id", "up"),): 1.0,
    }
    states["down"] = True
    assert samples(metrics, "nexus_upstream_up")[(("server_id", "down"),)] == 1.0


def test_the_scrape_token_is_compared_as_a_bearer() -> None:
    open_ = Observability(metrics=None, telemetry=None)
    assert open_.authorized(None)
    guarded = Observability(metrics=None, telemetry=None, bearer_token=SecretStr("s3cret"))
    assert guarded.authorized("Bearer s3cret") and guarded.authorized("bearer s3cret")
    for header in (None, "", "Bearer", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret"):
        assert not guarded.authorized(header)


WORKER = textwrap.dedent(
    """
    import sys
    from nexus_mcp.observability.telemetry import Metrics
    metrics = Metrics()
    metrics.bind_tools({"nexus_read_file"})
    for _ in range(int(sys.argv[1])):
        metrics.record_call("nexus_read_file", "ok", 0.01)
    if sys.argv[2] == "scrape":
        sys.stdout.write(metrics.exposition().decode())
    """
)


def test_multiprocess_mode_sums_every_worker(tmp_path: Path) -> None:
    directory = tmp_path / "prom"
    directory.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory), "PYTHONPATH": str(SRC)}

    def run(calls: int, action: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", WORKER, str(calls), action],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout

    run(2, "record")
    run(3, "record")
    text = run(1, "scrape")
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "nexus_tool_calls_total":
                found[tuple(sorted(sample.labels.items()))] = sample.value
    assert found == {(("outcome", "ok"), ("tool", "nexus_read_file")): 6.0}
