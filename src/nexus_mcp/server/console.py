"""The operator console's services from a running server's runtime (``console/``)."""

from __future__ import annotations

from collections.abc import Mapping

from nexus_mcp.console.services import ConsoleServices, console_keys
from nexus_mcp.server.runtime import Runtime, grants_changed


def console_services(runtime: Runtime, environ: Mapping[str, str]) -> ConsoleServices:
    settings = runtime.settings
    return ConsoleServices(
        settings=settings,
        config_file=runtime.config_file,
        approval_settings=runtime.approval_settings,
        state=runtime.state,
        audit=runtime.audit_log,
        keys=console_keys(settings, environ),
        host="server",
        # A grant changed in the console reaches this server's visible-tools cache at once
        # (other replicas hear of it through the state backend, as for the CLI).
        on_grants_changed=lambda zone: grants_changed(runtime, zone),
        profiles=runtime.access.profiles,
        upstreams=runtime.upstreams.summary if runtime.upstreams is not None else None,
        registry_info=runtime.registry_info,
    )


__all__ = ["console_services"]
