"""Issue 15 end to end: three real replicas on the shared state backend behind nginx.

The harness is what docs/replicas.md tells an operator to run: one
database migrated with ``nexus-mcp state migrate``, one Redis key prefix, three
``nexus-mcp serve --transport http`` processes (``state.backend: shared``, store URLs and
``request_state_keys`` by reference, ``instance_id`` r1/r2/r3, one workspace folder) and
nginx in front of them running the ``nginx`` block of docs/replicas.md, with only its example
addresses and listen port replaced by loopback ones. So the documented example is proven too.

Every guarantee is checked through what a client sees, and against the stores and the
workspace behind it: an approval token spent once in the fleet, a keyed write run once,
rate limits and budgets counted once, a revoke seen by another replica within a second,
a replica killed mid-load losing no acknowledged write, a store outage answered with
``UNAVAILABLE`` and survived without restarts, sessions routed by their instance prefix,
and ``serve --workers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
import yaml

from nexus_mcp.policy.targets import identify_folder
from nexus_mcp.stores.idempotency import IdempotencyScope
from tests.support.shared_state import (
    REDIS_URL as MACHINE_REDIS_URL,
)
from tests.support.shared_state import (
    PrivatePostgres,
    PrivateRedis,
    _unavailable,
    create_database,
    delete_prefix,
    drop_database,
    in_ci,
    postgres_reachable,
    redis_reachable,
)

from .access_helpers import AUDIENCE, SECRET, http_client, poll, token
from .conftest import REPO_ROOT, wire
from .node_clients import NodeClients, run_ts_plans
from .servers import free_port, http_server, serve_command, server_env
from .test_approvals import SECRET as APPROVAL_SECRET
from .test_approvals import code_of, envelope

pytestmark = pytest.mark.slow

REPLICAS_DOC = REPO_ROOT / "docs" / "replicas.md"
NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
README_ADDRESSES = ("10.0.0.11:8765", "10.0.0.12:8765", "10.0.0.13:8765")
README_LISTEN = "listen 8080;"
INSTANCES = ("r1", "r2", "r3")
WRITE = "nexus_write_file"
READ = "nexus_read_file"
HELLO = "hello from the shared workspace\n"
META_EFFECT = "nexus.mcp/tool_effect"
META_REPLAYED = "nexus.mcp/idempotent_replay"
REQUEST_STATE_KEY = "request-state-key-for-replica-tests-0123456789abcdef"
# The main fleet's limits, per subject. Every call that reaches the limits layer (chain
# step 8) counts, the fifty uses of one approval token too (a native tool spends its token
# at step 9, after the limits), so both are at least CONCURRENCY; an idempotent replay is
# answered at step 5 and counts nothing. The budget binds before the rate limit, so one
# burst over the limit shows both counted once across the replicas.
CONCURRENCY = 50
RATE_LIMIT = 60
BUDGET = 50
RATE_BURST = 90
REVOKE_DEADLINE_SECONDS = 1.0
OUTAGE_DEADLINE_SECONDS = 20.0
ENV_PG = "NEXUS_PG_URL"
ENV_REDIS = "NEXUS_REDIS_URL"
ENV_REQUEST_STATE = "NEXUS_REQUEST_STATE_KEY"
CLI_TIMEOUT_SECONDS = 60
STORE_NAMES = ("grants", "idempotency", "nonces", "limits")
# A bounded wait for a replica set to start (each process builds its server, ~2-3 s).
START_TIMEOUT_SECONDS = 60.0


# --- configuration -------------------------------------------------------------------------


def fleet_config(
    *,
    workspace: Path,
    data_dir: Path,
    prefix: str,
    instance_id: str | None,
    budgets: Mapping[str, Any],
    policy: Mapping[str, Any],
) -> dict[str, Any]:
    """One replica's YAML: every store by reference, the same on every replica except
    ``instance_id`` and its own data dir (its audit file)."""
    state: dict[str, Any] = {
        "backend": "shared",
        "postgres_url": {"env": ENV_PG},
        "redis_url": {"env": ENV_REDIS},
        "request_state_keys": [{"env": ENV_REQUEST_STATE}],
        "key_prefix": prefix,
        "connect_timeout_seconds": 1.0,
        "timeout_seconds": 1.0,
    }
    if instance_id is not None:
        state["instance_id"] = instance_id
    return {
        "mode": "prod",
        "workspace": str(workspace),
        "data_dir": str(data_dir),
        "log_level": "WARNING",
        "state": state,
        "budgets": dict(budgets),
        # A concurrent call with a key in flight waits for the first (bounded).
        "registry": {"idempotency_wait_seconds": 10.0},
        "write_policies": {"workspace": dict(policy)},
    }


APPROVED_WRITES = {
    "allowed_paths": ["scratch/**"],
    "allowed_operations": ["write"],
    "require_approval": True,
}
UNAPPROVED_WRITES = {**APPROVED_WRITES, "require_approval": False}
FLEET_BUDGETS = {
    "rate_limit_calls": RATE_LIMIT,
    "rate_limit_window_seconds": 60.0,
    "max_calls_per_session": BUDGET,
}
GENEROUS_BUDGETS = {"rate_limit_calls": 1_000_000, "max_calls_per_session": 1_000_000}


def store_env(pg_url: str, redis_url: str) -> dict[str, str]:
    """What every replica and operator command gets: store URLs and keys by reference,
    the bearer-token verifier and the approval secret, as the approval e2e tests set them."""
    return {
        ENV_PG: pg_url,
        ENV_REDIS: redis_url,
        ENV_REQUEST_STATE: REQUEST_STATE_KEY,
        "NEXUS_MCP_AUTH__JWT_SECRET": SECRET,
        "NEXUS_MCP_AUTH__AUDIENCE": AUDIENCE,
        "NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET,
    }


def write_yaml(path: Path, document: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(document), sort_keys=False), encoding="utf-8")
    return path


def cli(*argv: str, env: Mapping[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """``nexus-mcp <argv>`` as an operator runs it, in a clean environment."""
    done = subprocess.run(
        [sys.executable, "-m", "nexus_mcp", *argv],
        env=server_env(env),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_SECONDS,
        check=False,
    )
    if check:
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done


def migrate(config: Path, env: Mapping[str, str]) -> None:
    done = cli("state", "migrate", "--config", str(config), env=env)
    assert "schema" in done.stdout, done.stdout
    status = cli("state", "status", "--config", str(config), env=env)
    assert "current" in status.stdout and "reachable" in status.stdout, status.stdout


# --- replicas --------------------------------------------------------------------------------


@dataclass
class Replica:
    name: str
    port: int
    config: Path
    data_dir: Path
    stderr_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _stop: Callable[[], None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def audit(self) -> list[dict[str, Any]]:
        path = self.data_dir / "audit.jsonl"
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")


def start_replica(replica: Replica, env: Mapping[str, str], *extra: str) -> None:
    """``serve --transport http`` through the e2e ``http_server`` helper (bounded wait for
    /healthz); stderr goes to a file, so a replica never blocks on a full pipe."""
    handle: IO[bytes] = replica.stderr_path.open("ab")
    manager = http_server(
        ["--config", str(replica.config), *extra],
        env,
        port=replica.port,
        timeout=START_TIMEOUT_SECONDS,
        stderr=handle,
    )
    try:
        replica.proc = manager.__enter__()
    except BaseException:
        handle.close()
        raise

    def stop() -> None:
        try:
            manager.__exit__(None, None, None)
        finally:
            handle.close()

    replica._stop = stop


def stop_replica(replica: Replica) -> None:
    stop, replica._stop = replica._stop, None
    if stop is not None:
        stop()


@contextlib.contextmanager
def running(replicas: list[Replica], env: Mapping[str, str], *extra: str) -> Iterator[None]:
    """Start every replica at once (each start is CPU-bound for ~2 s); stop them all."""
    try:
        with ThreadPoolExecutor(max_workers=len(replicas)) as pool:
            for future in [pool.submit(start_replica, r, env, *extra) for r in replicas]:
                future.result()
        yield
    finally:
        for replica in replicas:
            stop_replica(replica)


def make_replicas(
    root: Path,
    names: tuple[str, ...],
    *,
    workspace: Path,
    prefix: str,
    budgets: Mapping[str, Any],
    policy: Mapping[str, Any],
    instance_ids: bool = True,
) -> list[Replica]:
    replicas = []
    for name in names:
        data_dir = root / f"data-{name}"
        config = write_yaml(
            root / f"{name}.yaml",
            fleet_config(
                workspace=workspace,
                data_dir=data_dir,
                prefix=prefix,
                instance_id=name if instance_ids else None,
                budgets=budgets,
                policy=policy,
            ),
        )
        replicas.append(Replica(name, free_port(), config, data_dir, root / f"{name}.stderr"))
    return replicas


# --- nginx -----------------------------------------------------------------------------------


def find_nginx() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    return next((c for c in NGINX_CANDIDATES if os.access(c, os.X_OK)), None)


def readme_nginx_block() -> str:
    """The ``nginx`` code block of docs/replicas.md, verbatim."""
    text = REPLICAS_DOC.read_text(encoding="utf-8")
    match = re.search(r"```nginx\n(.*?)```", text, re.DOTALL)
    assert match is not None, "docs/replicas.md has no nginx block"
    return match.group(1)


def nginx_conf(root: Path, ports: list[int], listen_port: int) -> str:
    """The README block inside a minimal nginx.conf whose every path is under ``root``."""
    block = readme_nginx_block()
    for address, port in zip(README_ADDRESSES, ports, strict=True):
        assert block.count(address) == 2, f"README block should name {address} twice"
        block = block.replace(address, f"127.0.0.1:{port}")
    assert block.count(README_LISTEN) == 1, "README block should listen on 8080"
    block = block.replace(README_LISTEN, f"listen 127.0.0.1:{listen_port};")
    temp = "\n".join(f"    {kind}_temp_path {root / kind};" for kind in nginx_temp_kinds())
    indented = "\n".join(f"    {line}" if line else "" for line in block.splitlines())
    return (
        "worker_processes 1;\n"
        "events { worker_connections 1024; }\n"
        "http {\n"
        "    log_format upstreams '$status|$request_method|$request_uri|$upstream_addr';\n"
        f"    access_log {root / 'access.log'} upstreams;\n"
        # Bodies up to nginx's default 1 MiB limit stay in memory: the temp folders are
        # under the test's private tmp, which workers running as another user cannot open.
        "    client_body_buffer_size 1m;\n"
        f"{temp}\n"
        f"{indented}\n"
        "}\n"
    )


def nginx_temp_kinds() -> list[str]:
    """Temp path directives of the modules this nginx has (nginx-light lacks some)."""
    nginx = find_nginx()
    assert nginx is not None
    built = subprocess.run([nginx, "-V"], capture_output=True, text=True, check=False).stderr
    kinds = ["client_body", "proxy"]
    kinds += [k for k in ("fastcgi", "uwsgi", "scgi") if f"--without-http_{k}_module" not in built]
    return kinds


@contextlib.contextmanager
def nginx_in_front(root: Path, replicas: list[Replica]) -> Iterator[str]:
    """nginx running the docs/replicas.md block in front of ``replicas``; yields its base URL."""
    nginx = find_nginx()
    assert nginx is not None
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = root / "nginx.conf"
    conf.write_text(nginx_conf(root, [r.port for r in replicas], port), encoding="utf-8")
    error_log = root / "error.log"
    globals_ = f"daemon off; pid {root / 'nginx.pid'}; error_log {error_log};"
    test = subprocess.run(
        [nginx, "-p", str(root), "-e", str(error_log), "-c", str(conf), "-g", globals_, "-t"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert test.returncode == 0, test.stderr
    proc = subprocess.Popen(
        [nginx, "-p", str(root), "-e", str(error_log), "-c", str(conf), "-g", globals_],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            assert proc.poll() is None, error_log.read_text(errors="replace")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "nginx did not start proxying"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# --- the module's stores and fleet -------------------------------------------------------------


@dataclass
class Stores:
    pg_url: str
    redis_url: str
    prefix: str
    root: Path
    workspace: Path
    env: dict[str, str]


@dataclass
class Fleet:
    url: str  # nginx
    replicas: list[Replica]
    stores: Stores
    nginx_root: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def mcp(self) -> str:
        return f"{self.url}/mcp"

    @property
    def config(self) -> Path:
        return self.replicas[0].config

    def replica(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)

    def audit(self) -> list[dict[str, Any]]:
        return [record for r in self.replicas for record in r.audit()]


def require_stores(request: pytest.FixtureRequest) -> None:
    """Skip (or, under CI, fail) as the shared_state fixtures do when a store is missing."""
    why = postgres_reachable()
    if why is not None:
        _unavailable("PostgreSQL", why, request)
    why = redis_reachable()
    if why is not None:
        _unavailable("Redis", why, request)


def require_nginx() -> None:
    if find_nginx() is None:
        if in_ci():
            pytest.fail("nginx is required under CI (.ci/run installs it) and is missing")
        pytest.skip("nginx is not installed")


@contextlib.contextmanager
def migrated_stores(request: pytest.FixtureRequest, root: Path) -> Iterator[Stores]:
    """One fresh database migrated by ``nexus-mcp state migrate``, one key prefix, one
    workspace under ``root``; all removed afterwards."""
    require_stores(request)
    name, pg_url = create_database()
    prefix = "nexus-t-" + secrets.token_hex(5)
    workspace = root / "ws"
    (workspace / "scratch").mkdir(parents=True)
    (workspace / "hello.txt").write_text(HELLO, encoding="utf-8")
    env = store_env(pg_url, MACHINE_REDIS_URL)
    try:
        config = write_yaml(
            root / "migrate.yaml",
            fleet_config(
                workspace=workspace,
                data_dir=root / "data-cli",
                prefix=prefix,
                instance_id=None,
                budgets=FLEET_BUDGETS,
                policy=APPROVED_WRITES,
            ),
        )
        migrate(config, env)
        yield Stores(pg_url, MACHINE_REDIS_URL, prefix, root, workspace, env)
    finally:
        drop_database(name)
        if redis_reachable() is None:
            delete_prefix(MACHINE_REDIS_URL, prefix)


@pytest.fixture(scope="module")
def stores(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stores]:
    with migrated_stores(request, tmp_path_factory.mktemp("replicas")) as migrated:
        yield migrated


@pytest.fixture(scope="module")
def fleet(stores: Stores) -> Iterator[Fleet]:
    """Three replicas r1, r2, r3 and nginx running the docs/replicas.md block in front of them."""
    require_nginx()
    replicas = make_replicas(
        stores.root,
        INSTANCES,
        workspace=stores.workspace,
        prefix=stores.prefix,
        budgets=FLEET_BUDGETS,
        policy=APPROVED_WRITES,
    )
    with running(replicas, stores.env):
        nginx_root = stores.root / "nginx"
        with nginx_in_front(nginx_root, replicas) as url:
            yield Fleet(url, replicas, stores, nginx_root, env=stores.env)
        for replica in replicas:
            assert "Traceback" not in replica.stderr(), replica.stderr()[-3000:]


# --- calls -------------------------------------------------------------------------------------


Outcome = dict[str, Any] | BaseException


async def call_tool(
    url: str, bearer: str, tool: str, args: Mapping[str, Any], *, mode: str = "auto"
) -> dict[str, Any]:
    """One call on its own connection, as one of many independent clients makes it."""
    async with http_client(url, bearer, mode=mode) as client:
        return wire(await client.call_tool_mcp(tool, dict(args)))


async def concurrently(calls: Iterable[Awaitable[dict[str, Any]]]) -> list[Outcome]:
    """Run every call at once; a transport failure is kept as its exception."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    return list(results)


