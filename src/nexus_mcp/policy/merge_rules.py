"""The merge decision: may this pull request be merged now, and if not, which reason class.

Pure: the forge client (``nexus_mcp.repos.forge``) fetches the pull request, its status
contexts, check runs and reviews, and ``evaluate_merge`` judges them against
``MergeRules``. The value objects live here so policy never imports the HTTP client.

Rules, first failure wins, in this order:

1. ``pull_not_open``: the pull request is closed or already merged.
2. ``base_not_allowed``: ``allowed_bases`` is set and the base branch is not in it.
3. ``head_changed``: the caller pinned a head sha and the head has moved since.
4. ``not_mergeable``: a draft, or the forge says it is not mergeable, or has not decided
   yet (``mergeable`` is ``None`` while GitHub computes it: fail closed, retry later).
5. Checks, on the latest check run per name (highest id wins) and every status context:
   ``checks_failed`` if any is red, then ``checks_pending`` if any has not finished, then
   ``checks_missing`` if a required check is not green.
6. Reviews, per reviewer the latest review that changes their standing: ``APPROVED``,
   ``CHANGES_REQUESTED`` or ``DISMISSED`` (which clears it); ``COMMENTED`` and
   ``PENDING`` change nothing. The author's own reviews never count. Any standing change
   request gives ``changes_requested`` (even on an older commit: a request stays until it
   is dismissed, as on GitHub); then fewer counted approvals than ``required_approvals``
   gives ``reviews_missing``. With ``dismiss_stale_reviews`` an approval counts only if
   it was given on the current head sha.

Green, red and unfinished (fail closed: anything unknown is red):

- a status context is green on ``success``, unfinished on ``pending``, red otherwise
  (``failure``, ``error``, or any state this module does not know);
- a check run is unfinished until its status is ``completed``; then green on
  ``success``, ``neutral`` or ``skipped``, red otherwise (``failure``, ``cancelled``,
  ``timed_out``, ``action_required``, ``startup_failure``, ``stale``, a missing or
  unknown conclusion).

A *required* check is stricter: it is satisfied only by a status context in ``success``
or a latest check run that concluded ``success``. A required check that was skipped or
neutral did not run to a verdict, so it proves nothing and counts as ``checks_missing``
(GitHub's branch protection would accept it; a merge guard for agents does not).

Logins compare case-insensitively, as GitHub's do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nexus_mcp.errors import ConfigError

PULL_NOT_OPEN = "pull_not_open"
NOT_MERGEABLE = "not_mergeable"
HEAD_CHANGED = "head_changed"
CHECKS_PENDING = "checks_pending"
CHECKS_FAILED = "checks_failed"
CHECKS_MISSING = "checks_missing"
REVIEWS_MISSING = "reviews_missing"
CHANGES_REQUESTED = "changes_requested"
BASE_NOT_ALLOWED = "base_not_allowed"

STATUS_SUCCESS = "success"
STATUS_PENDING = "pending"
RUN_COMPLETED = "completed"
RUN_SUCCESS = "success"
GREEN_CONCLUSIONS = frozenset({"success", "neutral", "skipped"})

REVIEW_APPROVED = "APPROVED"
REVIEW_CHANGES_REQUESTED = "CHANGES_REQUESTED"
REVIEW_DISMISSED = "DISMISSED"
STANDING_STATES = frozenset({REVIEW_APPROVED, REVIEW_CHANGES_REQUESTED, REVIEW_DISMISSED})


@dataclass(frozen=True)
class PullRequest:
    number: int
    state: str
    merged: bool
    mergeable: bool | None
    draft: bool
    head_ref: str
    head_sha: str
    base_ref: str
    html_url: str
    user_login: str
    base_sha: str | None = None  # the base branch's commit, as the forge reports it


@dataclass(frozen=True)
class Review:
    """One submitted review; ``id`` orders reviews (the forge assigns it increasing)."""

    user_login: str
    state: str
    commit_id: str | None
    submitted_at: str | None
    id: int


@dataclass(frozen=True)
class StatusContext:
    context: str
    state: str


@dataclass(frozen=True)
class CheckRun:
    id: int
    name: str
    status: str
    conclusion: str | None


@dataclass(frozen=True)
class MergeRules:
    required_checks: tuple[str, ...] = ()
    required_approvals: int = 1
    dismiss_stale_reviews: bool = True
    allowed_bases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if type(self.required_approvals) is not int or self.required_approvals < 0:
            raise ConfigError("merge rules: required_approvals must be a non-negative integer")


def evaluate_merge(
    rules: MergeRules,
    pull: PullRequest,
    statuses: Sequence[StatusContext],
    runs: Sequence[CheckRun],
    reviews: Sequence[Review],
    *,
    expected_head_sha: str | None = None,
) -> str | None:
    """``None`` when the merge may proceed, else the first reason class that blocks it."""
    if pull.state != "open" or pull.merged:
        return PULL_NOT_OPEN
    if rules.allowed_bases and pull.base_ref not in rules.allowed_bases:
        return BASE_NOT_ALLOWED
    if expected_head_sha is not None and expected_head_sha != pull.head_sha:
        return HEAD_CHANGED
    if pull.draft or pull.mergeable is not True:
        return NOT_MERGEABLE
    blocked = _check_reason(rules, statuses, latest_check_runs(runs))
    if blocked is not None:
        return blocked
    standings = _standings(pull, reviews)
    if any(review.state == REVIEW_CHANGES_REQUESTED for review in standings.values()):
        return CHANGES_REQUESTED
    if len(_counted_approvals(rules, pull, standings)) < rules.required_approvals:
        return REVIEWS_MISSING
    return None


def approving_reviewers(
    rules: MergeRules, pull: PullRequest, reviews: Sequence[Review]
) -> frozenset[str]:
    """The logins whose approval counts toward ``required_approvals`` (for CODEOWNERS)."""
    return _counted_approvals(rules, pull, _standings(pull, reviews))


def latest_check_runs(runs: Iterable[CheckRun]) -> dict[str, CheckRun]:
    """The latest run per check name: a re-run supersedes the run it repeats."""
    latest: dict[str, CheckRun] = {}
    for run in runs:
        current = latest.get(run.name)
        if current is None or run.id > current.id:
            latest[run.name] = run
    return latest


def _check_reason(
    rules: MergeRules, statuses: Sequence[StatusContext], runs: dict[str, CheckRun]
) -> str | None:
    if any(_is_red_status(s) for s in statuses) or any(_is_red_run(r) for r in runs.values()):
        return CHECKS_FAILED
    if any(s.state == STATUS_PENDING for s in statuses) or any(
        r.status != RUN_COMPLETED for r in runs.values()
    ):
        return CHECKS_PENDING
    passed = {s.context for s in statuses if s.state == STATUS_SUCCESS}
    passed.update(name for name, run in runs.items() if run.conclusion == RUN_SUCCESS)
    if any(name not in passed for name in rules.required_checks):
        return CHECKS_MISSING
    return None


def _is_red_status(status: StatusContext) -> bool:
    return status.state not in (STATUS_SUCCESS, STATUS_PENDING)


def _is_red_run(run: CheckRun) -> bool:
    return run.status == RUN_COMPLETED and run.conclusion not in GREEN_CONCLUSIONS


def _standings(pull: PullRequest, reviews: Sequence[Review]) -> dict[str, Review]:
    """Per reviewer (case-folded login), the latest review that set their standing."""
    author = pull.user_login.casefold()
    latest: dict[str, Review] = {}
    for review in reviews:
        reviewer = review.user_login.casefold()
        if reviewer == author or review.state not in STANDING_STATES:
            continue
        current = latest.get(reviewer)
        if current is None or review.id > current.id:
            latest[reviewer] = review
    return {who: r for who, r in latest.items() if r.state != REVIEW_DISMISSED}


def _counted_approvals(
    rules: MergeRules, pull: PullRequest, standings: dict[str, Review]
) -> frozenset[str]:
    return frozenset(
        review.user_login
        for review in standings.values()
        if review.state == REVIEW_APPROVED
        and (not rules.dismiss_stale_reviews or review.commit_id == pull.head_sha)
    )


__all__ = [
    "BASE_NOT_ALLOWED",
    "CHANGES_REQUESTED",
    "CHECKS_FAILED",
    "CHECKS_MISSING",
    "CHECKS_PENDING",
    "HEAD_CHANGED",
    "NOT_MERGEABLE",
    "PULL_NOT_OPEN",
    "REVIEWS_MISSING",
    "CheckRun",
    "MergeRules",
    "PullRequest",
    "Review",
    "StatusContext",
    "approving_reviewers",
    "evaluate_merge",
    "latest_check_runs",
]
