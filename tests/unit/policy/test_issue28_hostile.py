"""Issue 28, hostile: output scanning text crafted to hold the event loop, and secrets
that must still be found next to it; a flow label that silently labels nothing.

Every scan runs on the server's event loop: a text that makes one detector quadratic
stops every caller of the server, not just the one whose result it is. detect-secrets'
NPM (``//.+/:_authToken``), JWT (``eyJ[...]+\\.``) and OpenAI (``sk-[...]*...``)
expressions rescanned a whole run from every start inside it, and each found value was
searched for again over the whole text (thousands of tokens: thousands of full scans).
"""

from __future__ import annotations

import random
import string
import time

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.flow import labels_for, load_flow_config
from nexus_mcp.policy.secret_scan import SecretScanner, cut

scanner = SecretScanner()

JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
    "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
NPM_TOKEN = "npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
OPENAI_KEY = "sk-" + "A1b2C3d4E5f6G7h8I9j0" + "T3BlbkFJ" + "K1l2M3n4O5p6Q7r8S9t0"
# A scan of a few hundred kilobytes takes well under a second on a busy machine; the
# quadratic expressions took tens of seconds to hours on these texts.
BUDGET_SECONDS = 3.0


def timed(text: str) -> tuple[float, str]:
    began = time.perf_counter()
    spans = scanner.spans(text)
    return time.perf_counter() - began, cut(text, spans)


@pytest.mark.parametrize(
    ("name", "text", "secret"),
    [
        # A 64 kB line of "//" that never reaches ``/:_authToken=`` (was ~35 s), then
        # a real registry line.
        (
            "npm",
            "//" * 32_000 + " _authToken\n" + f"//registry/:_authToken={NPM_TOKEN}",
            NPM_TOKEN,
        ),
        # 300 kB of "eyJ" with no dot (was minutes), then a real token.
        ("jwt", "eyJ" * 100_000 + f" Bearer {JWT}", JWT),
        # A 300 kB run of "sk-" and over 256 gate words (the whole text is scanned), then
        # a key (was hours).
        ("openai", "sk-" * 100_000 + (" T3BlbkFJ" + "." * 1200) * 300 + OPENAI_KEY, OPENAI_KEY),
    ],
)
def test_a_run_crafted_for_a_backtracking_detector_is_scanned_in_linear_time(
    name: str, text: str, secret: str
) -> None:
    seconds, redacted = timed(text)
    assert seconds < BUDGET_SECONDS, name
    assert secret not in redacted


def test_many_windows_of_a_long_text_still_scan_in_linear_time() -> None:
    # Over 256 gate words hands the detector the whole text: still linear.
    text = ("eyJ" * 2_000 + "\n") * 150 + JWT
    seconds, redacted = timed(text)
    assert seconds < BUDGET_SECONDS
    assert JWT not in redacted


def test_thousands_of_distinct_tokens_are_each_cut_without_a_search_per_token() -> None:
    rng = random.Random(28)
    alphabet = string.ascii_letters + string.digits
    tokens = ["ghp_" + "".join(rng.choices(alphabet, k=36)) for _ in range(20_000)]
    text = " ".join(tokens)  # ~800 kB: a full search per token was ~20,000 x 800 kB
    seconds, redacted = timed(text)
    assert seconds < BUDGET_SECONDS
    assert not any(token in redacted for token in tokens)


def test_thousands_of_quoted_candidates_on_one_line_scan_in_linear_time() -> None:
    rng = random.Random(28)
    alphabet = string.ascii_letters + string.digits
    values = ['"' + "".join(rng.choices(alphabet, k=30)) + '"' for _ in range(8_000)]
    planted = "c2VjcmV0IGtleSB3aXRoIGVudHJvcHkgWjl4UTd2TjJwTDhr"
    # One 260 kB line: each candidate's "line" was everything before it (quadratic).
    text = " ".join(values) + f' secret = "{planted}"'
    seconds, redacted = timed(text)
    assert seconds < BUDGET_SECONDS * 2
    assert planted not in redacted


def test_a_value_found_once_is_cut_wherever_else_it_stands() -> None:
    text = f'token = "{JWT}"\nlater, unquoted: {JWT} and again {JWT}'
    assert JWT not in cut(text, scanner.spans(text))


def test_the_npm_token_is_still_found_after_failing_starts_on_its_line() -> None:
    text = "see //a //b //c then //registry.npmjs.org/:_authToken=" + NPM_TOKEN
    assert NPM_TOKEN not in cut(text, scanner.spans(text))


def test_a_jwt_after_a_run_that_fails_is_still_found() -> None:
    text = "eyJeyJeyJnope eyJ-only-no-dot " + JWT
    assert JWT not in cut(text, scanner.spans(text))


# -- flow labels -----------------------------------------------------------------------


def test_a_label_key_with_the_prefixed_name_stops_start_up_instead_of_labelling_nothing() -> None:
    # The operator wrote the name callers see (up_add), not the upstream's own (add): the
    # key labelled nothing, so "up/*: []" gave the egress tool no label and no check.
    section = {"labels": {"up/*": [], "up/up_add": ["egress"]}}
    with pytest.raises(ConfigError) as caught:
        load_flow_config(
            section, mode="prod", upstream_ids=["up"], upstream_tools={"up": {"add", "echo"}}
        )
    message = str(caught.value)
    assert "flow.labels.up/up_add" in message
    assert "own name" in message


def test_a_label_key_naming_a_registered_upstream_tool_still_loads() -> None:
    loaded = load_flow_config(
        {"labels": {"up/*": [], "up/add": ["egress"]}},
        mode="prod",
        upstream_ids=["up"],
        upstream_tools={"up": {"add"}},
    )
    assert labels_for(loaded, server_id="up", tool="add") == frozenset({"egress"})
