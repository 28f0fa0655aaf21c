"""Shared pieces of the repo toolset's end-to-end tests: a real repository, a server built
from a real YAML file that serves it, and helpers to call, mint and read refusals."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastmcp import Client

from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.policy.approvals import mint_approval_token
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings
from tests.support.git_repos import make_repo

from .conftest import wire

SECRET = "approval-secret-REPO-CANARY-0123456789abcdef"
APPROVER = "bob-approver"
CODEOWNERS = """\
# Owners of the project
*                 @lead
/src/             @bob-approver @alice
/src/billing/     @carol
/docs/            @org/writers
"""
FILES: dict[str, str | bytes | None] = {
    "README.md": "# Project\n",
    "src/app.py": "def handler(event):\n    return event\n\n\nclass Widget:\n    pass\n",
    "src/util.ts": "export function formatName(x: string) {\n  return x;\n}\n",
    "src/billing/invoice.py": "TOTAL = 1\n",
    "docs/guide.md": "Guide\n",
    ".github/workflows/ci.yml": "on: push\n",
    ".github/CODEOWNERS": CODEOWNERS,
}
POLICY: dict[str, Any] = {
    "allowed_branches": ["feature/.*", "bugfix/.*"],
    "max_diff_size": 10_000,
    "max_changed_files": 3,
    "max_changed_lines": 20,
    "require_codeowners": True,
    "disallowed_paths": [".github/workflows/", "src/auth/"],
    "allowed_operations": ["create_branch", "apply_patch", "open_pull_request", "merge_guarded"],
}

Builder = Callable[..., NexusServer]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "roots" / "project", FILES)


@pytest.fixture
def build(
    project: Path, workspace: Path, tmp_path: Path, audit: MemoryAuditSink
) -> Iterator[Builder]:
    """A prod server serving ``project`` as ``proj`` with ``POLICY`` (or the given one)."""
    built: list[NexusServer] = []
    counter = iter(range(1000))

    def factory(
        policy: Mapping[str, Any] | None = POLICY,
        *,
        repository: Mapping[str, Any] | None = None,
        repos: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> NexusServer:
        number = next(counter)
        entry: dict[str, Any] = {"path": str(project)}
        if policy is not None:
            entry["write_policy"] = dict(policy)
        entry.update(repository or {})
        section: dict[str, Any] = {
            "allowed_roots": [str(tmp_path / "roots")],
            "repositories": {"proj": entry},
        }
        section.update(repos or {})
        config = tmp_path / f"nexus-{number}.yaml"
        document = {"repos": section, **(extra or {})}  # extra: other sections (flow: ...)
        config.write_text(yaml.safe_dump(document), encoding="utf-8")
        values: dict[str, Any] = {
            "mode": "prod",
            "subject": "alice",
            "role": "editor",
            "profile": "repo",
            "workspace": workspace,
            "data_dir": tmp_path / f"data-{number}",
        }
        values.update(overrides)
        server = build_server(
            Settings(**values),
            config_file=config,
            audit_sinks=[audit],
            env={"NEXUS_MCP_APPROVAL_SECRET": SECRET, **(env or {})},
        )
        built.append(server)
        return server

    yield factory
    for server in built:
        server.close()


def mint(
    server: NexusServer,
    tool: str,
    arguments: Mapping[str, Any],
    *,
    approver: str = APPROVER,
    subject: str = "alice",
) -> str:
    assert server.runtime.approval_keys is not None
    return mint_approval_token(
        server.runtime.approval_keys,
        server.runtime.approval_settings,
        approver=approver,
        subject=subject,
        tool=tool,
        arguments=arguments,
        host_id="review-console",
    )


async def call(
    client: Client[Any], tool: str, args: Mapping[str, Any], meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    return wire(await client.call_tool_mcp(tool, dict(args), meta=meta))


async def approved(
    client: Client[Any],
    server: NexusServer,
    tool: str,
    args: Mapping[str, Any],
    *,
    approver: str = APPROVER,
) -> dict[str, Any]:
    """Call a write with a token minted for exactly its arguments."""
    token = mint(server, tool, args, approver=approver)
    return await call(client, tool, {**args, "approval_token": token})


def commit_directly(repository: Any, branch: str, analysis: Any, patch: bytes) -> str:
    """``Repository.commit_patch`` as the tool calls it, with a test author and no guard."""
    commit: str = repository.commit_patch(
        branch,
        analysis,
        patch,
        message="m",
        author=("a", "a@x"),
        committer=("a", "a@x"),
        guard=None,
    )
    return commit


def envelope(result: Mapping[str, Any]) -> dict[str, str]:
    assert result["isError"] is True, result
    assert "structuredContent" not in result
    payload: dict[str, str] = json.loads(result["content"][0]["text"])
    assert set(payload) == {"error", "code"}
    return payload


def code_of(result: Mapping[str, Any]) -> str:
    return envelope(result)["code"]


def ok(result: Mapping[str, Any]) -> dict[str, Any]:
    assert result.get("isError") is not True, result
    structured: dict[str, Any] = result["structuredContent"]
    return structured


def effect_of(result: Mapping[str, Any]) -> dict[str, Any]:
    effect: dict[str, Any] = result["_meta"]["nexus.mcp/tool_effect"]
    return effect


def finished(audit: MemoryAuditSink, tool: str) -> list[dict[str, Any]]:
    return [r for r in audit.records() if r["tool"] == tool and r["event"] != "tool_call_started"]


__all__ = [
    "APPROVER",
    "CODEOWNERS",
    "FILES",
    "POLICY",
    "SECRET",
    "Builder",
    "approved",
    "build",
    "call",
    "code_of",
    "effect_of",
    "envelope",
    "finished",
    "mint",
    "ok",
    "project",
]
