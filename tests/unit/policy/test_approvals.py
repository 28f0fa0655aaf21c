"""Approval tokens: the verification matrix, single use, rotation, loading, and no secret leaks."""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import hmac
import json
import logging
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jwt
import pytest
from structlog.testing import capture_logs

from nexus_mcp.errors import (
    ApprovalError,
    Code,
    ConfigError,
    InvalidInputError,
    NexusError,
)
from nexus_mcp.policy.approvals import (
    APPROVAL_LEEWAY_SECONDS,
    APPROVAL_TOKEN_TYPE,
    REQUIRED_CLAIMS,
    ApprovalClaims,
    ApprovalKeys,
    ApprovalSettings,
    approval_jti_digest,
    decide_approval_mode,
    digest_approved_arguments,
    enforce_approval,
    load_approval_keys,
    load_approval_settings,
    mint_approval_token,
    verify_approval_token,
)
from nexus_mcp.stores.nonces import MemoryNonceStore

SECRET = b"CANARY-approval-secret-0123456789abcdef"
OTHER_SECRET = b"another-approval-secret-0123456789abcdef"
NOW = 1_700_000_000
TTL = 300
TOOL = "nexus_write_file"
SUBJECT = "agent-7"
APPROVER = "alice@example.com"
ARGS: dict[str, Any] = {"path": "notes/a.md", "content": "hello\n"}

KEYS = ApprovalKeys({"k1": SECRET}, "k1")
SETTINGS = ApprovalSettings(audience="nexus-mcp", issuer="nexus-mcp", ttl_seconds=TTL)


def mint(now: float = NOW, keys: ApprovalKeys = KEYS, settings: ApprovalSettings = SETTINGS) -> str:
    return mint_approval_token(
        keys,
        settings,
        approver=APPROVER,
        subject=SUBJECT,
        tool=TOOL,
        arguments=ARGS,
        host_id="host-1",
        now=now,
    )


def verify(token: str, *, now: float = NOW, **overrides: Any) -> ApprovalClaims:
    binding: dict[str, Any] = {"subject": SUBJECT, "tool": TOOL, "arguments": ARGS}
    binding.update(overrides)
    keys = binding.pop("keys", KEYS)
    settings = binding.pop("settings", SETTINGS)
    return verify_approval_token(keys, settings, token, now=now, **binding)


def valid_payload(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "ver": 1,
        "iss": "nexus-mcp",
        "aud": "nexus-mcp",
        "sub": APPROVER,
        "iat": NOW,
        "nbf": NOW,
        "exp": NOW + TTL,
        "jti": "j" * 32,
        "tool": TOOL,
        "args_sha256": digest_approved_arguments(ARGS),
        "subject": SUBJECT,
        "host_id": "host-1",
    }
    payload.update(changes)
    return payload


def forge(
    payload: dict[str, Any],
    *,
    key: bytes = SECRET,
    algorithm: str = "HS256",
    headers: dict[str, Any] | None = None,
) -> str:
    all_headers = {"kid": "k1", "typ": APPROVAL_TOKEN_TYPE}
    all_headers.update(headers or {})
    return jwt.encode(payload, key, algorithm=algorithm, headers=all_headers)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def hand_made(header: dict[str, Any], payload: dict[str, Any], signature: bytes) -> str:
    head = b64url(json.dumps(header).encode())
    body = b64url(json.dumps(payload).encode())
    return f"{head}.{body}.{b64url(signature)}"


def sign_by_hand(header: dict[str, Any]) -> str:
    unsigned = hand_made(header, valid_payload(), b"").rsplit(".", 1)[0]
    signature = hmac.new(SECRET, unsigned.encode(), hashlib.sha256).digest()
    return f"{unsigned}.{b64url(signature)}"


def reason_of(token: str, **overrides: Any) -> str:
    with pytest.raises(ApprovalError) as caught:
        verify(token, **overrides)
    assert caught.value.code == Code.APPROVAL_INVALID
    reason = caught.value.facts["reason"]
    assert isinstance(reason, str)
    return reason


# --- the valid path ---------------------------------------------------------------------


def test_a_minted_token_verifies_with_the_claims_of_the_approved_call() -> None:
    claims = verify(mint())
    expected = ApprovalClaims(
        ver=1,
        iss="nexus-mcp",
        aud="nexus-mcp",
        sub=APPROVER,
        iat=NOW,
        nbf=NOW,
        exp=NOW + TTL,
        jti=claims.jti,
        tool=TOOL,
        args_sha256=digest_approved_arguments(ARGS),
        subject=SUBJECT,
        host_id="host-1",
    )
    assert claims == expected


