"""Configuration problems in plain words: one line each, naming where and which key.

Every loader of ``nexus.yaml`` (``settings.py`` and the sections ``write_policies``,
``upstreams``, ``repos``, ``approvals``) turns pydantic's errors into lines here, so a
problem reads the same wherever it is found: ``nexus.yaml:4: `search.max_results` should
be a whole number``, ``unknown key `dev_principal.mde`; did you mean `dev_principal.mode`?``.

A line never holds the value that was given (it may be a secret). Keys are printed (they
are the operator's own file), but capped and with control characters escaped, so a key
cannot move the cursor or recolour a terminal. The words come from pydantic's error type
and the field's expected type; pydantic's own message is used only where it is known not
to carry the input.

``${NAME}`` is the one way to name an environment variable inside a secret setting
(``env_reference``); a variable's value is never read for a further ``${...}``.
"""

from __future__ import annotations

import difflib
import functools
import re
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, SecretStr, ValidationError

from nexus_mcp.errors import ConfigError

MAX_KEY_CHARS = 64
# Problems one message lists; the rest are counted. A file of thousands of bad keys
# (a pasted section, a generated file) is answered in a moment, in a screenful.
MAX_PROBLEMS_SHOWN = 50
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_REFERENCE_PATTERN = r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$"
ENV_REFERENCE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Written as text, a secret setting holds either this whole form or no "${" at all.
ENV_REFERENCE_HINT = "name an environment variable as the whole value, ${NAME} (no text around it)"

# The class of a secret given by reference (policy/upstreams.py), known here by name.
REFERENCE_CLASS = "SecretRef"
REFERENCE_WORDS = "a secret reference: ${NAME}, {env: NAME} or {file: PATH}"

Loc = tuple[str | int, ...]

_TYPE_ERRORS = {
    "string_type": "text",
    "string_unicode": "text",
    "string_sub_type": "text",
    "bytes_type": "text",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "int_parsing_size": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "decimal_type": "a number",
    "decimal_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "tuple_type": "a list",
    "set_type": "a list",
    "frozen_set_type": "a list",
    "iterable_type": "a list",
    "dict_type": "a mapping (key: value)",
    "mapping_type": "a mapping (key: value)",
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
    "dataclass_type": "a mapping (key: value)",
    "path_type": "a path",
    "is_instance_of": None,
    "none_required": "empty (null)",
}
_BOUNDS = {
    "greater_than": ("gt", "greater than {}"),
    "greater_than_equal": ("ge", "at least {}"),
    "less_than": ("lt", "less than {}"),
    "less_than_equal": ("le", "at most {}"),
    "multiple_of": ("multiple_of", "a multiple of {}"),
}
_URL_ERRORS = ("url_type", "url_parsing", "url_syntax_violation", "url_too_long", "url_scheme")


def problem_line(origin: str, key: str, words: str) -> str:
    """``origin: `key` words`` (``words`` from ``phrase_for``; a leading ``:`` when they
    are a validator's own sentence)."""
    said = f"`{key}`" if key else ""
    if words.startswith(":"):
        said = f"{said}{words}" if said else words[1:].strip()
    else:
        said = f"{said} {words}" if said else words
    return f"{origin}: {said}" if origin else said


def safe_text(value: object, limit: int = MAX_KEY_CHARS) -> str:
    """``value`` as one printable line: control, format and other unprintable characters
    (ANSI escapes, newlines, bidirectional overrides) escaped; at most ``limit`` characters."""
    text = str(value)
    cut = len(text) > limit
    out = []
    for char in text[:limit]:
        if char.isprintable() and char != "`":
            out.append(char)
        elif char == "`":
            out.append("'")
        else:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out) + ("..." if cut else "")


def env_reference(value: object) -> str | None:
    """The variable a secret setting names as ``${NAME}`` (the whole value), else None.

    ``ValueError`` for text that holds ``${`` in any other way (``Bearer ${T}``,
    ``${A:-b}``), which would otherwise be taken as the secret itself."""
    if not isinstance(value, str) or "${" not in value:
        return None
    found = ENV_REFERENCE_RE.fullmatch(value.strip())
    if found is None:
        raise ValueError(ENV_REFERENCE_HINT)
    return found.group(1)


