"""Note frontmatter: the strict split, YAML loaded as js-yaml loads it, canister JSON.

Knowtation splits a note with ``^---\\r?\\n([\\s\\S]*?)\\r?\\n---\\r?\\n([\\s\\S]*)$`` and loads
the block with js-yaml 4 (YAML 1.2 core schema plus timestamps and merge keys; a
duplicate key is an error). Invalid YAML counts as ``{}`` but the block is still removed.
Hosted notes carry frontmatter as JSON text, sometimes encoded twice.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from nexus_mcp.notes.javascript import JsDate, js_trim, to_js_property_key

Frontmatter = dict[str, Any]

_FRONTMATTER_RE = re.compile(r"---\r?\n([\s\S]*?)\r?\n---\r?\n([\s\S]*)\Z")

_NULL_TAG = "tag:yaml.org,2002:null"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_STR_TAG = "tag:yaml.org,2002:str"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MERGE_TAG = "tag:yaml.org,2002:merge"

# js-yaml 4's implicit types, tried in this order on plain scalars only.
_NULL_RE = re.compile(r"~|null|Null|NULL|")
_BOOL_RE = re.compile(r"true|True|TRUE|false|False|FALSE")
_INT_RE = re.compile(
    r"[-+]?(?:0b[01_]*[01]|0x[0-9a-fA-F_]*[0-9a-fA-F]|0o[0-7_]*[0-7]|0"
    r"|0[0-9](?:[0-9_]*[0-9])?|[1-9](?:[0-9_]*[0-9])?)"
)
_FLOAT_RE = re.compile(
    r"(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?"
    r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))"
)
_DATE_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_TIMESTAMP_RE = re.compile(
    r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})(?:[Tt]|[ \t]+)([0-9]{1,2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]*))?(?:[ \t]*(Z|([-+])([0-9]{1,2})(?::([0-9]{2}))?))?"
)
_YAML_LOAD_ERRORS = (yaml.YAMLError, RecursionError, ValueError, TypeError, OverflowError)


def split_frontmatter(content: str) -> tuple[str | None, str]:
    """Return (YAML block or None, body) exactly as Knowtation's pattern splits a note."""
    match = _FRONTMATTER_RE.match(content)
    if match is None:
        return None, content
    return match.group(1), match.group(2)


def load_yaml_frontmatter(block: str) -> Frontmatter:
    """Load a YAML block as js-yaml does; anything invalid or not a mapping is ``{}``."""
    try:
        # js-yaml appends a final line break when missing, which a block scalar keeps.
        text = block if block.endswith(("\n", "\r")) else block + "\n"
        loader = _JsYamlLoader(text)  # the reader already refuses non-printable characters
        try:
            value = loader.get_single_data()
        finally:
            loader.dispose()
    except _YAML_LOAD_ERRORS:
        return {}
    return value if isinstance(value, dict) else {}


def parse_note_frontmatter(content: str) -> tuple[Frontmatter, str]:
    """Split a raw note file into (frontmatter, body before trimming)."""
    block, body = split_frontmatter(content)
    return ({} if block is None else load_yaml_frontmatter(block)), body


def parse_canister_frontmatter(value: object) -> Frontmatter:
    """Knowtation's ``parseCanisterFrontmatter``: an object, or JSON text maybe encoded twice.

    Raises ``ValueError`` where Knowtation's own parse throws (a quoted string that is
    not JSON), which the caller reports as a runtime failure.
    """
    if value is None or isinstance(value, list):
        return {}
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        return {}
    text = js_trim(value)
    if not text or text == "{}":
        return {}
    parsed = _try_parse_object(text)
    if parsed is not None:
        return parsed
    if '\\"' in text:
        parsed = _try_parse_object(text.replace('\\"', '"'))
        if parsed is not None:
            return parsed
    if text.startswith('"') and text.endswith('"'):
        inner = parse_js_json(text)
        parsed = _try_parse_object(inner) if isinstance(inner, str) else None
        if parsed is not None:
            return parsed
    return {}


