"""The ``repos:`` section and the repository write policy (seed 003, sections 1, 3, 5, 6).

Which git repositories the ``repo`` toolset serves, and what a write may do to each. A
repository is always named by this configuration, never discovered from a tool argument:
a ``repo`` argument must match ``SAFE_REPO_RE`` and name a configured repository.

Production: only the listed repositories (no wildcards), every one below an entry of
``allowed_roots`` (its working tree and its git directories, resolved), and a home
``Desktop`` folder is never an allowed root. Dev: ``dev_allow_all_repos`` may serve every
git repository directly below the allowed roots, with a start-up warning.

``WritePolicy`` has exactly the seed's fields, plus how approval is obtained. Deny by
default: a repository without a policy accepts no writes. Branch patterns are regular
expressions matched against the whole branch name (``re.fullmatch``: each pattern is
anchored at both ends, so ``feature/.*`` allows ``feature/x`` and nothing else; the seed's
``^feature/.*$`` spelling means the same). ``disallowed_paths`` use the write policy's
glob rules (``policy/write_policy.py``): case-insensitive, with Windows/macOS name
folding, an entry denying everything below it; ``.git/``, ``**/.git/`` and
``.github/workflows/`` always apply. Everything is validated once at start-up and a bad
entry stops it with a ``ConfigError`` naming its location, never its value.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from nexus_mcp.policy.config_errors import Loc, problem_line, problems_from, refuse, render_key
from nexus_mcp.policy.references import expand_references
from nexus_mcp.policy.upstreams import SecretValue
from nexus_mcp.policy.write_policy import (
    DEFAULT_DISALLOWED_PATHS,
    Pattern,
    WriteDecision,
    matches_disallowed,
    with_default_disallowed,
)

CONFIG_LOCATION = "repos"
# Seed 003 section 3, corrected: a character class, not literal brackets.
SAFE_REPO_RE = re.compile(r"^[A-Za-z0-9._-]+$")
MAX_REPO_NAME_CHARS = 100
MAX_BRANCH_CHARS = 255
MAX_BRANCH_PATTERN_CHARS = 512

RepoOperation = Literal["create_branch", "apply_patch", "open_pull_request", "merge_guarded"]
REPO_OPERATIONS: frozenset[str] = frozenset(get_args(RepoOperation))

RULE_ALLOWED = "allowed"
RULE_NO_POLICY = "no_policy"
RULE_OPERATION_NOT_ALLOWED = "operation_not_allowed"
RULE_BRANCH_NOT_ALLOWED = "branch_not_allowed"
RULE_BRANCH_PROTECTED = "branch_protected"
RULE_MAX_DIFF_SIZE = "max_diff_size"
RULE_MAX_CHANGED_FILES = "max_changed_files"
RULE_MAX_CHANGED_LINES = "max_changed_lines"
RULE_PATH_DISALLOWED = "path_disallowed"
RULE_BINARY_CONTENT = "binary_content"
RULE_SYMLINK = "symlink"
RULE_SUBMODULE = "submodule"
RULE_CODEOWNERS = "codeowners"
RULE_DOES_NOT_APPLY = "does_not_apply"
RULE_EMPTY_PATCH = "empty_patch"
RULE_NO_FORGE = "no_forge"
RULE_BRANCH_SYMBOLIC = "branch_symbolic"
# A published range with more commits, or more change, than can be judged (repos/ranges.py).
RULE_RANGE_TOO_LARGE = "range_too_large"
# A segment such as ``GITHUB~1``: the 8.3 short name Windows gives ``.github`` on NTFS, so
# in a Windows checkout it is that folder, whatever the disallowed patterns say.
_SHORT_NAME_RE = re.compile(r"~[0-9]")
# git's marker of a binary literal, which it inflates (zlib) before anything can measure it.
_BINARY_LITERAL_RE = re.compile(rb"^GIT binary patch\r?$", re.MULTILINE)

DEFAULT_ALLOWED_BRANCHES = ("feature/.*", "bugfix/.*")
DEFAULT_PROTECTED_BRANCHES = ("main", "master", "trunk", "develop", "release/.*")
DEFAULT_REPO_OPERATIONS: tuple[RepoOperation, ...] = (
    "create_branch",
    "apply_patch",
    "open_pull_request",
)
DEV_ALL_REPOS_WARNING = (
    "repos.dev_allow_all_repos: every git repository directly below repos.allowed_roots "
    "is served (dev only; list repositories by name in production)"
)
DESKTOP_DEV_WARNING = "repos.allowed_roots holds a home Desktop folder (refused in production)"


def _validate_branch_pattern(pattern: str) -> str:
    if not pattern or len(pattern) > MAX_BRANCH_PATTERN_CHARS:
        raise ValueError(f"must be 1 to {MAX_BRANCH_PATTERN_CHARS} characters")
    try:
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError):
        raise ValueError("is not a valid regular expression") from None
    return pattern


BranchPattern = Annotated[StrictStr, AfterValidator(_validate_branch_pattern)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WritePolicy(_Model):
    """Seed 003's ``WritePolicy`` for one repository (its ``repo`` is the entry's name)."""

    allowed_branches: tuple[BranchPattern, ...] = DEFAULT_ALLOWED_BRANCHES
    max_diff_size: StrictInt = Field(default=10_000, gt=0, le=64 * 1024 * 1024)
    max_changed_files: StrictInt = Field(default=10, gt=0, le=100_000)
    max_changed_lines: StrictInt = Field(default=400, gt=0, le=10_000_000)
    require_codeowners: StrictBool = True
    disallowed_paths: tuple[Pattern, ...] = (".github/workflows/",)
    allowed_operations: frozenset[RepoOperation] = frozenset(DEFAULT_REPO_OPERATIONS)
    require_approval: StrictBool = True
    approval_mode: Literal["token", "elicit"] = "token"

    @property
    def effective_disallowed_paths(self) -> tuple[str, ...]:
        return with_default_disallowed(self.disallowed_paths)

    @property
    def needs_approval(self) -> bool:
        # An owner's approval needs an approver: require_codeowners implies approval.
        return self.require_approval or self.require_codeowners


class ForgeConfig(_Model):
    """A forge with the GitHub REST API shape, for pull requests and guarded merges."""

    base_url: StrictStr = Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    repository: StrictStr = Field(pattern=r"^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$")
    token: SecretValue | None = None
    # Where open_pull_request pushes the branch: https:// (the token as credential) or
    # file:// (a local bare repository). Only this URL's scheme is ever allowed.
    push_url: StrictStr | None = Field(default=None, pattern=r"^(https|file)://\S+$")
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)
    ca_file: Path | None = None

    @field_validator("base_url", "push_url")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        # A credential goes in ``token`` (by reference); one in a URL would be inline.
        if value is not None and "@" in urlsplit(value).netloc:
            raise ValueError("must not carry credentials: use token")
        return value


class MergeSettings(_Model):
    """What ``merge_guarded`` re-checks on the forge right before it merges."""

    required_checks: tuple[StrictStr, ...] = ()
    required_approvals: StrictInt = Field(default=1, ge=0, le=100)
    # The branches a pull request may be merged into; none given: the default branch.
    allowed_bases: tuple[StrictStr, ...] = ()
    dismiss_stale_reviews: StrictBool = True
    method: Literal["merge", "squash", "rebase"] = "merge"
    # A pull request whose diff touches a disallowed path is never merged by an agent
    # unless the team says so here (the other write-policy rules apply regardless).
    allow_disallowed_paths: StrictBool = False


class RepositoryConfig(_Model):
    path: Path
    default_branch: StrictStr | None = None
    protected_branches: tuple[BranchPattern, ...] = DEFAULT_PROTECTED_BRANCHES
    write_policy: WritePolicy | None = None
    # CODEOWNERS teams: "@org/team" -> member logins or emails (no forge lookup).
    codeowner_teams: dict[StrictStr, tuple[StrictStr, ...]] = Field(default_factory=dict)
    forge: ForgeConfig | None = None
    merge: MergeSettings = MergeSettings()


class GitLimits(_Model):
    timeout_seconds: float = Field(default=20.0, gt=0, le=600)
    max_output_bytes: StrictInt = Field(default=64 * 1024 * 1024, ge=1024)


class _ReposDocument(_Model):
    allowed_roots: tuple[Path, ...] = ()
    dev_allow_all_repos: StrictBool = False
    repositories: dict[StrictStr, RepositoryConfig] = Field(default_factory=dict)
    git: GitLimits = GitLimits()

    @model_validator(mode="before")
    @classmethod
    def _path_shorthand(cls, data: Any) -> Any:
        # ``name: /path`` is short for ``name: {path: /path}`` (no write policy).
        if isinstance(data, Mapping) and isinstance(data.get("repositories"), Mapping):
            repositories = {
                name: {"path": entry} if isinstance(entry, str) else entry
                for name, entry in data["repositories"].items()
            }
            return {**data, "repositories": repositories}
        return data

    @model_validator(mode="after")
    def _names(self) -> _ReposDocument:
        for name in self.repositories:
            if not is_safe_repo_name(name):
                raise ValueError("a repository name must match ^[A-Za-z0-9._-]+$ (not '.' or '..')")
        return self


DEFAULT_WRITE_POLICY = WritePolicy()


@dataclass(frozen=True)
class ReposConfig:
    """The validated section: repositories by name, in configuration order."""

    repositories: Mapping[str, RepositoryConfig] = field(
        default_factory=lambda: MappingProxyType({})
    )
    allowed_roots: tuple[Path, ...] = ()
    dev_allow_all_repos: bool = False
    git: GitLimits = field(default_factory=GitLimits)
    warnings: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.repositories) or self.dev_allow_all_repos


def is_safe_repo_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_REPO_NAME_CHARS
        and SAFE_REPO_RE.fullmatch(name) is not None
        and name not in (".", "..")
    )


def is_desktop_folder(path: Path, home: Path | None = None) -> bool:
    """A home ``Desktop`` folder, or a folder inside one (seed 003: never an allowed root)."""
    parts = path.parts
    homes = [home] if home is not None else []
    with contextlib.suppress(RuntimeError):
        homes.append(Path.home())
    for candidate in homes:
        desktop = (candidate / "Desktop").parts
        if parts[: len(desktop)] == desktop:
            return True
    # Any user's home on the usual layouts: /home/<u>/Desktop, /Users/<u>/Desktop, /root/Desktop.
    if len(parts) >= 4 and parts[1] in ("home", "Users") and parts[3].casefold() == "desktop":
        return True
    return len(parts) >= 3 and parts[1] == "root" and parts[2].casefold() == "desktop"


def load_repos_config(
    raw: Any, *, mode: str, home: Path | None = None, source: Path | None = None
) -> ReposConfig:
    """Validate the section (paths are checked against the disk by ``repos/catalog.py``);
    ``source``, the file it was read from, is named with the line in each problem."""
    if raw is None:
        return ReposConfig()
    here: Loc = (CONFIG_LOCATION,)
    if not isinstance(raw, Mapping):
        raise refuse([(here, f"`{CONFIG_LOCATION}` should be a mapping (key: value)")], source)
    data, unresolved = expand_references(dict(raw), _ReposDocument, os.environ, here)
    try:
        document = _ReposDocument.model_validate(data)
    except ValidationError as exc:
        known = {loc for loc, _ in unresolved}
        found = [p for p in problems_from(exc, _ReposDocument, prefix=here) if p[0] not in known]
        raise refuse([*unresolved, *found], source) from None
    if unresolved:
        raise refuse(unresolved, source)
    problems: list[tuple[Loc, str]] = []

    def problem(loc: Loc, words: str) -> tuple[Loc, str]:
        return (
            (CONFIG_LOCATION, *loc),
            problem_line("", render_key((CONFIG_LOCATION, *loc)), words),
        )

    warnings: list[str] = []
    if document.dev_allow_all_repos:
        if mode != "dev":
            problems.append(problem(("dev_allow_all_repos",), ": dev mode only"))
        else:
            warnings.append(DEV_ALL_REPOS_WARNING)
            if not document.allowed_roots:
                problems.append(
                    problem(("allowed_roots",), ": dev_allow_all_repos needs at least one")
                )
    roots: list[Path] = []
    for position, root in enumerate(document.allowed_roots):
        if not root.is_absolute():
            problems.append(problem(("allowed_roots", position), "should be an absolute path"))
            continue
        resolved = root.resolve()
        if is_desktop_folder(resolved, home) or is_desktop_folder(root, home):
            if mode != "dev":
                problems.append(
                    problem(
                        ("allowed_roots", position),
                        ": a home Desktop folder is never an allowed root",
                    )
                )
                continue
            warnings.append(DESKTOP_DEV_WARNING)
        roots.append(resolved)
    if document.repositories and mode != "dev" and not document.allowed_roots:
        problems.append(problem(("allowed_roots",), "is required in production"))
    repositories: dict[str, RepositoryConfig] = {}
    for name, config in document.repositories.items():
        if not config.path.is_absolute():
            problems.append(problem(("repositories", name, "path"), "should be an absolute path"))
        if config.forge is not None and isinstance(config.forge.token, str) and mode != "dev":
            problems.append(
                problem(
                    ("repositories", name, "forge", "token"),
                    ": inline secrets are refused in prod (use ${NAME})",
                )
            )
        repositories[name] = config
    if problems:
        raise refuse(problems, source)
    return ReposConfig(
        repositories=MappingProxyType(repositories),
        allowed_roots=tuple(roots),
        dev_allow_all_repos=document.dev_allow_all_repos,
        git=document.git,
        warnings=tuple(warnings),
    )


# --- decisions -----------------------------------------------------------------------


def is_branch_allowed(policy: WritePolicy, branch: str) -> bool:
    return any(re.fullmatch(pattern, branch) for pattern in policy.allowed_branches)


def is_branch_protected(config: RepositoryConfig, branch: str, default_branch: str) -> bool:
    if branch == default_branch:
        return True
    return any(re.fullmatch(pattern, branch) for pattern in config.protected_branches)


def decide_operation(policy: WritePolicy | None, operation: str) -> WriteDecision:
    """The policy's first gate: is there a policy, and does it allow this operation?"""
    if policy is None:
        return WriteDecision(False, RULE_NO_POLICY)
    if operation not in REPO_OPERATIONS or operation not in policy.allowed_operations:
        return WriteDecision(False, RULE_OPERATION_NOT_ALLOWED)
    return WriteDecision(True, RULE_ALLOWED, policy.needs_approval, policy.approval_mode)


