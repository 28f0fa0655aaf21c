"""ConfinedRoot: resolution beneath a root on descriptors, and the workspace under a race."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nexus_mcp.confinement import MAX_SYMLINKS, ConfinedRoot
from nexus_mcp.errors import Code, NexusError
from nexus_mcp.policy.write_policy import DEV_WRITE_POLICY, PathGate
from nexus_mcp.workspace import ResolvedPath, Workspace

from ..support.swapper import Swapper


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "root"
    (base / "a" / "b").mkdir(parents=True)
    (base / "a" / "b" / "f.txt").write_text("f")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("CANARY")
    return base


def code(action: Callable[[], object]) -> str:
    with pytest.raises(NexusError) as info:
        action()
    return str(info.value.code)


@pytest.mark.parametrize(
    ("link_target", "expected"),
    [
        ("a/b", ("a", "b", "f.txt")),
        ("./a/./b/", ("a", "b", "f.txt")),
        ("a/b/../b", ("a", "b", "f.txt")),
        ("ABS:a/b", ("a", "b", "f.txt")),
    ],
)
def test_links_inside_resolve_to_their_real_path(
    root: Path, link_target: str, expected: tuple[str, ...]
) -> None:
    target = str(root / link_target[4:]) if link_target.startswith("ABS:") else link_target
    (root / "l").symlink_to(target)
    assert ConfinedRoot(root).real_parts(["l", "f.txt"]) == expected


@pytest.mark.parametrize(
    "link_target",
    ["../..", "../../outside", "../../../outside", "ABS:outside", "ABS:root/../outside"],
)
def test_links_leaving_the_root_are_invalid_paths(root: Path, link_target: str) -> None:
    target = str(root.parent / link_target[4:]) if link_target.startswith("ABS:") else link_target
    (root / "a" / "l").symlink_to(target)
    confined = ConfinedRoot(root)
    assert code(lambda: confined.real_parts(["a", "l", "secret"])) == Code.INVALID_PATH
    with pytest.raises(NexusError):
        with confined.locate(["a", "l", "secret"]):
            pass


def test_a_link_up_to_the_root_itself_is_the_root(root: Path) -> None:
    (root / "a" / "up").symlink_to("..")
    assert ConfinedRoot(root).real_parts(["a", "up", "a", "b"]) == ("a", "b")


def test_loops_and_long_chains_are_refused(root: Path) -> None:
    (root / "x").symlink_to("y")
    (root / "y").symlink_to("x")
    confined = ConfinedRoot(root)
    assert code(lambda: confined.real_parts(["x"])) == Code.INVALID_PATH
    previous = "a"
    for index in range(MAX_SYMLINKS + 1):
        (root / f"c{index}").symlink_to(previous)
        previous = f"c{index}"
    assert code(lambda: confined.real_parts([previous])) == Code.INVALID_PATH
    assert confined.real_parts([f"c{MAX_SYMLINKS - 1}"]) == ("a",)


def test_a_name_longer_than_the_file_system_allows_is_an_invalid_path(root: Path) -> None:
    confined = ConfinedRoot(root)
    assert code(lambda: confined.real_parts(["x" * 300])) == Code.INVALID_PATH
    assert code(lambda: confined.real_parts(["a", "x" * 300, "y"])) == Code.INVALID_PATH


def test_not_following_the_final_link_locates_the_link_itself(root: Path) -> None:
    (root / "l").symlink_to("a/b/f.txt")
    confined = ConfinedRoot(root)
    with confined.locate(["l"], follow_final=False) as entry:
        assert entry.parts == ("l",) and entry.is_link
    with confined.locate(["l"]) as target:
        assert target.parts == ("a", "b", "f.txt") and target.is_file


def test_a_missing_parent_is_not_found_but_real_parts_names_it(root: Path) -> None:
    confined = ConfinedRoot(root)
    assert code(lambda: confined.locate(["nope", "x"]).__enter__()) == Code.NOT_FOUND
    assert confined.real_parts(["nope", "x"]) == ("nope", "x")


def test_a_root_replaced_by_another_folder_is_refused(root: Path) -> None:
    confined = ConfinedRoot(root)
    root.rename(root.with_name("moved"))
    root.mkdir()
    assert code(lambda: confined.real_parts(["a"])) == Code.CONFLICT


# -- the race ---------------------------------------------------------------------------


def race_operations(ws: Workspace, i: int) -> list[tuple[str, Callable[[], object]]]:
    def at(path: str) -> ResolvedPath:
        return ws.resolve_parent(path)

    return [
        ("read", lambda: ws.read_bytes(at("d/secret"), limit=100)),
        ("write", lambda: ws.write_atomic(at(f"d/n{i}"), b"w", overwrite=True)),
        ("edit", lambda: ws.edit(at("d/secret"), lambda data: data, limit=100)),
        ("mkdir", lambda: ws.make_dir(at(f"d/m{i}"), parents=False)),
        ("mkdir", lambda: ws.make_dir(at(f"d/m{i}/x"), parents=False)),
        ("rename", lambda: ws.rename(at(f"d/n{i}"), at(f"d/r{i}"), overwrite=False)),
        ("delete", lambda: ws.delete_file(at(f"d/r{i}"))),
        ("rmdir", lambda: ws.remove_dir(at(f"d/m{i}"), recursive=True)),
    ]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def raced(tmp_path: Path) -> Iterator[tuple[Workspace, Path, Path]]:
    ws_root = tmp_path / "ws"
    (ws_root / "d").mkdir(parents=True)
    (ws_root / "d" / "secret").write_text("inside")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("CANARY-OUTSIDE")
    yield Workspace(ws_root, gate=PathGate(DEV_WRITE_POLICY)), ws_root, outside


def test_a_folder_swapped_for_a_link_never_redirects_an_operation_outside(
    raced: tuple[Workspace, Path, Path],
) -> None:
    ws, ws_root, outside = raced
    before = snapshot(outside)
    outcomes: dict[str, int] = {}
    with Swapper(ws_root / "d", outside) as swapper:
        deadline = time.monotonic() + 3
        index = 0
        while time.monotonic() < deadline:
            index += 1
            operations = race_operations(ws, index)
            for name, operation in operations:
                try:
                    value = operation()
                except NexusError as exc:
                    key = f"{name}:{exc.code}"
                else:
                    assert b"CANARY" not in (value if isinstance(value, bytes) else b"")
                    key = f"{name}:ok"
                outcomes[key] = outcomes.get(key, 0) + 1
    assert swapper.swaps > 0
    assert snapshot(outside) == before, "something outside the workspace was created or changed"
    assert not list(outside.glob(".nexus-*")), "a temporary file was left outside"
    assert not [p for p in ws_root.rglob(".nexus-*")], "a temporary file was left inside"
    # Both sides of the race were seen: calls that ran and calls the swap refused.
    assert any(k.endswith(":ok") for k in outcomes), outcomes
    assert set(outcomes) - {k for k in outcomes if k.endswith(":ok")}, outcomes
