"""A stdio upstream's transport with a bound on each message (issue 22, unbounded listings).

The MCP SDK's ``stdio_client`` reads the server's stdout into a line buffer with no
limit: an upstream that writes one endless line (a ``tools/list`` page of gigabytes)
fills the gateway's memory before any cap on the listing can look at it. This is that
client, unchanged (its process start, its shutdown: the SDK's own helpers) but for the
reader: a line longer than ``max_line_chars`` ends the connection (the upstream is down,
as for any broken transport; logged, never echoed). FastMCP's ``StdioTransport`` has no
hook for its stdio client, so ``BoundedStdioTransport`` is a plain ``ClientTransport``
(one process per session, as ``keep_alive=False`` gives).

A large message (a ``tools/list`` page of thousands of definitions, megabytes on one
line) is not parsed in one call on the event loop, as the SDK's ``_parse_line`` does
(one call to the JSON parser, the loop held for all of it): ``large_json.py`` walks its
outer containers and decodes what is inside them a value at a time, giving the loop a
turn every few milliseconds; the message is then validated as the SDK validates it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.lowlevel
import mcp_types as types
from anyio.streams.text import TextReceiveStream
from fastmcp.client.transports.base import ClientTransport, TransportOptions
from mcp import ClientSession
from mcp.client.stdio import (
    _WRITER_FLUSH_TIMEOUT,
    StdioServerParameters,
    _aclose_all,
    _create_platform_compatible_process,
    _drain_stdout,
    _get_executable_command,
    _parse_line,
    _stop_server_process,
    get_default_environment,
)
from mcp.shared.message import SessionMessage

from nexus_mcp.observability.logs import get_logger
from nexus_mcp.providers.upstream.large_json import loads_in_steps

log = get_logger(__name__)

LARGE_LINE_CHARS = 256 * 1024  # a line longer than this is parsed in steps


async def parse_large_line(line: str) -> SessionMessage | Exception:
    """``_parse_line``, the loop given a turn while it parses (module docstring)."""
    try:
        value = await loads_in_steps(line)
        message = types.jsonrpc_message_adapter.validate_python(value, by_name=False)
    except ValueError as exc:  # a JSON error or a ValidationError: as _parse_line returns it
        log.warning("upstream_message_unparsable", transport="stdio")
        return exc
    return SessionMessage(message)


class LineBuffer:
    """Splits a stream of text chunks into lines, each at most ``max_chars`` long.

    Linear in what is read: a chunk is searched once and kept in a list until its line
    ends (the SDK's ``(buffer + chunk).split("\\n")`` copies and scans the whole pending
    line again for every chunk, so an upstream dripping one long line in small writes
    costs the gateway's event loop time quadratic in its length). Once a line passes the
    cap, ``overflowed`` is set and nothing more is returned.
    """

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.pending: list[str] = []
        self.pending_chars = 0
        self.overflowed = False

    def feed(self, chunk: str) -> list[str]:
        """The lines ``chunk`` completes, in order (none once ``overflowed``)."""
        lines: list[str] = []
        start = 0
        while not self.overflowed:
            end = chunk.find("\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if self.pending_chars + len(piece) > self.max_chars:
                self.overflowed = True
                self.pending.clear()
                break
            if end < 0:
                if piece:
                    self.pending.append(piece)
                    self.pending_chars += len(piece)
                break
            if self.pending:
                self.pending.append(piece)
                piece = "".join(self.pending)
                self.pending.clear()
                self.pending_chars = 0
            lines.append(piece)
            start = end + 1
        return lines


@contextlib.asynccontextmanager
async def bounded_stdio_client(
    server: StdioServerParameters, errlog: TextIO, max_line_chars: int, *, whole_env: bool = False
) -> AsyncGenerator[tuple[Any, Any], None]:
    """``mcp.client.stdio.stdio_client`` with a bounded line buffer (module docstring).
    ``whole_env``: ``server.env`` is the whole environment (a sandboxed upstream), not
    added to the SDK's small default one."""
    command = await _get_executable_command(server.command)
    env = dict(server.env or {}) if whole_env else get_default_environment() | (server.env or {})
    process = await _create_platform_compatible_process(
        command=command,
        args=server.args,
        env=env,
        errlog=errlog,
        cwd=server.cwd,
    )
    read_stream_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](
        0
    )
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)
    shutting_down = False
    writer_done = anyio.Event()

    async def stdout_reader() -> None:
        assert process.stdout, "Opened process is missing stdout"
        stdout = TextReceiveStream(
            process.stdout, encoding=server.encoding, errors=server.encoding_error_handler
        )
        try:
            async with read_stream_writer:
                try:
                    lines = LineBuffer(max_line_chars)
                    async for chunk in stdout:
                        for line in lines.feed(chunk):
                            message = (
                                await parse_large_line(line)
                                if len(line) > LARGE_LINE_CHARS
                                else _parse_line(line)
                            )
                            try:
                                await read_stream_writer.send(message)
                            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                                return
                        if lines.overflowed:
                            # One message over the cap: not read further; the
                            # connection ends (the session sees it closed).
                            log.warning("upstream_message_too_large", transport="stdio")
                            return
                finally:
                    await _drain_stdout(process)
        except anyio.ClosedResourceError:
            pass
        except (anyio.BrokenResourceError, ConnectionError):
            if not shutting_down:
                log.warning("upstream_stdout_failed")

    async def stdin_writer() -> None:
        assert process.stdin, "Opened process is missing stdin"
        try:
            async with write_stream_reader:
                async for session_message in write_stream_reader:
                    json = session_message.message.model_dump_json(
                        by_alias=True, exclude_unset=True
                    )
                    data = (json + "\n").encode(
                        encoding=server.encoding, errors=server.encoding_error_handler
                    )
                    await process.stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_stream_writer.aclose()
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT) as flush_scope:
            await writer_done.wait()
        if flush_scope.cancelled_caught:
            await anyio.lowlevel.cancel_shielded_checkpoint()
        await _stop_server_process(process)
        await _aclose_all(read_stream, write_stream, read_stream_writer, write_stream_reader)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            shutting_down = True
            with anyio.CancelScope(shield=True):
                await shutdown()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()


class BoundedStdioTransport(ClientTransport):
    """A stdio upstream, one process per session, each message bounded."""

    def __init__(
        self,
        command: str,
        args: list[str],
        *,
        env: dict[str, str],
        cwd: str | None,
        max_line_chars: int,
        whole_env: bool = False,
    ) -> None:
        self.params = StdioServerParameters(command=command, args=args, env=env, cwd=cwd)
        self.max_line_chars = max_line_chars
        self.whole_env = whole_env

    @contextlib.asynccontextmanager
    async def connect_session(
        self, *, transport_options: TransportOptions | None = None, **session_kwargs: Any
    ) -> AsyncIterator[ClientSession]:
        options = transport_options or TransportOptions()
        with Path(os.devnull).open("a") as errlog:
            async with (
                bounded_stdio_client(
                    self.params, errlog, self.max_line_chars, whole_env=self.whole_env
                ) as (read, write),
                options.session_class(read, write, **session_kwargs) as session,
            ):
                yield session

    def __repr__(self) -> str:
        return "<BoundedStdioTransport>"


__all__ = ["BoundedStdioTransport", "LineBuffer", "bounded_stdio_client"]
