"""Who is calling and what they may see: the resolver that picks a request's principal,
bearer-token verification, and the granted tools behind the namespace layer.

The ``Principal`` value itself is ``nexus_mcp.principal`` (policy reads it too)."""
