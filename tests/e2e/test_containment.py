"""What is checked is what is touched: links never carry a write past the write policy,
the hidden server state or the workspace root, whichever tool, whichever link shape.

Each case builds a real workspace with real links, calls the real tools through the
in-memory client, and checks the answer's code, that the workspace and the folder
outside it are byte-for-byte unchanged (links included), and that the refusal is audited.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from itertools import count
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastmcp import Client

from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings

from ..support.swapper import Swapper
from ..support.trees import make_chain, remove_tree
from .conftest import wire

SCRATCH_ONLY = {
    "allowed_paths": ["scratch/**"],
    "allowed_operations": ["write", "edit", "delete", "mkdir", "rmdir", "rename"],
    "require_approval": False,
}
EVERYWHERE = {**SCRATCH_ONLY, "allowed_paths": ["**"]}
_keys = count()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (root / ".git" / "hooks" / "pre-commit.sample").write_text("#!/bin/sh\n")
    (root / ".github" / "workflows").mkdir(parents=True)
    (root / ".github" / "workflows" / "ci.yml").write_text("on: push\n")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('app')\n")
    (root / "scratch").mkdir()
    (root / "scratch" / "note.txt").write_text("note\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("CANARY-OUTSIDE")
    return root


@pytest.fixture
def outside(ws: Path) -> Path:
    return ws.parent / "outside"


Serve = Callable[..., NexusServer]


@pytest.fixture
def serve(ws: Path, tmp_path: Path, audit: MemoryAuditSink) -> Iterator[Serve]:
    built: list[NexusServer] = []

    def factory(policy: Mapping[str, Any] = SCRATCH_ONLY, **overrides: Any) -> NexusServer:
        config = tmp_path / f"nexus-{len(built)}.yaml"
        config.write_text(yaml.safe_dump({"write_policies": {"workspace": dict(policy)}}))
        values: dict[str, Any] = {
            "mode": "prod",
            "subject": "alice",
            "role": "editor",
            "profile": "full",
            "workspace": ws,
            "data_dir": tmp_path / "data",
        }
        values.update(overrides)
        server = build_server(Settings(**values), config_file=config, audit_sinks=[audit])
        built.append(server)
        return server

    yield factory
    for server in built:
        server.close()


def tree(root: Path) -> dict[str, Any]:
    """Every entry below ``root`` (links as their target text, never followed)."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            key = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[key] = ("link", os.readlink(path))
            elif path.is_dir():
                out[key] = ("dir",)
            else:
                out[key] = ("file", path.read_bytes(), path.stat().st_mode & 0o777)
    return dict(sorted(out.items()))


