"""An HTTP "browser" for sign-in tests: an httpx client with its own cookie jar.

It follows an authorization request through redirects (across hosts: a proxy in front of the
identity provider is followed the same way) and through the login and consent forms, and stops
at the client's redirect URI without requesting it. One ``Browser`` is one person's user agent;
two of them keep two sessions (mix-up and session tests).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import urlencode, urljoin, urlsplit

import httpx

HTTP_TIMEOUT_S = 20.0
MAX_BROWSER_STEPS = 40
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class BrowserError(AssertionError):
    """The sign-in met a page it could not go on from (status, URL and the page's start)."""

    def __init__(self, message: str, response: httpx.Response | None = None) -> None:
        super().__init__(message)
        self.response = response


class LoginRefused(BrowserError):
    """The login form came back after the credentials were posted."""


@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)  # name -> value, as the page sets
    types: dict[str, str] = field(default_factory=dict)  # name -> input type

    @property
    def asks_password(self) -> bool:
        return "password" in self.types.values()


class _FormParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.forms: list[Form] = []
        self._current: Form | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag == "form":
            self._current = Form(values.get("action", ""), values.get("method", "get").upper())
            self.forms.append(self._current)
        elif tag in {"input", "button"} and self._current is not None and values.get("name"):
            kind = values.get("type", "text" if tag == "input" else "submit").lower()
            if kind in {"submit", "button"} and tag == "button":
                return
            self._current.fields[values["name"]] = values.get("value", "")
            self._current.types[values["name"]] = kind

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._current = None


def parse_forms(html: str) -> list[Form]:
    parser = _FormParser()
    parser.feed(html)
    return parser.forms


# on_page(response, browser) -> the next request, or None for the default handling.
PageHandler = Callable[[httpx.Response, "Browser"], httpx.Request | None]


class Browser:
    """An HTTP user agent with its own cookie jar: one per simulated person or device.

    Redirects are followed by hand (any host), so the sign-in can stop at the client's
    redirect URI without requesting it."""

    def __init__(self, *, timeout: float = HTTP_TIMEOUT_S) -> None:
        self.client = httpx.Client(follow_redirects=False, timeout=timeout)
        self.visited: list[tuple[str, str, int]] = []  # (method, url, status), in order

    @property
    def cookies(self) -> httpx.Cookies:
        return self.client.cookies

    def build_request(
        self, method: str, url: str, *, data: Mapping[str, str] | None = None
    ) -> httpx.Request:
        return self.client.build_request(method, url, data=data)

    def send(self, request: httpx.Request) -> httpx.Response:
        response = self.client.send(request)
        response.read()
        self.visited.append((request.method, str(request.url), response.status_code))
        return response

    def get(self, url: str) -> httpx.Response:
        return self.send(self.build_request("GET", url))

    def submit(
        self, response: httpx.Response, form: Form, values: Mapping[str, str]
    ) -> httpx.Request:
        """The request that submitting ``form`` of ``response``'s page with ``values`` makes."""
        action = urljoin(str(response.url), form.action or str(response.url))
        data = {**form.fields, **values}
        if form.method == "POST":
            return self.build_request("POST", action, data=data)
        return self.build_request("GET", f"{action.split('?', 1)[0]}?{urlencode(data)}")

    def sign_in(
        self,
        authorize_url: str,
        *,
        login: str,
        password: str,
        stop_at_prefix: str,
        on_page: PageHandler | None = None,
        provider_origin: str | None = None,
    ) -> str:
        """Follow ``authorize_url`` until a redirect to ``stop_at_prefix``; return its URL.

        A page with a password field gets ``login`` and ``password`` (once: the form again
        raises ``LoginRefused``); a page with one other form (a consent) is submitted as is.
        ``on_page`` sees every HTML page first, except the pages of ``provider_origin`` when it
        is given; it returns the next request, or None to let the default handling go on."""
        request = self.build_request("GET", authorize_url)
        posted_login = False
        for _ in range(MAX_BROWSER_STEPS):
            response = self.send(request)
            if response.status_code in REDIRECT_STATUSES:
                location = urljoin(str(response.url), str(response.headers.get("location", "")))
                if location.startswith(stop_at_prefix):
                    return location
                request = self._redirected(request, response.status_code, location)
                continue
            if response.status_code != 200 or "html" not in response.headers.get(
                "content-type", ""
            ):
                raise BrowserError(_describe(response), response)
            origin = _origin(str(response.url))
            if on_page is not None and (provider_origin is None or origin != provider_origin):
                handled = on_page(response, self)
                if handled is not None:
                    request = handled
                    continue
            forms = parse_forms(response.text)
            login_form = next((form for form in forms if form.asks_password), None)
            if login_form is not None:
                if posted_login:
                    raise LoginRefused("the login form came back: credentials refused", response)
                posted_login = True
                request = self.submit(
                    response, login_form, _credentials(login_form, login, password)
                )
            elif len(forms) == 1:
                request = self.submit(response, forms[0], {})
            else:
                raise BrowserError(f"no form to go on with: {_describe(response)}", response)
        raise BrowserError(f"no redirect to {stop_at_prefix} in {MAX_BROWSER_STEPS} steps")

    def _redirected(self, request: httpx.Request, status: int, location: str) -> httpx.Request:
        if status in {307, 308}:  # same method and body
            headers = {"content-type": request.headers.get("content-type", "")}
            return self.client.build_request(
                request.method, location, content=request.content, headers=headers
            )
        return self.build_request("GET", location)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _credentials(form: Form, login: str, password: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for name, kind in form.types.items():
        if kind == "password":
            values[name] = password
        elif kind in {"text", "email"} and name not in values:
            values[name] = login
    return values


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _describe(response: httpx.Response) -> str:
    return f"{response.status_code} at {response.request.url}: {response.text[:500]!r}"


def browser_login(
    authorize_url: str,
    *,
    login: str,
    password: str,
    stop_at_prefix: str,
    client: Browser | None = None,
    on_page: PageHandler | None = None,
    provider_origin: str | None = None,
) -> str:
    """``Browser.sign_in`` with ``client`` (a fresh browser when None); see there."""
    if client is not None:
        return client.sign_in(
            authorize_url,
            login=login,
            password=password,
            stop_at_prefix=stop_at_prefix,
            on_page=on_page,
            provider_origin=provider_origin,
        )
    with Browser() as browser:
        return browser.sign_in(
            authorize_url,
            login=login,
            password=password,
            stop_at_prefix=stop_at_prefix,
            on_page=on_page,
            provider_origin=provider_origin,
        )