def test_the_token_header_names_hs256_the_kid_and_the_approval_type() -> None:
    assert jwt.get_unverified_header(mint()) == {
        "alg": "HS256",
        "kid": "k1",
        "typ": APPROVAL_TOKEN_TYPE,
    }


def test_each_token_gets_a_fresh_jti_of_at_least_128_bits() -> None:
    jtis = {verify(mint()).jti for _ in range(20)}
    assert len(jtis) == 20
    assert all(len(base64.urlsafe_b64decode(j + "==")) * 8 >= 128 for j in jtis)


def test_the_binding_ignores_idempotency_key_and_approval_token_arguments() -> None:
    token = mint()
    with_plumbing = {**ARGS, "idempotency_key": "retry-1", "approval_token": token}
    assert verify(token, arguments=with_plumbing).tool == TOOL


def test_the_audit_digest_is_the_sha256_of_the_jti() -> None:
    claims = verify(mint())
    assert approval_jti_digest(claims) == hashlib.sha256(claims.jti.encode()).hexdigest()
    assert claims.jti not in repr(claims)


# --- time ---------------------------------------------------------------------------------


@pytest.mark.parametrize("late", [0, TTL - 1, TTL + APPROVAL_LEEWAY_SECONDS - 1])
def test_a_token_is_accepted_until_exp_plus_the_leeway(late: int) -> None:
    assert verify(mint(), now=NOW + late).exp == NOW + TTL


@pytest.mark.parametrize("late", [TTL + APPROVAL_LEEWAY_SECONDS, TTL + 31, TTL + 3600])
def test_a_token_past_exp_plus_the_leeway_is_expired(late: int) -> None:
    with pytest.raises(ApprovalError) as caught:
        verify(mint(), now=NOW + late)
    assert caught.value.code == Code.APPROVAL_EXPIRED


@pytest.mark.parametrize("early", [1, APPROVAL_LEEWAY_SECONDS - 1, APPROVAL_LEEWAY_SECONDS])
def test_a_token_from_a_clock_ahead_inside_the_leeway_is_accepted(early: int) -> None:
    assert verify(mint(now=NOW + early)).tool == TOOL


@pytest.mark.parametrize("early", [APPROVAL_LEEWAY_SECONDS + 1, 120])
def test_a_token_not_yet_valid_beyond_the_leeway_is_invalid(early: int) -> None:
    assert reason_of(mint(now=NOW + early)) == "not_yet_valid"


def test_a_token_issued_in_the_future_beyond_the_leeway_is_invalid() -> None:
    token = forge(valid_payload(iat=NOW + 60))
    assert reason_of(token) == "issued_in_future"


@pytest.mark.parametrize("lifetime", [TTL + 1, 3600, 0, -5])
def test_a_token_whose_lifetime_is_not_between_zero_and_the_maximum_is_invalid(
    lifetime: int,
) -> None:
    assert reason_of(forge(valid_payload(exp=NOW + lifetime))) == "bad_lifetime"


# --- audience, issuer, keys -------------------------------------------------------------


def test_a_token_for_another_audience_is_invalid() -> None:
    other = ApprovalSettings(audience="other-server", issuer="nexus-mcp")
    assert reason_of(mint(settings=other)) == "bad_audience"


def test_a_token_from_another_issuer_is_invalid() -> None:
    other = ApprovalSettings(audience="nexus-mcp", issuer="somebody-else")
    assert reason_of(mint(settings=other)) == "bad_issuer"


def test_a_token_signed_with_another_secret_under_the_same_kid_is_invalid() -> None:
    assert reason_of(mint(keys=ApprovalKeys({"k1": OTHER_SECRET}, "k1"))) == "bad_signature"


def test_a_token_with_an_unknown_or_missing_kid_is_invalid() -> None:
    assert reason_of(mint(keys=ApprovalKeys({"zz": SECRET}, "zz"))) == "unknown_kid"
    assert reason_of(sign_by_hand({"alg": "HS256", "typ": APPROVAL_TOKEN_TYPE})) == "unknown_kid"
    header = {"alg": "HS256", "typ": APPROVAL_TOKEN_TYPE, "kid": 7}
    assert reason_of(sign_by_hand(header)) in {"unknown_kid", "malformed"}


