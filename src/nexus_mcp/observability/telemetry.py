"""Traces (OpenTelemetry) and metrics (Prometheus) for the server, with the standard clients.

Traces are off unless the standard ``OTEL_*`` environment asks for them
(``tracing.configure_tracing``). FastMCP opens one SERVER span per MCP request itself (taking a
``traceparent`` from the request's ``_meta``); the chain adds one ``nexus.tool_call`` span
per tool call (``CallTelemetry``), named by the chain's decision and nothing the caller
sent. Every exported span passes ``tracing.RedactingSpanExporter``: exception messages,
stack traces, status descriptions and caller identity never leave the process.

Metrics live on a ``Metrics`` object with its own ``CollectorRegistry``; ``/metrics``
serves them on the HTTP transport. Under ``PROMETHEUS_MULTIPROC_DIR`` (several worker
processes behind one socket) the counters and histograms are prometheus-client's
multiprocess ones, and a scrape of any worker reports all of them.

Policy code never imports this module; the chain calls it from the audit layer, where the
outcome of every call is known, and the composition root wires the rest.
"""

from __future__ import annotations

import functools
import hmac
import inspect
import os
import time
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar, cast

from fastmcp.telemetry import suppress_fastmcp_telemetry
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from pydantic import SecretStr
from starlette.responses import Response

from nexus_mcp._version import __version__
from nexus_mcp.errors import Code, NexusError, UnavailableError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.observability.tracing import (
    ATTR_OUTCOME,
    ATTR_SERVER_ID,
    ATTR_TOOL_CLASS,
    ATTR_TOOL_NAME,
    OUTCOME_OK,
    SPAN_TOOL_CALL,
    TRACER_NAME,
    UNKNOWN_TOOL,
    tracing_active,
)

log = get_logger(__name__)

T = TypeVar("T")

# --- traces ---------------------------------------------------------------------------


# --- metrics --------------------------------------------------------------------------

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
APPROVAL_EVENTS: Final = ("minted", "spent", "replayed")
NOT_REFUSALS: Final = frozenset({OUTCOME_OK, "TOOL_ERROR"})
STORE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


def multiprocess_dir() -> str | None:
    """The multiprocess directory prometheus-client uses, when set (``--workers N``)."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


class Metrics:
    """The server's Prometheus metrics, on a registry of their own (never the global one).

    Tool labels are tool names the server knows (``bind_tools``); anything else is
    ``unknown``, so a caller cannot grow the label set.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._known: Container[str] = ()
        self._local: list[Collector] = []
        registry = self.registry
        self.tool_calls = Counter(
            "nexus_tool_calls",
            "Tool calls by exposed tool name and outcome (ok or the stable error code).",
            ["tool", "outcome"],
            registry=registry,
        )
        self.tool_call_seconds = Histogram(
            "nexus_tool_call_seconds",
            "Time a tool call spent in the chain, refusals included.",
            ["tool"],
            registry=registry,
        )
        self.refusals = Counter(
            "nexus_refusals",
            "Calls answered with the error envelope or the unknown-tool answer, by code.",
            ["code"],
            registry=registry,
        )
        self.approvals = Counter(
            "nexus_approvals",
            "Approval tokens minted by /approvals/mint, spent by a write, or replayed.",
            ["event"],
            registry=registry,
        )
        self.rate_limit_hits = Counter(
            "nexus_rate_limit_hits",
            "Calls refused RATE_LIMITED.",
            registry=registry,
        )
        self.store_seconds = Histogram(
            "nexus_store_seconds",
            "State store operations by store and operation.",
            ["store", "operation"],
            buckets=STORE_BUCKETS,
            registry=registry,
        )
        self.store_errors = Counter(
            "nexus_store_errors",
            "State store operations that failed (unavailable or an unexpected error).",
            ["store"],
            registry=registry,
        )
        for event in APPROVAL_EVENTS:
            self.approvals.labels(event=event)
        self.rate_limit_hits.inc(0)

    # -- wiring

    def bind_tools(self, known: Container[str]) -> None:
        """The exposed tool names (a live container: upstream tools come and go)."""
        self._known = known

    def add_collector(self, collector: Collector) -> None:
        """A process-local custom collector (read at scrape time)."""
        self.registry.register(collector)
        self._local.append(collector)

    # -- recording

    def tool_label(self, name: str) -> str:
        return name if name in self._known else UNKNOWN_TOOL

    def record_call(self, tool: str, outcome: str, seconds: float) -> None:
        self.tool_calls.labels(tool=tool, outcome=outcome).inc()
        self.tool_call_seconds.labels(tool=tool).observe(seconds)
        if outcome not in NOT_REFUSALS:
            self.refusals.labels(code=outcome).inc()
            if outcome == Code.RATE_LIMITED:
                self.rate_limit_hits.inc()

    def approval(self, event: str) -> None:
        if event in APPROVAL_EVENTS:
            self.approvals.labels(event=event).inc()

    def timed(self, store: str, operation: str) -> _Timed:
        """Time one store operation; count it as an error when it raises (context manager
        or decorator)."""
        return _Timed(self, store, operation)

    # -- exposition

    def exposition(self) -> bytes:
        """The text format: this registry, or every worker's under multiprocess mode."""
        directory = multiprocess_dir()
        if directory is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
        for collector in self._local:
            registry.register(collector)
        return generate_latest(registry)


