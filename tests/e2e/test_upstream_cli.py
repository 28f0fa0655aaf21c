"""``nexus-mcp upstream list | check | pin`` against the recording test server as a process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from .upstream_harness import Gateway, make_gateway, run_cli, stdio_upstream


def gateway(tmp_path: Path) -> Gateway:
    return make_gateway(tmp_path / "gw", [stdio_upstream()])


def pins(gw: Gateway) -> dict[str, str]:
    path = gw.registry_dir / "up.lock.json"
    if not path.exists():
        return {}
    tools = json.loads(path.read_text())["tools"]
    return {name: entry["sha256"] for name, entry in tools.items()}


def cli(gw: Gateway, *args: str) -> int:
    return run_cli(["upstream", *args, "--config", str(gw.config_file)])


def test_list_shows_every_tool_with_its_class_and_pin_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gw = gateway(tmp_path)
    assert cli(gw, "list") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["server", "state", "tool", "exposed", "as", "class", "pin", "status"]
    rows = {line.split()[2]: line.split() for line in out[1:]}
    assert rows["echo"] == ["up", "ready", "echo", "up_echo", "read", "unpinned", "quarantined"]
    assert rows["write_note"][4] == "write"


def test_check_exits_one_on_any_drift_and_zero_when_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gw = gateway(tmp_path)
    assert cli(gw, "check", "up") == 1  # nothing pinned
    assert cli(gw, "pin", "up", "--yes") == 0
    assert cli(gw, "check", "up") == 0
    capsys.readouterr()

    config = yaml.safe_load(gw.config_file.read_text())
    config["upstreams"][0]["args"] += ["--variant", "v2"]  # echo's description changed
    gw.config_file.write_text(yaml.safe_dump(config))
    assert cli(gw, "check", "up") == 1
    assert "echo" in capsys.readouterr().err

    # A pinned tool the upstream no longer lists is drift too.
    lock = gw.registry_dir / "up.lock.json"
    document = json.loads(lock.read_text())
    document["tools"]["retired_tool"] = {"sha256": "a" * 64}
    lock.write_text(json.dumps(document))
    config["upstreams"][0]["args"] = config["upstreams"][0]["args"][:-2]
    gw.config_file.write_text(yaml.safe_dump(config))
    assert cli(gw, "check", "up") == 1
    assert "retired_tool (pinned, no longer listed)" in capsys.readouterr().err


def test_check_exits_one_when_it_cannot_connect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream(command="/nonexistent/upstream", timeouts={"connect_seconds": 2})],
    )
    assert cli(gw, "check", "up") == 1
    assert "could not connect" in capsys.readouterr().err


def test_pin_refuses_without_a_terminal_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gw = gateway(tmp_path)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert cli(gw, "pin", "up") == 2
    assert "--yes" in capsys.readouterr().err
    assert pins(gw) == {}


def test_pin_one_tool_only(tmp_path: Path) -> None:
    gw = gateway(tmp_path)
    assert cli(gw, "pin", "up", "--tool", "echo", "--yes") == 0
    assert set(pins(gw)) == {"echo"}
    assert cli(gw, "pin", "up", "--tool", "no_such_tool", "--yes") == 2
    assert set(pins(gw)) == {"echo"}


def test_an_unknown_server_is_named_and_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gw = gateway(tmp_path)
    assert cli(gw, "check", "elsewhere") == 2
    assert "no upstream 'elsewhere'" in capsys.readouterr().err


def test_a_missing_secret_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("UP_NOT_SET", raising=False)
    gw = make_gateway(
        tmp_path / "gw",
        [
            {
                "server_id": "up",
                "transport": "http",
                "url": "http://127.0.0.1:9/mcp",
                "credentials": {"type": "bearer", "token": {"env": "UP_NOT_SET"}},
            }
        ],
    )
    assert cli(gw, "check", "up") == 2
    err = capsys.readouterr().err
    assert "env:UP_NOT_SET is not set" in err
    assert "Traceback" not in err
