"""Approval tokens: mint, verify and consume the single-use HS256 JWTs that approve a write.

A token approves one exact action: one tool, one set of arguments (bound by their
canonical sha256), for one caller (``subject``), for two to five minutes. It is signed
server-side with an HMAC secret the client never sees (seed 003) and carries a ``kid``
header so secrets can rotate: verification picks the secret by ``kid``; minting uses
the active one.

Argument binding leaves out ``approval_token`` (a token cannot sign itself) and
``idempotency_key``: the key is retry plumbing chosen by the client, often after the
approver looked at the action, not part of what was approved. Replay is prevented by
the single-use ``jti`` instead, so leaving the key out loses nothing.

Verification fails closed and maps every failure to a code: ``APPROVAL_EXPIRED`` for a
token past ``exp`` plus the leeway, ``APPROVAL_INVALID`` (with an internal ``reason``
fact for the audit log) for everything else, ``APPROVAL_REPLAYED`` for a second use.
Nothing here ever puts a secret, a token or an argument value into an exception, a
repr or a log line; the PyJWT exception is dropped rather than chained.
"""

from __future__ import annotations

import hmac
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from nexus_mcp.errors import (
    ApprovalExpiredError,
    ApprovalInvalidError,
    ApprovalReplayedError,
    ApprovalRequiredError,
    ConfigError,
    InvalidInputError,
)
from nexus_mcp.policy.config_errors import (
    ENV_REFERENCE_HINT,
    env_reference,
    format_problems,
    problem_line,
    safe_text,
    unknown_key_words,
)
from nexus_mcp.policy.hashing import digest_arguments, sha256_hex

APPROVAL_TOKEN_VERSION = 1
APPROVAL_ALGORITHM = "HS256"
# Explicit typing (RFC 8725 section 3.11): an approval token is never accepted as a
# bearer token or the other way round, even if an operator reuses a secret.
APPROVAL_TOKEN_TYPE = "nexus-approval+jwt"  # noqa: S105 - a JWT "typ" value, not a secret
APPROVAL_LEEWAY_SECONDS = 30
MIN_APPROVAL_TTL_SECONDS = 120
MAX_APPROVAL_TTL_SECONDS = 300
DEFAULT_APPROVAL_TTL_SECONDS = 300
# How long an approval request waits in the inbox for a person (and, approved, for the
# caller's retry).
DEFAULT_REQUEST_TTL_SECONDS = 3600
MIN_REQUEST_TTL_SECONDS = 60
MAX_REQUEST_TTL_SECONDS = 7 * 24 * 3600
# How long a call whose client can answer elicitation may wait for an approver's decision
# (0: it is refused at once, and the agent retries once the request is approved).
DEFAULT_WAIT_SECONDS = 0
MAX_WAIT_SECONDS = 3600
MIN_SECRET_BYTES = 32
MAX_TOKEN_CHARS = 4096
MIN_JTI_CHARS = 22  # 128 bits in base64url
JTI_BYTES = 24  # 192 bits of randomness
DEFAULT_AUDIENCE = "nexus-mcp"
DEFAULT_ISSUER = "nexus-mcp"
DEFAULT_KID = "k1"
EXCLUDED_ARGUMENTS = frozenset({"approval_token", "idempotency_key"})
REQUIRED_CLAIMS = (
    "ver",
    "iss",
    "aud",
    "sub",
    "iat",
    "nbf",
    "exp",
    "jti",
    "tool",
    "args_sha256",
    "subject",
    "host_id",
)
_STRING_CLAIMS = ("iss", "aud", "sub", "jti", "tool", "args_sha256", "subject", "host_id")
_TIME_CLAIMS = ("iat", "nbf", "exp")
_KID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

ENV_SECRET = "NEXUS_MCP_APPROVAL_SECRET"  # noqa: S105 - the variable name, not its value
ENV_KEYS = "NEXUS_MCP_APPROVAL_KEYS"
ENV_ACTIVE_KID = "NEXUS_MCP_APPROVAL_ACTIVE_KID"
ENV_AUDIENCE = "NEXUS_MCP_APPROVAL_AUDIENCE"
ENV_ISSUER = "NEXUS_MCP_APPROVAL_ISSUER"
ENV_TTL = "NEXUS_MCP_APPROVAL_TTL_SECONDS"
CONFIG_SECTION = "approvals"
SECTION_KEYS = (
    "secret",
    "keys",
    "active_kid",
    "audience",
    "issuer",
    "ttl_seconds",
    "request_ttl_seconds",
    "wait_seconds",
    "allow_self_approval",
)
# Said by every minting path (POST /approvals/mint, ``nexus-mcp approvals mint``) alike.
NOT_A_WRITE_TOOL_MESSAGE = "tool is not a write tool of this server"