class _Timed:
    """``Metrics.timed``: a class, not ``@contextmanager`` (it runs on every store call)."""

    __slots__ = ("_metrics", "_operation", "_start", "_store")

    def __init__(self, metrics: Metrics, store: str, operation: str) -> None:
        self._metrics = metrics
        self._store = store
        self._operation = operation
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        elapsed = time.perf_counter() - self._start
        self._metrics.store_seconds.labels(store=self._store, operation=self._operation).observe(
            elapsed
        )
        if exc_type is not None and is_store_error(exc_type):
            self._metrics.store_errors.labels(store=self._store).inc()

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                with _Timed(self._metrics, self._store, self._operation):
                    return await fn(*args, **kwargs)

            return timed_async

        @functools.wraps(fn)
        def timed_sync(*args: Any, **kwargs: Any) -> Any:
            with _Timed(self._metrics, self._store, self._operation):
                return fn(*args, **kwargs)

        return timed_sync


def is_store_error(exc_type: type[BaseException]) -> bool:
    """A store failure: unavailable, or anything unexpected. A refusal the store decides
    (an idempotency conflict, say) is an answer, not an error; cancellation is neither."""
    if issubclass(exc_type, UnavailableError):
        return True
    return issubclass(exc_type, Exception) and not issubclass(exc_type, NexusError)


def timed(metrics: Metrics | None, store: str, operation: str) -> Any:
    """``metrics.timed(store, operation)``, or a no-op when metrics are off."""
    if metrics is None:
        return _NoTiming()
    return metrics.timed(store, operation)


class _NoTiming:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn


class Measured:
    """A generic proxy timing every public method of a state store (``measured``).

    Attribute reads pass through; methods are wrapped once and cached. It knows nothing of
    any particular store, so every backend (SQLite, PostgreSQL, Redis) is measured alike.
    """

    def __init__(self, store: Any, name: str, metrics: Metrics) -> None:
        object.__setattr__(self, "_store", store)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_metrics", metrics)
        object.__setattr__(self, "_wrapped", {})

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(self._store, attribute)
        if attribute.startswith("_") or not callable(value) or inspect.isclass(value):
            return value
        wrapped: dict[str, Any] = self._wrapped
        found = wrapped.get(attribute)
        if found is None:
            found = wrapped[attribute] = self._metrics.timed(self._name, attribute)(value)
        return found

    def __setattr__(self, attribute: str, value: Any) -> None:
        setattr(self._store, attribute, value)

    def __repr__(self) -> str:
        return f"Measured({self._store!r}, {self._name!r})"

    @property
    def measured_store(self) -> Any:
        return self._store


