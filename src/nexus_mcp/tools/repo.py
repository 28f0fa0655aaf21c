"""The ``repo`` toolset: seed 003's git operations, each declared with ``@nexus_tool``.

Reads (``list_repo_files``, ``read_repo_file``, ``search_content``, ``locate_component``
and ``propose_patch``, a dry run) look at git objects at a commit, never at the working
tree (``repos/repository.py``). Writes (``create_branch``, ``apply_patch``,
``open_pull_request``, ``merge_guarded``) need an idempotency key, pass the repository's
write policy and, where it asks, an approval (``repos/writes.py`` decides them in the
chain's approval layer; each tool checks again and acts on exactly what was decided).
Every write names what it changed in its tool effect's ``target_ref``: the branch it
created, the commit it made, the head it proposed or the merge commit.

The repository is named by its configured name (``repo``), never by a path. git runs in
worker threads, so the event loop and the chain's timeouts stay live.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, Field

from nexus_mcp.calls import current_call
from nexus_mcp.contracts import nexus_tool
from nexus_mcp.errors import (
    FACT_OUTCOME_UNKNOWN,
    ConflictError,
    DocSizeExceededError,
    InvalidInputError,
    MergeBlockedError,
    NotFoundError,
    UpstreamError,
    WritePolicyDeniedError,
)
from nexus_mcp.policy.merge_rules import approving_reviewers, evaluate_merge
from nexus_mcp.policy.repos import (
    RULE_DOES_NOT_APPLY,
    PatchFacts,
    PolicyRisk,
    branch_rule,
    decide_operation,
    patch_risks,
    precheck_patch,
)
from nexus_mcp.repos.catalog import RepoCatalog
from nexus_mcp.repos.git import (
    GitDeadlineError,
    current_work,
    git_timeouts_as_refusals,
    in_git_worker,
)
from nexus_mcp.repos.remote import push_branch, remote_branch
from nexus_mcp.repos.repository import (
    MODE_EXECUTABLE,
    MODE_FILE,
    REASON_NOT_A_FILE,
    PatchAnalysis,
    Repository,
    TreeEntry,
    check_branch_name,
    check_repo_path,
)
from nexus_mcp.repos.writes import (
    Prepared,
    RepoWrites,
    git_identity,
    merge_rules,
    to_patch_bytes,
)
from nexus_mcp.settings import SearchSettings, Settings
from nexus_mcp.tools.files import ApprovalArg, IdempotencyArg, SearchReport
from nexus_mcp.workspace.commits import CommitGuard, run_guarded
from nexus_mcp.workspace.search import (
    CAP_FILES_SCANNED,
    CAP_RESULTS,
    CAP_TIME,
    MAX_SEARCHED_LINE_CHARS,
    LineFinder,
    SandboxStopped,
    ScanBudget,
    compile_glob,
    compile_matcher,
    has_allowed_extension,
    is_binary,
    line_finder,
)

TOOLSET = "repo"
MAX_LINE_CHARS = 400
LINES_PER_TIME_CHECK = 256
_IDENTIFIER_RE = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$-]{0,127}$")
_DEFINITION_KEYWORDS = (
    "def|class|function|interface|type|struct|enum|trait|fn|func|module|const|let|var|"
    "impl|object|record|protocol|component"
)
T = TypeVar("T")

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


async def _git(work: Callable[[], T]) -> T:
    """Run a read's git work in a worker thread (``repos.git.in_git_worker``): a cancelled
    call's git is killed and its thread stopped before the caller is answered."""
    with git_timeouts_as_refusals():
        return await in_git_worker(work)


async def _committing(work: Callable[[CommitGuard], T]) -> T:
    """A write's git work under a ``CommitGuard``: cancelled, its ref update is forbidden
    and the thread awaited, so a timed-out write never lands later."""
    with git_timeouts_as_refusals():
        return await run_guarded(work)


