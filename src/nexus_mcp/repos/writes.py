"""Repository writes: the write policy decided on what each write really does, then the write.

Each write tool is decided in two steps, and acts in a third:

1. ``decide`` (chain step 6, before any approval is looked at): the repository's policy
   allows the operation; the branch is allowed and not protected; for ``apply_patch`` the
   patch is measured by git against the branch tip (``Repository.analyze_patch``) and
   every content rule is judged on that measurement; ``create_branch`` and
   ``open_pull_request`` measure the range they publish (``repos/ranges.py``: from the
   merge-base with the target branch to the head, whoever made its commits) and judge it
   by the same rules; for ``merge_guarded`` the forge is asked for the pull request, its
   checks, its reviews and its files, and its diff is measured here and judged likewise.
   A refusal here spends no approval.
2. ``check_approver`` (once the approval is verified, still before it is spent): with
   ``require_codeowners``, the approver must own every path the write touches or
   publishes (CODEOWNERS of the default branch: a branch cannot rewrite the rules it is
   judged by).
3. The tool acts on exactly what was decided: ``apply_patch`` commits the measured tree
   onto the measured tip with a compare-and-swap, so a branch that moved in between is a
   ``CONFLICT``; ``create_branch`` and ``open_pull_request`` judge the range again on the
   exact commit they point the branch at or push (from where the push target's base
   really is), and push that sha; ``merge_guarded`` asks the forge again, right before it
   merges, judges the diff again, and merges only the head commit it judged (the forge
   refuses another).

The tool re-runs steps 1 and 2 itself when the chain did not (``prepare``), so taking the
approval layer out never switches the policy off.
"""

from __future__ import annotations

import contextlib
import re
import threading
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from nexus_mcp.calls import CallState
from nexus_mcp.errors import (
    ConfigError,
    ConflictError,
    InvalidInputError,
    MergeBlockedError,
    NotFoundError,
    WritePolicyDeniedError,
)
from nexus_mcp.policy.codeowners import (
    CODEOWNERS_LOCATIONS,
    CodeOwners,
    find_codeowners,
    is_owner,
    unowned_paths,
)
from nexus_mcp.policy.merge_rules import (
    MergeRules,
    PullRequest,
    approving_reviewers,
    evaluate_merge,
)
from nexus_mcp.policy.repos import (
    DEFAULT_WRITE_POLICY,
    RULE_BRANCH_NOT_ALLOWED,
    RULE_BRANCH_SYMBOLIC,
    RULE_CODEOWNERS,
    RULE_DOES_NOT_APPLY,
    RULE_NO_FORGE,
    RULE_NO_POLICY,
    RULE_PATH_DISALLOWED,
    PatchFacts,
    PolicyRisk,
    RepoOperation,
    ReposConfig,
    branch_rule,
    decide_operation,
    is_branch_allowed,
    patch_risks,
    precheck_patch,
    publish_risks,
)
from nexus_mcp.policy.upstreams import resolve_secret
from nexus_mcp.policy.write_policy import WriteDecision
from nexus_mcp.repos.catalog import RepoCatalog
from nexus_mcp.repos.forge import ForgeClient, ForgeSettings
from nexus_mcp.repos.git import git_timeouts_as_refusals, in_git_worker
from nexus_mcp.repos.ranges import RangeAnalysis, analyze_range, commit_of
from nexus_mcp.repos.repository import (
    PatchAnalysis,
    Repository,
    check_branch_name,
    check_sha,
)

MAX_MESSAGE_CHARS = 64 * 1024
MAX_TITLE_CHARS = 256
MAX_BODY_CHARS = 64 * 1024
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
_NAME_UNSAFE_RE = re.compile(r"[<>\x00-\x1f\x7f]")
# The trailers nexus-mcp writes itself: a message may not carry its own.
_OWN_TRAILER_RE = re.compile(r"^\s*(approved-by|nexus-tool-call)\s*:", re.IGNORECASE | re.MULTILINE)
AUTHOR_EMAIL_DOMAIN = "nexus-mcp.invalid"

WRITE_OPERATIONS: Mapping[str, RepoOperation] = {
    "create_branch": "create_branch",
    "apply_patch": "apply_patch",
    "open_pull_request": "open_pull_request",
    "merge_guarded": "merge_guarded",
}


