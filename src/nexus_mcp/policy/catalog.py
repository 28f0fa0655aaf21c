"""An upstream's prompts, resources and resource templates: what they are pinned by.

Tools are not all an MCP server offers: its prompts are text the caller's model reads
(the same injection channel as a tool's description), its resources and resource
templates carry a name, a description and a URI the model sees. So each of them is pinned
like a tool (``policy/pins.py``): the sha256 of its canonical definition is kept in the
upstream's lock file, under its own kind, and a listed item whose definition differs from
its pin, or that has none, is quarantined (hidden, and refused as an unknown one).

The canonical definition of each kind is the JSON object of its definition fields
(absent fields as ``null``) as canonical JSON, like a tool's:

- a prompt: ``name``, ``title``, ``description``, ``arguments``;
- a resource template: ``uriTemplate``, ``name``, ``title``, ``description``,
  ``mimeType``, ``annotations``;
- a resource: ``uri``, ``name``, ``title``, ``description``, ``mimeType``,
  ``annotations`` (not ``size``: a file that grows is not a new definition).

An item is known by its key (a prompt's name, a template's ``uriTemplate``, a resource's
``uri``). Upstream items are exposed under names of nexus's own: a prompt under the
upstream's tool prefix (``<prefix><name>``), a resource or template under
``upstream://<server_id>/<its own URI>`` (plain concatenation: the upstream's URI, and a
template's variables, stay readable and expand as they did).

Each listed item is screened (``item_problem``) before it is pinned or shown: its key
must follow its rule (a prompt name MCP's tool-name rule; a URI a scheme, at most
``MAX_URI_CHARS``, no whitespace or control character), its text fields must be strings
of bounded size, a prompt's arguments a list of named objects. What breaks a rule is never
exposed and is reported by position and digest, never by its text.

No FastMCP here: callers pass the MCP wire form (camelCase keys).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import AnyUrl

from nexus_mcp.policy.hashing import sha256_hex, to_canonical_json
from nexus_mcp.policy.profiles import TOOL_NAME_RE

UPSTREAM_RESOURCE_SCHEME = "upstream"
MAX_URI_CHARS = 2048
MAX_TEXT_CHARS = 32 * 1024  # a description, a title, a name
MAX_ITEM_BYTES = 256 * 1024  # one canonical definition
MAX_PROMPT_ARGUMENTS = 64
MAX_TEMPLATE_VARIABLES = 8
_VARIABLE_RE = re.compile(r"\{[+#./;?&]?[A-Za-z0-9_.]{1,64}\*?(?:,[A-Za-z0-9_.]{1,64}\*?)*\}")
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
# A URI or template: a scheme, then anything but whitespace and control characters
# (the C0 and C1 sets, DEL, and the bidi and zero-width format characters).
_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]{0,31}:[^\s\x00-\x1f\x7f-\x9f]*$")
_FORMAT_CHARS = re.compile("[\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


class Kind(StrEnum):
    """The kinds of upstream item pinned beside tools (also the lock file's keys)."""

    PROMPT = "prompts"
    RESOURCE_TEMPLATE = "resource_templates"
    RESOURCE = "resources"


FIELDS: Mapping[Kind, tuple[str, ...]] = {
    Kind.PROMPT: ("name", "title", "description", "arguments"),
    Kind.RESOURCE_TEMPLATE: (
        "uriTemplate",
        "name",
        "title",
        "description",
        "mimeType",
        "annotations",
    ),
    Kind.RESOURCE: ("uri", "name", "title", "description", "mimeType", "annotations"),
}
KEY_FIELD: Mapping[Kind, str] = {
    Kind.PROMPT: "name",
    Kind.RESOURCE_TEMPLATE: "uriTemplate",
    Kind.RESOURCE: "uri",
}
# What a lock file entry's key must look like, per kind (``policy/pins.py`` reads it).
SINGULAR: Mapping[Kind, str] = {
    Kind.PROMPT: "prompt",
    Kind.RESOURCE_TEMPLATE: "resource template",
    Kind.RESOURCE: "resource",
}


def canonical_item(kind: Kind, item: Mapping[str, Any]) -> bytes:
    """The bytes an item's definition is pinned by (module docstring)."""
    return to_canonical_json({name: item.get(name) for name in FIELDS[kind]})


def item_digest(kind: Kind, item: Mapping[str, Any]) -> str:
    return sha256_hex(canonical_item(kind, item))


def key_ok(kind: Kind, key: Any) -> bool:
    """Whether ``key`` may name an item of ``kind`` (in a listing or a lock file)."""
    if not isinstance(key, str):
        return False
    if kind is Kind.PROMPT:
        return TOOL_NAME_RE.fullmatch(key) is not None
    return (
        len(key) <= MAX_URI_CHARS
        and _URI_RE.fullmatch(key) is not None
        and _FORMAT_CHARS.search(key) is None
        # No invisible or unpaired character a model would read and a person would not
        # see (soft hyphen, tag characters, Arabic letter mark, surrogates, ...).
        and not any(unicodedata.category(c) in _HIDDEN_CATEGORIES for c in key)
    )


def template_problem(template: str) -> str | None:
    """Why a resource template cannot be exposed. Its variables are matched by regular
    expressions (``{v}`` as ``[^/]+``, ``{v*}`` as ``.+``), so two variables in one path
    segment (``{a}{b}``, ``{a}-{b}``), more than one ``*`` or many variables make a read
    of a crafted URI take polynomial-to-exponential time, the gateway's event loop with
    it: at most one variable per segment, one ``*``, ``MAX_TEMPLATE_VARIABLES`` in all
    (query expressions ``{?q}`` and ``{&q}`` aside)."""
    variables = _VARIABLE_RE.findall(template)
    if len(variables) > MAX_TEMPLATE_VARIABLES or template.count("{") != len(variables):
        return "template_variables"
    path = [v for v in variables if v[1] not in "?&"]
    if sum(v.endswith("*}") for v in path) > 1:
        return "template_variables"  # two ``.+``: quadratic and worse
    for segment in _VARIABLE_RE.sub(lambda m: m.group(0).replace("/", ""), template).split("/"):
        # At most one variable between two slashes: two ``[^/]+`` in one segment
        # (``{a}-{b}``) make a failed match try every split of it.
        if sum(1 for v in _VARIABLE_RE.findall(segment) if v[1] not in "?&") > 1:
            return "template_variables"
    return None


def uri_stays(uri: str) -> bool:
    """A resource is exposed (and read) under a URI that the URI library keeps as it is:
    one it would rewrite (``x:a/../../y`` becomes ``y``, ``x:é`` is percent-encoded)
    would be listed as another URI than the one that reads it."""
    exposed = exposed_uri("server", uri)
    try:
        return str(AnyUrl(exposed)) == exposed
    except ValueError:
        return False


def item_problem(
    kind: Kind, item: Mapping[str, Any], counts: Mapping[Any, int], canonical: bytes
) -> str | None:
    """Why a listed item can be neither pinned nor exposed; None when it can."""
    key = item.get(KEY_FIELD[kind])
    if not key_ok(kind, key):
        return "key_rule"
    if counts.get(key, 0) > 1:
        return "duplicate_key"
    for name in ("name", "title", "description", "mimeType"):
        value = item.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > MAX_TEXT_CHARS):
            return f"{name}_type"
    if kind is not Kind.PROMPT and not isinstance(item.get("name"), str):
        return "name_type"
    annotations = item.get("annotations")
    if annotations is not None and not isinstance(annotations, dict):
        return "annotations_type"
    if kind is Kind.PROMPT and _arguments_problem(item.get("arguments")):
        return "arguments"
    if kind is Kind.RESOURCE_TEMPLATE and template_problem(str(key)):
        return "template_variables"
    if kind is Kind.RESOURCE and not uri_stays(str(key)):
        return "key_rule"
    if len(canonical) > MAX_ITEM_BYTES:
        return "definition_size"
    return None


