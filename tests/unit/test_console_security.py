"""The console's own policy and defences, decision by decision (policy/console.py,
console/security.py); the end-to-end tests drive the same through a real socket."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.requests import Request

from nexus_mcp.console.security import (
    COOKIE_NAME,
    SECURE_COOKIE_NAME,
    ConsoleKeys,
    cookie_name,
    csrf_ok,
    load_console_key,
    public_origin,
    same_origin,
)
from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.console import (
    ConsoleSettings,
    allows,
    console_role,
    self_approval_refused,
)
from nexus_mcp.settings import Settings

KEY = b"k" * 48


def request(
    headers: dict[str, str] | None = None, *, scheme: str = "http", host: str = "127.0.0.1:8765"
) -> Request:
    raw = [(b"host", host.encode())] + [
        (k.lower().encode(), v.encode()) for k, v in (headers or {}).items()
    ]
    return Request(
        {
            "type": "http",
            "method": "POST",
            "scheme": scheme,
            "path": "/console/x",
            "headers": raw,
            "query_string": b"",
            "server": ("127.0.0.1", 8765),
        }
    )


@pytest.mark.parametrize(
    ("role", "expected"),
    [("admin", "admin"), ("editor", None), ("viewer", "viewer"), ("ops", "approver"), ("", None)],
)
def test_console_roles_come_from_principal_roles(role: str, expected: str | None) -> None:
    settings = ConsoleSettings(viewer_roles=("viewer",), approver_roles=("ops",))
    assert console_role(role, settings, approver_roles=("admin",)) == expected


def test_approver_roles_default_to_the_servers() -> None:
    assert console_role("lead", ConsoleSettings(), approver_roles=("lead",)) == "approver"
    assert console_role("lead", ConsoleSettings(approver_roles=()), ("lead",)) is None


def test_each_role_may_do_what_its_rank_allows() -> None:
    table = {
        role: [a for a in ("read", "decide", "repin", "grant", "delete") if allows(role, a)]
        for role in ("viewer", "approver", "admin")
    }
    assert table == {
        "viewer": ["read"],
        "approver": ["read", "decide", "repin"],
        "admin": ["read", "decide", "repin", "grant"],
    }


def test_self_approval() -> None:
    assert self_approval_refused(
        request_subject="a", approver_subject="a", approve=True, allow_self_approval=False
    )
    assert not self_approval_refused(
        request_subject="a", approver_subject="a", approve=False, allow_self_approval=False
    )
    assert not self_approval_refused(
        request_subject="a", approver_subject="a", approve=True, allow_self_approval=True
    )
    assert not self_approval_refused(
        request_subject="a", approver_subject="b", approve=True, allow_self_approval=False
    )


def test_sessions_are_signed_and_bounded() -> None:
    keys = ConsoleKeys(KEY, session_ttl_seconds=600)
    user, cookie = keys.new_session(
        subject="alice", log_subject="alice", role="admin", console_role="admin", via="link"
    )
    assert keys.read_session(cookie) == user
    assert ConsoleKeys(b"x" * 48, session_ttl_seconds=600).read_session(cookie) is None
    body, _, signature = cookie.rpartition(".")
    assert keys.read_session(body + "." + signature[::-1]) is None
    assert keys.read_session("A" * 5000) is None
    assert keys.read_session(None) is None
    # A login link is not a session, nor a session a login link (separate salts).
    link = keys.mint_link(subject="alice", role="admin")
    assert keys.read_session(link) is None
    assert keys.read_link(cookie) is None
    assert keys.read_link(link) is not None


def test_csrf_tokens_are_compared_whole() -> None:
    keys = ConsoleKeys(KEY, session_ttl_seconds=600)
    user, _ = keys.new_session(
        subject="a", log_subject="a", role="admin", console_role="admin", via="link"
    )
    assert csrf_ok(user, user.csrf)
    assert not csrf_ok(user, user.csrf[:-1])
    assert not csrf_ok(user, "")
    assert not csrf_ok(user, None)
    assert not csrf_ok(user, "\ud800")


def test_forms_come_from_the_consoles_own_origin() -> None:
    assert same_origin(request({"Origin": "http://127.0.0.1:8765"}))
    assert same_origin(request())  # no Origin: no browser a forged form could drive
    assert not same_origin(request({"Origin": "http://127.0.0.1:8766"}))
    assert not same_origin(request({"Origin": "null"}))
    assert not same_origin(
        request({"Origin": "http://127.0.0.1:8765", "Sec-Fetch-Site": "same-site"})
    )
    # Behind a TLS proxy: the public origin (auth.base_url) is the console's own.
    public = public_origin("https://nexus.example.com/base")
    assert public == "https://nexus.example.com"
    assert same_origin(request({"Origin": "https://nexus.example.com"}), public)
    assert not same_origin(request({"Origin": "https://evil.example.com"}), public)


def test_cookie_names_follow_https() -> None:
    assert cookie_name(request()) == COOKIE_NAME
    assert cookie_name(request(scheme="https")) == SECURE_COOKIE_NAME
    assert cookie_name(request(), "https://nexus.example.com") == SECURE_COOKIE_NAME


def test_the_data_dir_key_is_made_once_and_owner_only(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    first = load_console_key(settings, {})
    assert load_console_key(settings, {}) == first and len(first) >= 32
    assert ((tmp_path / "data" / "console.key").stat().st_mode & 0o777) == 0o600
    (tmp_path / "data" / "console.key").write_text("short\n", encoding="utf-8")
    with pytest.raises(ConfigError):
        load_console_key(settings, {})


def test_a_configured_secret_is_used_by_reference(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "d", console={"secret": {"env": "CONSOLE_KEY"}})
    assert load_console_key(settings, {"CONSOLE_KEY": "s" * 40}) == b"s" * 40
    assert not (tmp_path / "d" / "console.key").exists()
    with pytest.raises(ConfigError):
        load_console_key(settings, {"CONSOLE_KEY": "short"})
