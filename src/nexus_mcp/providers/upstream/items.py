"""An upstream's prompts, resources and resource templates as FastMCP holds them.

Each is an ordinary FastMCP component, so the server's middleware chain (grants,
audit, envelope) runs for it exactly as for a native one. What it does when run is
``catalog.py``'s ``forward_*``: on the caller's own upstream session (never another
principal's), within the upstream's call timeout, its answer checked for shape and size
and never echoed when it is wrong. The upstream's own ``_meta`` is not passed on.

Every resource content carries ``_meta["nexus/sha256"]``: the sha256 of its bytes (the
UTF-8 of a text, the decoded bytes of a blob), as read tools' documents carry theirs. Texts
are scanned for secrets first (``scanned_resource``, ``scanned_prompt``: output scanning),
so the hash is of what the caller receives.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from fastmcp.prompts import Message, Prompt, PromptResult
from fastmcp.prompts.base import PromptArgument
from fastmcp.resources import Resource, ResourceTemplate
from fastmcp.resources.base import ResourceContent, ResourceResult
from fastmcp.utilities.tasks import TaskConfig
from mcp_types import (
    AudioContent,
    BlobResourceContents,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)
from pydantic import AnyUrl

from nexus_mcp.connector import block_text
from nexus_mcp.errors import DocSizeExceededError
from nexus_mcp.policy.catalog import Kind, backend_uri, key_ok
from nexus_mcp.policy.documents import MAX_READ_LIMIT_NAME
from nexus_mcp.policy.hashing import sha256_hex, to_canonical_json
from nexus_mcp.policy.pins import PinState
from nexus_mcp.providers.upstream.sessions import UpstreamFailure

SHA256_META = "nexus/sha256"
# A media type as RFC 6838 names them (parameters allowed, printable ASCII, bounded): an
# upstream's other text in ``mimeType`` is dropped, never passed on to the caller.
_MIME_RE = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}(;[ -~]{0,128})?$"
)
MAX_CONTENTS = 1000  # content items of one read or one prompt's messages


@dataclass(frozen=True)
class ItemView:
    """What nexus decided about one prompt, resource or template an upstream lists."""

    kind: Kind
    key: str  # the upstream's own name, uri or uriTemplate
    exposed: str | None  # what callers see it as
    definition: Mapping[str, Any]
    digest: str
    pin_state: PinState
    status: Literal["exposed", "quarantined", "not_allowed", "bad_name"]
    reason: str | None = None


class ItemHost(Protocol):
    """What the components need of their upstream (``catalog.UpstreamCatalog``)."""

    server_id: str

    async def read_resource(self, view: ItemView, backend_uri: str) -> ResourceResult: ...

    async def render_prompt(self, view: ItemView, arguments: dict[str, Any]) -> PromptResult: ...


_FORBIDDEN = TaskConfig(mode="forbidden")


class UpstreamPrompt(Prompt):
    task_config: TaskConfig = _FORBIDDEN
    _host: Any = None
    _view: Any = None

    @classmethod
    def for_view(cls, host: ItemHost, view: ItemView) -> UpstreamPrompt:
        d = view.definition
        arguments = [
            PromptArgument(
                name=a["name"], description=a.get("description"), required=bool(a.get("required"))
            )
            for a in d.get("arguments") or []
        ]
        prompt = cls(
            name=view.exposed or view.key,
            title=d.get("title"),
            description=d.get("description"),
            arguments=arguments,
            task_config=_FORBIDDEN,
        )
        prompt._host, prompt._view = host, view
        return prompt

    async def render(self, arguments: dict[str, Any] | None = None) -> PromptResult:
        host: ItemHost = self._host
        return await host.render_prompt(self._view, dict(arguments or {}))


class UpstreamResource(Resource):
    task_config: TaskConfig = _FORBIDDEN
    _host: Any = None
    _view: Any = None
    _backend: str | None = None

    @classmethod
    def for_view(
        cls, host: ItemHost, view: ItemView, *, uri: str | None = None, backend: str | None = None
    ) -> UpstreamResource:
        d = view.definition
        resource = cls(
            uri=AnyUrl(uri or view.exposed or ""),
            name=str(d.get("name") or view.key),
            title=d.get("title"),
            description=d.get("description"),
            mime_type=media_type(d.get("mimeType")) or "text/plain",
            task_config=_FORBIDDEN,
        )
        resource._host, resource._view = host, view
        resource._backend = backend or view.key
        return resource

    async def read(self) -> ResourceResult:
        host: ItemHost = self._host
        return await host.read_resource(self._view, self._backend or self._view.key)


class UpstreamTemplate(ResourceTemplate):
    task_config: TaskConfig = _FORBIDDEN
    _host: Any = None
    _view: Any = None

    @classmethod
    def for_view(cls, host: ItemHost, view: ItemView) -> UpstreamTemplate:
        d = view.definition
        template = cls(
            uri_template=view.exposed or "",
            name=str(d.get("name") or view.key),
            title=d.get("title"),
            description=d.get("description"),
            mime_type=media_type(d.get("mimeType")) or "text/plain",
            parameters={},
            task_config=_FORBIDDEN,
        )
        template._host, template._view = host, view
        return template

    async def create_resource(
        self, uri: str, params: dict[str, Any], context: Any = None
    ) -> UpstreamResource:
        # The upstream's URI is the one asked for, less the exposed prefix: exactly what
        # matched the exposed template, never a re-expansion of the parameters.
        backend = backend_uri(self._host.server_id, str(uri)) or ""
        return UpstreamResource.for_view(self._host, self._view, uri=str(uri), backend=backend)


def media_type(value: Any) -> str | None:
    """``value`` when it is a media type (``_MIME_RE``), else None."""
    return value if isinstance(value, str) and _MIME_RE.fullmatch(value) else None


def to_resource_result(raw: Any, max_bytes: int) -> ResourceResult:
    """The upstream's ReadResourceResult, checked (never echoed) and hashed per content."""
    try:
        items = list(raw.contents or [])
        if not items or len(items) > MAX_CONTENTS:
            raise ValueError("contents")
        contents: list[ResourceContent] = []
        total = 0
        for item in items:
            if isinstance(item, TextResourceContents):
                body: str | bytes = item.text
                data = item.text.encode("utf-8", "surrogatepass")
            elif isinstance(item, BlobResourceContents):
                data = base64.b64decode(item.blob, validate=True)
                body = data
            else:
                raise TypeError("content kind")
            total += len(data)
            if total > max_bytes:
                raise DocSizeExceededError(limit_name=MAX_READ_LIMIT_NAME, limit_bytes=max_bytes)
            mime = media_type(item.mime_type)
            contents.append(
                ResourceContent(content=body, mime_type=mime, meta={SHA256_META: sha256_hex(data)})
            )
    except DocSizeExceededError:
        raise
    except (ValueError, TypeError, AttributeError, binascii.Error, UnicodeError):
        raise UpstreamFailure("error", "bad_result").to_error() from None
    return ResourceResult(contents=contents)


