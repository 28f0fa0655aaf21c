"""Which stdio upstreams run in a bubblewrap sandbox, and how (``policy/sandbox.py``), for
``serve`` and for the commands that open an upstream (``upstream pin``, ``check``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.sandbox import SandboxLaunch, gateway_paths, plan_sandboxes
from nexus_mcp.policy.upstreams import UpstreamsConfig
from nexus_mcp.settings import Settings

log = get_logger(__name__)

UNSANDBOXED_WARNING = (
    "these stdio upstreams run unsandboxed, with the gateway's user's rights over its"
    " files and network (add a `sandbox:` section to each; bubblewrap)"
)


def plan_upstream_sandboxes(
    config: UpstreamsConfig,
    *,
    settings: Settings,
    registry_dir: Path,
    environ: Mapping[str, str],
    warn: bool = True,
) -> dict[str, SandboxLaunch]:
    """Each sandboxed upstream's launch; a sandbox that cannot be had stops start-up
    (``ConfigError``), never runs unsandboxed. ``warn``: log the unsandboxed ones."""
    protected = gateway_paths(
        data_dir=settings.data_dir,
        audit_path=settings.audit_path,
        registry_dir=registry_dir,
        trusted_files=settings.trusted_files,
    )
    stdio = [u for u in (s.sandboxed() for s in config.servers) if u is not None]
    launches, unsandboxed = plan_sandboxes(stdio, protected=protected, environ=environ)
    if unsandboxed and warn:
        log.warning("upstreams_unsandboxed", upstreams=unsandboxed, message=UNSANDBOXED_WARNING)
    return launches


__all__ = ["UNSANDBOXED_WARNING", "plan_upstream_sandboxes"]
