"""Access: the profiles, the subjects with grants, and assigning or revoking them.

The same operations on the same store as ``nexus-mcp profiles assign|revoke``
(``policy/grant_admin.py``): assigning makes a profile the subject's own, revoking removes
the profile's grants and the assignment (the subject falls back to its principal's or its
role's profile) or one direct grant. Only console admins change grants; each change is
audited as ``grant_changed`` and, inside the server, reaches its visible-tools cache at
once, so the agent's next ``tools/list`` follows (other replicas hear of it through the
shared backend, as for the CLI). Subjects that look like credentials are shown hashed, as
in the audit log, and the list's forms name them by that form, never the raw value.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from nexus_mcp.console.pages import PREFIX, Console
from nexus_mcp.console.security import ConsoleUser
from nexus_mcp.errors import NexusError
from nexus_mcp.identity.access import PROFILE_SUBJECT_PREFIX
from nexus_mcp.policy.grant_admin import (
    MAX_SUBJECT_CHARS,
    assign,
    known_profile,
    revoke_direct,
    revoke_profile,
    valid_subject,
)
from nexus_mcp.policy.grants import GrantSource, list_tool_grants
from nexus_mcp.policy.profiles import (
    PROFILE_NAME_RE,
    TOOL_NAME_RE,
    ToolProfileConfig,
    default_profiles_path,
    load_profiles,
)
from nexus_mcp.policy.tuples import TupleStore
from nexus_mcp.principal import to_log_subject

MAX_SUBJECTS = 500
GRANT_CHANGED = "grant_changed"
UNKNOWN_PROFILE = "unknown profile: choose one of the profiles listed on this page"
BAD_SUBJECT = (
    f"a subject is 1 to {MAX_SUBJECT_CHARS} printable characters without spaces "
    "(a token's 'sub' claim)"
)
UNKNOWN_SUBJECT = "no such subject with grants"


@dataclass(frozen=True)
class SubjectRow:
    shown: str  # as the audit log shows it (hashed when it looks like a credential)
    assignment: str | None
    profile_tools: int
    direct: tuple[str, ...]


def routes(console: Console) -> list[Route]:
    services = console.services
    store: TupleStore = services.state.grants
    zone = services.settings.profiles.zone

    def profiles() -> ToolProfileConfig:
        if services.profiles is not None:
            return services.profiles
        return load_profiles(services.settings.profiles.file or default_profiles_path())

    def subjects() -> tuple[list[SubjectRow], bool]:
        names = [s for s in store.list_subjects(zone) if not s.startswith(PROFILE_SUBJECT_PREFIX)]
        rows = []
        for subject in sorted(names)[:MAX_SUBJECTS]:
            grants = list_tool_grants(store, subject, zone)
            rows.append(
                SubjectRow(
                    shown=to_log_subject(subject),
                    assignment=store.get_assignment(subject, zone),
                    profile_tools=sum(GrantSource.PROFILE in g.sources for g in grants),
                    direct=tuple(g.tool for g in grants if GrantSource.DIRECT in g.sources),
                )
            )
        return rows, len(names) > MAX_SUBJECTS

    def by_shown(shown: str) -> str | None:
        """The stored subject a list form names (by its shown form)."""
        if not valid_subject(shown):
            return None
        for subject in store.list_subjects(zone):
            if not subject.startswith(PROFILE_SUBJECT_PREFIX) and to_log_subject(subject) == shown:
                return subject
        return None

    async def page(request: Request) -> Response:
        user = await console.require(request, "read")
        if isinstance(user, Response):
            return user
        config = await asyncio.to_thread(profiles)
        rows, capped = await asyncio.to_thread(subjects)
        done = request.query_params.get("done")
        return console.render(
            request,
            "access.html",
            user,
            page="access",
            config=config,
            subjects=rows,
            capped=capped,
            max_subjects=MAX_SUBJECTS,
            zone=zone,
            done=done if done in _DONE else None,
            done_text=_DONE.get(done or ""),
        )

    async def assign_route(request: Request) -> Response:
        posted = await console.posted(request, "grant")
        if isinstance(posted, Response):
            return posted
        user, form = posted
        subject = (form.get("subject") or "").strip()
        profile = form.get("profile") or ""
        if not valid_subject(subject):
            return console.refuse(request, user, 400, BAD_SUBJECT, code="subject")
        config = await asyncio.to_thread(profiles)
        if not known_profile(config, profile):
            return console.refuse(request, user, 400, UNKNOWN_PROFILE, code="unknown_profile")
        try:
            revision = await asyncio.to_thread(assign, store, config, subject, profile, zone)
        except NexusError:
            return console.refuse(request, user, 400, UNKNOWN_PROFILE, code="unknown_profile")
        changed(user, "assign", subject, revision, profile=profile)
        return RedirectResponse(f"{PREFIX}/access?done=assigned", status_code=303)

    async def revoke_route(request: Request) -> Response:
        posted = await console.posted(request, "grant")
        if isinstance(posted, Response):
            return posted
        user, form = posted
        subject = await asyncio.to_thread(by_shown, form.get("subject") or "")
        if subject is None:
            return console.refuse(request, user, 404, UNKNOWN_SUBJECT, code="unknown_subject")
        tool = form.get("tool")
        if tool is None:
            revision = await asyncio.to_thread(revoke_profile, store, subject, zone)
            changed(user, "revoke_profile", subject, revision)
            return RedirectResponse(f"{PREFIX}/access?done=revoked", status_code=303)
        if not TOOL_NAME_RE.fullmatch(tool):
            return console.refuse(request, user, 400, "not a tool name", code="tool")
        revoked = await asyncio.to_thread(revoke_direct, store, subject, tool, zone)
        changed(user, "revoke_tool", subject, revoked.revision, tool_name=tool)
        done = "revoked_still" if revoked.still_from_profile else "revoked"
        return RedirectResponse(f"{PREFIX}/access?done={done}", status_code=303)

    def changed(
        user: ConsoleUser,
        action: str,
        subject: str,
        revision: int,
        *,
        profile: str | None = None,
        tool_name: str | None = None,
    ) -> None:
        facts: dict[str, object] = {
            "action": action,
            "grantee": to_log_subject(subject),
            "zone": zone,
            "revision": revision,
        }
        if profile is not None and PROFILE_NAME_RE.fullmatch(profile):
            facts["profile"] = profile
        if tool_name is not None:
            facts["tool_name"] = tool_name
        console.audit(GRANT_CHANGED, user, tool="console", outcome="OK", facts=facts)
        if services.on_grants_changed is not None:
            services.on_grants_changed(zone)

    return [
        Route(f"{PREFIX}/access", page, methods=["GET"]),
        Route(f"{PREFIX}/access/assign", assign_route, methods=["POST"]),
        Route(f"{PREFIX}/access/revoke", revoke_route, methods=["POST"]),
    ]


_DONE = {
    "assigned": "Profile assigned. The subject's next tools/list shows its tools.",
    "revoked": "Revoked. The subject's next tools/list no longer shows what it granted.",
    "revoked_still": "Direct grant revoked; the tool stays visible through the subject's profile.",
}

__all__ = ["GRANT_CHANGED", "routes"]