def test_a_token_from_a_retired_kid_still_verifies_while_its_secret_is_kept() -> None:
    token = mint()
    rotated = ApprovalKeys({"k1": SECRET, "k2": OTHER_SECRET}, "k2")
    assert verify(token, keys=rotated).tool == TOOL
    assert jwt.get_unverified_header(mint(keys=rotated))["kid"] == "k2"
    assert reason_of(token, keys=ApprovalKeys({"k2": OTHER_SECRET}, "k2")) == "unknown_kid"


def test_approval_keys_copy_as_themselves_and_refuse_pickling() -> None:
    assert copy.deepcopy(KEYS) is KEYS
    assert copy.copy(KEYS) is KEYS
    with pytest.raises(TypeError):
        pickle.dumps(KEYS)


# --- algorithms -------------------------------------------------------------------------


def test_an_unsigned_alg_none_token_is_invalid() -> None:
    header = {"alg": "none", "typ": APPROVAL_TOKEN_TYPE, "kid": "k1"}
    assert reason_of(hand_made(header, valid_payload(), b"")) == "bad_algorithm"


def test_an_hs512_token_signed_with_the_same_secret_is_invalid() -> None:
    long_secret = SECRET * 2  # HS512 wants 64 bytes; keeps PyJWT from warning
    keys = ApprovalKeys({"k1": long_secret}, "k1")
    token = forge(valid_payload(), key=long_secret, algorithm="HS512")
    assert reason_of(token, keys=keys) == "bad_algorithm"


def test_an_rs256_header_is_invalid() -> None:
    header = {"alg": "RS256", "typ": APPROVAL_TOKEN_TYPE, "kid": "k1"}
    assert reason_of(hand_made(header, valid_payload(), b"\x01" * 256)) == "bad_algorithm"


def test_a_token_whose_header_says_hs256_but_is_signed_with_hs512_is_invalid() -> None:
    header = {"alg": "HS256", "typ": APPROVAL_TOKEN_TYPE, "kid": "k1"}
    unsigned = hand_made(header, valid_payload(), b"").rsplit(".", 1)[0]
    signature = hmac.new(SECRET, unsigned.encode(), hashlib.sha512).digest()
    assert reason_of(f"{unsigned}.{b64url(signature)}") == "bad_signature"


def test_a_token_without_the_approval_type_is_invalid() -> None:
    assert reason_of(forge(valid_payload(), headers={"typ": "JWT"})) == "bad_type"


# --- binding ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"subject": "agent-8"}, "subject_mismatch"),
        ({"tool": "nexus_delete_file"}, "tool_mismatch"),
        ({"arguments": {**ARGS, "content": "other\n"}}, "arguments_mismatch"),
        ({"arguments": {"path": "notes/a.md"}}, "arguments_mismatch"),
        ({"arguments": {**ARGS, "overwrite": True}}, "arguments_mismatch"),
        ({"arguments": {**ARGS, "x": float("nan")}}, "arguments_unhashable"),
    ],
)
def test_a_token_used_for_another_call_is_invalid(overrides: dict[str, Any], reason: str) -> None:
    assert reason_of(mint(), **overrides) == reason


# --- claims and shape -------------------------------------------------------------------


@pytest.mark.parametrize("claim", REQUIRED_CLAIMS)
def test_a_token_missing_any_claim_is_invalid(claim: str) -> None:
    payload = valid_payload()
    del payload[claim]
    assert reason_of(forge(payload)) == "missing_claim"


def test_a_tampered_payload_with_the_original_signature_is_invalid() -> None:
    head, body, signature = mint().split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["tool"] = "nexus_delete_file"
    tampered = f"{head}.{b64url(json.dumps(claims).encode())}.{signature}"
    assert reason_of(tampered, tool="nexus_delete_file") == "bad_signature"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"ver": 2}, "bad_version"),
        ({"ver": True}, "bad_version"),
        ({"ver": "1"}, "bad_version"),
        ({"exp": str(NOW + TTL)}, "bad_claim_type"),
        ({"iat": float(NOW)}, "bad_claim_type"),
        ({"aud": ["nexus-mcp"]}, "bad_claim_type"),
        ({"subject": ""}, "bad_claim_type"),
        ({"jti": "short"}, "bad_jti"),
    ],
)
def test_a_token_with_a_malformed_claim_is_invalid(changes: dict[str, Any], reason: str) -> None:
    assert reason_of(forge(valid_payload(**changes))) == reason


@pytest.mark.parametrize("token", ["", "abc", "a.b.c", "x" * 5000, "..", "e30.e30.e30"])
def test_a_malformed_token_is_invalid(token: str) -> None:
    assert reason_of(token) in {"malformed", "bad_algorithm"}


