"""``serve --replay`` and the native stand-ins: every native tool's contract built over
stand-ins that touch nothing (``workspace/replay.py``), the recording loaded and checked
against this build (``providers/fixtures.py``), and the names no upstream may take."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel

from nexus_mcp.book import ToolBook, ToolCatalog
from nexus_mcp.contracts import ToolContract, build_arguments_model, contract_of
from nexus_mcp.errors import InvalidInputError, NotFoundError
from nexus_mcp.fixtures.integrity import resolve_fixture_key
from nexus_mcp.fixtures.store import has_macs
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.pins import load_pins
from nexus_mcp.policy.registry import (
    DocumentSpec,
    RegistrySet,
    upstream_registry_dir,
)
from nexus_mcp.policy.repos import ReposConfig, is_safe_repo_name, load_repos_config
from nexus_mcp.policy.targets import ToolTargets, identify_folder
from nexus_mcp.policy.upstreams import (
    UpstreamsConfig,
    load_upstreams,
)
from nexus_mcp.providers.native import NexusTool, ToolFunction
from nexus_mcp.providers.recording import listed_definition
from nexus_mcp.server.runtime import Runtime
from nexus_mcp.server.startup import load_served_registry
from nexus_mcp.settings import Settings
from nexus_mcp.stores.locations import (
    server_state_paths,
)
from nexus_mcp.tools.discovery import build_discovery_tools
from nexus_mcp.tools.files import build_files_tools
from nexus_mcp.tools.notes import build_notes_tools
from nexus_mcp.workspace.files import Workspace
from nexus_mcp.workspace.replay import LexicalPaths, ReachedTheWorld, ReplayWorkspace

if TYPE_CHECKING:
    from nexus_mcp.providers.fixtures import ReplaySet

log = get_logger(__name__)


class _Absent:
    """Stands in for what a replaying server never touches (a vault, a repository): a
    replayed tool's body that reaches it has made every check it makes from its
    arguments (``ReachedTheWorld``), and never reaches the world."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise ReachedTheWorld(self._what)


class _ReplayRepos:
    """The repositories of a replay, never opened: a repository tool's body gets as far as
    its own argument checks. The name is judged as ``RepoCatalog.get`` judges it (a name
    that is not a repository name is INVALID_INPUT; one the configuration does not hold
    is NOT_FOUND, unless dev mode serves any folder); what the tool then asks of the
    repository is ``ReachedTheWorld``."""

    def __init__(self, config: ReposConfig | None) -> None:
        self._config = config

    def get(self, name: object) -> Any:
        from nexus_mcp.repos.catalog import ARG_REPO

        if not is_safe_repo_name(name):
            raise InvalidInputError(field=ARG_REPO)
        config = self._config
        known = config is not None and (name in config.repositories or config.dev_allow_all_repos)
        if not known:
            raise NotFoundError(reason="repository_not_found")
        return _Absent("repository")

    def __getattr__(self, name: str) -> Any:
        raise ReachedTheWorld("repositories")


def replay_stand_ins(
    settings: Settings,
    catalog: ToolCatalog,
    visible: Callable[[Any], Any],
    paths: LexicalPaths | None = None,
    repos_config: ReposConfig | None = None,
) -> list[ToolFunction]:
    """Every native toolset over stand-ins (``serve --replay`` answers every call from
    the recording): their contracts and argument models, and their bodies up to the
    first touch of a file, vault or repository (``workspace.replay.ReplayWorkspace``)."""
    from nexus_mcp.tools.repo import build_repo_tools

    def no_vault(_principal: Any) -> Any:
        # A vault that is never read: the notes tools check the path before they read.
        return _Absent("vault")

    absent_repos: Any = _ReplayRepos(repos_config)
    workspace = cast(Workspace, ReplayWorkspace(paths or LexicalPaths()))
    return [
        *build_files_tools(workspace, settings),
        *build_notes_tools(no_vault),
        *build_discovery_tools(catalog, visible),
        *build_repo_tools(absent_repos, absent_repos, settings),
    ]


def replay_hidden_parts(settings: Settings) -> list[tuple[str, ...]]:
    """What a live server over ``workspace`` hides from the file tools, as relative parts
    (the recording folder, the data directory, the audit file...), for a replay to refuse
    by name (``LexicalPaths``). Nothing without a configured workspace: a replay has no
    folder to place them in."""
    if settings.workspace is None:
        return []
    root = settings.workspace.resolve()
    live = settings.model_copy(update={"record": settings.replay})
    parts: list[tuple[str, ...]] = []
    for path in server_state_paths(live, root):
        real = path.resolve()
        if real != root and root in real.parents:
            parts.append(real.relative_to(root).parts)
    return parts


def load_replay_set(
    settings: Settings,
    functions: Iterable[ToolFunction],
    contracts: Mapping[str, ToolContract],
    argument_models: Mapping[str, type[BaseModel]],
    upstream_config: UpstreamsConfig,
    environ: Mapping[str, str],
) -> ReplaySet:
    """The recording in ``settings.replay``, checked against this build and configuration
    (``ConfigError`` listing every problem)."""
    from nexus_mcp.providers.fixtures import replay_refusal

    assert settings.replay is not None
    replay, problems = _check_recording(
        settings, settings.replay, functions, contracts, argument_models, upstream_config, environ
    )
    if problems:
        raise replay_refusal(settings.replay, problems)
    return replay