ApprovalDecision = Literal["token", "elicit", "deny"]


class ApprovalKeys:
    """The HMAC secrets by ``kid`` and the kid used for minting. Its repr never shows a secret."""

    __slots__ = ("_active_kid", "_secrets")

    def __init__(self, secrets_by_kid: Mapping[str, bytes], active_kid: str) -> None:
        if not secrets_by_kid:
            raise ConfigError("approval keys: at least one secret is required")
        for kid, secret in secrets_by_kid.items():
            if not isinstance(kid, str) or not _KID_RE.fullmatch(kid):
                raise ConfigError("approval keys: a kid must match [A-Za-z0-9._-]{1,64}")
            if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
                raise ConfigError(
                    f"approval keys: the secret for kid '{kid}' must be at least "
                    f"{MIN_SECRET_BYTES} bytes"
                )
        if active_kid not in secrets_by_kid:
            raise ConfigError("approval keys: the active kid has no secret")
        self._secrets = dict(secrets_by_kid)
        self._active_kid = active_kid

    @property
    def active_kid(self) -> str:
        return self._active_kid

    @property
    def kids(self) -> frozenset[str]:
        return frozenset(self._secrets)

    def secret_for(self, kid: str) -> bytes | None:
        return self._secrets.get(kid)

    def __repr__(self) -> str:
        return f"ApprovalKeys(kids={sorted(self._secrets)!r}, active_kid={self._active_kid!r})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        # Pickling would copy secrets into whatever stores the pickle; refuse it.
        raise TypeError("ApprovalKeys cannot be pickled")

    def __copy__(self) -> ApprovalKeys:
        return self  # immutable: sharing is copying

    def __deepcopy__(self, memo: dict[int, Any]) -> ApprovalKeys:
        return self