def parse_js_json(text: str | bytes) -> Any:
    """``JSON.parse``: Python's json without the NaN and Infinity literals JS refuses."""
    return json.loads(text, parse_constant=_refuse_constant)


def _try_parse_object(text: str) -> Frontmatter | None:
    while True:
        try:
            value = parse_js_json(text)
        except (ValueError, RecursionError):
            return None
        if isinstance(value, dict):
            return value
        if not isinstance(value, str):
            return None
        text = js_trim(value)


def _refuse_constant(name: str) -> Any:
    raise ValueError("not JSON")


# --- js-yaml compatible loader ---------------------------------------------------------


class _JsYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with js-yaml 4's scalar resolution, keys and duplicate rule."""

    def resolve(self, kind: type[Node], value: Any, implicit: tuple[bool, bool]) -> Any:
        if kind is ScalarNode and implicit[0]:
            return _resolve_plain_scalar(value)
        return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        # js-yaml lets an anchor be redefined; PyYAML refuses a duplicate anchor.
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if not isinstance(event, AliasEvent) and event.anchor is not None:
            self.anchors.pop(event.anchor, None)
        return super().compose_node(parent, index)

    def construct_js_mapping(self, node: Node) -> Iterator[Frontmatter]:
        data: Frontmatter = {}
        yield data
        if not isinstance(node, MappingNode):
            raise ConstructorError(None, None, "expected a mapping", node.start_mark)
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # merged keys may be overridden by explicit ones
            key = to_js_property_key(self.construct_object(key_node, deep=True))
            if key in seen:
                raise ConstructorError(None, None, "duplicated mapping key", key_node.start_mark)
            seen.add(key)
        self.flatten_mapping(node)  # merged pairs first, so explicit keys win
        for key_node, value_node in node.value:
            key = to_js_property_key(self.construct_object(key_node, deep=True))
            data[key] = self.construct_object(value_node, deep=False)

    def construct_js_null(self, node: Node) -> None:
        self._require_scalar(node, _NULL_RE)

    def construct_js_bool(self, node: Node) -> bool:
        return self._require_scalar(node, _BOOL_RE) in ("true", "True", "TRUE")

    def construct_js_int(self, node: Node) -> float:
        text = self._require_scalar(node, _INT_RE).replace("_", "")
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        base = {"0b": 2, "0x": 16, "0o": 8}.get(digits[:2], 10)
        magnitude = int(digits[2:] if base != 10 else digits, base)
        try:
            return float(sign * magnitude)
        except OverflowError:
            return sign * math.inf

    def construct_js_float(self, node: Node) -> float:
        text = self._require_scalar(node, _FLOAT_RE).replace("_", "").lower()
        sign = -1.0 if text.startswith("-") else 1.0
        digits = text.lstrip("+-")
        if digits == ".inf":
            return sign * math.inf
        if digits == ".nan":
            return math.nan
        return sign * float(digits)

    def construct_js_timestamp(self, node: Node) -> JsDate:
        text = self.construct_scalar(node)  # type: ignore[arg-type]
        date = _DATE_RE.fullmatch(text)
        if date is not None:
            year, month, day = (int(g) for g in date.groups())
            return JsDate.from_utc(year, month - 1, day)
        match = _TIMESTAMP_RE.fullmatch(text)
        if match is None:
            raise ConstructorError(None, None, "not a timestamp", node.start_mark)
        year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
        fraction = int((match.group(7) or "")[:3].ljust(3, "0"))
        result = JsDate.from_utc(year, month - 1, day, hour, minute, second, fraction)
        if match.group(9):
            delta = (int(match.group(10)) * 60 + int(match.group(11) or 0)) * 60_000
            result = result.shifted(delta if match.group(9) == "-" else -delta)
        return result

    def construct_js_set(self, node: Node) -> Iterator[Frontmatter]:
        data: Frontmatter = {}
        yield data
        for key_node, _ in node.value:
            data[to_js_property_key(self.construct_object(key_node, deep=True))] = None

    def construct_js_omap(self, node: Node) -> Iterator[list[Any]]:
        data: list[Any] = []
        yield data
        if not isinstance(node, SequenceNode):
            raise ConstructorError(None, None, "expected a sequence", node.start_mark)
        for item in node.value:
            data.append(self.construct_object(item, deep=True))

    def construct_js_pairs(self, node: Node) -> Iterator[list[Any]]:
        data: list[Any] = []
        yield data
        if not isinstance(node, SequenceNode):
            raise ConstructorError(None, None, "expected a sequence", node.start_mark)
        for item in node.value:
            if not isinstance(item, MappingNode) or len(item.value) != 1:
                raise ConstructorError(None, None, "expected a single pair", item.start_mark)
            key_node, value_node = item.value[0]
            key = to_js_property_key(self.construct_object(key_node, deep=True))
            data.append([key, self.construct_object(value_node, deep=True)])

    def construct_js_merge_value(self, node: Node) -> Any:
        return self.construct_scalar(node)  # type: ignore[arg-type]

    def refuse_tag(self, node: Node) -> None:
        raise ConstructorError(None, None, "unknown tag", node.start_mark)

    def _require_scalar(self, node: Node, pattern: re.Pattern[str]) -> str:
        text = self.construct_scalar(node)  # type: ignore[arg-type]
        if not isinstance(text, str) or pattern.fullmatch(text) is None:
            raise ConstructorError(None, None, "cannot resolve explicit tag", node.start_mark)
        if pattern is _FLOAT_RE and text.endswith("_"):
            raise ConstructorError(None, None, "cannot resolve explicit tag", node.start_mark)
        return text