def code(outcome: Outcome) -> str:
    """``OK``, the envelope's code, or ``TRANSPORT:<type>`` when no result came back."""
    if isinstance(outcome, BaseException):
        return f"TRANSPORT:{type(outcome).__name__}"
    if outcome.get("isError") is not True:
        return "OK"
    return code_of(outcome)


def effect_id(result: dict[str, Any]) -> str:
    effect: dict[str, Any] = result["_meta"][META_EFFECT]
    return str(effect["effect_id"])


def replayed(result: dict[str, Any]) -> bool:
    return bool(result.get("_meta", {}).get(META_REPLAYED))


def mint(
    url: str, tool: str, arguments: Mapping[str, Any], subject: str, count: int = 1
) -> list[str]:
    """Approval tokens from ``POST /approvals/mint`` (through nginx), by an admin approver."""
    headers = {"Authorization": f"Bearer {token('ann-approver', role='admin')}"}
    body = {"tool": tool, "arguments": dict(arguments), "subject": subject}
    tokens = []
    with httpx.Client(base_url=url, headers=headers, timeout=10) as http:
        for _ in range(count):
            response = http.post("/approvals/mint", json=body)
            assert response.status_code == 200, response.text
            tokens.append(response.json()["approval_token"])
    return tokens


def finished(records: list[dict[str, Any]], subject: str, tool: str) -> list[dict[str, Any]]:
    return [
        r
        for r in records
        if r.get("event") == "tool_call_finished"
        and r.get("subject") == subject
        and r.get("tool") == tool
    ]


