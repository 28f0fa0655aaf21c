"""Information flow: each tool's flow labels, and the decision on an egress call (issue 28).

A tool carries up to three labels, kept in configuration beside the registry (the seed's
registry schema is unchanged):

- ``reads_private``: its result holds the team's own data (the caller's notes, the
  workspace, the team's repositories);
- ``reads_untrusted``: its result holds content written by outsiders (issues, web pages,
  mail, other people's notes), which may carry instructions to the agent;
- ``egress``: it sends data beyond the team (a push, a pull request, the web, mail).

The chain keeps, per session (per principal where the protocol has no session), which
labels the calls that ran have touched (``stores/flow_taint.py``). An agent that has read
private data and untrusted content and then calls an egress tool is the "lethal trifecta":
the untrusted text can tell it to send the private data out. The flow policy refuses that
call (``deny``, ``FLOW_DENIED``), or holds it for an approver who is shown which earlier
calls tainted the session, by id and tool, never their content (``approve``).

What counts, for an egress call: ``reads_private`` touched by an earlier call *or* by this
call itself (an egress tool that reads private data sends it in the same step), and
``reads_untrusted`` touched by an earlier call (untrusted text this call reads itself
arrives after the call was made; it taints the session for the next one).

Labels: ``NATIVE_LABELS`` is the documented default of every native tool; ``flow.labels``
in ``nexus.yaml`` replaces a tool's labels (``tool`` for a native tool, ``server/tool``
for an upstream tool, ``server/*`` for every tool of an upstream without its own entry;
``[]`` is "no labels"). A tool with no labels anywhere counts as all three in prod (an
upstream tool nobody described may do anything) and as none in dev.

Pure decisions: no FastMCP, no store; the middleware adapts (``middleware/flow.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from nexus_mcp.policy.config_errors import Loc, problem_line, problems_from, refuse, render_key
from nexus_mcp.policy.upstreams import SERVER_ID_RE

CONFIG_LOCATION = "flow"
READS_PRIVATE = "reads_private"
READS_UNTRUSTED = "reads_untrusted"
EGRESS = "egress"
LABELS = (READS_PRIVATE, READS_UNTRUSTED, EGRESS)
ALL_LABELS = frozenset(LABELS)
NO_LABELS: frozenset[str] = frozenset()

POLICY_DENY = "deny"
POLICY_APPROVE = "approve"
POLICY_OFF = "off"
# The rule a flow refusal or hold is audited under (the call's ``policy_rule``).
FLOW_RULE = "flow_egress"
DEFAULT_TAINT_TTL_SECONDS = 86_400.0
MAX_TAINT_TTL_SECONDS = 30 * 86_400.0
WILDCARD = "*"
_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")

Label = Literal["reads_private", "reads_untrusted", "egress"]

_PRIVATE = frozenset({READS_PRIVATE})
_EGRESS = frozenset({EGRESS})

# The native tools' labels (the table in docs/flow.md). Listing file names and reading a
# repository's content are private reads too: names and code are the team's own.
# Workspace writes and local repository writes stay inside the team (no label); only the
# forge calls send anything out. A team whose workspace or repositories hold outsiders'
# content (downloaded pages, forks' pull requests) adds reads_untrusted in flow.labels.
NATIVE_LABELS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        # files (the workspace)
        "nexus_read_file": _PRIVATE,
        "nexus_list_files": _PRIVATE,
        "nexus_file_info": _PRIVATE,
        "nexus_glob": _PRIVATE,
        "nexus_grep": _PRIVATE,
        "nexus_write_file": NO_LABELS,
        "nexus_edit_file": NO_LABELS,
        "nexus_delete_file": NO_LABELS,
        "nexus_mkdir": NO_LABELS,
        "nexus_rmdir": NO_LABELS,
        "nexus_rename_file": NO_LABELS,
        # notes (the caller's own vault)
        "get_note_outline": _PRIVATE,
        "get_document_tree": _PRIVATE,
        "get_metadata_facets": _PRIVATE,
        "get_section_source": _PRIVATE,
        # discovery (tool metadata the caller is granted)
        "nexus_discovery_search_tools": NO_LABELS,
        "nexus_discovery_list_servers": NO_LABELS,
        "nexus_discovery_get_tool_details": NO_LABELS,
        "nexus_discovery_load_tools": NO_LABELS,
        # repo (the team's repositories; the forge is beyond the team)
        "list_repo_files": _PRIVATE,
        "read_repo_file": _PRIVATE,
        "search_content": _PRIVATE,
        "locate_component": _PRIVATE,
        "propose_patch": _PRIVATE,
        "create_branch": NO_LABELS,
        "apply_patch": NO_LABELS,
        "open_pull_request": _EGRESS,
        "merge_guarded": _EGRESS,
    }
)


class FlowSection(BaseModel):
    """The ``flow`` section of ``nexus.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["deny", "approve", "off"] = Field(
        default="deny",
        description=(
            "an egress call after private and untrusted reads in one session: deny "
            "(FLOW_DENIED), approve (an approval request shows the approver why), off"
        ),
    )
    labels: dict[StrictStr, tuple[Label, ...]] = Field(
        default_factory=dict,
        description=(
            "tool -> its flow labels, replacing the defaults: a native tool's name, "
            "server/tool for an upstream tool, server/* for all of an upstream's tools"
        ),
    )
    taint_ttl_seconds: float = Field(
        default=DEFAULT_TAINT_TTL_SECONDS,
        gt=0,
        le=MAX_TAINT_TTL_SECONDS,
        description="how long a session's taint is kept after its last labelled call",
    )


