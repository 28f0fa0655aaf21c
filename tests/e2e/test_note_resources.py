"""Issue 27: each Markdown note of the caller's vault as a resource, ``nexus://notes/{path*}``.

A server built by ``build_server``, FastMCP's in-memory client (both protocol eras), and
once a real ``nexus-mcp serve`` subprocess over stdio. Hostile URIs are sent as written,
through the session, past the client's own URL normalization (which would already
resolve ``..``): a hostile client does not normalize.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastmcp import Client
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from nexus_mcp.envelope import REFUSAL_JSONRPC_CODE
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings

from .conftest import REPO_ROOT, ServerFactory, snapshot
from .servers import server_env

MODES = ["auto", "legacy"]
PREFIX = "nexus://notes/"
BODY_CANARY = "CANARY-NOTE-BODY-7e31"
PATH_CANARY = "CANARY-NOTE-PATH-51c9"
OUTSIDE_CANARY = "CANARY-OUTSIDE-SECRET"
INVALID_PATH = {"error": "Invalid path", "code": "UPSTREAM_ERROR"}
MISSING = {"error": "Upstream 404", "code": "UPSTREAM_ERROR"}
RUNTIME_FAILURE = {"error": "Runtime failure", "code": "UPSTREAM_ERROR"}
NOTE = f"---\ntitle: Plan\n---\n# Plan\n\n{BODY_CANARY} and more.\n"
UNICODE_PATH = "notes/café ünï/日本語 ノート.md"


def write(root: Path, rel: str, data: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_bytes(content: Any) -> bytes:
    text = getattr(content, "text", None)
    if text is not None:
        return str(text).encode("utf-8")
    return base64.b64decode(content.blob)


async def read(client: Client[Any], uri: str) -> list[Any]:
    """One resources/read with ``uri`` sent exactly as written."""
    result = await client.session.read_resource(uri)
    return list(result.contents)


async def refusal(client: Client[Any], uri: str) -> dict[str, Any]:
    """The JSON-RPC error a read gets: its code, message and data, as the client sees it."""
    with pytest.raises(MCPError) as info:
        await client.session.read_resource(uri)
    error = info.value.error
    return {"code": error.code, "message": error.message, "data": error.data}


def refused(envelope: dict[str, str]) -> dict[str, Any]:
    """The refusal of a read as the chain sends it (``envelope.to_request_error``)."""
    message = json.dumps(envelope, separators=(",", ":"))
    return {"code": REFUSAL_JSONRPC_CODE, "message": message, "data": envelope}


def granting_notes(path: Path) -> Path:
    """The shipped profiles, each granting the note resources (``resources: [notes]``)."""
    profiles = yaml.safe_load((REPO_ROOT / "config" / "tool_profiles.yaml").read_text())
    for profile in profiles["profiles"].values():
        profile["resources"] = ["notes"]
    path.write_text(yaml.safe_dump(profiles), encoding="utf-8")
    return path


@pytest.fixture
def serve(make_server: ServerFactory, tmp_path: Path) -> ServerFactory:
    """``make_server`` with the note resources granted (unless ``profiles`` is given)."""
    granted = granting_notes(tmp_path / "profiles-granting-notes.yaml")

    def build(**overrides: Any) -> NexusServer:
        overrides.setdefault("profiles", {"file": granted})
        return make_server(**overrides)

    return build


@pytest.fixture
def notes(workspace: Path) -> Path:
    write(workspace, "notes/plan.md", NOTE)
    write(workspace, UNICODE_PATH, "# ノート\n\ncafé\n")
    return workspace


# -- reading -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_note_reads_whole_as_markdown_with_the_sha256_of_its_bytes(
    serve: ServerFactory, notes: Path, mode: str
) -> None:
    async with Client(serve().mcp, mode=mode) as client:
        contents = await client.read_resource(PREFIX + "notes/plan.md")
    [content] = contents
    dumped = content.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped == {
        "uri": PREFIX + "notes/plan.md",
        "mimeType": "text/markdown",
        "_meta": {"nexus/sha256": sha256(NOTE.encode())},
        "text": NOTE,
    }


async def test_a_nested_note_of_the_demo_workspace_reads_as_stored(
    serve: ServerFactory, workspace: Path
) -> None:
    rel = "notes/projects/atlas/meeting-notes_2026-10-14.md"
    stored = (workspace / rel).read_bytes()
    async with Client(serve().mcp) as client:
        [content] = await client.read_resource(PREFIX + rel)
    assert content_bytes(content) == stored
    assert content.meta == {"nexus/sha256": sha256(stored)}


async def test_a_unicode_name_reads_percent_encoded_or_as_the_client_sends_it(
    serve: ServerFactory, notes: Path
) -> None:
    stored = (notes / UNICODE_PATH).read_bytes()
    encoded = (
        PREFIX
        + "notes/caf%C3%A9%20%C3%BCn%C3%AF/"
        + ("%E6%97%A5%E6%9C%AC%E8%AA%9E%20%E3%83%8E%E3%83%BC%E3%83%88.md")
    )
    async with Client(serve().mcp) as client:
        by_client = await client.read_resource(PREFIX + UNICODE_PATH)  # the client encodes
        by_hand = await read(client, encoded)
        as_written = await read(client, PREFIX + UNICODE_PATH)  # raw UTF-8 in the URI
    for [content] in (by_client, by_hand, as_written):
        assert content_bytes(content) == stored
        assert content.meta == {"nexus/sha256": sha256(stored)}


async def test_a_note_that_is_not_utf8_is_a_blob_of_its_exact_bytes(
    serve: ServerFactory, workspace: Path
) -> None:
    stored = b"\xef\xbb\xbf# BOM then Latin-1 \xe9t\xe9\n\xff"
    write(workspace, "notes/latin.markdown", stored)
    async with Client(serve().mcp) as client:
        [content] = await read(client, PREFIX + "notes/latin.markdown")
    assert content.mime_type == "text/markdown"
    assert base64.b64decode(content.blob) == stored
    assert content.meta == {"nexus/sha256": sha256(stored)}


async def test_a_bom_and_crlf_survive_as_text_byte_for_byte(
    serve: ServerFactory, workspace: Path
) -> None:
    stored = "\ufeff# Title\r\n\r\nbody\u2028x\r\n".encode()
    write(workspace, "notes/Windows.MD", stored)
    async with Client(serve().mcp) as client:
        [content] = await read(client, PREFIX + "notes/Windows.MD")
    assert content.text.encode("utf-8") == stored
    assert content.meta == {"nexus/sha256": sha256(stored)}


async def test_the_template_is_listed_and_no_note_is(serve: ServerFactory, notes: Path) -> None:
    async with Client(serve().mcp) as client:
        templates = await client.list_resource_templates()
        resources = await client.list_resources()
    assert resources == []  # template only: no walk of the vault per page
    [template] = templates
    assert (template.uri_template, template.name, template.mime_type) == (
        "nexus://notes/{path*}",
        "note",
        "text/markdown",
    )
    assert template.meta is not None
    assert template.meta["nexus"] == {"risk": "read", "toolset": "notes"}


async def test_a_read_only_caller_reads_notes_a_read_is_no_write(
    serve: ServerFactory, notes: Path
) -> None:
    before = snapshot(notes)
    async with Client(serve(read_only=True).mcp) as client:
        [content] = await read(client, PREFIX + "notes/plan.md")
    assert content.text == NOTE
    assert snapshot(notes) == before


async def test_without_a_grant_the_template_is_hidden_and_a_note_reads_as_unknown(
    make_server: ServerFactory, notes: Path
) -> None:
    # The shipped profiles grant no resources: the notes are not readable as a whole.
    async with Client(make_server().mcp) as client:
        assert await client.list_resource_templates() == []
        hidden = await refusal(client, PREFIX + "notes/plan.md")
        unknown = await refusal(client, "nexus://elsewhere/plan.md")
    assert hidden == unknown
    assert hidden["code"] == -32602
    assert BODY_CANARY not in json.dumps(hidden)


# -- the document limit ------------------------------------------------------------------


async def test_a_note_over_the_read_limit_is_refused_unread_and_one_at_it_is_read(
    serve: ServerFactory, workspace: Path
) -> None:
    limit = 4096
    write(workspace, "notes/at.md", "a" * limit)
    write(workspace, "notes/over.md", BODY_CANARY + "b" * limit)
    async with Client(serve(limits={"max_read_bytes": limit}).mcp) as client:
        [at] = await read(client, PREFIX + "notes/at.md")
        over = await refusal(client, PREFIX + "notes/over.md")
    assert len(at.text) == limit
    assert over == refused(
        {"error": f"document exceeds the max_read_bytes limit of {limit} bytes",
         "code": "DOC_SIZE_EXCEEDED"}
    )  # fmt: skip
    assert BODY_CANARY not in json.dumps(over)


async def test_a_multibyte_note_is_measured_in_bytes_not_characters(
    serve: ServerFactory, workspace: Path
) -> None:
    write(workspace, "notes/wide.md", "é" * 3000)  # 3000 characters, 6000 bytes
    async with Client(serve(limits={"max_read_bytes": 5000}).mcp) as client:
        answer = await refusal(client, PREFIX + "notes/wide.md")
    assert answer["data"]["code"] == "DOC_SIZE_EXCEEDED"


# -- refusals: the notes tools' answers, never the path ----------------------------------

TRAVERSALS = [
    f"../{PATH_CANARY}.md",
    f"notes/../../{PATH_CANARY}.md",
    f"%2e%2e/{PATH_CANARY}.md",
    f"%2E%2E%2F{PATH_CANARY}.md",
    f"notes/%2e%2e/%2e%2e/ws-evil/{PATH_CANARY}.md",
    f"/etc/{PATH_CANARY}.md",
    f"%2Fetc%2F{PATH_CANARY}.md",
    f"C:/Users/{PATH_CANARY}.md",
    f"c:%5CUsers%5C{PATH_CANARY}.md",
    f"..\\..\\{PATH_CANARY}.md",
    f"notes%5C..%5C..%5C{PATH_CANARY}.md",
    f"\\\\server\\share\\{PATH_CANARY}.md",
    f"notes/{PATH_CANARY}%00.md",
    f"notes/{PATH_CANARY}\x00.md",
    f"notes/{PATH_CANARY}%FF.md",  # not UTF-8: refused, never replaced
    f"notes/{PATH_CANARY}%ED%A0%80.md",  # an encoded lone surrogate
    f"notes/{PATH_CANARY}.md?raw=1",
    f"notes/{PATH_CANARY}.md#frag",
    "",
    "%20",
    f"escape-link/{PATH_CANARY}.md",
]


@pytest.mark.parametrize("mode", MODES)
async def test_every_escape_is_invalid_path_without_echo_and_nothing_changes(
    serve: ServerFactory, workspace: Path, mode: str
) -> None:
    (workspace.parent / "ws-evil" / f"{PATH_CANARY}.md").write_text(OUTSIDE_CANARY)
    before = snapshot(workspace)
    async with Client(serve().mcp, mode=mode) as client:
        answers = {rest: await refusal(client, PREFIX + rest) for rest in TRAVERSALS}
    assert answers == dict.fromkeys(TRAVERSALS, refused(INVALID_PATH))
    dumped = json.dumps(list(answers.values()))
    assert PATH_CANARY not in dumped and OUTSIDE_CANARY not in dumped
    assert snapshot(workspace) == before


async def test_a_link_out_of_the_workspace_is_refused_as_any_escape(
    serve: ServerFactory, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.md"
    outside.write_text(OUTSIDE_CANARY)
    (workspace / "notes" / "link-out.md").symlink_to(outside)
    (workspace / "notes" / "dir-out").symlink_to(tmp_path / "ws-evil")
    (tmp_path / "ws-evil" / "n.md").write_text(OUTSIDE_CANARY)
    inside = write(workspace, "notes/inside.md", "# inside\n")
    (workspace / "notes" / "link-in.md").symlink_to(inside)
    async with Client(serve().mcp) as client:
        link_file = await refusal(client, PREFIX + "notes/link-out.md")
        link_dir = await refusal(client, PREFIX + "notes/dir-out/n.md")
        [followed] = await read(client, PREFIX + "notes/link-in.md")
    assert link_file == link_dir == refused(INVALID_PATH)
    assert followed.text == "# inside\n"  # a link that stays inside is the notes tools' rule


async def test_server_state_inside_the_workspace_is_never_a_note(
    serve: ServerFactory, workspace: Path, audit: MemoryAuditSink
) -> None:
    data_dir = workspace / "state"
    profiles = granting_notes(workspace / "profiles.md")
    server = serve(data_dir=data_dir, profiles={"file": profiles})
    state_files = sorted(p for p in data_dir.rglob("*") if p.is_file())
    assert state_files  # the grants database at least
    write(data_dir, "planted.md", BODY_CANARY)  # anything in the data dir
    os.link(state_files[0], workspace / "notes" / "hardlinked-state.md")
    async with Client(server.mcp) as client:
        answers = [
            await refusal(client, PREFIX + rest)
            for rest in (
                "state/planted.md",
                "state/absent.md",  # refused whether or not it exists
                "state/vaults/x.md",
                "profiles.md",  # the profiles file the server trusts
                "notes/hardlinked-state.md",  # server state under another name
                "notes/../state/planted.md",
            )
        ]
    assert answers == [refused(INVALID_PATH)] * len(answers)
    assert BODY_CANARY not in json.dumps(answers)


async def test_missing_not_markdown_folder_and_fifo_answer_alike(
    serve: ServerFactory, workspace: Path
) -> None:
    write(workspace, "notes/todo.txt", BODY_CANARY)
    write(workspace, "notes/noext", BODY_CANARY)
    (workspace / "notes" / "folder.md").mkdir()
    before = snapshot(workspace)
    fifo = workspace / "notes" / "pipe.md"
    os.mkfifo(fifo)  # must not block the read
    rests = [
        f"notes/{PATH_CANARY}.md",
        "notes/todo.txt",
        "todo.txt",
        "notes/noext",
        "notes",
        "notes/folder.md",
        "notes/pipe.md",
        "notes/plan.md/x.md",
    ]
    async with Client(serve().mcp) as client:
        answers = {rest: await refusal(client, PREFIX + rest) for rest in rests}
    assert answers == dict.fromkeys(rests, refused(MISSING))
    dumped = json.dumps(list(answers.values()))
    assert BODY_CANARY not in dumped and PATH_CANARY not in dumped
    fifo.unlink()  # the snapshot reads every file, and a FIFO would block it
    assert snapshot(workspace) == before


async def test_an_unknown_vault_reads_as_a_missing_note(serve: ServerFactory, notes: Path) -> None:
    server = serve(vault_id="no-such-vault")
    async with Client(server.mcp) as client:
        answer = await refusal(client, PREFIX + "notes/plan.md")
    assert answer == refused(MISSING)


async def test_a_principal_with_a_vault_reads_its_vault_not_the_workspace(
    serve: ServerFactory, notes: Path, tmp_path: Path
) -> None:
    vault = tmp_path / "vault-a"
    write(vault, "notes/plan.md", "# vault a\n")
    server = serve(vault_id="a", notes={"vaults": {"a": vault}})
    async with Client(server.mcp) as client:
        [content] = await read(client, PREFIX + "notes/plan.md")
        missing = await refusal(client, PREFIX + "notes/café ünï/日本語 ノート.md")
    assert content.text == "# vault a\n"
    assert missing == refused(MISSING)


async def test_the_notes_tools_and_the_resource_refuse_the_same_paths_alike(
    serve: ServerFactory, notes: Path
) -> None:
    cases = {"notes/absent.md": MISSING, f"../{PATH_CANARY}.md": INVALID_PATH,
             "C:/x.md": INVALID_PATH, "notes": MISSING}  # fmt: skip
    async with Client(serve().mcp) as client:
        for path, expected in cases.items():
            tool = await client.call_tool("get_note_outline", {"path": path}, raise_on_error=False)
            assert json.loads(tool.content[0].text) == expected, path
            assert (await refusal(client, PREFIX + path))["data"] == expected, path


async def test_reads_log_one_bounded_line_and_are_audited_without_path_or_content(
    serve: ServerFactory, notes: Path, log_output: io.StringIO, audit: MemoryAuditSink
) -> None:
    async with Client(serve().mcp) as client:
        await read(client, PREFIX + "notes/plan.md")
        await refusal(client, PREFIX + f"../{PATH_CANARY}.md")
        await refusal(client, PREFIX + f"{PATH_CANARY}.md")
    text = log_output.getvalue()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    reads = [line for line in lines if line.get("event") == "notes_resource"]
    assert [(r["outcome"], r["upstream_status_class"]) for r in reads] == [
        ("ok", None),
        ("invalid_path", None),
        ("upstream_status", "4xx"),
    ]
    assert reads[0]["size_bytes"] == len(NOTE.encode())
    for leaked in (BODY_CANARY, PATH_CANARY, "notes/plan.md"):
        assert leaked not in text
    records = [r for r in audit.records() if r.get("resource_source") == "notes"]
    assert [(r["outcome"], r["uri_sha256"]) for r in records] == [
        ("OK", sha256((PREFIX + "notes/plan.md").encode())),
        ("UPSTREAM_ERROR", sha256((PREFIX + f"../{PATH_CANARY}.md").encode())),
        ("UPSTREAM_ERROR", sha256((PREFIX + f"{PATH_CANARY}.md").encode())),
    ]
    audited = json.dumps(audit.records())
    for leaked in (BODY_CANARY, PATH_CANARY, "notes/plan.md"):
        assert leaked not in audited


async def test_a_canister_backend_serves_no_note_resources(tmp_path: Path, workspace: Path) -> None:
    # The canister hands over parsed notes, not files: there is no note file to serve.
    settings = Settings(
        mode="dev",
        workspace=workspace,
        data_dir=tmp_path / "data",
        notes={"backend": "canister", "canister_url": "https://canister.example",
               "canister_token": "t"},
    )  # fmt: skip
    server: NexusServer = build_server(settings, audit_sinks=[MemoryAuditSink()])
    try:
        async with Client(server.mcp) as client:
            assert await client.list_resource_templates() == []
            with pytest.raises(MCPError) as info:
                await client.session.read_resource(PREFIX + "notes/plan.md")
        assert info.value.error.code == -32602  # FastMCP's unknown resource
    finally:
        server.close()


# -- a real stdio subprocess -------------------------------------------------------------


@pytest.mark.slow
async def test_stdio_serve_reads_a_note_and_refuses_with_the_envelope_on_the_wire(
    notes: Path, tmp_path: Path
) -> None:
    before = snapshot(notes)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nexus_mcp", "serve", "--mode", "dev", "--workspace", str(notes),
              "--data-dir", str(tmp_path / "data")],
        env=server_env({"NEXUS_MCP_PROFILES__FILE": str(granting_notes(tmp_path / "p.yaml"))}),
    )  # fmt: skip
    stderr_path = tmp_path / "stderr.log"
    with stderr_path.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as session,
        ):
            await session.initialize()
            templates = (await session.list_resource_templates()).resource_templates
            note = await session.read_resource(PREFIX + "notes/plan.md")
            unicode_note = await session.read_resource(PREFIX + UNICODE_PATH)
            errors = []
            for rest in (f"%2e%2e/{PATH_CANARY}.md", f"{PATH_CANARY}.md"):
                with pytest.raises(MCPError) as info:
                    await session.read_resource(PREFIX + rest)
                errors.append(info.value.error.model_dump(mode="json", exclude_none=True))
    assert [t.uri_template for t in templates] == ["nexus://notes/{path*}"]
    [content] = note.contents
    assert content.text == NOTE
    assert content.mime_type == "text/markdown"
    assert content.meta == {"nexus/sha256": sha256(NOTE.encode())}
    assert unicode_note.contents[0].text == "# ノート\n\ncafé\n"
    assert errors == [refused(INVALID_PATH), refused(MISSING)]
    stderr = stderr_path.read_text()
    for leaked in (BODY_CANARY, PATH_CANARY, "notes/plan.md"):
        assert leaked not in stderr
    assert snapshot(notes) == before
