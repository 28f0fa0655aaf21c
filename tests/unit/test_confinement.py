"""ConfinedRoot: resolution beneath a root on descriptors, and the workspace under a race."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nexus_mcp.errors import Code, NexusError
from nexus_mcp.policy.write_policy import DEV_WRITE_POLICY, PathGate
from nexus_mcp.workspace.confinement import MAX_SYMLINKS, ConfinedRoot, walk_tree
from nexus_mcp.workspace.files import Workspace
from nexus_mcp.workspace.paths import ResolvedPath

from ..support.swapper import Swapper
from ..support.trees import make_chain, remove_tree


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


@pytest.mark.parametrize(
    "parts",
    [["a\ud800b"], ["a", "\udfff"], ["\udcff.txt"], ["a", "b", "x\udc80y", "z"]],
    ids=["high", "low", "escaped-byte", "middle"],
)
def test_a_name_with_a_lone_surrogate_is_an_invalid_path_and_creates_nothing(
    root: Path, parts: list[str]
) -> None:
    confined = ConfinedRoot(root)
    before = sorted(p.name for p in root.rglob("*"))
    assert code(lambda: confined.real_parts(parts)) == Code.INVALID_PATH
    with pytest.raises(NexusError) as info, confined.locate(parts):
        pass
    assert info.value.code == Code.INVALID_PATH
    assert sorted(p.name for p in root.rglob("*")) == before


def test_a_path_past_path_max_is_an_invalid_path_before_any_walk(root: Path) -> None:
    confined = ConfinedRoot(root)
    room = 4096 - len(str(confined.path)) - 1  # PATH_MAX counts the final NUL
    fits = ["abcdefgh"] * (room // 9 - 1)  # missing folders: a walk answers NOT_FOUND
    assert code(lambda: confined.locate(fits).__enter__()) == Code.NOT_FOUND
    too_long = ["abcdefgh"] * (room // 9 + 1)
    assert code(lambda: confined.real_parts(too_long)) == Code.INVALID_PATH
    assert code(lambda: confined.locate(too_long).__enter__()) == Code.INVALID_PATH
    multibyte = ["\u00e9" * 127]  # 254 bytes: one name, within NAME_MAX
    assert confined.real_parts(multibyte) == tuple(multibyte)
    assert code(lambda: confined.real_parts(["\u00e9" * 128])) == Code.INVALID_PATH


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


# -- walking a tree ----------------------------------------------------------------------


def test_a_walk_never_enters_a_link_and_needs_no_recursion(tmp_path: Path) -> None:
    root = tmp_path / "w"
    deep = make_chain(root, 1200)  # past Python's recursion limit
    (deep / "leaf").write_text("x")
    (root / "out").symlink_to(tmp_path)  # would loop forever if followed
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        folders = list(walk_tree(fd, strict=True))
    finally:
        os.close(fd)
    assert len(folders) == 1201
    assert folders[0].others == ["out"] and folders[-1].others == ["leaf"]
    remove_tree(root)  # pytest's own clean-up of tmp_path would recurse past its limit


def test_a_folder_swapped_for_a_fifo_never_hangs_a_walk(tmp_path: Path) -> None:
    root = tmp_path / "w"
    (root / "d").mkdir(parents=True)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                os.rmdir(root / "d")
                os.mkfifo(root / "d")
                os.unlink(root / "d")
                os.mkdir(root / "d")

    def walk_for(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for strict in (False, True):
                fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    list(walk_tree(fd, strict=strict))
                except NexusError:
                    pass  # a strict walk refuses a changed tree; it must not hang
                finally:
                    os.close(fd)

    swapper = threading.Thread(target=swap, daemon=True)
    walker = threading.Thread(target=walk_for, args=(2.0,), daemon=True)
    swapper.start()
    walker.start()
    walker.join(timeout=30)
    stop.set()
    swapper.join(timeout=10)
    assert not walker.is_alive(), "a walk hung on a FIFO"


def test_a_strict_walk_refuses_an_unreadable_folder_and_a_lax_one_skips_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "w"
    (root / "ok").mkdir(parents=True)
    (root / "gone").mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        walk = walk_tree(fd, strict=False)
        first = next(walk)
        os.rmdir(root / "gone")  # disappears between the listing and the descent
        assert [f.parts for f in walk] == [("ok",)]
        assert first.dirs == ["gone", "ok"]
        walk = walk_tree(fd, strict=True)
        next(walk)
        os.rmdir(root / "ok")
        with pytest.raises(NexusError) as info:
            list(walk)
        assert info.value.code == Code.CONFLICT
    finally:
        os.close(fd)
