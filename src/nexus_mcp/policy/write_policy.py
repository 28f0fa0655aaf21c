"""The write policy: which workspace paths a write tool may touch, how, and how much.

Deny by default: a workspace (or vault) without a policy accepts no writes. A policy
lists ``allowed_paths`` (globs), ``disallowed_paths``, ``allowed_operations`` and the
per-call limits, and says whether the write needs approval and how it is obtained.
Policies are validated once at start-up (``load_write_policy_config``); a bad pattern
or an unknown field stops start-up with a ``ConfigError`` naming its location.

Glob semantics (documented because every glob library differs): patterns and paths are
workspace-relative with ``/`` separators. ``**`` as a whole segment matches zero or
more segments (so ``notes/**`` matches ``notes`` itself and everything below it);
within one segment ``*``, ``?`` and ``[...]``/``[!...]`` work as in ``fnmatch`` and
never cross a ``/``. Dotfiles get no special treatment. Allowed patterns compare
case-sensitively, which on a case-insensitive filesystem only ever denies more.

A disallowed entry denies the paths it matches *and everything below them* (``x``,
``x/`` and ``x/**`` mean the same). They are compared case-insensitively and, in
addition, after the Windows/macOS name folding that made ``.GIT``, ``.git.``,
``.git::$INDEX_ALLOCATION`` and ``.g\u200cit`` reach ``.git`` (CVE-2014-9390,
CVE-2019-1352), so a case variant cannot bypass them. ``DEFAULT_DISALLOWED_PATHS``
always apply, whatever the configuration says. Operations that act on a whole subtree
(``rmdir``, ``rename``, both source and destination) are also denied on any ancestor
of an anchored disallowed entry: renaming ``ci`` to ``.github`` would otherwise create
``.github/workflows``. Entries starting with ``**`` cannot be checked that way without
the filesystem: the workspace judges every entry of a folder it removes or moves.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
)

from nexus_mcp.errors import DocEncodingInvalidError, WritePolicyDeniedError
from nexus_mcp.policy.config_errors import problems_from, refuse

Operation = Literal["write", "edit", "delete", "mkdir", "rmdir", "rename"]
OPERATIONS: frozenset[Operation] = frozenset(get_args(Operation))
SUBTREE_OPERATIONS = frozenset({"rmdir", "rename"})
TOOL_OPERATIONS: Mapping[str, Operation] = MappingProxyType(
    {
        "nexus_write_file": "write",
        "nexus_edit_file": "edit",
        "nexus_delete_file": "delete",
        "nexus_mkdir": "mkdir",
        "nexus_rmdir": "rmdir",
        "nexus_rename_file": "rename",
    }
)
DEFAULT_DISALLOWED_PATHS = (".git/", "**/.git/", ".github/workflows/")
DEFAULT_MAX_BYTES_PER_WRITE = 1024 * 1024
DEFAULT_MAX_CHANGED_LINES_PER_EDIT = 400
DEV_MAX_BYTES_PER_WRITE = 5 * 1024 * 1024  # the registry's default write limit
DEV_MAX_CHANGED_LINES_PER_EDIT = 100_000
MAX_PATTERN_CHARS = 1024
CONFIG_LOCATION = "write_policies"

RULE_ALLOWED = "allowed"
RULE_NO_POLICY = "no_policy"
RULE_UNKNOWN_OPERATION = "unknown_operation"
RULE_OPERATION_NOT_ALLOWED = "operation_not_allowed"
RULE_NO_PATHS = "no_paths"
RULE_PATH_NOT_NORMALIZED = "path_not_normalized"
RULE_WORKSPACE_ROOT = "workspace_root"
RULE_PATH_DISALLOWED = "path_disallowed"
RULE_DISALLOWED_SUBTREE = "disallowed_subtree"
RULE_PATH_NOT_ALLOWED = "path_not_allowed"
RULE_MAX_BYTES = "max_bytes"
RULE_MAX_CHANGED_LINES = "max_changed_lines"

DEV_POLICY_WARNING = (
    "no write policy configured: dev mode applies a permissive write policy "
    "(all operations, no approval; .git/ and .github/workflows/ still denied)"
)
PROD_NO_POLICY_WARNING = "no write policy configured: every write is denied"

# Code points HFS+ ignores when comparing names; ".g\u200cit" is ".git" there.
_IGNORABLE_CHARS = dict.fromkeys(
    [0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)
_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class _Glob:
    """A compiled pattern: one matcher per segment, ``None`` for ``**``."""

    segments: tuple[re.Pattern[str] | None, ...]
    literal_prefix: tuple[str, ...]  # leading segments without glob characters
    starts_with_globstar: bool
    # closures[k]: the positions reachable from k by letting each ``**`` match nothing.
    closures: tuple[frozenset[int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        count = len(self.segments)
        closures: list[frozenset[int]] = []
        for start in range(count + 1):
            end = start
            while end < count and self.segments[end] is None:
                end += 1
            closures.append(frozenset(range(start, end + 1)))
        object.__setattr__(self, "closures", tuple(closures))

    def matches(self, path: Sequence[str], *, or_ancestor: bool = False) -> bool:
        """Whether ``path`` matches; with ``or_ancestor``, whether it or an ancestor does."""
        # NFA simulation over pattern positions: linear in path length x pattern length.
        count = len(self.segments)
        states = self.closures[0]
        for part in path:
            advanced: set[int] = set()
            for position in states:
                if position == count:
                    continue
                matcher = self.segments[position]
                if matcher is None:
                    advanced |= self.closures[position]
                elif matcher.match(part):
                    advanced |= self.closures[position + 1]
            if not advanced:
                return False
            if or_ancestor and count in advanced:
                return True
            states = frozenset(advanced)
        return count in states


def _split_pattern(pattern: str) -> list[str]:
    """Validate a pattern and return its segments; raises ValueError naming the problem."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("pattern must be a non-empty string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"pattern is longer than {MAX_PATTERN_CHARS} characters")
    if pattern.startswith("/") or "\\" in pattern or "\x00" in pattern:
        raise ValueError("pattern must be workspace-relative with '/' separators")
    segments = pattern.removesuffix("/").split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise ValueError("pattern has an empty, '.' or '..' segment")
        if "**" in segment and segment != "**":
            raise ValueError("'**' must be a whole path segment")
        _check_brackets(segment)
    return segments


