"""Signing in and out of the console.

Two ways in, both ending in the same signed session cookie (``security.py``):

- the team's identity provider (``oidc.py``), when the server has one: the person's
  claims go through the server's claims mapping, and their role picks the console role;
- a one-time login link for the local admin, printed by ``nexus-mcp console``: ``GET``
  shows a button and spends nothing (a link preview or a prefetch cannot use it up);
  the ``POST`` from that page spends the link's id in the nonce store, once.
"""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from nexus_mcp.console.pages import PREFIX, Console
from nexus_mcp.console.security import (
    LOGIN_JTI_PREFIX,
    SESSION_COOKIE,
    ConsoleUser,
    policy_with_form_action,
    same_origin,
    session_jti,
)
from nexus_mcp.policy.console import LOGIN_LINK_TTL_SECONDS, console_role
from nexus_mcp.principal import to_log_subject


def start_session(
    console: Console,
    request: Request,
    *,
    subject: str,
    role: str,
    via: str,
    landing: Response | None = None,
) -> Response:
    """Sign ``subject`` in (their console role from ``role``) and go to the inbox.

    ``landing`` is the answer that carries the session cookie (default: a redirect to the
    inbox); the identity provider's callback sends a same-origin page instead (``oidc.py``).
    """
    services = console.services
    granted = console_role(role, services.settings.console, services.approver_roles)
    if granted is None:
        return console.refuse(
            request, None, 403, "your role has no access to the console", code="no_console_role"
        )
    user, cookie = services.keys.new_session(
        subject=subject,
        log_subject=to_log_subject(subject),
        role=role,
        console_role=granted,
        via=via,
    )
    console.audit("console_signed_in", user, tool="console", outcome="OK", facts={"via": via})
    response = landing or RedirectResponse(f"{PREFIX}/inbox", status_code=303)
    SESSION_COOKIE.set(response, request, cookie, services.keys.session_ttl_seconds, console.public)
    return response


def routes(console: Console) -> list[Route]:
    services = console.services

    async def signin(request: Request) -> Response:
        if await console.user(request, in_outage=True) is not None:
            return RedirectResponse(f"{PREFIX}/inbox", status_code=303)
        page = console.render(
            request,
            "signin.html",
            None,
            provider=services.sign_in is not None,
        )
        # The button's redirect to the identity provider is held to form-action too.
        origin = getattr(services.sign_in, "authorization_origin", None)
        if isinstance(origin, str):
            page.headers["Content-Security-Policy"] = policy_with_form_action(origin)
        return page

    async def login_page(request: Request) -> Response:
        token = request.query_params.get("t")
        if services.keys.read_link(token) is None:
            return console.refuse(
                request, None, 403, "this login link is not valid or has expired", code="link"
            )
        return console.render(request, "login.html", None, token=token)

    async def login(request: Request) -> Response:
        if not same_origin(request, console.public):
            return console.refuse(request, None, 403, "cross-site request refused", code="origin")
        try:
            async with request.form(max_files=0, max_fields=4, max_part_size=4096) as form:
                token = form.get("t")
        except Exception:  # noqa: BLE001 - a malformed body is a bad link like any other
            token = None
        claims = services.keys.read_link(token if isinstance(token, str) else None)
        spent = claims is not None and services.state.nonces.consume(
            LOGIN_JTI_PREFIX + claims["jti"], time.time() + LOGIN_LINK_TTL_SECONDS + 60
        )
        if claims is None or not spent:
            return console.refuse(
                request, None, 403, "this login link is not valid or was used", code="link"
            )
        return start_session(
            console, request, subject=claims["sub"], role=claims["role"], via="link"
        )

    async def logout(request: Request) -> Response:
        user = await console.user(request)
        if user is None:
            return RedirectResponse(f"{PREFIX}/signin", status_code=303)
        form = await console.form(request, user)
        if isinstance(form, Response):
            return form
        # The cookie is signed, not stored: its id is spent so no copy of it works again.
        await asyncio.to_thread(
            services.state.nonces.consume,
            session_jti(user),
            user.signed_in_at + services.keys.session_ttl_seconds + 60,
        )
        console.audit("console_signed_out", user, tool="console", outcome="OK")
        response = RedirectResponse(f"{PREFIX}/signin", status_code=303)
        SESSION_COOKIE.clear(response, request, console.public)
        return response

    async def index(request: Request) -> Response:
        return RedirectResponse(f"{PREFIX}/inbox", status_code=303)

    return [
        Route(PREFIX, index, methods=["GET"]),
        Route(f"{PREFIX}/", index, methods=["GET"]),
        Route(f"{PREFIX}/signin", signin, methods=["GET"]),
        Route(f"{PREFIX}/login", login_page, methods=["GET"]),
        Route(f"{PREFIX}/login", login, methods=["POST"]),
        Route(f"{PREFIX}/logout", logout, methods=["POST"]),
    ]


__all__ = ["ConsoleUser", "routes", "start_session"]
