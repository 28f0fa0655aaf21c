"""Deep folder trees for tests, and their removal without recursion.

pytest removes old ``tmp_path`` folders with ``shutil.rmtree``, which recurses once per
level: a tree deeper than Python's recursion limit, left behind, breaks that clean-up.
"""

from __future__ import annotations

import os
from pathlib import Path


def make_chain(top: Path, depth: int, name: str = "d") -> Path:
    """``top/d/d/.../d`` ``depth`` levels below ``top`` (created); returns the deepest."""
    path = top
    path.mkdir(parents=True, exist_ok=True)
    for _ in range(depth):
        path = path / name
        os.mkdir(path)
    return path


def remove_tree(top: Path) -> None:
    """Remove ``top`` and everything below it, links never followed, at any depth."""
    if not top.exists() and not top.is_symlink():
        return
    order: list[Path] = []
    stack = [top]
    while stack:  # pre-order without recursion; folders removed in reverse afterwards
        folder = stack.pop()
        order.append(folder)
        for entry in os.scandir(folder):
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            else:
                os.unlink(entry.path)
    for folder in reversed(order):
        os.rmdir(folder)
