"""``nexus-mcp profiles --config FILE``: the profiles file, zone and grants store ``serve``
would use, and the tools of the configured upstreams (without starting them).

The commands run as processes of their own; the upstream is the recording test server,
whose record proves it was never started; the shared grants store is a real PostgreSQL.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from nexus_mcp.policy.grants import DIRECT_RELATION
from nexus_mcp.stores.grants import TOOLS_PREFIX
from nexus_mcp.stores.postgres import PostgresPool, migrate
from nexus_mcp.stores.postgres_grants import PostgresTupleStore

from .servers import server_env
from .upstream_harness import Gateway, make_gateway, stdio_upstream

CLI_TIMEOUT_SECONDS = 120


def profiles(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nexus_mcp", "profiles", *args],
        env=server_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_SECONDS,
        check=False,
    )


def gateway(tmp_path: Path, **extra: Any) -> tuple[Gateway, Path]:
    record = tmp_path / "upstream-record.jsonl"
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream(record=record, tools=["echo", "add", "write_note"])],
        grant={"minimal": ["up_echo", "up_add", "up_write_note", "up_crash"]},
        **extra,
    )
    return gw, record


def with_data_dir(gw: Gateway) -> list[str]:
    return ["--config", str(gw.config_file), "--data-dir", str(gw.data_dir)]


def test_a_configured_upstream_tool_can_be_granted_by_the_name_callers_see(
    tmp_path: Path,
) -> None:
    gw, record = gateway(tmp_path)

    without = profiles("grant", "alice", "up_echo", "--data-dir", str(gw.data_dir))
    assert without.returncode == 1  # no configuration: the upstream is unknown
    done = profiles("grant", "alice", "up_echo", *with_data_dir(gw))
    assert done.returncode == 0, done.stderr
    # Not in the upstream's tools: allowlist: serve never exposes it, nor may it be granted.
    assert profiles("grant", "alice", "up_slow", *with_data_dir(gw)).returncode == 1
    assert profiles("grant", "alice", "up_no_such_tool", *with_data_dir(gw)).returncode == 1

    inspected = profiles("inspect", "alice", *with_data_dir(gw))
    assert inspected.returncode == 0
    rows = {line.split()[0]: line for line in inspected.stdout.splitlines()}
    assert "direct" in rows["up_echo"]
    assert not record.exists()  # the upstream was never started


def test_show_and_inspect_say_whether_serve_exposes_each_upstream_tool(tmp_path: Path) -> None:
    gw, record = gateway(tmp_path)
    assert gw.pin("up", "echo") == 0
    started = record.read_text()

    shown = profiles("show", "minimal", *with_data_dir(gw))

    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert (
        "  up_echo  (upstream up: classified and pinned (exposed while it matches its pin))"
        in lines
    )
    assert (
        "  up_add  (upstream up: not pinned yet, hidden until 'nexus-mcp upstream pin up')" in lines
    )
    assert "  up_crash  (upstream up: not in its tools: allowlist, never exposed)" in lines
    assert "  nexus_read_file" in lines  # a native tool, as before

    inspected = profiles("inspect", "bob", "--role", "viewer", *with_data_dir(gw))
    assert inspected.returncode == 0, inspected.stderr
    header, *rows = inspected.stdout.split("zone: default\n")[1].splitlines()[1:]
    assert header.split() == ["TOOL", "SOURCE", "UPSTREAM"]
    by_tool = {row.split()[0]: row for row in rows}
    hidden = "upstream up: not pinned yet, hidden until 'nexus-mcp upstream pin up'"
    assert by_tool["up_write_note"].endswith(hidden)
    assert by_tool["nexus_read_file"].split()[-1] == "-"
    assert record.read_text() == started  # only the pin started it


def test_the_configuration_names_the_profiles_file_and_the_zone(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path)
    own = tmp_path / "own-profiles.yaml"
    own.write_text("default_profile: solo\nprofiles:\n  solo: {tools: [nexus_read_file]}\n")
    config = yaml.safe_load(gw.config_file.read_text())
    config["profiles"] = {"file": str(own), "zone": "team-a"}
    gw.config_file.write_text(yaml.safe_dump(config))

    listed = profiles("list", "--config", str(gw.config_file))
    assert listed.returncode == 0, listed.stderr
    assert "default profile: solo" in listed.stdout
    by_env = profiles("list", env={"NEXUS_MCP_CONFIG": str(gw.config_file)})
    assert by_env.stdout == listed.stdout

    inspected = profiles("inspect", "alice", *with_data_dir(gw))
    assert "zone: team-a" in inspected.stdout
    overridden = profiles("inspect", "alice", "--zone", "z9", *with_data_dir(gw))
    assert "zone: z9" in overridden.stdout


@pytest.fixture
def migrated(postgres_url: str) -> str:
    pool = PostgresPool(postgres_url, pool_size=2)
    try:
        migrate(pool)
    finally:
        pool.close()
    return postgres_url


def test_the_configuration_s_shared_store_is_the_one_granted_in(
    tmp_path: Path, migrated: str, redis_url: str, state_prefix: str
) -> None:
    state = {
        "backend": "shared",
        "postgres_url": {"env": "PG"},
        "redis_url": {"env": "RD"},
        "key_prefix": state_prefix,
        "request_state_keys": [{"env": "RSK"}],
    }
    gw, record = gateway(tmp_path, extra={"state": state})
    env = {"PG": migrated, "RD": redis_url, "RSK": "k" * 64}

    done = profiles("grant", "carol", "up_echo", *with_data_dir(gw), env=env)

    assert done.returncode == 0, done.stderr
    pool = PostgresPool(migrated, pool_size=1)
    try:
        store = PostgresTupleStore(pool)
        granted = store.list_objects("carol", DIRECT_RELATION, "default", TOOLS_PREFIX)
    finally:
        pool.close()
    assert [o.removeprefix(TOOLS_PREFIX) for o in granted] == ["up_echo"]
    assert not (gw.data_dir / "grants.sqlite3").exists()  # not the embedded file
    inspected = profiles("inspect", "carol", *with_data_dir(gw), env=env)
    assert "direct" in {r.split()[0]: r for r in inspected.stdout.splitlines()}["up_echo"]
    assert not record.exists()


def test_in_dev_mode_an_unpinned_upstream_tool_is_said_to_be_exposed(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path)
    config = yaml.safe_load(gw.config_file.read_text())
    config["mode"] = "dev"
    gw.config_file.write_text(yaml.safe_dump(config))

    shown = profiles("show", "minimal", *with_data_dir(gw))

    assert "  up_add  (upstream up: not pinned yet (exposed in dev mode only))" in (
        shown.stdout.splitlines()
    )


def test_a_broken_upstreams_section_is_named_without_its_value(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path)
    config = yaml.safe_load(gw.config_file.read_text())
    config["upstreams"][0]["transport"] = "carrier-pigeon\x1b[2J"
    gw.config_file.write_text(yaml.safe_dump(config))

    done = profiles("show", "minimal", *with_data_dir(gw))

    assert done.returncode == 2
    assert "upstreams.up.transport" in done.stderr
    for unwanted in ("carrier-pigeon", "\x1b", "Traceback"):
        assert unwanted not in done.stderr
