"""Which grant a resource URI falls under: its *source* (pure; no FastMCP).

A profile grants resources by source, as it grants tools by name (``policy/profiles.py``):

- ``upstream://<server_id>/...`` (an upstream's resource or template, as the gateway
  exposes it) is the source ``<server_id>``;
- ``nexus://notes/...`` (the native note resources) is the source ``notes``;
- anything else has no source and is never granted to anyone.

The URI is read as FastMCP matches it (the namespace layer passes the string FastMCP
resolves, scheme already lower-cased); the scheme is compared without regard to case (RFC
3986), the server id exactly, as FastMCP compares it. An authority that is not a plain
server id (user info, a port, percent-escapes, a template variable) has no source, and
neither has ``upstream://notes/...``: ``notes`` names the native notes, so an upstream by
that id must never be reachable through their grant.
"""

from __future__ import annotations

import hashlib
import re

NOTES_SOURCE = "notes"
UPSTREAM_SCHEME = "upstream"
NEXUS_SCHEME = "nexus"
# policy/upstreams.SERVER_ID_RE, the rule a source name follows (profiles.RESOURCE_SOURCE_RE).
_AUTHORITY_RE = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,63})/")
# Checked before any parsing: longer URIs still get an answer, just never a source.
MAX_URI_CHARS = 8192


def resource_source(uri: str) -> str | None:
    """The source a resource URI or URI template is granted under, or None (never granted)."""
    if len(uri) > MAX_URI_CHARS:
        return None
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return None
    scheme = scheme.lower()
    match = _AUTHORITY_RE.match(rest)
    if match is None:
        return None
    authority = match.group(1)
    if scheme == UPSTREAM_SCHEME:
        return None if authority == NOTES_SOURCE else authority
    if scheme == NEXUS_SCHEME and authority == NOTES_SOURCE:
        return NOTES_SOURCE
    return None


def uri_sha256(uri: str) -> str:
    """What the audit records of a URI: the sha256 hex of its UTF-8, never its text."""
    return hashlib.sha256(uri.encode("utf-8", "surrogatepass")).hexdigest()


__all__ = ["MAX_URI_CHARS", "NOTES_SOURCE", "resource_source", "uri_sha256"]
