"""Replicas (issue 15): the shared state backend, --workers, and replicas behind nginx.

Three parts, each measuring nexus-mcp beside its baseline in the same run, every server a
real ``nexus-mcp serve --transport http --stateless-http`` subprocess on a loopback port,
and each part with its own throwaway PostgreSQL database and Redis key prefix (created,
migrated with ``nexus-mcp state migrate``, dropped and deleted afterwards, also on failure):

1. **shared vs embedded backend**, one process each: one client alternates calls between
   the two servers (the order flips every round), reads (``nexus_read_file``) then writes
   (``nexus_write_file`` with a new ``idempotency_key`` each call); each side's median.
   Target for reads: the shared backend keeps at least 0.85 of the embedded backend's
   calls/s (its per-call time at most 1/0.85 = 1.18x). Writes are reported.
2. **--workers 2 vs --workers 1**, both on the shared backend: the load generator of
   ``bench_http_load.py`` (its own process, a minimal HTTP/1.1 client) keeps 50 calls in
   flight for a fixed window, the two servers taking turns (rotating order). Target: 2
   workers at least 1.6x the calls/s of 1. One process on the embedded backend takes the
   same turns, for reference. The machine has 2 cores and the load generator, PostgreSQL
   and Redis share them: beside each result are the CPU seconds (per call, and as cores
   busy over the window) of the servers, the generator, PostgreSQL + Redis, and the whole
   machine (/proc/stat), so other work on the machine shows.
3. **three replicas behind nginx vs one replica directly** (the nginx block of docs/replicas.md with
   loopback ports; the direct side is replica r1 itself): calls/s and p99 latency, same
   load generator and rounds as part 2. Reported, no target.

    python benchmarks/bench_replicas.py [--part backends|workers|nginx ...] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench_http_load import Tally, one_round
from results import Row, format_value, progress, report
from servers import (
    HttpSession,
    RpcError,
    ServerSpec,
    bench_workspace,
    check_read_result,
    child_env,
    free_port,
    http_server,
)

NAME = "bench_replicas"
READ_TARGET = 0.85  # shared backend: at least 0.85 of the embedded backend's reads/s
WORKERS_TARGET = 1.6  # two workers: at least 1.6x one worker's calls/s
WARMUP_CALLS = 50
READ_ARGS = {"path": "small.txt"}
PG_ADMIN_URL = os.environ.get(
    "NEXUS_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("NEXUS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
# Dev mode accepts inline keys; 32+ bytes, the same for every replica of a part.
REQUEST_STATE_KEY = "nexus-bench-request-state-key-0123456789"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


# --- shared state: a database and key prefix of each part's own --------------------------


@dataclass
class SharedState:
    database: str
    postgres_url: str
    redis_url: str
    key_prefix: str

    def config(self, path: Path, instance_id: str | None = None) -> Path:
        """A configuration file putting a server on this database and prefix."""
        lines = [
            "mode: dev",
            "state:",
            "  backend: shared",
            f"  postgres_url: {self.postgres_url}",
            f"  redis_url: {self.redis_url}",
            f"  key_prefix: {self.key_prefix}",
            f'  request_state_keys: ["{REQUEST_STATE_KEY}"]',
        ]
        if instance_id:
            lines.append(f"  instance_id: {instance_id}")
        path.write_text("\n".join(lines) + "\n")
        return path


@contextlib.contextmanager
def shared_state(root: Path) -> Iterator[SharedState]:
    """A new database (migrated) and Redis key prefix, dropped and deleted afterwards."""
    import psycopg
    import redis

    token = secrets.token_hex(5)
    name = f"nexus_bench_{token}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    state = SharedState(
        name, f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}", REDIS_URL, f"nexus-bench-{token}"
    )
    try:
        config = state.config(root / "migrate.yaml")
        done = subprocess.run(
            [sys.executable, "-m", "nexus_mcp", "state", "migrate", "--config", str(config)],
            env=child_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"state migrate failed ({done.returncode}): {done.stderr}")
        yield state
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        client = redis.Redis.from_url(REDIS_URL)
        try:
            keys = list(client.scan_iter(match=f"{state.key_prefix}:*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


# --- CPU: a process and its descendants (workers, nginx), the stores, the machine --------

STORE_COMMANDS = ("postgres", "redis-server")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class ProcessTable:
    """One pass over /proc: each process's parent, command name and CPU seconds."""

    parent: dict[int, int] = field(default_factory=dict)
    command: dict[int, str] = field(default_factory=dict)
    cpu: dict[int, float] = field(default_factory=dict)

    @classmethod
    def read(cls) -> ProcessTable:
        table = cls()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            pid = int(entry.name)
            head, _, rest = text.rpartition(")")
            fields = rest.split()  # state, ppid, ... utime (12th), stime (13th) from here
            table.parent[pid] = int(fields[1])
            table.command[pid] = head.partition("(")[2]
            table.cpu[pid] = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        return table

    def tree(self, root: int) -> list[int]:
        """``root`` and every live descendant."""
        children: dict[int, list[int]] = {}
        for pid, parent in self.parent.items():
            children.setdefault(parent, []).append(pid)
        found, todo = [], [root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found

    def stores_cpu(self) -> float:
        """PostgreSQL's and Redis's processes together (the machine's own servers)."""
        return sum(
            cpu for pid, cpu in self.cpu.items() if self.command[pid].startswith(STORE_COMMANDS)
        )


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent on anything but idle and iowait, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / _CLOCK_TICKS


@dataclass
class Target:
    """Where a round's load goes (``url``) and whose CPU it costs (``pids``' trees)."""

    label: str
    url: str
    pids: list[int]
    per_pid: dict[int, float] = field(default_factory=dict)  # CPU over all windows
    stores_s: float = 0.0  # PostgreSQL + Redis CPU over all windows
    machine_s: float = 0.0  # all cores' busy time over all windows
    _snapshots: list[tuple[dict[int, float], float, float]] = field(default_factory=list)

    def cpu_seconds(self) -> float:
        """Called by ``one_round`` at the window's start and end."""
        table = ProcessTable.read()
        mine = {pid: table.cpu[pid] for root in self.pids for pid in table.tree(root)}
        self._snapshots.append((mine, table.stores_cpu(), machine_busy_seconds()))
        return sum(mine.values())

    def close_window(self) -> None:
        (start, stores0, busy0), (end, stores1, busy1) = self._snapshots[-2:]
        for pid, value in end.items():
            self.per_pid[pid] = self.per_pid.get(pid, 0.0) + value - start.get(pid, value)
        self.stores_s += stores1 - stores0
        self.machine_s += busy1 - busy0

    def cpu_of(self, pids: set[int]) -> float:
        return sum(v for pid, v in self.per_pid.items() if pid in pids)

    def split(self) -> str:
        """The busiest processes' shares of this target's CPU, e.g. ``51/49 %``."""
        total = sum(self.per_pid.values())
        busy = sorted((v for v in self.per_pid.values() if v > 0.02 * total), reverse=True)
        return "/".join(f"{100 * v / total:.0f}" for v in busy) + " %" if total else "n/a"


# --- part 1: one replica, shared vs embedded backend --------------------------------------


async def alternate(
    rounds: int, sides: dict[str, Callable[[], Awaitable[None]]], label: str
) -> dict[str, list[float]]:
    """One call per side per round, the order flipped every round; seconds per call."""
    for call in sides.values():
        for _ in range(WARMUP_CALLS):
            await call()
    samples: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for number in range(rounds):
        for name in names if number % 2 == 0 else names[::-1]:
            began = time.perf_counter()
            await sides[name]()
            samples[name].append(time.perf_counter() - began)
        if (number + 1) % 500 == 0 and number + 1 < rounds:
            progress(NAME, f"{label}: {number + 1}/{rounds} rounds")
    return samples


async def part_backends(args: argparse.Namespace) -> list[Row]:
    with bench_workspace() as (root, workspace, logs), shared_state(root) as state:
        config = state.config(root / "shared.yaml")
        specs = {
            "embedded": ServerSpec("embedded", "nexus", workspace, root / "data-embedded"),
            "shared": ServerSpec(
                "shared", "nexus", workspace, root / "data-shared", ("--config", str(config))
            ),
        }
        async with (
            http_server(specs["embedded"], logs, stateless=True) as embedded,
            http_server(specs["shared"], logs, stateless=True) as shared,
        ):
            running = {"embedded": embedded, "shared": shared}
            sessions = {k: HttpSession(v.url or "", stateless=True) for k, v in running.items()}
            try:
                for session in sessions.values():
                    await session.initialize()
                    check_read_result(await session.call_tool("nexus_read_file", READ_ARGS))

                def reader(session: HttpSession) -> Callable[[], Awaitable[None]]:
                    async def call() -> None:
                        check_read_result(await session.call_tool("nexus_read_file", READ_ARGS))

                    return call

                def writer(name: str, session: HttpSession) -> Callable[[], Awaitable[None]]:
                    arguments = {"path": f"out-{name}.txt", "content": "written\n" * 32}

                    async def call() -> None:
                        key = {"idempotency_key": uuid.uuid4().hex}
                        result = await session.call_tool("nexus_write_file", arguments | key)
                        if result.get("isError"):
                            raise RpcError(f"the write was refused: {result.get('content')}")

                    return call

                cpu = {k: v.cpu_seconds() for k, v in running.items()}
                progress(NAME, f"backends: {args.calls} reads per side, alternating")
                reads = await alternate(
                    args.calls, {k: reader(s) for k, s in sessions.items()}, "reads"
                )
                read_cpu = {k: v.cpu_seconds() - cpu[k] for k, v in running.items()}
                cpu = {k: v.cpu_seconds() for k, v in running.items()}
                progress(NAME, f"backends: {args.writes} writes per side, alternating")
                writes = await alternate(
                    args.writes, {k: writer(k, s) for k, s in sessions.items()}, "writes"
                )
                write_cpu = {k: v.cpu_seconds() - cpu[k] for k, v in running.items()}
            finally:
                for session in sessions.values():
                    await session.close()
    return backend_rows(args, reads, writes, read_cpu, write_cpu)


def backend_rows(
    args: argparse.Namespace,
    reads: dict[str, list[float]],
    writes: dict[str, list[float]],
    read_cpu: dict[str, float],
    write_cpu: dict[str, float],
) -> list[Row]:
    read_us = {k: statistics.median(v) * 1e6 for k, v in reads.items()}
    write_us = {k: statistics.median(v) * 1e6 for k, v in writes.items()}

    def cpu_note(used: dict[str, float], calls: int) -> str:
        per = {k: v / (calls + WARMUP_CALLS) * 1e6 for k, v in used.items()}
        return (
            f"server CPU per call {per['embedded']:,.0f} µs embedded, {per['shared']:,.0f} µs "
            f"shared ({per['shared'] / per['embedded']:.2f}x)"
        )

    time_ratio = read_us["shared"] / read_us["embedded"]
    return [
        Row(
            measure="1 replica, stateless HTTP read, 1 client: calls/s, shared vs embedded",
            baseline="embedded backend",
            baseline_value=1e6 / read_us["embedded"],
            value=1e6 / read_us["shared"],
            unit="calls/s",
            target_kind="ratio_min",
            target=READ_TARGET,
            note=(
                f"1 / median per-call time of {args.calls} alternating calls each: "
                f"{read_us['embedded']:,.0f} µs embedded, {read_us['shared']:,.0f} µs shared "
                f"(time shared ÷ embedded {time_ratio:.3f}x, bound {1 / READ_TARGET:.3f}x); "
                + cpu_note(read_cpu, args.calls)
            ),
        ),
        Row(
            measure="1 replica, stateless HTTP write (new idempotency key): per call",
            baseline="embedded backend",
            baseline_value=write_us["embedded"],
            value=write_us["shared"],
            unit="µs",
            note=(
                f"median of {args.writes} alternating nexus_write_file calls each (fsync'd "
                "file, idempotency claim: SQLite vs PostgreSQL); "
                + cpu_note(write_cpu, args.writes)
            ),
        ),
    ]


# --- parts 2 and 3: throughput under load --------------------------------------------------


async def load_rounds(
    args: argparse.Namespace, targets: list[Target], label: str
) -> dict[str, Tally]:
    """``args.rounds`` rounds per target, rotating order, the bench_http_load generator."""
    tallies = {target.label: Tally() for target in targets}
    for number in range(args.rounds):
        shift = number % len(targets)
        for target in targets[shift:] + targets[:shift]:
            progress(NAME, f"{label} round {number + 1}/{args.rounds}: {target.label}")
            await one_round(target, args, True, tallies[target.label])
            target.close_window()
    return tallies


def load_note(label: str, tally: Tally, target: Target, extra: str = "") -> str:
    def cores(seconds: float) -> str:
        return f"{seconds / tally.seconds:.2f}" if tally.seconds else "n/a"

    def per_call(seconds: float) -> str:
        return format_value(tally.per_call_ms(seconds), "ms")

    other = target.machine_s - tally.server_cpu_s - tally.client_cpu_s - target.stores_s
    return (
        f"{label}: {tally.throughput:,.0f} calls/s, p50 {format_value(tally.percentile(0.5), 'ms')}"
        f", p99 {format_value(tally.percentile(0.99), 'ms')}, {tally.errors} errors; CPU per "
        f"call (cores busy): servers {per_call(tally.server_cpu_s)} "
        f"({cores(tally.server_cpu_s)}){extra}, load generator {per_call(tally.client_cpu_s)} "
        f"({cores(tally.client_cpu_s)}), PostgreSQL + Redis {per_call(target.stores_s)} "
        f"({cores(target.stores_s)}, all their clients), whole machine "
        f"{cores(target.machine_s)} cores busy (other work {cores(max(0.0, other))})"
    )


async def part_workers(args: argparse.Namespace) -> list[Row]:
    with bench_workspace() as (root, workspace, logs), shared_state(root) as state:
        config = str(state.config(root / "shared.yaml"))
        specs = [
            ServerSpec(
                f"workers-{n}", "nexus", workspace, root / f"data-{n}",
                ("--config", config, "--workers", str(n)),
            )
            for n in (1, 2)
        ]  # fmt: skip
        # For reference: one process on the embedded backend (what --workers is refused on).
        specs.append(ServerSpec("embedded", "nexus", workspace, root / "data-embedded"))
        async with (
            http_server(specs[0], logs, stateless=True) as one,
            http_server(specs[1], logs, stateless=True) as two,
            http_server(specs[2], logs, stateless=True) as alone,
        ):
            targets = [
                Target("1 worker", one.url or "", [one.pid]),
                Target("2 workers", two.url or "", [two.pid]),
                Target("1 process, embedded", alone.url or "", [alone.pid]),
            ]
            tallies = await load_rounds(args, targets, "workers")
    base, measured, embedded = (tallies[t.label] for t in targets)
    return [
        Row(
            measure=f"--workers 2 vs 1, shared, stateless read, {args.clients} clients: calls/s",
            baseline="--workers 1, same load",
            baseline_value=base.throughput,
            value=measured.throughput,
            unit="calls/s",
            target_kind="ratio_min",
            target=WORKERS_TARGET,
            note="; ".join(
                [
                    load_note("2 workers", measured, targets[1], f" (split {targets[1].split()})"),
                    load_note("1 worker", base, targets[0]),
                    f"{os.cpu_count()} cores shared by servers, generator, PostgreSQL, Redis",
                ]
            ),
        ),
        Row(
            measure="same, --workers 2 (shared) vs 1 process on the embedded backend",
            baseline="embedded, 1 process, same load",
            baseline_value=embedded.throughput,
            value=measured.throughput,
            unit="calls/s",
            note=load_note("1 process, embedded", embedded, targets[2]),
        ),
    ]


NGINX_CONF = """\
{user}worker_processes 1;
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;

    upstream nexus_pool {{
{servers}
        keepalive 32;
    }}

    # A 2025-11-25 session goes back to the replica whose instance_id starts its id;
    # everything else (new sessions, stateless requests) is balanced.
    map $http_mcp_session_id $nexus_backend {{
{routes}
        default nexus_pool;
    }}

    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://$nexus_backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_read_timeout 1h;
        }}
    }}
}}
"""


@contextlib.asynccontextmanager
async def nginx(folder: Path, ports: list[int]) -> AsyncIterator[tuple[str, int]]:
    """nginx in front of ``ports`` (docs/replicas.md's block, loopback); yields (url, pid)."""
    folder.mkdir()
    port = free_port()
    conf = folder / "nginx.conf"
    conf.write_text(
        NGINX_CONF.format(
            # As root, nginx's workers would run as nobody, who cannot enter this folder.
            user="user root;\n" if os.geteuid() == 0 else "",
            dir=folder,
            port=port,
            servers="\n".join(f"        server 127.0.0.1:{p};" for p in ports),
            routes="\n".join(
                f"        ~^r{n}\\.  127.0.0.1:{p};" for n, p in enumerate(ports, start=1)
            ),
        )
    )
    process = subprocess.Popen(
        [NGINX, "-p", str(folder), "-c", str(conf), "-g", "daemon off;"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=(folder / "stderr").open("wb"),
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 20
        while True:
            if process.poll() is not None:
                log = (
                    (folder / "error.log").read_text(errors="replace")
                    if (folder / "error.log").exists()
                    else ""
                )
                raise RuntimeError(f"nginx exited ({process.returncode}): {log}")
            session = HttpSession(url, stateless=True)
            try:
                await asyncio.wait_for(session.initialize(), 5.0)
                break
            except (OSError, asyncio.IncompleteReadError, TimeoutError, RpcError):
                if time.monotonic() > deadline:
                    raise TimeoutError("nginx did not pass requests through") from None
                await asyncio.sleep(0.1)  # polling interval of a bounded wait
            finally:
                await session.close()
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def part_nginx(args: argparse.Namespace) -> list[Row]:
    with bench_workspace() as (root, workspace, logs), shared_state(root) as state:
        specs = [
            ServerSpec(
                f"r{n}", "nexus", workspace, root / f"data-r{n}",
                ("--config", str(state.config(root / f"r{n}.yaml", instance_id=f"r{n}"))),
            )
            for n in (1, 2, 3)
        ]  # fmt: skip
        async with (
            http_server(specs[0], logs, stateless=True) as r1,
            http_server(specs[1], logs, stateless=True) as r2,
            http_server(specs[2], logs, stateless=True) as r3,
        ):
            replicas = [r1, r2, r3]
            ports = [int((r.url or "").rsplit(":", 1)[1].split("/")[0]) for r in replicas]
            async with nginx(root / "nginx", ports) as (url, nginx_pid):
                direct = Target("1 replica, direct", r1.url or "", [r1.pid])
                balanced = Target("3 replicas, nginx", url, [nginx_pid] + [r.pid for r in replicas])
                tallies = await load_rounds(args, [direct, balanced], "nginx")
                nginx_pids = set(ProcessTable.read().tree(nginx_pid))
            nginx_cpu = balanced.cpu_of(nginx_pids)
    base, measured = tallies[direct.label], tallies[balanced.label]
    nginx_ms = nginx_cpu / measured.calls * 1000 if measured.calls else float("nan")
    note = "; ".join(
        [
            load_note(
                "3 replicas + nginx", measured, balanced,
                f" (nginx {nginx_ms:.2f} ms of it; split {balanced.split()})",
            ),
            load_note("1 replica direct", base, direct),
        ]
    )  # fmt: skip
    return [
        Row(
            measure=f"3 replicas + nginx vs 1 direct, stateless read, {args.clients} clients: calls/s",
            baseline="1 replica, direct, same load",
            baseline_value=base.throughput,
            value=measured.throughput,
            unit="calls/s",
            note=note,
        ),
        Row(
            measure="same: p99 latency",
            baseline="1 replica, direct",
            baseline_value=base.percentile(0.99),
            value=measured.percentile(0.99),
            unit="ms",
        ),
    ]


# --- main ------------------------------------------------------------------------------------


PARTS = {"backends": part_backends, "workers": part_workers, "nginx": part_nginx}


def stores_reachable() -> str | None:
    """None when PostgreSQL and Redis answer; else which does not, and why."""
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any driver failure means "not reachable"
        return f"PostgreSQL at {PG_ADMIN_URL}: {type(exc).__name__}"
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001
        return f"Redis at {REDIS_URL}: {type(exc).__name__}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--part", choices=sorted(PARTS), action="append", help="these only")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--calls", type=int, default=1500, help="part 1: reads per side")
    parser.add_argument("--writes", type=int, default=400, help="part 1: writes per side")
    parser.add_argument("--clients", type=int, default=50, help="parts 2, 3: calls in flight")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured window per round")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each window")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side (parts 2, 3)")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.writes, args.seconds, args.rounds = 200, 60, 2.0, 1
    problem = stores_reachable()
    if problem is not None:
        sys.stderr.write(f"{NAME}: the shared backend's stores are not reachable: {problem}\n")
        return 1
    rows: list[Row] = []
    for part in args.part or list(PARTS):
        progress(NAME, f"part {part}")
        rows += asyncio.run(PARTS[part](args))
    report(NAME, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
