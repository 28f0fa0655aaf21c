"""The hosted backend: one bounded ``GET /api/v1/notes/{path}`` to the Knowtation canister.

Each read sends Knowtation's note-read request, with the caller's vault and effective
canister user taken from the principal, never from tool arguments. One
``httpx.AsyncClient`` is reused; it follows no redirects, keeps no cookies, ignores proxy
and netrc settings, has bounded connect/read/total times, and stops reading a response
past ``max_response_bytes``. 401, 403 and 404 map to ``Upstream <status>``; everything
else, including any malformed reply, is ``Runtime failure``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any
from urllib.parse import urlsplit

import httpx

from nexus_mcp.errors import ConfigError, UpstreamError
from nexus_mcp.notes.frontmatter import parse_canister_frontmatter, parse_js_json
from nexus_mcp.notes.paths import check_normalized_path, encode_uri_component
from nexus_mcp.notes.source import NoteSource
from nexus_mcp.principal import Principal

NOTES_ROUTE = "/api/v1/notes/"
PASSED_THROUGH_STATUSES = frozenset({401, 403, 404})
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 10.0
# Below the default tool timeout (30 s), so a reply that drip-feeds past it ends as the
# spec's "Runtime failure", not as TOOL_TIMEOUT (settings check the configured values).
DEFAULT_TOTAL_TIMEOUT_S = 25.0
# A 1,000,000-unit body JSON-escaped is at most ~6 MB; the rest is frontmatter headroom.
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
_JSON_MEDIA_TYPE = "application/json"
_IDENTITY_ENCODINGS = frozenset({"", "identity"})

TokenProvider = Callable[[Principal], Awaitable[str]]

_TRANSPORT_ERRORS = (httpx.HTTPError, httpx.InvalidURL, TimeoutError, OSError, ValueError)


class CanisterBackend:
    """Reads notes from a Knowtation canister over HTTP(S)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        token_provider: TokenProvider | None = None,
        gateway_secret: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        read_timeout: float = DEFAULT_READ_TIMEOUT_S,
        total_timeout: float = DEFAULT_TOTAL_TIMEOUT_S,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._base_url = _validate_base_url(base_url)
        if (token is None) == (token_provider is None):
            raise ConfigError("notes canister backend: set exactly one of token or token_provider")
        self._token = token
        self._token_provider = token_provider
        self._gateway_secret = gateway_secret or None
        if not total_timeout > 0 or total_timeout < max(connect_timeout, read_timeout):
            raise ConfigError(
                "notes canister backend: the total timeout must be positive and at least "
                "the connect and read timeouts"
            )
        self._total_timeout = total_timeout
        self._max_response_bytes = max_response_bytes
        _silence_request_logs()
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(
                connect=connect_timeout, read=read_timeout, write=read_timeout, pool=connect_timeout
            ),
            follow_redirects=False,
            trust_env=False,  # no proxy variables, no .netrc credentials
            cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def read_note(self, path: str, caller: Principal) -> NoteSource:
        url = self._base_url + NOTES_ROUTE + _encode_path(check_normalized_path(path))
        headers = await self._headers(caller)
        payload = await self._fetch_json(url, headers)
        if not isinstance(payload, dict):
            raise _failure("malformed_payload")
        body = payload.get("body")
        if body is None:
            body = ""
        if not isinstance(body, str):
            raise _failure("malformed_payload")
        try:
            frontmatter = parse_canister_frontmatter(payload.get("frontmatter"))
        except (ValueError, RecursionError):
            raise _failure("malformed_frontmatter") from None
        return NoteSource(body=body, frontmatter=frontmatter)

    async def _headers(self, caller: Principal) -> dict[str, str]:
        vault_id, user_id = caller.vault_id, caller.canister_user
        if not vault_id or not user_id:
            # Fail closed: a request without a vault or user must never reach the canister.
            raise _failure("principal_without_vault")
        token = self._token
        if self._token_provider is not None:
            token = await self._token_provider(caller)
        if not isinstance(token, str) or not token:
            raise _failure("no_canister_token")
        headers = {
            "Authorization": f"Bearer {token}",
            "X-Vault-Id": vault_id,
            "X-User-Id": user_id,
            "Accept": _JSON_MEDIA_TYPE,
            "Content-Type": _JSON_MEDIA_TYPE,
            # Compressed replies could inflate past the byte cap before it is checked.
            "Accept-Encoding": "identity",
        }
        if self._gateway_secret:
            headers["X-Gateway-Auth"] = self._gateway_secret
        return headers

    async def _fetch_json(self, url: str, headers: dict[str, str]) -> Any:
        try:
            async with asyncio.timeout(self._total_timeout):
                request = self._client.build_request("GET", url, headers=headers)
                response = await self._client.send(request, stream=True)
                try:
                    raw = await self._read_bounded(response)
                finally:
                    await response.aclose()
        except UpstreamError:
            raise
        except _TRANSPORT_ERRORS as exc:
            raise _failure(type(exc).__name__) from None
        try:
            return parse_js_json(_decode_utf8(raw))
        except (ValueError, RecursionError):
            raise _failure("malformed_json") from None

    async def _read_bounded(self, response: httpx.Response) -> bytes:
        status = response.status_code
        if status in PASSED_THROUGH_STATUSES:
            raise UpstreamError.status(status)
        if not 200 <= status < 300:  # redirects included: they are never followed
            error = _failure("unexpected_status")
            # The client still sees only "Runtime failure"; logs get the status class.
            error.facts["status"] = status
            raise error
        encoding = response.headers.get("content-encoding", "").strip().lower()
        if encoding not in _IDENTITY_ENCODINGS:
            raise _failure("encoded_response")
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_response_bytes:
            raise _failure("response_too_large")
        chunks: list[bytes] = []
        received = 0
        async for chunk in response.aiter_raw():
            received += len(chunk)
            if received > self._max_response_bytes:
                raise _failure("response_too_large")
            chunks.append(chunk)
        return b"".join(chunks)


def _encode_path(path: str) -> str:
    try:
        return encode_uri_component(path)
    except UnicodeEncodeError:
        raise _failure("unencodable_path") from None  # JavaScript throws URIError here


def _decode_utf8(raw: bytes) -> str:
    # fetch's res.json(): UTF-8 with replacement characters, a leading BOM dropped.
    return raw.decode("utf-8", errors="replace").removeprefix("\ufeff")


def _validate_base_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError("notes canister_url must be an http(s) URL without query or fragment")
    return base_url.rstrip("/")


class _DropRequestLines(logging.Filter):
    """httpx logs each request URL at INFO, and the URL holds the note path."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


_REQUEST_LOG_FILTER = _DropRequestLines()


def _silence_request_logs() -> None:
    for name in ("httpx", "httpcore"):
        logger = logging.getLogger(name)
        if _REQUEST_LOG_FILTER not in logger.filters:
            logger.addFilter(_REQUEST_LOG_FILTER)


def _failure(reason: str) -> UpstreamError:
    error = UpstreamError.runtime_failure()
    error.facts["reason"] = reason
    return error