TextScan = Callable[[list[str]], list[str]]


def scanned_resource(result: ResourceResult, scan: TextScan) -> ResourceResult:
    """``result`` with its text contents as output scanning lets them leave, each hash made
    again from the text delivered; blob contents pass as they are (binary)."""
    texts = [c.content for c in result.contents if isinstance(c.content, str)]
    delivered = scan(texts)
    if delivered is texts:
        return result
    given = iter(delivered)
    contents = []
    for item in result.contents:
        if isinstance(item.content, str):
            text = next(given)
            data = text.encode("utf-8", "surrogatepass")
            item = ResourceContent(
                content=text, mime_type=item.mime_type, meta={SHA256_META: sha256_hex(data)}
            )
        contents.append(item)
    return ResourceResult(contents=contents)


def scanned_prompt(result: PromptResult, scan: TextScan) -> PromptResult:
    """``result`` with its messages' texts (text and embedded text resources) and its
    description as output scanning lets them leave; images, audio and blobs pass."""
    texts: list[str] = []
    for message in result.messages:
        text = block_text(message.content)
        if text is not None:
            texts.append(text)
    if result.description is not None:
        texts.append(result.description)
    delivered = scan(texts)
    if delivered is texts:
        return result
    given = iter(delivered)
    messages = []
    for message in result.messages:
        content = message.content
        if isinstance(content, TextContent):
            content = TextContent(type="text", text=next(given))
        elif isinstance(content, EmbeddedResource) and isinstance(
            content.resource, TextResourceContents
        ):
            inner = content.resource.model_copy(update={"text": next(given)})
            content = EmbeddedResource(type="resource", resource=inner)
        messages.append(Message(content=content, role=message.role))
    description = next(given) if result.description is not None else None
    return PromptResult(messages=messages, description=description)


def to_prompt_result(raw: Any, max_bytes: int) -> PromptResult:
    """The upstream's GetPromptResult, checked for shape and size (never echoed), each
    message rebuilt from the fields MCP defines for its kind: the upstream's ``_meta`` and
    ``annotations`` (text a model may read, that no pin covered) are not passed on, and a
    ``resource_link`` (a URI and a description of the upstream's choosing) refuses it."""
    try:
        messages = list(raw.messages or [])
        if len(messages) > MAX_CONTENTS:
            raise ValueError("messages")
        kept = [Message(content=_content(m.content), role=_role(m.role)) for m in messages]
        dumped = [m.content.model_dump(mode="json", by_alias=True) for m in kept]
        description = raw.description if isinstance(raw.description, str) else None
        size = len(to_canonical_json([dumped, description]))
    except (ValueError, TypeError, AttributeError, binascii.Error):
        raise UpstreamFailure("error", "bad_result").to_error() from None
    if size > max_bytes:
        raise DocSizeExceededError(limit_name=MAX_READ_LIMIT_NAME, limit_bytes=max_bytes)
    return PromptResult(messages=kept, description=description)


def _role(role: Any) -> Any:
    if role not in ("user", "assistant"):
        raise ValueError("role")
    return role


def _content(content: Any) -> Any:
    kind = getattr(content, "type", None)
    if kind == "text" and isinstance(content.text, str):
        return TextContent(type="text", text=content.text)
    if kind in ("image", "audio"):
        mime = media_type(content.mime_type)
        base64.b64decode(content.data, validate=True)
        if mime is None:
            raise ValueError("mime")
        cls = ImageContent if kind == "image" else AudioContent
        return cls(type=kind, data=content.data, mime_type=mime)
    if kind == "resource":
        inner = content.resource
        uri = str(inner.uri)
        if not key_ok(Kind.RESOURCE, uri):
            raise ValueError("uri")
        mime = media_type(inner.mime_type)
        if isinstance(inner, TextResourceContents):
            body: Any = TextResourceContents(uri=uri, text=inner.text, mime_type=mime)
        elif isinstance(inner, BlobResourceContents):
            base64.b64decode(inner.blob, validate=True)
            body = BlobResourceContents(uri=uri, blob=inner.blob, mime_type=mime)
        else:
            raise TypeError("resource")
        return EmbeddedResource(type="resource", resource=body)
    raise TypeError("content kind")


__all__ = [
    "SHA256_META",
    "ItemView",
    "UpstreamPrompt",
    "UpstreamResource",
    "UpstreamTemplate",
    "scanned_prompt",
    "scanned_resource",
    "to_prompt_result",
    "to_resource_result",
]
