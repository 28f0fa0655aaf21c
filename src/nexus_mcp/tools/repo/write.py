"""The ``repo`` toolset's patch review and writes: ``propose_patch`` (a dry run), and
``create_branch``, ``apply_patch``, ``open_pull_request`` and ``merge_guarded``, which need an
idempotency key, pass the repository's write policy and, where it asks, an approval
(``repos/writes.py`` decides them in the chain's approval layer; each tool checks again and
acts on exactly what was decided). Every write names what it changed in its tool effect's
``target_ref``: the branch it created, the commit it made, the head it proposed or the
merge commit.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Annotated, Any, TypeVar

from pydantic import Field

from nexus_mcp.calls import current_call
from nexus_mcp.contracts import nexus_tool
from nexus_mcp.errors import (
    FACT_OUTCOME_UNKNOWN,
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
from nexus_mcp.repos.git import git_timeouts_as_refusals
from nexus_mcp.repos.remote import push_branch, remote_branch
from nexus_mcp.repos.repository import PatchAnalysis, check_branch_name
from nexus_mcp.repos.writes import (
    Prepared,
    RepoWrites,
    git_identity,
    merge_rules,
    to_patch_bytes,
)
from nexus_mcp.tools.files import ApprovalArg, IdempotencyArg
from nexus_mcp.tools.repo.models import (
    TOOLSET,
    ApplyPatchResult,
    BranchArg,
    CodeownersReview,
    CreateBranchResult,
    MergeResult,
    PatchFile,
    PatchRisk,
    PatchSummary,
    ProposePatchResult,
    PullRequestResult,
    RepoArg,
)
from nexus_mcp.tools.repo.scan import git_read
from nexus_mcp.workspace.commits import CommitGuard, run_guarded

T = TypeVar("T")


async def _committing(work: Callable[[CommitGuard], T]) -> T:
    """A write's git work under a ``CommitGuard``: cancelled, its ref update is forbidden
    and the thread awaited, so a timed-out write never lands later."""
    with git_timeouts_as_refusals():
        return await run_guarded(work)


def build_write_tools(
    catalog: RepoCatalog, writes: RepoWrites
) -> list[Callable[..., Awaitable[Any]]]:
    """The patch review and write tools over the configured repositories, in the toolset's
    order."""

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
            # Both tips before the analysis, in one git process: the branch's is the commit
            # the patch is measured on and reported against; the default branch's, whose
            # CODEOWNERS is reported, is read at that same moment. Either missing: each is
            # asked on its own, as before, and reported as before.
            tips = repository.branch_and_default_tips(branch)
            tip, default_tip = tips if tips is not None else (repository.branch_tip(branch), None)
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
            owners = writes.codeowners(repository, default_tip)
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

        return await git_read(review)

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
            await git_read(lambda: writes.recheck_publish(prepared, repository.default_branch))
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
            await git_read(lambda: writes.recheck_publish(prepared, target_base))
        if forge.push_url is None:
            async with _judged_again():
                await writes.check_owners(prepared, _approver())
        else:
            push_url = forge.push_url
            token = writes.forge_token(repository)
            # What the push target already holds is not published; the rest is judged.
            remote_base = await git_read(
                lambda: remote_branch(repository, target_base, push_url, token)
            )
            async with _judged_again():
                await git_read(lambda: writes.recheck_push(prepared, remote_base))
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
            await git_read(lambda: writes.judge_pull_content(prepared, pull))
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

    return [propose_patch, create_branch, apply_patch, open_pull_request, merge_guarded]


# --- helpers of the write tools -------------------------------------------------------


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
