"""A native tool is listed exactly as FastMCP lists the declared function.

The wrapper FastMCP registers carries no docstring (``providers/native.py``: FastMCP then
never loads its docstring parser), so the description comes from the contract and the
parameters from the signature alone. These tests check that nothing is lost: each tool's
description and parameters equal what FastMCP derives from the declared function itself,
docstring and all, and no tool module describes a parameter in a docstring.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastmcp.tools import FunctionTool

import nexus_mcp.tools
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.providers.native import NexusTool
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NexusServer]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    built = build_server(
        Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "data"),
        audit_sinks=[MemoryAuditSink()],
    )
    yield built
    built.close()


async def test_every_native_tool_is_defined_as_fastmcp_defines_the_declared_function(
    server: NexusServer,
) -> None:
    tools = [tool for tool in await server.mcp.list_tools() if isinstance(tool, NexusTool)]
    assert len(tools) >= 10
    for tool in tools:
        declared = tool.fn.__wrapped__  # type: ignore[attr-defined]
        assert declared.__doc__, f"{tool.name}: the declared function documents itself"
        assert tool.fn.__doc__ is None
        reference = FunctionTool.from_function(
            declared, name=tool.name, description=tool.description
        )
        # What a docstring can give: the description and the parameters' descriptions
        # (FastMCP's docstring parsing never touches the output schema).
        assert tool.description == reference.description, tool.name
        assert tool.parameters == reference.parameters, tool.name


def test_a_stdio_server_is_built_without_fastmcps_docstring_parser(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from nexus_mcp.server import build_server\n"
        "from nexus_mcp.settings import Settings\n"
        f"built = build_server(Settings(mode='dev', workspace=Path({str(workspace)!r}),"
        f" data_dir=Path({str(tmp_path / 'data')!r})))\n"
        "built.close()\n"
        "print('griffe' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "False"


# The docstring sections FastMCP's parser (griffe: Google, NumPy, Sphinx) would read
# parameter descriptions from.
PARAMETER_SECTIONS = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Keyword Args|Other Parameters):\s*$"
    r"|^\s*Parameters\s*\n\s*-{3,}\s*$"
    r"|^\s*:param\b",
    re.MULTILINE,
)


def test_no_tool_module_documents_parameters_in_a_docstring() -> None:
    """Every native toolset, the repositories' included (not built in the server above):
    a parameter described in a docstring would be lost, the wrapper carrying none."""
    tools = Path(nexus_mcp.tools.__file__).parent
    modules = sorted(tools.rglob("*.py"))
    assert len(modules) >= 5
    for module in modules:
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node) or ""
                assert not PARAMETER_SECTIONS.search(doc), f"{module.name}: {node.name}"
