"""Sandboxed stdio upstreams (issue 27): a real upstream process run in bubblewrap through
the gateway. Its tools work; what the gateway keeps (data directory, configuration, secret
files, another upstream's folder, its environment, its processes, the network) is out of
its reach, and each test proves the thing it cannot reach does exist outside."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from structlog.testing import capture_logs

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.sandbox import BWRAP_ENV, SandboxConfig, SandboxUpstream, plan_sandboxes
from nexus_mcp.policy.upstreams import load_upstreams

from .node_clients import is_ci
from .upstream_harness import REPO, make_gateway

PROBE = textwrap.dedent(
    """
    import json, os, resource, socket, sys
    from fastmcp import FastMCP

    mcp = FastMCP("probe")

    def fail(exc):
        return "ERR:" + type(exc).__name__

    @mcp.tool
    def read(path: str) -> str:
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read()
        except OSError as exc:
            return fail(exc)

    @mcp.tool
    def write(path: str, text: str) -> str:
        try:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
            return "ok"
        except OSError as exc:
            return fail(exc)

    @mcp.tool
    def connect(port: int) -> str:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=3).close()
            return "ok"
        except OSError as exc:
            return fail(exc)

    @mcp.tool
    def env() -> str:
        return json.dumps(dict(os.environ))

    @mcp.tool
    def procs() -> str:
        pids = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
        return json.dumps({"pid": os.getpid(), "pids": pids})

    @mcp.tool
    def limits() -> str:
        cpu, memory = resource.RLIMIT_CPU, resource.RLIMIT_AS
        return json.dumps([resource.getrlimit(cpu), resource.getrlimit(memory)])

    mcp.run(transport="stdio", show_banner=False)
    """
)
PROBE_TOOLS = {name: "read" for name in ("read", "write", "connect", "env", "procs", "limits")}
CANARY = "GATEWAY-CANARY-SECRET-0123456789"


@pytest.fixture
def bwrap_present() -> None:
    if shutil.which("bwrap") is None or shutil.which("prlimit") is None:
        if is_ci():
            pytest.fail("bubblewrap (bwrap) and prlimit are required in CI", pytrace=False)
        pytest.skip("bubblewrap (bwrap) or prlimit missing: apt-get install bubblewrap")


def probe_folder(tmp_path: Path) -> Path:
    box = tmp_path / "box"
    box.mkdir()
    (box / "probe.py").write_text(PROBE, encoding="utf-8")
    return box


def probe_upstream(server_id: str, box: Path, **extra: Any) -> dict[str, Any]:
    return {
        "server_id": server_id,
        "transport": "stdio",
        "command": sys.executable,
        "args": [str(box / "probe.py")],
        **extra,
    }


class Layout:
    """The gateway under ``tmp/gw`` (config, registries, data dir), the probe's folder
    (read-only), its writable folder, another upstream's folder and a secret file."""

    def __init__(self, tmp_path: Path, *, network: bool = False) -> None:
        self.box = probe_folder(tmp_path)
        self.writable = tmp_path / "writable"
        self.writable.mkdir()
        self.other = tmp_path / "other"
        self.other.mkdir()
        (self.other / "theirs.txt").write_text("OTHER-UPSTREAM-FILE")
        self.secret = tmp_path / "secret.txt"
        self.secret.write_text("SECRET-FILE-CONTENT\n")
        sandbox = {
            "writable": [str(self.writable)],
            "readable": [str(self.box)],
            "network": network,
            "cpu_seconds": 120,
            "memory_mb": 3000,
        }
        upstreams = [
            probe_upstream("box", self.box, env={"GIVEN": "given-value"}, sandbox=sandbox),
            # Unsandboxed: its own folder (cwd) and a secret by file reference.
            probe_upstream(
                "plain", self.box, cwd=str(self.other), secret_env={"T": {"file": str(self.secret)}}
            ),
        ]
        self.gw = make_gateway(
            tmp_path / "gw",
            upstreams,
            registries={"box": PROBE_TOOLS, "plain": PROBE_TOOLS},
            grant={"full": [f"box_{name}" for name in PROBE_TOOLS]},
        )
        self.gw.data_dir.mkdir()
        self.data_file = self.gw.data_dir / "state.txt"
        self.data_file.write_text("GATEWAY-DATA")
        assert self.gw.pin("box") == 0


async def call(client: Client[Any], tool: str, **arguments: Any) -> str:
    result = await client.call_tool_mcp(f"box_{tool}", arguments)
    assert not result.is_error, result
    text: str = result.content[0].text
    return text


