"""Issue 28: on the shared backend each replica's audit head is anchored in PostgreSQL, so
a log rewritten together with its heads file (a self-consistent chain, which the file
alone cannot tell from the original) is caught by ``nexus-mcp audit verify --config``.

Real PostgreSQL and Redis, two real replicas (``build_server``) writing real audit files
in their own data dirs, the real CLI.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastmcp import Client

from nexus_mcp.cli import main
from nexus_mcp.observability.audit import AuditEvent, JsonlAuditSink, read_audit_file
from nexus_mcp.observability.audit_chain import ANCHOR_MISSING, heads_path
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings
from nexus_mcp.stores.postgres import PostgresPool
from nexus_mcp.stores.postgres_audit import PostgresAuditHeads

pytestmark = pytest.mark.slow

STATE_KEY = "request-state-key-CANARY-0123456789abcdef"
CANARY = "CANARY-anchor-note-body"


def state_section(prefix: str, instance: str) -> dict[str, Any]:
    return {
        "backend": "shared",
        "postgres_url": {"env": "PG"},
        "redis_url": {"env": "RD"},
        "key_prefix": prefix,
        "instance_id": instance,
        "request_state_keys": [{"env": "RSK"}],
    }


Replica = Callable[[str], NexusServer]


@pytest.fixture
def replica(
    tmp_path: Path, workspace: Path, migrated_postgres: str, redis_url: str, state_prefix: str
) -> Iterator[Replica]:
    built: list[NexusServer] = []

    def factory(instance: str) -> NexusServer:
        settings = Settings(
            mode="dev",
            workspace=workspace,
            data_dir=tmp_path / f"data-{instance}",
            state=state_section(state_prefix, instance),
        )
        env = {"PG": migrated_postgres, "RD": redis_url, "RSK": STATE_KEY}
        server = build_server(settings, env=env)  # the real audit file in its data dir
        built.append(server)
        return server

    yield factory
    for server in built:
        server.close()


def verify_config(
    tmp_path: Path, prefix: str, instance: str, monkeypatch: pytest.MonkeyPatch, pg: str, rd: str
) -> Path:
    config = tmp_path / f"verify-{instance}.yaml"
    config.write_text(yaml.safe_dump({"state": state_section(prefix, instance)}), encoding="utf-8")
    monkeypatch.setenv("PG", pg)
    monkeypatch.setenv("RD", rd)
    monkeypatch.setenv("RSK", STATE_KEY)
    return config


async def traffic(server: NexusServer, calls: int) -> None:
    async with Client(server.mcp) as client:
        for _ in range(calls):
            await client.call_tool_mcp("nexus_read_file", {"path": "README.md"})


def last_hash(log: Path) -> str:
    records = [r for _, r, _ in read_audit_file(log) if r is not None]
    return str(records[-1]["sha256"])


def rewrite_keeping(log: Path, keep: int) -> None:
    """The attacker's rewrite: the first ``keep`` records, re-chained from scratch with a
    fresh heads file, so the file alone verifies."""
    records = [r for _, r, _ in read_audit_file(log) if r is not None][:keep]
    log.unlink()
    heads_path(log).unlink()
    sink = JsonlAuditSink(log)
    writer = sink._writer
    writer.write(records)
    sink.close()


def run_verify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["audit", "verify", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


async def test_each_replica_anchors_its_head_and_a_rewritten_log_is_caught(
    tmp_path: Path,
    replica: Replica,
    migrated_postgres: str,
    redis_url: str,
    state_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    one, two = replica("r1"), replica("r2")
    await traffic(one, 3)
    await traffic(two, 2)
    log_one = one.runtime.settings.audit_path
    log_two = two.runtime.settings.audit_path
    one.close()
    two.close()  # the last heads are anchored at shutdown
    pool = PostgresPool(migrated_postgres, pool_size=1)
    try:
        heads = PostgresAuditHeads(pool, state_prefix)
        anchored_one = heads.head("r1", log_one.name)
        anchored_two = heads.head("r2", log_two.name)
    finally:
        pool.close()
    assert anchored_one is not None and anchored_one[0] == last_hash(log_one)
    assert anchored_two is not None and anchored_two[0] == last_hash(log_two)
    assert anchored_one[0] != anchored_two[0]  # one chain per replica, each recorded

    config = verify_config(tmp_path, state_prefix, "r1", monkeypatch, migrated_postgres, redis_url)
    data_one = str(log_one.parent)
    code, out = run_verify(capsys, "--config", str(config), "--data-dir", data_one)
    assert code == 0, out
    assert "anchored head found in the chain" in out
    # The other replica's log is not r1's: its chain does not hold r1's head.
    code, out = run_verify(capsys, "--config", str(config), str(log_two))
    assert code == 1 and ANCHOR_MISSING in out
    code, out = run_verify(capsys, "--config", str(config), "--replica", "r2", str(log_two))
    assert code == 0, out

    # The attacker drops the last records and rewrites the chain and its heads: the file
    # alone verifies, the anchor does not.
    rewrite_keeping(log_one, 4)
    code, out = run_verify(capsys, str(log_one))
    assert code == 0, out
    code, out = run_verify(capsys, "--config", str(config), "--data-dir", data_one)
    assert code == 1
    assert ANCHOR_MISSING in out
    assert migrated_postgres not in out and CANARY not in out


async def test_the_anchor_follows_a_running_replica_within_its_interval(
    replica: Replica, migrated_postgres: str, state_prefix: str
) -> None:
    server = replica("live")
    log = server.runtime.settings.audit_path
    pool = PostgresPool(migrated_postgres, pool_size=1)
    try:
        heads = PostgresAuditHeads(pool, state_prefix)
        await traffic(server, 2)
        deadline = time.monotonic() + 10
        while (heads.head("live", log.name) or ("",))[0] != last_hash(log):
            assert time.monotonic() < deadline, "the head was not anchored while running"
            time.sleep(0.1)
    finally:
        pool.close()


def test_an_embedded_backend_config_checks_the_file_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "data" / "audit.jsonl"
    sink = JsonlAuditSink(log)
    sink.emit(AuditEvent(event="x", tool_call_id="a", correlation_id="a", tool="t"))
    sink.close()
    config = tmp_path / "nexus.yaml"
    config.write_text(json.dumps({"mode": "dev"}), encoding="utf-8")
    code, out = run_verify(capsys, "--config", str(config), str(log))
    assert code == 0, out
    assert "anchored" not in out
