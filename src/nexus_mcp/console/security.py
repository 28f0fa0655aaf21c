"""The console's own defences: signed sessions and login links, CSRF, and response headers.

- **Sessions** are a cookie signed with the console key (``itsdangerous``, HMAC-SHA1 over
  a derived key with its own salt per use; we do not hand-roll signing). It holds who
  signed in, their console role, a CSRF token and when it was made; it is ``HttpOnly``,
  ``SameSite=Strict``, scoped to ``/console``, ``Secure`` when the console is reached over
  HTTPS, and expires after ``console.session_ttl_seconds``.
- **Login links** (``nexus-mcp console``): a signed token for the local admin, good for
  five minutes and once (its id is spent in the nonce store the approvals use, so on the
  shared backend once across replicas).
- **CSRF**: every form carries the session's token, compared in constant time, and a
  state-changing request must come from the console's own origin (``Origin`` and the
  browser's ``Sec-Fetch-Site`` when sent).
- **Headers** on every console response: a strict Content-Security-Policy (scripts,
  styles and fetches from the console's own origin only, no inline code, no framing, forms
  post only to itself; the sign-in page's also to the identity provider), ``X-Frame-Options:
  DENY``, ``nosniff``, no referrer, no caching.

The key is ``console.secret`` (replicas behind one address must share it) or a random key
made once in the data dir (``console.key``, 0600), which the file tools never reach
(``stores/locations.server_state_paths``).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from itsdangerous import BadData, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.console import (
    CONSOLE_ROLES,
    LOGIN_LINK_TTL_SECONDS,
    ConsoleRole,
    secret_bytes,
)
from nexus_mcp.policy.upstreams import resolve_secret
from nexus_mcp.settings import Settings
from nexus_mcp.stores.locations import console_key_path

CONSOLE_PATH = "/console"
COOKIE_NAME = "nexus_console"
SECURE_COOKIE_NAME = "__Host-nexus_console"
MAX_COOKIE_CHARS = 4000
MAX_LINK_CHARS = 2000
KEY_BYTES = 32
LOGIN_JTI_PREFIX = "console-login:"
SESSION_JTI_PREFIX = "console-session:"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    )
)
SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # Not "no-referrer": under it a browser sends ``Origin: null`` on the console's own form
    # posts (Fetch: a non-GET request's origin is hidden with the referrer), which the
    # origin checks then refuse. "same-origin" still sends nothing to any other site.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}


def policy_with_form_action(origin: str) -> str:
    """The CSP of a page whose form leads to ``origin`` too: browsers hold a form's
    submission to ``form-action`` through its redirects, so the sign-in page's button
    (a POST answered by a redirect to the identity provider) needs the provider's origin."""
    return CONTENT_SECURITY_POLICY.replace("form-action 'self'", f"form-action 'self' {origin}")


@dataclass(frozen=True)
class ConsoleUser:
    """A signed-in person, as the session cookie holds them."""

    sid: str
    subject: str  # binds decisions (self-approval is checked against it)
    log_subject: str  # what pages and the audit show
    role: str  # the principal role the console role came from
    console_role: ConsoleRole
    csrf: str
    via: str  # "link" (local one-time link) or "oidc" (the identity provider)
    signed_in_at: float


def load_console_key(settings: Settings, environ: Mapping[str, str]) -> bytes:
    """``console.secret``, or the data dir's key (made once, owner-only)."""
    configured = settings.console.secret
    if configured is not None:
        key = secret_bytes(resolve_secret(configured, environ))
        if len(key) < KEY_BYTES:
            raise ConfigError(f"'console.secret' must be at least {KEY_BYTES} bytes")
        return key
    path = console_key_path(settings)
    with contextlib.suppress(FileNotFoundError):
        return _read_key(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use theirs
        return _read_key(path)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(48) + "\n")
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    key = path.read_text(encoding="utf-8").strip().encode()
    if len(key) < KEY_BYTES:
        raise ConfigError(f"the console key {path.name} in the data dir is too short")
    return key


