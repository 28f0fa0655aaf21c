"""README's quickstart, every command block of it run as written.

The quickstart (between the ``--8<-- [start:quickstart]`` and ``[end:quickstart]`` markers,
which docs/quickstart.md includes verbatim) holds three runnable blocks, each after a marker
comment naming who runs it: ``desktop`` and ``http`` here, ``walkthrough`` in
tests/e2e/test_walkthrough.py. A runnable block (``sh``, ``python``) without a marker, or a
marker no test claims, fails here: the first screen a newcomer reads cannot drift.

The desktop block is run in a POSIX shell with a fresh ``HOME``; then the Claude Desktop
entry it wrote is started exactly as the client starts it (its command, args and env, over
stdio), a tool is called, and the refusal the README shows is the refusal the client reads.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport

from .conftest import DEMO_WORKSPACE, REPO_ROOT
from .servers import free_port, http_server, server_env
from .test_walkthrough import POSIX_SHELL, nexus_mcp_on_path

pytestmark = pytest.mark.slow

README = REPO_ROOT / "README.md"
DEMO_CONFIG = REPO_ROOT / "demo" / "nexus.yaml"
RUNNABLE = ("sh", "python")
CLAIMED = {"desktop", "http", "walkthrough"}  # walkthrough: tests/e2e/test_walkthrough.py
MARKER = re.compile(r"<!-- (quickstart: (?P<name>[a-z]+)|(?P<walk>walkthrough))[^>]*-->\s*$")
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```\n", re.DOTALL | re.MULTILINE)
STEP_TIMEOUT_SECONDS = 120


def quickstart(readme: str) -> str:
    start = readme.index("--8<-- [start:quickstart]")
    end = readme.index("--8<-- [end:quickstart]")
    return readme[start:end]


def blocks(section: str) -> list[tuple[str | None, str, str]]:
    """Every fenced block of ``section``: (marker name or None, language, body)."""
    found = []
    for fence in FENCE.finditer(section):
        before = section[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        name = None
        if marker is not None:
            name = "walkthrough" if marker["walk"] else marker["name"]
        found.append((name, fence["lang"], fence["body"]))
    return found


def block(name: str) -> tuple[str, str]:
    matches = [
        (lang, body) for marker, lang, body in blocks(quickstart(_readme())) if marker == name
    ]
    assert len(matches) == 1, f"README's quickstart should have one '{name}' block"
    return matches[0]


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def test_every_runnable_quickstart_block_is_run_by_a_test() -> None:
    found = blocks(quickstart(_readme()))
    runnable = [(name, lang) for name, lang, _ in found if lang in RUNNABLE]
    assert runnable, "the quickstart holds no command"
    assert all(name is not None for name, _ in runnable), runnable
    assert {name for name, _ in runnable} == CLAIMED
    # Blocks without a language are shown output, never commands to paste.
    for name, lang, body in found:
        if name is None:
            assert lang not in RUNNABLE, body


def shown_refusal(readme: str) -> dict[str, Any]:
    """The refusal the quickstart says the desktop client reads (the plain block after it)."""
    section = quickstart(readme)
    after = section.split("<!-- quickstart: desktop", 1)[1]
    shown = [body for name, lang, body in blocks(after) if name is None and lang == ""]
    assert shown, "the quickstart shows no refusal after the desktop block"
    value = json.loads(shown[0])
    assert set(value) == {"error", "code"}
    return value  # type: ignore[no-any-return]


def envelope(result: Any) -> dict[str, Any]:
    assert result.is_error
    value = json.loads(result.content[0].text)
    assert isinstance(value, dict)
    return value


async def test_the_desktop_block_writes_an_entry_that_serves_reads_and_a_plain_refusal(
    tmp_path: Path,
) -> None:
    lang, body = block("desktop")
    assert lang == "sh"
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = nexus_mcp_on_path(tmp_path / "bin")
    env = server_env({"HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    env.pop("XDG_CONFIG_HOME", None)
    done = subprocess.run(
        [POSIX_SHELL, "-e", "-c", body],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_SECONDS,
    )
    assert done.returncode == 0, done.stderr
    assert "next:" in done.stdout  # install says what to do next

    config = json.loads((home / ".config" / "Claude" / "claude_desktop_config.json").read_text())
    entry = config["mcpServers"]["nexus-mcp"]
    assert os.path.isabs(entry["command"])  # a client starts it without the user's PATH
    # Started as Claude Desktop starts it: the entry's command, args and env, a bare env.
    launch_env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONPATH": env["PYTHONPATH"]}
    launch_env.update(entry.get("env", {}))
    transport = StdioTransport(entry["command"], entry["args"], env=launch_env, cwd=str(home))
    async with Client(transport) as client:
        names = {tool.name for tool in await client.list_tools()}
        assert {"nexus_read_file", "nexus_write_file"} <= names

        read = await client.call_tool_mcp("nexus_read_file", {"path": "hello.md"})
        assert not read.is_error
        assert "# Hello from nexus-mcp" in json.dumps(read.structured_content)

        refused = await client.call_tool_mcp(
            "nexus_write_file",
            {"path": "notes/todo.md", "content": "buy milk", "idempotency_key": "k1"},
        )
        assert envelope(refused) == shown_refusal(_readme())
    assert sorted(p.name for p in (home / "notes").iterdir()) == ["hello.md"]  # nothing written


def test_the_http_block_talks_to_the_demo_as_make_run_serves_it(tmp_path: Path) -> None:
    lang, body = block("http")
    assert lang == "python"
    assert body.count("127.0.0.1:8765") == 1, "the block should name make run's address once"
    port = free_port()
    script = tmp_path / "client.py"
    script.write_text(body.replace("127.0.0.1:8765", f"127.0.0.1:{port}"))
    workspace = tmp_path / "demo-workspace"
    shutil.copytree(DEMO_WORKSPACE, workspace)
    args = ["--mode", "dev", "--workspace", str(workspace), "--data-dir", str(tmp_path / "data"),
            "--config", str(DEMO_CONFIG)]  # fmt: skip
    with http_server(args, {}, port=port):
        done = subprocess.run(
            [sys.executable, str(script)],
            env=server_env({"HOME": str(tmp_path)}),
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_SECONDS,
        )
    assert done.returncode == 0, done.stderr
    tools_line, outline_line = done.stdout.strip().splitlines()[:2]
    assert "get_note_outline" in tools_line
    assert "plan" in outline_line.lower()
