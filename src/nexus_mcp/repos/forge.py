"""The forge client: the few GitHub REST calls ``open_pull_request`` and ``merge_guarded`` make.

The forge is the outside world and may be compromised or flaky, and the caller is an AI
agent, so every call is bounded and every answer distrusted:

- One ``httpx.AsyncClient`` per client: no redirects followed (a 3xx is an error, since
  a redirect could carry the token elsewhere), no proxy or netrc settings, no cookies,
  a per-request deadline, TLS verified (against ``ca_file`` when set). Plain ``http`` is
  accepted only for a loopback forge, so the token never crosses a network in clear.
- The bearer token is sent only to ``base_url``'s scheme, host and port. Pagination
  follows ``Link: rel="next"`` only on that same origin (anything else is an error) and
  at most ``MAX_PAGES`` pages: a list is complete or the call fails, since a truncated
  list of reviews or files could hide a change request or a CODEOWNERS path.
- Path parameters are validated (a sha is 40 or 64 lowercase hex, a number a positive
  integer) and URL-quoted. Bodies are streamed with a hard cap of ``max_response_bytes``
  and no content encoding (a compressed body could inflate past the cap in one chunk),
  decoded as strict UTF-8 JSON (no ``NaN``, no duplicate keys), and every field used is
  type-checked.
- Every failure is an ``UpstreamError`` whose message and facts hold no forge text, URL,
  token or request data, raised ``from None``: ``Upstream unavailable``
  (``forge_unavailable``), ``Upstream timeout`` (``forge_timeout``), ``Upstream <status>``
  for a 4xx/5xx (``forge_status``), ``Upstream error`` (``forge_malformed``: a redirect,
  an oversized, encoded or malformed body, a foreign or endless ``next`` link). The
  ``reason`` fact names which, from this module's own constants. The only answers that
  are not errors: ``MergeOutcome.refused`` for 405 (``not_mergeable``) and 409
  (``head_changed``) on merge; ``create_pull`` maps 422 to ``ConflictError``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import re
import ssl
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path
from typing import Any, Literal, NoReturn
from urllib.parse import quote

import httpx
from pydantic import SecretStr

from nexus_mcp.errors import ConfigError, ConflictError, InvalidInputError, UpstreamError
from nexus_mcp.policy.merge_rules import CheckRun, PullRequest, Review, StatusContext

MergeMethod = Literal["merge", "squash", "rebase"]
MERGE_METHODS: frozenset[str] = frozenset({"merge", "squash", "rebase"})
API_VERSION = "2022-11-28"
USER_AGENT = "nexus-mcp-forge"
PER_PAGE = 100
# GitHub lists at most 3000 files of a pull request: 30 pages of 100.
MAX_PAGES = 30
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
MAX_REF_LENGTH = 255

OUTCOME_UNAVAILABLE = "forge_unavailable"
OUTCOME_TIMEOUT = "forge_timeout"
OUTCOME_STATUS = "forge_status"
OUTCOME_MALFORMED = "forge_malformed"
PULL_EXISTS_OR_INVALID = "pull_exists_or_invalid"

_SHA = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")
_REPOSITORY = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
_TOKEN = re.compile(r"[\x21-\x7e]+")  # visible ASCII: nothing that could split a header
_DEFAULT_PORTS = {"http": 80, "https": 443}
_IDENTITY_ENCODINGS = frozenset({"", "identity"})


@dataclass(frozen=True)
class ForgeSettings:
    """Where the forge is and how to talk to it; validated on construction."""

    base_url: str
    repository: str
    token: SecretStr | None
    timeout_seconds: float = DEFAULT_TIMEOUT_S
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    ca_file: Path | None = None

    def __post_init__(self) -> None:
        url = _parse_url(self.base_url)
        if (
            url is None
            or url.scheme not in _DEFAULT_PORTS
            or not url.host
            or url.userinfo
            or url.query
            or url.fragment
        ):
            raise ConfigError("forge base_url must be an http(s) URL without credentials or query")
        if url.scheme == "http" and not _is_loopback(url.host):
            raise ConfigError("forge base_url must use https unless the forge is on loopback")
        name = self.repository
        if not _REPOSITORY.fullmatch(name) or any(p in (".", "..") for p in name.split("/")):
            raise ConfigError("forge repository must be 'owner/name'")
        token = self.token
        if token is not None and (
            not isinstance(token, SecretStr) or not _TOKEN.fullmatch(token.get_secret_value())
        ):
            raise ConfigError("forge token must be non-empty visible ASCII")
        timeout = self.timeout_seconds
        if type(timeout) not in (int, float) or not 0 < timeout < math.inf:
            raise ConfigError("forge timeout_seconds must be positive")
        if type(self.max_response_bytes) is not int or self.max_response_bytes <= 0:
            raise ConfigError("forge max_response_bytes must be a positive integer")


@dataclass(frozen=True)
class MergeOutcome:
    """``refused`` is ``None``, ``"not_mergeable"`` (405) or ``"head_changed"`` (409)."""

    merged: bool
    sha: str | None
    refused: str | None


@dataclass(frozen=True)
class _Reply:
    status: int
    payload: Any
    next_url: httpx.URL | None


class ForgeClient:
    """An async client for one repository on a GitHub-shaped forge."""

    def __init__(
        self, settings: ForgeSettings, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self._settings = settings
        self._base = httpx.URL(settings.base_url.rstrip("/"))
        owner, name = settings.repository.split("/")
        self._repo_url = f"{self._base}/repos/{quote(owner, safe='')}/{quote(name, safe='')}"
        verify: ssl.SSLContext | bool = True
        if settings.ca_file is not None:
            try:
                verify = ssl.create_default_context(cafile=str(settings.ca_file))
            except (OSError, ValueError):
                raise ConfigError("forge ca_file cannot be read as PEM certificates") from None
        self._client = httpx.AsyncClient(
            verify=verify,
            timeout=httpx.Timeout(settings.timeout_seconds),
            follow_redirects=False,
            trust_env=False,  # no proxy variables, no .netrc credentials
            cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"ForgeClient(repository={self._settings.repository!r})"

    async def aclose(self) -> None:
        await self._client.aclose()

    async def create_pull(
        self, *, head: str, base: str, title: str, body: str, draft: bool = False
    ) -> PullRequest:
        request = {
            "head": _ref(head, "head"),
            "base": _ref(base, "base"),
            "title": _text(title, "title"),
            "body": _text(body, "body"),
            "draft": _flag(draft, "draft"),
        }
        reply = await self._call(
            "POST", f"{self._repo_url}/pulls", body=request, passed=frozenset({422})
        )
        if reply.status == 422:
            raise ConflictError(reason=PULL_EXISTS_OR_INVALID) from None
        return _to_pull(reply.payload)

    async def get_pull(self, number: int) -> PullRequest:
        reply = await self._call("GET", f"{self._repo_url}/pulls/{_number(number)}")
        pull = _to_pull(reply.payload)
        if pull.number != number:
            _malformed("wrong_pull")
        return pull

    async def list_pull_files(self, number: int) -> list[str]:
        """Every path the pull request touches: each file and, for a rename, its old name."""
        paths: dict[str, None] = {}
        for item in await self._pages(f"/pulls/{_number(number)}/files", key=None):
            entry = _object(item)
            paths[_str(entry, "filename")] = None
            previous = _opt_str(entry, "previous_filename")
            if previous is not None:
                paths[previous] = None
        return list(paths)

    async def list_reviews(self, number: int) -> list[Review]:
        return [
            _to_review(item)
            for item in await self._pages(f"/pulls/{_number(number)}/reviews", key=None)
        ]

    async def combined_status(self, sha: str) -> list[StatusContext]:
        items = await self._pages(f"/commits/{_sha(sha)}/status", key="statuses")
        return [
            StatusContext(context=_str(entry, "context"), state=_str(entry, "state"))
            for entry in map(_object, items)
        ]

    async def check_runs(self, sha: str) -> list[CheckRun]:
        items = await self._pages(f"/commits/{_sha(sha)}/check-runs", key="check_runs")
        return [
            CheckRun(
                id=_int(entry, "id"),
                name=_str(entry, "name"),
                status=_str(entry, "status"),
                conclusion=_opt_str(entry, "conclusion"),
            )
            for entry in map(_object, items)
        ]

    async def merge_pull(
        self, number: int, *, sha: str, method: MergeMethod = "merge"
    ) -> MergeOutcome:
        if method not in MERGE_METHODS:
            raise InvalidInputError(field="method")
        url = f"{self._repo_url}/pulls/{_number(number)}/merge"
        body = {"sha": _sha(sha), "merge_method": method}
        reply = await self._call("PUT", url, body=body, passed=frozenset({405, 409}))
        if reply.status == 405:
            return MergeOutcome(merged=False, sha=None, refused="not_mergeable")
        if reply.status == 409:
            return MergeOutcome(merged=False, sha=None, refused="head_changed")
        payload = _object(reply.payload)
        if not _bool(payload, "merged"):
            return MergeOutcome(merged=False, sha=None, refused="not_mergeable")
        return MergeOutcome(merged=True, sha=_checked_sha(_str(payload, "sha")), refused=None)

    async def _pages(self, path: str, *, key: str | None) -> list[Any]:
        """All items of a paginated list (the body itself, or the list under ``key``)."""
        url = httpx.URL(f"{self._repo_url}{path}", params={"per_page": PER_PAGE})
        items: list[Any] = []
        for _ in range(MAX_PAGES):
            reply = await self._call("GET", url)
            page = reply.payload if key is None else _object(reply.payload).get(key)
            if not isinstance(page, list):
                _malformed("not_a_list")
            items.extend(page)
            if reply.next_url is None:
                return items
            url = reply.next_url
        _malformed("too_many_pages")

    async def _call(
        self,
        method: str,
        url: str | httpx.URL,
        *,
        body: dict[str, Any] | None = None,
        passed: frozenset[int] = frozenset(),
    ) -> _Reply:
        """One request; ``passed`` statuses return without reading the body."""
        try:
            async with asyncio.timeout(self._settings.timeout_seconds):
                request = self._client.build_request(
                    method, url, headers=self._headers(httpx.URL(url)), json=body
                )
                response = await self._client.send(request, stream=True)
                try:
                    status = response.status_code
                    if status in passed:
                        return _Reply(status=status, payload=None, next_url=None)
                    _check_status(status)
                    raw = await self._read_bounded(response)
                    next_url = self._next_url(response)
                finally:
                    await response.aclose()
        except UpstreamError:
            raise
        except (TimeoutError, httpx.TimeoutException):
            raise UpstreamError("Upstream timeout", outcome=OUTCOME_TIMEOUT) from None
        except (httpx.ProtocolError, httpx.DecodingError, httpx.InvalidURL) as exc:
            _malformed(type(exc).__name__)
        except (httpx.TransportError, OSError) as exc:  # connect, TLS, DNS, reset
            error = UpstreamError("Upstream unavailable", outcome=OUTCOME_UNAVAILABLE)
            error.facts["reason"] = type(exc).__name__
            raise error from None
        return _Reply(status=status, payload=_decode_json(raw), next_url=next_url)

    def _headers(self, url: httpx.URL) -> dict[str, str]:
        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": USER_AGENT,
            "Accept-Encoding": "identity",
        }
        token = self._settings.token
        if token is not None and _same_origin(url, self._base):
            headers["Authorization"] = f"Bearer {token.get_secret_value()}"
        return headers

    async def _read_bounded(self, response: httpx.Response) -> bytes:
        limit = self._settings.max_response_bytes
        encoding = response.headers.get("content-encoding", "").strip().lower()
        if encoding not in _IDENTITY_ENCODINGS:
            _malformed("encoded_response")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            _malformed("response_too_large")
        chunks: list[bytes] = []
        received = 0
        async for chunk in response.aiter_raw():
            received += len(chunk)
            if received > limit:
                _malformed("response_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    def _next_url(self, response: httpx.Response) -> httpx.URL | None:
        link = response.links.get("next")
        if link is None:
            return None
        target = response.request.url.join(link.get("url", ""))
        if not _same_origin(target, self._base) or target.userinfo:
            _malformed("foreign_next_link")
        return target


def _check_status(status: int) -> None:
    if 200 <= status < 300:
        return
    if 400 <= status < 600:
        error = UpstreamError.status(status)
        error.facts["outcome"] = OUTCOME_STATUS
        raise error from None
    _malformed("redirect" if 300 <= status < 400 else "unexpected_status")


def _parse_url(value: object) -> httpx.URL | None:
    try:
        return httpx.URL(value) if isinstance(value, str) else None
    except httpx.InvalidURL:
        return None


def _same_origin(url: httpx.URL, base: httpx.URL) -> bool:
    return (url.scheme, url.host, _port(url)) == (base.scheme, base.host, _port(base))


def _port(url: httpx.URL) -> int | None:
    return url.port if url.port is not None else _DEFAULT_PORTS.get(url.scheme)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _malformed(reason: str) -> NoReturn:
    error = UpstreamError("Upstream error", outcome=OUTCOME_MALFORMED)
    error.facts["reason"] = reason
    raise error from None


# --- strict JSON and typed fields -------------------------------------------------------


def _reject_constant(_name: str) -> NoReturn:
    raise ValueError("non-finite number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate key")
    return result


def _decode_json(raw: bytes) -> Any:
    try:
        return json.loads(
            raw.decode("utf-8"), parse_constant=_reject_constant, object_pairs_hook=_unique_keys
        )
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        _malformed("malformed_json")


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        _malformed("wrong_type")
    return value


def _str(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        _malformed("wrong_type")
    return value


def _opt_str(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return None if value is None else _str(obj, key)


def _int(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if type(value) is not int or value <= 0:
        _malformed("wrong_type")
    return value


def _bool(obj: dict[str, Any], key: str) -> bool:
    value = obj.get(key)
    if not isinstance(value, bool):
        _malformed("wrong_type")
    return value


def _checked_sha(value: str) -> str:
    if not _SHA.fullmatch(value):
        _malformed("wrong_type")
    return value


def _checked_url(value: str) -> str:
    # Shown to the agent as the pull request's address: a link, never free text.
    url = _parse_url(value)
    if url is None or url.scheme not in _DEFAULT_PORTS or not url.host or not value.isprintable():
        _malformed("wrong_type")
    if any(char.isspace() for char in value):
        _malformed("wrong_type")
    return value


def _to_pull(payload: Any) -> PullRequest:
    pull = _object(payload)
    head, base, user = (
        _object(pull.get("head")),
        _object(pull.get("base")),
        _object(pull.get("user")),
    )
    base_sha = _opt_str(base, "sha")
    mergeable = pull.get("mergeable")
    if mergeable is not None and not isinstance(mergeable, bool):
        _malformed("wrong_type")
    return PullRequest(
        number=_int(pull, "number"),
        state=_str(pull, "state"),
        merged=_bool(pull, "merged"),
        mergeable=mergeable,
        draft=_bool(pull, "draft"),
        head_ref=_str(head, "ref"),
        head_sha=_checked_sha(_str(head, "sha")),
        base_ref=_str(base, "ref"),
        html_url=_checked_url(_str(pull, "html_url")),
        user_login=_str(user, "login"),
        base_sha=None if base_sha is None else _checked_sha(base_sha),
    )


def _to_review(item: Any) -> Review:
    # A deleted account's review has ``user: null``: refused like any malformed entry, so
    # the merge fails closed rather than counting (or dropping) a reviewer it cannot name.
    review = _object(item)
    commit_id = _opt_str(review, "commit_id")
    return Review(
        user_login=_str(_object(review.get("user")), "login"),
        state=_str(review, "state"),
        commit_id=None if commit_id is None else _checked_sha(commit_id),
        submitted_at=_opt_str(review, "submitted_at"),
        id=_int(review, "id"),
    )


# --- caller input -----------------------------------------------------------------------


def _number(number: int) -> int:
    if type(number) is not int or number <= 0:
        raise InvalidInputError(field="number")
    return number


def _sha(sha: str) -> str:
    if not isinstance(sha, str) or not _SHA.fullmatch(sha):
        raise InvalidInputError(field="sha")
    return quote(sha, safe="")


def _ref(ref: str, field: str) -> str:
    if not isinstance(ref, str) or not ref or len(ref) > MAX_REF_LENGTH or not ref.isprintable():
        raise InvalidInputError(field=field)
    return ref


def _text(value: str, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(field=field)
    return value


def _flag(value: bool, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInputError(field=field)
    return value


__all__ = [
    "MAX_PAGES",
    "MERGE_METHODS",
    "PER_PAGE",
    "CheckRun",
    "ForgeClient",
    "ForgeSettings",
    "MergeMethod",
    "MergeOutcome",
    "PullRequest",
    "Review",
    "StatusContext",
]
