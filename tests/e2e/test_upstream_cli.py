"""``nexus-mcp upstream list | check | pin`` against the recording test server as a process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fastmcp import Client
from structlog.testing import capture_logs

from .servers import free_port
from .test_upstream_sandbox import bwrap_present  # noqa: F401 - the fixture, by name
from .upstream_harness import (
    UPSTREAM_SCRIPT,
    Gateway,
    http_upstream,
    make_gateway,
    run_cli,
    stdio_upstream,
)


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
    header = ["server", "state", "tool", "exposed", "as", "class", "pin", "status"]
    assert out[0].split() == [*header, "sandbox", "network"]
    rows = {line.split()[2]: line.split() for line in out[1:]}
    assert rows["echo"] == [
        *("up", "ready", "echo", "up_echo", "read", "unpinned", "quarantined"),
        *("none", "on"),  # a stdio upstream run with the gateway's rights and network
    ]
    assert rows["write_note"][4] == "write"


@pytest.mark.usefixtures("bwrap_present")
async def test_list_and_the_operator_summary_say_how_each_upstream_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sandboxed (network on or off), unsandboxed (no section, or one turned off) or
    remote: the table and the running gateway's summary (``/readyz``'s operator detail)
    say the same, from the sandbox each was launched with."""
    support = {"readable": [str(UPSTREAM_SCRIPT.parent)]}
    upstreams = [
        stdio_upstream("plain"),
        stdio_upstream("box", sandbox=support),
        stdio_upstream("net", sandbox={**support, "network": True}),
        stdio_upstream("off", sandbox={**support, "enabled": False}),
        http_upstream(
            "web", f"http://127.0.0.1:{free_port()}/mcp", timeouts={"connect_seconds": 1}
        ),
    ]
    gw = make_gateway(tmp_path / "gw", upstreams)
    assert cli(gw, "list") == 0
    out = capsys.readouterr().out.splitlines()
    runs = {line.split()[0]: tuple(line.split()[-2:]) for line in out[1:]}
    expected = {
        "plain": ("none", "on"),
        "box": ("bubblewrap", "off"),
        "net": ("bubblewrap", "on"),
        "off": ("none", "on"),
        "web": ("remote", "-"),
    }
    assert runs == expected
    with capture_logs() as logs:
        server = gw.build()
    # Start-up names the unsandboxed stdio ones (never the remote one).
    (warning,) = [e for e in logs if e["event"] == "upstreams_unsandboxed"]
    assert warning["upstreams"] == ["plain", "off"]
    async with Client(server.mcp):
        upstreams_now = server.runtime.upstreams
        assert upstreams_now is not None
        summaries = upstreams_now.summary()
    network = {"on": True, "off": False, "-": None}
    assert {sid: s["isolation"] for sid, s in summaries.items()} == {
        sid: {"sandbox": how, "network": network[net]} for sid, (how, net) in expected.items()
    }


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
