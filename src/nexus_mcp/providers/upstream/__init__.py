"""Upstream MCP servers as tool providers (seed 002's MCP tool provider; DESIGN.md, Gateway).

One module per concern: ``gateway.py`` (every configured upstream wired into the chain),
``server.py`` (``UpstreamServer``: one upstream's sessions, health, listings and calls),
built on ``pinning.py`` (pins, decisions, the tools published) and ``evidence.py`` (the
quarantine evidence, kept and shared); ``sessions.py`` (one FastMCP client per session),
``stdio.py`` (the bounded stdio transport), ``relay.py`` (an upstream's own requests to
the caller), ``listing.py`` (fetching and screening a tool listing), ``tools.py`` (the
``UpstreamTool`` FastMCP holds, its connector), ``provider.py`` (FastMCP's ``Provider``
for them all). Nothing is re-exported here: import from the module that owns the name.
"""
