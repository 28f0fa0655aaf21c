"""Session budgets, sliding-window rate limits and tool timeouts, with injected clocks."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from nexus_mcp.errors import Code, ConfigError, NexusError
from nexus_mcp.policy.budgets import (
    IdleExpiringMap,
    SessionBudget,
    SlidingWindowRateLimiter,
    ToolTimeouts,
)


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def outcome(call: Any, *args: Any) -> str:
    try:
        call(*args)
    except NexusError as exc:
        return str(exc.code)
    return "ok"


# --- session budget -----------------------------------------------------------------------


def test_a_session_may_make_exactly_its_budget_of_calls() -> None:
    budget = SessionBudget(3, FakeClock())
    assert [budget.charge("s1") for _ in range(3)] == [2, 1, 0]
    with pytest.raises(NexusError) as caught:
        budget.charge("s1")
    assert caught.value.code == Code.BUDGET_EXCEEDED
    assert caught.value.facts == {"limit": 3}


def test_budgets_are_kept_per_session_key() -> None:
    budget = SessionBudget(2, FakeClock())
    results = [outcome(budget.charge, key) for key in ("a", "a", "b", "a", "b", "b")]
    assert results == ["ok", "ok", "ok", "BUDGET_EXCEEDED", "ok", "BUDGET_EXCEEDED"]


def test_an_idle_session_is_forgotten_after_the_idle_ttl() -> None:
    clock = FakeClock()
    budget = SessionBudget(1, clock, idle_ttl_seconds=100)
    budget.charge("s1")
    clock.now = 99.0
    assert outcome(budget.charge, "s1") == "BUDGET_EXCEEDED"
    clock.now = 198.0  # the refused call renewed the idle clock
    assert outcome(budget.charge, "s1") == "BUDGET_EXCEEDED"
    clock.now = 299.0
    assert len(budget) == 0
    assert outcome(budget.charge, "s1") == "ok"


def test_the_budget_tracks_at_most_maxsize_sessions() -> None:
    budget = SessionBudget(5, FakeClock(), maxsize=100)
    for i in range(1000):
        budget.charge(f"session-{i}")
    assert len(budget) == 100


def test_concurrent_charges_never_exceed_the_budget() -> None:
    budget = SessionBudget(100, FakeClock())
    barrier = threading.Barrier(20)

    def charge_many(_: int) -> int:
        barrier.wait(timeout=10)
        return sum(outcome(budget.charge, "shared") == "ok" for _ in range(20))

    with ThreadPoolExecutor(max_workers=20) as pool:
        assert sum(pool.map(charge_many, range(20))) == 100


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_calls_per_session": 0},
        {"max_calls_per_session": True},
        {"max_calls_per_session": 5, "idle_ttl_seconds": 0},
        {"max_calls_per_session": 5, "idle_ttl_seconds": float("inf")},
        {"max_calls_per_session": 5, "maxsize": 0},
    ],
)
def test_a_bad_budget_setting_is_a_config_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        SessionBudget(clock=FakeClock(), **kwargs)


# --- sliding window -----------------------------------------------------------------------


def test_a_subject_may_make_max_calls_in_any_window() -> None:
    clock = FakeClock()
    limiter = SlidingWindowRateLimiter(3, 10.0, clock)
    results = []
    for now in (0.0, 1.0, 2.0, 3.0, 9.9, 10.0, 10.5, 11.0, 11.5, 12.0):
        clock.now = now
        results.append(outcome(limiter.check, "alice"))
    assert results == [
        "ok",  # 0
        "ok",  # 1
        "ok",  # 2
        "RATE_LIMITED",  # 3: calls at 0, 1, 2 are in (-7, 3]
        "RATE_LIMITED",  # 9.9
        "ok",  # 10: the call at 0 left the window
        "RATE_LIMITED",  # 10.5
        "ok",  # 11: the call at 1 left
        "RATE_LIMITED",  # 11.5
        "ok",  # 12: the call at 2 left
    ]


def test_refused_calls_do_not_use_up_the_window() -> None:
    clock = FakeClock()
    limiter = SlidingWindowRateLimiter(1, 10.0, clock)
    limiter.check("alice")
    for step in range(1, 10):
        clock.now = float(step)
        assert outcome(limiter.check, "alice") == "RATE_LIMITED"
    clock.now = 10.0
    assert outcome(limiter.check, "alice") == "ok"


def test_the_refusal_says_when_to_retry() -> None:
    clock = FakeClock()
    limiter = SlidingWindowRateLimiter(2, 60.0, clock)
    limiter.check("alice")
    clock.now = 20.0
    limiter.check("alice")
    clock.now = 30.5
    with pytest.raises(NexusError) as caught:
        limiter.check("alice")
    assert caught.value.code == Code.RATE_LIMITED
    assert caught.value.facts == {"limit": 2, "window_seconds": 60.0, "retry_after_seconds": 30}


def test_rate_limits_are_kept_per_subject() -> None:
    limiter = SlidingWindowRateLimiter(1, 10.0, FakeClock())
    results = [outcome(limiter.check, s) for s in ("alice", "bob", "alice", "carol", "bob")]
    assert results == ["ok", "ok", "RATE_LIMITED", "ok", "RATE_LIMITED"]


def test_a_quiet_subject_is_forgotten_after_one_window() -> None:
    clock = FakeClock()
    limiter = SlidingWindowRateLimiter(2, 10.0, clock)
    limiter.check("alice")
    limiter.check("bob")
    clock.now = 5.0
    limiter.check("bob")
    clock.now = 10.0
    assert len(limiter) == 1
    clock.now = 15.0
    assert len(limiter) == 0


def test_the_limiter_tracks_at_most_maxsize_subjects() -> None:
    limiter = SlidingWindowRateLimiter(5, 60.0, FakeClock(), maxsize=50)
    for i in range(500):
        limiter.check(f"subject-{i}")
    assert len(limiter) == 50


def test_concurrent_checks_never_exceed_the_limit() -> None:
    limiter = SlidingWindowRateLimiter(50, 60.0, FakeClock())
    barrier = threading.Barrier(10)

    def check_many(_: int) -> int:
        barrier.wait(timeout=10)
        return sum(outcome(limiter.check, "shared") == "ok" for _ in range(20))

    with ThreadPoolExecutor(max_workers=10) as pool:
        assert sum(pool.map(check_many, range(10))) == 50


@pytest.mark.parametrize(
    ("max_calls", "window"), [(0, 1.0), (1, 0.0), (1, -1.0), (1, float("nan")), (True, 1.0)]
)
def test_a_bad_rate_limit_setting_is_a_config_error(max_calls: Any, window: Any) -> None:
    with pytest.raises(ConfigError):
        SlidingWindowRateLimiter(max_calls, window, FakeClock())


# --- timeouts -----------------------------------------------------------------------------


def test_a_tool_timeout_is_its_override_or_the_default() -> None:
    timeouts = ToolTimeouts(default_seconds=20, overrides={"nexus_grep": 60.5})
    assert timeouts.timeout_for("nexus_grep") == 60.5
    assert timeouts.timeout_for("nexus_read_file") == 20.0
    assert ToolTimeouts().timeout_for("anything") == 30.0


def test_tool_timeouts_copy_their_overrides() -> None:
    overrides = {"nexus_grep": 5.0}
    timeouts = ToolTimeouts(overrides=overrides)
    overrides["nexus_grep"] = 500.0
    assert timeouts.timeout_for("nexus_grep") == 5.0


@pytest.mark.parametrize(
    ("default", "overrides"),
    [
        (0, {}),
        (-1, {}),
        (float("inf"), {}),
        (7200, {}),
        ("30", {}),
        (30, {"nexus_grep": 0}),
        (30, {"bad name!": 5}),
        (30, {"nexus_grep": True}),
    ],
)
def test_a_bad_timeout_is_a_config_error(default: Any, overrides: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ToolTimeouts(default_seconds=default, overrides=overrides)


def test_idle_expiring_map_forgets_keys_idle_for_the_ttl_and_renews_on_set() -> None:
    m: IdleExpiringMap[str, int] = IdleExpiringMap(maxsize=10, ttl=10.0)
    m.set("a", 1, now=0.0)
    m.set("b", 2, now=5.0)
    assert m.get("a", now=9.9) == 1
    m.set("a", 3, now=9.9)  # renewed: now idle from 9.9
    assert m.get("b", now=15.0) is None  # set at 5.0, expired at exactly 15.0
    assert m.get("a", now=19.8) == 3
    assert m.get("a", now=19.9) is None
    assert len(m) == 0


def test_idle_expiring_map_drops_the_least_recently_set_key_when_full() -> None:
    m: IdleExpiringMap[str, int] = IdleExpiringMap(maxsize=3, ttl=100.0)
    for i, key in enumerate("abc"):
        m.set(key, i, now=float(i))
    m.set("a", 9, now=3.0)  # a is now the most recent
    m.set("d", 4, now=4.0)  # full: b goes
    assert [m.get(k, now=5.0) for k in "abcd"] == [9, None, 2, 4]
    assert len(m) == 3
