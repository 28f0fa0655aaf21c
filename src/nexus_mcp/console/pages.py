"""What every console page shares: rendering, the signed-in user, role checks, the audit.

Pages are Jinja2 templates (a maintained engine, autoescaping every value); text that came
from outside (tool names and descriptions, paths, subjects, previews) also has its control
and bidirectional-formatting characters shown as ``\\u{...}``, so a name cannot hide
what it is or reorder what an approver reads. Every refusal is a fixed page naming the
rule, never the request's words, and every action and refusal is audited.
"""

from __future__ import annotations

import asyncio
import re
import time
import unicodedata
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from nexus_mcp._version import __version__
from nexus_mcp.console.security import (
    CONSOLE_PATH,
    SECURITY_HEADERS,
    ConsoleUser,
    cookie_name,
    csrf_ok,
    public_origin,
    same_origin,
    session_jti,
)
from nexus_mcp.console.services import ConsoleServices
from nexus_mcp.errors import UnavailableError
from nexus_mcp.ids import new_id
from nexus_mcp.observability.audit import AuditEvent
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.approval_requests import span_text
from nexus_mcp.policy.console import allows, console_role

log = get_logger(__name__)
PREFIX = CONSOLE_PATH
MAX_FORM_BYTES = 64 * 1024
NAV = (
    ("inbox", "Inbox"),
    ("pins", "Upstream pins"),
    ("access", "Access"),
    ("audit", "Audit"),
    ("health", "Health"),
)
_KEEP_IN_BLOCKS = frozenset("\n\t")