class ConsoleKeys:
    """Signs and reads session cookies and login links with the console key."""

    def __init__(self, key: bytes, *, session_ttl_seconds: int) -> None:
        self._sessions = URLSafeTimedSerializer(key, salt="nexus-console-session")
        self._links = URLSafeTimedSerializer(key, salt="nexus-console-login")
        # The identity provider sign-in in progress (``oidc.py``): state, nonce, verifier.
        self._flows = URLSafeTimedSerializer(key, salt="nexus-console-oidc-flow")
        self.session_ttl_seconds = session_ttl_seconds

    def new_session(
        self, *, subject: str, log_subject: str, role: str, console_role: ConsoleRole, via: str
    ) -> tuple[ConsoleUser, str]:
        user = ConsoleUser(
            sid=secrets.token_urlsafe(16),
            subject=subject,
            log_subject=log_subject,
            role=role,
            console_role=console_role,
            csrf=secrets.token_urlsafe(32),
            via=via,
            signed_in_at=time.time(),
        )
        return user, self._sessions.dumps(asdict(user))

    def read_session(self, cookie: str | None) -> ConsoleUser | None:
        if not cookie or len(cookie) > MAX_COOKIE_CHARS:
            return None
        try:
            data = self._sessions.loads(cookie, max_age=self.session_ttl_seconds)
        except BadData:
            return None
        try:
            user = ConsoleUser(**data)
        except TypeError:
            return None
        if user.console_role not in CONSOLE_ROLES or not all(
            isinstance(getattr(user, name), str)
            for name in ("sid", "subject", "log_subject", "role", "csrf", "via")
        ):
            return None
        return user

    def mint_link(self, *, subject: str, role: str) -> str:
        """A one-time login token for the local admin (``nexus-mcp console``)."""
        return self._links.dumps({"sub": subject, "role": role, "jti": secrets.token_urlsafe(16)})

    def read_link(self, token: str | None) -> dict[str, Any] | None:
        """The link's claims if it is genuine and young; spending it is the caller's."""
        if not token or len(token) > MAX_LINK_CHARS:
            return None
        try:
            data = self._links.loads(token, max_age=LOGIN_LINK_TTL_SECONDS)
        except BadData:
            return None
        if not isinstance(data, dict) or not all(
            isinstance(data.get(k), str) and data.get(k) for k in ("sub", "role", "jti")
        ):
            return None
        return data

    def seal_flow(self, flow: Mapping[str, str]) -> str:
        """A sign-in in progress at the identity provider, for its short-lived cookie."""
        return self._flows.dumps(dict(flow))

    def open_flow(
        self, value: str | None, *, fields: tuple[str, ...], max_age: int
    ) -> dict[str, str] | None:
        """The sign-in in progress if the cookie is ours and young, with every field a string."""
        if not value or len(value) > MAX_COOKIE_CHARS:
            return None
        try:
            data = self._flows.loads(value, max_age=max_age)
        except BadData:
            return None
        if not isinstance(data, dict) or not all(
            isinstance(data.get(k), str) and data.get(k) for k in fields
        ):
            return None
        return {k: data[k] for k in fields}


def public_origin(base_url: str | None) -> str | None:
    """The origin people reach the console at behind a proxy (``auth.base_url``)."""
    if not base_url:
        return None
    parts = urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None


@dataclass(frozen=True)
class ConsoleCookie:
    """One of the console's cookies: its name, ``SameSite`` and where it applies.

    Over HTTPS (or behind a TLS proxy, ``auth.base_url``) it is ``Secure`` and named with
    ``__Host-`` (bound to this host, path ``/``, HTTPS: no other subdomain or plain-HTTP
    page can set it); over plain loopback HTTP it is scoped to ``/console``.
    """

    name: str
    samesite: Literal["strict", "lax"]

    def named(self, request: Request, public: str | None = None) -> str:
        return f"__Host-{self.name}" if is_https(request, public) else self.name

    def read(self, request: Request, public: str | None = None) -> str | None:
        return request.cookies.get(self.named(request, public))

    def set(
        self, response: Response, request: Request, value: str, ttl: int, public: str | None
    ) -> None:
        secure = is_https(request, public)
        response.set_cookie(
            self.named(request, public),
            value,
            max_age=ttl,
            path="/" if secure else CONSOLE_PATH,
            secure=secure,
            httponly=True,
            samesite=self.samesite,
        )

    def clear(self, response: Response, request: Request, public: str | None) -> None:
        secure = is_https(request, public)
        response.delete_cookie(
            self.named(request, public),
            path="/" if secure else CONSOLE_PATH,
            secure=secure,
            httponly=True,
            samesite=self.samesite,
        )


SESSION_COOKIE = ConsoleCookie(COOKIE_NAME, "strict")


def session_jti(user: ConsoleUser) -> str:
    """The nonce-store id that marks a session signed out."""
    return SESSION_JTI_PREFIX + user.sid


def is_https(request: Request, public: str | None = None) -> bool:
    # Behind a TLS-terminating proxy the request itself may look like plain HTTP.
    return request.url.scheme == "https" or (public or "").startswith("https://")


def cookie_name(request: Request, public: str | None = None) -> str:
    """The session cookie's name for this request."""
    return SESSION_COOKIE.named(request, public)


def own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


def same_origin(request: Request, public: str | None = None) -> bool:
    """A state-changing request from the console's own pages (never another site's):
    the origin the request reached, or the public one (``auth.base_url``)."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        # Browsers send Origin on every POST; a client that does not is no browser a
        # forged form could drive, and it still needs the session's CSRF token.
        return True
    sent = origin.encode("utf-8", "surrogatepass")
    return any(
        hmac.compare_digest(sent, allowed.encode())
        for allowed in (own_origin(request), public)
        if allowed is not None
    )


def csrf_ok(user: ConsoleUser, submitted: object) -> bool:
    return isinstance(submitted, str) and hmac.compare_digest(
        submitted.encode("utf-8", "surrogatepass"), user.csrf.encode()
    )


__all__ = [
    "CONSOLE_PATH",
    "CONTENT_SECURITY_POLICY",
    "LOGIN_JTI_PREFIX",
    "SECURITY_HEADERS",
    "SESSION_COOKIE",
    "ConsoleCookie",
    "ConsoleKeys",
    "ConsoleUser",
    "cookie_name",
    "csrf_ok",
    "is_https",
    "load_console_key",
    "own_origin",
    "policy_with_form_action",
    "public_origin",
    "same_origin",
    "session_jti",
]