def _resolve_plain_scalar(value: str) -> str:
    if _NULL_RE.fullmatch(value):
        return _NULL_TAG
    if _BOOL_RE.fullmatch(value):
        return _BOOL_TAG
    if _INT_RE.fullmatch(value):
        return _INT_TAG
    if _FLOAT_RE.fullmatch(value) and not value.endswith("_"):
        return _FLOAT_TAG
    if _DATE_RE.fullmatch(value) or _TIMESTAMP_RE.fullmatch(value):
        return _TIMESTAMP_TAG
    if value == "<<":
        return _MERGE_TAG
    return _STR_TAG


_JsYamlLoader.add_constructor("tag:yaml.org,2002:map", _JsYamlLoader.construct_js_mapping)
_JsYamlLoader.add_constructor(_NULL_TAG, _JsYamlLoader.construct_js_null)
_JsYamlLoader.add_constructor(_BOOL_TAG, _JsYamlLoader.construct_js_bool)
_JsYamlLoader.add_constructor(_INT_TAG, _JsYamlLoader.construct_js_int)
_JsYamlLoader.add_constructor(_FLOAT_TAG, _JsYamlLoader.construct_js_float)
_JsYamlLoader.add_constructor(_TIMESTAMP_TAG, _JsYamlLoader.construct_js_timestamp)
_JsYamlLoader.add_constructor(_MERGE_TAG, _JsYamlLoader.construct_js_merge_value)
_JsYamlLoader.add_constructor("tag:yaml.org,2002:set", _JsYamlLoader.construct_js_set)
_JsYamlLoader.add_constructor("tag:yaml.org,2002:omap", _JsYamlLoader.construct_js_omap)
_JsYamlLoader.add_constructor("tag:yaml.org,2002:pairs", _JsYamlLoader.construct_js_pairs)
_JsYamlLoader.add_constructor("tag:yaml.org,2002:value", _JsYamlLoader.refuse_tag)

__all__ = [
    "Frontmatter",
    "load_yaml_frontmatter",
    "parse_canister_frontmatter",
    "parse_js_json",
    "parse_note_frontmatter",
    "split_frontmatter",
]
