"""Traces: OpenTelemetry spans for tool calls, configured from the standard environment
variables, exported with the caller's identity and exception text redacted."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Final

from opentelemetry import trace
from opentelemetry.sdk.resources import (
    SERVICE_NAME,
    SERVICE_VERSION,
    OTELResourceDetector,
    Resource,
    get_aggregated_resources,
)
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Status

from nexus_mcp._version import __version__
from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.logs import get_logger

log = get_logger(__name__)


TRACER_NAME: Final = "nexus_mcp"


SPAN_TOOL_CALL: Final = "nexus.tool_call"


DEFAULT_SERVICE_NAME: Final = "nexus-mcp"


ATTR_TOOL_NAME: Final = "mcp.tool.name"


ATTR_SERVER_ID: Final = "nexus.server_id"


ATTR_TOOL_CLASS: Final = "nexus.tool_class"


ATTR_OUTCOME: Final = "nexus.outcome"


OUTCOME_OK: Final = "ok"


UNKNOWN_TOOL: Final = "unknown"


TRACES_EXPORTERS: Final = frozenset({"otlp", "console"})


# Span attributes that name the caller or its session (FastMCP sets them on its spans):
# traces stay principal-free.
REDACTED_ATTRIBUTES: Final = frozenset({"enduser.id", "enduser.scope", "mcp.session.id"})


# The only attributes an exception event keeps: its message and stack trace may quote
# caller input (a pydantic message, an OS error naming a path).
EXCEPTION_EVENT_KEEPS: Final = frozenset({"exception.type", "exception.escaped"})


def requested_exporters(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The span exporters the standard environment asks for; empty means tracing is off.

    On when ``OTEL_TRACES_EXPORTER`` names ``otlp`` and/or ``console``, or when an OTLP
    endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``/``..._TRACES_ENDPOINT``) is set and no
    exporter is named. ``OTEL_TRACES_EXPORTER=none`` and ``OTEL_SDK_DISABLED=true`` turn
    it off. Unlike the SDK's own default (``otlp``), nothing is exported unless asked.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    named = [
        part.strip().lower()
        for part in environ.get("OTEL_TRACES_EXPORTER", "").split(",")
        if part.strip()
    ]
    if not named:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ("otlp",) if endpoint else ()
    if "none" in named:
        return ()
    unknown = sorted(set(named) - TRACES_EXPORTERS)
    if unknown:
        raise ConfigError(
            f"invalid OTEL_TRACES_EXPORTER: {', '.join(unknown)} "
            f"(supported: {', '.join(sorted(TRACES_EXPORTERS))}, none)"
        )
    return tuple(dict.fromkeys(named))


def tracing_resource() -> Resource:
    """``service.name`` nexus-mcp and the version, under what ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` say (read by the SDK's own detector)."""
    base = Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME, SERVICE_VERSION: __version__})
    return get_aggregated_resources([OTELResourceDetector()], initial_resource=base)


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    # Imported here: only a deployment that exports over OTLP pays for it. The exporter
    # reads OTEL_EXPORTER_OTLP_* (endpoint, headers, timeout, certificates) itself.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def build_tracer_provider(
    environ: Mapping[str, str], *, exporters: Sequence[SpanExporter] | None = None
) -> TracerProvider | None:
    """An SDK ``TracerProvider`` as the environment asks, or None when tracing is off.

    Each exporter (``exporters`` replaces the configured ones, for tests) is wrapped in
    ``RedactingSpanExporter`` behind a ``BatchSpanProcessor``. Sets nothing global.
    """
    names = requested_exporters(environ)
    if not names and exporters is None:
        return None
    chosen = list(exporters) if exporters is not None else [_exporter(n) for n in names]
    provider = TracerProvider(resource=tracing_resource())
    for exporter in chosen:
        provider.add_span_processor(BatchSpanProcessor(RedactingSpanExporter(exporter)))
    return provider


def configure_tracing(environ: Mapping[str, str]) -> TracerProvider | None:
    """Install the process's ``TracerProvider`` when the environment asks for traces.

    Off by default: without ``OTEL_*`` settings nothing is installed and FastMCP's and our
    spans stay no-ops. Once per process; a provider the embedding application installed
    first is kept (and None returned).
    """
    global _configured
    with _configure_lock:
        if _configured is not None:
            return _configured
        provider = build_tracer_provider(environ)
        if provider is None:
            return None
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            log.warning("tracing_provider_exists", reason="kept the application's provider")
            provider.shutdown()
            return None
        trace.set_tracer_provider(provider)
        _configured = provider
        log.info("tracing_enabled", exporters=list(requested_exporters(environ)))
        return provider


class RedactingSpanExporter(SpanExporter):
    """Exports spans without exception text, status descriptions or caller identity.

    FastMCP records an exception on its spans with ``str(exc)`` as the status and the
    message and stack trace (every chained cause included) as an event; the text of an
    unexpected exception can quote caller input. Only the exception's type is kept.
    """

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([redact_span(span) for span in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def redact_span(span: ReadableSpan) -> ReadableSpan:
    attributes = {k: v for k, v in (span.attributes or {}).items() if k not in REDACTED_ATTRIBUTES}
    events = [
        Event(
            event.name,
            {k: v for k, v in (event.attributes or {}).items() if k in EXCEPTION_EVENT_KEEPS},
            timestamp=event.timestamp,
        )
        if event.name == "exception"
        else event
        for event in span.events
    ]
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=events,
        links=span.links,
        kind=span.kind,
        status=Status(span.status.status_code),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def tracing_active() -> bool:
    """Whether a real ``TracerProvider`` is installed (ours or the application's)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


_configured: TracerProvider | None = None


_configure_lock = threading.Lock()


__all__ = [
    "ATTR_OUTCOME",
    "ATTR_SERVER_ID",
    "ATTR_TOOL_CLASS",
    "ATTR_TOOL_NAME",
    "DEFAULT_SERVICE_NAME",
    "EXCEPTION_EVENT_KEEPS",
    "OUTCOME_OK",
    "REDACTED_ATTRIBUTES",
    "SPAN_TOOL_CALL",
    "TRACER_NAME",
    "TRACES_EXPORTERS",
    "UNKNOWN_TOOL",
    "RedactingSpanExporter",
    "build_tracer_provider",
    "configure_tracing",
    "redact_span",
    "requested_exporters",
    "tracing_active",
    "tracing_resource",
]
