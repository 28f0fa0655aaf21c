"""The merge decision as decision tables: every reason class, their order, and the edge cases."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nexus_mcp.errors import MERGE_BLOCKED_REASONS, ConfigError
from nexus_mcp.policy.merge_rules import (
    CheckRun,
    MergeRules,
    PullRequest,
    Review,
    StatusContext,
    approving_reviewers,
    evaluate_merge,
    latest_check_runs,
)

HEAD = "a" * 40
OLD = "b" * 40
AUTHOR = "agent-bot"
PULL = PullRequest(
    number=7,
    state="open",
    merged=False,
    mergeable=True,
    draft=False,
    head_ref="feature/x",
    head_sha=HEAD,
    base_ref="main",
    html_url="https://forge.test/octo/widgets/pull/7",
    user_login=AUTHOR,
)
RULES = MergeRules(required_checks=("ci",), required_approvals=1)
GREEN = (StatusContext("ci", "success"),)


def review(review_id: int, login: str, state: str, commit_id: str | None = HEAD) -> Review:
    return Review(
        user_login=login, state=state, commit_id=commit_id, submitted_at=None, id=review_id
    )


def run(
    run_id: int, name: str, status: str = "completed", conclusion: str | None = "success"
) -> CheckRun:
    return CheckRun(id=run_id, name=name, status=status, conclusion=conclusion)


APPROVED = (review(1, "alice", "APPROVED"),)


def decide(
    *,
    rules: MergeRules = RULES,
    pull: PullRequest = PULL,
    statuses: tuple[StatusContext, ...] = GREEN,
    runs: tuple[CheckRun, ...] = (),
    reviews: tuple[Review, ...] = APPROVED,
    expected_head_sha: str | None = None,
) -> str | None:
    return evaluate_merge(rules, pull, statuses, runs, reviews, expected_head_sha=expected_head_sha)


def test_a_green_approved_open_pull_may_merge() -> None:
    assert decide() is None
    assert decide(expected_head_sha=HEAD) is None


@pytest.mark.parametrize(
    ("pull", "reason"),
    [
        (replace(PULL, state="closed"), "pull_not_open"),
        (replace(PULL, merged=True), "pull_not_open"),
        (replace(PULL, state="closed", merged=True), "pull_not_open"),
        (replace(PULL, draft=True), "not_mergeable"),
        (replace(PULL, mergeable=False), "not_mergeable"),
        (replace(PULL, mergeable=None), "not_mergeable"),
    ],
    ids=["closed", "merged", "closed and merged", "draft", "conflicting", "still computing"],
)
def test_the_pull_request_itself_can_block(pull: PullRequest, reason: str) -> None:
    assert decide(pull=pull) == reason


def test_a_moved_head_blocks_as_head_changed() -> None:
    assert decide(expected_head_sha=OLD) == "head_changed"


@pytest.mark.parametrize(
    ("allowed", "base", "reason"),
    [
        ((), "anything", None),
        (("main",), "main", None),
        (("main", "release"), "release", None),
        (("main",), "Main", "base_not_allowed"),
        (("main",), "feature/y", "base_not_allowed"),
    ],
)
def test_allowed_bases_limit_the_base_branch(
    allowed: tuple[str, ...], base: str, reason: str | None
) -> None:
    rules = replace(RULES, allowed_bases=allowed)
    assert decide(rules=rules, pull=replace(PULL, base_ref=base)) == reason


# --- checks -----------------------------------------------------------------------------

STATUS_TABLE = [
    ("success", None),
    ("pending", "checks_pending"),
    ("failure", "checks_failed"),
    ("error", "checks_failed"),
    ("unknown-state", "checks_failed"),
]


@pytest.mark.parametrize(("state", "reason"), STATUS_TABLE)
def test_an_optional_status_context_blocks_unless_green(state: str, reason: str | None) -> None:
    assert decide(statuses=(*GREEN, StatusContext("lint", state))) == reason


RUN_TABLE = [
    ("completed", "success", None),
    ("completed", "neutral", None),
    ("completed", "skipped", None),
    ("completed", "failure", "checks_failed"),
    ("completed", "cancelled", "checks_failed"),
    ("completed", "timed_out", "checks_failed"),
    ("completed", "action_required", "checks_failed"),
    ("completed", "startup_failure", "checks_failed"),
    ("completed", "stale", "checks_failed"),
    ("completed", None, "checks_failed"),
    ("completed", "something-new", "checks_failed"),
    ("queued", None, "checks_pending"),
    ("in_progress", None, "checks_pending"),
    ("waiting", None, "checks_pending"),
]


@pytest.mark.parametrize(("status", "conclusion", "reason"), RUN_TABLE)
def test_an_optional_check_run_blocks_unless_green(
    status: str, conclusion: str | None, reason: str | None
) -> None:
    assert decide(runs=(run(1, "lint", status, conclusion),)) == reason


@pytest.mark.parametrize(
    ("statuses", "runs", "reason"),
    [
        ((), (), "checks_missing"),
        ((StatusContext("ci", "success"),), (), None),
        ((), (run(1, "ci"),), None),
        ((), (run(1, "ci", conclusion="neutral"),), "checks_missing"),
        ((), (run(1, "ci", conclusion="skipped"),), "checks_missing"),
        ((StatusContext("ci", "success"),), (run(1, "ci", conclusion="skipped"),), None),
        ((StatusContext("ci/other", "success"),), (run(1, "other"),), "checks_missing"),
        ((StatusContext("CI", "success"),), (), "checks_missing"),
    ],
    ids=[
        "absent",
        "status success",
        "run success",
        "run neutral",
        "run skipped",
        "status success beside a skipped run",
        "other names",
        "names compare exactly",
    ],
)
def test_a_required_check_needs_a_success_by_status_or_check_run(
    statuses: tuple[StatusContext, ...], runs: tuple[CheckRun, ...], reason: str | None
) -> None:
    assert decide(statuses=statuses, runs=runs) == reason


def test_two_required_checks_both_need_a_success() -> None:
    rules = replace(RULES, required_checks=("ci", "e2e"))
    assert decide(rules=rules) == "checks_missing"
    assert decide(rules=rules, runs=(run(1, "e2e"),)) is None


@pytest.mark.parametrize(
    ("runs", "reason"),
    [
        ((run(1, "ci", conclusion="failure"), run(2, "ci")), None),
        ((run(2, "ci"), run(1, "ci", conclusion="failure")), None),
        ((run(1, "ci"), run(2, "ci", conclusion="failure")), "checks_failed"),
        ((run(1, "ci"), run(2, "ci", "in_progress", None)), "checks_pending"),
        ((run(9, "ci", conclusion="cancelled"), run(3, "ci")), "checks_failed"),
    ],
    ids=[
        "re-run fixed it",
        "order in the list is irrelevant",
        "re-run broke it",
        "re-running",
        "highest id",
    ],
)
def test_only_the_latest_check_run_per_name_counts(
    runs: tuple[CheckRun, ...], reason: str | None
) -> None:
    assert decide(statuses=(), runs=runs) == reason


def test_latest_check_runs_keeps_the_highest_id_per_name() -> None:
    runs = [run(3, "a"), run(5, "b"), run(4, "a", conclusion="failure"), run(1, "b")]
    assert latest_check_runs(runs) == {"a": runs[2], "b": runs[1]}


# --- reviews ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reviews", "reason"),
    [
        ((), "reviews_missing"),
        ((review(1, "alice", "APPROVED"),), None),
        ((review(1, "alice", "APPROVED", OLD),), "reviews_missing"),
        ((review(1, "alice", "APPROVED", None),), "reviews_missing"),
        ((review(1, "alice", "COMMENTED"),), "reviews_missing"),
        ((review(1, "alice", "PENDING", None),), "reviews_missing"),
        ((review(1, AUTHOR, "APPROVED"),), "reviews_missing"),
        ((review(1, AUTHOR.upper(), "APPROVED"),), "reviews_missing"),
        ((review(1, "alice", "APPROVED"), review(2, "alice", "COMMENTED")), None),
        ((review(1, "alice", "APPROVED"), review(2, "alice", "DISMISSED")), "reviews_missing"),
        ((review(1, "alice", "DISMISSED"), review(2, "alice", "APPROVED")), None),
        ((review(1, "alice", "CHANGES_REQUESTED"), review(2, "alice", "APPROVED")), None),
        (
            (review(1, "alice", "APPROVED"), review(2, "alice", "CHANGES_REQUESTED")),
            "changes_requested",
        ),
        (
            (review(2, "alice", "CHANGES_REQUESTED"), review(1, "alice", "APPROVED")),
            "changes_requested",
        ),
        (
            (review(1, "alice", "CHANGES_REQUESTED"), review(2, "alice", "COMMENTED")),
            "changes_requested",
        ),
        (
            (review(1, "alice", "CHANGES_REQUESTED"), review(2, "alice", "DISMISSED")),
            "reviews_missing",
        ),
        (
            (review(1, "alice", "APPROVED"), review(2, "bob", "CHANGES_REQUESTED", OLD)),
            "changes_requested",
        ),
        (
            (review(1, "alice", "APPROVED"), review(2, AUTHOR, "CHANGES_REQUESTED")),
            None,
        ),
        (
            (review(1, "alice", "APPROVED"), review(2, "ALICE", "DISMISSED")),
            "reviews_missing",
        ),
    ],
    ids=[
        "no reviews",
        "approved on head",
        "approved on an older commit",
        "approved on no commit",
        "only a comment",
        "only a pending review",
        "author self-approval",
        "author self-approval in other case",
        "a later comment keeps an approval",
        "a dismissal clears an approval",
        "approved after a dismissal",
        "approved after requesting changes",
        "changes requested after approving",
        "latest by id, not by list order",
        "a later comment keeps a change request",
        "a dismissal clears a change request",
        "a stale change request still blocks",
        "the author's own change request is ignored",
        "logins compare case-insensitively",
    ],
)
def test_reviews_decide_by_each_reviewers_latest_standing(
    reviews: tuple[Review, ...], reason: str | None
) -> None:
    assert decide(reviews=reviews) == reason


def test_stale_approvals_count_when_stale_reviews_are_not_dismissed() -> None:
    rules = replace(RULES, dismiss_stale_reviews=False)
    assert decide(rules=rules, reviews=(review(1, "alice", "APPROVED", OLD),)) is None


@pytest.mark.parametrize(
    ("reviews", "reason"),
    [
        ((review(1, "alice", "APPROVED"),), "reviews_missing"),
        ((review(1, "alice", "APPROVED"), review(2, "alice", "APPROVED")), "reviews_missing"),
        ((review(1, "alice", "APPROVED"), review(2, "bob", "APPROVED", OLD)), "reviews_missing"),
        ((review(1, "alice", "APPROVED"), review(2, "bob", "APPROVED")), None),
    ],
    ids=["one", "the same reviewer twice", "one of them stale", "two"],
)
def test_two_required_approvals_need_two_distinct_current_reviewers(
    reviews: tuple[Review, ...], reason: str | None
) -> None:
    assert decide(rules=replace(RULES, required_approvals=2), reviews=reviews) == reason


def test_zero_required_approvals_still_honours_change_requests() -> None:
    rules = replace(RULES, required_approvals=0)
    assert decide(rules=rules, reviews=()) is None
    assert decide(rules=rules, reviews=(review(1, "bob", "CHANGES_REQUESTED"),)) == (
        "changes_requested"
    )


def test_approving_reviewers_are_the_logins_whose_approval_counts() -> None:
    reviews = (
        review(1, "alice", "APPROVED"),
        review(2, "bob", "APPROVED", OLD),
        review(3, AUTHOR, "APPROVED"),
        review(4, "carol", "APPROVED"),
        review(5, "carol", "DISMISSED"),
        review(6, "dave", "COMMENTED"),
        review(7, "erin", "CHANGES_REQUESTED"),
        review(8, "Frank", "APPROVED"),
    )
    assert approving_reviewers(RULES, PULL, reviews) == frozenset({"alice", "Frank"})
    stale_ok = replace(RULES, dismiss_stale_reviews=False)
    assert approving_reviewers(stale_ok, PULL, reviews) == frozenset({"alice", "bob", "Frank"})


# --- order and vocabulary ---------------------------------------------------------------

FAILED = (StatusContext("ci", "failure"),)
PENDING = (StatusContext("ci", "pending"),)
CHANGES = (review(1, "bob", "CHANGES_REQUESTED"),)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (
            {
                "pull": replace(PULL, state="closed", draft=True, base_ref="x"),
                "statuses": FAILED,
                "reviews": CHANGES,
                "expected_head_sha": OLD,
            },
            "pull_not_open",
        ),
        (
            {"pull": replace(PULL, base_ref="x", draft=True), "expected_head_sha": OLD},
            "base_not_allowed",
        ),
        ({"pull": replace(PULL, draft=True), "expected_head_sha": OLD}, "head_changed"),
        ({"pull": replace(PULL, mergeable=False), "statuses": FAILED}, "not_mergeable"),
        ({"statuses": (*FAILED, *PENDING), "reviews": CHANGES}, "checks_failed"),
        ({"statuses": (StatusContext("lint", "pending"),), "reviews": CHANGES}, "checks_pending"),
        ({"statuses": (), "reviews": CHANGES}, "checks_missing"),
        ({"reviews": (*CHANGES, review(2, "alice", "APPROVED"))}, "changes_requested"),
    ],
    ids=[
        "not open first",
        "then the base",
        "then the head",
        "then mergeability",
        "then failed checks",
        "then pending checks",
        "then missing checks",
        "then change requests before approvals",
    ],
)
def test_the_first_failing_rule_wins(case: dict[str, object], reason: str) -> None:
    rules = replace(RULES, allowed_bases=("main",))
    assert decide(rules=rules, **case) == reason  # type: ignore[arg-type]


def test_every_reason_is_a_merge_blocked_reason_class() -> None:
    reasons = {
        decide(pull=replace(PULL, state="closed")),
        decide(rules=replace(RULES, allowed_bases=("x",))),
        decide(expected_head_sha=OLD),
        decide(pull=replace(PULL, draft=True)),
        decide(statuses=FAILED),
        decide(statuses=PENDING),
        decide(statuses=()),
        decide(reviews=CHANGES),
        decide(reviews=()),
    }
    assert len(reasons) == 9
    assert reasons <= MERGE_BLOCKED_REASONS


@pytest.mark.parametrize("approvals", [-1, True, 1.5])
def test_required_approvals_must_be_a_non_negative_integer(approvals: object) -> None:
    with pytest.raises(ConfigError):
        MergeRules(required_approvals=approvals)  # type: ignore[arg-type]