def _check_brackets(segment: str) -> None:
    # Same scan as fnmatch.translate; an unclosed '[' is malformed here rather than
    # silently literal, because it is almost always a typo in the configuration.
    index = 0
    while index < len(segment):
        if segment[index] == "[":
            end = index + 1
            if end < len(segment) and segment[end] == "!":
                end += 1
            if end < len(segment) and segment[end] == "]":
                end += 1
            while end < len(segment) and segment[end] != "]":
                end += 1
            if end >= len(segment):
                raise ValueError("pattern has an unclosed '['")
            index = end
        index += 1


@functools.lru_cache(maxsize=1024)
def _compile_glob(pattern: str, fold_case: bool) -> _Glob:
    text = pattern.casefold() if fold_case else pattern
    parts = _split_pattern(text)
    matchers = tuple(
        None if part == "**" else re.compile(fnmatch.translate(part)) for part in parts
    )
    prefix: list[str] = []
    for part in parts:
        if part == "**" or _GLOB_CHARS.search(part):
            break
        prefix.append(part)
    return _Glob(matchers, tuple(prefix), parts[0] == "**")


def _validate_pattern(pattern: str) -> str:
    _compile_glob(pattern, False)
    return pattern


Pattern = Annotated[str, AfterValidator(_validate_pattern)]