def new_files(workspace: Path, pattern: str) -> dict[str, str]:
    return {
        p.relative_to(workspace).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(workspace.glob(pattern))
    }


# --- 1. one approval token, fifty uses ----------------------------------------------------------


async def test_one_approval_token_used_fifty_times_through_nginx_writes_once(
    fleet: Fleet,
) -> None:
    args = {"path": "scratch/approved-once.txt", "content": "approved once\n"}
    minted = cli(
        "approvals", "mint", "--config", str(fleet.config), "--approver", "alice",
        "--subject", "carol", "--tool", WRITE, "--args", json.dumps(args), env=fleet.env,
    )  # fmt: skip
    approval = minted.stdout.strip()
    bearer = token("carol", role="editor")
    calls = [
        call_tool(
            fleet.mcp,
            bearer,
            WRITE,
            {**args, "idempotency_key": f"once-{i}", "approval_token": approval},
        )
        for i in range(CONCURRENCY)
    ]
    outcomes = await concurrently(calls)
    codes = Counter(code(o) for o in outcomes)
    assert codes == {"OK": 1, "APPROVAL_REPLAYED": CONCURRENCY - 1}, codes
    for outcome in outcomes:
        if code(outcome) == "APPROVAL_REPLAYED":
            assert isinstance(outcome, dict)
            assert envelope(outcome)["error"] == "approval token was already used"
    assert new_files(fleet.stores.workspace, "scratch/approved-once*") == {
        "scratch/approved-once.txt": "approved once\n"
    }
    audit = fleet.audit()
    writes = finished(audit, "carol", WRITE)
    assert [r["outcome"] for r in writes].count("OK") == 1, writes
    blocked = [
        r for r in audit if r.get("event") == "tool_call_blocked" and r.get("subject") == "carol"
    ]
    assert Counter(r["outcome"] for r in blocked) == {"APPROVAL_REPLAYED": CONCURRENCY - 1}
    # The fifty calls really were spread over the fleet, not served by one replica.
    served = {r.name for r in fleet.replicas if any(x.get("subject") == "carol" for x in r.audit())}
    assert len(served) >= 2, served