def build_repo_tools(
    catalog: RepoCatalog, writes: RepoWrites, settings: Settings
) -> list[Callable[..., Awaitable[Any]]]:
    """The repo toolset over the configured repositories."""
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
            _require_folder(repository, commit, folder)
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

        return await _git(scan)

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

        return await _git(read)

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
            _require_folder(repository, commit, folder)
            budget = ScanBudget(caps)
            files: list[SearchFile] = []

            def keep(entry: TreeEntry) -> bool:
                below = entry.path[len(folder) + 1 :] if folder else entry.path
                return has_allowed_extension(entry.path, caps) and (
                    file_filter is None or file_filter.match(below)
                )

            try:
                with _line_finder(
                    matcher, regex=regex, caps=caps, deadline=budget.deadline
                ) as find:
                    # One search per blob, however many paths name it.
                    for entries, text in _scan_texts(repository, commit, folder, budget, keep):
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
            return SearchContentResult(files=files, **_report(repository, commit, budget))

        return await _git(scan)

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
            _require_folder(repository, commit, folder)
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
            for entries, text in _scan_texts(repository, commit, folder, budget, keep):
                if CAP_RESULTS in budget.cut_by:
                    break
                found: list[tuple[int, str]] = []
                for number, line in enumerate(text.splitlines(), start=1):
                    if number % LINES_PER_TIME_CHECK == 0 and _out_of_time(budget):
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
            return LocateComponentResult(matches=matches, **_report(repository, commit, budget))

        return await _git(scan)

    @nexus_tool(risk="read", toolset=TOOLSET, loggable_args=("repo", "branch"))
    async def propose_patch(
        repo: RepoArg,
        branch: BranchArg,
        patch: Annotated[str, Field(description="A unified diff (git format).")],
    ) -> ProposePatchResult:
        """Dry-run a patch against a branch: what it changes, every policy rule it would break,
        the CODEOWNERS owners it needs, whether it applies. Changes nothing."""
        repository = catalog.get(repo)
        check_branch_name(branch)
        data = to_patch_bytes(patch)

        def review() -> ProposePatchResult:
            tip = repository.branch_tip(branch)
            if tip is None:
                raise NotFoundError(reason="branch_not_found")
            policy = repository.policy
            # Too large, or a binary literal: reported as such, and git never reads it.
            early = precheck_patch(policy, data)
            analysis = (
                PatchAnalysis(tip, False, PatchFacts(len(data), (), 0, 0))
                if early
                else repository.analyze_patch(tip, data)
            )
            risks: list[PolicyRisk] = list(early)
            gate = decide_operation(policy, "apply_patch")
            if not gate.allowed:
                risks.append(PolicyRisk(gate.rule))
            rule = branch_rule(repository.config, policy, branch, repository.default_branch)
            if rule is not None:
                risks.append(PolicyRisk(rule))
            if not analysis.applies and not early:
                risks.append(PolicyRisk(RULE_DOES_NOT_APPLY))
            if not early:
                risks += patch_risks(policy, analysis.facts)
            owners = writes.codeowners(repository)
            paths = analysis.facts.changed_paths
            every_owner = sorted({o for p in paths for o in owners.owners_of(p)})
            unowned = [p for p in paths if not owners.owners_of(p)]
            required = policy is not None and policy.require_codeowners
            return ProposePatchResult(
                repo=repository.name,
                branch=branch,
                base_sha=tip,
                applies=analysis.applies,
                diff=data.decode("utf-8"),
                summary=PatchSummary(
                    files_changed=len(paths),
                    lines_added=analysis.facts.lines_added,
                    lines_removed=analysis.facts.lines_removed,
                    diff_bytes=analysis.facts.diff_bytes,
                    files=[
                        PatchFile(
                            path=f.path,
                            old_path=f.old_path,
                            lines_added=f.lines_added,
                            lines_removed=f.lines_removed,
                        )
                        for f in analysis.files
                    ],
                ),
                risks=[PatchRisk(**risk.to_dict()) for risk in risks],
                codeowners=CodeownersReview(
                    required=required, owners=every_owner, unowned_paths=unowned
                ),
            )

        return await _git(review)

    @nexus_tool(
        risk="write", toolset=TOOLSET, loggable_args=("repo", "branch", "from_ref"), idempotent=True
    )
    async def create_branch(
        repo: RepoArg,
        branch: BranchArg,
        from_ref: Annotated[
            str | None, Field(description="Where the branch starts (default: default branch).")
        ] = None,
        idempotency_key: IdempotencyArg = None,
        approval_token: ApprovalArg = None,
    ) -> CreateBranchResult:
        """Create a branch (allowed by the repository's write policy) at a ref."""
        prepared = await _prepared(writes, "create_branch")
        repository, commit = prepared.repository, prepared.commit
        assert commit is not None
        # Judged again now, on the very commit the branch will point at.
        async with _judged_again():
            await _git(lambda: writes.recheck_publish(prepared, repository.default_branch))
            await writes.check_owners(prepared, _approver())
        await _committing(lambda guard: repository.create_branch(branch, commit, guard))
        _target(f"refs/heads/{branch}")
        return CreateBranchResult(repo=repository.name, branch=branch, commit_sha=commit)

    @nexus_tool(risk="write", toolset=TOOLSET, loggable_args=("repo", "branch"))
    async def apply_patch(
        repo: RepoArg,
        branch: BranchArg,
        patch: Annotated[str, Field(description="A unified diff (git format).")],
        message: Annotated[str, Field(description="The commit message.")],
        idempotency_key: IdempotencyArg = None,
        approval_token: ApprovalArg = None,
    ) -> ApplyPatchResult:
        """Commit a patch onto a branch that is not the default or a protected branch,
        refused unless it applies cleanly and passes the repository's write policy."""
        prepared = await _prepared(writes, "apply_patch")
        approver = _approver()
        await writes.check_owners(prepared, approver)
        state = current_call()
        principal = state.principal if state is not None else None
        author = git_identity(principal.subject if principal is not None else "unknown")
        committer = git_identity(approver) if approver else author
        trailers = [f"Nexus-Tool-Call: {state.tool_call_id if state else ''}"]
        if approver:
            trailers.insert(0, f"Approved-by: {committer[0]} <{committer[1]}>")
        full_message = message.rstrip("\n") + "\n\n" + "\n".join(trailers) + "\n"
        repository, analysis = prepared.repository, prepared.analysis
        assert analysis is not None

        def commit(guard: CommitGuard) -> str:
            return repository.commit_patch(
                branch,
                analysis,
                prepared.patch,
                message=full_message,
                author=author,
                committer=committer,
                guard=guard,
            )

        sha = await _committing(commit)
        _target(sha)
        facts = analysis.facts
        return ApplyPatchResult(
            repo=repository.name,
            branch=branch,
            commit_sha=sha,
            parent_sha=analysis.base_commit,
            files_changed=len(facts.changed_paths),
            lines_added=facts.lines_added,
            lines_removed=facts.lines_removed,
        )

    @nexus_tool(risk="write", toolset=TOOLSET, loggable_args=("repo", "branch", "base", "draft"))
    async def open_pull_request(
        repo: RepoArg,
        branch: BranchArg,
        title: Annotated[str, Field(description="The pull request's title (one line).")],
        body: Annotated[str, Field(description="The pull request's description.")] = "",
        base: Annotated[
            str | None, Field(description="The branch to merge into (default: default branch).")
        ] = None,
        draft: bool = False,
        idempotency_key: IdempotencyArg = None,
        approval_token: ApprovalArg = None,
    ) -> PullRequestResult:
        """Push a branch to the forge and open a pull request for it."""
        prepared = await _prepared(writes, "open_pull_request")
        repository, head_sha = prepared.repository, prepared.commit
        forge = repository.config.forge
        assert forge is not None and head_sha is not None
        target_base = base or repository.default_branch
        # Judged again right before the push, on the exact commit pushed (a sha, never the
        # branch's name, which may have moved since): whatever it publishes passes the
        # write policy and its approver owns it.
        async with _judged_again():
            await _git(lambda: writes.recheck_publish(prepared, target_base))
        if forge.push_url is None:
            async with _judged_again():
                await writes.check_owners(prepared, _approver())
        else:
            push_url = forge.push_url
            token = writes.forge_token(repository)
            # What the push target already holds is not published; the rest is judged.
            remote_base = await _git(
                lambda: remote_branch(repository, target_base, push_url, token)
            )
            async with _judged_again():
                await _git(lambda: writes.recheck_push(prepared, remote_base))
                await writes.check_owners(prepared, _approver())
            # Guarded like a ref update: a call that timed out never pushes afterwards.
            await _committing(
                lambda guard: push_branch(repository, branch, head_sha, push_url, token, guard)
            )
        async with contextlib.aclosing(writes.forge(repository)) as client:
            with _after_sending():
                pull = await client.create_pull(
                    head=branch, base=target_base, title=title, body=body, draft=draft
                )
        _target(pull.head_sha or head_sha)
        return PullRequestResult(
            repo=repository.name,
            number=pull.number,
            url=pull.html_url,
            head=branch,
            base=target_base,
            head_sha=pull.head_sha or head_sha,
        )

    @nexus_tool(
        risk="write", toolset=TOOLSET, loggable_args=("repo", "pull_number", "expected_head_sha")
    )
    async def merge_guarded(
        repo: RepoArg,
        pull_number: Annotated[int, Field(ge=1, description="The pull request's number.")],
        expected_head_sha: Annotated[
            str | None, Field(description="Merge only if the head is still this commit.")
        ] = None,
        idempotency_key: IdempotencyArg = None,
        approval_token: ApprovalArg = None,
    ) -> MergeResult:
        """Merge a pull request only if, asked again now, every required check is green and
        the review and CODEOWNERS rules hold; refused with MERGE_BLOCKED otherwise."""
        prepared = await _prepared(writes, "merge_guarded")
        repository = prepared.repository
        forge = repository.config.forge
        assert forge is not None and prepared.pull is not None
        judged = prepared.pull
        async with contextlib.aclosing(writes.forge(repository)) as client:
            # Asked again at merge time: the rules must hold now, on the head judged.
            pull = await client.get_pull(pull_number)
            rules = merge_rules(repository)
            reviews = await client.list_reviews(pull_number)
            reason = evaluate_merge(
                rules,
                pull,
                await client.combined_status(pull.head_sha),
                await client.check_runs(pull.head_sha),
                reviews,
                expected_head_sha=judged.head_sha,
            )
            if reason is not None:
                raise MergeBlockedError(reason=reason)
            # The whole diff of the head to be merged passes the write policy, asked now,
            # of the pull request as the forge reports it now: its head is the judged one
            # (``head_changed`` otherwise), but its base may have been retargeted or
            # rewound since, and what merging carries in is measured from that base.
            prepared.pull_files = tuple(await client.list_pull_files(pull_number))
            await _git(lambda: writes.judge_pull_content(prepared, pull))
            # CODEOWNERS counts the approvals standing now, not the ones the gate saw.
            prepared.reviewers = approving_reviewers(rules, pull, reviews)
            await writes.check_owners(prepared, _approver())
            with _after_sending():
                outcome = await client.merge_pull(
                    pull_number, sha=judged.head_sha, method=repository.config.merge.method
                )
        if outcome.refused is not None or not outcome.merged:
            raise MergeBlockedError(reason=outcome.refused or "not_mergeable")
        _target(outcome.sha or judged.head_sha)
        return MergeResult(
            repo=repository.name,
            number=pull_number,
            merged=True,
            merge_sha=outcome.sha,
            head_sha=judged.head_sha,
        )

    return [
        list_repo_files,
        read_repo_file,
        search_content,
        locate_component,
        propose_patch,
        create_branch,
        apply_patch,
        open_pull_request,
        merge_guarded,
    ]


