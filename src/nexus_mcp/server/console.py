"""The operator console's services from a running server's runtime (``console/``)."""

from __future__ import annotations

from collections.abc import Mapping

from nexus_mcp.console.services import ConsoleServices, console_keys
from nexus_mcp.server.runtime import Runtime


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
    )


__all__ = ["console_services"]