async def call(server: NexusServer, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    if tool not in READ_TOOLS:
        args = {**args, "idempotency_key": f"key-{next(_keys)}"}
    async with Client(server.mcp) as client:
        return wire(await client.call_tool_mcp(tool, args))


def code_of(result: dict[str, Any]) -> str | None:
    if not result.get("isError"):
        return None
    return str(json.loads(result["content"][0]["text"])["code"])


READ_TOOLS = {"nexus_read_file", "nexus_list_files", "nexus_file_info", "nexus_glob", "nexus_grep"}


async def refused(
    server: NexusServer,
    audit: MemoryAuditSink,
    roots: list[Path],
    tool: str,
    args: dict[str, Any],
    code: str,
) -> dict[str, Any]:
    """Call, expect ``code``, and prove nothing changed and the refusal was audited."""
    before = [tree(root) for root in roots]
    audit.clear()
    result = await call(server, tool, args)
    assert code_of(result) == code, (tool, args, result)
    assert [tree(root) for root in roots] == before, (tool, args)
    records = [r for r in audit.records() if r["event"] != "tool_call_started"]
    assert [r["outcome"] for r in records] == [code]
    text = json.dumps(result)
    for value in args.values():
        if isinstance(value, str) and len(value) >= 6 and not value.startswith("key-"):
            assert value not in text, "the refusal echoed an argument"
    return result


def link(at: Path, target: str | Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)


# -- the reproductions and their variants ----------------------------------------


def git_hooks_links(ws: Path) -> list[str]:
    """Many shapes of a link that leads into .git/hooks; returns the written paths."""
    link(ws / "hooks-link", ".git/hooks")  # relative
    link(ws / "hooks-abs", ws / ".git" / "hooks")  # absolute
    link(ws / "git-dir", ".git")  # a link to .git, then a real folder below it
    link(ws / "chain-1", "chain-2")  # a link to a link to a link
    link(ws / "chain-2", "chain-3")
    link(ws / "chain-3", ".git/hooks")
    link(ws / "scratch" / "up", "../.git/hooks")  # climbing out of a folder
    link(ws / "scratch" / "deep" / "up2", "../../.git/./hooks/")  # dot and slash noise
    link(ws / "src" / "sideways", "../scratch/../.git/hooks")  # through a real folder
    link(ws / "dot", ".")  # a link to the root itself
    return [
        "hooks-link/pre-commit",
        "hooks-abs/pre-commit",
        "git-dir/hooks/pre-commit",
        "chain-1/pre-commit",
        "scratch/up/pre-commit",
        "scratch/deep/up2/pre-commit",
        "src/sideways/pre-commit",
        "dot/.git/hooks/pre-commit",
        "dot/dot/hooks-link/pre-commit",
    ]


async def test_a_write_through_any_link_into_git_is_denied(
    serve: Serve, ws: Path, outside: Path, audit: MemoryAuditSink
) -> None:
    paths = git_hooks_links(ws)
    server = serve(EVERYWHERE)
    for path in paths:
        for tool, args in [
            ("nexus_write_file", {"path": path, "content": "#!/bin/sh\ncurl evil\n"}),
            ("nexus_mkdir", {"path": path, "parents": True}),
        ]:
            await refused(server, audit, [ws, outside], tool, args, "WRITE_POLICY_DENIED")
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()


async def test_an_edit_or_delete_through_a_link_to_git_config_is_denied(
    serve: Serve, ws: Path, outside: Path, audit: MemoryAuditSink
) -> None:
    link(ws / "cfg", ".git/config")
    link(ws / "scratch" / "cfg", ws / ".git" / "config")
    link(ws / "cfg-chain", "cfg")
    server = serve(EVERYWHERE)
    for path in ("cfg", "scratch/cfg", "cfg-chain", "git-dir/config"):
        if path == "git-dir/config":
            link(ws / "git-dir", ".git")
        edit = {"path": path, "old_text": "false", "new_text": "true"}
        await refused(server, audit, [ws, outside], "nexus_edit_file", edit, "WRITE_POLICY_DENIED")
        write = {"path": path, "content": "[core]\n\tfsmonitor = evil\n"}
        await refused(
            server, audit, [ws, outside], "nexus_write_file", write, "WRITE_POLICY_DENIED"
        )
        delete = {"path": path}
        await refused(
            server, audit, [ws, outside], "nexus_delete_file", delete, "WRITE_POLICY_DENIED"
        )
    assert (ws / ".git" / "config").read_text() == "[core]\n\tbare = false\n"


async def test_a_link_to_github_workflows_carries_no_write(
    serve: Serve, ws: Path, outside: Path, audit: MemoryAuditSink
) -> None:
    link(ws / "wf", ".github/workflows")
    link(ws / "gh", ".github")
    server = serve(EVERYWHERE)
    for tool, args in [
        ("nexus_write_file", {"path": "wf/evil.yml", "content": "on: push\n"}),
        ("nexus_write_file", {"path": "gh/workflows/ci.yml", "content": "on: push\n"}),
        ("nexus_edit_file", {"path": "wf/ci.yml", "old_text": "push", "new_text": "pull"}),
        ("nexus_delete_file", {"path": "wf/ci.yml"}),
        ("nexus_rename_file", {"source": "scratch/note.txt", "destination": "wf/note.yml"}),
        ("nexus_rename_file", {"source": "wf/ci.yml", "destination": "scratch/ci.yml"}),
        ("nexus_rmdir", {"path": "gh/workflows", "recursive": True}),
    ]:
        await refused(server, audit, [ws, outside], tool, args, "WRITE_POLICY_DENIED")


@pytest.mark.parametrize("target", ["../src", "ABS"])
async def test_a_link_out_of_the_allowed_paths_carries_no_change(
    serve: Serve, ws: Path, outside: Path, audit: MemoryAuditSink, target: str
) -> None:
    link(ws / "scratch" / "to-src", ws / "src" if target == "ABS" else target)
    link(ws / "scratch" / "app-link", "../src/app.py")
    server = serve(SCRATCH_ONLY)
    cases = [
        ("nexus_write_file", {"path": "scratch/to-src/app.py", "content": "pwned\n"}),
        ("nexus_write_file", {"path": "scratch/to-src/new.py", "content": "pwned\n"}),
        ("nexus_write_file", {"path": "scratch/app-link", "content": "pwned\n"}),
        ("nexus_edit_file", {"path": "scratch/to-src/app.py", "old_text": "app", "new_text": "x"}),
        ("nexus_edit_file", {"path": "scratch/app-link", "old_text": "app", "new_text": "x"}),
        ("nexus_delete_file", {"path": "scratch/to-src/app.py"}),
        ("nexus_mkdir", {"path": "scratch/to-src/pkg"}),
        ("nexus_mkdir", {"path": "scratch/to-src/a/b/c", "parents": True}),
        ("nexus_rmdir", {"path": "scratch/to-src", "recursive": True}),
        ("nexus_rename_file", {"source": "scratch/note.txt", "destination": "scratch/to-src/n"}),
        ("nexus_rename_file", {"source": "scratch/to-src/app.py", "destination": "scratch/a.py"}),
        ("nexus_rename_file", {"source": "scratch/to-src", "destination": "scratch/moved"}),
        ("nexus_delete_file", {"path": "scratch/app-link"}),
        ("nexus_rename_file", {"source": "scratch/app-link", "destination": "scratch/l2"}),
    ]
    for tool, args in cases:
        await refused(server, audit, [ws, outside], tool, args, "WRITE_POLICY_DENIED")
    assert (ws / "src" / "app.py").read_text() == "print('app')\n"


async def test_links_inside_the_allowed_paths_still_work(serve: Serve, ws: Path) -> None:
    link(ws / "scratch" / "alias", "sub")
    (ws / "scratch" / "sub").mkdir()
    link(ws / "scratch" / "note-link", "note.txt")
    server = serve(SCRATCH_ONLY)
    wrote = await call(server, "nexus_write_file", {"path": "scratch/alias/a.txt", "content": "A"})
    assert code_of(wrote) is None
    assert (ws / "scratch" / "sub" / "a.txt").read_text() == "A"
    edited = await call(
        server,
        "nexus_edit_file",
        {"path": "scratch/note-link", "old_text": "note", "new_text": "NOTE"},
    )
    assert code_of(edited) is None
    assert (ws / "scratch" / "note.txt").read_text() == "NOTE\n"
    assert (ws / "scratch" / "note-link").is_symlink()  # written through, not replaced
    # Deleting a link removes the link, never what it points to.
    assert code_of(await call(server, "nexus_delete_file", {"path": "scratch/note-link"})) is None
    assert not (ws / "scratch" / "note-link").exists()
    assert (ws / "scratch" / "note.txt").read_text() == "NOTE\n"


async def test_removing_a_folder_removes_links_inside_it_never_their_targets(
    serve: Serve, ws: Path, outside: Path
) -> None:
    (ws / "scratch" / "d").mkdir()
    link(ws / "scratch" / "d" / "to-src", "../../src")
    link(ws / "scratch" / "d" / "to-outside", outside)
    link(ws / "scratch" / "d" / "to-secret", outside / "secret.txt")
    before = tree(outside), (ws / "src" / "app.py").read_bytes()
    server = serve(SCRATCH_ONLY)
    result = await call(server, "nexus_rmdir", {"path": "scratch/d", "recursive": True})
    assert code_of(result) is None
    assert not (ws / "scratch" / "d").exists()
    assert (tree(outside), (ws / "src" / "app.py").read_bytes()) == before


async def test_a_folder_holding_a_real_git_folder_cannot_be_removed_or_moved(
    serve: Serve, ws: Path, outside: Path, audit: MemoryAuditSink
) -> None:
    (ws / "scratch" / "vendored" / ".git").mkdir(parents=True)
    (ws / "scratch" / "vendored" / ".git" / "HEAD").write_text("ref: x\n")
    link(ws / "scratch" / "alias", "vendored")
    server = serve(SCRATCH_ONLY)
    for tool, args in [
        ("nexus_rmdir", {"path": "scratch/vendored", "recursive": True}),
        ("nexus_rename_file", {"source": "scratch/vendored", "destination": "scratch/v2"}),
        ("nexus_rmdir", {"path": "scratch/alias/.git", "recursive": True}),
        ("nexus_write_file", {"path": "scratch/alias/.git/HEAD", "content": "x"}),
    ]:
        await refused(server, audit, [ws, outside], tool, args, "WRITE_POLICY_DENIED")


async def test_links_leaving_the_workspace_are_invalid_paths_for_every_tool(
    serve: Serve, ws: Path, outside: Path, audit: MemoryAuditSink
) -> None:
    link(ws / "scratch" / "out", outside)
    link(ws / "scratch" / "out-rel", "../../outside")
    link(ws / "scratch" / "secret", outside / "secret.txt")
    link(ws / "scratch" / "loop-a", "loop-b")
    link(ws / "scratch" / "loop-b", "loop-a")
    link(ws / "scratch" / "root-alias", ws.parent / "ws" / "..")  # absolute, then up
    server = serve(SCRATCH_ONLY)
    for path in ("scratch/out/secret.txt", "scratch/out-rel/secret.txt", "scratch/secret"):
        for tool, args in [
            ("nexus_read_file", {"path": path}),
            ("nexus_file_info", {"path": path}),
            ("nexus_write_file", {"path": path, "content": "x"}),
            ("nexus_edit_file", {"path": path, "old_text": "CANARY", "new_text": "x"}),
            ("nexus_delete_file", {"path": path}),
            ("nexus_rename_file", {"source": path, "destination": "scratch/got"}),
            ("nexus_rename_file", {"source": "scratch/note.txt", "destination": path}),
        ]:
            await refused(server, audit, [ws, outside], tool, args, "INVALID_PATH")
    for path in ("scratch/loop-a", "scratch/loop-a/x", "scratch/root-alias/outside/secret.txt"):
        for tool, args in [
            ("nexus_read_file", {"path": path}),
            ("nexus_write_file", {"path": path, "content": "x"}),
            ("nexus_list_files", {"path": path}),
        ]:
            await refused(server, audit, [ws, outside], tool, args, "INVALID_PATH")
    for tool, args in [
        ("nexus_list_files", {"path": "scratch/out"}),
        ("nexus_glob", {"pattern": "**", "path": "scratch/out"}),
        ("nexus_grep", {"pattern": "CANARY", "path": "scratch/out-rel"}),
        ("nexus_mkdir", {"path": "scratch/out/new"}),
        ("nexus_rmdir", {"path": "scratch/out", "recursive": True}),
    ]:
        await refused(server, audit, [ws, outside], tool, args, "INVALID_PATH")


async def test_searches_and_listings_never_show_what_lies_behind_a_link(
    serve: Serve, ws: Path, outside: Path
) -> None:
    link(ws / "scratch" / "out", outside)
    link(ws / "scratch" / "secret.txt", outside / "secret.txt")
    server = serve(SCRATCH_ONLY)
    for tool, args in [
        ("nexus_grep", {"pattern": "CANARY"}),
        ("nexus_glob", {"pattern": "**/*"}),
        ("nexus_list_files", {"path": ".", "recursive": True}),
    ]:
        result = await call(server, tool, args)
        assert code_of(result) is None
        text = json.dumps(result)
        assert "CANARY-OUTSIDE" not in text
        assert "scratch/out/" not in text


async def test_a_link_created_between_two_calls_is_judged_on_the_second(
    serve: Serve, ws: Path, outside: Path, audit: MemoryAuditSink
) -> None:
    server = serve(SCRATCH_ONLY)
    (ws / "scratch" / "pkg").mkdir()
    first = await call(server, "nexus_write_file", {"path": "scratch/pkg/a.py", "content": "1"})
    assert code_of(first) is None
    (ws / "scratch" / "pkg" / "a.py").unlink()
    (ws / "scratch" / "pkg").rmdir()
    link(ws / "scratch" / "pkg", "../src")
    args = {"path": "scratch/pkg/app.py", "content": "pwned"}
    await refused(server, audit, [ws, outside], "nexus_write_file", args, "WRITE_POLICY_DENIED")
    (ws / "scratch" / "pkg").unlink()
    link(ws / "scratch" / "pkg", outside)
    await refused(server, audit, [ws, outside], "nexus_write_file", args, "INVALID_PATH")


async def test_server_state_behind_a_link_is_out_of_reach(
    serve: Serve, ws: Path, outside: Path, audit: MemoryAuditSink
) -> None:
    data = ws / "scratch" / ".state"
    server = serve(EVERYWHERE, data_dir=data)
    assert code_of(await call(server, "nexus_read_file", {"path": "src/app.py"})) is None
    link(ws / "scratch" / "audit-link", ".state/audit.jsonl")
    link(ws / "state-dir", "scratch/.state")
    for tool, args in [
        ("nexus_read_file", {"path": "scratch/audit-link"}),
        ("nexus_write_file", {"path": "scratch/audit-link", "content": "{}"}),
        ("nexus_delete_file", {"path": "scratch/audit-link"}),
        ("nexus_edit_file", {"path": "state-dir/audit.jsonl", "old_text": "{", "new_text": "["}),
        ("nexus_rmdir", {"path": "state-dir", "recursive": True}),
        ("nexus_rename_file", {"source": "state-dir", "destination": "moved"}),
        ("nexus_write_file", {"path": "state-dir/grants.sqlite3", "content": "x"}),
        ("nexus_list_files", {"path": "state-dir"}),
    ]:
        # The audit file grows with every call; compare the workspace without it.
        before = {k: v for k, v in tree(ws).items() if ".state" not in k}
        audit.clear()
        result = await call(server, tool, args)
        assert code_of(result) == "INVALID_PATH", (tool, args)
        assert {k: v for k, v in tree(ws).items() if ".state" not in k} == before
        assert [r["outcome"] for r in audit.records() if r["event"] != "tool_call_started"] == [
            "INVALID_PATH"
        ]


async def test_new_files_get_the_usual_mode_and_replaced_files_keep_theirs(
    serve: Serve, ws: Path
) -> None:
    server = serve(SCRATCH_ONLY)
    umask = os.umask(0o022)
    os.umask(umask)
    new = await call(server, "nexus_write_file", {"path": "scratch/n.txt", "content": "n"})
    assert code_of(new) is None
    assert (ws / "scratch" / "n.txt").stat().st_mode & 0o777 == 0o666 & ~umask
    os.chmod(ws / "scratch" / "note.txt", 0o640)
    edit = {"path": "scratch/note.txt", "old_text": "note", "new_text": "x"}
    assert code_of(await call(server, "nexus_edit_file", edit)) is None
    assert (ws / "scratch" / "note.txt").stat().st_mode & 0o777 == 0o640


async def test_calls_racing_a_folder_link_swap_never_touch_anything_outside(
    serve: Serve, ws: Path, outside: Path
) -> None:
    (ws / "scratch" / "d").mkdir()
    (ws / "scratch" / "d" / "secret.txt").write_text("inside\n")
    (outside / "x.txt").write_text("CANARY-OUTSIDE x\n")
    before = tree(outside)
    server = serve(EVERYWHERE)
    seen: dict[str, int] = {}
    async with Client(server.mcp) as client:
        with Swapper(ws / "scratch" / "d", outside) as swapper:
            deadline = time.monotonic() + 4
            index = 0
            while time.monotonic() < deadline:
                index += 1
                for tool, args in race_calls(index):
                    result = wire(await client.call_tool_mcp(tool, args))
                    assert "CANARY" not in json.dumps(result), (tool, args)
                    key = f"{tool}:{code_of(result) or 'OK'}"
                    seen[key] = seen.get(key, 0) + 1
    assert swapper.swaps > 0
    assert tree(outside) == before, "something outside the workspace was created or changed"
    assert not [p for p in ws.rglob(".nexus-*")], "a temporary file was left behind"
    assert any(key.endswith(":OK") for key in seen), seen


def race_calls(i: int) -> list[tuple[str, dict[str, Any]]]:
    def write(tool: str, **args: Any) -> tuple[str, dict[str, Any]]:
        return tool, {**args, "idempotency_key": f"race-{i}-{tool}"}

    return [
        ("nexus_read_file", {"path": "scratch/d/secret.txt"}),
        ("nexus_read_file", {"path": "scratch/d/x.txt"}),
        ("nexus_file_info", {"path": "scratch/d/x.txt"}),
        ("nexus_list_files", {"path": "scratch/d", "recursive": True}),
        ("nexus_grep", {"pattern": "CANARY", "path": "scratch"}),
        ("nexus_glob", {"pattern": "**/*.txt", "path": "scratch/d"}),
        write("nexus_write_file", path=f"scratch/d/n{i}.txt", content="w"),
        write("nexus_edit_file", path="scratch/d/x.txt", old_text="CANARY", new_text="gone"),
        write("nexus_mkdir", path=f"scratch/d/m{i}"),
        write("nexus_rename_file", source=f"scratch/d/n{i}.txt", destination=f"scratch/d/r{i}.txt"),
        write("nexus_delete_file", path="scratch/d/x.txt"),
        write("nexus_rmdir", path=f"scratch/d/m{i}"),
    ]


# -- what a removed or moved folder carries, judged entry by entry ------------------------


async def test_a_move_is_judged_where_every_entry_lands(
    serve: Serve, ws: Path, outside: Path, audit: MemoryAuditSink
) -> None:
    policy = {**EVERYWHERE, "disallowed_paths": ["**/deploy/prod/", "config/*/secret"]}
    (ws / "scratch" / "deploy2" / "prod").mkdir(parents=True)
    (ws / "scratch" / "deploy2" / "prod" / "values.yml").write_text("replicas: 1\n")
    (ws / "scratch" / "a").mkdir()
    (ws / "scratch" / "a" / "secret").write_text("s\n")
    (ws / "config").mkdir()
    server = serve(policy)
    direct = {"path": "scratch/deploy/prod/values.yml", "content": "x"}
    await refused(server, audit, [ws, outside], "nexus_write_file", direct, "WRITE_POLICY_DENIED")
    for source, destination in [("scratch/deploy2", "scratch/deploy"), ("scratch/a", "config/a")]:
        args = {"source": source, "destination": destination}
        await refused(
            server, audit, [ws, outside], "nexus_rename_file", args, "WRITE_POLICY_DENIED"
        )


async def test_every_entry_a_removal_or_move_takes_must_be_in_the_allowed_paths(
    serve: Serve, ws: Path, outside: Path, audit: MemoryAuditSink
) -> None:
    policy = {**EVERYWHERE, "allowed_paths": ["notes", "notes/*.md", "*/inbox/**", "archive/**"]}
    (ws / "notes").mkdir()
    (ws / "notes" / "a.md").write_text("a\n")
    (ws / "notes" / "build.py").write_text("print(1)\n")
    (ws / "archive").mkdir()
    server = serve(policy)
    for tool, args in [
        ("nexus_delete_file", {"path": "notes/build.py"}),
        ("nexus_rmdir", {"path": "notes", "recursive": True}),
        ("nexus_rename_file", {"source": "notes", "destination": "archive/notes"}),
        ("nexus_mkdir", {"path": "zzz/inbox/x", "parents": True}),
    ]:
        await refused(server, audit, [ws, outside], tool, args, "WRITE_POLICY_DENIED")
    assert (
        code_of(await call(server, "nexus_mkdir", {"path": "archive/x/y", "parents": True})) is None
    )


async def test_a_moved_link_is_judged_by_where_it_will_lead(
    serve: Serve, ws: Path, outside: Path, audit: MemoryAuditSink
) -> None:
    (ws / "scratch" / "a" / "b").mkdir(parents=True)
    link(ws / "scratch" / "a" / "b" / "wf", "../../../.github/workflows")  # leads nowhere yet
    link(ws / "scratch" / "a" / "b" / "o", "../../../../outside")
    link(ws / "scratch" / "a" / "b" / "ok", "../../note.txt")  # scratch/note.txt
    (ws / "scratch" / "pkg").mkdir()
    link(ws / "scratch" / "pkg" / "up", "../../src")  # climbs out of the folder it is in
    (ws / "scratch" / "deeper").mkdir()
    server = serve(SCRATCH_ONLY)
    for source, destination, code in [
        ("scratch/a/b/wf", "scratch/a/wf", "WRITE_POLICY_DENIED"),  # now .github/workflows
        ("scratch/a/b/o", "scratch/o", "INVALID_PATH"),  # now outside
        ("scratch/pkg", "scratch/deeper/pkg", "WRITE_POLICY_DENIED"),  # up would change
    ]:
        args = {"source": source, "destination": destination}
        await refused(server, audit, [ws, outside], "nexus_rename_file", args, code)
    moved = {"source": "scratch/a/b/ok", "destination": "scratch/a/b/ok2"}
    assert code_of(await call(server, "nexus_rename_file", moved)) is None


async def test_a_folder_too_deep_for_recursion_is_listed_searched_and_removed(
    serve: Serve, ws: Path
) -> None:
    deep = ws / "scratch" / "deep"
    path = make_chain(deep, 1100)  # deeper than Python's recursion limit
    (path / "leaf.txt").write_text("CANARY-DEEP-LEAF\n")
    try:
        await list_search_move_and_remove(serve(SCRATCH_ONLY), ws)
    finally:
        remove_tree(deep)
        remove_tree(ws / "scratch" / "deep2")


async def list_search_move_and_remove(server: NexusServer, ws: Path) -> None:
    for tool, args in [
        ("nexus_list_files", {"path": "scratch", "recursive": True}),
        ("nexus_glob", {"pattern": "**/*.txt", "path": "scratch"}),
        ("nexus_grep", {"pattern": "CANARY-DEEP", "path": "scratch"}),
    ]:
        assert code_of(await call(server, tool, args)) is None, tool
    moved = {"source": "scratch/deep", "destination": "scratch/deep2"}
    assert code_of(await call(server, "nexus_rename_file", moved)) is None
    removed = await call(server, "nexus_rmdir", {"path": "scratch/deep2", "recursive": True})
    assert code_of(removed) is None
    assert not (ws / "scratch" / "deep2").exists()
    assert not [p for p in (ws / "scratch").iterdir() if p.name.startswith(".nexus-")]


async def test_a_replaced_file_never_keeps_set_id_bits(serve: Serve, ws: Path) -> None:
    target = ws / "scratch" / "tool.sh"
    target.write_text("#!/bin/sh\necho hi\n")
    os.chmod(target, 0o6755)  # noqa: S103 - the set-id bits are what this test is about
    server = serve(SCRATCH_ONLY)
    edit = {"path": "scratch/tool.sh", "old_text": "hi", "new_text": "ho"}
    assert code_of(await call(server, "nexus_edit_file", edit)) is None
    assert target.stat().st_mode & 0o7777 == 0o755
    os.chmod(target, 0o4750)  # noqa: S103 - as above
    write = {"path": "scratch/tool.sh", "content": "#!/bin/sh\n"}
    assert code_of(await call(server, "nexus_write_file", write)) is None
    assert target.stat().st_mode & 0o7777 == 0o750


async def test_a_hard_link_to_server_state_is_not_read(
    serve: Serve, ws: Path, audit: MemoryAuditSink
) -> None:
    data = ws / "scratch" / ".state"
    server = serve(EVERYWHERE, data_dir=data)
    assert code_of(await call(server, "nexus_read_file", {"path": "src/app.py"})) is None
    (data / "notes.txt").write_text("CANARY-STATE tool_call\n")  # server state, as text
    os.link(data / "notes.txt", ws / "scratch" / "copy.txt")
    os.link(data / "grants.sqlite3", ws / "scratch" / "grants-copy")
    for tool, args in [
        ("nexus_read_file", {"path": "scratch/copy.txt"}),
        ("nexus_read_file", {"path": "scratch/grants-copy"}),
        ("nexus_file_info", {"path": "scratch/copy.txt"}),
        ("nexus_edit_file", {"path": "scratch/copy.txt", "old_text": "tool_call", "new_text": "x"}),
    ]:
        assert code_of(await call(server, tool, args)) == "INVALID_PATH", tool
    found = await call(server, "nexus_grep", {"pattern": "CANARY-STATE", "path": "scratch"})
    assert "CANARY-STATE" not in json.dumps(found)


async def test_an_absolute_link_target_through_a_link_outside_is_refused(
    serve: Serve, ws: Path, outside: Path, audit: MemoryAuditSink
) -> None:
    link(outside / "hop", ws)  # outside, pointing back into the workspace
    link(ws / "scratch" / "x", outside / "hop" / "src")
    server = serve(EVERYWHERE)
    await refused(
        server,
        audit,
        [ws, outside],
        "nexus_read_file",
        {"path": "scratch/x/app.py"},
        "INVALID_PATH",
    )