def check_recording(
    settings: Settings,
    directory: Path,
    *,
    sections: Mapping[str, Any],
    environ: Mapping[str, str],
) -> list[str]:
    """Every problem ``serve --replay`` start-up would refuse ``directory`` for, with these
    settings and configuration sections: the same check (``check_replay``) over the same
    build (``replay_stand_ins``). ``nexus-mcp fixtures verify`` runs it."""
    catalog = ToolCatalog()
    functions = replay_stand_ins(
        settings,
        catalog,
        lambda _principal: frozenset(),
        repos_config=load_repos_config(sections.get("repos"), mode=settings.mode),
    )
    contracts = {contract_of(fn).name: contract_of(fn) for fn in functions}
    argument_models = {contract_of(fn).name: build_arguments_model(fn) for fn in functions}
    upstream_config = load_upstreams(
        sections.get("upstreams"), mode=settings.mode, native_server_id=settings.registry.server_id
    )
    _replay, problems = _check_recording(
        settings, directory, functions, contracts, argument_models, upstream_config, environ
    )
    return problems


def _check_recording(
    settings: Settings,
    directory: Path,
    functions: Iterable[ToolFunction],
    contracts: Mapping[str, ToolContract],
    argument_models: Mapping[str, type[BaseModel]],
    upstream_config: UpstreamsConfig,
    environ: Mapping[str, str],
) -> tuple[ReplaySet, list[str]]:
    from nexus_mcp.providers.fixtures import check_replay

    key = resolve_fixture_key(
        settings.fixture_key, is_dev=settings.is_dev, environ=environ, folder=directory
    )
    if key is None and has_macs(directory):
        log.warning(
            "fixtures_not_verified",
            reason="the recording is sealed (its lines carry MACs) but no fixture_key is "
            "configured: the MACs are not checked",
        )
    definitions = {}
    for fn in functions:
        contract = contract_of(fn)
        tool = NexusTool.bind(fn, contract, argument_models[contract.name])
        definitions[contract.name] = listed_definition(tool)
    configured = {server.server_id: server for server in upstream_config.servers}
    pins_dir = upstream_registry_dir(
        settings.registry.directory, settings.registry.upstream_directory
    )

    def exposed(server_id: str, tool: str) -> str | None:
        server = configured.get(server_id)
        return server.exposed_name(tool) if server is not None and server.allows(tool) else None

    def pin(server_id: str, tool: str) -> str | None:
        return load_pins(pins_dir, server_id).digests.get(tool) if server_id in configured else None

    registry = load_served_registry(settings)

    def risk(server_id: str, tool: str) -> str:
        # As live classifies an upstream tool (``ToolView.tool_class``): its registry
        # entry's class, a write without one.
        entry = registry.lookup(server_id, tool)
        return entry.tool_class if entry is not None else "write"

    def read_spec(server_id: str, tool: str) -> DocumentSpec | None:
        # The spec the enforcer measures a read's result with (``read_spec``).
        entry = registry.lookup(server_id, tool)
        if entry is None or not entry.is_document_op or entry.tool_class != "read":
            return None
        return entry.document_spec

    return check_replay(
        directory,
        native_server_id=settings.registry.server_id,
        native_contracts=contracts,
        native_definitions=definitions,
        upstream_exposed=exposed,
        upstream_pin=pin,
        upstream_risk=risk,
        read_spec=read_spec,
        key=key,
    )


def replay_targets(settings: Settings, book: ToolBook) -> ToolTargets:
    """A replay's writes act on the recording, whatever their toolset: idempotency records
    of a replay never match a live run's (or another recording's)."""
    assert settings.replay is not None
    target = identify_folder(settings.replay)
    return ToolTargets(
        {toolset: (lambda _principal, _arguments: target) for toolset in book.toolsets.values()},
        book.toolsets,
    )


def make_replayed_upstreams_known(runtime: Runtime, replay: ReplaySet) -> None:
    """The tools that exist, for the namespace: a recorded upstream name that is a native
    tool's reaches no grant, as live."""
    contracts = runtime.book.contracts
    writes = frozenset(n for n, c in contracts.items() if c.tool_class == "write")
    runtime.access.set_tools(
        frozenset(contracts),
        writes,
        upstream=list(replay.upstream_records),
        native=native_catalog(runtime.settings, runtime.registry, {}),
    )


def native_catalog(
    settings: Settings, registry: RegistrySet, mounted: Mapping[str, ToolContract]
) -> frozenset[str]:
    """Every native tool name: each toolset's, whether this configuration mounts it or
    not (built over stand-ins, as a replay builds them), the native registry's, and the
    ones mounted here. No upstream tool is exposed under one of them (``providers/gateway``)."""
    names = {contract_of(fn).name for fn in replay_stand_ins(settings, ToolCatalog(), _no_one)}
    names.update(native_registry_names(registry, settings.registry.server_id))
    names.update(mounted)
    return frozenset(names)


def _no_one(_principal: Any) -> frozenset[str]:
    return frozenset()


def native_registry_names(registry: RegistrySet, server_id: str) -> list[str]:
    native = registry.get(server_id)
    return [entry.tool_name for entry in native.entries] if native is not None else []