@dataclass
class Prepared:
    """What ``decide`` found, for the tool to act on (kept on the call's state)."""

    operation: str
    arguments: Mapping[str, Any]
    repository: Repository
    decision: WriteDecision
    commit: str | None = None  # create_branch: the start; apply_patch: the measured tip
    patch: bytes = b""
    analysis: PatchAnalysis | None = None
    pull: PullRequest | None = None
    pull_files: tuple[str, ...] = ()
    reviewers: frozenset[str] = field(default_factory=frozenset)
    # create_branch, open_pull_request, merge_guarded: what the write publishes, measured.
    published: RangeAnalysis | None = None


class RepoWrites:
    """The repository write gate of the approval layer, and the writes themselves."""

    def __init__(self, catalog: RepoCatalog, environ: Mapping[str, str]) -> None:
        self.catalog = catalog
        self._lock = threading.Lock()
        self._codeowners: dict[str, tuple[str, CodeOwners]] = {}
        # Each forge's settings are built (and checked: scheme, host, repository, token
        # form) once, at start-up, with its token resolved from its reference.
        self._forges: dict[str, ForgeSettings] = {}
        for name in catalog.names:
            forge = catalog.get(name).config.forge
            if forge is None:
                continue
            try:
                self._forges[name] = ForgeSettings(
                    base_url=forge.base_url,
                    repository=forge.repository,
                    token=resolve_secret(forge.token, environ) if forge.token else None,
                    timeout_seconds=forge.timeout_seconds,
                    ca_file=forge.ca_file,
                )
            except ConfigError as exc:
                raise ConfigError(f"repos.repositories.{name}.forge: {exc}") from None

    # --- the approval layer's gate (chain step 6) -------------------------------------

    async def decide(self, state: CallState) -> WriteDecision:
        prepared = await self.prepare(state.tool_name, state.arguments)
        state.prepared = prepared
        return prepared.decision

    async def check_approver(self, state: CallState, approver: str | None) -> None:
        prepared = self.prepared_for(state)
        await self.check_owners(prepared, approver)

    def describe(self, state: CallState) -> str:
        """The elicitation question: the tool, the repository and what it acts on (the
        decision ran first, so these are the validated values)."""
        prepared = self.prepared_for(state)
        subject = f"{state.tool_name} on repository {prepared.repository.name}"
        branch = prepared.arguments.get("branch")
        if isinstance(branch, str):
            subject += f", branch {branch}"
        if prepared.pull is not None:
            subject += f", pull request #{prepared.pull.number} ({prepared.pull.head_sha[:12]})"
        if prepared.analysis is not None:
            facts = prepared.analysis.facts
            subject += (
                f": {len(facts.changed_paths)} files, +{facts.lines_added}/-{facts.lines_removed}"
            )
        elif prepared.published is not None and prepared.pull is None:
            # What a new branch or a push publishes, so an approver approves more than a name.
            facts, commits = prepared.published.facts, prepared.published.commits
            subject += (
                f" at {prepared.commit[:12] if prepared.commit else '?'}: publishes "
                f"{commits} commits, {len(facts.changed_paths)} files, "
                f"+{facts.lines_added}/-{facts.lines_removed}"
            )
        return f"Approve {subject}?"

    # --- deciding -----------------------------------------------------------------------

    def prepared_for(self, state: CallState) -> Prepared:
        prepared = state.prepared
        if (
            not isinstance(prepared, Prepared)
            or prepared.operation != state.tool_name
            or prepared.arguments is not state.arguments
        ):
            raise WritePolicyDeniedError(rule="not_decided")
        return prepared

    async def prepare(self, tool_name: str, arguments: Mapping[str, Any]) -> Prepared:
        operation = WRITE_OPERATIONS.get(tool_name)
        if operation is None:
            raise WritePolicyDeniedError(rule="unknown_operation")
        repository = self.catalog.get(arguments.get("repo"))
        decision = decide_operation(repository.policy, operation)
        if not decision.allowed:
            raise WritePolicyDeniedError(rule=decision.rule, operation=operation)
        prepared = Prepared(operation, arguments, repository, decision)
        with git_timeouts_as_refusals():
            await self._prepare(prepared)
        return prepared

    async def _prepare(self, prepared: Prepared) -> None:
        operation = prepared.operation
        if operation == "create_branch":
            await in_git_worker(lambda: self._prepare_branch(prepared))
        elif operation == "apply_patch":
            await in_git_worker(lambda: self._prepare_patch(prepared))
        elif operation == "open_pull_request":
            await in_git_worker(lambda: self._prepare_pull_request(prepared))
        else:
            await self._prepare_merge(prepared)

    def _check_branch(self, repository: Repository, branch: str) -> None:
        rule = branch_rule(repository.config, repository.policy, branch, repository.default_branch)
        if rule is not None:
            raise WritePolicyDeniedError(rule=rule)

    def _check_not_symbolic(self, repository: Repository, branch: str) -> None:
        # An alias could move (or create) the ref it names, a protected one included.
        if repository.is_symbolic(branch):
            raise WritePolicyDeniedError(rule=RULE_BRANCH_SYMBOLIC)

    def _prepare_branch(self, prepared: Prepared) -> None:
        repository, arguments = prepared.repository, prepared.arguments
        branch = check_branch_name(arguments.get("branch"))
        self._check_branch(repository, branch)
        self._check_not_symbolic(repository, branch)
        start = arguments.get("from_ref") or repository.default_branch
        prepared.commit = repository.resolve_commit(start, field_name="from_ref")
        if repository.branch_tip(branch) is not None:
            raise ConflictError("branch already exists", reason="branch_exists")
        # The start point may carry commits nexus-mcp never judged (another branch, a tag,
        # a sha): what the new branch adds to the default branch passes the patch rules.
        self.judge_publish(prepared, prepared.commit, repository.default_branch)

    def _prepare_patch(self, prepared: Prepared) -> None:
        repository, arguments = prepared.repository, prepared.arguments
        branch = check_branch_name(arguments.get("branch"))
        self._check_branch(repository, branch)
        message = check_text(
            arguments.get("message"), field_name="message", limit=MAX_MESSAGE_CHARS
        )
        if _OWN_TRAILER_RE.search(message):
            raise InvalidInputError(field="message")
        patch = to_patch_bytes(arguments.get("patch"))
        policy = repository.policy
        assert policy is not None  # decide_operation refused otherwise
        # Judged before git runs: an oversized patch or a binary literal never reaches it.
        refuse_risks(precheck_patch(policy, patch))
        self._check_not_symbolic(repository, branch)
        tip = repository.branch_tip(branch)
        if tip is None:
            raise NotFoundError(reason="branch_not_found")
        if branch in repository.checked_out_branches():
            raise ConflictError("branch is checked out", reason="branch_checked_out")
        analysis = repository.analyze_patch(tip, patch)
        if not analysis.applies:
            raise ConflictError("patch does not apply", reason=RULE_DOES_NOT_APPLY)
        refuse_risks(patch_risks(policy, analysis.facts))
        prepared.commit, prepared.patch, prepared.analysis = tip, patch, analysis

    def _prepare_pull_request(self, prepared: Prepared) -> None:
        repository, arguments = prepared.repository, prepared.arguments
        if repository.config.forge is None:
            raise WritePolicyDeniedError(rule=RULE_NO_FORGE)
        branch = check_branch_name(arguments.get("branch"))
        self._check_branch(repository, branch)
        base = arguments.get("base") or repository.default_branch
        check_branch_name(base, field_name="base")
        if repository.branch_tip(base) is None:
            raise NotFoundError(reason="base_not_found")
        self._check_not_symbolic(repository, branch)
        check_text(arguments.get("title"), field_name="title", limit=MAX_TITLE_CHARS, line=True)
        body = arguments.get("body", "")
        if body:
            check_text(body, field_name="body", limit=MAX_BODY_CHARS)
        tip = repository.branch_tip(branch)
        if tip is None:
            raise NotFoundError(reason="branch_not_found")
        prepared.commit = tip
        # Everything the push publishes, whoever made its commits, passes the patch rules.
        self.judge_publish(prepared, tip, base)

    async def _prepare_merge(self, prepared: Prepared) -> None:
        repository, arguments = prepared.repository, prepared.arguments
        if repository.config.forge is None:
            raise WritePolicyDeniedError(rule=RULE_NO_FORGE)
        number = arguments.get("pull_number")
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise InvalidInputError(field="pull_number")
        expected = arguments.get("expected_head_sha")
        if expected is not None:
            check_sha(expected, field_name="expected_head_sha")
        async with contextlib.aclosing(self.forge(repository)) as client:
            await self._judge_merge(prepared, client, number, expected)

    async def _judge_merge(
        self, prepared: Prepared, client: ForgeClient, number: int, expected: str | None
    ) -> None:
        """Ask the forge for the pull request, its checks and reviews; refuse what fails."""
        repository = prepared.repository
        pull = await client.get_pull(number)
        # Only pull requests from a branch this policy lets agents write to.
        self._check_branch(repository, pull.head_ref)
        statuses = await client.combined_status(pull.head_sha)
        runs = await client.check_runs(pull.head_sha)
        reviews = await client.list_reviews(number)
        rules = merge_rules(repository)
        reason = evaluate_merge(rules, pull, statuses, runs, reviews, expected_head_sha=expected)
        if reason is not None:
            raise MergeBlockedError(reason=reason)
        prepared.pull = pull
        prepared.reviewers = approving_reviewers(rules, pull, reviews)
        prepared.pull_files = tuple(await client.list_pull_files(number))
        await in_git_worker(lambda: self.judge_pull_content(prepared, pull))

    # --- what a write publishes -----------------------------------------------------------

    def judge_publish(self, prepared: Prepared, head: str, target_branch: str) -> None:
        """Refuse (``WRITE_POLICY_DENIED``) unless the range ``target_branch..head`` passes
        the repository's patch rules (``repos/ranges.py``); keep it for CODEOWNERS."""
        repository = prepared.repository
        self._judge_range(prepared, head, repository.branch_tip(target_branch))

    def _judge_range(self, prepared: Prepared, head: str, target: str | None) -> None:
        repository = prepared.repository
        published = self._measure(repository, head, target)
        refuse_risks(
            publish_risks(
                repository.policy,
                published.facts,
                history=published.history,
                too_large=published.too_large,
            )
        )
        prepared.published = published

    def recheck_publish(self, prepared: Prepared, target_branch: str) -> None:
        """``judge_publish`` again, right before the write acts, on the very commit it
        publishes: the target branch may have moved since the decision."""
        assert prepared.commit is not None
        self.judge_publish(prepared, prepared.commit, target_branch)

    def recheck_push(self, prepared: Prepared, remote_base: str | None) -> None:
        """Right before ``open_pull_request`` pushes: judge what the push publishes, the
        range from the commit the push target's base branch holds (``remote_base``, asked
        of it just now) to the exact commit pushed. A local base branch may hold commits
        the forge has never seen; they are published too. A push target without the base
        branch is ``NOT_FOUND``; one whose base commit this repository does not hold is a
        ``CONFLICT`` (fetch first): what is published could not be measured."""
        assert prepared.commit is not None
        if remote_base is None:
            raise NotFoundError(reason="base_not_found")
        if commit_of(prepared.repository, remote_base) != remote_base:
            raise ConflictError("the base branch is not fetched", reason="base_not_fetched")
        self._judge_range(prepared, prepared.commit, remote_base)

    def judge_pull_content(self, prepared: Prepared, pull: PullRequest) -> None:
        """A pull request is merged only if its whole diff passes the write policy: the
        head commit the forge reports, measured here against the base (the head must be
        a commit this repository holds: what cannot be measured is not merged), and the
        forge's own list of its files. ``MERGE_BLOCKED`` (``write_policy``) otherwise;
        ``merge.allow_disallowed_paths`` lets the disallowed-path rule alone pass."""
        repository = prepared.repository
        if commit_of(repository, pull.head_sha) != pull.head_sha:
            raise MergeBlockedError(reason="write_policy", rule="head_not_local")
        # The diff is measured from the base the forge reports (a local base branch may be
        # behind it, or hold commits the forge has never seen), else the local branch.
        target = repository.branch_tip(pull.base_ref)
        if pull.base_sha is not None:
            if commit_of(repository, pull.base_sha) != pull.base_sha:
                raise MergeBlockedError(reason="write_policy", rule="base_not_local")
            target = pull.base_sha
        published = self._measure(repository, pull.head_sha, target)
        history = published.history
        history = PatchFacts(
            diff_bytes=0,
            changed_paths=history.changed_paths + prepared.pull_files,
            lines_added=0,
            lines_removed=0,
            symlink_paths=history.symlink_paths,
            submodule_paths=history.submodule_paths,
        )
        risks = publish_risks(
            repository.policy, published.facts, history=history, too_large=published.too_large
        )
        if repository.config.merge.allow_disallowed_paths:
            risks = [risk for risk in risks if risk.rule != RULE_PATH_DISALLOWED]
        if risks:
            raise MergeBlockedError(reason="write_policy", rule=risks[0].rule)
        prepared.published = published

    @staticmethod
    def _measure(repository: Repository, head: str, target: str | None) -> RangeAnalysis:
        policy = repository.policy
        limit = policy.max_diff_size if policy is not None else DEFAULT_WRITE_POLICY.max_diff_size
        return analyze_range(repository, head, target, max_diff_bytes=limit)

    # --- owners ---------------------------------------------------------------------------

    async def check_owners(self, prepared: Prepared, approver: str | None) -> None:
        """With ``require_codeowners``: the approver owns every path the write touches."""
        repository = prepared.repository
        policy = repository.policy
        if policy is None or not policy.require_codeowners:
            return
        if prepared.operation == "apply_patch" and prepared.analysis is not None:
            owners = await in_git_worker(lambda: self.codeowners(repository))
            paths = prepared.analysis.facts.changed_paths
            if not approver or unowned_paths(approver, paths, owners, teams=_teams(repository)):
                raise WritePolicyDeniedError(rule=RULE_CODEOWNERS)
        elif prepared.operation in ("create_branch", "open_pull_request"):
            # What the write publishes beyond the target branch: its approver owns it all.
            published = prepared.published.paths if prepared.published is not None else ()
            if not published:
                return
            owners = await in_git_worker(lambda: self.codeowners(repository))
            if not approver or unowned_paths(approver, published, owners, teams=_teams(repository)):
                raise WritePolicyDeniedError(rule=RULE_CODEOWNERS)
        elif prepared.operation == "merge_guarded":
            owners = await in_git_worker(lambda: self.codeowners(repository))
            approvers = set(prepared.reviewers) | ({approver} if approver else set())
            teams = _teams(repository)
            published = prepared.published.paths if prepared.published is not None else ()
            for path in dict.fromkeys(prepared.pull_files + published):
                path_owners = owners.owners_of(path)
                if not path_owners or not any(
                    is_owner(who, path_owners, teams=teams) for who in approvers
                ):
                    raise MergeBlockedError(reason="codeowners_missing")

    def codeowners(self, repository: Repository, commit: str | None = None) -> CodeOwners:
        """CODEOWNERS as the default branch has it now (none: nobody owns anything), or at
        ``commit``, its tip the caller has just read.

        Parsed once per commit of the default branch: the tip is asked every time.
        """
        if commit is None:
            commit = repository.resolve_commit(repository.default_branch)
        with self._lock:
            cached = self._codeowners.get(repository.name)
        if cached is not None and cached[0] == commit:
            return cached[1]
        entries = repository.entries(commit, CODEOWNERS_LOCATIONS)

        def read(path: str) -> bytes | None:
            entry = entries.get(path)
            if entry is None or entry.type != "file":
                return None
            return repository.read_blob(entry.sha)

        found = find_codeowners(read)
        owners = found[1] if found is not None else CodeOwners.parse("")
        with self._lock:
            self._codeowners[repository.name] = (commit, owners)
        return owners

    # --- the forge ------------------------------------------------------------------------

    def forge(self, repository: Repository) -> ForgeClient:
        settings = self._forges.get(repository.name)
        if settings is None:
            raise WritePolicyDeniedError(rule=RULE_NO_FORGE)
        return ForgeClient(settings)

    def forge_token(self, repository: Repository) -> SecretStr | None:
        settings = self._forges.get(repository.name)
        return settings.token if settings is not None else None