def test_a_token_that_is_not_a_string_is_invalid() -> None:
    assert reason_of(b"abc") == "malformed"  # type: ignore[arg-type]


# --- single use -------------------------------------------------------------------------


async def enforce(token: str | None, store: MemoryNonceStore, **overrides: Any) -> ApprovalClaims:
    binding: dict[str, Any] = {"subject": SUBJECT, "tool": TOOL, "arguments": ARGS}
    binding.update(overrides)
    return await enforce_approval(KEYS, SETTINGS, token, nonce_store=store, now=NOW, **binding)


def make_store() -> MemoryNonceStore:
    return MemoryNonceStore(maxsize=1000, clock=lambda: float(NOW))


async def test_a_token_is_accepted_once_and_replayed_after() -> None:
    store = make_store()
    token = mint()
    assert (await enforce(token, store)).tool == TOOL
    with pytest.raises(ApprovalError) as caught:
        await enforce(token, store)
    assert caught.value.code == Code.APPROVAL_REPLAYED


@pytest.mark.parametrize("token", [None, ""])
async def test_a_write_without_a_token_requires_approval(token: str | None) -> None:
    with pytest.raises(ApprovalError) as caught:
        await enforce(token, make_store())
    assert caught.value.code == Code.APPROVAL_REQUIRED


async def test_a_rejected_use_does_not_spend_the_nonce() -> None:
    store = make_store()
    token = mint()
    with pytest.raises(ApprovalError) as caught:
        await enforce(token, store, arguments={**ARGS, "content": "other"})
    assert caught.value.code == Code.APPROVAL_INVALID
    assert len(store) == 0
    assert (await enforce(token, store)).tool == TOOL


async def test_fifty_concurrent_tasks_using_one_token_succeed_exactly_once() -> None:
    store = make_store()
    token = mint()
    results = await asyncio.gather(
        *(enforce(token, store) for _ in range(50)), return_exceptions=True
    )
    successes = [r for r in results if isinstance(r, ApprovalClaims)]
    replays = [r for r in results if isinstance(r, NexusError)]
    assert len(successes) == 1
    assert len(replays) == 49
    assert {r.code for r in replays} == {Code.APPROVAL_REPLAYED}


def test_fifty_concurrent_threads_using_one_token_succeed_exactly_once() -> None:
    store = make_store()
    token = mint()
    barrier = threading.Barrier(50)

    def use_once() -> str:
        barrier.wait(timeout=10)
        try:
            asyncio.run(enforce(token, store))
        except NexusError as exc:
            return str(exc.code)
        return "ok"

    with ThreadPoolExecutor(max_workers=50) as pool:
        outcomes = list(pool.map(lambda _: use_once(), range(50)))
    assert outcomes.count("ok") == 1
    assert outcomes.count(str(Code.APPROVAL_REPLAYED)) == 49


# --- approval mode ------------------------------------------------------------------------


class _Policy:
    def __init__(self, mode: str) -> None:
        self.approval_mode = mode


@pytest.mark.parametrize(
    ("policy", "can_elicit", "expected"),
    [
        (None, False, "token"),
        ("token", False, "token"),
        ("token", True, "token"),
        ("elicit", True, "elicit"),
        ("elicit", False, "deny"),
        ("sometimes", True, "deny"),
        (_Policy("elicit"), False, "deny"),
        (_Policy("elicit"), True, "elicit"),
        (_Policy("token"), True, "token"),
    ],
)
def test_the_approval_mode_fails_closed_when_elicitation_is_impossible(
    policy: Any, can_elicit: bool, expected: str
) -> None:
    assert decide_approval_mode(policy, can_elicit=can_elicit) == expected


# --- keys and settings ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("secrets_by_kid", "active"),
    [
        ({"k1": b"x" * 31}, "k1"),
        ({}, "k1"),
        ({"k1": SECRET}, "k2"),
        ({"bad kid!": SECRET}, "bad kid!"),
        ({"k1": "a-string-secret-that-is-long-enough-0123"}, "k1"),
    ],
)
def test_approval_keys_refuse_short_secrets_and_bad_kids(
    secrets_by_kid: dict[str, Any], active: str
) -> None:
    with pytest.raises(ConfigError):
        ApprovalKeys(secrets_by_kid, active)


@pytest.mark.parametrize("ttl", [119, 301, 0, True, 150.5])
def test_approval_ttl_outside_two_to_five_minutes_is_a_config_error(ttl: Any) -> None:
    with pytest.raises(ConfigError):
        ApprovalSettings(ttl_seconds=ttl)