# --- 2. one idempotency key, fifty concurrent writes --------------------------------------------


async def test_fifty_concurrent_writes_with_one_key_run_the_write_once(fleet: Fleet) -> None:
    args = {"path": "scratch/keyed.txt", "content": "written by one of fifty\n"}
    approvals = mint(fleet.url, WRITE, args, "dora", CONCURRENCY)
    bearer = token("dora", role="editor")
    calls = [
        call_tool(
            fleet.mcp,
            bearer,
            WRITE,
            {**args, "idempotency_key": "one-key-fifty-calls", "approval_token": approval},
        )
        for approval in approvals
    ]
    outcomes = await concurrently(calls)
    codes = Counter(code(o) for o in outcomes)
    assert set(codes) <= {"OK", "IDEMPOTENCY_KEY_CONFLICT"}, codes
    results = [o for o in outcomes if isinstance(o, dict) and code(o) == "OK"]
    assert results, codes
    # One execution: every success carries the same effect, and only one is not a replay.
    assert len({effect_id(r) for r in results}) == 1, [effect_id(r) for r in results]
    assert sum(not replayed(r) for r in results) == 1
    assert {json.dumps(r["structuredContent"], sort_keys=True) for r in results} == {
        json.dumps(results[0]["structuredContent"], sort_keys=True)
    }
    assert results[0]["structuredContent"]["created"] is True
    for outcome in outcomes:
        if code(outcome) == "IDEMPOTENCY_KEY_CONFLICT":
            assert isinstance(outcome, dict)
            envelope(outcome)
    assert (fleet.stores.workspace / "scratch/keyed.txt").read_text() == args["content"]
    # The fleet's audit agrees: one execution, every other call a replay of it.
    audited = Counter(
        (r["outcome"], r.get("idempotency")) for r in finished(fleet.audit(), "dora", WRITE)
    )
    assert audited[("OK", "executed")] == 1, audited
    assert audited[("OK", "replayed")] == codes["OK"] - 1, audited
    [executed] = [
        r for r in finished(fleet.audit(), "dora", WRITE) if r.get("idempotency") == "executed"
    ]
    assert executed["effect_id"] == effect_id(results[0])


# --- 3. rate limit and budget, counted once for the fleet ---------------------------------------


async def read_burst(fleet: Fleet, subject: str, count: int) -> Counter[str]:
    bearer = token(subject, role="viewer")
    calls = [call_tool(fleet.mcp, bearer, READ, {"path": "hello.txt"}) for _ in range(count)]
    return Counter(code(o) for o in await concurrently(calls))