# --- helpers of the toolset -----------------------------------------------------------


async def _prepared(writes: RepoWrites, tool: str) -> Prepared:
    """The approval layer's decision for this call, or the same decision made here."""
    state = current_call()
    if state is not None and isinstance(state.prepared, Prepared):
        return writes.prepared_for(state)
    assert state is not None  # the connector refuses a call without the chain
    prepared = await writes.prepare(tool, state.arguments)
    state.prepared = prepared
    return prepared


@contextlib.asynccontextmanager
async def _judged_again() -> AsyncIterator[None]:
    """Around a tool's own second judgement: a refusal there is the write policy's decision
    for this call, recorded as such (the audit's ``policy_decision`` and ``policy_rule``)."""
    try:
        yield
    except WritePolicyDeniedError as exc:
        state = current_call()
        if state is not None:
            state.policy_decision, state.policy_rule = "denied", str(exc.facts.get("rule"))
        raise


@contextlib.contextmanager
def _after_sending() -> Iterator[None]:
    """Around a forge write request: a failure other than the forge's own 4xx answer may
    come after the forge acted (a merge whose reply was lost), so its outcome is unknown
    and the call's idempotency key is never freed for a retry that would act again."""
    try:
        yield
    except UpstreamError as exc:
        status = exc.facts.get("status")
        if not (isinstance(status, int) and 400 <= status < 500):
            exc.facts[FACT_OUTCOME_UNKNOWN] = True
        raise