def describe_type(annotation: Any) -> str | None:
    """What a value of ``annotation`` looks like, in words (None: no plain word for it)."""
    branches = branches_of(annotation)
    if not branches:
        return None
    if any(getattr(b, "__name__", "") == REFERENCE_CLASS for b in branches):
        return REFERENCE_WORDS
    if len(branches) > 1:
        words = [w for w in (describe_type(b) for b in branches) if w]
        return " or ".join(dict.fromkeys(words)) or None
    (kind,) = branches
    origin = get_origin(kind)
    if origin is Literal:
        return "one of: " + ", ".join(str(choice) for choice in get_args(kind))
    if origin in (list, tuple, set, frozenset) or kind in (list, tuple, set, frozenset):
        return "a list"
    if origin in (dict, Mapping) or kind is dict:
        return "a mapping (key: value)"
    if isinstance(kind, type):
        if issubclass(kind, bool):
            return "true or false"
        if issubclass(kind, int):
            return "a whole number"
        if issubclass(kind, float):
            return "a number"
        if issubclass(kind, str | SecretStr):
            return "text"
        if issubclass(kind, Path):
            return "a path"
        if issubclass(kind, BaseModel):
            return "a mapping (key: value)"
    return None


def phrase_for(error: Mapping[str, Any], annotation: Any = None) -> str:
    """The plain words for one pydantic error about a field of ``annotation``."""
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind in ("literal_error", "enum"):
        words = describe_type(annotation)
        if words and words.startswith("one of"):
            return f"should be {words}"
        return f"should be one of: {ctx.get('expected', '')}".rstrip(": ")
    if kind in _TYPE_ERRORS:
        words = describe_type(annotation) or _TYPE_ERRORS[kind]
        if kind == "int_from_float":
            words = "a whole number"
        return f"should be {words}" if words else "has the wrong type"
    if kind in _BOUNDS:
        name, template = _BOUNDS[kind]
        return "should be " + template.format(_number(ctx.get(name)))
    if kind in ("string_too_short", "too_short"):
        least = ctx.get("min_length", 1)
        if least == 1:
            return "should not be empty"
        unit = "characters" if kind.startswith("string") else "items"
        return f"should have at least {least} {unit}"
    if kind in ("string_too_long", "too_long"):
        unit = "characters" if kind.startswith("string") else "items"
        return f"should have at most {ctx.get('max_length')} {unit}"
    if kind == "string_pattern_mismatch":
        return f"should match the pattern {ctx.get('pattern')}"
    if kind in _URL_ERRORS:
        return "should be a URL (https://...)"
    if kind == "finite_number":
        return "should be a finite number"
    if kind == "json_invalid":
        return "should be valid JSON"
    if kind in ("value_error", "assertion_error"):
        # Our own validators' words: they name settings, never the value given.
        return ": " + str(ctx.get("error", "is not valid")).strip()
    return f"is not valid ({kind})"