@dataclass(frozen=True)
class ApprovalSettings:
    """Who tokens are for and how long they live."""

    audience: str = DEFAULT_AUDIENCE
    issuer: str = DEFAULT_ISSUER
    ttl_seconds: int = DEFAULT_APPROVAL_TTL_SECONDS
    request_ttl_seconds: int = DEFAULT_REQUEST_TTL_SECONDS
    # A write refused for a pending request may wait this long for its decision, when the
    # client can answer elicitation and says it waits (``middleware/waiting.py``).
    wait_seconds: int = DEFAULT_WAIT_SECONDS
    # An approver may approve a request of their own subject only when this is on.
    allow_self_approval: bool = False

    def __post_init__(self) -> None:
        for name in ("audience", "issuer"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or len(value) > 256:
                raise ConfigError(f"`approvals.{name}` should be text (1 to 256 characters)")
        ttl = self.ttl_seconds
        if isinstance(ttl, bool) or not isinstance(ttl, int):
            raise ConfigError("`approvals.ttl_seconds` should be a whole number")
        if not MIN_APPROVAL_TTL_SECONDS <= ttl <= MAX_APPROVAL_TTL_SECONDS:
            raise ConfigError(
                f"`approvals.ttl_seconds` should be between {MIN_APPROVAL_TTL_SECONDS} and "
                f"{MAX_APPROVAL_TTL_SECONDS}"
            )
        wait = self.request_ttl_seconds
        if isinstance(wait, bool) or not isinstance(wait, int):
            raise ConfigError("`approvals.request_ttl_seconds` should be a whole number")
        if not MIN_REQUEST_TTL_SECONDS <= wait <= MAX_REQUEST_TTL_SECONDS:
            raise ConfigError(
                f"`approvals.request_ttl_seconds` should be between {MIN_REQUEST_TTL_SECONDS} "
                f"and {MAX_REQUEST_TTL_SECONDS}"
            )
        hold = self.wait_seconds
        if isinstance(hold, bool) or not isinstance(hold, int):
            raise ConfigError("`approvals.wait_seconds` should be a whole number")
        if not 0 <= hold <= MAX_WAIT_SECONDS:
            raise ConfigError(
                f"`approvals.wait_seconds` should be between 0 and {MAX_WAIT_SECONDS}"
            )
        if not isinstance(self.allow_self_approval, bool):
            raise ConfigError("`approvals.allow_self_approval` should be true or false")


@dataclass(frozen=True)
class ApprovalClaims:
    """The verified claims of an approval token. ``jti`` stays out of the repr (audit hashes it)."""

    ver: int
    iss: str
    aud: str
    sub: str  # the approver
    iat: int
    nbf: int
    exp: int
    jti: str = field(repr=False)
    tool: str
    args_sha256: str
    subject: str  # the caller allowed to use the token
    host_id: str


class HasApprovalMode(Protocol):
    @property
    def approval_mode(self) -> str: ...


def digest_approved_arguments(arguments: Mapping[str, Any]) -> str:
    """The canonical sha256 a token binds: every argument except the excluded two."""
    return digest_arguments(dict(arguments), exclude=EXCLUDED_ARGUMENTS)


def check_mintable_tool(tool_class: str | None) -> None:
    """Refuse to approve anything but a write tool of this server (``None``: unknown tool).

    A token for a read tool or an unknown name would approve nothing, and minting one
    anyway hides the operator's mistake until the call fails; every minting path asks here.
    """
    if tool_class != "write":
        raise InvalidInputError(NOT_A_WRITE_TOOL_MESSAGE, reason="not_a_write_tool")


def mint_approval_token(
    keys: ApprovalKeys,
    settings: ApprovalSettings,
    *,
    approver: str,
    subject: str,
    tool: str,
    arguments: Mapping[str, Any],
    host_id: str,
    now: float | None = None,
) -> str:
    """Sign a token approving ``tool`` with exactly ``arguments`` for ``subject``."""
    for name, value in (
        ("approver", approver),
        ("subject", subject),
        ("tool", tool),
        ("host_id", host_id),
    ):
        if not isinstance(value, str) or not value:
            raise InvalidInputError(field=name)
    try:
        args_sha256 = digest_approved_arguments(arguments)
    except (TypeError, ValueError):
        raise InvalidInputError(field="arguments") from None
    issued_at = int(time.time() if now is None else now)
    payload = {
        "ver": APPROVAL_TOKEN_VERSION,
        "iss": settings.issuer,
        "aud": settings.audience,
        "sub": approver,
        "iat": issued_at,
        "nbf": issued_at,
        "exp": issued_at + settings.ttl_seconds,
        "jti": secrets.token_urlsafe(JTI_BYTES),
        "tool": tool,
        "args_sha256": args_sha256,
        "subject": subject,
        "host_id": host_id,
    }
    kid = keys.active_kid
    secret = keys.secret_for(kid)
    assert secret is not None  # ApprovalKeys guarantees the active kid has a secret
    import jwt  # here: a server or command that never mints or verifies does not load it

    return jwt.encode(
        payload,
        secret,
        algorithm=APPROVAL_ALGORITHM,
        headers={"kid": kid, "typ": APPROVAL_TOKEN_TYPE},
    )


def verify_approval_token(
    keys: ApprovalKeys,
    settings: ApprovalSettings,
    token: str,
    *,
    subject: str,
    tool: str,
    arguments: Mapping[str, Any],
    now: float | None = None,
) -> ApprovalClaims:
    """Check signature, claims, lifetime and binding; does NOT consume the nonce."""
    payload = _decode_signed_payload(keys, token)
    claims = _to_claims(payload)
    if claims.ver != APPROVAL_TOKEN_VERSION:
        raise ApprovalInvalidError(reason="bad_version")
    if not _equals(claims.aud, settings.audience):
        raise ApprovalInvalidError(reason="bad_audience")
    if not _equals(claims.iss, settings.issuer):
        raise ApprovalInvalidError(reason="bad_issuer")
    if len(claims.jti) < MIN_JTI_CHARS or len(claims.jti) > 256:
        raise ApprovalInvalidError(reason="bad_jti")
    if not 0 < claims.exp - claims.iat <= MAX_APPROVAL_TTL_SECONDS:
        raise ApprovalInvalidError(reason="bad_lifetime")
    current = time.time() if now is None else now
    if current >= claims.exp + APPROVAL_LEEWAY_SECONDS:
        raise ApprovalExpiredError()
    if claims.nbf > current + APPROVAL_LEEWAY_SECONDS:
        raise ApprovalInvalidError(reason="not_yet_valid")
    if claims.iat > current + APPROVAL_LEEWAY_SECONDS:
        raise ApprovalInvalidError(reason="issued_in_future")
    if not _equals(claims.tool, tool):
        raise ApprovalInvalidError(reason="tool_mismatch")
    if not _equals(claims.subject, subject):
        raise ApprovalInvalidError(reason="subject_mismatch")
    try:
        args_sha256 = digest_approved_arguments(arguments)
    except (TypeError, ValueError):
        raise ApprovalInvalidError(reason="arguments_unhashable") from None
    if not _equals(claims.args_sha256, args_sha256):
        raise ApprovalInvalidError(reason="arguments_mismatch")
    return claims


async def enforce_approval(
    keys: ApprovalKeys,
    settings: ApprovalSettings,
    token: str | None,
    *,
    subject: str,
    tool: str,
    arguments: Mapping[str, Any],
    nonce_store: NonceStore,
    now: float | None = None,
) -> ApprovalClaims:
    """Verify the token, then consume its nonce; the nonce is spent only by a valid token.

    No token -> ``ApprovalRequiredError``; a token already used -> ``ApprovalReplayedError``.
    """
    if not token:
        raise ApprovalRequiredError()
    claims = verify_approval_token(
        keys, settings, token, subject=subject, tool=tool, arguments=arguments, now=now
    )
    spend_approval(claims, nonce_store)
    return claims


@runtime_checkable
class NonceStore(Protocol):
    """Remembers used token ids until they expire; its backends are in ``stores/``."""

    def consume(self, jti: str, expires_at: float) -> bool:
        """Record ``jti`` as used until ``expires_at`` (epoch seconds).

        Atomic: ``True`` for exactly one caller the first time an id is seen, ``False``
        for every later call while the id is remembered.
        """
        ...

    def spent(self, jti: str) -> bool:
        """Whether ``jti`` is remembered as used now (records nothing): how a console
        session signed out, or revoked, is told from one still good."""
        ...


def spend_approval(claims: ApprovalClaims, nonce_store: NonceStore) -> None:
    """Consume the token's nonce; a second spend is ``ApprovalReplayedError``.

    The server verifies a token in the approval layer but spends it only when the tool is
    about to run, so a call refused by a later check does not burn the approval.
    """
    # Kept until the token could no longer verify: exp plus the leeway.
    if not nonce_store.consume(claims.jti, float(claims.exp + APPROVAL_LEEWAY_SECONDS)):
        raise ApprovalReplayedError()


def approval_jti_digest(claims: ApprovalClaims) -> str:
    """sha256 of the token id, the form the audit log records."""
    return sha256_hex(claims.jti.encode("utf-8"))


def decide_approval_mode(
    policy: HasApprovalMode | str | None, *, can_elicit: bool
) -> ApprovalDecision:
    """How to obtain approval; fails closed when elicitation is configured but impossible.

    ``None`` means the default, ``"token"``. An unknown mode is ``"deny"``.
    """
    mode = (
        "token" if policy is None else policy if isinstance(policy, str) else policy.approval_mode
    )
    if mode == "token":
        return "token"
    if mode == "elicit":
        return "elicit" if can_elicit else "deny"
    return "deny"


def has_approval_keys(env: Mapping[str, str], config: Mapping[str, Any] | None) -> bool:
    """Whether any approval secret is configured, in the places ``load_approval_keys`` reads."""
    section = _approvals_section(config)
    return bool(
        env.get(ENV_SECRET) or env.get(ENV_KEYS) or section.get("secret") or section.get("keys")
    )


def load_approval_keys(env: Mapping[str, str], config: Mapping[str, Any] | None) -> ApprovalKeys:
    """Secrets from the environment, else from the ``approvals`` section of the YAML config.

    ``NEXUS_MCP_APPROVAL_SECRET`` is one secret under kid ``k1``;
    ``NEXUS_MCP_APPROVAL_KEYS`` is ``kid1:secret1,kid2:secret2`` (a secret may contain
    ``:`` but not ``,``). With more than one key ``NEXUS_MCP_APPROVAL_ACTIVE_KID`` is
    required, so rotation never silently mints with the wrong key. The YAML form is
    ``approvals: {secret: ...}`` or ``approvals: {keys: {kid: secret}, active_kid: kid}``.
    """
    section = _approvals_section(config)
    active_kid = env.get(ENV_ACTIVE_KID) or None
    by_kid: dict[str, bytes]
    if env.get(ENV_SECRET) and env.get(ENV_KEYS):
        raise ConfigError(f"set only one of {ENV_SECRET} and {ENV_KEYS}")
    if env.get(ENV_SECRET):
        by_kid = {active_kid or DEFAULT_KID: env[ENV_SECRET].encode("utf-8")}
    elif env.get(ENV_KEYS):
        by_kid = _parse_key_list(env[ENV_KEYS])
    else:
        by_kid, config_kid = _keys_from_section(section, env)
        active_kid = active_kid or config_kid
    if active_kid is None:
        if len(by_kid) != 1:
            raise ConfigError(f"{ENV_ACTIVE_KID} (or approvals.active_kid) is required")
        active_kid = next(iter(by_kid))
    return ApprovalKeys(by_kid, active_kid)


def load_approval_settings(
    env: Mapping[str, str], config: Mapping[str, Any] | None
) -> ApprovalSettings:
    """Audience, issuer and TTL: environment over the ``approvals`` section over defaults."""
    section = _approvals_section(config)
    audience = env.get(ENV_AUDIENCE) or section.get("audience", DEFAULT_AUDIENCE)
    issuer = env.get(ENV_ISSUER) or section.get("issuer", DEFAULT_ISSUER)
    ttl: Any = section.get("ttl_seconds", DEFAULT_APPROVAL_TTL_SECONDS)
    if env.get(ENV_TTL):
        try:
            ttl = int(env[ENV_TTL])
        except ValueError:
            raise ConfigError(
                f"{ENV_TTL}: `approvals.ttl_seconds` should be a whole number"
            ) from None
    return ApprovalSettings(
        audience=audience,
        issuer=issuer,
        ttl_seconds=ttl,
        request_ttl_seconds=section.get("request_ttl_seconds", DEFAULT_REQUEST_TTL_SECONDS),
        wait_seconds=section.get("wait_seconds", DEFAULT_WAIT_SECONDS),
        allow_self_approval=section.get("allow_self_approval", False),
    )


def _decode_signed_payload(keys: ApprovalKeys, token: str) -> dict[str, Any]:
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
        raise ApprovalInvalidError(reason="malformed")
    # Here, not at the top: only a token checked needs PyJWT (and the cryptography it
    # loads). A failed import raises here, before any claim is trusted: the call fails.
    import jwt

    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise ApprovalInvalidError(reason="malformed") from None
    if header.get("alg") != APPROVAL_ALGORITHM:
        raise ApprovalInvalidError(reason="bad_algorithm")
    if header.get("typ") != APPROVAL_TOKEN_TYPE:
        raise ApprovalInvalidError(reason="bad_type")
    kid = header.get("kid")
    secret = keys.secret_for(kid) if isinstance(kid, str) else None
    if secret is None:
        raise ApprovalInvalidError(reason="unknown_kid")
    try:
        return jwt.decode(
            token,
            secret,
            algorithms=[APPROVAL_ALGORITHM],
            options={
                # Time, audience and issuer are checked below with an injectable clock
                # and constant-time comparisons; PyJWT checks signature and presence.
                "verify_signature": True,
                "verify_exp": False,
                "verify_nbf": False,
                "verify_iat": False,
                "verify_aud": False,
                "verify_iss": False,
                "verify_sub": False,
                "verify_jti": False,
                "require": list(REQUIRED_CLAIMS),
                "enforce_minimum_key_length": True,
            },
        )
    except jwt.InvalidSignatureError:
        raise ApprovalInvalidError(reason="bad_signature") from None
    except jwt.InvalidAlgorithmError:
        raise ApprovalInvalidError(reason="bad_algorithm") from None
    except jwt.MissingRequiredClaimError:
        raise ApprovalInvalidError(reason="missing_claim") from None
    except jwt.PyJWTError:
        raise ApprovalInvalidError(reason="malformed") from None


def _to_claims(payload: Mapping[str, Any]) -> ApprovalClaims:
    ver = payload["ver"]
    if isinstance(ver, bool) or not isinstance(ver, int):
        raise ApprovalInvalidError(reason="bad_version")
    for name in _STRING_CLAIMS:
        if not isinstance(payload[name], str) or not payload[name]:
            raise ApprovalInvalidError(reason="bad_claim_type")
    for name in _TIME_CLAIMS:
        value = payload[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApprovalInvalidError(reason="bad_claim_type")
    return ApprovalClaims(
        ver=ver,
        iss=payload["iss"],
        aud=payload["aud"],
        sub=payload["sub"],
        iat=payload["iat"],
        nbf=payload["nbf"],
        exp=payload["exp"],
        jti=payload["jti"],
        tool=payload["tool"],
        args_sha256=payload["args_sha256"],
        subject=payload["subject"],
        host_id=payload["host_id"],
    )


def _equals(actual: str, expected: str) -> bool:
    return hmac.compare_digest(actual.encode("utf-8"), expected.encode("utf-8"))


def _approvals_section(config: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if config is None:
        return {}
    section = config.get(CONFIG_SECTION)
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"`{CONFIG_SECTION}` should be a mapping (key: value)")
    unknown = [key for key in section if key not in SECTION_KEYS]
    if unknown:
        words = [unknown_key_words(key, SECTION_KEYS, at=CONFIG_SECTION) for key in unknown]
        raise ConfigError(format_problems(words))
    return section


def _parse_key_list(raw: str) -> dict[str, bytes]:
    by_kid: dict[str, bytes] = {}
    for position, item in enumerate(raw.split(",")):
        kid, sep, secret = item.strip().partition(":")
        if not sep or not kid or not secret:
            raise ConfigError(f"{ENV_KEYS} entry {position} must be kid:secret")
        if kid in by_kid:
            raise ConfigError(f"{ENV_KEYS} entry {position} repeats a kid")
        by_kid[kid] = secret.encode("utf-8")
    return by_kid


def _keys_from_section(
    section: Mapping[str, Any], env: Mapping[str, str]
) -> tuple[dict[str, bytes], str | None]:
    secret = section.get("secret")
    keys = section.get("keys")
    active = section.get("active_kid")
    if active is not None and not isinstance(active, str):
        raise _problem("active_kid", "should be text")
    if secret is not None and keys is not None:
        raise _problem("", f"set only one of `{CONFIG_SECTION}.secret` and `{CONFIG_SECTION}.keys`")
    if isinstance(secret, str) and secret:
        return {active or DEFAULT_KID: _secret_text(secret, "secret", env)}, active
    if secret is not None:
        raise _problem("secret", "should be text (not empty)")
    if isinstance(keys, Mapping) and keys:
        by_kid: dict[str, bytes] = {}
        for kid, value in keys.items():
            if not isinstance(kid, str) or not isinstance(value, str) or not value:
                raise _problem("keys", "should map each kid to its secret, as text")
            by_kid[kid] = _secret_text(value, f"keys.{safe_text(kid)}", env)
        return by_kid, active
    if keys is not None:
        raise _problem("keys", "should be a mapping (kid: secret), not empty")
    raise ConfigError(
        f"no approval secret: set {ENV_SECRET} or {ENV_KEYS}, or {CONFIG_SECTION}.secret"
    )


def _secret_text(value: str, key: str, env: Mapping[str, str]) -> bytes:
    """A secret of the section, ``${NAME}`` read once from ``env`` (never read again)."""
    try:
        name = env_reference(value)
    except ValueError:
        raise _problem(key, f": {ENV_REFERENCE_HINT}") from None
    if name is None:
        return value.encode("utf-8")
    found = env.get(name)
    if not found:
        raise _problem(key, f"names the environment variable {safe_text(name)}, which is not set")
    return found.encode("utf-8")


def _problem(key: str, words: str) -> ConfigError:
    where = f"{CONFIG_SECTION}.{key}" if key else ""
    line = problem_line("", where, words) if where else words
    return ConfigError(format_problems([line]))


__all__ = [
    "APPROVAL_ALGORITHM",
    "APPROVAL_LEEWAY_SECONDS",
    "APPROVAL_TOKEN_TYPE",
    "APPROVAL_TOKEN_VERSION",
    "DEFAULT_APPROVAL_TTL_SECONDS",
    "DEFAULT_AUDIENCE",
    "DEFAULT_ISSUER",
    "ENV_ACTIVE_KID",
    "ENV_AUDIENCE",
    "ENV_ISSUER",
    "ENV_KEYS",
    "ENV_SECRET",
    "ENV_TTL",
    "EXCLUDED_ARGUMENTS",
    "MAX_APPROVAL_TTL_SECONDS",
    "MIN_APPROVAL_TTL_SECONDS",
    "MIN_SECRET_BYTES",
    "NOT_A_WRITE_TOOL_MESSAGE",
    "REQUIRED_CLAIMS",
    "ApprovalClaims",
    "ApprovalDecision",
    "ApprovalKeys",
    "ApprovalSettings",
    "HasApprovalMode",
    "NonceStore",
    "approval_jti_digest",
    "check_mintable_tool",
    "decide_approval_mode",
    "digest_approved_arguments",
    "enforce_approval",
    "has_approval_keys",
    "load_approval_keys",
    "load_approval_settings",
    "mint_approval_token",
    "spend_approval",
    "verify_approval_token",
]
