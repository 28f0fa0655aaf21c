"""Issue 15 configuration: state backend URLs by reference, requestState keys shared by
replicas, the worker-count rules, and the session-affinity layer a balancer routes on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp.server.request_state import RequestStateSecurity
from starlette.types import Message, Receive, Scope, Send

from nexus_mcp.errors import ConfigError
from nexus_mcp.settings import Settings
from nexus_mcp.stores.backends import describe_address, request_state_keys, resolve_url
from nexus_mcp.transport.serve import SessionAffinityMiddleware, http_options
from nexus_mcp.transport.workers import check_workers

KEY_A = "a" * 40
KEY_B = "b" * 40


def settings(**values: Any) -> Settings:
    return Settings(**values)


def shared(**state: Any) -> dict[str, Any]:
    return {
        "backend": "shared",
        "postgres_url": {"env": "PG"},
        "redis_url": {"env": "RD"},
        **state,
    }


# --- URLs by reference -------------------------------------------------------------------


def test_shared_backend_needs_both_urls() -> None:
    with pytest.raises(ValueError, match="postgres_url and redis_url"):
        Settings(state={"backend": "shared"})


def test_url_with_password_inline_is_refused_in_prod_and_never_echoed() -> None:
    secret = "s3cr3t-pass-word"
    config = settings(state=shared(postgres_url=f"postgresql://nexus:{secret}@db:5432/nexus"))
    with pytest.raises(ConfigError) as caught:
        resolve_url(config.state.postgres_url, "state.postgres_url", config, {})
    assert "by reference" in str(caught.value)
    assert secret not in str(caught.value)


def test_url_without_password_inline_and_by_reference_resolve() -> None:
    config = settings(state=shared(postgres_url="postgresql://nexus@db/nexus"))
    assert (
        resolve_url(config.state.postgres_url, "state.postgres_url", config, {})
        == "postgresql://nexus@db/nexus"
    )
    url = "redis://:pw-abcdef@cache:6379/0"
    assert resolve_url(config.state.redis_url, "state.redis_url", config, {"RD": url}) == url


def test_unset_reference_names_the_variable_not_a_value() -> None:
    config = settings(state=shared())
    with pytest.raises(ConfigError, match="env:PG is not set"):
        resolve_url(config.state.postgres_url, "state.postgres_url", config, {})


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://user:pw@db.internal:5433/x", "db.internal:5433"),
        ("redis://:hunter2hunter2@10.1.2.3:6379/0", "10.1.2.3:6379"),
        ("postgresql:///nexus", "localhost"),
    ],
)
def test_describe_address_never_shows_credentials(url: str, shown: str) -> None:
    assert describe_address(url) == shown
    assert "pw" not in describe_address(url) and "hunter2" not in describe_address(url)


# --- requestState keys -------------------------------------------------------------------


def test_shared_backend_refuses_a_per_process_request_state_key() -> None:
    with pytest.raises(ConfigError, match="request_state_keys"):
        request_state_keys(settings(state=shared()), {})


def test_embedded_backend_keeps_fastmcps_per_process_key() -> None:
    assert request_state_keys(settings(), {}) == []


def test_inline_key_is_dev_only_and_short_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match="by reference"):
        request_state_keys(settings(state=shared(request_state_keys=[KEY_A])), {})
    assert request_state_keys(
        settings(mode="dev", state=shared(request_state_keys=[KEY_A])), {}
    ) == [KEY_A.encode()]
    with pytest.raises(ConfigError, match="at least 32 bytes") as caught:
        request_state_keys(
            settings(state=shared(request_state_keys=[{"env": "K"}])), {"K": "short-key"}
        )
    assert "short-key" not in str(caught.value)


def test_replicas_with_the_same_keys_open_each_others_request_state() -> None:
    """Rotation: a replica already on [new, old] opens what one still on [old] sealed, and
    a replica with an unrelated key opens nothing."""
    environ = {"OLD": KEY_A, "NEW": KEY_B}
    old = request_state_keys(settings(state=shared(request_state_keys=[{"env": "OLD"}])), environ)
    rotated = request_state_keys(
        settings(state=shared(request_state_keys=[{"env": "NEW"}, {"env": "OLD"}])), environ
    )
    sealed = RequestStateSecurity(keys=old, audience="nexus").codec.seal(b"round-1")
    assert RequestStateSecurity(keys=rotated, audience="nexus").codec.unseal(sealed) == b"round-1"
    resealed = RequestStateSecurity(keys=rotated, audience="nexus").codec.seal(b"round-2")
    with pytest.raises(Exception):  # noqa: B017 - the codec's own refusal type
        RequestStateSecurity(keys=[b"c" * 40], audience="nexus").codec.unseal(resealed)


# --- workers -------------------------------------------------------------------------------


def test_one_worker_is_always_fine() -> None:
    check_workers(settings())


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"workers": 2, "transport": "stdio"}, "--transport http"),
        ({"workers": 2, "transport": "http", "stateless_http": True}, "state.backend: shared"),
        ({"workers": 2, "transport": "http", "state": shared()}, "--stateless-http"),
    ],
)
def test_several_workers_need_http_the_shared_backend_and_stateless_http(
    values: dict[str, Any], reason: str
) -> None:
    with pytest.raises(ConfigError, match=reason):
        check_workers(settings(**values))


def test_workers_setting_is_bounded() -> None:
    with pytest.raises(ValueError):
        Settings(workers=0)


# --- session affinity ----------------------------------------------------------------------


async def _run(
    middleware: SessionAffinityMiddleware, request_headers: list[tuple[bytes, bytes]]
) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    seen: dict[str, Any] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen["headers"] = list(scope["headers"])
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"Mcp-Session-Id", b"abc123"), (b"content-type", b"x")],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    middleware.app = app
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        sent.append(message)

    await middleware({"type": "http", "headers": request_headers}, receive, send)
    return seen["headers"], sent[0]["headers"]


async def test_session_ids_carry_the_instance_and_lose_it_on_the_way_in() -> None:
    middleware = SessionAffinityMiddleware(lambda *a: None, "r2")  # type: ignore[arg-type]
    inbound, outbound = await _run(middleware, [(b"mcp-session-id", b"r2.abc123")])
    assert (b"mcp-session-id", b"abc123") in inbound
    assert (b"Mcp-Session-Id", b"r2.abc123") in outbound
    assert (b"content-type", b"x") in outbound


async def test_another_replicas_session_stays_unknown_here() -> None:
    middleware = SessionAffinityMiddleware(lambda *a: None, "r2")  # type: ignore[arg-type]
    inbound, _ = await _run(middleware, [(b"mcp-session-id", b"r1.abc123")])
    assert (b"mcp-session-id", b"r1.abc123") in inbound


def test_affinity_layer_only_with_an_instance_id_and_sessions() -> None:
    def layers(config: Settings) -> list[Any]:
        return [spec.cls for spec in http_options(config)["middleware"]]

    assert SessionAffinityMiddleware not in layers(settings())
    assert SessionAffinityMiddleware in layers(settings(state={"instance_id": "r1"}))
    assert SessionAffinityMiddleware not in layers(
        settings(state={"instance_id": "r1"}, stateless_http=True)
    )
    with pytest.raises(ValueError):
        Settings(state={"instance_id": "r1.evil"})


# --- state export / import (embedded; the shared side is in tests/unit/stores) ------------


def test_export_then_import_round_trips_grants_between_data_dirs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_mcp.cli import main
    from nexus_mcp.stores.grants import RelationTuple, SqliteTupleStore
    from nexus_mcp.stores.locations import grants_path

    monkeypatch.delenv("NEXUS_MCP_CONFIG", raising=False)
    source, target = tmp_path / "a", tmp_path / "b"
    store = SqliteTupleStore(grants_path(Settings(data_dir=source)))
    store.write([RelationTuple("alice", "direct_viewer", "/tools/nexus_grep")], "default")
    store.set_assignment("bob", "minimal", "default")
    store.write([RelationTuple("carol", "direct_viewer", "/tools/x")], "other")
    store.close()
    out = tmp_path / "grants.json"
    assert main(["state", "export", "--data-dir", str(source), "-o", str(out)]) == 0
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    assert main(["state", "import", "--data-dir", str(target), str(out)]) == 0
    copy = SqliteTupleStore(grants_path(Settings(data_dir=target)))
    try:
        assert copy.check("alice", "direct_viewer", "/tools/nexus_grep", "default")
        assert copy.get_assignment("bob", "default") == "minimal"
        assert copy.check("carol", "direct_viewer", "/tools/x", "other")
    finally:
        copy.close()


@pytest.mark.parametrize(
    "document",
    [
        "not json",
        json.dumps({"format": "other", "version": 1, "zones": []}),
        json.dumps(
            {
                "format": "nexus-mcp.grants-export",
                "version": 1,
                "zones": [{"zone": "z", "revision": 1, "tuples": [["a", "b"]], "assignments": {}}],
            }
        ),
        json.dumps(
            {
                "format": "nexus-mcp.grants-export",
                "version": 1,
                "zones": [
                    {"zone": "z", "revision": 0, "tuples": [], "assignments": {}},
                    {"zone": "z", "revision": 0, "tuples": [], "assignments": {}},
                ],
            }
        ),
    ],
)
def test_a_malformed_import_changes_nothing(
    tmp_path: Path,
    document: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nexus_mcp.cli import main

    monkeypatch.delenv("NEXUS_MCP_CONFIG", raising=False)
    path = tmp_path / "in.json"
    path.write_text(document)
    assert main(["state", "import", "--data-dir", str(tmp_path / "d"), str(path)]) == 2
    assert not (tmp_path / "d" / "grants.sqlite3").exists()
    assert "Traceback" not in capsys.readouterr().err


# --- /metrics in prod ----------------------------------------------------------------------


def test_prod_serves_metrics_only_with_a_bearer_token_given_by_reference(tmp_path: Path) -> None:
    from pydantic import SecretStr

    from nexus_mcp.server.startup import build_server_observability

    base: dict[str, Any] = {"mode": "prod", "transport": "http", "data_dir": tmp_path}
    assert build_server_observability(Settings(**base), {}).metrics is None
    by_reference = Settings(**base, metrics={"bearer_token": {"env": "SCRAPE"}})
    served = build_server_observability(by_reference, {"SCRAPE": "scrape-token-0123456789"})
    assert served.metrics is not None
    assert isinstance(served.bearer_token, SecretStr)
    with pytest.raises(ConfigError, match="by reference") as caught:
        build_server_observability(
            Settings(**base, metrics={"bearer_token": "inline-token-0123456789"}), {}
        )
    assert "inline-token" not in str(caught.value)
    dev = Settings(mode="dev", transport="http", data_dir=tmp_path)
    assert build_server_observability(dev, {}).metrics is not None
