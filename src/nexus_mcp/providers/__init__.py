"""Tool providers (seed 002; DESIGN.md, "Gateway: tool providers").

Tools come from providers, one module per kind, and the chain wraps every provider the
same way: there is one enforcement path, the middleware chain, and each provider's tools
run behind the same connector checks.

- ``native``: nexus-mcp's own toolsets (``tools/``: files, notes, discovery), registered
  as ``@nexus_tool`` functions bound to the connector.
- ``upstream``: one ``UpstreamServer`` per configured upstream MCP server, classified by
  its own registry file and pinned by its lock file; its connector is the code that
  forwards the call.

The composition root (``server/build.py``) chooses which providers a deployment has.
"""
