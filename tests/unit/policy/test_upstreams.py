"""The ``upstreams:`` section: validation lists every problem, secrets only by reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.upstreams import (
    RULE_UPSTREAM_NO_POLICY,
    RULE_UPSTREAM_TOOL_NOT_ALLOWED,
    UpstreamConfig,
    decide_upstream_write,
    load_upstreams,
    resolve_secrets,
)

CANARY = "sk-canary-9f2e7d"


def stdio(**extra: Any) -> dict[str, Any]:
    return {"server_id": "up", "transport": "stdio", "command": "python", **extra}


def http(**extra: Any) -> dict[str, Any]:
    return {"server_id": "web", "transport": "http", "url": "http://127.0.0.1:9/mcp", **extra}


def load(raw: Any, mode: str = "prod") -> Any:
    return load_upstreams(raw, mode=mode, native_server_id="nexus")


def test_no_section_is_no_upstream() -> None:
    assert load(None).servers == ()


def test_defaults() -> None:
    (server,) = load([stdio()]).servers
    assert server.name_prefix == "up_"
    assert server.exposed_name("echo") == "up_echo"
    assert server.allows("anything")
    assert server.forward.sampling is False
    assert server.forward.elicitation is False
    assert server.forward.roots is False
    assert server.shared is False
    assert server.write_policy is None
    assert server.timeouts.call_seconds < 30  # below the default tool timeout


def test_every_error_is_listed_with_its_location_and_no_value() -> None:
    raw = [
        {"server_id": "bad id!", "transport": "stdio", "command": "x"},
        {"server_id": "web", "transport": "http", "url": "ftp://x/" + CANARY},
        {"server_id": "ok", "transport": "stdio", "command": "x", "bogus": CANARY},
        {"server_id": "nocmd", "transport": "stdio"},
    ]
    with pytest.raises(ConfigError) as caught:
        load(raw)
    message = str(caught.value)
    assert message.splitlines() == [
        "invalid configuration (4 problems):",
        "  `upstreams[0].server_id` should match the pattern ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        "  `upstreams.web`: transport 'http' needs an http:// or https:// url",
        "  unknown key `upstreams.ok.bogus`",
        "  `upstreams.nocmd`: transport 'stdio' needs command",
    ]
    assert CANARY not in message


def test_duplicate_ids_overlapping_prefixes_and_the_native_id_are_refused() -> None:
    raw = [
        stdio(),
        stdio(),
        stdio(server_id="up2", prefix="up"),
        stdio(server_id="nexus"),
    ]
    with pytest.raises(ConfigError) as caught:
        load(raw)
    message = str(caught.value)
    assert "`upstreams[1].server_id`: also used by `upstreams[0]`" in message
    assert "overlaps the prefix" in message
    assert "native server's id" in message


def test_inline_secrets_are_refused_in_prod_and_warned_in_dev() -> None:
    raw = [http(credentials={"type": "bearer", "token": CANARY})]
    with pytest.raises(ConfigError) as caught:
        load(raw)
    assert "inline secrets are refused in prod" in str(caught.value)
    assert CANARY not in str(caught.value)
    config = load(raw, mode="dev")
    assert config.warnings and CANARY not in " ".join(config.warnings)


@pytest.mark.parametrize(
    ("credentials", "problem"),
    [
        ({"type": "bearer"}, "needs token"),
        ({"type": "header", "value": {"env": "X"}}, "needs header"),
        ({"type": "header", "header": "Host", "value": {"env": "X"}}, "transport owns"),
        ({"type": "header", "header": "bad header", "value": {"env": "X"}}, "header name"),
        ({"type": "mtls", "cert_file": "c.pem"}, "needs key_file"),
        ({"type": "none", "token": {"env": "X"}}, "does not take token"),
        ({"type": "bearer", "token": {"env": "X", "file": "f"}}, "exactly one"),
    ],
)
def test_credential_shapes(credentials: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load([http(credentials=credentials)])


def test_stdio_takes_no_url_or_credentials_and_http_no_command() -> None:
    with pytest.raises(ConfigError, match="does not take url"):
        load([stdio(url="http://x")])
    with pytest.raises(ConfigError, match="no credentials"):
        load([stdio(credentials={"type": "bearer", "token": {"env": "X"}})])
    with pytest.raises(ConfigError, match="does not take command"):
        load([http(command="python")])


def test_names_follow_the_tool_name_rule() -> None:
    with pytest.raises(ConfigError, match="tool-name rule"):
        load([stdio(tools=["fine", "not fine"])])
    with pytest.raises(ConfigError, match="prefix"):
        load([stdio(prefix="a/b")])
    (server,) = load([stdio(prefix="")]).servers
    assert server.exposed_name("x" * 129) is None  # would break MCP's rule: never exposed


def test_allowlist() -> None:
    (server,) = load([stdio(tools=["echo"])]).servers
    assert server.allows("echo")
    assert not server.allows("write_note")


def test_secrets_resolve_by_reference(tmp_path: Path) -> None:
    secret_file = tmp_path / "token"
    secret_file.write_text(CANARY + "\n")
    raw = [
        http(credentials={"type": "bearer", "token": {"file": str(secret_file)}}),
        http(
            server_id="w2",
            credentials={"type": "header", "header": "X-Api-Key", "value": {"env": "API_KEY"}},
        ),
        stdio(secret_env={"GITHUB_TOKEN": {"env": "GH"}}),
    ]
    config = load(raw)
    bearer = resolve_secrets(config.servers[0], {})
    assert bearer.headers["Authorization"].get_secret_value() == f"Bearer {CANARY}"
    assert CANARY not in repr(bearer)
    header = resolve_secrets(config.servers[1], {"API_KEY": "k1"})
    assert header.headers["X-Api-Key"].get_secret_value() == "k1"
    env = resolve_secrets(config.servers[2], {"GH": "g1"})
    assert env.env["GITHUB_TOKEN"].get_secret_value() == "g1"
    with pytest.raises(ConfigError, match="env:API_KEY is not set"):
        resolve_secrets(config.servers[1], {})


def test_write_policy_is_deny_by_default_in_prod() -> None:
    (server,) = load([stdio()]).servers
    assert decide_upstream_write(server, "write_note", mode="prod").rule == (
        RULE_UPSTREAM_NO_POLICY
    )
    assert decide_upstream_write(server, "write_note", mode="dev").allowed
    (server,) = load(
        [stdio(write_policy={"allowed_tools": ["write_note"], "require_approval": True})]
    ).servers
    decision = decide_upstream_write(server, "write_note", mode="prod")
    assert decision.allowed and decision.requires_approval
    other = decide_upstream_write(server, "delete_all", mode="prod")
    assert not other.allowed and other.rule == RULE_UPSTREAM_TOOL_NOT_ALLOWED


def test_endpoint_names_what_the_upstream_is_never_a_secret() -> None:
    server = UpstreamConfig.model_validate(
        http(credentials={"type": "header", "header": "X-K", "value": {"env": "K"}})
    )
    assert server.endpoint() == ("http", "http://127.0.0.1:9/mcp")
