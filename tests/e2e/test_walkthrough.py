"""README's approved-write walkthrough, run as written against `make run`'s demo server.

The block after the ``<!-- walkthrough ... -->`` marker in README.md is the only copy: the
test cuts it into steps (one command each, ``\\``-continued lines joined), runs them in
order in one POSIX shell (so ``TOKEN=$(...)`` carries over), and checks each step against
the comment under it: ``# -> <output>  (exit N)``, where every ``"key": value`` shown must
be in the step's JSON output (a string ending in ``...`` is a prefix). A step without such
a comment must exit 0. So the README cannot drift from what the commands do.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .conftest import DEMO_WORKSPACE, REPO_ROOT, snapshot
from .servers import free_port, http_server, server_env

pytestmark = pytest.mark.slow

README = REPO_ROOT / "README.md"
DEMO_CONFIG = REPO_ROOT / "demo" / "nexus.yaml"
MARKER = "<!-- walkthrough"
EXPECTATION = re.compile(r"^# -> (?P<shown>.*?)\s*\(exit (?P<code>\d+)\)\s*$")
# `"key": value` pairs shown in an expectation: a JSON string, true/false/null or a number.
SHOWN_PAIR = re.compile(r'"([^"]+)":\s*("(?:[^"\\]|\\.)*"|true|false|null|-?\d+(?:\.\d+)?)')
ELLIPSIS = "..."
POSIX_SHELL = "/bin/sh"  # the README block is ```sh: no bash-only syntax
WALKTHROUGH_TIMEOUT_SECONDS = 300  # a bound on the whole shell run, far above a healthy one


@dataclass
class Step:
    command: str
    exit_code: int = 0
    shown: list[tuple[str, Any]] = field(default_factory=list)


def readme_walkthrough(readme: str) -> str:
    """The fenced block right after the walkthrough marker."""
    at = readme.find(MARKER)
    if at < 0:
        pytest.fail(f"README.md has no '{MARKER} ... -->' marker before the walkthrough block")
    fence = re.search(r"```[a-z]*\n(.*?)```", readme[at:], flags=re.DOTALL)
    if fence is None:
        pytest.fail("README.md's walkthrough marker is not followed by a fenced code block")
    return fence.group(1)


def parse_steps(block: str) -> list[Step]:
    steps: list[Step] = []
    lines = block.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            expected = EXPECTATION.match(stripped)
            if expected is not None:
                if not steps:
                    pytest.fail("an expectation comment comes before any command")
                steps[-1].exit_code = int(expected["code"])
                steps[-1].shown = [
                    (key, json.loads(value)) for key, value in SHOWN_PAIR.findall(expected["shown"])
                ]
            continue
        command = [line]
        while command[-1].endswith("\\") and index < len(lines):
            command.append(lines[index])
            index += 1
        steps.append(Step("\n".join(command)))
    return steps


def occurs(value: Any, key: str, expected: Any) -> bool:
    """Whether ``key`` holds ``expected`` anywhere in ``value`` (``...``: a string prefix)."""
    if isinstance(value, dict):
        for name, item in value.items():
            if name == key and matches(item, expected):
                return True
            if occurs(item, key, expected):
                return True
    if isinstance(value, list):
        return any(occurs(item, key, expected) for item in value)
    return False


def matches(actual: Any, expected: Any) -> bool:
    if isinstance(expected, str) and expected.endswith(ELLIPSIS):
        return isinstance(actual, str) and actual.startswith(expected[: -len(ELLIPSIS)])
    return bool(actual == expected and type(actual) is type(expected))


def shell_script(steps: list[Step], out: Path) -> str:
    """Every step in one shell, each with its own stdout, stderr and exit status."""
    lines = ["cd " + _quote(str(REPO_ROOT))]
    for number, step in enumerate(steps):
        base = _quote(str(out / str(number)))
        # A brace group runs in this shell (assignments persist) and takes the redirections
        # for everything inside it, command substitutions included.
        lines.append(f"{{\n{step.command}\n}} >{base}.out 2>{base}.err")
        lines.append(f"echo $? >{base}.rc")
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def nexus_mcp_on_path(folder: Path) -> Path:
    """A ``nexus-mcp`` command for this checkout and interpreter, whatever is installed."""
    folder.mkdir()
    command = folder / "nexus-mcp"
    command.write_text(f'#!/bin/sh\nexec {_quote(sys.executable)} -m nexus_mcp "$@"\n')
    command.chmod(0o755)
    return folder


def run_walkthrough(block: str, tmp_path: Path) -> list[tuple[Step, str, str]]:
    """Serve the demo as `make run` does, run the block's steps, check each one."""
    steps = parse_steps(block)
    assert steps, "the walkthrough block holds no command"
    workspace = tmp_path / "demo-workspace"
    shutil.copytree(DEMO_WORKSPACE, workspace)  # `make run` serves a copy of the demo
    before = snapshot(workspace)
    port = free_port()
    out = tmp_path / "steps"
    out.mkdir()
    bin_dir = nexus_mcp_on_path(tmp_path / "bin")
    # The Makefile's `run` target, on a free port instead of 8765.
    args = ["--mode", "dev", "--workspace", str(workspace), "--data-dir", str(tmp_path / "data"),
            "--config", str(DEMO_CONFIG)]  # fmt: skip
    env = server_env(
        {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "NEXUS_MCP_URL": f"http://127.0.0.1:{port}/mcp",
            "HOME": str(tmp_path / "home"),  # nothing of the tester's own state is used
        }
    )
    with http_server(args, {}, port=port):
        subprocess.run(
            [POSIX_SHELL, "-c", shell_script(steps, out)],
            env=env,
            timeout=WALKTHROUGH_TIMEOUT_SECONDS,
            check=True,
        )
    results = []
    for number, step in enumerate(steps):
        stdout = (out / f"{number}.out").read_text()
        stderr = (out / f"{number}.err").read_text()
        status = int((out / f"{number}.rc").read_text())
        where = f"walkthrough step {number + 1}: {step.command}\nstdout: {stdout}\nstderr: {stderr}"
        assert status == step.exit_code, where
        if step.shown:
            printed = json.loads(stdout)
            for key, value in step.shown:
                assert occurs(printed, key, value), f"{where}\nmissing: {key} = {value!r}"
        results.append((step, stdout, stderr))
    check_what_the_writes_did(results, before, workspace)
    return results


