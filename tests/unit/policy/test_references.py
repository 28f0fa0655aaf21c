"""``${NAME}`` in a secret setting of ``nexus.yaml``: read once from the environment, kept
a reference where the setting takes one, and an unset variable named with its key."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.approvals import load_approval_keys
from nexus_mcp.policy.repos import load_repos_config
from nexus_mcp.policy.upstreams import SecretRef, load_upstreams, resolve_secret, resolve_secrets
from nexus_mcp.settings import load_settings

CANARY = "sk-canary-7a3b" + "x" * 32  # long enough for any secret setting


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("NEXUS_MCP_"):
            monkeypatch.delenv(key)


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "nexus.yaml"
    path.write_text(text)
    return path


def refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(config(tmp_path, text))
    return str(caught.value)


def test_a_text_secret_is_read_from_its_variable_at_load_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_TEST_JWT", CANARY)
    settings = load_settings(config(tmp_path, "auth:\n  jwt_secret: ${NEXUS_TEST_JWT}\n"))
    assert settings.auth.jwt_secret is not None
    assert settings.auth.jwt_secret.get_secret_value() == CANARY
    assert CANARY not in repr(settings)


def test_a_variable_whose_value_holds_the_form_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ${OUTER} -> "${INNER}..." stays as it is: one read, no recursion, no injection.
    monkeypatch.setenv("NEXUS_TEST_INNER", CANARY)
    monkeypatch.setenv("NEXUS_TEST_OUTER", "${NEXUS_TEST_INNER}" + "y" * 32)
    settings = load_settings(config(tmp_path, "auth:\n  jwt_secret: ${NEXUS_TEST_OUTER}\n"))
    assert settings.auth.jwt_secret is not None
    assert settings.auth.jwt_secret.get_secret_value() == "${NEXUS_TEST_INNER}" + "y" * 32
    monkeypatch.setenv("NEXUS_TEST_OUTER", "${NEXUS_TEST_OUTER}")  # itself: no loop either
    message = refusal(tmp_path, "auth:\n  jwt_secret: ${NEXUS_TEST_OUTER}\n")
    assert message.endswith("`auth.jwt_secret`: must be at least 32 bytes")


def test_a_value_from_the_environment_is_never_read_as_a_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    literal = "${NEXUS_TEST_LONG_ENOUGH_VARIABLE_NAME_X}"
    monkeypatch.setenv("NEXUS_TEST_LONG_ENOUGH_VARIABLE_NAME_X", CANARY)
    monkeypatch.setenv("NEXUS_MCP_AUTH__JWT_SECRET", literal)
    settings = load_settings()
    assert settings.auth.jwt_secret is not None
    assert settings.auth.jwt_secret.get_secret_value() == literal


def test_a_setting_that_takes_a_reference_keeps_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_TEST_TOKEN", CANARY)
    monkeypatch.setenv("NEXUS_TEST_KEY", CANARY)
    text = (
        "metrics:\n  bearer_token: ${NEXUS_TEST_TOKEN}\n"
        "state:\n  request_state_keys: ['${NEXUS_TEST_KEY}']\n"
        "fixture_key: ${NEXUS_TEST_KEY}\n"
    )
    settings = load_settings(config(tmp_path, text))
    assert settings.metrics.bearer_token == SecretRef(env="NEXUS_TEST_TOKEN")
    assert settings.state.request_state_keys == (SecretRef(env="NEXUS_TEST_KEY"),)
    assert settings.fixture_key == SecretRef(env="NEXUS_TEST_KEY")
    assert resolve_secret(settings.fixture_key, os.environ).get_secret_value() == CANARY


def test_an_unset_variable_names_the_key_and_the_variable(tmp_path: Path) -> None:
    text = "mode: dev\nstate:\n  postgres_url: ${NEXUS_TEST_UNSET_PG}\n"
    path = config(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert str(caught.value) == (
        f"{path}:3: `state.postgres_url` names the environment variable NEXUS_TEST_UNSET_PG, "
        "which is not set"
    )


def test_a_variable_set_to_nothing_counts_as_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_TEST_EMPTY", "")
    assert "NEXUS_TEST_EMPTY, which is not set" in refusal(
        tmp_path, "health:\n  bearer_token: ${NEXUS_TEST_EMPTY}\n"
    )


@pytest.mark.parametrize("value", ["Bearer ${X}", "${X:-fallback}", "${X}${Y}", "$${X}"])
def test_the_form_inside_other_text_is_refused_not_sent_as_the_secret(
    tmp_path: Path, value: str
) -> None:
    message = refusal(tmp_path, f"notes:\n  canister_token: '{value}'\n")
    assert message.endswith(
        "`notes.canister_token`: name an environment variable as the whole value, ${NAME} "
        "(no text around it)"
    )


def test_a_setting_that_is_not_a_secret_is_left_as_written(tmp_path: Path) -> None:
    settings = load_settings(config(tmp_path, "server_name: ${NOT_READ}\n"))
    assert settings.server_name == "${NOT_READ}"


def test_a_huge_variable_name_is_capped_in_the_problem(tmp_path: Path) -> None:
    name = "V" * 10_000
    message = refusal(tmp_path, f"auth:\n  jwt_secret: ${{{name}}}\n")
    assert "V" * 64 + "..." in message and len(message) < 400


def upstream(**extra: Any) -> dict[str, Any]:
    return {"server_id": "fs", "transport": "stdio", "command": "npx", **extra}


def test_an_upstream_env_entry_written_as_a_reference_becomes_a_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NEXUS_TEST_GH", CANARY)
    raw = [upstream(env={"GITHUB_TOKEN": "${NEXUS_TEST_GH}", "LOG": "debug"})]
    (server,) = load_upstreams(raw, mode="prod", native_server_id="nexus").servers
    assert server.env == {"LOG": "debug"}
    assert server.secret_env == {"GITHUB_TOKEN": SecretRef(env="NEXUS_TEST_GH")}
    assert resolve_secrets(server, os.environ).env["GITHUB_TOKEN"].get_secret_value() == CANARY


def test_an_upstream_credential_by_reference_is_accepted_in_prod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NEXUS_TEST_TOKEN", CANARY)
    raw = [
        {
            "server_id": "web",
            "transport": "http",
            "url": "https://mcp.example.com/mcp",
            "credentials": {"type": "bearer", "token": "${NEXUS_TEST_TOKEN}"},
            "secret_env": {},
        }
    ]
    (server,) = load_upstreams(raw, mode="prod", native_server_id="nexus").servers
    assert server.credentials.token == SecretRef(env="NEXUS_TEST_TOKEN")
    headers = resolve_secrets(server, os.environ).headers
    assert headers["Authorization"].get_secret_value() == f"Bearer {CANARY}"


def test_an_upstream_reference_to_an_unset_variable_names_it(tmp_path: Path) -> None:
    raw = [upstream(secret_env={"API_KEY": "${NEXUS_TEST_UNSET}"})]
    source = tmp_path / "nexus.yaml"
    source.write_text("upstreams:\n  - server_id: fs\n    secret_env:\n      API_KEY: x\n")
    with pytest.raises(ConfigError) as caught:
        load_upstreams(raw, mode="prod", native_server_id="nexus", source=source)
    assert str(caught.value) == (
        f"{source}:4: `upstreams.fs.secret_env.API_KEY` names the environment variable "
        "NEXUS_TEST_UNSET, which is not set"
    )


def test_a_forge_token_by_reference_is_accepted_in_prod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_TEST_FORGE", CANARY)
    forge = {
        "base_url": "https://api.github.com",
        "repository": "o/r",
        "token": "${NEXUS_TEST_FORGE}",
    }
    raw = {
        "allowed_roots": [str(tmp_path)],
        "repositories": {"proj": {"path": str(tmp_path / "proj"), "forge": forge}},
    }
    config_ = load_repos_config(raw, mode="prod")
    forge_config = config_.repositories["proj"].forge
    assert forge_config is not None
    assert forge_config.token == SecretRef(env="NEXUS_TEST_FORGE")


def test_an_approval_secret_is_read_once_from_its_variable() -> None:
    env = {"NEXUS_TEST_APPROVAL": CANARY, "NEXUS_TEST_NESTED": "${NEXUS_TEST_APPROVAL}" * 3}
    keys = load_approval_keys(env, {"approvals": {"secret": "${NEXUS_TEST_APPROVAL}"}})
    assert keys.secret_for(keys.active_kid) == CANARY.encode()
    nested = {"approvals": {"keys": {"k1": "${NEXUS_TEST_NESTED}"}}}
    keys = load_approval_keys(env, nested)
    assert keys.secret_for("k1") == ("${NEXUS_TEST_APPROVAL}" * 3).encode()
    with pytest.raises(ConfigError) as caught:
        load_approval_keys({}, {"approvals": {"secret": "${NEXUS_TEST_APPROVAL}"}})
    assert str(caught.value) == (
        "`approvals.secret` names the environment variable NEXUS_TEST_APPROVAL, which is not set"
    )


def test_an_unknown_approvals_key_gets_a_guess_and_no_value() -> None:
    with pytest.raises(ConfigError) as caught:
        load_approval_keys({}, {"approvals": {"secrte": CANARY}})
    assert str(caught.value) == "unknown key `approvals.secrte`; did you mean `approvals.secret`?"


def test_a_reference_that_reached_no_loader_is_still_not_the_secret() -> None:
    assert resolve_secret("${NEXUS_TEST_X}", {"NEXUS_TEST_X": CANARY}).get_secret_value() == CANARY
    with pytest.raises(ConfigError, match="env:NEXUS_TEST_X is not set"):
        resolve_secret("${NEXUS_TEST_X}", {})


@pytest.mark.parametrize("bad", ["API_KEY", ["API_KEY"], 5])
def test_a_bad_secret_env_beside_an_env_reference_is_still_reported(
    monkeypatch: pytest.MonkeyPatch, bad: Any
) -> None:
    # Moving ``env: {X: ${NAME}}`` into ``secret_env`` replaced a ``secret_env`` that was
    # not a mapping: the operator's mistake vanished, and the secrets it meant with it.
    monkeypatch.setenv("NEXUS_TEST_GH", CANARY)
    raw = [upstream(env={"GITHUB_TOKEN": "${NEXUS_TEST_GH}"}, secret_env=bad)]
    with pytest.raises(ConfigError) as caught:
        load_upstreams(raw, mode="prod", native_server_id="nexus")
    assert "`upstreams.fs.secret_env` should be a mapping" in str(caught.value)
    assert CANARY not in str(caught.value)
