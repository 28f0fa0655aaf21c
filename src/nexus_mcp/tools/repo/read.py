"""The ``repo`` toolset's reads of files: ``list_repo_files``, ``read_repo_file``,
``search_content`` and ``locate_component``. Each looks at git objects at a commit, never at
the working tree (``repos/repository.py``), in a worker thread (``scan.git_read``)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from pydantic import Field

from nexus_mcp.contracts import nexus_tool
from nexus_mcp.errors import ConflictError, DocSizeExceededError, InvalidInputError, NotFoundError
from nexus_mcp.repos.catalog import RepoCatalog
from nexus_mcp.repos.repository import REASON_NOT_A_FILE, TreeEntry, check_repo_path
from nexus_mcp.settings import Settings
from nexus_mcp.tools.repo.models import (
    TOOLSET,
    ComponentMatch,
    ListRepoFilesResult,
    LocateComponentResult,
    PathArg,
    ReadRepoFileResult,
    RefArg,
    RepoArg,
    RepoEntry,
    SearchContentResult,
    SearchFile,
    SearchLine,
)
from nexus_mcp.tools.repo.scan import (
    git_read,
    guarded_line_finder,
    out_of_time,
    require_folder,
    scan_report,
    scan_texts,
)
from nexus_mcp.workspace.search import (
    CAP_RESULTS,
    CAP_TIME,
    MAX_SEARCHED_LINE_CHARS,
    SandboxStopped,
    ScanBudget,
    compile_glob,
    compile_matcher,
    has_allowed_extension,
    is_binary,
)

MAX_LINE_CHARS = 400
LINES_PER_TIME_CHECK = 256
_IDENTIFIER_RE = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$-]{0,127}$")
_DEFINITION_KEYWORDS = (
    "def|class|function|interface|type|struct|enum|trait|fn|func|module|const|let|var|"
    "impl|object|record|protocol|component"
)


def build_read_tools(
    catalog: RepoCatalog, settings: Settings
) -> list[Callable[..., Awaitable[Any]]]:
    """The read tools over the configured repositories, in the toolset's order."""
    limits, caps = settings.limits, settings.search

    @nexus_tool(risk="read", toolset=TOOLSET, loggable_args=("repo", "path", "ref", "recursive"))
    async def list_repo_files(
        repo: RepoArg, path: PathArg = ".", ref: RefArg = "HEAD", recursive: bool = False
    ) -> ListRepoFilesResult:
        """List a folder of a repository at a ref (its entries, or everything below it)."""
        repository = catalog.get(repo)
        folder = check_repo_path(path)

        def scan() -> ListRepoFilesResult:
            commit = repository.resolve_commit(ref)
            require_folder(repository, commit, folder)
            entries: list[RepoEntry] = []
            truncated = False
            for entry in repository.list_tree(commit, folder, recursive=recursive):
                if len(entries) >= limits.max_list_entries:
                    truncated = True
                    break
                entries.append(
                    RepoEntry(
                        path=entry.path,
                        type=entry.type,
                        size_bytes=entry.size if entry.type == "file" else None,
                    )
                )
            return ListRepoFilesResult(
                repo=repository.name,
                commit_sha=commit,
                path=folder or ".",
                entries=entries,
                truncated=truncated,
            )

        return await git_read(scan)

    @nexus_tool(risk="read", toolset=TOOLSET, loggable_args=("repo", "path", "ref"))
    async def read_repo_file(
        repo: RepoArg, path: PathArg, ref: RefArg = "HEAD"
    ) -> ReadRepoFileResult:
        """Read a file of a repository at a ref (HEAD by default), never the working tree."""
        repository = catalog.get(repo)
        name = check_repo_path(path)
        if not name:
            raise ConflictError("not a file", reason=REASON_NOT_A_FILE)

        def read() -> ReadRepoFileResult:
            commit = repository.resolve_commit(ref)
            entry = repository.entry(commit, name)
            if entry is None:
                raise NotFoundError(reason="path_not_found")
            if entry.type != "file":
                raise ConflictError("not a file", reason=REASON_NOT_A_FILE)
            # The read limit, or what git may hand over within its output bound if less.
            limit = min(limits.max_read_bytes, repository.runner.max_output_bytes // 2)
            if entry.size is not None and entry.size > limit:
                raise DocSizeExceededError(limit_bytes=limit, limit_name="max_read_bytes")
            data = repository.read_blob(entry.sha)
            binary = is_binary(data[: caps.binary_sniff_bytes]) or not _is_utf8(data)
            return ReadRepoFileResult(
                repo=repository.name,
                commit_sha=commit,
                path=entry.path,
                content="" if binary else data.decode("utf-8"),
                size_bytes=len(data),
                binary=binary,
                sha256=hashlib.sha256(data).hexdigest(),
            )

        return await git_read(read)

    @nexus_tool(
        risk="read",
        toolset=TOOLSET,
        loggable_args=("repo", "path", "ref", "glob", "regex", "case_sensitive"),
    )
    async def search_content(
        repo: RepoArg,
        pattern: Annotated[str, Field(description="Text to find (a regex when regex=true).")],
        path: PathArg = ".",
        ref: RefArg = "HEAD",
        glob: Annotated[str | None, Field(description="Only files matching this glob.")] = None,
        regex: bool = False,
        case_sensitive: bool = True,
    ) -> SearchContentResult:
        """Search a repository's text files at a ref, within the server's workload caps."""
        repository = catalog.get(repo)
        matcher = compile_matcher(pattern, regex=regex, case_sensitive=case_sensitive, caps=caps)
        file_filter = compile_glob(glob, field="glob") if glob is not None else None
        folder = check_repo_path(path)

        def scan() -> SearchContentResult:
            commit = repository.resolve_commit(ref)
            require_folder(repository, commit, folder)
            budget = ScanBudget(caps)
            files: list[SearchFile] = []

            def keep(entry: TreeEntry) -> bool:
                below = entry.path[len(folder) + 1 :] if folder else entry.path
                return has_allowed_extension(entry.path, caps) and (
                    file_filter is None or file_filter.match(below)
                )

            try:
                with guarded_line_finder(
                    matcher, regex=regex, caps=caps, deadline=budget.deadline
                ) as find:
                    # One search per blob, however many paths name it.
                    for entries, text in scan_texts(repository, commit, folder, budget, keep):
                        numbers, more = find(text)
                        if not numbers:
                            continue
                        lines = text.splitlines()
                        matches = [
                            SearchLine(line_number=n, text=lines[n - 1][:MAX_LINE_CHARS])
                            for n in numbers
                        ]
                        if more:
                            budget.cut("max_matches_per_file")
                        for entry in entries:
                            if len(files) >= caps.max_results:
                                budget.cut(CAP_RESULTS)
                                break
                            files.append(
                                SearchFile(path=entry.path, matches=matches, more_in_file=more)
                            )
                        if CAP_RESULTS in budget.cut_by:
                            break
            except SandboxStopped:
                budget.cut(CAP_TIME)
            return SearchContentResult(files=files, **scan_report(repository, commit, budget))

        return await git_read(scan)

    @nexus_tool(risk="read", toolset=TOOLSET, loggable_args=("repo", "name", "path", "ref"))
    async def locate_component(
        repo: RepoArg,
        name: Annotated[str, Field(description="A symbol, component or file name.")],
        path: PathArg = ".",
        ref: RefArg = "HEAD",
    ) -> LocateComponentResult:
        """Find where a symbol, component or file is defined in a repository (bounded)."""
        repository = catalog.get(repo)
        if not isinstance(name, str) or not _IDENTIFIER_RE.fullmatch(name):
            raise InvalidInputError(field="name")
        folder = check_repo_path(path)
        # The name is escaped and the pattern's shape is fixed: it runs in process.
        definition = re.compile(
            rf"(?:^|[\s(,;])(?:(?:{_DEFINITION_KEYWORDS})\s+(?:\([^)]{{0,200}}\)\s*)?)"
            rf"{re.escape(name)}(?![A-Za-z0-9_$])"
        )
        wanted = name.casefold()

        def scan() -> LocateComponentResult:
            commit = repository.resolve_commit(ref)
            require_folder(repository, commit, folder)
            budget = ScanBudget(caps)
            matches: list[ComponentMatch] = []

            def add(match: ComponentMatch) -> bool:
                if len(matches) >= caps.max_results:
                    budget.cut(CAP_RESULTS)
                    return False
                matches.append(match)
                return True

            def keep(entry: TreeEntry) -> bool:
                base = entry.path.rsplit("/", 1)[-1]
                if base.casefold() == wanted or base.split(".", 1)[0].casefold() == wanted:
                    add(ComponentMatch(path=entry.path, kind="file"))
                return has_allowed_extension(entry.path, caps)

            # One search per blob, however many paths name it; the time cap is asked every
            # few hundred lines, so one large file cannot run the call past it.
            for entries, text in scan_texts(repository, commit, folder, budget, keep):
                if CAP_RESULTS in budget.cut_by:
                    break
                found: list[tuple[int, str]] = []
                for number, line in enumerate(text.splitlines(), start=1):
                    if number % LINES_PER_TIME_CHECK == 0 and out_of_time(budget):
                        break
                    if len(line) > MAX_SEARCHED_LINE_CHARS or not definition.search(line):
                        continue
                    found.append((number, line[:MAX_LINE_CHARS]))
                    if len(found) >= caps.max_matches_per_file:
                        budget.cut("max_matches_per_file")
                        break
                for entry in entries:
                    for number, line in found:
                        add(
                            ComponentMatch(
                                path=entry.path, kind="definition", line_number=number, text=line
                            )
                        )
                if CAP_TIME in budget.cut_by:
                    break
            return LocateComponentResult(matches=matches, **scan_report(repository, commit, budget))

        return await git_read(scan)

    return [list_repo_files, read_repo_file, search_content, locate_component]


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
