"""A contract schema compiled to plain Python checks, for records validated on every call.

jsonschema walks the schema on every pass (about 130 us for a ``tool_call`` record, a
tenth of a whole in-memory ``tools/call``; ``benchmarks/bench_chain.py`` missed its
1.10x target with it). ``compile_contract`` turns the small subset of JSON Schema the
record contracts use (``type``, ``properties``/``required``/``additionalProperties:
false``, ``items``/``minItems``/``maxItems``, ``minLength``/``maxLength``/``pattern``,
string ``enum``/``const``, ``allOf``; annotations ignored; local ``$ref`` already written
in place) into nested closures built once, and returns ``None`` for a schema with any
other keyword, so the caller falls back to jsonschema rather than guess. It answers only
valid or not; jsonschema stays the authority that says why (``best_match``). A unit test
compares the two on generated records.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "title", "description", "examples"})
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


class _Unsupported(Exception):
    pass


def compile_contract(schema: Mapping[str, Any]) -> Check | None:
    """A check equal to the schema's verdict, or ``None`` when the schema leaves the subset."""
    try:
        return _compile(schema)
    except _Unsupported:
        return None


def _compile(schema: Any) -> Check:
    if schema is True:
        return lambda value: True
    if not isinstance(schema, dict):
        raise _Unsupported
    checks: list[Check] = []
    keys = set(schema) - _ANNOTATIONS
    if "type" in keys:
        kind = schema["type"]
        if not isinstance(kind, str) or kind not in _TYPES:
            raise _Unsupported
        checks.append(_TYPES[kind])
    if "enum" in keys or "const" in keys:
        allowed = schema["enum"] if "enum" in keys else [schema["const"]]
        if not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
            raise _Unsupported
        options = frozenset(allowed)
        checks.append(lambda v: isinstance(v, str) and v in options)
    checks += _string_checks(schema, keys)
    checks += _array_checks(schema, keys)
    checks += _object_checks(schema, keys)
    if "allOf" in keys:
        checks.append(_every([_compile(part) for part in schema["allOf"]]))
    known = {"type", "enum", "const", "allOf", "minLength", "maxLength", "pattern"}
    known |= {"items", "minItems", "maxItems", "properties", "required", "additionalProperties"}
    if keys - known:
        raise _Unsupported
    return _every(checks)


def _every(checks: list[Check]) -> Check:
    """One check that holds when each holds (a plain loop: this runs on every call)."""
    if not checks:
        return lambda value: True
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:  # the common case: a type and one rule
        first, second = checks
        return lambda value: first(value) and second(value)

    def every(value: Any) -> bool:
        for check in checks:  # noqa: SIM110 - a plain loop: no generator on every call
            if not check(value):
                return False
        return True

    return every


def _string_checks(schema: dict[str, Any], keys: set[str]) -> list[Check]:
    checks: list[Check] = []
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    if not isinstance(low, int) or (high is not None and not isinstance(high, int)):
        raise _Unsupported
    bounded = "minLength" in keys or "maxLength" in keys
    top = high if high is not None else -1
    # JSON Schema patterns are not anchored: re.search, as jsonschema does.
    search = re.compile(schema["pattern"]).search if "pattern" in keys else None
    if bounded or search is not None:

        def string_rules(value: Any) -> bool:
            if not isinstance(value, str):
                return True
            if bounded and (len(value) < low or (top >= 0 and len(value) > top)):
                return False
            return search is None or search(value) is not None

        checks.append(string_rules)
    return checks


def _array_checks(schema: dict[str, Any], keys: set[str]) -> list[Check]:
    checks: list[Check] = []
    low, high = schema.get("minItems", 0), schema.get("maxItems")
    if not isinstance(low, int) or (high is not None and not isinstance(high, int)):
        raise _Unsupported
    if "minItems" in keys or "maxItems" in keys:
        top = high if high is not None else -1
        checks.append(
            lambda v: not isinstance(v, list) or (len(v) >= low and (top < 0 or len(v) <= top))
        )
    if "items" in keys:
        item = _compile(schema["items"])

        def each(value: Any) -> bool:
            if isinstance(value, list):
                for element in value:
                    if not item(element):
                        return False
            return True

        checks.append(each)
    return checks


def _object_checks(schema: dict[str, Any], keys: set[str]) -> list[Check]:
    checks: list[Check] = []
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if (
        not isinstance(properties, dict)
        or not isinstance(required, list)
        or extra
        not in (
            True,
            False,
        )
    ):
        raise _Unsupported
    compiled = {name: _compile(sub) for name, sub in properties.items()}
    needed = tuple(required)
    closed = extra is False

    def check_object(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        if any(name not in value for name in needed):
            return False
        for name, item in value.items():
            sub = compiled.get(name)
            if sub is None:
                if closed:
                    return False
            elif not sub(item):
                return False
        return True

    if keys & {"properties", "required", "additionalProperties"}:
        checks.append(check_object)
    return checks


__all__ = ["Check", "compile_contract"]