def problems_from(
    exc: ValidationError,
    model: type[BaseModel],
    *,
    prefix: Loc = (),
    known_extra: Iterable[str] = (),
    label: Callable[[Loc], str | None] | None = None,
) -> list[tuple[Loc, str]]:
    """``(location, words)`` for every problem in ``exc`` (raised by ``model``), one per
    location, the key named in the words: union branches and pydantic's validator steps
    are folded away. Put ``problem_line``'s origin in front.

    ``prefix`` is where ``model`` sits in the file (``("upstreams",)``); ``known_extra``
    adds names valid at the top level that ``model`` does not hold (for suggestions);
    ``label`` may name a list item (``upstreams[0]`` as ``upstreams.fs``)."""
    found: dict[Loc, list[tuple[dict[str, Any], Any, Any]]] = {}
    deeper: set[Loc] = set()
    for error in exc.errors(include_url=False, include_input=False):
        loc, annotation, owner, tagged_at = _walk(model, tuple(error["loc"]))
        if tagged_at is not None and len(loc) > len(tagged_at):
            deeper.add(tagged_at)
        found.setdefault(loc, []).append((dict(error), annotation, owner))
    problems: list[tuple[Loc, str]] = []
    for loc, errors in found.items():
        full = (*prefix, *loc)
        real = [e for e in errors if e[0]["type"] not in _TYPE_ERRORS]
        if not real and loc in deeper:
            continue  # a union branch failed further in; that failure is the problem
        first, annotation, owner = (real or errors)[0]
        if first["type"] in ("extra_forbidden", "invalid_key") and full:
            names = _names(owner, known_extra if len(loc) == 1 else ())
            at = render_key(full[:-1], label)
            problems.append((full, unknown_key_words(full[-1], names, at=at)))
            continue
        if not real and len(errors) > 1:
            described = describe_type(annotation)
            text = f"should be {described}" if described else phrase_for(first, annotation)
        else:
            text = phrase_for(first, annotation)
        problems.append((full, problem_line("", render_key(full, label), text)))
    return problems


def unknown_key_words(key: object, known: Sequence[str], at: str = "") -> str:
    """``unknown key `dev_principal.mde`; did you mean `dev_principal.mode`?`` (``at``:
    the rendered place of the key's mapping; the guess, the closest schema name)."""
    guess = difflib.get_close_matches(str(key).lower(), [n.lower() for n in known], 1, 0.6)
    place = f"{at}." if at else ""
    words = f"unknown key `{place}{safe_text(key)}`"
    if guess:
        name = next(n for n in known if n.lower() == guess[0])
        words += f"; did you mean `{place}{name}`?"
    return words


def render_key(loc: Loc, label: Callable[[Loc], str | None] | None = None) -> str:
    """``a.b[0].c`` with every part escaped; ``label`` may replace ``[0]`` by ``.name``."""
    out = ""
    for position, part in enumerate(loc):
        if isinstance(part, int):
            name = label(loc[: position + 1]) if label is not None else None
            out += f".{safe_text(name)}" if name else f"[{part}]"
        else:
            out += ("." if out else "") + safe_text(part)
    return out


def format_problems(lines: Sequence[str]) -> str:
    """The ``ConfigError`` message: the one problem as it is, or a count and then one
    problem per line."""
    unique = list(dict.fromkeys(lines))
    if len(unique) == 1:
        return unique[0]
    shown = unique[:MAX_PROBLEMS_SHOWN]
    more = len(unique) - len(shown)
    tail = f"\n  ... and {more} more problems" if more else ""
    return f"invalid configuration ({len(unique)} problems):\n  " + "\n  ".join(shown) + tail


PROBLEMS_HEAD = "invalid configuration ("


def split_problems(message: str) -> list[str]:
    """The problem lines of a ``format_problems`` message (its inverse), so the problems
    of several loaders can be reported together, each once."""
    head, _, rest = message.partition("\n  ")
    if head.startswith(PROBLEMS_HEAD) and head.endswith("problems):") and rest:
        return rest.split("\n  ")
    return [message]


def yaml_line(text: str, loc: Loc) -> int | None:
    """The 1-based line of ``loc`` in the YAML ``text`` (its key's line), or None."""
    node: Any = _composed(text)
    if node is None:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((kv for kv in node.value if _is_key(kv[0], part)), None)
            if match is None:
                return line
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                return line
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