def refuse_risks(risks: list[PolicyRisk]) -> None:
    """``WRITE_POLICY_DENIED`` naming the first rule broken (and its bound), if any."""
    if not risks:
        return
    first = risks[0]
    if first.limit is not None:
        raise WritePolicyDeniedError(rule=first.rule, limit=first.limit, actual=first.actual)
    raise WritePolicyDeniedError(rule=first.rule)


def merge_rules(repository: Repository) -> MergeRules:
    merge = repository.config.merge
    return MergeRules(
        required_checks=merge.required_checks,
        required_approvals=merge.required_approvals,
        dismiss_stale_reviews=merge.dismiss_stale_reviews,
        allowed_bases=merge.allowed_bases or (repository.default_branch,),
    )


def _teams(repository: Repository) -> Mapping[str, tuple[str, ...]]:
    return repository.config.codeowner_teams


def check_text(value: object, *, field_name: str, limit: int, line: bool = False) -> str:
    """Free text a write records (a commit message, a title): bounded, no control bytes
    (tabs and, unless ``line``, newlines allowed), valid UTF-8."""
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise InvalidInputError(field=field_name)
    if (line and "\n" in value) or _has_unsafe_characters(value):
        raise InvalidInputError(field=field_name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(field=field_name) from None
    return value


def _has_unsafe_characters(text: str) -> bool:
    """Control characters (C0 but tab and newline, DEL, C1), Unicode line and paragraph
    separators, and bidirectional overrides, which make text read otherwise than it is."""
    if _CONTROL_RE.search(text):
        return True
    if text.isascii():
        return False
    return any(
        unicodedata.category(char) in ("Cc", "Zl", "Zp") or char in _BIDI_CONTROLS
        for char in text
        if char not in "\t\n"
    )


def to_patch_bytes(patch: object) -> bytes:
    if not isinstance(patch, str) or not patch:
        raise InvalidInputError(field="patch")
    try:
        data = patch.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(field="patch") from None
    if b"\0" in data:
        raise InvalidInputError(field="patch")
    return data


def git_identity(who: str) -> tuple[str, str]:
    """A commit identity for a subject: a safe name, and an email (its own when it is one)."""
    name = _NAME_UNSAFE_RE.sub("", who).strip()[:128] or "unknown"
    if re.fullmatch(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}", name):
        return name, name
    local = re.sub(r"[^A-Za-z0-9._+-]", "-", name)[:64].strip(".-") or "unknown"
    return name, f"{local}@{AUTHOR_EMAIL_DOMAIN}"


__all__ = [
    "AUTHOR_EMAIL_DOMAIN",
    "WRITE_OPERATIONS",
    "Prepared",
    "RepoWrites",
    "check_text",
    "git_identity",
    "merge_rules",
    "to_patch_bytes",
]


class ConfiguredPolicyGate:
    """The repository write gate of a replay (``serve --replay``), which opens no
    repository: each repository's write policy as configured, on the call's arguments:
    whether the repository and the operation are allowed, the approval it needs, the
    branch patterns, a patch's size and binary precheck. What needs git (a protected
    default branch, whether the patch applies, CODEOWNERS) was judged when recording: a
    refusal it made came before the tool ran, so it was not recorded and replays as
    ``FIXTURE_NOT_FOUND``.
    """

    def __init__(self, config: ReposConfig) -> None:
        self.config = config

    async def decide(self, state: CallState) -> WriteDecision:
        operation = WRITE_OPERATIONS.get(state.tool_name)
        arguments = state.arguments
        name = arguments.get("repo")
        repository = self.config.repositories.get(name) if isinstance(name, str) else None
        if operation is None or repository is None:
            raise WritePolicyDeniedError(rule=RULE_NO_POLICY)
        policy = repository.write_policy
        decision = decide_operation(policy, operation)
        if not decision.allowed or policy is None:
            raise WritePolicyDeniedError(rule=decision.rule, operation=operation)
        for key in ("branch", "base"):
            branch = arguments.get(key)
            if isinstance(branch, str) and not is_branch_allowed(policy, branch):
                raise WritePolicyDeniedError(rule=RULE_BRANCH_NOT_ALLOWED)
        if operation == "apply_patch":
            refuse_risks(precheck_patch(policy, to_patch_bytes(arguments.get("patch"))))
        return decision

    async def check_approver(self, state: CallState, approver: str | None) -> None:
        """CODEOWNERS needs the repository: judged when recording."""

    def describe(self, state: CallState) -> str:
        name = state.arguments.get("repo")
        return f"Approve {state.tool_name} on repository {name}?"