class WritePolicy(BaseModel):
    """One workspace's or vault's write rules, as written in the YAML configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowed_paths: tuple[Pattern, ...]
    disallowed_paths: tuple[Pattern, ...] = ()
    allowed_operations: frozenset[Operation]
    max_bytes_per_write: StrictInt = Field(default=DEFAULT_MAX_BYTES_PER_WRITE, gt=0)
    max_changed_lines_per_edit: StrictInt = Field(default=DEFAULT_MAX_CHANGED_LINES_PER_EDIT, gt=0)
    require_approval: StrictBool = True
    approval_mode: Literal["token", "elicit"] = "token"

    @property
    def effective_disallowed_paths(self) -> tuple[str, ...]:
        """The configured entries plus the defaults, which always apply."""
        return with_default_disallowed(self.disallowed_paths)


def with_default_disallowed(entries: Sequence[str]) -> tuple[str, ...]:
    """``DEFAULT_DISALLOWED_PATHS``, which always apply, then ``entries`` not among them."""
    return DEFAULT_DISALLOWED_PATHS + tuple(p for p in entries if p not in DEFAULT_DISALLOWED_PATHS)


DEV_WRITE_POLICY = WritePolicy(
    allowed_paths=("**",),
    allowed_operations=OPERATIONS,
    max_bytes_per_write=DEV_MAX_BYTES_PER_WRITE,
    max_changed_lines_per_edit=DEV_MAX_CHANGED_LINES_PER_EDIT,
    require_approval=False,
)


class _WritePoliciesDocument(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    workspace: WritePolicy | None = None
    vaults: dict[str, WritePolicy] = Field(default_factory=dict)


@dataclass(frozen=True)
class WritePolicyConfig:
    """The loaded policies; ``fallback`` is set only for the dev-mode permissive policy."""

    workspace: WritePolicy | None = None
    vaults: Mapping[str, WritePolicy] = field(default_factory=lambda: MappingProxyType({}))
    fallback: WritePolicy | None = None

    def policy_for_workspace(self) -> WritePolicy | None:
        return self.workspace if self.workspace is not None else self.fallback

    def policy_for_vault(self, vault_id: str) -> WritePolicy | None:
        return self.vaults.get(vault_id, self.fallback)


@dataclass(frozen=True)
class WriteDecision:
    allowed: bool
    rule: str
    requires_approval: bool = False
    approval_mode: Literal["token", "elicit"] = "token"
    facts: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


def load_write_policy_config(
    raw: Mapping[str, Any] | None, *, mode: str, source: Path | None = None
) -> tuple[WritePolicyConfig, list[str]]:
    """Validate the ``write_policies`` section; returns the config and warnings to log.

    Only ``mode == "dev"`` with no section at all falls back to ``DEV_WRITE_POLICY``;
    any other mode is production and never does.
    """
    if raw is None:
        if mode == "dev":
            return WritePolicyConfig(fallback=DEV_WRITE_POLICY), [DEV_POLICY_WARNING]
        return WritePolicyConfig(), [PROD_NO_POLICY_WARNING]
    here = (CONFIG_LOCATION,)
    if not isinstance(raw, Mapping):
        raise refuse([(here, f"`{CONFIG_LOCATION}` should be a mapping (key: value)")], source)
    try:
        document = _WritePoliciesDocument.model_validate(dict(raw))
    except ValidationError as exc:
        problems = problems_from(exc, _WritePoliciesDocument, prefix=here)
        raise refuse(problems, source) from None
    config = WritePolicyConfig(
        workspace=document.workspace, vaults=MappingProxyType(dict(document.vaults))
    )
    warnings = [] if document.workspace is not None else ["no workspace write policy: denied"]
    return config, warnings


def decide_write(
    policy: WritePolicy | None,
    *,
    operation: str,
    paths: Sequence[str],
    size_bytes: int | None = None,
    changed_lines: int | None = None,
) -> WriteDecision:
    """The decision table, without raising: ``allowed`` False names the first rule hit."""
    if policy is None:
        return WriteDecision(False, RULE_NO_POLICY)
    if operation not in OPERATIONS:
        return WriteDecision(False, RULE_UNKNOWN_OPERATION)
    if operation not in policy.allowed_operations:
        return WriteDecision(False, RULE_OPERATION_NOT_ALLOWED)
    if not paths:
        return WriteDecision(False, RULE_NO_PATHS)
    for path in paths:
        refused = _check_path(policy, path, subtree=operation in SUBTREE_OPERATIONS)
        if refused is not None:
            rule, entry = refused
            return WriteDecision(False, rule, facts=_entry_facts(policy, entry))
    if size_bytes is not None and (size_bytes < 0 or size_bytes > policy.max_bytes_per_write):
        facts = {"limit_bytes": policy.max_bytes_per_write, "actual_bytes": size_bytes}
        return WriteDecision(False, RULE_MAX_BYTES, facts=MappingProxyType(facts))
    limit_lines = policy.max_changed_lines_per_edit
    if changed_lines is not None and (changed_lines < 0 or changed_lines > limit_lines):
        facts = {"limit_lines": limit_lines, "actual_lines": changed_lines}
        return WriteDecision(False, RULE_MAX_CHANGED_LINES, facts=MappingProxyType(facts))
    return WriteDecision(True, RULE_ALLOWED, policy.require_approval, policy.approval_mode)


def check_write(
    policy: WritePolicy | None,
    *,
    operation: str,
    paths: Sequence[str],
    size_bytes: int | None = None,
    changed_lines: int | None = None,
) -> WriteDecision:
    """``decide_write`` that raises ``WritePolicyDeniedError(rule=...)`` on a denial."""
    decision = decide_write(
        policy,
        operation=operation,
        paths=paths,
        size_bytes=size_bytes,
        changed_lines=changed_lines,
    )
    if not decision.allowed:
        known_operation = operation if operation in OPERATIONS else None
        raise WritePolicyDeniedError(
            rule=decision.rule, operation=known_operation, **dict(decision.facts)
        )
    return decision


@dataclass(frozen=True)
class PathGate:
    """The path rules of one policy, as the workspace asks them when a write acts.

    The chain decides the whole policy (operations, paths, sizes) before the tool runs;
    the workspace asks this gate again, on the real paths it is about to touch, in the
    worker that touches them (``workspace.paths.PathAdmission``). ``None`` denies every write.
    """

    policy: WritePolicy | None

    def check_paths(self, operation: str, paths: Sequence[str]) -> None:
        check_write(self.policy, operation=operation, paths=paths)


def is_path_disallowed(policy: WritePolicy | None, path: str) -> bool:
    """True when ``path`` (or an ancestor) matches a disallowed entry, defaults included."""
    entries = policy.effective_disallowed_paths if policy else DEFAULT_DISALLOWED_PATHS
    return matches_disallowed(entries, path)


def matches_disallowed(entries: Sequence[str], path: str) -> bool:
    """True when ``path`` (or an ancestor) matches one of ``entries``, with the same
    case and name folding as the policy's own check; a path that is not normalized
    counts as disallowed."""
    segments = _to_segments(path)
    if segments is None:
        return True
    return _matches_disallowed(entries, _folded_variants(segments))


def count_changed_lines(old_text: str, new_text: str) -> int:
    """Lines removed plus lines added, after trimming the lines both texts share at each end.

    Exact for one contiguous change, an upper bound otherwise; linear time, unlike
    difflib, whose quadratic worst case a caller could trigger with a large edit.
    Line endings count as content, so a CRLF-to-LF change counts every line.
    """
    old_lines = old_text.splitlines(keepends=True)
    new_lines = new_text.splitlines(keepends=True)
    shared = min(len(old_lines), len(new_lines))
    head = 0
    while head < shared and old_lines[head] == new_lines[head]:
        head += 1
    tail = 0
    while (
        tail < shared - head
        and old_lines[len(old_lines) - 1 - tail] == new_lines[len(new_lines) - 1 - tail]
    ):
        tail += 1
    return (len(old_lines) - head - tail) + (len(new_lines) - head - tail)


def _check_path(policy: WritePolicy, path: str, *, subtree: bool) -> tuple[str, str | None] | None:
    """The rule ``path`` breaks and the disallowed entry that decided, if one did."""
    segments = _to_segments(path)
    if segments is None:
        return RULE_PATH_NOT_NORMALIZED, None
    if not segments:
        return RULE_WORKSPACE_ROOT, None
    disallowed = policy.effective_disallowed_paths
    variants = _folded_variants(segments)
    entry = _first_disallowed(disallowed, variants)
    if entry is not None:
        return RULE_PATH_DISALLOWED, entry
    if subtree:
        entry = _disallowed_below(disallowed, variants)
        if entry is not None:
            return RULE_DISALLOWED_SUBTREE, entry
    if not any(_compile_glob(pattern, False).matches(segments) for pattern in policy.allowed_paths):
        return RULE_PATH_NOT_ALLOWED, None
    return None


def entry_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """Which disallowed entry a denial's ``facts`` name, to carry into another denial."""
    return {k: v for k, v in facts.items() if k in ("disallowed_entry", "disallowed_builtin")}


