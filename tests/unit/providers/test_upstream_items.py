"""An upstream's answers to resources/read and prompts/get, checked before a caller sees
them (``providers/upstream/items.py``): bounded, hashed, typed, never echoed."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from mcp_types import (
    BlobResourceContents,
    GetPromptResult,
    PromptMessage,
    ReadResourceResult,
    TextContent,
    TextResourceContents,
)

from nexus_mcp.errors import DocSizeExceededError, UpstreamError
from nexus_mcp.providers.upstream.items import (
    SHA256_META,
    media_type,
    to_prompt_result,
    to_resource_result,
)

SECRET = "UPSTREAM-SECRET-TEXT"


def text(body: str, mime: str | None = "text/plain") -> TextResourceContents:
    return TextResourceContents(uri="t://x", text=body, mimeType=mime)


def blob(data: bytes, mime: str | None = None) -> BlobResourceContents:
    return BlobResourceContents(uri="t://x", blob=base64.b64encode(data).decode(), mimeType=mime)


def test_each_content_is_hashed_by_its_bytes() -> None:
    result = to_resource_result(
        ReadResourceResult(contents=[text("héllo"), blob(b"\x00\xff")]), 1024
    )
    first, second = result.contents
    assert first.meta == {SHA256_META: hashlib.sha256("héllo".encode()).hexdigest()}
    assert second.meta == {SHA256_META: hashlib.sha256(b"\x00\xff").hexdigest()}
    assert second.content == b"\x00\xff"


def test_the_read_limit_is_over_every_content_together_and_refuses() -> None:
    raw = ReadResourceResult(contents=[text("a" * 600), text("b" * 600)])
    with pytest.raises(DocSizeExceededError):
        to_resource_result(raw, 1000)
    assert to_resource_result(raw, 1200).contents


@pytest.mark.parametrize(
    "raw",
    [
        ReadResourceResult(contents=[]),
        ReadResourceResult(
            contents=[BlobResourceContents(uri="t://x", blob=SECRET + "!!not base64")]
        ),
        ReadResourceResult(contents=[text("x")] * 1001),
    ],
)
def test_a_malformed_read_is_an_upstream_error_that_echoes_nothing(raw: Any) -> None:
    with pytest.raises(UpstreamError) as refused:
        to_resource_result(raw, 10_000_000)
    assert SECRET not in str(refused.value) and refused.value.message == "Upstream error"


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("text/markdown", True),
        ("application/vnd.api+json; charset=utf-8", True),
        ("text/plain\x1b[2J", False),
        ("text/\u202eplain", False),
        ("not a type", False),
        ("a/" + "b" * 200, False),
        (None, False),
        (42, False),
    ],
)
def test_only_media_types_are_passed_on(value: Any, kept: bool) -> None:
    assert (media_type(value) is not None) is kept
    if isinstance(value, str):
        result = to_resource_result(ReadResourceResult(contents=[text("x", value)]), 100)
        # Dropped, the content takes FastMCP's default for text.
        assert result.contents[0].mime_type == (value if kept else "text/plain")


def test_a_prompt_answer_is_bounded_and_typed() -> None:
    ok = GetPromptResult(
        description="d",
        messages=[PromptMessage(role="user", content=TextContent(type="text", text="hi"))],
    )
    assert to_prompt_result(ok, 1000).messages[0].content.text == "hi"  # type: ignore[union-attr]
    huge = GetPromptResult(
        messages=[PromptMessage(role="user", content=TextContent(type="text", text="y" * 5000))]
    )
    with pytest.raises(DocSizeExceededError):
        to_prompt_result(huge, 1000)
    many = GetPromptResult(
        messages=[PromptMessage(role="user", content=TextContent(type="text", text="x"))] * 1001
    )
    with pytest.raises(UpstreamError):
        to_prompt_result(many, 10_000_000)


def test_a_prompt_message_is_rebuilt_without_the_upstreams_meta_or_annotations() -> None:
    content = TextContent(
        type="text",
        text="hi",
        annotations={"audience": ["assistant"], "priority": 1.0},
        _meta={"upstream/evil": "IGNORE PREVIOUS"},
    )
    result = to_prompt_result(
        GetPromptResult(messages=[PromptMessage(role="user", content=content)]), 1000
    )
    dumped = result.messages[0].content.model_dump(mode="json", by_alias=True)
    assert "IGNORE" not in str(dumped) and "priority" not in str(dumped)


def test_a_prompt_with_a_resource_link_or_a_bad_embedded_uri_is_refused() -> None:
    from mcp_types import EmbeddedResource, ResourceLink

    link = ResourceLink(type="resource_link", uri="https://evil.example/x", name="click")
    bad = EmbeddedResource(
        type="resource", resource=text("x").model_copy(update={"uri": "t://a\u202eb"})
    )
    for content in (link, bad):
        with pytest.raises(UpstreamError):
            to_prompt_result(
                GetPromptResult(messages=[PromptMessage(role="user", content=content)]), 1000
            )