async def test_the_rate_limit_holds_across_the_fleet(fleet: Fleet) -> None:
    """RATE_BURST calls of one subject over three replicas: the window admits RATE_LIMIT
    of them once, not once per replica (which would admit them all)."""
    codes = await read_burst(fleet, "rita", RATE_BURST)
    assert codes["RATE_LIMITED"] == RATE_BURST - RATE_LIMIT, codes
    # Of the admitted calls the budget (below the rate) lets exactly BUDGET run.
    expected = {
        "OK": BUDGET,
        "BUDGET_EXCEEDED": RATE_LIMIT - BUDGET,
        "RATE_LIMITED": RATE_BURST - RATE_LIMIT,
    }
    assert codes == expected, codes
    served = {r.name for r in fleet.replicas if finished(r.audit(), "rita", READ)}
    assert len(served) >= 2, served


async def test_the_call_budget_of_a_principal_holds_across_the_fleet(fleet: Fleet) -> None:
    """Stateless calls key the budget on the principal: of BUDGET + 5, exactly BUDGET run."""
    codes = await read_burst(fleet, "bea", BUDGET + 5)
    assert codes == {"OK": BUDGET, "BUDGET_EXCEEDED": 5}, codes
    served = {r.name for r in fleet.replicas if finished(r.audit(), "bea", READ)}
    assert len(served) >= 2, served


# --- 4. a revoke reaches another replica within a second ----------------------------------------


async def test_a_revoke_by_the_operator_hides_the_tool_on_another_replica_within_a_second(
    fleet: Fleet,
) -> None:
    env = {**fleet.env, "NEXUS_MCP_CONFIG": str(fleet.config)}
    b = fleet.replica("r2")
    bearer = token("gina", role="viewer")  # minimal profile: no nexus_grep of its own
    cli("profiles", "grant", "gina", "nexus_grep", env=env)
    async with http_client(f"{b.url}/mcp", bearer) as client:

        async def names() -> set[str]:
            return {t.name for t in await client.list_tools(cache_mode="bypass")}

        granted, _ = await poll(names, lambda n: "nexus_grep" in n, timeout=5)
        assert "nexus_grep" in granted
        ok = wire(await client.call_tool_mcp("nexus_grep", {"pattern": "hello"}))
        assert code(ok) == "OK", ok
        cli("profiles", "revoke", "gina", "--tool", "nexus_grep", env=env)
        revoked, elapsed = await poll(names, lambda n: "nexus_grep" not in n, timeout=5)
        assert "nexus_grep" not in revoked
        print(f"\nrevoke reached r2 in {elapsed:.3f} s")
        assert elapsed < REVOKE_DEADLINE_SECONDS, f"revoke took {elapsed:.3f} s to reach r2"
        refused = wire(await client.call_tool_mcp("nexus_grep", {"pattern": "hello"}))
    assert refused["isError"] is True
    assert "Unknown tool: 'nexus_grep'" in refused["content"][0]["text"]
    assert "nexus_read_file" in revoked  # only the revoked grant went


# --- 7. sessions and stateless calls through nginx ----------------------------------------------


async def test_sessions_are_routed_back_to_their_replica_by_instance_prefix(
    fleet: Fleet,
) -> None:
    sessions: list[str] = []
    for number in range(6):  # a subject per session: each stays far under the rate limit
        bearer = token(f"sam{number}", role="viewer")
        async with http_client(fleet.mcp, bearer, mode="legacy") as client:
            session = client.transport.get_session_id()
            assert session is not None
            sessions.append(session)
            for _ in range(8):
                result = wire(await client.call_tool_mcp(READ, {"path": "hello.txt"}))
                assert code(result) == "OK", result
                assert result["structuredContent"]["content"] == HELLO
    prefixes = [s.split(".", 1)[0] for s in sessions]
    assert all(re.fullmatch(r"r[123]\.[^.].*", s) for s in sessions), sessions
    # New sessions are balanced over the pool; every later request followed its prefix.
    assert set(prefixes) == set(INSTANCES), prefixes
    # The prefix is what routes: the same session sent straight to another replica is
    # an unknown session there.
    bearer = token("sid", role="viewer")
    async with http_client(fleet.mcp, bearer, mode="legacy") as client:
        session = client.transport.get_session_id()
        assert session is not None
        owner = session.split(".", 1)[0]
        other = next(r for r in fleet.replicas if r.name != owner)
        headers = {
            "Authorization": f"Bearer {bearer}",
            "Mcp-Session-Id": session,
            "MCP-Protocol-Version": "2025-11-25",
            "Accept": "application/json, text/event-stream",
        }
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}
        stray = httpx.post(f"{other.url}/mcp", json=body, headers=headers, timeout=10)
        assert stray.status_code == 404, (stray.status_code, stray.text[:200])
        routed = httpx.post(fleet.mcp, json=body, headers=headers, timeout=10)
        assert routed.status_code == 200, (routed.status_code, routed.text[:200])


async def test_stateless_calls_are_balanced_over_every_replica(fleet: Fleet) -> None:
    """A 2026-07-28 call is several requests (discover, list, call), each its own; nginx
    balances requests, so one call's requests reach different replicas, and it works."""
    bearer = token("stan", role="viewer")
    log = fleet.nginx_root / "access.log"
    start = log.stat().st_size
    for _ in range(12):
        result = await call_tool(fleet.mcp, bearer, READ, {"path": "hello.txt"})
        assert code(result) == "OK", result
        assert result["structuredContent"]["content"] == HELLO
    with log.open("rb") as handle:
        handle.seek(start)
        lines = [line.split("|") for line in handle.read().decode().splitlines()]
    assert {status for status, *_ in lines} == {"200"}, lines
    upstreams = {address for *_, address in lines}
    assert upstreams == {f"127.0.0.1:{r.port}" for r in fleet.replicas}, upstreams
    assert finished(fleet.audit(), "stan", READ)


