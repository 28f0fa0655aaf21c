"""An HTTP upstream that answers with a redirect: never followed, same origin or not.

The gateway's credential for an upstream is for that URL only. The MCP SDK follows a
redirect that stays on the endpoint's origin by itself (``stream_within_origin``, up to
the client's ``max_redirects``), whatever the client's ``follow_redirects`` says; the
gateway's HTTP client allows none, and refuses any request to another URL than the
configured one. A redirect is an upstream failure: the upstream is down, nothing else is.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastmcp import Client

from .hostile_harness import HostileHttp, hostile_http
from .upstream_harness import Gateway, http_upstream, make_gateway, poll

pytestmark = pytest.mark.slow

CANARY = "redirect-credential-CANARY-5e1d"
CODES = (301, 302, 307, 308)


def assert_never_followed(upstream: HostileHttp) -> None:
    seen = upstream.requests()
    assert seen, "the gateway never reached the upstream"
    for request in seen:
        # Only the configured endpoint was ever asked; the redirect target never was.
        assert (request["port"], request["path"]) == (upstream.port, "/mcp"), request
        assert request["authorization"] == f"Bearer {CANARY}"


def gateway_for(tmp_path: Path, url: str) -> Gateway:
    upstream = http_upstream(
        "hop",
        url,
        credentials={"type": "bearer", "token": {"env": "HOP_TOKEN"}},
        timeouts={"connect_seconds": 5},
    )
    return make_gateway(tmp_path / "gw", [upstream], registries={"hop": {"echo": "read"}})


@pytest.mark.parametrize("origin", ["same", "cross"])
@pytest.mark.parametrize("code", CODES)
def test_check_never_follows_a_redirect(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    code: int,
    origin: str,
) -> None:
    monkeypatch.setenv("HOP_TOKEN", CANARY)
    with hostile_http(f"redirect-{code}-{origin}", tmp_path / "record.jsonl") as upstream:
        gw = gateway_for(tmp_path, upstream.url)
        assert gw.check("hop") == 1
        assert "could not connect" in capsys.readouterr().err
        assert_never_followed(upstream)


async def test_serve_treats_a_redirect_as_the_upstream_down(tmp_path: Path) -> None:
    """Serve: the redirecting upstream is degraded; native tools are served as ever."""
    with hostile_http("redirect-307-same", tmp_path / "record.jsonl") as upstream:
        gw = gateway_for(tmp_path, upstream.url)
        server = gw.build(env={"HOP_TOKEN": CANARY})
        async with Client(server.mcp) as client:
            names = {t.name for t in await client.list_tools()}
            upstreams = server.runtime.upstreams
            assert upstreams is not None
            hop = upstreams.servers["hop"]
            await poll(lambda: hop.state == "degraded")
            assert names  # native tools are served
            assert not any(n.startswith("hop_") for n in names)
        assert_never_followed(upstream)
