"""``nexus-mcp approvals mint|verify`` driven through a real argparse parser."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jwt
import pytest
from fastmcp.utilities.tests import asgi_server

from nexus_mcp.commands.approvals import add_parser
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.policy.approvals import (
    ApprovalKeys,
    ApprovalSettings,
    verify_approval_token,
)
from nexus_mcp.policy.registry import default_registry_dir, load_registry_dir
from nexus_mcp.server import build_server
from nexus_mcp.settings import Settings

SECRET = "CANARY-cli-secret-0123456789abcdefghijkl"
NEW_SECRET = "CANARY-new-secret-0123456789abcdefghijkl"
ARGS = '{"path": "notes/a.md", "content": "hi"}'
ENV_NAMES = (
    "NEXUS_MCP_APPROVAL_SECRET",
    "NEXUS_MCP_APPROVAL_KEYS",
    "NEXUS_MCP_APPROVAL_ACTIVE_KID",
    "NEXUS_MCP_APPROVAL_AUDIENCE",
    "NEXUS_MCP_APPROVAL_ISSUER",
    "NEXUS_MCP_APPROVAL_TTL_SECONDS",
)
BINDING = ["--tool", "nexus_write_file", "--subject", "agent-7", "--args", ARGS]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXUS_MCP_APPROVAL_SECRET", SECRET)


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nexus-mcp")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result = args.func(args)
    assert isinstance(result, int)
    return result


def mint(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert run(["approvals", "mint", *BINDING, "--approver", "alice", *extra]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out.strip()


@pytest.mark.usefixtures("secret_env")
def test_mint_prints_a_token_bound_to_the_call(capsys: pytest.CaptureFixture[str]) -> None:
    token = mint(capsys, "--host-id", "laptop")
    keys = ApprovalKeys({"k1": SECRET.encode()}, "k1")
    claims = verify_approval_token(
        keys,
        ApprovalSettings(),
        token,
        subject="agent-7",
        tool="nexus_write_file",
        arguments=json.loads(ARGS),
    )
    assert (claims.sub, claims.host_id, claims.exp - claims.iat) == ("alice", "laptop", 300)


@pytest.mark.usefixtures("secret_env")
def test_verify_prints_the_claims_with_the_jti_only_hashed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    token = mint(capsys)
    assert run(["approvals", "verify", token, *BINDING]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert set(shown) == {
        "ver",
        "iss",
        "aud",
        "sub",
        "iat",
        "nbf",
        "exp",
        "jti_sha256",
        "tool",
        "args_sha256",
        "subject",
        "host_id",
    }
    assert jwt.decode(token, options={"verify_signature": False})["jti"] not in json.dumps(shown)


@pytest.mark.usefixtures("secret_env")
def test_verify_prints_the_error_code_for_another_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    token = mint(capsys)
    other = ["--tool", "nexus_write_file", "--subject", "agent-7", "--args", '{"path": "x"}']
    assert run(["approvals", "verify", token, *other]) == 1
    assert json.loads(capsys.readouterr().out) == {
        "code": "APPROVAL_INVALID",
        "reason": "arguments_mismatch",
    }


@pytest.mark.usefixtures("secret_env")
def test_verify_with_another_audience_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    token = mint(capsys, "--audience", "other-server")
    assert run(["approvals", "verify", token, *BINDING]) == 1
    assert json.loads(capsys.readouterr().out)["reason"] == "bad_audience"
    assert run(["approvals", "verify", token, *BINDING, "--audience", "other-server"]) == 0


@pytest.mark.usefixtures("secret_env")
def test_args_can_come_from_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args_file = tmp_path / "args.json"
    args_file.write_text(ARGS, encoding="utf-8")
    token = mint(capsys)
    from_file = [*BINDING[:-1], f"@{args_file}"]
    assert run(["approvals", "verify", token, *from_file]) == 0


def test_the_secret_can_come_from_the_yaml_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "nexus.yaml"
    config.write_text(f"approvals:\n  secret: {SECRET}\n  ttl_seconds: 120\n", encoding="utf-8")
    token = mint(capsys, "--config", str(config))
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 120
    assert run(["approvals", "verify", token, *BINDING, "--config", str(config)]) == 0


def test_tokens_from_a_rotated_out_key_verify_while_the_key_is_kept(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_MCP_APPROVAL_KEYS", f"old:{SECRET}")
    token = mint(capsys)
    monkeypatch.setenv("NEXUS_MCP_APPROVAL_KEYS", f"old:{SECRET},new:{NEW_SECRET}")
    monkeypatch.setenv("NEXUS_MCP_APPROVAL_ACTIVE_KID", "new")
    assert run(["approvals", "verify", token, *BINDING]) == 0
    capsys.readouterr()
    assert jwt.get_unverified_header(mint(capsys))["kid"] == "new"
    monkeypatch.setenv("NEXUS_MCP_APPROVAL_KEYS", f"new:{NEW_SECRET}")
    assert run(["approvals", "verify", token, *BINDING]) == 1
    assert json.loads(capsys.readouterr().out)["reason"] == "unknown_kid"


@pytest.mark.parametrize(
    "extra",
    [
        ["--args", "not json"],
        ["--args", "[1, 2]"],
        ["--args", '{"path": NaN}'],  # Python reads NaN and Infinity; JSON has neither
        ["--args", '{"n": [-Infinity]}'],
        ["--args", '{"n": ' + "9" * 5000 + "}"],  # past Python's digit limit
        ["--args", "@/nonexistent/args.json"],
        ["--ttl", "600"],
        ["--config", "/nonexistent/nexus.yaml"],
    ],
)
@pytest.mark.usefixtures("secret_env")
def test_bad_flags_exit_with_a_usage_error(
    capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    assert run(["approvals", "mint", *BINDING, "--approver", "alice", *extra]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ")
    assert "not json" not in err


def test_mint_without_a_secret_exits_with_a_configuration_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["approvals", "mint", *BINDING, "--approver", "alice"]) == 2
    assert "NEXUS_MCP_APPROVAL_SECRET" in capsys.readouterr().err


def test_mint_with_an_empty_approver_exits_with_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_MCP_APPROVAL_SECRET", SECRET)
    assert run(["approvals", "mint", *BINDING, "--approver", ""]) == 2
    assert "approver" in capsys.readouterr().err


def test_approvals_without_an_action_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as caught:
        run(["approvals"])
    assert caught.value.code == 2


def test_the_secret_is_never_printed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_MCP_APPROVAL_KEYS", f"a:{SECRET},b:{NEW_SECRET}")
    outputs = []
    run(["approvals", "mint", *BINDING, "--approver", "alice"])  # no active kid: refused
    outputs.append(capsys.readouterr())
    monkeypatch.setenv("NEXUS_MCP_APPROVAL_ACTIVE_KID", "a")
    token = mint(capsys)
    for argv in (
        ["approvals", "verify", token, *BINDING],
        ["approvals", "verify", token + "x", *BINDING],
        ["approvals", "mint", *BINDING, "--approver", "alice", "--ttl", "5"],
    ):
        run(argv)
        outputs.append(capsys.readouterr())
    printed = "".join(out + err for out, err in outputs)
    assert "error: " in printed
    assert SECRET not in printed
    assert NEW_SECRET not in printed


# -- mint approves only a write tool of this server, as POST /approvals/mint does ---------

MINT_ARGS = {"path": "scratch/a.txt", "content": "x"}
HOSTILE_NAMES = [
    "no_such_tool",
    "NEXUS_WRITE_FILE",
    "nexus_write_file ",
    "nexus_write_file\u200b",
    "../nexus_write_file",
    "nexus/nexus_write_file",
    "nexus_write_file\n",
]


def write_config(tmp_path: Path, extra: str = "") -> Path:
    config = tmp_path / "nexus.yaml"
    config.write_text(f"approvals:\n  secret: {SECRET}\n{extra}", encoding="utf-8")
    return config


def cli_mint(capsys: pytest.CaptureFixture[str], config: Path, tool: str) -> tuple[int, str, str]:
    argv = ["approvals", "mint", "--config", str(config), "--tool", tool]
    code = run([*argv, "--subject", "dev", "--approver", "alice", "--args", json.dumps(MINT_ARGS)])
    out, err = capsys.readouterr()
    return code, out, err


async def test_mint_refuses_every_tool_the_mint_endpoint_refuses_with_the_same_answer(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = write_config(tmp_path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    settings = Settings(mode="dev", transport="http", workspace=workspace, data_dir=tmp_path / "d")
    server = build_server(settings, config_file=config, audit_sinks=[MemoryAuditSink()])
    registry = load_registry_dir(default_registry_dir()).get("nexus")
    assert registry is not None
    tools = [entry.tool_name for entry in registry.entries] + HOSTILE_NAMES
    try:
        async with asgi_server(server.mcp) as running, running.http_client() as http:
            for tool in tools:
                response = await http.post(
                    "/approvals/mint", json={"tool": tool, "arguments": MINT_ARGS}
                )
                capsys.readouterr()  # the server's own log lines
                code, out, err = cli_mint(capsys, config, tool)
                if response.status_code == 200:
                    assert code == 0, tool
                    assert out.count(".") == 2, tool  # a JWT
                else:
                    body = response.json()
                    assert (response.status_code, body["code"]) == (400, "INVALID_INPUT"), tool
                    assert (code, out) == (1, ""), tool
                    assert err == f"error: {body['error']} ({body['code']})\n", tool
    finally:
        server.close()
    write_tools = {e.tool_name for e in registry.entries if e.tool_class == "write"}
    assert write_tools and write_tools < set(tools)


@pytest.mark.parametrize("tool", ["nexus_read_file", "get_note_outline", *HOSTILE_NAMES])
def test_mint_for_a_tool_that_is_not_a_write_tool_exits_1_and_prints_no_token(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tool: str
) -> None:
    code, out, err = cli_mint(capsys, write_config(tmp_path), tool)

    assert (code, out) == (1, "")
    assert err.endswith("(INVALID_INPUT)\n")


def test_mint_asks_the_registry_the_config_file_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Another server id: its registry has no nexus_write_file, so nothing can be approved.
    config = write_config(tmp_path, "registry:\n  server_id: elsewhere\n")

    assert cli_mint(capsys, config, "nexus_write_file")[0] == 1
    assert cli_mint(capsys, write_config(tmp_path), "nexus_write_file")[0] == 0


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--ttl", "5"], "--ttl"),
        (["--ttl", "301"], "--ttl"),
        (["--audience", ""], "--audience"),
        (["--audience", "a" * 257], "--audience"),
        (["--issuer", ""], "--issuer"),
    ],
)
@pytest.mark.usefixtures("secret_env")
def test_a_bad_flag_value_names_the_flag(
    capsys: pytest.CaptureFixture[str], extra: list[str], flag: str
) -> None:
    assert run(["approvals", "mint", *BINDING, "--approver", "alice", *extra]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"error: {flag}: ")
    assert "approvals." not in err and "NEXUS_MCP_" not in err
