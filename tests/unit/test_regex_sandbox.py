"""A caller's regex in a child process: the same answers as in process, killed at a deadline."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mcp.workspace.regex_child import matching_lines
from nexus_mcp.workspace.regex_sandbox import RegexSandbox, SandboxStopped

MAX_MATCHES = 3
MAX_LINE_CHARS = 40
# Generous: the child must start on a loaded CI machine; this is a bound, not a claim.
ROOMY_SECONDS = 60.0
SHORT_SECONDS = 0.5
BAIT = "a" * 32 + "!"  # exponential for every pattern below; under MAX_LINE_CHARS


def sandbox(pattern: str, flags: int = 0, *, seconds: float = ROOMY_SECONDS) -> RegexSandbox:
    return RegexSandbox(
        pattern,
        flags,
        max_matches=MAX_MATCHES,
        max_line_chars=MAX_LINE_CHARS,
        deadline=time.monotonic() + seconds,
    )


TEXTS = st.lists(st.text(alphabet="ab\u00e9\U0001f600 \t\r\n", max_size=50), min_size=1, max_size=4)


@settings(max_examples=10, deadline=None)
@given(TEXTS)
def test_the_child_finds_the_lines_the_in_process_search_finds(texts: list[str]) -> None:
    pattern, flags = "a+b|\u00e9$", re.IGNORECASE
    matcher = re.compile(pattern, flags)
    with sandbox(pattern, flags) as child:
        for text in texts:
            expected = matching_lines(
                matcher, text, max_matches=MAX_MATCHES, max_line_chars=MAX_LINE_CHARS
            )
            assert child.search(text) == expected


def test_a_pattern_and_text_with_lone_surrogates_and_newlines_cross_intact() -> None:
    pattern = "x\ud800|line\\s2\n?"
    text = "x\ud800\nline 2\r\nline\t2\u2028tail"
    matcher = re.compile(pattern)
    with sandbox(pattern) as child:
        assert child.search(text) == matching_lines(
            matcher, text, max_matches=MAX_MATCHES, max_line_chars=MAX_LINE_CHARS
        )


def assert_reaped(pid: int) -> None:
    with pytest.raises(ProcessLookupError):  # a zombie would still answer signal 0
        os.kill(pid, 0)


@pytest.mark.parametrize("pattern", ["(a+)+$", "(a|a)*$", "(a*)*b", "(?:a+a+)+$"])
def test_a_catastrophic_pattern_is_killed_at_the_deadline_and_reaped(pattern: str) -> None:
    pids: list[int] = []
    with pytest.raises(SandboxStopped), sandbox(pattern, seconds=SHORT_SECONDS) as child:
        assert child.pid is not None
        pids.append(child.pid)
        child.search(BAIT)
    # (On a slow machine the deadline may pass while the child starts: stopped all the same.)
    for pid in pids:
        assert_reaped(pid)


def test_a_child_that_dies_is_an_error_and_is_reaped() -> None:
    with pytest.raises((RuntimeError, OSError)), sandbox("a") as child:
        pid = child.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        child.search("a")
    assert_reaped(pid)


def test_lines_past_the_limit_are_not_searched_and_matches_are_capped() -> None:
    text = "\n".join(["ab"] * 5 + ["x" * MAX_LINE_CHARS + "ab"])
    with sandbox("ab") as child:
        assert child.search(text) == ([1, 2, 3], True)
        assert child.search("no\nmatch") == ([], False)
