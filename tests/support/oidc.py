"""A real OpenID provider for the OAuth tests, and an HTTP "browser" that signs in to it.

The provider is ``oidc-provider`` (npm, pinned in ``tests/clients/package.json``) run by
``tests/clients/oidc_provider.mjs`` on a loopback port; its configuration (accounts, clients,
resources) is written per test module. Nothing about OAuth is mocked: the tokens are the
provider's RS256 JWTs, checked against its JWKS.

- ``OidcProvider(config, work_dir=...)``: a context manager around the process, and
  ``oidc_provider_fixture(config)``: a pytest fixture of one (module scope by default).
- ``Browser``: an httpx client with its own cookie jar that follows an authorization request
  through redirects and the login and consent forms, across hosts (a proxy in front of the
  provider is followed the same way), up to the client's redirect URI.
- ``client_credentials_token`` / ``code_flow_token`` (and ``*_grant`` for the whole token
  response): tokens from the provider as a static client gets them.
- ``sdk_oauth_flow``: the official TypeScript SDK's own OAuth flow
  (``tests/clients/oauth_flow.mjs``), with a ``Browser`` doing the sign-in.

Without node or the npm packages the tests skip (``make clients`` installs them); under CI
(``CI`` set) they fail instead.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import jwt
import pytest

from tests.support.browser import (
    Browser,
    BrowserError,
    Form,
    LoginRefused,
    PageHandler,
    browser_login,
    parse_forms,
)

__all__ = [
    "AuthorizationResponse",
    "Browser",
    "BrowserError",
    "Form",
    "LoginRefused",
    "OAuthError",
    "OidcProvider",
    "PageHandler",
    "authorize",
    "browser_login",
    "client_credentials_grant",
    "client_credentials_token",
    "code_flow_grant",
    "code_flow_token",
    "exchange_code",
    "oidc_provider_fixture",
    "parse_forms",
    "pkce_pair",
    "require_oidc_node",
    "sdk_oauth_flow",
    "token_body",
    "token_request",
]

CLIENTS_DIR = Path(__file__).resolve().parents[1] / "clients"
PROVIDER_SCRIPT = CLIENTS_DIR / "oidc_provider.mjs"
OAUTH_FLOW_SCRIPT = CLIENTS_DIR / "oauth_flow.mjs"
READY_TIMEOUT_S = 20.0  # a bound, not a pace: the provider listens in well under a second
STOP_TIMEOUT_S = 5.0
HTTP_TIMEOUT_S = 20.0
FLOW_TIMEOUT_S = 120.0


# --- the provider process ------------------------------------------------------------------


def find_oidc_node() -> tuple[str | None, str]:
    """``node`` and the installed provider package, or None and why not."""
    node = shutil.which("node")
    if node is None:
        return None, "node is not installed: the OAuth tests run oidc-provider with it"
    if not (CLIENTS_DIR / "node_modules" / "oidc-provider" / "package.json").is_file():
        return None, "oidc-provider is not installed: run `make clients` (npm ci, tests/clients)"
    return node, ""


def require_oidc_node() -> str:
    """``node``, or skip the test (fail it under CI) naming what is missing."""
    node, reason = find_oidc_node()
    if node is None:
        if os.environ.get("CI"):
            pytest.fail(f"required under CI: {reason}")
        pytest.skip(reason)
    return node


class OidcProvider:
    """``node oidc_provider.mjs CONFIG`` as a context manager; see that script for CONFIG."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        work_dir: Path,
        port: int = 0,
        node: str | None = None,
    ) -> None:
        self.config = dict(config)
        self.work_dir = work_dir
        self._port = port
        self._node = node
        self._proc: subprocess.Popen[bytes] | None = None
        self.issuer = ""
        self.port = 0
        self.discovery: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        assert self._proc is not None, "the provider is not started"
        return self._proc.pid

    @property
    def jwks_uri(self) -> str:
        return str(self.discovery["jwks_uri"])

    @property
    def token_endpoint(self) -> str:
        return str(self.discovery["token_endpoint"])

    @property
    def authorization_endpoint(self) -> str:
        return str(self.discovery["authorization_endpoint"])

    @property
    def registration_endpoint(self) -> str:
        return str(self.discovery["registration_endpoint"])

    @property
    def stderr_path(self) -> Path:
        return self.work_dir / "oidc-provider.stderr"

    def start(self) -> OidcProvider:
        node = self._node or require_oidc_node()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.work_dir / "oidc-provider.json"
        config_path.write_text(json.dumps(self.config), encoding="utf-8")
        with self.stderr_path.open("wb") as errlog:
            self._proc = subprocess.Popen(
                [node, str(PROVIDER_SCRIPT), str(config_path), str(self._port)],
                stdout=subprocess.PIPE,
                stderr=errlog,
                stdin=subprocess.DEVNULL,
                cwd=CLIENTS_DIR,
            )
        try:
            ready = json.loads(self._ready_line())
            self.issuer = str(ready["issuer"])
            self.port = int(ready["port"])
            response = httpx.get(
                f"{self.issuer}/.well-known/openid-configuration", timeout=HTTP_TIMEOUT_S
            )
            response.raise_for_status()
            self.discovery = response.json()
        except BaseException:
            self.stop()
            raise
        return self

    def _ready_line(self) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        buffer = b""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"oidc-provider did not listen in time: {self._stderr_tail()}")
            readable, _, _ = select.select([fd], [], [], remaining)
            if readable:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise RuntimeError(f"oidc-provider exited: {self._stderr_tail()}")
                buffer += chunk
        return buffer.split(b"\n", 1)[0]

    def _stderr_tail(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no stderr)"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not ended in ``STOP_TIMEOUT_S``; idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
        if proc.stdout is not None:
            proc.stdout.close()

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def __enter__(self) -> OidcProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what a resource server does with the provider's tokens ---

    def jwks(self) -> dict[str, Any]:
        response = httpx.get(self.jwks_uri, timeout=HTTP_TIMEOUT_S)
        response.raise_for_status()
        return dict(response.json())

    def verify_access_token(self, token: str, *, audience: str) -> dict[str, Any]:
        """The claims of ``token`` once its RS256 signature, issuer, audience and expiry hold."""
        kid = str(jwt.get_unverified_header(token).get("kid"))
        key = jwt.PyJWKSet.from_dict(self.jwks())[kid]
        claims: dict[str, Any] = jwt.decode(
            token, key=key, algorithms=["RS256"], audience=audience, issuer=self.issuer
        )
        return claims