def _entry_facts(policy: WritePolicy, entry: str | None) -> Mapping[str, Any]:
    """Which disallowed entry decided, as the refusal may say it: its position in the
    configured ``disallowed_paths`` (1-based), or that it is a built-in one; never the
    pattern itself (an operator's pattern can name what it protects)."""
    if entry is None:
        return MappingProxyType({})
    if entry in DEFAULT_DISALLOWED_PATHS:
        return MappingProxyType({"disallowed_builtin": True})
    return MappingProxyType({"disallowed_entry": policy.disallowed_paths.index(entry) + 1})


def _to_segments(path: str) -> list[str] | None:
    """Segments of a normalized relative path, ``[]`` for the root, None if not normalized."""
    if not isinstance(path, str) or "\\" in path or "\x00" in path or path.startswith("/"):
        return None
    trimmed = path.removesuffix("/")
    if trimmed in ("", "."):
        return []
    segments = trimmed.split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        return None
    return segments


def _folded_variants(segments: Sequence[str]) -> list[list[str]]:
    folded = [segment.casefold() for segment in segments]
    # What NTFS and HFS+ would resolve the name to: no stream suffix, no trailing dots
    # or spaces, no ignorable code points. Checked in addition, so it only adds denials.
    hardened = [
        segment.translate(_IGNORABLE_CHARS).split(":", 1)[0].rstrip(". ") for segment in folded
    ]
    return [folded] if hardened == folded else [folded, hardened]


