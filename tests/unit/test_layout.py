"""The package's shape holds (issue 23, ``LAYOUT.md``): no import circles between files,
few modules flat at the top, and no module so long that it must hold several concerns.

The import-linter contracts in ``pyproject.toml`` (``make check``) keep the layers; this
test reads every import itself, including the ones Python would not notice at import
time (inside functions, under ``TYPE_CHECKING``): a circle is a tie between files
whether or not it fails at start-up.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import nexus_mcp

PACKAGE = Path(nexus_mcp.__file__).resolve().parent
ROOT = "nexus_mcp"
MAX_TOP_LEVEL_MODULES = 14
MAX_LINES = 700
# Modules where one concern earns the length (issue 23 names them), with a ceiling so
# they do not grow unnoticed.
EARNED = {"nexus_mcp.repos.repository": 850, "nexus_mcp.workspace.confinement": 700}


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package by dotted name: (its file, whether it is a package)."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = [ROOT, *path.relative_to(PACKAGE).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


def _owner(name: str, known: dict[str, tuple[Path, bool]]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(
    name: str, path: Path, is_package: bool, known: dict[str, tuple[Path, bool]]
) -> Iterator[str]:
    """Every module of ours that ``name`` imports, anywhere in its text."""
    base = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                owner = _owner(alias.name, known)
                if owner is not None:
                    yield owner
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")[: len(base.split(".")) - (node.level - 1)]
                module = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module != ROOT and not module.startswith(ROOT + "."):
                continue
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                owner = submodule if submodule in known else _owner(module, known)
                if owner is not None:
                    yield owner


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {
        name: set(imports_of(name, path, is_package, known)) - {name}
        for name, (path, is_package) in known.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_two_files_import_each_other_even_lazily() -> None:
    assert circles(import_graph()) == []


def test_the_circle_finder_sees_a_lazy_or_type_checking_circle() -> None:
    # The test above can fail: a tie made only inside a function or under TYPE_CHECKING
    # is a circle too.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    known = modules()
    path, is_package = known["nexus_mcp.server.build"]
    assert "nexus_mcp.connector" in set(
        imports_of("nexus_mcp.server.build", path, is_package, known)
    )


def test_few_modules_sit_flat_at_the_top() -> None:
    flat = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(flat) <= MAX_TOP_LEVEL_MODULES, flat


def test_no_module_holds_several_concerns_by_length() -> None:
    too_long = {}
    for name, (path, _is_package) in modules().items():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > EARNED.get(name, MAX_LINES):
            too_long[name] = lines
    assert too_long == {}


def test_the_composition_root_is_only_imported_from_above() -> None:
    # Nothing on a call's path (providers, middleware, the connector, policy...) imports
    # the server package: only the transports and the commands that start one.
    graph = import_graph()
    allowed = ("nexus_mcp.server", "nexus_mcp.transport", "nexus_mcp.commands", ROOT)
    importers = {
        name
        for name, imported in graph.items()
        if any(i == "nexus_mcp.server" or i.startswith("nexus_mcp.server.") for i in imported)
        and not any(name == a or name.startswith(a + ".") for a in allowed[:-1])
        and name != ROOT
    }
    assert importers == set()