@pytest.mark.usefixtures("bwrap_present")
async def test_a_sandboxed_upstream_works_and_cannot_reach_the_gateways_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_SANDBOX_CANARY", CANARY)
    lay = Layout(tmp_path)
    with capture_logs() as logs:
        server = lay.gw.build()
    (warning,) = [e for e in logs if e["event"] == "upstreams_unsandboxed"]
    assert warning["upstreams"] == ["plain"]
    async with Client(server.mcp) as client:
        # Its own folder is readable, as the system it runs on.
        assert "FastMCP" in await call(client, "read", path=str(lay.box / "probe.py"))
        assert "root:" in await call(client, "read", path="/etc/passwd")
        # The gateway's data dir, its config, a secret file, another upstream's folder:
        # there outside, absent inside.
        for kept in (lay.data_file, lay.gw.config_file, lay.secret, lay.other / "theirs.txt"):
            assert kept.is_file()
            assert await call(client, "read", path=str(kept)) == "ERR:FileNotFoundError"
        lock = lay.gw.registry_dir / "box.lock.json"
        assert lock.is_file()
        assert await call(client, "read", path=str(lock)) == "ERR:FileNotFoundError"

        # Writes: inside the writable folder only.
        inside = lay.writable / "note.txt"
        assert await call(client, "write", path=str(inside), text="hello") == "ok"
        assert inside.read_text() == "hello"
        refused = await call(client, "write", path=str(lay.box / "x.txt"), text="no")
        assert refused == "ERR:OSError"  # read-only file system
        assert not (lay.box / "x.txt").exists()
        assert (await call(client, "write", path="/usr/x.txt", text="no")).startswith("ERR:")
        # Its /tmp is its own: a file it writes there is not the host's.
        assert await call(client, "write", path="/tmp/own.txt", text="t") == "ok"
        assert not Path("/tmp/own.txt").exists()

        # A clean environment: what its config gives, PATH and HOME; nothing of ours.
        env = json.loads(await call(client, "env"))
        assert os.environ["NEXUS_SANDBOX_CANARY"] == CANARY
        assert CANARY not in json.dumps(env)
        assert env["GIVEN"] == "given-value" and env["HOME"] == "/tmp"
        assert "NEXUS_SANDBOX_CANARY" not in env

        # Its own PID namespace: the gateway's process is not there.
        seen = json.loads(await call(client, "procs"))
        assert Path(f"/proc/{os.getpid()}").is_dir()
        assert os.getpid() not in seen["pids"]
        assert seen["pid"] < 10 and len(seen["pids"]) < 10

        # Its limits are the configured ones, soft and hard.
        cpu, memory = json.loads(await call(client, "limits"))
        assert cpu == [120, 120] and memory == [3000 * 2**20] * 2


@pytest.mark.parametrize(
    ("sandbox", "words"),
    [
        ({"writeable": ["/srv/x"]}, "writeable"),
        ({"writable": ["relative"]}, "absolute"),
        ({"writable": ["/usr/local"]}, "system folder"),
        ({"readable": ["/"]}, "system folder"),
        ({"memory_mb": 1}, "memory_mb"),
    ],
)
def test_a_bad_sandbox_section_is_refused(sandbox: dict[str, Any], words: str) -> None:
    raw = [{"server_id": "a", "transport": "stdio", "command": "x", "sandbox": sandbox}]
    with pytest.raises(ConfigError, match=words):
        load_upstreams(raw, mode="prod", native_server_id="nexus")
    http = [{"server_id": "a", "transport": "http", "url": "http://h/", "sandbox": {}}]
    with pytest.raises(ConfigError, match="sandbox"):
        load_upstreams(http, mode="prod", native_server_id="nexus")


@pytest.mark.usefixtures("bwrap_present")
@pytest.mark.parametrize("network", [False, True])
async def test_network_only_when_allowed(tmp_path: Path, network: bool) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        lay = Layout(tmp_path, network=network)
        async with Client(lay.gw.build().mcp) as client:
            answer = await call(client, "connect", port=port)
        # The listener is there: this very process reaches it.
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        assert (answer == "ok") is network, answer
    finally:
        listener.close()


def plan(tmp_path: Path, upstreams: list[SandboxUpstream], **environ: str) -> Any:
    data = tmp_path / "data"
    data.mkdir(parents=True, exist_ok=True)
    return plan_sandboxes(
        upstreams,
        protected={data: "the gateway's data directory"},
        environ={"PATH": os.environ["PATH"], **environ},
    )


