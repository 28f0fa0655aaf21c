"""The one place that assembles the policy chain, outermost first (DESIGN.md, "The chain").

    1 envelope -> 2 audit -> 3 identity -> 4 namespace -> 5 classification
      -> 6 approval & write policy -> 7 documents -> 8 budgets & timeouts -> 9 connector

The connector (9) is not a middleware: ``@nexus_tool``'s binding wraps each tool function.

Each layer is an ordinary FastMCP ``Middleware`` with the usual hooks (``on_request``,
``on_call_tool``, ``on_list_tools``, ...), but FastMCP sees a single ``PolicyChain`` that
runs them. FastMCP gives every registered middleware eight Python frames per message
(``wrapped``, ``__call__``, ``_dispatch_handler`` and a wrapper around each of
``on_message``/``on_request``/the typed hook), and every resumption of a suspended tool
call travels back through all of them; the chain gives each hook a layer actually
defines exactly one frame. Same hooks, same order, same semantics (benchmarks/README.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.server.middleware.dereference import DereferenceRefsMiddleware

# FastMCP tells a middleware which slice of its hooks a dispatch pass runs through this
# context variable (``Middleware.__call__`` reads it); an override of ``__call__`` must
# read it too, or the typed hooks run in the root's "outer" pass on the raw params of a
# request that failed validation (a dict, not the typed message).
from fastmcp.server.middleware.middleware import _dispatch_phase

CHAIN_ORDER = (
    "envelope",
    "audit",
    "identity",
    "namespace",
    "classification",
    "approval",
    "documents",
    "limits",
)

# The typed hook FastMCP's Middleware._dispatch_handler picks for each method.
TYPED_HOOKS = {
    "initialize": "on_initialize",
    "server/discover": "on_discover",
    "tools/call": "on_call_tool",
    "resources/read": "on_read_resource",
    "prompts/get": "on_get_prompt",
    "tools/list": "on_list_tools",
    "resources/list": "on_list_resources",
    "resources/templates/list": "on_list_resource_templates",
    "prompts/list": "on_list_prompts",
}
_KIND_HOOKS = {"request": "on_request", "notification": "on_notification"}

Hook = Callable[..., Any]


@dataclass(frozen=True)
class ChainLayers:
    """The middleware for each slot; a slot a deployment does not use is ``None``."""

    envelope: Middleware
    audit: Middleware
    identity: Middleware
    namespace: Middleware | None = None
    classification: Middleware | None = None
    approval: Middleware | None = None
    documents: Middleware | None = None
    limits: Middleware | None = None


def _defines(layer: Middleware, hook: str) -> bool:
    return getattr(type(layer), hook, None) is not getattr(Middleware, hook, None)


def hooks_for(
    layers: Iterable[Middleware], method: str | None, kind: str, phase: str = "all"
) -> tuple[Hook, ...]:
    """The hooks a message runs through, outermost first, as FastMCP would run them.

    Per layer: ``on_message``, then ``on_request``/``on_notification``, then the typed
    hook, each only where the layer defines it (the base class hooks only pass the
    message on) and only where the dispatch ``phase`` runs it: ``"outer"`` (FastMCP's
    root pass, also the one that observes a request whose params failed validation)
    runs no typed hook, ``"typed"`` only the typed hook. A layer that overrides
    ``__call__`` itself runs as one hook.
    """
    hooks: list[Hook] = []
    outer = phase != "typed"
    typed = phase != "outer"
    for layer in layers:
        if _defines(layer, "__call__"):
            hooks.append(layer.__call__)
            continue
        names = [
            "on_message" if outer else "",
            _KIND_HOOKS.get(kind, "") if outer else "",
            TYPED_HOOKS.get(method or "", "") if typed else "",
        ]
        for name in names:
            # resources/read's base hook is not a pass-through: it runs the layer's
            # check_resource_access, so it always runs.
            if name and (_defines(layer, name) or name == "on_read_resource"):
                hooks.append(getattr(layer, name))
    return tuple(hooks)


class PolicyChain(Middleware):
    """The only middleware FastMCP sees: runs the chain's layers in DESIGN.md order.

    It overrides ``__call__``, which FastMCP calls once per message; the hooks of every
    layer are then composed with ``functools.partial`` (no frame of its own).
    """

    def __init__(self, layers: Sequence[Middleware]) -> None:
        self._layers: tuple[Middleware, ...] = tuple(layers)
        self._hooks: dict[tuple[str | None, str, str], tuple[Hook, ...]] = {}

    @property
    def layers(self) -> tuple[Middleware, ...]:
        return self._layers

    def replace_layers(self, layers: Sequence[Middleware]) -> None:
        """Swap the layers (tests take one out to show the others alone still hold)."""
        self._layers = tuple(layers)
        self._hooks = {}

    async def __call__(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        key = (context.method, context.type, _dispatch_phase.get())
        hooks = self._hooks.get(key)
        if hooks is None:
            hooks = self._hooks[key] = hooks_for(self._layers, *key)
        handler: Any = call_next
        for hook in reversed(hooks):
            handler = partial(hook, call_next=handler)
        return await handler(context)


def build_layers_in_order(layers: ChainLayers) -> list[Middleware]:
    """The layers in DESIGN.md order, skipping empty slots.

    FastMCP's ``DereferenceRefsMiddleware`` (inlines ``$ref`` in listed schemas) sits
    right inside the envelope instead of innermost, where FastMCP would append it: there
    it only rewrites the tools the namespace lets the caller see, not every registered
    tool (30 instead of 1,000 in benchmarks/bench_list_tools.py). It has no call hook.
    """
    ordered = [getattr(layers, slot) for slot in CHAIN_ORDER]
    chain = [layer for layer in ordered if layer is not None]
    return [chain[0], DereferenceRefsMiddleware(), *chain[1:]]


def build_middleware(layers: ChainLayers) -> list[Middleware]:
    """What the server hands FastMCP: one ``PolicyChain`` over the ordered layers."""
    return [PolicyChain(build_layers_in_order(layers))]


__all__ = [
    "CHAIN_ORDER",
    "ChainLayers",
    "PolicyChain",
    "build_layers_in_order",
    "build_middleware",
    "hooks_for",
]
