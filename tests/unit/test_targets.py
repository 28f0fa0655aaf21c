"""Target identities on real folders: stable, distinct, alias-proof; vaults and toolsets."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from nexus_mcp.errors import Code, NexusError, WritePolicyDeniedError
from nexus_mcp.notes.vaults import VaultRouter
from nexus_mcp.policy.targets import (
    RULE_UNKNOWN_TARGET,
    ToolTargets,
    identify_canister_vault,
    identify_folder,
    identify_missing_vault,
    to_target_id,
)
from nexus_mcp.principal import Principal
from nexus_mcp.settings import Settings

CANISTER = "https://canister.example.test"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "served"
    root.mkdir()
    return root


def test_a_folder_has_the_same_identity_every_time_it_is_asked(folder: Path) -> None:
    assert identify_folder(folder) == identify_folder(folder)
    assert len(identify_folder(folder)) == 64


def test_two_folders_side_by_side_have_different_identities(tmp_path: Path, folder: Path) -> None:
    twin = tmp_path / "served-twin"
    twin.mkdir()
    nested = folder / "inner"
    nested.mkdir()
    identities = {identify_folder(p) for p in (folder, twin, nested, tmp_path)}
    assert len(identities) == 4


ALIASES: list[Callable[[Path, Path], Path]] = [
    lambda tmp, root: _link(tmp / "alias", root),
    lambda tmp, root: _link(tmp / "alias-of-alias", _link(tmp / "alias", root)),
    lambda tmp, root: _link(tmp / "parent-alias", root.parent) / root.name,
    lambda tmp, root: root / "." / "sub" / "..",
    lambda tmp, root: Path(os.path.relpath(root)),
]


def _link(link: Path, target: Path) -> Path:
    link.symlink_to(target, target_is_directory=True)
    return link


@pytest.mark.parametrize(
    "alias_of",
    ALIASES,
    ids=["symlink", "symlink-to-symlink", "symlinked-parent", "dot-segments", "relative"],
)
def test_a_folder_reached_by_another_path_has_the_same_identity(
    tmp_path: Path, folder: Path, alias_of: Callable[[Path, Path], Path]
) -> None:
    (folder / "sub").mkdir()  # for the dot-segments path
    assert identify_folder(alias_of(tmp_path, folder)) == identify_folder(folder)


@pytest.mark.skipif(sys.platform != "linux", reason="names that are not UTF-8 need Linux")
def test_folders_whose_names_are_not_utf8_have_distinct_identities(tmp_path: Path) -> None:
    names = [b"bad-\xff", b"bad-\xfe", "bad-\udcff".encode("utf-8", "surrogatepass")]
    paths = []
    for name in names:
        raw = os.path.join(os.fsencode(tmp_path), name)
        os.mkdir(raw)
        paths.append(Path(os.fsdecode(raw)))
    assert len({identify_folder(path) for path in paths}) == len(names)


def test_a_folder_moved_to_another_path_is_a_new_target(tmp_path: Path, folder: Path) -> None:
    before = identify_folder(folder)
    moved = folder.rename(tmp_path / "moved")
    assert identify_folder(moved) != before


@pytest.mark.parametrize("kind", ["missing", "dangling-link", "link-loop"])
def test_a_folder_that_cannot_be_found_is_not_found(tmp_path: Path, kind: str) -> None:
    path = tmp_path / kind
    if kind == "dangling-link":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "link-loop":
        path.symlink_to(tmp_path / "loop-b")
        (tmp_path / "loop-b").symlink_to(path)
    with pytest.raises(NexusError) as caught:
        identify_folder(path)
    assert caught.value.code == Code.NOT_FOUND
    assert str(tmp_path) not in caught.value.message


def test_identities_of_different_kinds_never_collide() -> None:
    identities = {
        identify_canister_vault(CANISTER, "v1"),
        identify_canister_vault(CANISTER, "v2"),
        identify_canister_vault(CANISTER + "/other", "v1"),
        identify_canister_vault(CANISTER, None),
        identify_missing_vault("v1"),
        to_target_id("folder", CANISTER, "v1"),
        # Field boundaries cannot be shifted to forge another identity.
        to_target_id("canister", CANISTER + "v", "1"),
    }
    assert len(identities) == 7


def test_a_canister_url_with_a_trailing_slash_is_the_same_canister() -> None:
    assert identify_canister_vault(CANISTER + "/", "v1") == identify_canister_vault(CANISTER, "v1")
    assert identify_canister_vault(CANISTER, None) == identify_canister_vault(CANISTER, "")


# --- toolsets ----------------------------------------------------------------------------

ALICE = Principal(subject="alice", vault_id="v1")


def test_a_tool_gets_the_target_its_toolset_names_for_the_caller() -> None:
    asked: list[Principal] = []

    def vault_of(principal: Principal) -> str:
        asked.append(principal)
        return f"vault-{principal.vault_id}"

    targets = ToolTargets(
        {"files": lambda principal, _args: "workspace", "notes": lambda p, _args: vault_of(p)},
        {"nexus_write_file": "files", "get_note_outline": "notes"},
    )
    assert targets.target_of("nexus_write_file", ALICE, {}) == "workspace"
    assert targets.target_of("get_note_outline", ALICE, {}) == "vault-v1"
    assert asked == [ALICE]
    assert targets.has_target("nexus_write_file") and targets.has_target("get_note_outline")


@pytest.mark.parametrize("tool", ["mounted_tool", "stamp_record"])
def test_a_tool_without_a_target_is_refused_as_unknown_target(tool: str) -> None:
    targets = ToolTargets({"files": lambda principal, _args: "workspace"}, {"stamp_record": "test"})
    assert not targets.has_target(tool)
    with pytest.raises(WritePolicyDeniedError) as caught:
        targets.target_of(tool, ALICE, {})
    assert caught.value.code == Code.WRITE_POLICY_DENIED
    assert caught.value.facts == {"rule": RULE_UNKNOWN_TARGET}


# --- vaults ------------------------------------------------------------------------------


def local_router(tmp_path: Path, workspace: Path, **notes: Any) -> VaultRouter:
    return VaultRouter(
        Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "data", notes=notes)
    )


def test_a_caller_without_a_vault_acts_on_the_workspace(tmp_path: Path, folder: Path) -> None:
    router = local_router(tmp_path, folder)
    assert router.target_for(Principal(subject="alice")) == identify_folder(folder)


def test_each_local_vault_is_its_own_target(tmp_path: Path, folder: Path) -> None:
    mapped = tmp_path / "mapped-vault"
    mapped.mkdir()
    default = tmp_path / "data" / "vaults" / "v-default"
    default.mkdir(parents=True)
    router = local_router(tmp_path, folder, vaults={"v-mapped": mapped})
    of = {
        v: router.target_for(Principal(subject="alice", vault_id=v))
        for v in ("v-mapped", "v-default")
    }
    assert of == {"v-mapped": identify_folder(mapped), "v-default": identify_folder(default)}
    assert identify_folder(folder) not in of.values()


@pytest.mark.parametrize("vault_id", ["absent", "..", "bad/id"])
def test_a_vault_that_does_not_exist_matches_no_folder(
    tmp_path: Path, folder: Path, vault_id: str
) -> None:
    router = local_router(tmp_path, folder)
    target = router.target_for(Principal(subject="alice", vault_id=vault_id))
    assert target == identify_missing_vault(vault_id)
    assert target != identify_folder(folder)


def test_a_vault_created_later_becomes_a_folder_target(tmp_path: Path, folder: Path) -> None:
    router = local_router(tmp_path, folder)
    caller = Principal(subject="alice", vault_id="late")
    before = router.target_for(caller)
    created = tmp_path / "data" / "vaults" / "late"
    created.mkdir(parents=True)
    assert router.target_for(caller) == identify_folder(created) != before


@pytest.fixture
async def canister_router(tmp_path: Path, folder: Path) -> AsyncIterator[VaultRouter]:
    router = local_router(
        tmp_path, folder, backend="canister", canister_url=CANISTER + "/", canister_token="t"
    )
    yield router
    await router.aclose()


async def test_each_canister_vault_is_its_own_target(canister_router: VaultRouter) -> None:
    one = canister_router.target_for(Principal(subject="alice", vault_id="v1"))
    same = canister_router.target_for(Principal(subject="bob", vault_id="v1"))
    other = canister_router.target_for(Principal(subject="alice", vault_id="v2"))
    assert one == same == identify_canister_vault(CANISTER, "v1")
    assert other == identify_canister_vault(CANISTER, "v2") != one