def check_what_the_writes_did(
    results: list[tuple[Step, str, str]], before: dict[str, bytes], workspace: Path
) -> None:
    """The workspace changed by exactly the files the successful writes reported, with the
    sha256 they reported; no approval token was ever printed."""
    written: dict[str, str] = {}
    for step, stdout, stderr in results:
        assert "eyJ" not in stdout + stderr, f"a token was printed by: {step.command}"
        if step.exit_code == 0 and stdout.strip().startswith("{"):
            printed = json.loads(stdout)
            printed = printed.get("structuredContent", printed)
            if isinstance(printed, dict) and {"path", "sha256"} <= set(printed):
                written[printed["path"]] = printed["sha256"]
    after = snapshot(workspace)
    changed = {name for name in after if after[name] != before.get(name)}
    assert changed == set(written)
    for name, digest in written.items():
        assert hashlib.sha256(after[name]).hexdigest() == digest


def test_the_readme_walkthrough_runs_end_to_end_as_written(tmp_path: Path) -> None:
    block = readme_walkthrough(README.read_text(encoding="utf-8"))
    results = run_walkthrough(block, tmp_path)

    # The two second uses the README explains must both be shown, and be what it says.
    shown = {(key, json.dumps(value)) for step, _, _ in results for key, value in step.shown}
    assert ("code", '"APPROVAL_REPLAYED"') in shown
    assert ("nexus.mcp/idempotent_replay", "true") in shown


def test_steps_are_cut_at_commands_and_carry_their_expectations() -> None:
    block = """
# prose
A='{"x": 1}'
nexus-mcp call t --args "$A" \\
  k=v
# -> {"error": "this write requires...", "code": "APPROVAL_REQUIRED"}  (exit 1)

nexus-mcp call t --full
# -> {"_meta": {..., "nexus.mcp/idempotent_replay": true}, "size_bytes": 20}  (exit 0)
"""
    steps = parse_steps(block)

    assert [s.command for s in steps] == [
        "A='{\"x\": 1}'",
        'nexus-mcp call t --args "$A" \\\n  k=v',
        "nexus-mcp call t --full",
    ]
    assert [s.exit_code for s in steps] == [0, 1, 0]
    assert steps[1].shown == [("error", "this write requires..."), ("code", "APPROVAL_REQUIRED")]
    assert steps[2].shown == [("nexus.mcp/idempotent_replay", True), ("size_bytes", 20)]


def test_shown_values_match_exactly_or_by_prefix_anywhere_in_the_output() -> None:
    printed = {"_meta": {"nexus.mcp/idempotent_replay": True}, "sha256": "d2527bff8f34", "n": 1}

    assert occurs(printed, "nexus.mcp/idempotent_replay", True)
    assert occurs(printed, "sha256", "d2527bff...")
    assert not occurs(printed, "sha256", "d2527bff")
    assert not occurs(printed, "n", True)  # 1 == True in Python, not in JSON
    assert not occurs(printed, "missing", None)