@pytest.mark.parametrize("ttl", [120, 300])
def test_approval_ttl_at_either_bound_is_accepted(ttl: int) -> None:
    assert ApprovalSettings(ttl_seconds=ttl).ttl_seconds == ttl


@pytest.mark.parametrize("seconds", [-1, 3601, True, 1.5, "30"])
def test_a_wait_outside_zero_to_an_hour_is_a_config_error(seconds: Any) -> None:
    with pytest.raises(ConfigError, match=r"approvals\.wait_seconds"):
        ApprovalSettings(wait_seconds=seconds)


@pytest.mark.parametrize("seconds", [0, 3600])
def test_a_wait_at_either_bound_is_accepted(seconds: int) -> None:
    assert ApprovalSettings(wait_seconds=seconds).wait_seconds == seconds


def test_the_wait_is_read_from_the_approvals_section_and_is_off_by_default() -> None:
    assert load_approval_settings({}, None).wait_seconds == 0
    loaded = load_approval_settings({}, {"approvals": {"wait_seconds": 120}})
    assert loaded.wait_seconds == 120


@pytest.mark.parametrize(
    ("field", "value"),
    [("approver", ""), ("subject", ""), ("tool", ""), ("host_id", "")],
)
def test_minting_refuses_an_empty_binding_field(field: str, value: str) -> None:
    binding: dict[str, Any] = {
        "approver": APPROVER,
        "subject": SUBJECT,
        "tool": TOOL,
        "host_id": "h",
    }
    binding[field] = value
    with pytest.raises(InvalidInputError) as caught:
        mint_approval_token(KEYS, SETTINGS, arguments=ARGS, **binding)
    assert caught.value.facts == {"field": field}


def test_minting_refuses_arguments_that_are_not_json() -> None:
    with pytest.raises(InvalidInputError) as caught:
        mint_approval_token(
            KEYS,
            SETTINGS,
            approver=APPROVER,
            subject=SUBJECT,
            tool=TOOL,
            arguments={"x": object()},
            host_id="h",
        )
    assert caught.value.code == Code.INVALID_INPUT


LONG_A = "a" * 40
LONG_B = "b" * 40


@pytest.mark.parametrize(
    ("env", "config", "kids", "active"),
    [
        ({"NEXUS_MCP_APPROVAL_SECRET": LONG_A}, None, {"k1"}, "k1"),
        (
            {"NEXUS_MCP_APPROVAL_SECRET": LONG_A, "NEXUS_MCP_APPROVAL_ACTIVE_KID": "main"},
            None,
            {"main"},
            "main",
        ),
        (
            {
                "NEXUS_MCP_APPROVAL_KEYS": f"old:{LONG_A}, new:{LONG_B}",
                "NEXUS_MCP_APPROVAL_ACTIVE_KID": "new",
            },
            None,
            {"old", "new"},
            "new",
        ),
        ({"NEXUS_MCP_APPROVAL_KEYS": f"only:{LONG_A}"}, None, {"only"}, "only"),
        ({}, {"approvals": {"secret": LONG_A}}, {"k1"}, "k1"),
        (
            {},
            {"approvals": {"keys": {"a": LONG_A, "b": LONG_B}, "active_kid": "b"}},
            {"a", "b"},
            "b",
        ),
        (
            {"NEXUS_MCP_APPROVAL_SECRET": LONG_B},
            {"approvals": {"keys": {"a": LONG_A}, "active_kid": "a"}},
            {"k1"},
            "k1",
        ),
    ],
)
def test_approval_keys_load_from_env_first_then_config(
    env: dict[str, str], config: dict[str, Any] | None, kids: set[str], active: str
) -> None:
    keys = load_approval_keys(env, config)
    assert keys.kids == frozenset(kids)
    assert keys.active_kid == active


def test_a_secret_with_a_colon_is_kept_whole_in_the_key_list() -> None:
    keys = load_approval_keys({"NEXUS_MCP_APPROVAL_KEYS": f"k9:{LONG_A}:tail"}, None)
    assert keys.secret_for("k9") == f"{LONG_A}:tail".encode()