def branch_rule(
    config: RepositoryConfig, policy: WritePolicy | None, branch: str, default_branch: str
) -> str | None:
    """The rule a write to ``branch`` breaks, or None (protected first: it is the sharper)."""
    if is_branch_protected(config, branch, default_branch):
        return RULE_BRANCH_PROTECTED
    if policy is None or not is_branch_allowed(policy, branch):
        return RULE_BRANCH_NOT_ALLOWED
    return None


@dataclass(frozen=True)
class PatchFacts:
    """What a patch really does to a tree, as git computed it (``repos/patches.py``)."""

    diff_bytes: int
    changed_paths: tuple[str, ...]  # every path added, changed or removed (both rename ends)
    lines_added: int
    lines_removed: int
    binary_paths: tuple[str, ...] = ()
    symlink_paths: tuple[str, ...] = ()
    submodule_paths: tuple[str, ...] = ()

    @property
    def changed_lines(self) -> int:
        return self.lines_added + self.lines_removed


@dataclass(frozen=True)
class PolicyRisk:
    """One rule a patch breaks, with the paths that break it (for ``propose_patch``)."""

    rule: str
    paths: tuple[str, ...] = ()
    limit: int | None = None
    actual: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule}
        if self.paths:
            out["paths"] = list(self.paths)
        if self.limit is not None:
            out["limit"] = self.limit
            out["actual"] = self.actual
        return out


