"""Hostile review of issue 15 end to end: real ``nexus-mcp serve`` processes on the shared
backend (real PostgreSQL and Redis). The budget tests failed before session keys carried
the principal and stateless HTTP keyed budgets on the principal; they guard that now."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.shared_state import delete_prefix

from .access_helpers import token
from .test_replicas import (
    APPROVED_WRITES,
    HELLO,
    READ,
    Stores,
    call_tool,
    code,
    make_replicas,
    migrated_stores,
    running,
)

pytestmark = pytest.mark.slow

BUDGET = 3
CALLS = 8


@pytest.fixture(scope="module")
def stores(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stores]:
    with migrated_stores(request, tmp_path_factory.mktemp("hostile")) as migrated:
        yield migrated


@pytest.fixture(scope="module")
def stateless(stores: Stores, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One replica as docs/replicas.md's "Several workers on one host" runs it: --stateless-http,
    a per-session call budget of BUDGET, no rate limit to speak of."""
    root = tmp_path_factory.mktemp("stateless")
    [replica] = make_replicas(
        root,
        ("s1",),
        workspace=stores.workspace,
        prefix=stores.prefix,
        budgets={"max_calls_per_session": BUDGET, "rate_limit_calls": 1_000_000},
        policy=APPROVED_WRITES,
        instance_ids=False,
    )
    with running([replica], stores.env, "--stateless-http"):
        yield f"{replica.url}/mcp"


async def test_stateless_legacy_calls_get_a_fresh_budget_each(stateless: str) -> None:
    """DEFECT. With --stateless-http (required by --workers) a 2025-11-25 client has no
    server-issued session, yet ``identity.session_key`` keys the budget on
    ``ctx.session_id``, which FastMCP then makes up per request (a fresh uuid, or the
    client's own ``Mcp-Session-Id`` header). Every call is a new "session": the budget of
    BUDGET calls never binds, on one replica or many."""
    bearer = token("budgetbob", role="viewer")
    calls = [
        await call_tool(stateless, bearer, READ, {"path": "hello.txt"}, mode="legacy")
        for _ in range(CALLS)
    ]
    codes = Counter(code(result) for result in calls)
    assert codes == {"OK": BUDGET, "BUDGET_EXCEEDED": CALLS - BUDGET}, codes


def raw_call(url: str, bearer: str, session: str | None, ident: int) -> str:
    headers = {
        "Authorization": f"Bearer {bearer}",
        "MCP-Protocol-Version": "2025-11-25",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    if session is not None:
        headers["Mcp-Session-Id"] = session
    body = {
        "jsonrpc": "2.0",
        "id": ident,
        "method": "tools/call",
        "params": {"name": READ, "arguments": {"path": "hello.txt"}},
    }
    response = httpx.post(url, json=body, headers=headers, timeout=10)
    text = response.text
    if "BUDGET_EXCEEDED" in text:
        return "BUDGET_EXCEEDED"
    if response.status_code == 200 and HELLO.strip() in text:
        return "OK"
    return f"{response.status_code}:{text[:120]}"


async def test_stateless_budget_key_is_chosen_by_the_client_and_shared_across_subjects(
    stateless: str,
) -> None:
    """DEFECT. The budget key ``session:<Mcp-Session-Id>`` is taken from the request header
    in stateless mode and does not include the subject: (1) a caller rotating the header
    gets unlimited calls; (2) a caller who sends another subject's session id spends that
    subject's budget (here eve exhausts "victim-session", then alice is refused)."""
    eve = token("eve-budget", role="viewer")
    rotated = Counter(raw_call(stateless, eve, f"rot-{n}", n) for n in range(CALLS))
    alice = token("alice-budget", role="viewer")
    for n in range(BUDGET):
        raw_call(stateless, eve, "victim-session", 100 + n)
    victim = raw_call(stateless, alice, "victim-session", 200)
    expected = {"OK": BUDGET, "BUDGET_EXCEEDED": CALLS - BUDGET}
    assert (dict(rotated), victim) == (expected, "OK"), (rotated, victim)


async def test_modern_stateless_calls_share_one_principal_budget(
    stores: Stores, tmp_path: Path
) -> None:
    """GUARD: the 2026-07-28 era keys the budget on the principal, so it binds across
    separate connections (what test_replicas checks through nginx, here in one line)."""
    prefix = "nexus-t-" + secrets.token_hex(5)
    [replica] = make_replicas(
        tmp_path,
        ("m1",),
        workspace=stores.workspace,
        prefix=prefix,
        budgets={"max_calls_per_session": BUDGET, "rate_limit_calls": 1_000_000},
        policy=APPROVED_WRITES,
        instance_ids=False,
    )
    try:
        with running([replica], stores.env, "--stateless-http"):
            bearer = token("modern-mo", role="viewer")
            codes = Counter(
                [
                    code(await call_tool(f"{replica.url}/mcp", bearer, READ, {"path": "hello.txt"}))
                    for _ in range(CALLS)
                ]
            )
        assert codes == {"OK": BUDGET, "BUDGET_EXCEEDED": CALLS - BUDGET}, codes
    finally:
        delete_prefix(stores.redis_url, prefix)