def _matches_disallowed(entries: Sequence[str], variants: Sequence[Sequence[str]]) -> bool:
    return _first_disallowed(entries, variants) is not None


def _first_disallowed(entries: Sequence[str], variants: Sequence[Sequence[str]]) -> str | None:
    """The first entry that denies the path (or an ancestor of it), in the given order."""
    for entry in entries:
        glob = _compile_glob(entry, True)
        if any(glob.matches(variant, or_ancestor=True) for variant in variants):
            return entry
    return None


def _disallowed_below(entries: Sequence[str], variants: Sequence[Sequence[str]]) -> str | None:
    """The first anchored entry at or below the path (moving or removing the path as a
    whole would carry it)."""
    for entry in entries:
        glob = _compile_glob(entry, True)
        if glob.starts_with_globstar:
            continue
        prefix = glob.literal_prefix
        for variant in variants:
            if len(variant) <= len(prefix) and tuple(variant) == prefix[: len(variant)]:
                return entry
    return None


def utf8_size(value: str, pointer: str) -> int:
    """Exact UTF-8 size; text that has no UTF-8 form (a lone surrogate) is refused."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise DocEncodingInvalidError(encoding="utf8", pointer=pointer) from None


def measure_write(operation: str, arguments: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(size_bytes, changed_lines)`` of a write before it runs, for the policy limits."""
    if operation == "write":
        content = arguments.get("content")
        return (utf8_size(content, "/content") if isinstance(content, str) else None), None
    if operation == "edit":
        old, new = arguments.get("old_text"), arguments.get("new_text")
        times = arguments.get("expected_occurrences", 1)
        if isinstance(old, str) and isinstance(new, str) and isinstance(times, int):
            utf8_size(old, "/old_text")
            return utf8_size(new, "/new_text") * times, count_changed_lines(old, new) * times
    return None, None


__all__ = [
    "DEFAULT_DISALLOWED_PATHS",
    "DEV_POLICY_WARNING",
    "DEV_WRITE_POLICY",
    "OPERATIONS",
    "RULE_ALLOWED",
    "RULE_DISALLOWED_SUBTREE",
    "RULE_MAX_BYTES",
    "RULE_MAX_CHANGED_LINES",
    "RULE_NO_PATHS",
    "RULE_NO_POLICY",
    "RULE_OPERATION_NOT_ALLOWED",
    "RULE_PATH_DISALLOWED",
    "RULE_PATH_NOT_ALLOWED",
    "RULE_PATH_NOT_NORMALIZED",
    "RULE_UNKNOWN_OPERATION",
    "RULE_WORKSPACE_ROOT",
    "TOOL_OPERATIONS",
    "Operation",
    "PathGate",
    "Pattern",
    "WriteDecision",
    "WritePolicy",
    "WritePolicyConfig",
    "check_write",
    "count_changed_lines",
    "decide_write",
    "entry_facts",
    "is_path_disallowed",
    "load_write_policy_config",
    "matches_disallowed",
    "measure_write",
    "utf8_size",
    "with_default_disallowed",
]
