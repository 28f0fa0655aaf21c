"""The ``files`` toolset: workspace file tools, each declared with ``@nexus_tool``.

Tools receive only workspace-relative paths; containment, atomic writes and workload caps
live in ``workspace/files.py`` and ``workspace/search.py``. Write tools take ``idempotency_key`` and
``approval_token`` arguments because an LLM-driven client can only set arguments; the
chain consumes them before the function runs (DESIGN.md, "Tool calls on the wire").
Blocking file I/O runs in a worker thread so the event loop (and timeouts) stay live.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field

from nexus_mcp.contracts import nexus_tool
from nexus_mcp.errors import ConflictError, InvalidInputError
from nexus_mcp.settings import Settings
from nexus_mcp.workspace.commits import run_guarded
from nexus_mcp.workspace.files import Workspace
from nexus_mcp.workspace.search import (
    CAP_RESULTS,
    CAP_TIME,
    SandboxStopped,
    ScanBudget,
    bounded,
    compile_glob,
    compile_matcher,
    grep_file,
    has_allowed_extension,
    is_binary,
    line_finder,
)

TOOLSET = "files"

PathArg = Annotated[str, Field(description="Workspace-relative path, '/' separated.")]
IdempotencyArg = Annotated[
    str | None,
    Field(description="Required for writes: a unique key; retrying with it never writes twice."),
]
ApprovalArg = Annotated[
    str | None, Field(description="Approval token, when the write policy requires approval.")
]

EntryType = Literal["file", "directory", "symlink", "other"]
T = TypeVar("T")


class ReadFileResult(BaseModel):
    path: str
    content: str = Field(description="UTF-8 text; empty when the file is binary.")
    size_bytes: int
    binary: bool


class FileEntry(BaseModel):
    path: str
    type: EntryType
    size_bytes: int | None = None


class ListFilesResult(BaseModel):
    path: str
    entries: list[FileEntry]
    truncated: bool


class FileInfoResult(BaseModel):
    path: str
    type: EntryType
    size_bytes: int
    modified: str
    binary: bool | None = None
    sha256: str | None = Field(default=None, description="For files within the read limit.")


class SearchReport(BaseModel):
    files_scanned: int
    truncated: bool
    caps_hit: list[str] = Field(description="Workload caps that cut the results, if any.")


class GlobResult(SearchReport):
    matches: list[str]


class GrepLine(BaseModel):
    line_number: int
    text: str


class GrepFile(BaseModel):
    path: str
    matches: list[GrepLine]
    more_in_file: bool


class GrepResult(SearchReport):
    files: list[GrepFile]


class WriteFileResult(BaseModel):
    path: str
    size_bytes: int
    created: bool
    sha256: str


class EditFileResult(BaseModel):
    path: str
    replacements: int
    size_bytes: int
    sha256: str


class DeleteFileResult(BaseModel):
    path: str
    deleted: bool


class MkdirResult(BaseModel):
    path: str
    created: bool


class RmdirResult(BaseModel):
    path: str
    removed_entries: int


class RenameFileResult(BaseModel):
    source: str
    destination: str


def _entry_type(mode: int) -> EntryType:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


async def _read(work: Callable[[], T]) -> T:
    """Blocking read-only file work in a thread (nothing to commit, so no guard)."""
    return await asyncio.to_thread(work)


async def _io(work: Callable[[], T]) -> T:
    """Blocking file work in a thread under a ``CommitGuard`` (``commits.run_guarded``)."""
    return await run_guarded(lambda _guard: work())


def build_files_tools(
    workspace: Workspace, settings: Settings
) -> list[Callable[..., Awaitable[Any]]]:
    """The files toolset bound to one workspace."""
    limits, caps = settings.limits, settings.search

    @nexus_tool(risk="read", toolset=TOOLSET, loggable_args=("path",))
    async def nexus_read_file(path: PathArg) -> ReadFileResult:
        """Read a UTF-8 text file from the workspace. Files over the read limit are refused."""
        target = workspace.named(path)
        data = await _read(lambda: workspace.read_bytes(target, limit=limits.max_read_bytes))
        binary = is_binary(data[: caps.binary_sniff_bytes]) or not _is_utf8(data)
        content = "" if binary else data.decode("utf-8")
        return ReadFileResult(
            path=target.relative, content=content, size_bytes=len(data), binary=binary
        )

    @nexus_tool(risk="read", toolset=TOOLSET, loggable_args=("path", "recursive"))
    async def nexus_list_files(path: PathArg = ".", recursive: bool = False) -> ListFilesResult:
        """List a folder of the workspace (its direct entries, or everything below it)."""
        target = workspace.named(path)

        def scan() -> ListFilesResult:
            entries: list[FileEntry] = []
            truncated = False
            with workspace.open_dir(target) as (dir_fd, base):
                for _folder, fd, dirnames, filenames in workspace.iter_tree(
                    dir_fd, base, recursive=recursive
                ):
                    for name in sorted([*dirnames, *filenames]):
                        if len(entries) >= limits.max_list_entries:
                            truncated = True
                            break
                        try:
                            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        except FileNotFoundError:
                            continue  # removed while we listed
                        kind = _entry_type(info.st_mode)
                        entries.append(
                            FileEntry(
                                path="/".join((*_folder, name)),
                                type=kind,
                                size_bytes=info.st_size if kind == "file" else None,
                            )
                        )
                    if truncated:
                        break
            return ListFilesResult(
                path=target.relative or ".", entries=entries, truncated=truncated
            )

        return await _read(scan)

    @nexus_tool(risk="read", toolset=TOOLSET, loggable_args=("path",))
    async def nexus_file_info(path: PathArg) -> FileInfoResult:
        """Describe one file or folder: type, size, modification time and sha256."""
        target = workspace.named(path)

        def describe() -> FileInfoResult:
            info, data = workspace.describe(target, hash_limit=limits.max_read_bytes)
            kind = _entry_type(info.st_mode)
            digest, binary = None, None
            if data is not None:
                digest = hashlib.sha256(data).hexdigest()
                binary = is_binary(data[: caps.binary_sniff_bytes])
            return FileInfoResult(
                path=target.relative or ".",
                type=kind,
                size_bytes=info.st_size,
                modified=datetime.fromtimestamp(info.st_mtime, UTC).isoformat(),
                binary=binary,
                sha256=digest,
            )

        return await _read(describe)

    @nexus_tool(risk="read", toolset=TOOLSET, loggable_args=("pattern", "path"))
    async def nexus_glob(
        pattern: Annotated[str, Field(description="Glob such as '**/*.md'; '**' spans folders.")],
        path: PathArg = ".",
    ) -> GlobResult:
        """Find files whose path below ``path`` matches a glob (bounded by workload caps)."""
        matcher = compile_glob(pattern)
        target = workspace.named(path)

        def scan() -> GlobResult:
            budget = ScanBudget(caps)
            matches: list[str] = []
            with workspace.open_dir(target) as (dir_fd, base):
                for found in bounded(
                    workspace.walk_files(dir_fd, base, stop=budget.out_of_time), budget
                ):
                    if matcher.match(found.below):
                        if len(matches) >= caps.max_results:
                            budget.cut(CAP_RESULTS)
                            break
                        matches.append(found.relative)
            return GlobResult(
                matches=matches,
                files_scanned=budget.files_scanned,
                truncated=bool(budget.cut_by),
                caps_hit=budget.cut_by,
            )

        return await _read(scan)

    @nexus_tool(
        risk="read", toolset=TOOLSET, loggable_args=("path", "glob", "regex", "case_sensitive")
    )
    async def nexus_grep(
        pattern: Annotated[str, Field(description="Text to find (a regex when regex=true).")],
        path: PathArg = ".",
        glob: Annotated[str | None, Field(description="Only files matching this glob.")] = None,
        regex: bool = False,
        case_sensitive: bool = True,
    ) -> GrepResult:
        """Search text files for a string or regex, within the workload caps of the server."""
        matcher = compile_matcher(pattern, regex=regex, case_sensitive=case_sensitive, caps=caps)
        file_filter = compile_glob(glob, field="glob") if glob is not None else None
        target = workspace.named(path)

        def scan() -> GrepResult:
            budget = ScanBudget(caps)
            files: list[GrepFile] = []
            try:
                with (
                    workspace.open_dir(target) as (dir_fd, base),
                    line_finder(matcher, regex=regex, caps=caps, deadline=budget.deadline) as find,
                ):
                    for found_file in bounded(
                        workspace.walk_files(dir_fd, base, stop=budget.out_of_time), budget
                    ):
                        if not has_allowed_extension(found_file.relative, caps):
                            continue
                        if file_filter is not None and not file_filter.match(found_file.below):
                            continue
                        found = grep_file(workspace, found_file, find, caps)
                        if not found or not found[0]:
                            continue
                        if len(files) >= caps.max_results:
                            budget.cut(CAP_RESULTS)
                            break
                        lines, more = found
                        if more:
                            budget.cut("max_matches_per_file")
                        files.append(
                            GrepFile(
                                path=found_file.relative,
                                matches=[
                                    GrepLine(line_number=m.line_number, text=m.text) for m in lines
                                ],
                                more_in_file=more,
                            )
                        )
            except SandboxStopped:  # a regex ran past the time budget: its child was killed
                budget.cut(CAP_TIME)
            return GrepResult(
                files=files,
                files_scanned=budget.files_scanned,
                truncated=bool(budget.cut_by),
                caps_hit=budget.cut_by,
            )

        return await _read(scan)

    @nexus_tool(risk="write", toolset=TOOLSET, loggable_args=("path", "overwrite"), idempotent=True)
    async def nexus_write_file(
        path: PathArg,
        content: Annotated[str, Field(description="The complete new UTF-8 content.")],
        overwrite: bool = True,
        idempotency_key: IdempotencyArg = None,
        approval_token: ApprovalArg = None,
    ) -> WriteFileResult:
        """Create or replace a text file atomically (temporary file, fsync, rename)."""
        target = workspace.named(path)
        data = content.encode("utf-8")
        existed = await _io(lambda: workspace.write_atomic(target, data, overwrite=overwrite))
        return WriteFileResult(
            path=target.relative,
            size_bytes=len(data),
            created=not existed,
            sha256=hashlib.sha256(data).hexdigest(),
        )

    @nexus_tool(risk="write", toolset=TOOLSET, loggable_args=("path", "expected_occurrences"))
    async def nexus_edit_file(
        path: PathArg,
        old_text: Annotated[str, Field(description="Exact text to replace (not empty).")],
        new_text: Annotated[str, Field(description="Replacement text.")],
        expected_occurrences: Annotated[
            int, Field(ge=1, description="How many times old_text must occur.")
        ] = 1,
        idempotency_key: IdempotencyArg = None,
        approval_token: ApprovalArg = None,
    ) -> EditFileResult:
        """Replace exact text in a file; refuses unless it occurs exactly as often as expected."""
        if not old_text:
            raise InvalidInputError(field="old_text")
        target = workspace.named(path)
        replaced = 0

        def change(original: bytes) -> bytes:
            nonlocal replaced
            try:
                text = original.decode("utf-8")
            except UnicodeDecodeError:
                raise ConflictError("file is not UTF-8 text", reason="binary") from None
            found = text.count(old_text)
            if found != expected_occurrences:
                raise ConflictError(
                    "old_text does not occur exactly expected_occurrences times",
                    reason="occurrences",
                    found=found,
                )
            replaced = found
            return text.replace(old_text, new_text).encode("utf-8")

        def edit() -> EditFileResult:
            data = workspace.edit(target, change, limit=limits.max_read_bytes)
            return EditFileResult(
                path=target.relative,
                replacements=replaced,
                size_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
            )

        return await _io(edit)

    @nexus_tool(risk="write", toolset=TOOLSET, loggable_args=("path",))
    async def nexus_delete_file(
        path: PathArg, idempotency_key: IdempotencyArg = None, approval_token: ApprovalArg = None
    ) -> DeleteFileResult:
        """Delete one file (never a folder; use nexus_rmdir for folders)."""
        target = workspace.named(path)
        await _io(lambda: workspace.delete_file(target))
        return DeleteFileResult(path=target.relative, deleted=True)

    @nexus_tool(risk="write", toolset=TOOLSET, loggable_args=("path", "parents"), idempotent=True)
    async def nexus_mkdir(
        path: PathArg,
        parents: bool = False,
        idempotency_key: IdempotencyArg = None,
        approval_token: ApprovalArg = None,
    ) -> MkdirResult:
        """Create a folder (and its parents when parents=true)."""
        target = workspace.named(path)
        created = await _io(lambda: workspace.make_dir(target, parents=parents))
        return MkdirResult(path=target.relative, created=created)

    @nexus_tool(risk="write", toolset=TOOLSET, loggable_args=("path", "recursive"))
    async def nexus_rmdir(
        path: PathArg,
        recursive: bool = False,
        idempotency_key: IdempotencyArg = None,
        approval_token: ApprovalArg = None,
    ) -> RmdirResult:
        """Remove a folder; only an empty one unless recursive=true."""
        target = workspace.named(path)
        removed = await _io(lambda: workspace.remove_dir(target, recursive=recursive))
        return RmdirResult(path=target.relative, removed_entries=removed)

    @nexus_tool(risk="write", toolset=TOOLSET, loggable_args=("source", "destination", "overwrite"))
    async def nexus_rename_file(
        source: PathArg,
        destination: PathArg,
        overwrite: bool = False,
        idempotency_key: IdempotencyArg = None,
        approval_token: ApprovalArg = None,
    ) -> RenameFileResult:
        """Rename or move a file or folder within the workspace."""
        src = workspace.named(source)
        dst = workspace.named(destination)
        await _io(lambda: workspace.rename(src, dst, overwrite=overwrite))
        return RenameFileResult(source=src.relative, destination=dst.relative)

    return [
        nexus_read_file,
        nexus_list_files,
        nexus_file_info,
        nexus_glob,
        nexus_grep,
        nexus_write_file,
        nexus_edit_file,
        nexus_delete_file,
        nexus_mkdir,
        nexus_rmdir,
        nexus_rename_file,
    ]


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


__all__ = ["TOOLSET", "build_files_tools"]