def patch_risks(policy: WritePolicy | None, facts: PatchFacts) -> list[PolicyRisk]:
    """Every content rule the patch breaks, in a stable order (empty: the patch may land).

    Binary content, links and submodules are refused whatever the policy says; the rest
    are the policy's limits and ``disallowed_paths`` (the defaults when there is none).
    """
    risks: list[PolicyRisk] = []
    if not facts.changed_paths:
        risks.append(PolicyRisk(RULE_EMPTY_PATCH))
    return risks + _content_risks(policy, facts)


def publish_risks(
    policy: WritePolicy | None,
    facts: PatchFacts,
    *,
    history: PatchFacts | None = None,
    too_large: bool = False,
) -> list[PolicyRisk]:
    """Every rule a published range breaks (``repos/ranges.py``): ``patch_risks`` on its
    tree-to-tree change (an empty range is no risk: nothing new is published), with the
    paths, links and submodules of each of its commits (``history``) judged as well."""
    if too_large:
        return [PolicyRisk(RULE_RANGE_TOO_LARGE)]
    return _content_risks(policy, facts, history)


def _content_risks(
    policy: WritePolicy | None, facts: PatchFacts, history: PatchFacts | None = None
) -> list[PolicyRisk]:
    risks: list[PolicyRisk] = []
    disallowed = (
        policy.effective_disallowed_paths if policy is not None else DEFAULT_DISALLOWED_PATHS
    )
    every_path = facts.changed_paths + (history.changed_paths if history else ())
    blocked = tuple(
        p
        for p in dict.fromkeys(every_path)
        if matches_disallowed(disallowed, p) or _SHORT_NAME_RE.search(p) is not None
    )
    if blocked:
        risks.append(PolicyRisk(RULE_PATH_DISALLOWED, blocked))
    for rule, paths in (
        (RULE_SYMLINK, facts.symlink_paths + (history.symlink_paths if history else ())),
        (RULE_SUBMODULE, facts.submodule_paths + (history.submodule_paths if history else ())),
        (RULE_BINARY_CONTENT, facts.binary_paths),
    ):
        if paths:
            risks.append(PolicyRisk(rule, tuple(dict.fromkeys(paths))))
    if policy is not None:
        for rule, limit, actual in (
            (RULE_MAX_DIFF_SIZE, policy.max_diff_size, facts.diff_bytes),
            (RULE_MAX_CHANGED_FILES, policy.max_changed_files, len(facts.changed_paths)),
            (RULE_MAX_CHANGED_LINES, policy.max_changed_lines, facts.changed_lines),
        ):
            if actual > limit:
                risks.append(PolicyRisk(rule, limit=limit, actual=actual))
    return risks