@dataclass(frozen=True)
class FlowConfig:
    """The validated section. Without a ``flow`` section the policy is ``off``."""

    policy: str = POLICY_OFF
    labels: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    taint_ttl_seconds: float = DEFAULT_TAINT_TTL_SECONDS
    mode: str = "prod"

    @property
    def enabled(self) -> bool:
        return self.policy != POLICY_OFF


@dataclass(frozen=True, slots=True)
class TaintSource:
    """The call that first touched a label in a session: its id and the tool's name."""

    tool_call_id: str
    tool: str


# label -> the call that first touched it
Taint = Mapping[str, TaintSource]


@dataclass(frozen=True)
class FlowHold:
    """An egress call the policy stops: ``action`` deny or approve, and why."""

    action: str
    sources: tuple[tuple[str, TaintSource], ...]
    # This very call reads private data (its own reads_private label).
    reads_private_itself: bool = False


def load_flow_config(
    raw: Any,
    *,
    mode: str,
    native_tools: Iterable[str] = (),
    upstream_ids: Iterable[str] = (),
    upstream_tools: Mapping[str, Iterable[str]] | None = None,
    source: Path | None = None,
) -> FlowConfig:
    """Validate the ``flow`` section; a problem names its place, never the value given.

    A label key must name a native tool this build knows (``native_tools``; every tool
    of ``NATIVE_LABELS`` is known) or ``server/tool`` / ``server/*`` of a configured
    upstream (``upstream_ids``). Where an upstream's registry is known (``upstream_tools``:
    server id -> its registry's tool names, the upstream's own names), ``server/tool``
    must name one of them: a key that names no tool (the exposed, prefixed name, a typo)
    would label nothing, and leave the tool to ``server/*``, perhaps without ``egress``.
    """
    if raw is None:
        return FlowConfig(mode=mode)
    here: Loc = (CONFIG_LOCATION,)
    if not isinstance(raw, Mapping):
        raise refuse([(here, f"`{CONFIG_LOCATION}` should be a mapping (key: value)")], source)
    try:
        section = FlowSection.model_validate(dict(raw))
    except ValidationError as exc:
        raise refuse(problems_from(exc, FlowSection, prefix=here), source) from None
    known_native = {*NATIVE_LABELS, *native_tools}
    upstreams = set(upstream_ids)
    registered = {sid: frozenset(names) for sid, names in (upstream_tools or {}).items()}
    problems: list[tuple[Loc, str]] = []
    labels: dict[str, frozenset[str]] = {}
    for key, given in section.labels.items():
        loc: Loc = (CONFIG_LOCATION, "labels", key)
        words = _key_problem(key, known_native, upstreams, registered)
        if words is not None:
            problems.append((loc, problem_line("", render_key(loc), words)))
            continue
        labels[key] = frozenset(given)
    if problems:
        raise refuse(problems, source)
    return FlowConfig(
        policy=section.policy,
        labels=MappingProxyType(labels),
        taint_ttl_seconds=float(section.taint_ttl_seconds),
        mode=mode,
    )


