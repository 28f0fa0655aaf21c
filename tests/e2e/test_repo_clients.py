"""The repo toolset through non-Python clients: the official TypeScript SDK and the MCP
Inspector CLI, each starting ``nexus-mcp serve --transport stdio`` as a real subprocess
with a ``repos:`` configuration, as a host would.

Every refusal a caller of the repo tools can provoke with arguments alone comes back as a
result the client reads (text envelope, no ``structuredContent``), and an approved write
really lands in the repository.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from nexus_mcp.policy.approvals import (
    load_approval_keys,
    load_approval_settings,
    mint_approval_token,
)
from tests.support.git_repos import git, make_patch, make_repo, rev

from .node_clients import (
    INSPECTOR_EXIT_TOOL_ERROR,
    InspectorTarget,
    NodeClients,
    inspector_command,
    run_inspector,
    run_ts_plans,
)
from .repo_harness import FILES, POLICY
from .servers import SRC, serve_command, server_env
from .test_clients import OK, Case, check_result, envelope_of

pytestmark = pytest.mark.slow

SECRET = "repo-client-tests-approval-secret-0123456789"
SUBJECT = "dev"


def mint(tool: str, arguments: Mapping[str, Any]) -> str:
    section = {"approvals": {"secret": SECRET}}
    return mint_approval_token(
        load_approval_keys({}, section),
        load_approval_settings({}, section),
        approver="bob-approver",
        subject=SUBJECT,
        tool=tool,
        arguments=arguments,
        host_id="ci-host",
    )


def serve_args(tmp_path: Path, workspace: Path, project: Path) -> list[str]:
    config = {
        "mode": "dev",
        "profile": "repo",
        "log_level": "WARNING",
        "approvals": {"secret": SECRET},
        "repos": {
            "allowed_roots": [str(project.parent)],
            "repositories": {"proj": {"path": str(project), "write_policy": POLICY}},
        },
    }
    path = tmp_path / "repo-clients.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return [
        "--transport",
        "stdio",
        "--config",
        str(path),
        "--workspace",
        str(workspace),
        "--data-dir",
        str(tmp_path / "data"),
    ]


def cases(project: Path, tmp_path: Path) -> list[Case]:
    git(project, "branch", "feature/ts", "main")
    good = make_patch(
        project, "main", {"src/app.py": "def handler(e):\n    return 3\n"}, scratch=tmp_path
    )
    workflow = make_patch(
        project, "main", {".github/workflows/ci.yml": "on: pull_request\n"}, scratch=tmp_path
    )
    apply_ok = {
        "repo": "proj",
        "branch": "feature/ts",
        "patch": good,
        "message": "From the TypeScript SDK",
        "idempotency_key": "ts-apply",
    }
    return [
        Case(OK, "list_repo_files", {"repo": "proj", "path": "src"}),
        Case(OK, "read_repo_file", {"repo": "proj", "path": "README.md"}),
        Case(OK, "propose_patch", {"repo": "proj", "branch": "feature/ts", "patch": workflow}),
        Case("INVALID_INPUT", "read_repo_file", {"repo": "../etc", "path": "passwd"}),
        Case("INVALID_PATH", "read_repo_file", {"repo": "proj", "path": "../../etc/passwd"}),
        Case("NOT_FOUND", "read_repo_file", {"repo": "proj", "path": "absent.md"}),
        Case("CONFLICT", "read_repo_file", {"repo": "proj", "path": "src"}),
        Case("IDEMPOTENCY_KEY_REQUIRED", "create_branch", {"repo": "proj", "branch": "feature/k"}),
        Case(
            "WRITE_POLICY_DENIED",
            "create_branch",
            {"repo": "proj", "branch": "main", "idempotency_key": "ts-main"},
        ),
        Case(
            "WRITE_POLICY_DENIED",
            "apply_patch",
            {**apply_ok, "patch": workflow, "idempotency_key": "ts-workflow"},
        ),
        Case("APPROVAL_REQUIRED", "apply_patch", {**apply_ok, "idempotency_key": "ts-none"}),
        Case(OK, "apply_patch", {**apply_ok, "approval_token": mint("apply_patch", apply_ok)}),
    ]  # fmt: skip


def test_the_typescript_sdk_reads_every_repo_refusal_and_an_approved_commit_lands(
    node_clients: NodeClients, workspace: Path, tmp_path: Path
) -> None:
    project = make_repo(tmp_path / "roots" / "project", FILES)
    plan = cases(project, tmp_path)
    command = serve_command(*serve_args(tmp_path, workspace, project))
    session = {
        "transport": "stdio",
        "command": command[0],
        "args": command[1:],
        "env": server_env(),
        "calls": [case.call() for case in plan],
    }
    [[run]] = run_ts_plans(node_clients, [[session]], work=tmp_path)
    threw = [(c.tool, r["threw"]) for c, r in zip(plan, run.calls, strict=True) if "threw" in r]
    assert threw == []
    for case, call in zip(plan, run.calls, strict=True):
        check_result(case, call["result"], run.tools)
    applied = run.calls[-1]["result"]["structuredContent"]
    assert applied["commit_sha"] == rev(project, "feature/ts")
    assert git(project, "show", "feature/ts:src/app.py") == "def handler(e):\n    return 3\n"


def test_the_inspector_cli_prints_a_repo_refusal_as_a_result(
    node_clients: NodeClients, workspace: Path, tmp_path: Path
) -> None:
    project = make_repo(tmp_path / "roots" / "project", FILES)
    target = serve_command(*serve_args(tmp_path, workspace, project))
    arguments = {"repo": "proj", "branch": "main", "idempotency_key": "insp-main"}
    # Only what the server needs: the Inspector refuses an empty value (MAKEFLAGS= under make).
    stdio = InspectorTarget.stdio(target, {"PYTHONPATH": str(SRC)})
    command = inspector_command(node_clients, stdio, "create_branch", arguments)
    run = run_inspector(command, home=tmp_path)
    assert run.returncode == INSPECTOR_EXIT_TOOL_ERROR
    assert run.result is not None
    assert envelope_of(run.result)["code"] == "WRITE_POLICY_DENIED"
    assert "main" not in envelope_of(run.result)["error"]