def precheck_patch(policy: WritePolicy | None, patch: bytes) -> list[PolicyRisk]:
    """What is judged on the patch text before git reads it: its size (the policy's bound,
    or the default policy's where there is none) and binary literals, which git inflates
    in memory and which could never land anyway (binary content is refused)."""
    limit = (policy or DEFAULT_WRITE_POLICY).max_diff_size
    risks: list[PolicyRisk] = []
    if len(patch) > limit:
        risks.append(PolicyRisk(RULE_MAX_DIFF_SIZE, limit=limit, actual=len(patch)))
    if _BINARY_LITERAL_RE.search(patch):
        risks.append(PolicyRisk(RULE_BINARY_CONTENT))
    return risks


__all__ = [
    "CONFIG_LOCATION",
    "DEFAULT_ALLOWED_BRANCHES",
    "DEFAULT_PROTECTED_BRANCHES",
    "DEFAULT_REPO_OPERATIONS",
    "DEV_ALL_REPOS_WARNING",
    "MAX_BRANCH_CHARS",
    "REPO_OPERATIONS",
    "RULE_ALLOWED",
    "RULE_BINARY_CONTENT",
    "RULE_BRANCH_NOT_ALLOWED",
    "RULE_BRANCH_PROTECTED",
    "RULE_BRANCH_SYMBOLIC",
    "RULE_CODEOWNERS",
    "RULE_DOES_NOT_APPLY",
    "RULE_EMPTY_PATCH",
    "RULE_MAX_CHANGED_FILES",
    "RULE_MAX_CHANGED_LINES",
    "RULE_MAX_DIFF_SIZE",
    "RULE_NO_FORGE",
    "RULE_NO_POLICY",
    "RULE_OPERATION_NOT_ALLOWED",
    "RULE_PATH_DISALLOWED",
    "RULE_RANGE_TOO_LARGE",
    "RULE_SUBMODULE",
    "RULE_SYMLINK",
    "SAFE_REPO_RE",
    "ForgeConfig",
    "GitLimits",
    "MergeSettings",
    "PatchFacts",
    "PolicyRisk",
    "RepoOperation",
    "ReposConfig",
    "RepositoryConfig",
    "WritePolicy",
    "branch_rule",
    "decide_operation",
    "is_branch_allowed",
    "is_branch_protected",
    "is_desktop_folder",
    "is_safe_repo_name",
    "load_repos_config",
    "patch_risks",
    "precheck_patch",
    "publish_risks",
]
