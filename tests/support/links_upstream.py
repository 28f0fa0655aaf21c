"""An upstream for issue 28's hostile tests: a tool whose result carries the text it is
given in every place of a content block that is not its ``text`` (a resource link's URI,
name, title and description, a block's ``_meta``, an embedded resource's URI and
``_meta``). Run over stdio: ``python links_upstream.py``."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastmcp import FastMCP
from fastmcp.tools import ToolResult
from mcp_types import EmbeddedResource, ResourceLink, TextContent, TextResourceContents

mcp: FastMCP[Any] = FastMCP("links-upstream")


@mcp.tool(annotations={"readOnlyHint": True})
async def links(text: str) -> ToolResult:
    """Return ``text`` outside every text field."""
    return ToolResult(
        content=[
            TextContent(type="text", text="see the links", _meta={"note": text}),
            ResourceLink(
                type="resource_link",
                uri=f"https://example.com/file?token={quote(text, safe='')}",
                name=text,
                title=text,
                description=text,
            ),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(
                    uri=f"https://example.com/{quote(text, safe='')}",
                    text="plain",
                    _meta={"note": text},
                ),
                _meta={"note": text},
            ),
        ]
    )


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
