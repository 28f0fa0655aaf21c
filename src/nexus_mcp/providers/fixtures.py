"""The fixture provider (seed 002, "Deterministic tool providers"): replay what
``providers/recording.py`` recorded.

Replaying (``serve --replay DIR``): ``FixtureProvider`` lists every recorded tool (name,
schemas, annotations from the recording) and answers each call from the fixtures by
(tool, contract version, normalized-arguments hash), with no workspace, vault, repository
or upstream at all. The whole chain runs around it as for live tools: grants,
classification, approvals and write policy, documents, limits, audit. ``ReplayTool.run``
is the connector of a replayed call: the same connector checks, approval spend and audit
start, then the recorded answer (or the recorded refusal, re-raised as the same typed
error, so the envelope and the audit say what they said live). Several answers recorded
for one key are given in order, per session (per caller where the protocol has no
session), and the last one then repeats. An unrecorded call is ``FIXTURE_NOT_FOUND``.
"""

from __future__ import annotations

import inspect
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastmcp.server.providers import Provider
from fastmcp.tools import Tool, ToolResult
from fastmcp.utilities.versions import VersionSpec
from mcp_types import ContentBlock, ToolAnnotations
from mcp_types import Tool as McpTool
from pydantic import BaseModel, TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from nexus_mcp.calls import CallState, current_call
from nexus_mcp.connector import Connector, Outcome
from nexus_mcp.contracts import ToolContract
from nexus_mcp.envelope import invalid_input_from, unknown_tool
from nexus_mcp.errors import (
    Code,
    ConfigError,
    FixtureNotFoundError,
    NexusError,
    rebuild_error,
)
from nexus_mcp.fixtures.integrity import holds_redaction
from nexus_mcp.fixtures.lines import (
    arguments_hash,
    listing_digest,
)
from nexus_mcp.fixtures.store import CallRecord, ToolRecord, read_fixtures
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.documents import check_read_documents
from nexus_mcp.policy.pins import definition_digest as pinned_digest
from nexus_mcp.policy.registry import DocumentSpec
from nexus_mcp.policy.upstreams import UPSTREAM_TOOLSET_PREFIX
from nexus_mcp.workspace.replay import ReachedTheWorld

log = get_logger(__name__)

_CONTENT = TypeAdapter(ContentBlock)
# Sessions whose replay position is remembered (the least recently used is forgotten).
MAX_REPLAY_SESSIONS = 4096
FASTMCP_META = "fastmcp"


# -- recording -----------------------------------------------------------------------------


# -- replaying -----------------------------------------------------------------------------


class ReplayTool(Tool):
    """A recorded tool as FastMCP holds it; ``run`` is the connector of a replayed call."""

    _replayer: Any = None
    _record: Any = None

    @classmethod
    def for_record(cls, record: ToolRecord, replayer: FixtureProvider) -> ReplayTool:
        definition = record.definition
        meta = dict(definition.get("_meta") or {})
        fastmcp_meta = meta.pop(FASTMCP_META, None)
        tags = fastmcp_meta.get("tags") if isinstance(fastmcp_meta, Mapping) else None
        annotations = definition.get("annotations")
        tool = cls(
            name=record.tool,
            title=definition.get("title"),
            description=definition.get("description"),
            parameters=definition.get("inputSchema") or {"type": "object"},
            output_schema=definition.get("outputSchema"),
            annotations=ToolAnnotations(**annotations)
            if isinstance(annotations, Mapping)
            else None,
            meta=meta or None,
            tags={str(t) for t in tags} if isinstance(tags, list) else set(),
        )
        tool._replayer = replayer
        tool._record = record
        return tool

    @property
    def record(self) -> ToolRecord:
        return self._record  # type: ignore[no-any-return]

    async def run(self, arguments: dict[str, Any], context: Any = None) -> ToolResult:
        replayer: FixtureProvider = self._replayer
        return await replayer.answer(self, arguments)


