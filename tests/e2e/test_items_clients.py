"""Prompts and resources through the gateway, read by the official TypeScript SDK and the
MCP Inspector CLI over stdio (issue 27): the non-Python clients list what is granted and
pinned, read and render it, and get a refusal as an MCP error with the stable code and
nothing of the request or the upstream quoted. The server is ``nexus-mcp serve`` as a
real subprocess in front of the recording test upstream (another real subprocess)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from .node_clients import (
    CLIENT_TIMEOUT_S,
    CLIENTS_DIR,
    NodeClients,
    client_env,
    inspector_env_args,
)
from .servers import SRC, serve_command, server_env
from .upstream_harness import Gateway, all_up_tools, make_gateway, stdio_upstream

README = "# Upstream readme\n\nResources through the gateway.\n"


def pinned_gateway(tmp_path: Path) -> Gateway:
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream()],
        grant={"full": all_up_tools()},
        grant_items={"full": {"resources": ["up"], "prompts": ["up_greet"]}},
        extra={"limits": {"max_read_bytes": 1024 * 1024}},
    )
    assert gw.pin("up") == 0
    return gw


def command(gw: Gateway) -> list[str]:
    return serve_command(
        "--transport",
        "stdio",
        "--config",
        str(gw.config_file),
        "--workspace",
        str(gw.workspace),
        "--data-dir",
        str(gw.data_dir),
    )


def test_the_typescript_sdk_reads_and_renders_through_the_chain(
    node_clients: NodeClients, tmp_path: Path
) -> None:
    gw = pinned_gateway(tmp_path)
    serve = command(gw)
    plan = {
        "command": serve[0],
        "args": serve[1:],
        "env": server_env(),
        "reads": [
            "upstream://up/test://static/readme",
            "upstream://up/test://items/9",
            "upstream://up/test://static/huge",  # over the read limit
            "upstream://up/test://static/nothing",  # unknown
        ],
        "prompts": [
            {"name": "up_greet", "arguments": {"name": "Ada"}},
            {"name": "up_review", "arguments": {"code": "x"}},  # pinned, not granted
        ],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    proc = subprocess.run(
        [node_clients.node, str(CLIENTS_DIR / "read_items.mjs"), str(path)],
        env=client_env(tmp_path),
        capture_output=True,
        timeout=CLIENT_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    out: dict[str, Any] = json.loads(proc.stdout)
    assert [p["name"] for p in out["prompts"]] == ["up_greet"]
    assert "upstream://up/test://static/readme" in {r["uri"] for r in out["resources"]}
    assert "upstream://up/test://items/{item_id}" in {t["uriTemplate"] for t in out["templates"]}
    readme, item, huge, unknown = out["reads"]
    assert readme["result"]["contents"][0]["text"] == README
    assert "nexus/sha256" in readme["result"]["contents"][0]["_meta"]
    assert item["result"]["contents"][0]["text"] == "item 9"
    assert huge["threw"]["code"] == -32050
    assert "DOC_SIZE_EXCEEDED" in huge["threw"]["message"]
    assert "zzzz" not in huge["threw"]["message"]
    assert unknown["threw"]["code"] == -32602
    assert "nothing" not in unknown["threw"]["message"]
    greet, hidden = out["gets"]
    assert greet["result"]["messages"][0]["content"]["text"] == "Hello, Ada (plain)."
    assert hidden["threw"]["code"] == -32602 and "up_review" not in hidden["threw"]["message"]


def test_the_inspector_cli_lists_and_reads_through_the_chain(
    node_clients: NodeClients, tmp_path: Path
) -> None:
    gw = pinned_gateway(tmp_path)
    # Only what the server needs (the upstream gets its own clean environment).
    pairs = inspector_env_args({"PYTHONPATH": str(SRC)})

    def inspector(*method: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [
                node_clients.node,
                str(node_clients.inspector),
                "--cli",
                *pairs,
                "--method",
                *method,
                "--",
                *command(gw),
            ],
            env=client_env(tmp_path),
            capture_output=True,
            timeout=CLIENT_TIMEOUT_S,
            check=False,
        )

    listed = inspector("resources/list")
    assert listed.returncode == 0, listed.stderr.decode(errors="replace")[-2000:]
    uris = {r["uri"] for r in json.loads(listed.stdout)["resources"]}
    assert "upstream://up/test://static/readme" in uris
    read = inspector("resources/read", "--uri", "upstream://up/test://static/readme")
    assert read.returncode == 0, read.stderr.decode(errors="replace")[-2000:]
    assert json.loads(read.stdout)["contents"][0]["text"] == README
    prompt = inspector("prompts/get", "--prompt-name", "up_greet", "--prompt-args", "name=Ada")
    assert prompt.returncode == 0, prompt.stderr.decode(errors="replace")[-2000:]
    assert "Hello, Ada" in prompt.stdout.decode()
    refused = inspector("resources/read", "--uri", "upstream://up/test://static/huge")
    assert refused.returncode != 0
    assert "DOC_SIZE_EXCEEDED" in refused.stderr.decode(errors="replace")