@pytest.mark.usefixtures("bwrap_present")
def test_overlaps_with_the_gateway_or_another_upstream_are_refused(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    inside_data = tmp_path / "data" / "sub"
    inside_data.mkdir(parents=True)
    box = SandboxConfig(writable=(inside_data,))
    with pytest.raises(ConfigError) as refused:
        plan(tmp_path, [SandboxUpstream("a", sys.executable, None, box)])
    assert "overlaps the gateway's data directory" in str(refused.value)
    assert str(tmp_path) not in str(refused.value)
    # Readable of one, the cwd of another (unsandboxed or not): refused too.
    box = SandboxConfig(readable=(tmp_path,))
    with pytest.raises(ConfigError, match="overlaps a folder of upstream b"):
        plan(
            tmp_path / "elsewhere",
            [
                SandboxUpstream("a", sys.executable, None, box),
                SandboxUpstream("b", sys.executable, mine, None),
            ],
        )
    # Apart: planned, and b said to run unsandboxed.
    launches, unsandboxed = plan(
        tmp_path,
        [
            SandboxUpstream("a", sys.executable, None, SandboxConfig(writable=(mine,))),
            SandboxUpstream("b", sys.executable, tmp_path / "b", None),
        ],
    )
    assert set(launches) == {"a"} and unsandboxed == ["b"]


def test_a_sandbox_without_bwrap_refuses_to_start(tmp_path: Path) -> None:
    lay_box = probe_folder(tmp_path)
    upstream = SandboxUpstream("a", sys.executable, None, SandboxConfig(readable=(lay_box,)))
    with pytest.raises(ConfigError, match="bubblewrap") as refused:
        plan(tmp_path, [upstream], **{BWRAP_ENV: str(tmp_path / "no-bwrap")})
    assert "no-bwrap" not in str(refused.value)
    # Disabled: runs, unsandboxed, and is said to.
    off = SandboxUpstream("a", sys.executable, None, SandboxConfig(enabled=False))
    assert plan(tmp_path, [off], **{BWRAP_ENV: str(tmp_path / "no-bwrap")}) == ({}, ["a"])


@pytest.mark.usefixtures("bwrap_present")
def test_a_sandbox_without_bwrap_stops_the_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = Layout(tmp_path)
    monkeypatch.setenv(BWRAP_ENV, str(tmp_path / "no-bwrap"))
    with pytest.raises(ConfigError, match="bubblewrap"):
        lay.gw.build()


@pytest.mark.usefixtures("bwrap_present")
def test_a_protected_path_under_the_commands_folder_is_hidden(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    tool = prefix / "bin" / "tool"
    shutil.copy(shutil.which("true") or "/bin/true", tool)
    secret_dir = prefix / "data"
    secret_dir.mkdir()
    secret_file = prefix / "nexus.yaml"
    secret_file.write_text("x")
    launches, _ = plan_sandboxes(
        [SandboxUpstream("a", str(tool), None, SandboxConfig())],
        protected={secret_dir: "data", secret_file: "config"},
        environ={"PATH": os.environ["PATH"]},
    )
    argv = launches["a"].argv([])
    assert ["--ro-bind", str(prefix), str(prefix)] == argv[argv.index(str(prefix)) - 1 :][:3]
    assert ["--tmpfs", str(secret_dir)] == argv[argv.index(str(secret_dir)) - 1 :][:2]
    assert ["--ro-bind", os.devnull, str(secret_file)] == argv[argv.index(str(secret_file)) - 2 :][
        :3
    ]
    assert "--share-net" not in argv and argv[-1] == str(tool)


@pytest.mark.usefixtures("bwrap_present")
async def test_the_reference_filesystem_server_runs_sandboxed(tmp_path: Path) -> None:
    """A Node upstream nobody here wrote: its modules reached through a linked folder."""
    from .test_upstream_fs import fs_gateway

    served = tmp_path / "served"
    clients = REPO / "tests" / "clients" / "node_modules"
    sandbox = {"writable": [str(served)], "readable": [str(clients)]}
    gw, _ = fs_gateway(tmp_path, sandbox=sandbox)  # it makes ``served``
    assert gw.pin("fs") == 0
    async with Client(gw.build().mcp) as client:
        read = await client.call_tool_mcp("fs_read_text_file", {"path": str(served / "notes.txt")})
        assert not read.is_error, read
        assert "Quarterly notes" in read.content[0].text
