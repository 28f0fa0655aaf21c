"""The local vault backend: one read, real-path containment, sanitized refusals, no writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nexus_mcp.errors import DocSizeExceededError, UpstreamError
from nexus_mcp.notes.backends import (
    LocalVaultBackend,
    NoteBackend,
    NoteFileReader,
    is_path_inside,
)
from nexus_mcp.principal import Principal

CALLER = Principal(subject="tester", vault_id="vault-1", user_id="user-1")


def _vault(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "inbox").mkdir(parents=True)
    (root / "inbox" / "one.md").write_text(
        "---\ntitle: One\n---\n# Heading\n\nbody\n", encoding="utf-8"
    )
    return root


def _snapshot(path: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
        if not p.is_symlink()
    }


async def test_local_backend_reads_one_note_with_frontmatter_split(tmp_path: Path) -> None:
    backend = LocalVaultBackend(_vault(tmp_path))
    assert isinstance(backend, NoteBackend)
    source = await backend.read_note("inbox/one.md", CALLER)
    assert source.frontmatter == {"title": "One"}
    assert source.body == "# Heading\n\nbody\n"


async def test_missing_notes_and_directories_are_upstream_404(tmp_path: Path) -> None:
    backend = LocalVaultBackend(_vault(tmp_path))
    for path in ("inbox/missing.md", "inbox", "missing/deeper.md"):
        with pytest.raises(UpstreamError) as caught:
            await backend.read_note(path, CALLER)
        assert caught.value.message == "Upstream 404"


async def test_a_symlink_pointing_outside_the_vault_is_refused(tmp_path: Path) -> None:
    root = _vault(tmp_path)
    secret = tmp_path / "secret.md"
    secret.write_text("# CANARY-OUTSIDE\n", encoding="utf-8")
    (root / "inbox" / "leak.md").symlink_to(secret)
    (root / "linked").symlink_to(tmp_path)
    backend = LocalVaultBackend(root)
    for path in ("inbox/leak.md", "linked/secret.md"):
        with pytest.raises(UpstreamError) as caught:
            await backend.read_note(path, CALLER)
        assert caught.value.message == "Invalid path"
        assert "CANARY" not in str(caught.value) and str(tmp_path) not in str(caught.value)


async def test_a_sibling_folder_sharing_the_root_prefix_is_refused(tmp_path: Path) -> None:
    root = _vault(tmp_path)
    evil = tmp_path / "root-evil"
    evil.mkdir()
    (evil / "secret.md").write_text("# secret\n", encoding="utf-8")
    (root / "evil.md").symlink_to(evil / "secret.md")
    with pytest.raises(UpstreamError) as caught:
        await LocalVaultBackend(root).read_note("evil.md", CALLER)
    assert caught.value.message == "Invalid path"
    assert is_path_inside(str(root), str(root / "a.md"))
    assert not is_path_inside(str(root), str(evil / "secret.md"))


async def test_a_symlink_inside_the_vault_is_followed(tmp_path: Path) -> None:
    root = _vault(tmp_path)
    (root / "alias.md").symlink_to(root / "inbox" / "one.md")
    source = await LocalVaultBackend(root).read_note("alias.md", CALLER)
    assert source.frontmatter == {"title": "One"}


async def test_a_vault_root_given_through_a_symlink_still_contains_its_notes(
    tmp_path: Path,
) -> None:
    root = _vault(tmp_path)
    alias = tmp_path / "alias-root"
    alias.symlink_to(root)
    source = await LocalVaultBackend(alias).read_note("inbox/one.md", CALLER)
    assert source.body.startswith("# Heading")


async def test_an_oversized_file_is_a_runtime_failure_without_reading_it(tmp_path: Path) -> None:
    root = _vault(tmp_path)
    (root / "big.md").write_bytes(b"x" * 2048)
    with pytest.raises(UpstreamError) as caught:
        await LocalVaultBackend(root, max_file_bytes=1024).read_note("big.md", CALLER)
    assert caught.value.message == "Runtime failure"


async def test_a_fifo_is_not_a_note_and_does_not_block(tmp_path: Path) -> None:
    root = _vault(tmp_path)
    os.mkfifo(root / "pipe.md")
    with pytest.raises(UpstreamError) as caught:
        await LocalVaultBackend(root).read_note("pipe.md", CALLER)
    assert caught.value.message == "Upstream 404"


async def test_invalid_utf8_is_replaced_like_node_and_a_bom_is_kept(tmp_path: Path) -> None:
    root = _vault(tmp_path)
    (root / "bad.md").write_bytes(b"\xef\xbb\xbf# A\xff\n")
    source = await LocalVaultBackend(root).read_note("bad.md", CALLER)
    assert source.body == "\ufeff# A\ufffd\n"


async def test_a_missing_vault_root_is_a_runtime_failure(tmp_path: Path) -> None:
    with pytest.raises(UpstreamError) as caught:
        await LocalVaultBackend(tmp_path / "nope").read_note("a.md", CALLER)
    assert caught.value.message == "Runtime failure"


async def test_an_unnormalized_path_is_refused_by_the_backend_itself(tmp_path: Path) -> None:
    backend = LocalVaultBackend(_vault(tmp_path))
    for path in ("../root/inbox/one.md", "/etc/passwd", "inbox//one.md"):
        with pytest.raises(UpstreamError) as caught:
            await backend.read_note(path, CALLER)
        assert caught.value.message == "Invalid path"


async def test_reads_create_and_change_no_files_in_the_vault(tmp_path: Path) -> None:
    root = _vault(tmp_path)
    before = _snapshot(root)
    backend = LocalVaultBackend(root)
    for _ in range(3):
        await backend.read_note("inbox/one.md", CALLER)
    with pytest.raises(UpstreamError):
        await backend.read_note("inbox/missing.md", CALLER)
    assert _snapshot(root) == before


async def test_hidden_state_is_refused_by_inode_and_by_its_missing_folders(tmp_path: Path) -> None:
    root = _vault(tmp_path)
    state = root / "state"
    (state / "db").mkdir(parents=True)
    (state / "db" / "grants.sqlite3").write_bytes(b"CANARY-STATE")
    os.link(state / "db" / "grants.sqlite3", root / "inbox" / "grants.md")
    os.link(root / "inbox" / "one.md", root / "inbox" / "two.md")  # other names: still a note
    backend = LocalVaultBackend(root, hidden=[state / "db", state / "vaults"])
    for path in ("inbox/grants.md", "state/db/x.md", "state/vaults/v/x.md", "state/vaults"):
        for read in (
            backend.read_note(path, CALLER),
            backend.read_note_bytes(path, CALLER, max_bytes=1024),
        ):
            with pytest.raises(UpstreamError) as caught:
                await read
            assert caught.value.message == "Invalid path", path
    assert (await backend.read_note("inbox/two.md", CALLER)).body == "# Heading\n\nbody\n"
    with pytest.raises(UpstreamError) as caught:
        await backend.read_note("state/other/x.md", CALLER)  # not hidden: missing
    assert caught.value.message == "Upstream 404"


async def test_the_bytes_of_a_note_are_read_as_stored_under_the_callers_limit(
    tmp_path: Path,
) -> None:
    root = _vault(tmp_path)
    stored = b"\xef\xbb\xbf# A\xff\r\n"
    (root / "bad.md").write_bytes(stored)
    backend = LocalVaultBackend(root, max_file_bytes=4)  # the tools' cap is not the limit
    assert isinstance(backend, NoteFileReader)
    assert await backend.read_note_bytes("bad.md", CALLER, max_bytes=len(stored)) == stored
    with pytest.raises(DocSizeExceededError) as caught:
        await backend.read_note_bytes("bad.md", CALLER, max_bytes=len(stored) - 1)
    assert caught.value.facts == {"limit_name": "max_read_bytes", "limit_bytes": len(stored) - 1}
