"""The ``repo`` toolset (``write.py`` for now; split along its seams next)."""

from nexus_mcp.tools.repo.write import TOOLSET, build_repo_tools

__all__ = ["TOOLSET", "build_repo_tools"]
