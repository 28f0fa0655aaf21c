"""Settings precedence and error messages that name the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.settings import load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("NEXUS_MCP_"):
            monkeypatch.delenv(key)


def test_defaults_are_safe() -> None:
    settings = load_settings()
    assert (settings.mode, settings.transport, settings.host) == ("prod", "stdio", "127.0.0.1")
    assert settings.subject is None


def test_flags_beat_environment_which_beats_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("port: 1111\nhost: 0.0.0.0\nmode: dev\nlimits:\n  max_read_bytes: 2048\n")
    monkeypatch.setenv("NEXUS_MCP_PORT", "2222")
    monkeypatch.setenv("NEXUS_MCP_LIMITS__MAX_READ_BYTES", "4096")
    settings = load_settings(config, {"host": "127.0.0.2", "mode": None})
    assert settings.port == 2222
    assert settings.host == "127.0.0.2"
    assert settings.mode == "dev"
    assert settings.limits.max_read_bytes == 4096


def test_launch_principal_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXUS_MCP_SUBJECT", "alice")
    monkeypatch.setenv("NEXUS_MCP_READ_ONLY", "true")
    monkeypatch.setenv("NEXUS_MCP_SCOPES", "notes:read,files:read")
    settings = load_settings()
    assert (settings.subject, settings.read_only, settings.scopes) == (
        "alice",
        True,
        "notes:read,files:read",
    )


@pytest.mark.parametrize(
    ("env", "value", "named"),
    [
        ("NEXUS_MCP_PORT", "eighty", "NEXUS_MCP_PORT: `port`"),
        ("NEXUS_MCP_MODE", "staging", "NEXUS_MCP_MODE: `mode`"),
        ("NEXUS_MCP_AUTH__JWT_SECRET", "short", "NEXUS_MCP_AUTH__JWT_SECRET: `auth.jwt_secret`"),
        ("NEXUS_MCP_READ_ONLY", "maybe", "NEXUS_MCP_READ_ONLY: `read_only`"),
    ],
)
def test_bad_values_name_the_setting_and_not_the_value(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, named: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert named in str(info.value)
    assert value not in str(info.value)


def test_unknown_file_keys_and_bad_yaml_are_reported_with_the_file(tmp_path: Path) -> None:
    bad_key = tmp_path / "k.yaml"
    bad_key.write_text("prot: 1\n")
    with pytest.raises(ConfigError, match="unknown key `prot`; did you mean `port`"):
        load_settings(bad_key)
    bad_yaml = tmp_path / "y.yaml"
    bad_yaml.write_text("port: [1,\n")
    with pytest.raises(ConfigError, match=r"y\.yaml is not valid YAML at line"):
        load_settings(bad_yaml)
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "missing.yaml")


@pytest.mark.parametrize("value", ["-1", "301", "soon", "1.5"])
def test_a_bad_token_leeway_names_its_setting(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("NEXUS_MCP_AUTH__LEEWAY_SECONDS", value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "NEXUS_MCP_AUTH__LEEWAY_SECONDS: `auth.leeway_seconds`" in str(info.value)


def test_tokens_need_exp_and_get_thirty_seconds_of_leeway_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    auth = load_settings().auth
    assert (auth.leeway_seconds, auth.allow_tokens_without_exp) == (30, False)
    monkeypatch.setenv("NEXUS_MCP_AUTH__LEEWAY_SECONDS", "0")
    monkeypatch.setenv("NEXUS_MCP_AUTH__ALLOW_TOKENS_WITHOUT_EXP", "true")
    auth = load_settings().auth
    assert (auth.leeway_seconds, auth.allow_tokens_without_exp) == (0, True)


def test_the_canister_deadline_defaults_below_the_default_tool_timeout() -> None:
    settings = load_settings()
    assert settings.notes.total_timeout_seconds == 25.0
    assert settings.notes.total_timeout_seconds < settings.budgets.tool_timeout_seconds


@pytest.mark.parametrize(
    "env",
    [
        {"NEXUS_MCP_NOTES__TOTAL_TIMEOUT_SECONDS": "0"},
        {"NEXUS_MCP_NOTES__TOTAL_TIMEOUT_SECONDS": "-5"},
        {"NEXUS_MCP_NOTES__TOTAL_TIMEOUT_SECONDS": "3601"},
        {"NEXUS_MCP_NOTES__TOTAL_TIMEOUT_SECONDS": "9"},  # the read timeout is 10 s
        {
            "NEXUS_MCP_NOTES__TOTAL_TIMEOUT_SECONDS": "4",
            "NEXUS_MCP_NOTES__READ_TIMEOUT_SECONDS": "1",
        },
    ],
    ids=["zero", "negative", "too-long", "shorter-than-read", "shorter-than-connect"],
)
def test_a_canister_deadline_shorter_than_its_parts_names_its_setting(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    named = "NEXUS_MCP_NOTES__TOTAL_TIMEOUT_SECONDS: `notes.total_timeout_seconds`"
    assert named in str(info.value)


@pytest.mark.parametrize("server_id", ["my server", "", "-lead", "a/b", "x" * 65, "n\u00e9xus"])
def test_a_native_server_id_the_tool_call_record_refuses_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, server_id: str
) -> None:
    # Every call's tool_call record carries this id; an id the schema refuses would
    # otherwise refuse every call with TOOL_CALL_RECORD_INVALID instead of failing here.
    monkeypatch.setenv("NEXUS_MCP_REGISTRY__SERVER_ID", server_id)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "registry.server_id" in str(info.value)
    if server_id:
        assert server_id not in str(info.value)


def test_a_native_server_id_of_the_record_rule_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXUS_MCP_REGISTRY__SERVER_ID", "corp.nexus-1")
    assert load_settings().registry.server_id == "corp.nexus-1"
