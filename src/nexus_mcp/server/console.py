"""The operator console's services from a running server's runtime (``console/``)."""

from __future__ import annotations

from collections.abc import Mapping

from nexus_mcp.console.oidc import CALLBACK_PATH, OidcSignIn, ProviderEndpoints, id_token_algorithms
from nexus_mcp.console.services import ConsoleServices, console_keys
from nexus_mcp.identity.oauth import FrontDoorProxy
from nexus_mcp.policy.registry import upstream_registry_dir
from nexus_mcp.providers.upstream.gateway import UpstreamGateway
from nexus_mcp.providers.upstream.pins_view import PinsView
from nexus_mcp.providers.upstream.review import ReviewContext
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
        pins=gateway_pins(runtime, runtime.upstreams) if runtime.upstreams else None,
        sign_in=provider_sign_in(runtime),
    )


def gateway_pins(runtime: Runtime, gateway: UpstreamGateway) -> PinsView:
    """The pins page over the gateway's own upstream servers: their decisions for the
    page; their secrets and evidence stores for a re-pin's fresh connection."""
    settings = runtime.settings
    servers = gateway.servers
    first = next(iter(servers.values()), None)
    shared = None
    if first is not None and first.shares_evidence:
        from nexus_mcp.stores.redis_quarantine import RedisSeenDigests

        if isinstance(first.evidence, RedisSeenDigests):
            shared = first.evidence
    context = ReviewContext(
        gateway.config,
        upstream_registry_dir(settings.registry.directory, settings.registry.upstream_directory),
        gateway.mode,
        gateway.registry,
        settings,
        secrets=lambda upstream: servers[upstream.server_id].secrets,
        persisted=first.persisted if first is not None else None,
        shared=shared,
    )
    return PinsView(context, live=servers)


def provider_sign_in(runtime: Runtime) -> OidcSignIn | None:
    """Sign-in with the team's identity provider, when the server has the front door.

    It reuses ``auth.oidc_proxy``'s client at the provider and the discovery the front
    door did at start-up (its issuer checked). A provider without discovery (explicit
    endpoints, a plain OAuth 2 server) issues no ID token to verify; a server with
    ``auth.authorization_servers`` only has no client of its own at the provider.
    """
    auth = runtime.settings.auth
    spec = auth.oidc_proxy
    door = runtime.front_door
    if spec is None or auth.base_url is None or door is None:
        return None
    provider = door.provider
    if not isinstance(provider, FrontDoorProxy):
        return None
    config = provider.oidc_config
    endpoints = ProviderEndpoints(
        issuer=spec.issuer,
        authorization_endpoint=str(config.authorization_endpoint),
        token_endpoint=str(config.token_endpoint),
        jwks_uri=str(config.jwks_uri),
        algorithms=id_token_algorithms(config.id_token_signing_alg_values_supported),
    )
    return OidcSignIn(
        endpoints=endpoints,
        client_id=spec.client_id,
        client_secret=(
            spec.client_secret.get_secret_value() if spec.client_secret is not None else None
        ),
        scopes=spec.scopes,
        redirect_uri=auth.base_url + CALLBACK_PATH,
        mapper=door.mapper,
        leeway_seconds=auth.leeway_seconds,
        timeout_seconds=float(spec.discovery_timeout_seconds),
    )


__all__ = ["console_services", "gateway_pins", "provider_sign_in"]