def _arguments_problem(arguments: Any) -> bool:
    if arguments is None:
        return False
    if not isinstance(arguments, list) or len(arguments) > MAX_PROMPT_ARGUMENTS:
        return True
    names: set[str] = set()
    for argument in arguments:
        if not isinstance(argument, dict):
            return True
        name = argument.get("name")
        if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name) or name in names:
            return True
        names.add(name)
        description = argument.get("description")
        if description is not None and not isinstance(description, str):
            return True
        if not isinstance(argument.get("required", False), bool | None):
            return True
    return False


def exposed_uri(server_id: str, uri: str) -> str:
    """The URI (or template) an upstream's resource is exposed under."""
    return f"{UPSTREAM_RESOURCE_SCHEME}://{server_id}/{uri}"


def backend_uri(server_id: str, exposed: str) -> str | None:
    """The upstream's own URI behind an exposed one; None when it is not this upstream's."""
    prefix = f"{UPSTREAM_RESOURCE_SCHEME}://{server_id}/"
    if not exposed.startswith(prefix):
        return None
    return exposed[len(prefix) :] or None


__all__ = [
    "FIELDS",
    "KEY_FIELD",
    "MAX_ITEM_BYTES",
    "MAX_URI_CHARS",
    "SINGULAR",
    "UPSTREAM_RESOURCE_SCHEME",
    "Kind",
    "backend_uri",
    "canonical_item",
    "exposed_uri",
    "item_digest",
    "item_problem",
    "key_ok",
]