def _approver() -> str | None:
    state = current_call()
    approval = state.approval if state is not None else None
    approver = approval.get("approver") if approval else None
    return approver if isinstance(approver, str) and approver else None


def _target(ref: str) -> None:
    state = current_call()
    if state is not None:
        state.target_ref = ref


def _report(repository: Repository, commit: str, budget: ScanBudget) -> dict[str, Any]:
    return {
        "repo": repository.name,
        "commit_sha": commit,
        "files_scanned": budget.files_scanned,
        "truncated": bool(budget.cut_by),
        "caps_hit": budget.cut_by,
    }


def _require_folder(repository: Repository, commit: str, folder: str) -> None:
    entry = repository.entry(commit, folder)
    if entry is None:
        raise NotFoundError(reason="path_not_found")
    if entry.type != "directory":
        raise ConflictError("not a folder", reason="not_a_folder")


def _scan_texts(
    repository: Repository,
    commit: str,
    folder: str,
    budget: ScanBudget,
    keep: Callable[[TreeEntry], bool],
) -> Iterator[tuple[list[TreeEntry], str]]:
    """(entries, text) of each text blob below ``folder``, once per blob with every entry
    naming it, within the budget's caps.

    The time cap is asked between entries and blobs, and it is the deadline of every git
    command of the scan (``GitWork.deadline``): a listing or a batch of blobs still
    running at the cap is killed and the scan reports ``max_seconds``.
    """
    caps = budget.caps
    work = current_work()
    if work is not None:
        work.deadline = budget.deadline
    try:
        candidates: list[TreeEntry] = []
        for entry in repository.list_tree(commit, folder, recursive=True):
            if _out_of_time(budget):
                return
            if entry.mode not in (MODE_FILE, MODE_EXECUTABLE) or not keep(entry):
                continue
            if entry.size is not None and entry.size > caps.max_file_bytes:
                continue
            if budget.files_scanned >= caps.max_files_scanned:
                budget.cut(CAP_FILES_SCANNED)
                break
            budget.files_scanned += 1
            candidates.append(entry)
        by_sha: dict[str, list[TreeEntry]] = {}
        for entry in candidates:
            by_sha.setdefault(entry.sha, []).append(entry)
        for blobs in repository.read_entries(candidates):
            for sha, data in blobs.items():
                if _out_of_time(budget):
                    return
                if is_binary(data[: caps.binary_sniff_bytes]):
                    continue
                yield by_sha.get(sha, []), data.decode("utf-8", errors="replace")
    except GitDeadlineError:
        budget.cut(CAP_TIME)
    finally:
        if work is not None:
            work.deadline = None


def _line_finder(
    matcher: re.Pattern[str], *, regex: bool, caps: SearchSettings, deadline: float
) -> contextlib.AbstractContextManager[LineFinder]:
    """``search.line_finder``; a caller's regex runs in a ``RegexSandbox`` child, which a
    cancelled call kills at once rather than at the scan's deadline."""
    work = current_work()

    def kill_on_cancel(pid: int) -> contextlib.AbstractContextManager[object]:
        assert work is not None
        return work.stopping(functools.partial(os.kill, pid, signal.SIGKILL))

    return line_finder(
        matcher,
        regex=regex,
        caps=caps,
        deadline=deadline,
        guard_child=None if work is None else kill_on_cancel,
    )


def _out_of_time(budget: ScanBudget) -> bool:
    """The scan's time cap (reported as cut), or ``GitCancelledError`` once its call was
    cancelled: the worker stops even when nobody waits for its answer any more."""
    work = current_work()
    if work is not None:
        work.check_cancelled()
    return budget.out_of_time()


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


__all__ = ["TOOLSET", "build_repo_tools"]
