"""Tool classification: decide a call's class from the registry and refuse what the seed refuses.

The rules run in this order, and the first that fails refuses the call:

1. Registry resolution. ``{server_id, tool_name}`` missing from the registry is
   ``TOOL_UNCLASSIFIED_DENIED`` in production (any mode other than ``"dev"``). In dev the
   call goes on with a heuristic class and a warning: ``readOnlyHint`` true gives read
   only when nothing contradicts it (no ``destructiveHint``, no write verb in the name);
   anything else is write. An unknown tool never becomes read by name alone.
2. Declared class (``_meta`` ``nexus.mcp/tool_class``). A value other than read/write is
   ``INVALID_INPUT``; a value that differs from the registry class is
   ``TOOL_CLASS_DECLARATION_MISMATCH``. Against a dev heuristic it is only a warning: a
   guess is no ground to refuse on. The declaration is never used for authorization.
3. Read-only caller and a write class: ``TOOL_CLASS_MISMATCH``.
4. Write class without a usable idempotency key: ``IDEMPOTENCY_KEY_REQUIRED`` (empty or
   blank); a key longer than the tool_call contract allows is ``INVALID_INPUT``.

The declaration check comes before the read-only check so that a caller lying about the
class is told so even when it is read-only; both refuse, and audit sees the sharper code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nexus_mcp.errors import (
    IdempotencyKeyRequiredError,
    InvalidInputError,
    ToolClassDeclarationError,
    ToolClassMismatchError,
    ToolUnclassifiedError,
)
from nexus_mcp.policy.registry import RegistrySet, ToolClass, ToolEntry

DEV_MODE = "dev"
META_TOOL_CLASS = "nexus.mcp/tool_class"
IDEMPOTENCY_KEY_FIELD = "idempotency_key"
MAX_IDEMPOTENCY_KEY_LENGTH = 256  # the tool_call contract's maxLength

WARNING_UNCLASSIFIED = "tool_unclassified_heuristic_class"
WARNING_HINTS_CONFLICT = "tool_hints_conflict_write_assumed"
WARNING_DECLARATION_DIFFERS = "declared_class_differs_from_heuristic"

# Verbs that make an unclassified tool a write in dev. Matched as whole name tokens.
WRITE_VERBS = frozenset(
    {
        "write",
        "edit",
        "delete",
        "remove",
        "rm",
        "mkdir",
        "rename",
        "move",
        "create",
        "update",
        "put",
        "set",
        "apply",
        "merge",
        "push",
    }
)

_VALID_CLASSES: frozenset[str] = frozenset({"read", "write"})
_TOKEN = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


@dataclass(frozen=True, slots=True)
class Classification:
    """The class a call runs under; ``entry`` is None and ``heuristic`` True for dev guesses."""

    tool_class: ToolClass
    entry: ToolEntry | None
    heuristic: bool
    warnings: tuple[str, ...] = ()


def classify_call(
    registry_set: RegistrySet,
    *,
    server_id: str,
    tool_name: str,
    mode: str,
    caller_read_only: bool,
    declared_class: str | None,
    idempotency_key: str | None,
    read_only_hint: bool | None = None,
    destructive_hint: bool | None = None,
) -> Classification:
    """Apply the four rules in the module's order; return the class or raise its refusal."""
    entry = registry_set.lookup(server_id, tool_name)
    warnings: list[str] = []
    if entry is not None:
        tool_class: ToolClass = entry.tool_class
    elif mode == DEV_MODE:
        tool_class, conflict = guess_tool_class(tool_name, read_only_hint, destructive_hint)
        warnings.append(WARNING_UNCLASSIFIED)
        if conflict:
            warnings.append(WARNING_HINTS_CONFLICT)
    else:
        raise ToolUnclassifiedError(mode="prod")

    if declared_class is not None:
        if declared_class not in _VALID_CLASSES:
            raise InvalidInputError(field=META_TOOL_CLASS)
        if declared_class != tool_class:
            if entry is not None:
                raise ToolClassDeclarationError(registry_class=tool_class)
            warnings.append(WARNING_DECLARATION_DIFFERS)

    if caller_read_only and tool_class == "write":
        raise ToolClassMismatchError(tool_class=tool_class, heuristic=entry is None)

    if tool_class == "write":
        check_idempotency_key(idempotency_key)

    return Classification(tool_class, entry, entry is None, tuple(warnings))


def check_idempotency_key(idempotency_key: str | None) -> str:
    """The key a write needs: non-blank and within the contract's length."""
    if idempotency_key is None or not idempotency_key.strip():
        raise IdempotencyKeyRequiredError()
    if len(idempotency_key) > MAX_IDEMPOTENCY_KEY_LENGTH:
        raise InvalidInputError(field=IDEMPOTENCY_KEY_FIELD)
    return idempotency_key


def guess_tool_class(
    tool_name: str, read_only_hint: bool | None, destructive_hint: bool | None
) -> tuple[ToolClass, bool]:
    """Dev-only heuristic: ``(class, signals_conflict)``; write whenever in doubt."""
    write_named = has_write_verb(tool_name)
    if read_only_hint is True:
        conflict = destructive_hint is True or write_named
        return ("write" if conflict else "read"), conflict
    return "write", False


def has_write_verb(tool_name: str) -> bool:
    """True when a token of the name (split on ``_ . -`` and camelCase) is a write verb."""
    tokens = (token.lower() for token in _TOKEN.findall(tool_name))
    return any(token in WRITE_VERBS for token in tokens)


__all__ = [
    "IDEMPOTENCY_KEY_FIELD",
    "MAX_IDEMPOTENCY_KEY_LENGTH",
    "META_TOOL_CLASS",
    "WARNING_DECLARATION_DIFFERS",
    "WARNING_HINTS_CONFLICT",
    "WARNING_UNCLASSIFIED",
    "WRITE_VERBS",
    "Classification",
    "check_idempotency_key",
    "classify_call",
    "guess_tool_class",
    "has_write_verb",
]