def _key_problem(
    key: str, native: set[str], upstreams: set[str], registered: Mapping[str, frozenset[str]]
) -> str | None:
    server, slash, tool = key.partition("/")
    if not slash:
        return None if key in native else "is not a native tool of this server"
    if not SERVER_ID_RE.fullmatch(server) or server not in upstreams:
        return "does not name a configured upstream (server/tool or server/*)"
    if tool != WILDCARD and not _TOOL_NAME_RE.fullmatch(tool):
        return "should be server/tool or server/* (a tool name is [A-Za-z0-9_.-], 1-128)"
    names = registered.get(server)
    if tool != WILDCARD and names is not None and tool not in names:
        return (
            "names no tool of that upstream's registry (server/tool takes the upstream's "
            "own name for the tool, not the prefixed name callers see)"
        )
    return None


def labels_for(config: FlowConfig, *, server_id: str | None, tool: str) -> frozenset[str]:
    """The labels of one tool: the configured ones, else the default, else all three in
    prod (none in dev). ``tool`` is an upstream's own name for it when ``server_id``."""
    if server_id is None:
        found = config.labels.get(tool)
        if found is None:
            found = NATIVE_LABELS.get(tool)
    else:
        found = config.labels.get(f"{server_id}/{tool}")
        if found is None:
            found = config.labels.get(f"{server_id}/{WILDCARD}")
    if found is not None:
        return found
    return ALL_LABELS if config.mode != "dev" else NO_LABELS


def decide_flow(config: FlowConfig, labels: frozenset[str], taint: Taint) -> FlowHold | None:
    """None when the call may go on; a ``FlowHold`` for an egress call after private and
    untrusted reads (module docstring)."""
    if not config.enabled or EGRESS not in labels:
        return None
    itself = READS_PRIVATE in labels
    if READS_UNTRUSTED not in taint or (READS_PRIVATE not in taint and not itself):
        return None
    sources = tuple(
        (label, taint[label]) for label in (READS_PRIVATE, READS_UNTRUSTED) if label in taint
    )
    return FlowHold(action=config.policy, sources=sources, reads_private_itself=itself)


def hold_text(hold: FlowHold) -> str:
    """What the approver reads: the rule and the calls that tainted the session (ids and
    tools, never what they read or returned)."""
    lines = [
        "flow policy: an egress call after private and untrusted reads in this session",
        "(the untrusted content may be steering the agent to send the private data out)",
        "",
        "tainted by:",
    ]
    for label, source in hold.sources:
        lines.append(f"  {label}: call {source.tool_call_id} ({source.tool})")
    if hold.reads_private_itself:
        lines.append(f"  {READS_PRIVATE}: this call itself reads private data")
    return "\n".join(lines)


__all__ = [
    "ALL_LABELS",
    "CONFIG_LOCATION",
    "EGRESS",
    "FLOW_RULE",
    "LABELS",
    "NATIVE_LABELS",
    "NO_LABELS",
    "POLICY_APPROVE",
    "POLICY_DENY",
    "POLICY_OFF",
    "READS_PRIVATE",
    "READS_UNTRUSTED",
    "WILDCARD",
    "FlowConfig",
    "FlowHold",
    "FlowSection",
    "Taint",
    "TaintSource",
    "decide_flow",
    "hold_text",
    "labels_for",
    "load_flow_config",
]