class FixtureProvider(Provider):
    """FastMCP's ``Provider`` for the recorded tools (``serve --replay``)."""

    # In replay the recorded tools are the only ones (nothing is registered locally).
    disjoint_from_local = True

    def __init__(
        self,
        records: Mapping[str, ToolRecord],
        calls: Mapping[tuple[str, str, str], Sequence[CallRecord]],
        *,
        contracts: Mapping[str, ToolContract],
        argument_models: Mapping[str, type[BaseModel]],
        connector: Connector,
        prechecks: Mapping[str, Callable[..., Awaitable[Any]]] | None = None,
    ) -> None:
        super().__init__()
        self.contracts = contracts
        self.connector = connector
        self.argument_models = argument_models
        self.prechecks = dict(prechecks or {})
        self.calls = calls
        self.tools = {name: ReplayTool.for_record(r, self) for name, r in records.items()}
        self._positions: OrderedDict[tuple[str, tuple[str, str, str]], int] = OrderedDict()
        self._sessions: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    async def _list_tools(self) -> list[Tool]:
        return list(self.tools.values())

    async def _get_tool(self, name: str, version: VersionSpec | None = None) -> Tool | None:
        return self.tools.get(name)

    # -- one call ----------------------------------------------------------------------

    async def answer(self, tool: ReplayTool, arguments: dict[str, Any]) -> ToolResult:
        state = current_call()
        if state is None or state.principal is None or self.tools.get(tool.name) is not tool:
            # Reached without the chain: the answer a hidden or missing tool gets.
            raise unknown_tool(tool.name)
        record = tool.record
        contract = self.contracts[tool.name]
        # What validate and prepare found, for the steps after them.
        found: dict[str, Any] = {}

        def validate() -> dict[str, Any]:
            found["arguments"] = normalized = self._normalized(record, state, arguments)
            return normalized

        async def prepare() -> None:
            normalized = found["arguments"]
            refusal = await self._precheck(record, normalized)
            if refusal is not None:
                # Live, the tool ran and refused from its arguments: so it does here, after
                # its approval is spent and its start audited.
                found["answer"] = refusal
                return
            key = (
                record.tool,
                record.version,
                arguments_hash(normalized, secret=record.secret_args),
            )
            recorded = self._next(state, key)
            if recorded is None:
                raise FixtureNotFoundError(args_sha256=key[2])
            found["answer"] = recorded  # the call runs from here on, as a live one would

        async def execute() -> Outcome:
            recorded = found["answer"]
            if isinstance(recorded, NexusError):
                raise recorded
            if recorded.error is not None:
                error = recorded.error
                raise rebuild_error(str(error["code"]), str(error["message"]), error.get("facts"))
            result = recorded.result
            content = [_CONTENT.validate_python(block) for block in result["content"]]
            structured = result.get("structuredContent")
            is_error = bool(result.get("isError"))
            target_ref = (recorded.effect or {}).get("target_ref")
            if isinstance(target_ref, str):
                state.target_ref = target_ref
            document: dict[str, Any] | None = None
            if not is_error:
                document = (
                    dict(structured or {})
                    if record.upstream_tool is None
                    else {"content": result["content"], "structuredContent": structured}
                )
            return Outcome(
                content=content, structured=structured, document=document, is_error=is_error
            )

        return await self.connector.run(
            contract, state, arguments, execute, validate=validate, prepare=prepare
        )

    async def _precheck(
        self, record: ToolRecord, arguments: Mapping[str, Any]
    ) -> NexusError | None:
        """The refusal a native tool's own body makes from its arguments alone, before it
        touches a file, vault or repository (its body runs over stand-ins until then:
        ``workspace.replay.ReplayWorkspace``), or None. Made before the recording is looked up,
        so a replay refuses what live refuses whatever the recording holds."""
        body = self.prechecks.get(record.tool) if record.upstream_tool is None else None
        if body is None:
            return None
        accepted = inspect.signature(body).parameters
        try:
            await body(**{k: v for k, v in arguments.items() if k in accepted})
        except ReachedTheWorld:
            return None
        except NexusError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - the recording decides, as before
            log.debug("replay_precheck_inconclusive", tool=record.tool, exc_type=type(exc).__name__)
        return None

    def _normalized(
        self, record: ToolRecord, state: CallState, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        """The arguments as the recording hashed them: a native tool's validated ones (its
        defaults filled in), an upstream tool's as sent."""
        model = self.argument_models.get(record.tool) if record.upstream_tool is None else None
        if model is None:
            return arguments
        checked = state.validated_arguments
        if checked is not None and checked[0] is arguments:
            return checked[1]
        try:
            return dict(model.model_validate(arguments).__dict__)
        except PydanticValidationError as exc:
            raise invalid_input_from(exc, model.model_fields) from None

    def _next(self, state: CallState, key: tuple[str, str, str]) -> CallRecord | None:
        answers = self.calls.get(key)
        if not answers:
            return None
        principal = state.principal
        session = state.session_key or (principal.subject if principal is not None else "")
        with self._lock:
            position = self._positions.get((session, key), 0)
            self._positions[(session, key)] = position + 1
            self._positions.move_to_end((session, key))
            self._sessions[session] = None
            self._sessions.move_to_end(session)
            while len(self._sessions) > MAX_REPLAY_SESSIONS:
                forgotten, _ = self._sessions.popitem(last=False)
                for stale in [k for k in self._positions if k[0] == forgotten]:
                    del self._positions[stale]
        return answers[min(position, len(answers) - 1)]


__all__ = [
    "FixtureProvider",
    "ReplayTool",
]


# -- loading a recording for replay -------------------------------------------------------

PRUNE_HINT = "record again, or drop them: nexus-mcp fixtures prune DIR --tool {tool}"
MAX_LISTED_PROBLEMS = 20


@dataclass
class ReplaySet:
    """What a replaying server serves: the recorded tools, their answers and contracts."""

    records: dict[str, ToolRecord]
    calls: dict[tuple[str, str, str], list[CallRecord]]
    contracts: dict[str, ToolContract]
    upstream_records: dict[str, ToolRecord]


def check_replay(
    directory: Path,
    *,
    native_server_id: str,
    native_contracts: Mapping[str, ToolContract],
    native_definitions: Mapping[str, Mapping[str, Any]],
    upstream_exposed: Callable[[str, str], str | None],
    upstream_pin: Callable[[str, str], str | None],
    upstream_risk: Callable[[str, str], str] | None = None,
    read_spec: Callable[[str, str], DocumentSpec | None] | None = None,
    key: bytes | None = None,
) -> tuple[ReplaySet, list[str]]:
    """Read ``directory`` and check it against this build: what a replay would serve, and
    every problem found. The one check of a recording: ``serve --replay`` start-up
    (``load_replay``) and ``nexus-mcp fixtures verify`` both run it, so they cannot drift.

    Problems: a folder entry that is not a regular ``*.jsonl`` file (a link, FIFO, device,
    subfolder); a line that is not a fixture line; a line that contradicts itself
    (``fixtures/integrity.py``: a refusal that is not one, a document whose recorded hash
    no longer matches, ...); with ``key`` a line without a MAC or whose MAC does not
    verify; a call of a tool the recording never listed; a native tool this build lacks,
    or whose contract version differs (a version change invalidates its fixtures), or
    whose schemas changed without a version bump; an upstream the configuration no longer
    exposes under that name, or whose pinned definition differs from the recorded one; an
    unknown error code; a result that is no MCP content.
    ``upstream_exposed(server_id, upstream_tool)`` is the name the configuration exposes
    (None: not configured or not allowed); ``upstream_pin`` the pinned digest, if any;
    ``upstream_risk`` the class its registry gives it (``write`` without an entry), as live.
    ``read_spec(server_id, tool)`` is the registry's document spec of a read document op
    (None: not one): a recorded read's document hashes must be the ones it measures on the
    recorded result, as live measured them (the line's own effect never decides which).

    An upstream tool's contract is the one live makes it (``UpstreamServer.contract_for``):
    its risk from the registry, its toolset the upstream's; a recording that says otherwise
    is refused, never believed (its risk decides who sees the tool and what the audit says).
    """
    servers, line_problems = read_fixtures(directory, key=key)
    problems = [p.describe() for p in line_problems]
    records: dict[str, ToolRecord] = {}
    upstream_records: dict[str, ToolRecord] = {}
    calls: dict[tuple[str, str, str], list[CallRecord]] = {}
    contracts: dict[str, ToolContract] = {}
    for server_id, fixtures in sorted(servers.items()):
        for tool in sorted(set(fixtures.call_versions) - set(fixtures.tools)):
            problems.append(f"{server_id}: calls of {tool}, which the recording never listed")
        for name, record in sorted(fixtures.tools.items()):
            if name in records:
                problems.append(f"{server_id}: {name} is also recorded by another server")
                continue
            stale = sorted(fixtures.call_versions.get(name, set()) - {record.version})
            if record.upstream_tool is None and server_id == native_server_id:
                problem = _native_problem(record, native_contracts, native_definitions)
            elif record.upstream_tool is not None and server_id != native_server_id:
                problem = _upstream_problem(record, upstream_exposed, upstream_pin, upstream_risk)
            else:
                problem = "recorded for a server this build does not serve it from"
            if problem is None:
                problem = _definition_problem(record)
            if problem is None and stale:
                problem = (
                    f"calls recorded with version {', '.join(stale)}, "
                    f"the recording's listing has {record.version}"
                )
            if problem is not None:
                problems.append(f"{server_id}: {name}: {problem}; " + PRUNE_HINT.format(tool=name))
                continue
            records[name] = record
            if record.upstream_tool is not None:
                upstream_records[name] = record
                contracts[name] = ToolContract(
                    name=name,
                    description=str(record.definition.get("description") or record.upstream_tool),
                    risk=record.risk,  # type: ignore[arg-type]
                    toolset=record.toolset,
                    version=record.version,
                    title=record.definition.get("title"),
                )
            else:
                contracts[name] = native_contracts[name]
                # Listed as this build lists it: a description, title, annotation or
                # _meta edited in the file is never served (same version, same schemas).
                record.definition = dict(native_definitions[name])
        for call_key, answers in fixtures.calls.items():
            for answer in answers:
                code = (answer.error or {}).get("code")
                if code is not None and code not in Code.__members__:
                    problems.append(
                        f"{server_id}: {call_key[0]}: a recorded refusal has an unknown code"
                    )
                    break
                if not _content_is_valid(answer.result.get("content")):
                    problems.append(f"{server_id}: {call_key[0]}: a result that is no MCP content")
                    break
            if call_key[0] in records and call_key[1] == records[call_key[0]].version:
                calls.setdefault(call_key, []).extend(answers)
                record = records[call_key[0]]
                if read_spec is not None and _unmeasured(
                    record, answers, native_server_id, read_spec
                ):
                    problems.append(
                        f"{server_id}: {call_key[0]}: a read whose documents are not the ones "
                        "its registry entry measures in its result"
                    )
    return ReplaySet(records, calls, contracts, upstream_records), problems


def load_replay(directory: Path, **checks: Any) -> ReplaySet:
    """``check_replay``, refusing (``ConfigError``) a recording with any problem."""
    replay, problems = check_replay(directory, **checks)
    if problems:
        raise replay_refusal(directory, problems)
    return replay


def replay_refusal(directory: Path, problems: Sequence[str]) -> ConfigError:
    """The start-up refusal of a recording: every problem (up to ``MAX_LISTED_PROBLEMS``)."""
    shown = problems[:MAX_LISTED_PROBLEMS]
    more = len(problems) - len(shown)
    return ConfigError(
        f"the fixtures in 'replay' ({directory}) do not fit this server:\n  "
        + "\n  ".join(shown)
        + (f"\n  ... and {more} more" if more > 0 else "")
    )


def _definition_problem(record: ToolRecord) -> str | None:
    """A definition that is not an MCP tool, or not the one its line's digest names."""
    definition = record.definition
    if listing_digest(definition) != record.digest:
        return "its definition differs from the digest recorded with it"
    if definition.get("name") != record.tool:
        return "its definition names another tool"
    try:
        annotations = definition.get("annotations")
        if annotations is not None:
            ToolAnnotations.model_validate(annotations)
        McpTool.model_validate(definition)
    except PydanticValidationError:
        return "its definition is not an MCP tool definition"
    return None


def _unmeasured(
    record: ToolRecord,
    answers: Sequence[CallRecord],
    native_server_id: str,
    read_spec: Callable[[str, str], DocumentSpec | None],
) -> bool:
    """Whether a recorded success of a read document op carries document hashes other
    than those its registry spec measures in the recorded result (``check_read_documents``,
    the enforcer's own measure). A redacted answer keeps its pointers, not its hashes."""
    upstream = record.upstream_tool
    spec = (
        read_spec(native_server_id, record.tool)
        if upstream is None
        else read_spec(record.server_id, upstream)
    )
    if spec is None:
        return False
    for answer in answers:
        result = answer.result
        if answer.error is not None or result.get("isError") is not False:
            continue
        effect = answer.effect if isinstance(answer.effect, dict) else {}
        document: Any = (
            result.get("structuredContent")
            if upstream is None
            else {
                "content": result.get("content"),
                "structuredContent": result.get("structuredContent"),
            }
        )
        try:
            measured = check_read_documents(spec, document)
        except NexusError:
            continue  # over today's limits: the replay's own check refuses it per call
        recorded = effect.get("document_hashes")
        if answer.redacted:
            pointers = [h.get("pointer") for h in recorded] if isinstance(recorded, list) else None
            if pointers != [h.pointer for h in measured.hashes]:
                return True
        elif recorded != measured.hash_dicts() or (
            effect.get("batch_total_bytes") != measured.batch_total_bytes
        ):
            return True
    return False


def _as_published(record: ToolRecord) -> str | None:
    """The pin digest of a recorded upstream tool's definition as the upstream published
    it: the listed title, description and schemas (given as published), its own name and
    annotations (the listing carries the gateway's). None when not recorded."""
    if not record.has_upstream_annotations:
        return None
    definition = record.definition
    published = {
        "name": record.upstream_tool,
        "title": definition.get("title"),
        "description": definition.get("description"),
        "inputSchema": definition.get("inputSchema"),
        "outputSchema": definition.get("outputSchema"),
        "annotations": record.upstream_annotations,
    }
    return pinned_digest(published)


def _content_is_valid(content: Any) -> bool:
    if not isinstance(content, list):
        return False
    try:
        for block in content:
            _CONTENT.validate_python(block)
    except PydanticValidationError:
        return False
    return True


def _native_problem(
    record: ToolRecord,
    contracts: Mapping[str, ToolContract],
    definitions: Mapping[str, Mapping[str, Any]],
) -> str | None:
    contract = contracts.get(record.tool)
    if contract is None:
        return "no such tool in this build"
    if contract.version != record.version:
        return f"recorded with version {record.version}, this build has {contract.version}"
    # The recording's word on these decides what its lines are checked for (a read's
    # documents): held to this build's contract, which a replay serves.
    if record.risk != contract.risk:
        return "recorded with another risk than this build's"
    if record.toolset != contract.toolset:
        return "recorded in another toolset than this build's"
    current = definitions.get(record.tool, {})
    for part in ("inputSchema", "outputSchema"):
        if current.get(part) != record.definition.get(part):
            return f"its {part} changed without a contract version bump"
    return None


def _upstream_problem(
    record: ToolRecord,
    exposed: Callable[[str, str], str | None],
    pin: Callable[[str, str], str | None],
    risk: Callable[[str, str], str] | None = None,
) -> str | None:
    upstream_tool = str(record.upstream_tool)
    if exposed(record.server_id, upstream_tool) != record.tool:
        return "the configuration does not expose this upstream tool under this name"
    if record.toolset != UPSTREAM_TOOLSET_PREFIX + record.server_id:
        return "recorded in another toolset than its upstream's"
    if risk is not None and risk(record.server_id, upstream_tool) != record.risk:
        return "recorded with another risk than its registry gives it (the contract changed)"
    pinned = pin(record.server_id, upstream_tool)
    if pinned is not None and pinned[: len(record.version)] != record.version:
        return "its pinned definition differs from the recorded one (the contract changed)"
    if (
        pinned is not None
        and _as_published(record) != pinned
        # A secret redacted from the definition leaves nothing to hash: only the key
        # (which seals the line) vouches for it, as for any redacted answer.
        and not holds_redaction([record.definition, record.upstream_annotations])
    ):
        # The version is the line's claim; what a replay serves is the definition.
        return "its definition is not the pinned one (edited, or recorded before a re-pin)"
    return None


__all__ += ["ReplaySet", "check_replay", "load_replay", "replay_refusal"]
