r"""A contract schema compiled to plain Python checks, for records validated on every call.

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

Patterns are ECMA-262 regular expressions (JSON Schema 2020-12, 6.3.3), which Python's
``re`` reads differently in ways that matter to an anchored rule: ``$`` also matches
before a final ``\n`` (``^[a-z]+$`` accepts ``"abc\n"``), and ``\d``/``\w`` match every
Unicode digit and letter. ``ecma_regex`` translates those (``$`` to ``\Z``, ``\d`` to
``[0-9]``, ``\w`` to ``[A-Za-z0-9_]``) and both the compiled checks and
``ContractValidator`` (jsonschema with its ``pattern`` keyword on ``ecma_regex``) use it, so
a contract's pattern means what the contract's author wrote.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

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


_ECMA_ESCAPES = {"d": "0-9", "w": "A-Za-z0-9_"}


@lru_cache(maxsize=256)
def ecma_regex(pattern: str) -> re.Pattern[str]:
    r"""``pattern`` read as ECMA-262 reads it (no flags), compiled for ``re``.

    Outside a character class ``$`` becomes ``\Z`` (end of input, never before a final
    newline); ``\d`` and ``\w`` become their ASCII classes, inside or outside one.
    Everything else is passed through: the contracts use nothing where the two differ.
    """
    out: list[str] = []
    in_class = False
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\" and index + 1 < len(pattern):
            escaped = pattern[index + 1]
            ascii_class = _ECMA_ESCAPES.get(escaped)
            if ascii_class is None:
                out.append(char + escaped)
            else:
                out.append(ascii_class if in_class else f"[{ascii_class}]")
            index += 2
            continue
        if in_class:
            in_class = char != "]" or out[-1] in ("[", "[^")
        elif char == "[":
            in_class = True
            if pattern.startswith("[^", index):
                out.append("[^")
                index += 2
                continue
        elif char == "$":
            char = r"\Z"
        out.append(char)
        index += 1
    return re.compile("".join(out))


def _ecma_pattern(
    validator: Any, pattern: str, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not ecma_regex(pattern).search(instance):
        # The rule, never the value: this message may reach a log.
        yield ValidationError("does not match the pattern")


# jsonschema's own validator, with ``pattern`` read the ECMA way (module docstring).
ContractValidator: type[Draft202012Validator] = validators.extend(
    Draft202012Validator, {"pattern": _ecma_pattern}
)


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
    # JSON Schema patterns are not anchored (search), and are ECMA regexes (ecma_regex).
    search = ecma_regex(schema["pattern"]).search if "pattern" in keys else None
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
        for name in needed:
            if name not in value:
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


__all__ = ["Check", "ContractValidator", "compile_contract", "ecma_regex"]