def measured(store: T, name: str, metrics: Metrics | None) -> T:
    """``store`` itself when metrics are off, else ``Measured`` around it (same interface)."""
    if metrics is None:
        return store
    return cast(T, Measured(store, name, metrics))


class CacheCollector(Collector):
    """The visible-tools cache's counters (``GrantedTools.metrics()``) at scrape time."""

    def __init__(self, read: Callable[[], Mapping[str, int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        counters = self._read()
        for key in ("hits", "misses", "errors"):
            family = CounterMetricFamily(
                f"nexus_visible_tools_cache_{key}",
                f"Visible-tool cache {key} (this process).",
                value=float(counters.get(key, 0)),
            )
            yield family
        yield GaugeMetricFamily(
            "nexus_visible_tools_cache_entries",
            "Entries in the visible-tool cache (this process).",
            value=float(counters.get("entries", 0)),
        )


class UpstreamCollector(Collector):
    """``nexus_upstream_up{server_id}``: 1 while an upstream is connected and listed."""

    def __init__(self, read: Callable[[], Mapping[str, bool]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "nexus_upstream_up",
            "1 when the upstream MCP server is ready, else 0 (this process).",
            labels=["server_id"],
        )
        for server_id, up in sorted(self._read().items()):
            family.add_metric([server_id], 1.0 if up else 0.0)
        yield family


# --- per call -------------------------------------------------------------------------


class ObservedCall(Protocol):
    """What telemetry reads of a call's state (``calls.CallState`` has it): never its
    arguments, results or principal."""

    @property
    def tool_name(self) -> str: ...
    @property
    def server_id(self) -> str | None: ...
    @property
    def tool_class(self) -> Any: ...
    @property
    def started_at(self) -> float: ...
    @property
    def approval(self) -> Mapping[str, Any] | None: ...
    @property
    def pending_approval(self) -> Any: ...


class CallTelemetry:
    """What the chain records for each tool call: its span and its metrics.

    The audit layer opens ``call(state)`` around the rest of the chain and reports the
    call's outcome to it; nothing here reads arguments, results or the principal.
    """

    def __init__(
        self, metrics: Metrics | None, *, tracing: bool, native_server_id: str = ""
    ) -> None:
        self.metrics = metrics
        self.tracing = tracing
        self.native_server_id = native_server_id
        self.known: Container[str] = ()
        self.tracer = trace.get_tracer(TRACER_NAME, __version__)

    def call(self, state: ObservedCall) -> CallSpan:
        return CallSpan(self, state)

    def tool_label(self, name: str) -> str:
        return name if name in self.known else UNKNOWN_TOOL


class CallSpan:
    """One tool call: a ``nexus.tool_call`` span (current while the chain runs, so an
    upstream call carries it in ``_meta.traceparent``) and its metrics at ``finish``."""

    __slots__ = ("_owner", "_span", "_state", "_suppress", "_token")

    def __init__(self, owner: CallTelemetry, state: ObservedCall) -> None:
        self._owner = owner
        self._state = state
        self._span: Span | None = None
        self._token: Any = None
        self._suppress: Any = None

    def __enter__(self) -> CallSpan:
        if not self._owner.tracing:
            return self
        span = self._owner.tracer.start_span(SPAN_TOOL_CALL, kind=SpanKind.INTERNAL)
        if span.get_span_context().is_valid:
            self._span = span
            self._token = otel_context.attach(trace.set_span_in_context(span))
            # FastMCP would open a second SERVER span for the tool's execution under
            # ours; this one is the call's span. The trace context still propagates.
            self._suppress = suppress_fastmcp_telemetry()
            self._suppress.__enter__()
        return self

    def finish(self, outcome: str) -> None:
        """Record the call's outcome (the audit's: ``OK``, ``TOOL_ERROR``, a code)."""
        owner, state = self._owner, self._state
        outcome = OUTCOME_OK if outcome == "OK" else outcome
        tool = owner.tool_label(state.tool_name)
        span = self._span
        if span is not None:
            span.set_attribute(ATTR_TOOL_NAME, tool)
            if tool != UNKNOWN_TOOL:
                span.set_attribute(ATTR_SERVER_ID, state.server_id or owner.native_server_id)
            if state.tool_class is not None:
                span.set_attribute(ATTR_TOOL_CLASS, str(state.tool_class))
            span.set_attribute(ATTR_OUTCOME, outcome)
            if outcome != OUTCOME_OK:
                span.set_attribute("error.type", outcome)
                span.set_status(Status(StatusCode.ERROR))
        metrics = owner.metrics
        if metrics is not None:
            metrics.record_call(tool, outcome, time.perf_counter() - state.started_at)
            if outcome == Code.APPROVAL_REPLAYED:
                metrics.approval("replayed")
            elif (
                state.approval is not None
                and "jti_digest" in state.approval
                and state.pending_approval is None
            ):
                metrics.approval("spent")

    def __exit__(self, *exc: object) -> None:
        # Never records the exception: its text may quote caller input (the outcome code
        # is on the span already).
        if self._suppress is not None:
            self._suppress.__exit__(None, None, None)
        if self._token is not None:
            otel_context.detach(self._token)
        if self._span is not None:
            self._span.end()


# --- the whole ------------------------------------------------------------------------


@dataclass
class Observability:
    """Everything the composition root wires: metrics (HTTP only), per-call telemetry,
    and the ``/metrics`` bearer token."""

    metrics: Metrics | None
    telemetry: CallTelemetry | None
    bearer_token: SecretStr | None = None

    def bind(
        self,
        *,
        tools: Container[str],
        cache: Callable[[], Mapping[str, int]] | None = None,
        upstreams: Callable[[], Mapping[str, bool]] | None = None,
    ) -> None:
        if self.telemetry is not None:
            self.telemetry.known = tools
        if self.metrics is None:
            return
        self.metrics.bind_tools(tools)
        if cache is not None:
            self.metrics.add_collector(CacheCollector(cache))
        if upstreams is not None:
            self.metrics.add_collector(UpstreamCollector(upstreams))

    def count_approval(self, event: str) -> None:
        """An approval event seen outside the chain (``minted`` by ``/approvals/mint``)."""
        if self.metrics is not None:
            self.metrics.approval(event)

    def authorized(self, header: str | None) -> bool:
        """Whether a scrape may read ``/metrics``: no token configured, or the same bearer
        token (compared in constant time)."""
        if self.bearer_token is None:
            return True
        scheme, _, given = (header or "").partition(" ")
        expected = self.bearer_token.get_secret_value().encode()
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected)


def metrics_response(observability: Observability, authorization: str | None) -> Response:
    """The ``/metrics`` answer: 401 without the configured bearer token, else the text
    format (every worker's under multiprocess mode)."""
    if not observability.authorized(authorization):
        return Response(
            b'{"error":"authentication required"}',
            status_code=401,
            media_type="application/json",
            headers={"WWW-Authenticate": "Bearer", "Cache-Control": "no-store"},
        )
    metrics = observability.metrics
    body = metrics.exposition() if metrics is not None else b""
    return Response(body, media_type=None, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_observability(
    *, metrics_enabled: bool, native_server_id: str, bearer_token: SecretStr | None = None
) -> Observability:
    """Metrics when enabled; per-call telemetry when metrics or traces are on (none at
    all otherwise: the chain then pays nothing)."""
    metrics = Metrics() if metrics_enabled else None
    tracing = tracing_active()
    telemetry = (
        CallTelemetry(metrics, tracing=tracing, native_server_id=native_server_id)
        if metrics is not None or tracing
        else None
    )
    return Observability(metrics=metrics, telemetry=telemetry, bearer_token=bearer_token)


__all__ = [
    "CONTENT_TYPE_LATEST",
    "CacheCollector",
    "CallSpan",
    "CallTelemetry",
    "Measured",
    "Metrics",
    "Observability",
    "ObservedCall",
    "UpstreamCollector",
    "build_observability",
    "measured",
    "metrics_response",
    "timed",
]