@pytest.mark.parametrize(
    ("env", "config"),
    [
        ({}, None),
        ({}, {"approvals": {}}),
        ({"NEXUS_MCP_APPROVAL_SECRET": "short"}, None),
        ({"NEXUS_MCP_APPROVAL_SECRET": LONG_A, "NEXUS_MCP_APPROVAL_KEYS": f"a:{LONG_B}"}, None),
        ({"NEXUS_MCP_APPROVAL_KEYS": f"a:{LONG_A},b:{LONG_B}"}, None),
        ({"NEXUS_MCP_APPROVAL_KEYS": f"a:{LONG_A},a:{LONG_B}"}, None),
        ({"NEXUS_MCP_APPROVAL_KEYS": "no-separator"}, None),
        (
            {"NEXUS_MCP_APPROVAL_KEYS": f"a:{LONG_A}", "NEXUS_MCP_APPROVAL_ACTIVE_KID": "b"},
            None,
        ),
        ({}, {"approvals": {"secret": LONG_A, "keys": {"a": LONG_B}}}),
        ({}, {"approvals": {"secret": 12}}),
        ({}, {"approvals": {"keys": []}}),
        ({}, {"approvals": {"keys": {"a": 5}}}),
        ({}, {"approvals": {"active_kid": 5, "secret": LONG_A}}),
        ({}, {"approvals": {"secrett": LONG_A}}),
        ({}, {"approvals": "not a mapping"}),
    ],
)
def test_missing_or_ambiguous_approval_keys_are_a_config_error(
    env: dict[str, str], config: dict[str, Any] | None
) -> None:
    with pytest.raises(ConfigError):
        load_approval_keys(env, config)


def test_approval_settings_load_env_over_config_over_defaults() -> None:
    assert load_approval_settings({}, None) == ApprovalSettings()
    config = {"approvals": {"audience": "cfg-aud", "issuer": "cfg-iss", "ttl_seconds": 200}}
    assert load_approval_settings({}, config) == ApprovalSettings("cfg-aud", "cfg-iss", 200)
    env = {
        "NEXUS_MCP_APPROVAL_AUDIENCE": "env-aud",
        "NEXUS_MCP_APPROVAL_ISSUER": "env-iss",
        "NEXUS_MCP_APPROVAL_TTL_SECONDS": "150",
    }
    assert load_approval_settings(env, config) == ApprovalSettings("env-aud", "env-iss", 150)


@pytest.mark.parametrize(
    ("env", "config"),
    [
        ({"NEXUS_MCP_APPROVAL_TTL_SECONDS": "soon"}, None),
        ({"NEXUS_MCP_APPROVAL_TTL_SECONDS": "600"}, None),
        ({}, {"approvals": {"ttl_seconds": "200"}}),
        ({}, {"approvals": {"audience": ""}}),
    ],
)
def test_bad_approval_settings_are_a_config_error(
    env: dict[str, str], config: dict[str, Any] | None
) -> None:
    with pytest.raises(ConfigError):
        load_approval_settings(env, config)


# --- the secret never leaks -------------------------------------------------------------


def _texts_of(exc: BaseException) -> list[str]:
    texts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts += [str(current), repr(current), repr(current.args)]
        if isinstance(current, NexusError):
            texts += [current.message, repr(current.facts), json.dumps(current.to_payload())]
        current = current.__cause__ or current.__context__
    return texts


def test_the_secret_never_appears_in_errors_reprs_or_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    canary = SECRET.decode()
    caplog.set_level(logging.DEBUG)
    failures: list[BaseException] = []
    with capture_logs() as structured:
        attempts: list[tuple[str, dict[str, Any]]] = [
            (mint(), {"subject": "someone-else"}),
            (mint(), {"arguments": {}}),
            (mint(now=NOW - 3600), {}),
            (mint(keys=ApprovalKeys({"k1": OTHER_SECRET}, "k1")), {}),
            (forge(valid_payload(), algorithm="HS384", key=SECRET + SECRET), {}),
            ("not-a-token", {}),
        ]
        for token, overrides in attempts:
            try:
                verify(token, **overrides)
            except NexusError as exc:
                failures.append(exc)
        for bad_secret in (SECRET[:31], canary.encode()[:20]):
            try:
                ApprovalKeys({"k1": bad_secret}, "k1")
            except ConfigError as exc:
                failures.append(exc)
        try:
            load_approval_keys({"NEXUS_MCP_APPROVAL_KEYS": f"k1:{canary},k2:{canary}x"}, None)
        except ConfigError as exc:
            failures.append(exc)
    assert len(failures) == 9
    texts = [text for failure in failures for text in _texts_of(failure)]
    texts += [repr(KEYS), str(KEYS), caplog.text, repr(structured)]
    assert all(canary[:20] not in text for text in texts)