@functools.lru_cache(maxsize=4)
def _composed(text: str) -> Any:
    """The YAML node tree of ``text``, composed once for all the problems of one file
    (composing it again for each problem made a file of many problems take minutes)."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None


def file_origin(file: Path | None, text: str | None, loc: Loc) -> str:
    """``nexus.yaml:4`` (or just the file when the line is unknown); "" without a file."""
    if file is None:
        return ""
    line = yaml_line(text, loc) if text is not None else None
    return f"{file}:{line}" if line is not None else str(file)


def located_lines(problems: Iterable[tuple[Loc, str]], source: Path | None) -> list[str]:
    """Each problem as ``file:line: words`` (the file read once, for the lines)."""
    text = None
    if source is not None:
        try:
            text = source.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = None
    return [problem_line(file_origin(source, text, loc), "", words) for loc, words in problems]


def refuse(problems: Sequence[tuple[Loc, str]], source: Path | None) -> ConfigError:
    """The ``ConfigError`` that lists ``problems``, located in ``source``."""
    return ConfigError(format_problems(located_lines(problems, source)))


def _is_key(node: Any, part: str | int) -> bool:
    if node.value == str(part):
        return True
    if isinstance(part, str) or not isinstance(node, yaml.ScalarNode):
        return False
    try:  # a key that is not text (``5``, ``null``, ``true``): compare what it reads as
        return bool(yaml.safe_load(node.value) == part)
    except yaml.YAMLError:
        return False


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _unwrap(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def branches_of(annotation: Any) -> list[Any]:
    """The types ``annotation`` allows, ``Annotated`` and ``None`` left out."""
    annotation = _unwrap(annotation)
    if annotation is None:
        return []
    if get_origin(annotation) in (Union, types.UnionType):
        out: list[Any] = []
        for branch in get_args(annotation):
            out.extend(b for b in branches_of(branch) if b is not type(None))
        return out
    return [] if annotation is type(None) else [annotation]


def _walk(model: type[BaseModel], loc: Loc) -> tuple[Loc, Any, type[BaseModel] | None, Loc | None]:
    """Follow ``loc`` through ``model``: the location without pydantic's step names, the
    annotation of that key, the model that holds the last key, and where a union branch was
    taken (None when none was)."""
    kept: list[str | int] = []
    annotation: Any = model
    owner: type[BaseModel] | None = None
    tagged_at: Loc | None = None
    at_key: Any = model  # the annotation at the last kept part (before any union branch)
    for part in loc:
        branches = branches_of(annotation)
        if isinstance(part, int):
            sequence = next((b for b in branches if get_origin(b) in (list, tuple, set)), None)
            kept.append(part)
            annotation = at_key = get_args(sequence)[0] if sequence is not None else None
            continue
        holder = next(
            (b for b in branches if isinstance(b, type) and issubclass(b, BaseModel)), None
        )
        if holder is not None and part in holder.model_fields:
            kept.append(part)
            owner, annotation = holder, holder.model_fields[part].annotation
            at_key = annotation
            continue
        mapping = next((b for b in branches if get_origin(b) in (dict, Mapping)), None)
        if mapping is not None:
            kept.append(part)
            annotation = at_key = get_args(mapping)[1]
            continue
        if len(branches) > 1:  # pydantic's name for a union branch: not a key
            tagged_at = tuple(kept)
            picked = [b for b in branches if _is_branch(b, part)]
            annotation = picked[0] if picked else annotation
            continue
        if holder is not None:  # a key the model does not have
            owner = holder
        kept.append(part)
        annotation = at_key = None
    return tuple(kept), at_key, owner, tagged_at


def _is_branch(branch: Any, tag: str) -> bool:
    name = getattr(branch, "__name__", "")
    return bool(name) and (tag == name or tag.endswith(f"{name}]") or tag == name.lower())


def _names(owner: Any, known_extra: Iterable[str]) -> list[str]:
    names = list(known_extra)
    if isinstance(owner, type) and issubclass(owner, BaseModel):
        for name, info in owner.model_fields.items():
            names.append(name)
            if isinstance(info.alias, str):
                names.append(info.alias)
    return names


__all__ = [
    "ENV_REFERENCE_HINT",
    "ENV_REFERENCE_PATTERN",
    "ENV_REFERENCE_RE",
    "MAX_KEY_CHARS",
    "Loc",
    "branches_of",
    "describe_type",
    "env_reference",
    "file_origin",
    "format_problems",
    "located_lines",
    "phrase_for",
    "problem_line",
    "problems_from",
    "refuse",
    "render_key",
    "safe_text",
    "unknown_key_words",
    "yaml_line",
]