# --- 5. a replica killed during a load of writes ------------------------------------------------


KILL_LANES = 16


def bulk(label: str) -> str:
    """Content large enough (~256 KiB) that a write is in flight for a while."""
    return f"{label}\n" + "x" * (256 * 1024)


def idempotency_rows(pg_url: str) -> dict[str, tuple[str, str | None]]:
    import psycopg

    with psycopg.connect(pg_url, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT scope_key, state, result_json FROM idempotency_records"
        ).fetchall()
    return {str(key): (str(state), result) for key, state, result in rows}


async def test_a_replica_killed_mid_load_loses_no_acknowledged_write(fleet: Fleet) -> None:
    subjects = [f"kim{i}" for i in range(4)]
    per_subject = 16  # under every subject's budget and rate
    victim = fleet.replica("r2")
    workspace = fleet.stores.workspace
    jobs: list[tuple[str, str, dict[str, Any]]] = []  # subject, key, arguments
    for subject in subjects:
        for n in range(per_subject):
            jobs.append(
                (subject, f"kill-{subject}-{n}",
                 {"path": f"scratch/kill/{subject}-{n}.txt", "content": bulk(f"{subject} {n}")})
            )  # fmt: skip
    approvals = {key: mint(fleet.url, WRITE, args, subject)[0] for subject, key, args in jobs}
    (workspace / "scratch" / "kill").mkdir()
    seen: dict[str, Outcome] = {}
    done = 0
    killed_at: float | None = None

    async def writer(queue: list[tuple[str, str, dict[str, Any]]]) -> None:
        nonlocal done
        for subject, key, args in queue:
            call = {**args, "idempotency_key": key, "approval_token": approvals[key]}
            try:
                seen[key] = await call_tool(fleet.mcp, token(subject, role="editor"), WRITE, call)
            except Exception as exc:  # a dropped call is an outcome here
                seen[key] = exc
            done += 1

    async def killer() -> None:
        nonlocal killed_at
        while done < len(jobs) // 4:
            await asyncio.sleep(0.01)
        assert victim.proc is not None
        os.kill(victim.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()

    lanes = [jobs[i::KILL_LANES] for i in range(KILL_LANES)]
    try:
        await asyncio.gather(killer(), *(writer(lane) for lane in lanes))
        assert killed_at is not None and victim.proc is not None
        assert victim.proc.wait(10) == -signal.SIGKILL
        accepted = {k for k, o in seen.items() if code(o) == "OK"}
        assert len(seen) == len(jobs)
        # Every write the client saw accepted is on disk, as sent.
        by_key = {key: (subject, args) for subject, key, args in jobs}
        for key in accepted:
            args = by_key[key][1]
            assert (workspace / args["path"]).read_text() == args["content"], key
        # Nothing but the kill went wrong: a call either succeeded or lost its replica.
        other = Counter(code(o) for k, o in seen.items() if k not in accepted)
        assert all(c.startswith("TRANSPORT:") or c == "INTERNAL_ERROR" for c in other), other
        # The store's side: no record claims a write that is not on disk, and a pending
        # claim exists only for a call the client did not see succeed.
        target = identify_folder(workspace)
        scopes = {
            IdempotencyScope(subject, "nexus", WRITE, key, target=target).digest(): key
            for subject, key, _ in jobs
        }
        rows = {
            scopes[s]: v for s, v in idempotency_rows(fleet.stores.pg_url).items() if s in scopes
        }
        for key, (state, result_json) in rows.items():
            args = by_key[key][1]
            if state == "succeeded":
                assert result_json is not None
                assert (workspace / args["path"]).read_text() == args["content"], key
                assert json.loads(result_json)["structured"]["path"] == args["path"]
            else:
                assert key not in accepted, (key, state)
        for key in accepted:
            assert rows.get(key, ("missing", None))[0] == "succeeded", key
        # The other replicas keep serving through nginx.
        survivors = [r for r in fleet.replicas if r is not victim]
        assert all(r.alive() for r in survivors)
        reader = token("kira", role="viewer")
        after = await concurrently(
            call_tool(fleet.mcp, reader, READ, {"path": "hello.txt"}) for _ in range(12)
        )
        assert Counter(code(o) for o in after) == {"OK": 12}
        print(
            f"\nkill test: {len(accepted)}/{len(jobs)} accepted, "
            f"{len(jobs) - len(accepted)} lost with r2, rows {Counter(s for s, _ in rows.values())}"
        )
    finally:
        # Leave the fleet whole for any test that follows.
        stop_replica(victim)
        start_replica(victim, fleet.env)


# --- 6. a store stopped during load -------------------------------------------------------------


@dataclass
class Load:
    """Calls from several lanes, until stopped; every outcome with the time it came."""

    outcomes: list[tuple[float, str, Outcome]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, lanes: int, make: Callable[[int], Awaitable[tuple[str, Outcome]]]) -> None:
        counter = iter(range(10**9))

        async def lane() -> None:
            while not self.stop.is_set():
                number = next(counter)
                try:
                    name, outcome = await make(number)
                except Exception as exc:  # kept as an outcome
                    name, outcome = "?", exc
                self.outcomes.append((time.monotonic(), name, outcome))

        await asyncio.gather(*(lane() for _ in range(lanes)))

    def since(self, moment: float) -> list[Outcome]:
        return [o for t, _, o in self.outcomes if t >= moment]

    async def until(self, done: Callable[[], bool], timeout: float) -> float:
        start = time.monotonic()
        while not done():
            assert time.monotonic() - start < timeout, Counter(
                code(o) for _, _, o in self.outcomes[-20:]
            )
            await asyncio.sleep(0.05)
        return time.monotonic() - start


def assert_clean_refusal(outcome: Outcome, secrets_: list[str]) -> None:
    """UNAVAILABLE as a typed envelope naming the store, never an address or a trace."""
    assert isinstance(outcome, dict), outcome
    payload = envelope(outcome)
    assert payload["code"] == "UNAVAILABLE", payload
    message = payload["error"]
    for leaked in ("Traceback", "127.0.0.1", "localhost", "redis://", "postgresql://", *secrets_):
        assert leaked not in message, message


async def outage_under_load(
    replicas: list[Replica],
    *,
    stop_store: Callable[[], None],
    start_store: Callable[[], None],
    call: Callable[[Replica, int], Awaitable[dict[str, Any]]],
    leaks: list[str],
) -> Load:
    """Load the replicas, stop the store, see refusals, start it, see successes again."""
    load = Load()

    async def make(number: int) -> tuple[str, Outcome]:
        replica = replicas[number % len(replicas)]
        return replica.name, await call(replica, number)

    pids = [r.proc.pid for r in replicas if r.proc is not None]
    task = asyncio.create_task(load.run(4, make))
    try:
        await load.until(lambda: sum(code(o) == "OK" for _, _, o in load.outcomes) >= 8, 20)
        before = [code(o) for _, _, o in load.outcomes]
        assert set(before) == {"OK"}, Counter(before)
        await asyncio.to_thread(stop_store)
        stopped = time.monotonic()

        def refused_everywhere() -> bool:
            names = {n for t, n, o in load.outcomes if t > stopped and code(o) == "UNAVAILABLE"}
            return names == {r.name for r in replicas}

        await load.until(refused_everywhere, OUTAGE_DEADLINE_SECONDS)
        await asyncio.sleep(0.5)  # a stretch of outage under load
        await asyncio.to_thread(start_store)
        restarted = time.monotonic()

        def served_everywhere() -> bool:
            names = {n for t, n, o in load.outcomes if t > restarted and code(o) == "OK"}
            return names == {r.name for r in replicas}

        recovery = await load.until(served_everywhere, OUTAGE_DEADLINE_SECONDS)
        print(f"\nrecovered {recovery:.2f} s after the store came back")
    finally:
        load.stop.set()
        await task
    during = load.since(stopped)
    codes = Counter(code(o) for o in during)
    assert set(codes) <= {"OK", "UNAVAILABLE"}, codes
    for outcome in during:
        if code(outcome) == "UNAVAILABLE":
            assert_clean_refusal(outcome, leaks)
    # The same processes, alive, no trace in their logs: nothing was restarted.
    assert [r.proc.pid for r in replicas if r.proc is not None] == pids
    assert all(r.alive() for r in replicas)
    for replica in replicas:
        assert "Traceback" not in replica.stderr(), replica.stderr()[-3000:]
    return load


def assert_store_named(load: Load) -> None:
    """docs/errors.md: UNAVAILABLE "names the store (grants, idempotency, nonces,
    limits), never its address"."""
    messages = {
        envelope(o)["error"]
        for _, _, o in load.outcomes
        if isinstance(o, dict) and code(o) == "UNAVAILABLE"
    }
    assert messages
    for message in messages:
        assert any(store in message for store in STORE_NAMES), messages


def outage_workspace(root: Path) -> Path:
    workspace = root / "ws"
    (workspace / "scratch").mkdir(parents=True)
    (workspace / "hello.txt").write_text(HELLO, encoding="utf-8")
    return workspace


async def test_redis_stopped_during_load_refuses_with_unavailable_and_recovers_in_place(
    postgres_url: str, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    prefix = "nexus-t-" + secrets.token_hex(5)
    env = store_env(postgres_url, private_redis.url)
    workspace = outage_workspace(tmp_path)
    replicas = make_replicas(
        tmp_path, ("a1", "a2"), workspace=workspace, prefix=prefix,
        budgets=GENEROUS_BUDGETS, policy=UNAPPROVED_WRITES,
    )  # fmt: skip
    migrate(replicas[0].config, env)
    bearer = token("otto", role="viewer")

    async def read(replica: Replica, _number: int) -> dict[str, Any]:
        return await call_tool(f"{replica.url}/mcp", bearer, READ, {"path": "hello.txt"})

    with running(replicas, env):
        load = await outage_under_load(
            replicas,
            stop_store=private_redis.stop,
            start_store=private_redis.start,
            call=read,
            leaks=[str(private_redis.port)],
        )
    assert_store_named(load)


async def test_postgres_stopped_during_load_refuses_with_unavailable_and_recovers_in_place(
    private_postgres: PrivatePostgres, redis_url: str, state_prefix: str, tmp_path: Path
) -> None:
    env = store_env(private_postgres.url, redis_url)
    workspace = outage_workspace(tmp_path)
    replicas = make_replicas(
        tmp_path, ("p1", "p2"), workspace=workspace, prefix=state_prefix,
        budgets=GENEROUS_BUDGETS, policy=UNAPPROVED_WRITES,
    )  # fmt: skip
    migrate(replicas[0].config, env)
    bearer = token("olga", role="editor")
    sent: dict[str, str] = {}

    async def write(replica: Replica, number: int) -> dict[str, Any]:
        path = f"scratch/pg-{number}.txt"
        sent[path] = f"write {number}\n"
        args = {"path": path, "content": sent[path], "idempotency_key": f"pg-{number}"}
        result = await call_tool(f"{replica.url}/mcp", bearer, WRITE, args)
        result["_path"] = path
        return result

    with running(replicas, env):
        load = await outage_under_load(
            replicas,
            stop_store=private_postgres.stop,
            start_store=private_postgres.start,
            call=write,
            leaks=[str(private_postgres.port)],
        )
    # Fail closed: a refused write did nothing; an accepted one is on disk.
    for _, _, outcome in load.outcomes:
        assert isinstance(outcome, dict)
        target = workspace / outcome["_path"]
        if code(outcome) == "OK":
            assert target.read_text() == sent[outcome["_path"]]
        else:
            assert code(outcome) == "UNAVAILABLE"
            assert not target.exists(), outcome["_path"]
    assert_store_named(load)


# --- 8. serve --workers ------------------------------------------------------------------------


def worker_pids(parent: int) -> list[int]:
    """The uvicorn workers ``serve --workers`` spawned (not multiprocessing's tracker)."""
    found: list[int] = []
    for task in Path(f"/proc/{parent}/task").iterdir():
        for pid in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
    return found


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


async def test_two_workers_on_the_shared_backend_serve_with_one_global_budget(
    stores: Stores, tmp_path: Path
) -> None:
    prefix = "nexus-t-" + secrets.token_hex(5)
    # A burst long enough that the kernel hands both workers connections (a short one can
    # be taken almost whole by whichever worker accepts first).
    budget = 60
    [replica] = make_replicas(
        tmp_path, ("w",), workspace=stores.workspace, prefix=prefix,
        budgets={"max_calls_per_session": budget, "rate_limit_calls": 1_000_000},
        policy=APPROVED_WRITES, instance_ids=False,
    )  # fmt: skip
    bearer = token("walt", role="viewer")
    try:
        with running([replica], stores.env, "--workers", "2", "--stateless-http"):
            assert replica.proc is not None
            parent = replica.proc.pid

            async def workers_now() -> list[int]:
                return worker_pids(parent)

            workers, _ = await poll(workers_now, lambda pids: len(pids) >= 2)
            before = {pid: cpu_ticks(pid) for pid in workers}
            calls = [
                call_tool(f"{replica.url}/mcp", bearer, READ, {"path": "hello.txt"})
                for _ in range(budget + 20)
            ]
            codes = Counter(code(o) for o in await concurrently(calls))
            busy = {pid: cpu_ticks(pid) - ticks for pid, ticks in before.items()}
            after = worker_pids(parent)
        assert len(set(workers)) == 2 and set(after) == set(workers), (workers, after)
        print(f"\nworkers {workers}: CPU ticks spent serving the burst {busy}")
        # Both workers served (each spent CPU on the burst), yet one budget held.
        assert all(spent >= 3 for spent in busy.values()), busy
        assert "Traceback" not in replica.stderr(), replica.stderr()[-3000:]
        assert codes == {"OK": budget, "BUDGET_EXCEEDED": 20}, codes
    finally:
        delete_prefix(stores.redis_url, prefix)


def test_two_workers_on_the_embedded_backend_exit_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    env = {"NEXUS_MCP_AUTH__JWT_SECRET": SECRET, "NEXUS_MCP_AUTH__AUDIENCE": AUDIENCE}
    done = subprocess.run(
        serve_command(
            "--transport", "http", "--stateless-http", "--workers", "2", "--port", "0",
            "--mode", "prod", "--workspace", str(tmp_path / "ws"),
            "--data-dir", str(tmp_path / "data"),
        ),
        env=server_env(env), capture_output=True, text=True, timeout=CLI_TIMEOUT_SECONDS,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2, done
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        "nexus-mcp: 'workers' (--workers) above 1 needs state.backend: shared"
    )
    assert done.stdout == ""


def test_the_typescript_sdk_keeps_its_sessions_through_nginx(
    fleet: Fleet, node_clients: NodeClients, tmp_path: Path
) -> None:
    """A non-Python client behind the balancer: the official TypeScript SDK opens
    sessions through nginx (each one's later requests routed back by its prefix), lists,
    calls, gets a refusal as a result, and ends the session, in four processes at once."""
    calls = [{"name": READ, "arguments": {"path": "hello.txt"}}] * 6 + [
        {"name": "no_such_tool", "arguments": {}}
    ]
    plans = [
        [
            {
                "transport": "http",
                "url": fleet.mcp,
                "headers": {"Authorization": f"Bearer {token(f'ts{n}-{s}', role='viewer')}"},
                "calls": calls,
            }
            for s in range(2)
        ]
        for n in range(4)
    ]
    runs = run_ts_plans(node_clients, plans, work=tmp_path)
    sessions = [run for plan in runs for run in plan]
    assert len(sessions) == 8
    for run in sessions:
        assert READ in run.tools
        *reads, unknown = run.calls
        for call in reads:
            result = call["result"]
            assert result.get("isError") is not True, result
            assert result["structuredContent"]["content"] == HELLO
        # FastMCP's own answer, as for a hidden tool (docs/errors.md).
        assert unknown["result"]["isError"] is True
        assert unknown["result"]["content"] == [
            {"type": "text", "text": "Unknown tool: 'no_such_tool'"}
        ]
    # Each session (its own subject) was served by one replica from start to end.
    served_by: dict[str, set[str]] = {}
    for replica in fleet.replicas:
        for record in replica.audit():
            subject = str(record.get("subject", ""))
            if subject.startswith("ts") and record.get("tool") == READ:
                served_by.setdefault(subject, set()).add(replica.name)
    assert len(served_by) == 8, served_by
    assert all(len(names) == 1 for names in served_by.values()), served_by
    assert len(set().union(*served_by.values())) > 1  # and the sessions were balanced
