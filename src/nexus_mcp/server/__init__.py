"""The composition root: ``build_server`` reads the settings and assembles one server.

``build.py`` assembles it from ``startup.py``'s decisions, holds what it shares in a
``Runtime`` (``runtime.py``) and, for ``serve --replay``, builds over ``replay.py``'s
stand-ins; ``routes.py`` and ``health.py`` are its plain HTTP routes.
Callers keep importing ``build_server`` and ``NexusServer`` from here.
"""

from nexus_mcp.server.build import NexusServer, build_server

__all__ = ["NexusServer", "build_server"]