def shown(value: object, *, block: bool = False) -> str:
    """Text from outside as a person may safely read it (escaping is Jinja's job)."""
    text = "" if value is None else str(value)
    out: list[str] = []
    for char in text:
        if block and char in _KEEP_IN_BLOCKS:
            out.append(char)
        elif unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(f"\\u{{{ord(char):04x}}}")
        else:
            out.append(char)
    return "".join(out)


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def build_templates() -> Environment:
    env = Environment(
        loader=PackageLoader("nexus_mcp.console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shown"] = shown
    env.filters["block"] = lambda value: shown(value, block=True)
    env.filters["when"] = _when
    env.filters["span"] = span_text
    return env


class Console:
    """The console's request helpers, bound to its services."""

    def __init__(self, services: ConsoleServices) -> None:
        self.services = services
        self.templates = build_templates()
        # Where people reach the console behind a proxy (``auth.base_url``), if set.
        self.public = public_origin(services.settings.auth.base_url)

    # -- who is asking -------------------------------------------------------------

    async def user(self, request: Request, *, in_outage: bool = False) -> ConsoleUser | None:
        """The signed-in person, or None. While the nonce store is unreachable a session
        cannot be told from a signed-out one: ``UnavailableError``, unless ``in_outage``
        (the health page, which an operator needs most then)."""
        cookie = request.cookies.get(cookie_name(request, self.public))
        user = self.services.keys.read_session(cookie)
        if user is None:
            return None
        # Signed out (or revoked): the session's id is spent in the nonce store, which
        # every replica shares, so a copy of the cookie is refused too.
        try:
            spent = await asyncio.to_thread(self.services.state.nonces.spent, session_jti(user))
        except UnavailableError:
            if not in_outage:
                raise
            log.warning("console_session_unchecked", reason="state_store_unavailable")
            spent = False
        if spent:
            return None
        # The console role the person's role has *now*, not the one the cookie was signed
        # with: a narrowed ``console.*`` mapping takes effect on sessions already open.
        services = self.services
        current = console_role(user.role, services.settings.console, services.approver_roles)
        if current is None:
            return None
        return user if current == user.console_role else replace(user, console_role=current)

    async def require(
        self, request: Request, action: str, *, in_outage: bool = False
    ) -> ConsoleUser | Response:
        """The signed-in user allowed to take ``action``, or the response that refuses."""
        try:
            user = await self.user(request, in_outage=in_outage)
        except UnavailableError:
            return self.refuse(
                request,
                None,
                503,
                "the state store is unavailable: try again shortly",
                code="state_unavailable",
            )
        if user is None:
            if request.method == "GET":
                return RedirectResponse(f"{PREFIX}/signin", status_code=303, headers=_NO_STORE)
            return self.refuse(request, None, 401, "sign in first", code="not_signed_in")
        if not allows(user.console_role, action):
            return self.refuse(
                request, user, 403, f"your console role may not {_VERBS[action]}", code="role"
            )
        return user

    async def posted(
        self, request: Request, action: str
    ) -> tuple[ConsoleUser, Mapping[str, Any]] | Response:
        """A state-changing form (``form``) from a user allowed to take ``action``
        (``require``), or the response that refuses: every console POST starts here."""
        user = await self.require(request, action)
        if isinstance(user, Response):
            return user
        form = await self.form(request, user)
        if isinstance(form, Response):
            return form
        return user, form

    async def form(self, request: Request, user: ConsoleUser) -> Mapping[str, Any] | Response:
        """A state-changing form from the console's own page, or the refusal."""
        if not same_origin(request, self.public):
            return self.refuse(request, user, 403, "cross-site request refused", code="origin")
        length = request.headers.get("content-length")
        if length is not None and (
            not (length.isascii() and length.isdigit()) or int(length) > MAX_FORM_BYTES
        ):
            return self.refuse(request, user, 413, "form too large", code="too_large")
        try:
            async with request.form(max_files=0, max_fields=20, max_part_size=MAX_FORM_BYTES) as f:
                values = {k: v for k, v in f.items() if isinstance(v, str)}
        except Exception:  # noqa: BLE001 - any malformed body is the same refusal
            return self.refuse(request, user, 400, "malformed form", code="malformed")
        if not csrf_ok(user, values.get("csrf")):
            return self.refuse(request, user, 403, "the form expired: reload the page", code="csrf")
        return values

    # -- answers -------------------------------------------------------------------

    def render(
        self,
        request: Request,
        template: str,
        user: ConsoleUser | None,
        *,
        status: int = 200,
        page: str | None = None,
        **context: Any,
    ) -> HTMLResponse:
        body = self.templates.get_template(template).render(
            user=user,
            page=page,
            nav=NAV,
            prefix=PREFIX,
            version=__version__,
            can=(lambda action: user is not None and allows(user.console_role, action)),
            host=self.services.host,
            **context,
        )
        return HTMLResponse(body, status_code=status, headers=dict(SECURITY_HEADERS))

    def refuse(
        self,
        request: Request,
        user: ConsoleUser | None,
        status: int,
        message: str,
        *,
        code: str,
    ) -> HTMLResponse:
        self.audit(
            "console_refused",
            user,
            tool="console",
            outcome="REFUSED",
            reason=code,
            facts={"path": _plain_path(request.url.path), "method": request.method[:16]},
        )
        return self.render(request, "refused.html", user, status=status, message=message)

    def audit(self, event: str, user: ConsoleUser | None, *, tool: str, **fields: Any) -> None:
        """One console action in the server's audit log (``transport`` ``console``)."""
        record_id = fields.pop("tool_call_id", None) or new_id()
        fields.setdefault("subject", user.log_subject if user is not None else None)
        fields.setdefault("role", user.role if user is not None else None)
        self.services.audit.emit(
            AuditEvent(
                event=event,
                tool_call_id=record_id,
                correlation_id=fields.pop("correlation_id", None) or record_id,
                tool=tool,
                transport="console",
                host_id=f"console:{self.services.host}",
                **fields,
            )
        )


_NO_STORE = {"Cache-Control": "no-store"}
_PLAIN_PATH = re.compile(r"/console(/[A-Za-z0-9_.-]{1,64}){0,4}/?")


def _plain_path(path: str) -> str:
    """The console path refused, for the audit; anything unusual is not copied there."""
    return path if _PLAIN_PATH.fullmatch(path) else "/console/(other)"


_VERBS = {
    "read": "read the console",
    "decide": "decide approval requests",
    "repin": "re-pin upstream tools",
    "grant": "change grants",
}

__all__ = ["NAV", "PREFIX", "Console", "build_templates", "shown"]