ProviderConfig = Mapping[str, Any] | Callable[[pytest.FixtureRequest], Mapping[str, Any]]


FixtureScope = Literal["session", "package", "module", "class", "function"]


def oidc_provider_fixture(config: ProviderConfig, *, scope: FixtureScope = "module") -> Any:
    """A pytest fixture yielding a started ``OidcProvider``; bind it to a module name:

        oidc = oidc_provider_fixture({"accounts": ..., "clients": [...], "resources": {...}})

    ``config`` may be a callable of the fixture request (to read other fixtures, such as a
    reserved port that a resource URL names). Skips without node (fails under CI)."""

    @pytest.fixture(scope=scope)
    def provider(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[OidcProvider]:
        resolved = config(request) if callable(config) else config
        with OidcProvider(resolved, work_dir=tmp_path_factory.mktemp("oidc")) as started:
            yield started

    return provider


# --- tokens as a static client gets them ---------------------------------------------------


class OAuthError(AssertionError):
    """An OAuth error response (``error`` and ``error_description``)."""

    def __init__(self, error: str, description: str = "", status: int | None = None) -> None:
        super().__init__(f"{error}: {description}" if description else error)
        self.error = error
        self.description = description
        self.status = status


def pkce_pair() -> tuple[str, str]:
    """(code_verifier, S256 code_challenge)."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class AuthorizationResponse:
    redirect: str  # the whole URL the browser was sent to
    params: dict[str, str]  # its query (code, state, iss; or error)
    state: str  # the state the request sent
    verifier: str  # the PKCE verifier of the request

    @property
    def code(self) -> str:
        if "code" not in self.params:
            raise OAuthError(
                self.params.get("error", "no code"), self.params.get("error_description", "")
            )
        return self.params["code"]


def authorize(
    provider: OidcProvider,
    *,
    client_id: str,
    redirect_uri: str,
    login: str,
    password: str,
    scope: str,
    resource: str | None = None,
    browser: Browser | None = None,
    extra_params: Mapping[str, str] | None = None,
) -> AuthorizationResponse:
    """An authorization request (code, PKCE S256, state) signed in by ``browser``."""
    verifier, challenge = pkce_pair()
    state = secrets.token_urlsafe(16)
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "scope": scope,
        "state": state,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    if resource is not None:
        params["resource"] = resource
    params.update(extra_params or {})
    url = f"{provider.authorization_endpoint}?{urlencode(params)}"
    redirect = browser_login(
        url, login=login, password=password, stop_at_prefix=redirect_uri, client=browser
    )
    query = {k: v[0] for k, v in parse_qs(urlsplit(redirect).query).items()}
    if query.get("state") != state:
        raise OAuthError("state_mismatch", "the redirect did not carry the request's state")
    return AuthorizationResponse(redirect=redirect, params=query, state=state, verifier=verifier)


def token_request(
    provider: OidcProvider,
    data: Mapping[str, str],
    *,
    client_id: str,
    client_secret: str | None = None,
) -> httpx.Response:
    """POST ``data`` to the token endpoint: HTTP Basic with a secret, else client_id in the body."""
    body = dict(data)
    auth = None
    if client_secret is None:
        body["client_id"] = client_id
    else:
        auth = httpx.BasicAuth(client_id, client_secret)
    return httpx.post(provider.token_endpoint, data=body, auth=auth, timeout=HTTP_TIMEOUT_S)


def token_body(response: httpx.Response) -> dict[str, Any]:
    """The token response's JSON, or ``OAuthError`` for an error response."""
    body: dict[str, Any] = response.json()
    if response.status_code != 200 or "error" in body:
        raise OAuthError(
            str(body.get("error", "http_error")),
            str(body.get("error_description", "")),
            response.status_code,
        )
    return body


def exchange_code(
    provider: OidcProvider,
    authorization: AuthorizationResponse,
    *,
    client_id: str,
    redirect_uri: str,
    client_secret: str | None = None,
    resource: str | None = None,
) -> httpx.Response:
    data = {
        "grant_type": "authorization_code",
        "code": authorization.code,
        "redirect_uri": redirect_uri,
        "code_verifier": authorization.verifier,
    }
    if resource is not None:
        data["resource"] = resource
    return token_request(provider, data, client_id=client_id, client_secret=client_secret)


def code_flow_grant(
    provider: OidcProvider,
    *,
    client_id: str,
    redirect_uri: str,
    login: str,
    password: str,
    scope: str,
    resource: str | None = None,
    client_secret: str | None = None,
    browser: Browser | None = None,
) -> dict[str, Any]:
    """The whole token response of an authorization code flow with PKCE."""
    authorization = authorize(
        provider,
        client_id=client_id,
        redirect_uri=redirect_uri,
        login=login,
        password=password,
        scope=scope,
        resource=resource,
        browser=browser,
    )
    response = exchange_code(
        provider,
        authorization,
        client_id=client_id,
        redirect_uri=redirect_uri,
        client_secret=client_secret,
        resource=resource,
    )
    return token_body(response)


def code_flow_token(provider: OidcProvider, **kwargs: Any) -> str:
    """The access token of ``code_flow_grant(provider, **kwargs)``."""
    return str(code_flow_grant(provider, **kwargs)["access_token"])


def client_credentials_grant(
    provider: OidcProvider, client_id: str, client_secret: str, *, resource: str, scope: str
) -> dict[str, Any]:
    data = {"grant_type": "client_credentials", "resource": resource, "scope": scope}
    response = token_request(provider, data, client_id=client_id, client_secret=client_secret)
    return token_body(response)


def client_credentials_token(
    provider: OidcProvider, client_id: str, client_secret: str, *, resource: str, scope: str
) -> str:
    grant = client_credentials_grant(
        provider, client_id, client_secret, resource=resource, scope=scope
    )
    return str(grant["access_token"])


# --- the TypeScript SDK's OAuth flow -------------------------------------------------------


def sdk_oauth_flow(
    plan: Mapping[str, Any],
    *,
    work: Path,
    sign_in: Callable[[str], str],
    timeout: float = FLOW_TIMEOUT_S,
) -> dict[str, Any]:
    """Run ``oauth_flow.mjs`` with ``plan``; ``sign_in(authorize_url)`` returns the redirect.

    Returns the script's final JSON (``{"error": ...}`` when it failed; ``"exit"`` holds the
    exit status either way)."""
    node = require_oidc_node()
    path = work / f"oauth-plan-{secrets.token_hex(4)}.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    with path.with_suffix(".stderr").open("wb") as errlog:
        proc = subprocess.Popen(
            [node, str(OAUTH_FLOW_SCRIPT), str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            cwd=CLIENTS_DIR,
        )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        deadline = time.monotonic() + timeout
        while True:
            line = _read_line(proc.stdout.fileno(), deadline)
            if not line:
                raise AssertionError(f"oauth_flow.mjs ended without output: {_tail(path)}")
            message: dict[str, Any] = json.loads(line)
            if "authorize" not in message:
                break
            proc.stdin.write(sign_in(str(message["authorize"])).encode() + b"\n")
            proc.stdin.flush()
        proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
        message["exit"] = proc.returncode
        return message
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def _read_line(fd: int, deadline: float) -> bytes:
    buffer = b""
    while not buffer.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError("oauth_flow.mjs did not answer in time")
        readable, _, _ = select.select([fd], [], [], remaining)
        if readable:
            chunk = os.read(fd, 1)
            if not chunk:
                return buffer
            buffer += chunk
    return buffer


def _tail(plan_path: Path) -> str:
    try:
        return plan_path.with_suffix(".stderr").read_text(errors="replace")[-3000:]
    except OSError:
        return "(no stderr)"
