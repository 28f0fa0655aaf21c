"""The ``repo`` toolset's name, its argument types and its tools' result models."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from nexus_mcp.tools.files import SearchReport

TOOLSET = "repo"

RepoArg = Annotated[str, Field(description="A configured repository's name.")]
RefArg = Annotated[str, Field(description="Branch, tag or commit id (default HEAD).")]
PathArg = Annotated[str, Field(description="Repository-relative path, '/' separated.")]
BranchArg = Annotated[str, Field(description="Branch name, without refs/heads/.")]


class RepoEntry(BaseModel):
    path: str
    type: str = Field(description="file, directory, symlink or submodule")
    size_bytes: int | None = None


class ListRepoFilesResult(BaseModel):
    repo: str
    commit_sha: str
    path: str
    entries: list[RepoEntry]
    truncated: bool


class ReadRepoFileResult(BaseModel):
    repo: str
    commit_sha: str
    path: str
    content: str = Field(description="UTF-8 text; empty when the file is binary.")
    size_bytes: int
    binary: bool
    sha256: str


class SearchLine(BaseModel):
    line_number: int
    text: str


class SearchFile(BaseModel):
    path: str
    matches: list[SearchLine]
    more_in_file: bool


class RepoScanReport(SearchReport):
    """A bounded scan of a repository at one commit (the files toolset's caps report)."""

    repo: str
    commit_sha: str


class SearchContentResult(RepoScanReport):
    files: list[SearchFile]


class ComponentMatch(BaseModel):
    path: str
    kind: str = Field(description="file (its name) or definition (a line that defines it)")
    line_number: int | None = None
    text: str | None = None


class LocateComponentResult(RepoScanReport):
    matches: list[ComponentMatch]


class PatchFile(BaseModel):
    path: str
    old_path: str | None = None
    lines_added: int
    lines_removed: int


class PatchSummary(BaseModel):
    files_changed: int
    lines_added: int
    lines_removed: int
    diff_bytes: int
    files: list[PatchFile]


class PatchRisk(BaseModel):
    rule: str
    paths: list[str] | None = None
    limit: int | None = None
    actual: int | None = None


class CodeownersReview(BaseModel):
    required: bool
    owners: list[str] = Field(description="Every owner of a touched path (CODEOWNERS).")
    unowned_paths: list[str] = Field(description="Touched paths that no one owns.")


class ProposePatchResult(BaseModel):
    repo: str
    branch: str
    base_sha: str
    applies: bool
    diff: str = Field(description="The patch as it would be applied (pass it to apply_patch).")
    summary: PatchSummary
    risks: list[PatchRisk] = Field(description="Every write-policy rule it would break.")
    codeowners: CodeownersReview


class CreateBranchResult(BaseModel):
    repo: str
    branch: str
    commit_sha: str


class ApplyPatchResult(BaseModel):
    repo: str
    branch: str
    commit_sha: str
    parent_sha: str
    files_changed: int
    lines_added: int
    lines_removed: int


class PullRequestResult(BaseModel):
    repo: str
    number: int
    url: str
    head: str
    base: str
    head_sha: str


class MergeResult(BaseModel):
    repo: str
    number: int
    merged: bool
    merge_sha: str | None
    head_sha: str
