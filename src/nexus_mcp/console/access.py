"""Access: the profiles, the subjects with grants, and assigning or revoking them.

The same operations on the same store as ``nexus-mcp profiles assign|revoke``
(``policy/grant_admin.py``): assigning makes a profile the subject's own, revoking removes
the profile's grants and the assignment (the subject falls back to its principal's or its
role's profile) or one direct grant. A resource source (``notes``, an upstream's id) or a
prompt is granted or revoked directly as ``nexus-mcp profiles grant|revoke --resource`` or
``--prompt`` does (``grant_admin.item_object``, ``known_item``, ``grant_item``,
``revoke_item``). Only console admins change grants; each change is audited as
``grant_changed`` and, inside the server, reaches its visible-tools, resources and prompts
caches at once, so the agent's next ``tools/list``, ``resources/list`` and
``prompts/list`` follow (other replicas hear of it through the shared backend, as for the
CLI). Subjects that look like credentials are shown hashed, as in the audit log, and the
list's forms name them by that form, never the raw value.
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
    ITEM_KINDS,
    MAX_SUBJECT_CHARS,
    ItemKind,
    assign,
    grant_item,
    item_object,
    known_item,
    known_profile,
    revoke_direct,
    revoke_item,
    revoke_profile,
    valid_subject,
)
from nexus_mcp.policy.grants import (
    DIRECT_RELATION,
    PROFILE_RELATION,
    GrantSource,
    list_tool_grants,
)
from nexus_mcp.policy.profiles import (
    PROFILE_NAME_RE,
    TOOL_NAME_RE,
    ToolProfileConfig,
    default_profiles_path,
    load_profiles,
)
from nexus_mcp.policy.tuples import PROMPTS_PREFIX, RESOURCES_PREFIX, TupleStore
from nexus_mcp.principal import to_log_subject

MAX_SUBJECTS = 500
GRANT_CHANGED = "grant_changed"
UNKNOWN_PROFILE = "unknown profile: choose one of the profiles listed on this page"
BAD_SUBJECT = (
    f"a subject is 1 to {MAX_SUBJECT_CHARS} printable characters without spaces "
    "(a token's 'sub' claim)"
)
UNKNOWN_SUBJECT = "no such subject with grants"
UNKNOWN_ITEM = {
    "resource": "no profile names this resource source and no configured upstream has this id",
    "prompt": "no profile names this prompt and it has no configured upstream's name prefix",
}
_PREFIXES: dict[ItemKind, str] = {"resource": RESOURCES_PREFIX, "prompt": PROMPTS_PREFIX}


@dataclass(frozen=True)
class SubjectRow:
    shown: str  # as the audit log shows it (hashed when it looks like a credential)
    assignment: str | None
    profile_tools: int
    direct: tuple[str, ...]
    # Resource sources and prompts: (kind, name, its sources: "profile", "direct").
    items: tuple[tuple[ItemKind, str, tuple[str, ...]], ...] = ()


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
                    items=item_grants(subject),
                )
            )
        return rows, len(names) > MAX_SUBJECTS

    def item_grants(subject: str) -> tuple[tuple[ItemKind, str, tuple[str, ...]], ...]:
        """The subject's resource sources and prompts, each with where it comes from."""
        rows = []
        for kind in ITEM_KINDS:
            prefix = _PREFIXES[kind]
            sources: dict[str, list[str]] = {}
            for relation, source in (
                (PROFILE_RELATION, GrantSource.PROFILE),
                (DIRECT_RELATION, GrantSource.DIRECT),
            ):
                for obj in store.list_objects(subject, relation, zone, prefix):
                    sources.setdefault(obj.removeprefix(prefix), []).append(source.value)
            rows += [(kind, name, tuple(sources[name])) for name in sorted(sources)]
        return tuple(rows)

    def upstreams() -> tuple[list[str], list[str]]:
        """The configured upstreams' ids (resource sources) and name prefixes (prompts)."""
        pins = services.pins
        servers = pins.context.config.servers if pins is not None else ()
        return [u.server_id for u in servers], [u.name_prefix for u in servers]

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

    async def grant_item_route(request: Request) -> Response:
        posted = await console.posted(request, "grant")
        if isinstance(posted, Response):
            return posted
        user, form = posted
        subject = (form.get("subject") or "").strip()
        kind, name = form.get("kind", ""), form.get("name", "")
        if not valid_subject(subject):
            return console.refuse(request, user, 400, BAD_SUBJECT, code="subject")
        which = item_kind(request, user, kind, name)
        if isinstance(which, Response):
            return which
        config = await asyncio.to_thread(profiles)
        ids, prefixes = upstreams()
        if not known_item(config, which, name, upstream_ids=ids, prompt_prefixes=prefixes):
            return console.refuse(
                request, user, 404, f"{UNKNOWN_ITEM[which]} (NOT_FOUND)", code="not_found"
            )
        revision = await asyncio.to_thread(grant_item, store, subject, which, name, zone)
        changed(user, f"grant_{which}", subject, revision, item=(which, name))
        return RedirectResponse(f"{PREFIX}/access?done=granted", status_code=303)

    async def revoke_item_route(request: Request) -> Response:
        posted = await console.posted(request, "grant")
        if isinstance(posted, Response):
            return posted
        user, form = posted
        subject = await asyncio.to_thread(by_shown, form.get("subject") or "")
        if subject is None:
            return console.refuse(request, user, 404, UNKNOWN_SUBJECT, code="unknown_subject")
        kind, name = form.get("kind", ""), form.get("name", "")
        which = item_kind(request, user, kind, name)
        if isinstance(which, Response):
            return which
        revoked = await asyncio.to_thread(revoke_item, store, subject, which, name, zone)
        changed(user, f"revoke_{which}", subject, revoked.revision, item=(which, name))
        done = "revoked_item_still" if revoked.still_from_profile else "revoked"
        return RedirectResponse(f"{PREFIX}/access?done={done}", status_code=303)

    def item_kind(request: Request, user: ConsoleUser, kind: str, name: str) -> ItemKind | Response:
        """The kind of a posted item grant, once its form holds a kind and a well-formed
        name (``INVALID_INPUT`` names the field, never the value); else the refusal."""
        if kind not in ITEM_KINDS:
            return console.refuse(request, user, 400, "not a kind of grant", code="kind")
        which: ItemKind = "prompt" if kind == "prompt" else "resource"
        try:
            item_object(which, name)
        except NexusError as exc:
            return console.refuse(
                request, user, 400, f"{exc.message} ({exc.code})", code=str(exc.code).lower()
            )
        return which

    def changed(
        user: ConsoleUser,
        action: str,
        subject: str,
        revision: int,
        *,
        profile: str | None = None,
        tool_name: str | None = None,
        item: tuple[ItemKind, str] | None = None,
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
        if item is not None:  # checked by ``item_object`` before anything was written
            facts[f"{item[0]}_name"] = item[1]
        console.audit(GRANT_CHANGED, user, tool="console", outcome="OK", facts=facts)
        if services.on_grants_changed is not None:
            services.on_grants_changed(zone)

    return [
        Route(f"{PREFIX}/access", page, methods=["GET"]),
        Route(f"{PREFIX}/access/assign", assign_route, methods=["POST"]),
        Route(f"{PREFIX}/access/revoke", revoke_route, methods=["POST"]),
        Route(f"{PREFIX}/access/grant-item", grant_item_route, methods=["POST"]),
        Route(f"{PREFIX}/access/revoke-item", revoke_item_route, methods=["POST"]),
    ]


_DONE = {
    "assigned": "Profile assigned. The subject's next tools/list shows its tools.",
    "revoked": "Revoked. The subject's next tools/list no longer shows what it granted.",
    "revoked_still": "Direct grant revoked; the tool stays visible through the subject's profile.",
    "granted": (
        "Granted. The subject's next resources/list or prompts/list shows what it granted."
    ),
    "revoked_item_still": ("Direct grant revoked; it stays visible through the subject's profile."),
}

__all__ = ["GRANT_CHANGED", "routes"]
