"""The forge client against a GitHub-shaped forge on a real loopback socket and a real bare repo."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import certifi
import pytest
from pydantic import SecretStr

from nexus_mcp.errors import (
    Code,
    ConfigError,
    ConflictError,
    InvalidInputError,
    UpstreamError,
)
from nexus_mcp.repos.forge import (
    MAX_PAGES,
    CheckRun,
    ForgeClient,
    ForgeSettings,
    MergeOutcome,
    PullRequest,
    Review,
    StatusContext,
)
from tests.support.forge_app import CANARY, FakeForge
from tests.support.loopback import serve_in_thread

TOKEN = "ghp_TOKEN-CANARY-7d41a0"
REPOSITORY = "octo/widgets"
AUTHOR = "agent-bot"
GIT = shutil.which("git") or "git"
GIT_ENV = {
    "PATH": os.environ.get("PATH", ""),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "LC_ALL": "C",
}
OTHER_SHA = "f" * 40


def git(*args: str, cwd: Path | None = None) -> str:
    command = [GIT, "-c", "user.name=t", "-c", "user.email=t@e", "-c", "commit.gpgSign=false"]
    result = subprocess.run(
        [*command, *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True
    )
    return result.stdout.strip()


@dataclass
class Served:
    forge: FakeForge
    base_url: str
    remote: Path

    def settings(self, **changes: Any) -> ForgeSettings:
        values: dict[str, Any] = {
            "base_url": self.base_url,
            "repository": REPOSITORY,
            "token": SecretStr(TOKEN),
            "timeout_seconds": 5.0,
        }
        values.update(changes)
        return ForgeSettings(**values)

    def branch_sha(self, branch: str) -> str:
        return git("--git-dir", str(self.remote), "rev-parse", f"refs/heads/{branch}")


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    """A bare repository with ``main`` and ``feature/x`` (one added file, one rename)."""
    bare, work = tmp_path / "remote.git", tmp_path / "work"
    git("init", "--bare", "-q", "-b", "main", str(bare))
    git("init", "-q", "-b", "main", str(work))
    (work / "README.md").write_text("hello\n")
    (work / "old.txt").write_text("a file that will be renamed\n" * 5)
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "initial", cwd=work)
    git("switch", "-q", "-c", "feature/x", cwd=work)
    (work / "src").mkdir()
    (work / "src" / "app.py").write_text("print('hi')\n")
    git("mv", "old.txt", "new.txt", cwd=work)
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "feature", cwd=work)
    git("push", "-q", str(bare), "main", "feature/x", cwd=work)
    return bare


@pytest.fixture
def served(remote: Path) -> Iterator[Served]:
    forge = FakeForge(remote, repository=REPOSITORY, token=TOKEN, author=AUTHOR)
    with serve_in_thread(forge.app, on_stop=forge.release) as base_url:
        yield Served(forge=forge, base_url=base_url, remote=remote)


@pytest.fixture
async def client(served: Served) -> AsyncIterator[ForgeClient]:
    forge_client = ForgeClient(served.settings())
    yield forge_client
    await forge_client.aclose()


@pytest.fixture
async def pull(client: ForgeClient) -> PullRequest:
    return await client.create_pull(head="feature/x", base="main", title="Add app", body="why")


def assert_leak_free(error: BaseException, served: Served) -> None:
    """Neither the message, the repr, the facts nor the printed traceback hold forge text."""
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__
    facts = getattr(error, "facts", {})
    text = "".join(traceback.format_exception(error)) + repr(error) + repr(facts)
    for secret in (CANARY, TOKEN, served.base_url, "127.0.0.1", "feature/x"):
        assert secret not in text


def assert_upstream(error: BaseException, message: str, outcome: str) -> None:
    assert isinstance(error, UpstreamError)
    assert (error.code, error.message, error.facts["outcome"]) == (
        Code.UPSTREAM_ERROR,
        message,
        outcome,
    )


# --- the calls --------------------------------------------------------------------------


async def test_create_pull_resolves_the_head_branch_in_the_remote(
    served: Served, client: ForgeClient
) -> None:
    created = await client.create_pull(head="feature/x", base="main", title="Add", body="b")

    expected = PullRequest(
        number=1,
        state="open",
        merged=False,
        mergeable=True,
        draft=False,
        head_ref="feature/x",
        head_sha=served.branch_sha("feature/x"),
        base_ref="main",
        html_url=f"https://forge.test/{REPOSITORY}/pull/1",
        user_login=AUTHOR,
        base_sha=served.branch_sha("main"),
    )
    assert created == expected
    assert await client.get_pull(1) == expected


async def test_every_request_carries_the_github_headers_and_the_bearer_token(
    served: Served, client: ForgeClient, pull: PullRequest
) -> None:
    await client.get_pull(pull.number)

    for request in served.forge.requests:
        assert request.headers["accept"] == "application/vnd.github+json"
        assert request.headers["x-github-api-version"] == "2022-11-28"
        assert request.headers["user-agent"] == "nexus-mcp-forge"
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert [(r.method, r.path) for r in served.forge.requests] == [
        ("POST", f"/repos/{REPOSITORY}/pulls"),
        ("GET", f"/repos/{REPOSITORY}/pulls/1"),
    ]


async def test_create_pull_for_a_branch_the_remote_lacks_is_a_conflict(
    client: ForgeClient,
) -> None:
    with pytest.raises(ConflictError) as caught:
        await client.create_pull(head="feature/none", base="main", title="t", body="b")

    assert caught.value.code == Code.CONFLICT
    assert caught.value.facts == {"reason": "pull_exists_or_invalid"}
    assert caught.value.__cause__ is None


async def test_a_second_pull_for_the_same_branches_is_a_conflict(
    client: ForgeClient, pull: PullRequest
) -> None:
    with pytest.raises(ConflictError):
        await client.create_pull(head="feature/x", base="main", title="again", body="b")


async def test_pull_files_name_both_paths_of_a_rename(
    client: ForgeClient, pull: PullRequest
) -> None:
    assert await client.list_pull_files(pull.number) == ["new.txt", "old.txt", "src/app.py"]


async def test_reviews_come_back_in_order_with_their_ids(
    served: Served, client: ForgeClient, pull: PullRequest
) -> None:
    first = served.forge.add_review(1, "alice", "COMMENTED", pull.head_sha)
    second = served.forge.add_review(1, "bob", "APPROVED", pull.head_sha)
    pending = served.forge.add_review(1, "carol", "PENDING", None)

    assert await client.list_reviews(pull.number) == [
        Review("alice", "COMMENTED", pull.head_sha, "2024-01-01T00:00:00Z", first),
        Review("bob", "APPROVED", pull.head_sha, "2024-01-01T00:00:00Z", second),
        Review("carol", "PENDING", None, None, pending),
    ]


async def test_combined_status_and_check_runs_are_read_for_the_head_sha(
    served: Served, client: ForgeClient, pull: PullRequest
) -> None:
    served.forge.set_status(pull.head_sha, "ci/lint", "success")
    served.forge.set_status(pull.head_sha, "ci/build", "pending")
    run = served.forge.add_check_run(pull.head_sha, "tests", "completed", "success")
    queued = served.forge.add_check_run(pull.head_sha, "e2e", "queued", None)

    assert await client.combined_status(pull.head_sha) == [
        StatusContext("ci/lint", "success"),
        StatusContext("ci/build", "pending"),
    ]
    assert await client.check_runs(pull.head_sha) == [
        CheckRun(run, "tests", "completed", "success"),
        CheckRun(queued, "e2e", "queued", None),
    ]
    assert await client.combined_status(OTHER_SHA) == []


async def test_lists_follow_next_links_page_by_page(
    served: Served, client: ForgeClient, pull: PullRequest
) -> None:
    served.forge.page_size = 1
    for name in ("a", "b", "c"):
        served.forge.set_status(pull.head_sha, name, "success")
        served.forge.add_check_run(pull.head_sha, name, "completed", "success")
        served.forge.add_review(1, name, "APPROVED", pull.head_sha)
    served.forge.requests.clear()

    assert len(await client.list_pull_files(pull.number)) == 3
    assert len(await client.list_reviews(pull.number)) == 3
    assert [s.context for s in await client.combined_status(pull.head_sha)] == ["a", "b", "c"]
    assert [r.name for r in await client.check_runs(pull.head_sha)] == ["a", "b", "c"]

    two_pages = ["per_page=100", "per_page=1&page=2"]  # a rename is one entry, two paths
    three_pages = [*two_pages, "per_page=1&page=3"]
    queries = [r.query for r in served.forge.requests]
    assert queries == two_pages + three_pages * 3


async def test_a_list_longer_than_the_page_cap_is_refused_not_truncated(
    served: Served, client: ForgeClient, pull: PullRequest
) -> None:
    served.forge.page_size = 1
    for index in range(MAX_PAGES + 1):
        served.forge.set_status(pull.head_sha, f"ctx-{index}", "success")
    served.forge.requests.clear()

    with pytest.raises(UpstreamError) as caught:
        await client.combined_status(pull.head_sha)

    assert_upstream(caught.value, "Upstream error", "forge_malformed")
    assert caught.value.facts["reason"] == "too_many_pages"
    assert len(served.forge.requests) == MAX_PAGES


async def test_merge_moves_the_base_branch_to_the_head_commit(
    served: Served, client: ForgeClient, pull: PullRequest
) -> None:
    outcome = await client.merge_pull(pull.number, sha=pull.head_sha, method="squash")

    assert outcome == MergeOutcome(merged=True, sha=pull.head_sha, refused=None)
    assert served.branch_sha("main") == pull.head_sha
    merged = await client.get_pull(pull.number)
    assert (merged.state, merged.merged) == ("closed", True)
    request = served.forge.requests[-2]
    assert (request.method, request.path) == ("PUT", f"/repos/{REPOSITORY}/pulls/1/merge")
    assert request.body == b'{"sha":"' + pull.head_sha.encode() + b'","merge_method":"squash"}'


async def test_merge_of_an_unmergeable_pull_is_refused_not_raised(
    served: Served, client: ForgeClient, pull: PullRequest
) -> None:
    served.forge.set_mergeable(pull.number, False)
    main_before = served.branch_sha("main")

    outcome = await client.merge_pull(pull.number, sha=pull.head_sha)

    assert outcome == MergeOutcome(merged=False, sha=None, refused="not_mergeable")
    assert served.branch_sha("main") == main_before


async def test_merge_after_a_push_is_refused_as_head_changed(
    served: Served, client: ForgeClient, pull: PullRequest
) -> None:
    served.forge.set_head(pull.number, OTHER_SHA)
    main_before = served.branch_sha("main")

    outcome = await client.merge_pull(pull.number, sha=pull.head_sha)

    assert outcome == MergeOutcome(merged=False, sha=None, refused="head_changed")
    assert served.branch_sha("main") == main_before


@pytest.mark.parametrize("number", [0, -1, True, "1", 1.0])
async def test_a_number_that_is_not_a_positive_integer_is_refused_before_any_request(
    served: Served, client: ForgeClient, number: Any
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        await client.get_pull(number)

    assert caught.value.facts == {"field": "number"}
    assert served.forge.requests == []


@pytest.mark.parametrize(
    "sha", ["A" * 40, "a" * 39, "a" * 41, "a" * 63, "../" + "a" * 37, "a" * 40 + "\n", ""]
)
async def test_a_sha_that_is_not_lowercase_hex_is_refused_before_any_request(
    served: Served, client: ForgeClient, sha: str
) -> None:
    for call in (client.combined_status, client.check_runs):
        with pytest.raises(InvalidInputError) as caught:
            await call(sha)
        assert caught.value.facts == {"field": "sha"}
    with pytest.raises(InvalidInputError):
        await client.merge_pull(1, sha=sha)
    assert served.forge.requests == []


async def test_a_sha256_object_name_is_accepted(served: Served, client: ForgeClient) -> None:
    assert await client.check_runs("a" * 64) == []
    assert served.forge.requests[0].path == f"/repos/{REPOSITORY}/commits/{'a' * 64}/check-runs"


# --- failures: mapped, and nothing of the forge leaks -----------------------------------


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_a_closed_port_is_upstream_unavailable(served: Served) -> None:
    settings = served.settings(base_url=f"http://127.0.0.1:{closed_port()}")
    forge_client = ForgeClient(settings)
    try:
        with pytest.raises(UpstreamError) as caught:
            await forge_client.get_pull(1)
    finally:
        await forge_client.aclose()

    assert_upstream(caught.value, "Upstream unavailable", "forge_unavailable")
    assert_leak_free(caught.value, served)


@pytest.mark.parametrize("slow", ["delay", "drip"])
async def test_a_slow_forge_is_upstream_timeout(
    served: Served, pull: PullRequest, slow: str
) -> None:
    if slow == "delay":
        served.forge.delay_next(30)
    else:  # each byte arrives inside the read timeout: only the total deadline ends it
        served.forge.drip_next()
    forge_client = ForgeClient(served.settings(timeout_seconds=0.3))
    try:
        with pytest.raises(UpstreamError) as caught:
            await forge_client.get_pull(pull.number)
    finally:
        await forge_client.aclose()

    assert_upstream(caught.value, "Upstream timeout", "forge_timeout")
    assert_leak_free(caught.value, served)


@pytest.mark.parametrize("status", [400, 403, 404, 422, 500, 502, 503])
async def test_an_error_status_is_upstream_status_without_the_forge_body(
    served: Served, client: ForgeClient, pull: PullRequest, status: int
) -> None:
    served.forge.fail_next(status)

    with pytest.raises(UpstreamError) as caught:
        await client.get_pull(pull.number)

    assert_upstream(caught.value, f"Upstream {status}", "forge_status")
    assert caught.value.facts["status"] == status
    assert_leak_free(caught.value, served)


async def test_a_wrong_token_is_upstream_401(served: Served) -> None:
    forge_client = ForgeClient(served.settings(token=SecretStr("wrong-token")))
    try:
        with pytest.raises(UpstreamError) as caught:
            await forge_client.list_reviews(1)
    finally:
        await forge_client.aclose()

    assert_upstream(caught.value, "Upstream 401", "forge_status")
    assert_leak_free(caught.value, served)


async def test_without_a_token_no_authorization_header_is_sent(served: Served) -> None:
    forge_client = ForgeClient(served.settings(token=None))
    try:
        with pytest.raises(UpstreamError) as caught:
            await forge_client.get_pull(1)
    finally:
        await forge_client.aclose()

    assert caught.value.message == "Upstream 401"
    assert "authorization" not in served.forge.requests[0].headers


async def test_a_failure_on_merge_or_create_is_upstream_status_too(
    served: Served, client: ForgeClient, pull: PullRequest
) -> None:
    served.forge.fail_next(500, times=2)

    with pytest.raises(UpstreamError) as merge_error:
        await client.merge_pull(pull.number, sha=pull.head_sha)
    with pytest.raises(UpstreamError) as create_error:
        await client.create_pull(head="feature/x", base="main", title="t", body="b")

    assert merge_error.value.message == create_error.value.message == "Upstream 500"
    assert served.branch_sha("main") != pull.head_sha


async def test_a_redirect_is_not_followed_and_the_token_goes_nowhere(
    served: Served, client: ForgeClient, pull: PullRequest, remote: Path
) -> None:
    elsewhere = FakeForge(remote, repository=REPOSITORY, token=TOKEN)
    with serve_in_thread(elsewhere.app, on_stop=elsewhere.release) as other_url:
        served.forge.redirect_next(f"{other_url}/repos/{REPOSITORY}/pulls/1?{CANARY}")
        with pytest.raises(UpstreamError) as caught:
            await client.get_pull(pull.number)

    assert_upstream(caught.value, "Upstream error", "forge_malformed")
    assert caught.value.facts["reason"] == "redirect"
    assert elsewhere.requests == []
    assert_leak_free(caught.value, served)


async def test_a_body_past_the_cap_is_refused_while_streaming(
    served: Served, pull: PullRequest
) -> None:
    served.forge.oversize_next(1024 * 1024)
    forge_client = ForgeClient(served.settings(max_response_bytes=64 * 1024))
    try:
        with pytest.raises(UpstreamError) as caught:
            await forge_client.get_pull(pull.number)
    finally:
        await forge_client.aclose()

    assert_upstream(caught.value, "Upstream error", "forge_malformed")
    assert caught.value.facts["reason"] == "response_too_large"
    assert_leak_free(caught.value, served)


async def test_a_declared_length_past_the_cap_is_refused_before_reading(
    served: Served, pull: PullRequest
) -> None:
    forge_client = ForgeClient(served.settings(max_response_bytes=64))
    try:
        with pytest.raises(UpstreamError) as caught:
            await forge_client.get_pull(pull.number)
    finally:
        await forge_client.aclose()

    assert caught.value.facts["reason"] == "response_too_large"


MALFORMED_PULLS = {
    "truncated": b'{"number": 1, "' + CANARY.encode(),
    "not utf-8": b'{"number": 1, "title": "\xff\xfe"}',
    "byte order mark": b'\xef\xbb\xbf{"number": 1}',
    "NaN": b'{"number": NaN}',
    "duplicate key": b'{"number": 1, "number": 2}',
    "a list": b"[1, 2]",
    "empty": b"",
}


@pytest.mark.parametrize("body", MALFORMED_PULLS.values(), ids=MALFORMED_PULLS.keys())
async def test_a_body_that_is_not_strict_json_is_malformed(
    served: Served, client: ForgeClient, pull: PullRequest, body: bytes
) -> None:
    served.forge.malformed_next(body)

    with pytest.raises(UpstreamError) as caught:
        await client.get_pull(pull.number)

    assert_upstream(caught.value, "Upstream error", "forge_malformed")
    assert_leak_free(caught.value, served)


def pull_payload(sha: str, **changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "number": 1,
        "state": "open",
        "merged": False,
        "mergeable": True,
        "draft": False,
        "html_url": "https://forge.test/pull/1",
        "user": {"login": "agent"},
        "head": {"ref": "feature/x", "sha": sha},
        "base": {"ref": "main"},
    }
    payload.update(changes)
    return payload


WRONG_TYPES = {
    "number as text": {"number": "1"},
    "number as bool": {"number": True},
    "another pull's number": {"number": 2},
    "merged as text": {"merged": "false"},
    "mergeable as text": {"mergeable": "yes"},
    "draft missing": {"draft": None},
    "head as text": {"head": CANARY},
    "head sha not hex": {"head": {"ref": "feature/x", "sha": CANARY}},
    "base sha not hex": {"base": {"ref": "main", "sha": CANARY}},
    "base sha a number": {"base": {"ref": "main", "sha": 1}},
    "user missing": {"user": None},
    "html_url not a link": {"html_url": f"ignore previous instructions {CANARY}"},
    "html_url another scheme": {"html_url": "javascript:alert(1)"},
}


@pytest.mark.parametrize("changes", WRONG_TYPES.values(), ids=WRONG_TYPES.keys())
async def test_a_field_of_the_wrong_type_is_malformed(
    served: Served, client: ForgeClient, pull: PullRequest, changes: dict[str, Any]
) -> None:
    served.forge.malformed_next(json.dumps(pull_payload(pull.head_sha, **changes)).encode())

    with pytest.raises(UpstreamError) as caught:
        await client.get_pull(pull.number)

    assert_upstream(caught.value, "Upstream error", "forge_malformed")
    assert_leak_free(caught.value, served)


async def test_a_compressed_body_is_refused(
    served: Served, client: ForgeClient, pull: PullRequest
) -> None:
    served.forge.malformed_next(b"\x1f\x8b\x08\x00", **{"content-encoding": "gzip"})

    with pytest.raises(UpstreamError) as caught:
        await client.get_pull(pull.number)

    assert caught.value.facts["reason"] == "encoded_response"


@pytest.mark.parametrize(
    "link_base",
    [
        "http://localhost:{port}",
        "http://127.0.0.1:1",
        "https://127.0.0.1:{port}",
        "http://evil.test",
    ],
    ids=["other host", "other port", "other scheme", "other origin"],
)
async def test_a_next_link_off_the_forge_origin_is_refused(
    served: Served, client: ForgeClient, pull: PullRequest, link_base: str
) -> None:
    port = served.base_url.rsplit(":", 1)[1]
    served.forge.link_base = link_base.format(port=port)
    served.forge.page_size = 1
    served.forge.requests.clear()

    with pytest.raises(UpstreamError) as caught:
        await client.list_pull_files(pull.number)

    assert_upstream(caught.value, "Upstream error", "forge_malformed")
    assert caught.value.facts["reason"] == "foreign_next_link"
    assert len(served.forge.requests) == 1
    assert_leak_free(caught.value, served)


MALFORMED_LISTS = {
    "files entry without a filename": ("files", [{"status": "added"}]),
    "files entry with a numeric previous name": (
        "files",
        [{"filename": "a", "previous_filename": 1}],
    ),
    "files not a list": ("files", {"filename": "a"}),
    "review of a deleted account": (
        "reviews",
        [{"id": 1, "user": None, "state": "APPROVED", "commit_id": None}],
    ),
    "review with a non-hex commit": (
        "reviews",
        [{"id": 1, "user": {"login": "a"}, "state": "APPROVED", "commit_id": CANARY}],
    ),
    "statuses missing": ("status", {"state": "success"}),
    "status without a state": ("status", {"statuses": [{"context": "ci"}]}),
    "check runs under another key": ("runs", {"runs": []}),
    "check run id as text": (
        "runs",
        {"check_runs": [{"id": "1", "name": "ci", "status": "completed"}]},
    ),
}


@pytest.mark.parametrize(("call", "payload"), MALFORMED_LISTS.values(), ids=MALFORMED_LISTS.keys())
async def test_a_list_entry_of_the_wrong_shape_is_malformed(
    served: Served, client: ForgeClient, pull: PullRequest, call: str, payload: Any
) -> None:
    served.forge.malformed_next(json.dumps(payload).encode())
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "files": lambda: client.list_pull_files(pull.number),
        "reviews": lambda: client.list_reviews(pull.number),
        "status": lambda: client.combined_status(pull.head_sha),
        "runs": lambda: client.check_runs(pull.head_sha),
    }

    with pytest.raises(UpstreamError) as caught:
        await calls[call]()

    assert_upstream(caught.value, "Upstream error", "forge_malformed")
    assert_leak_free(caught.value, served)


async def test_a_merge_answer_that_merged_nothing_is_a_refusal(
    served: Served, client: ForgeClient, pull: PullRequest
) -> None:
    served.forge.malformed_next(b'{"merged": false, "message": "' + CANARY.encode() + b'"}')

    outcome = await client.merge_pull(pull.number, sha=pull.head_sha)

    assert outcome == MergeOutcome(merged=False, sha=None, refused="not_mergeable")


@pytest.mark.parametrize(
    "body",
    [b'{"merged": true, "sha": "' + CANARY.encode() + b'"}', b'{"merged": "true"}', b"{}"],
    ids=["sha not hex", "merged as text", "empty object"],
)
async def test_a_malformed_merge_answer_is_malformed(
    served: Served, client: ForgeClient, pull: PullRequest, body: bytes
) -> None:
    served.forge.malformed_next(body)

    with pytest.raises(UpstreamError) as caught:
        await client.merge_pull(pull.number, sha=pull.head_sha)

    assert_upstream(caught.value, "Upstream error", "forge_malformed")
    assert_leak_free(caught.value, served)


@pytest.mark.parametrize("ca_file", [None, certifi.where()], ids=["system roots", "ca_file"])
async def test_a_failed_tls_handshake_is_upstream_unavailable(
    served: Served, ca_file: str | None
) -> None:
    https_url = served.base_url.replace("http://", "https://")
    settings = served.settings(base_url=https_url, ca_file=ca_file and Path(ca_file))
    forge_client = ForgeClient(settings)
    try:
        with pytest.raises(UpstreamError) as caught:
            await forge_client.get_pull(1)
    finally:
        await forge_client.aclose()

    assert_upstream(caught.value, "Upstream unavailable", "forge_unavailable")
    assert_leak_free(caught.value, served)
    assert served.forge.requests == []


@contextmanager
def garbage_listener() -> Iterator[str]:
    """A listener that answers one connection with bytes that are not HTTP."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def answer() -> None:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection:
            connection.recv(65536)
            connection.sendall(f"NOT-HTTP {CANARY}\r\n\r\n".encode())

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        thread.join(timeout=10)


async def test_a_reply_that_is_not_http_is_malformed(served: Served) -> None:
    with garbage_listener() as base_url:
        forge_client = ForgeClient(served.settings(base_url=base_url))
        try:
            with pytest.raises(UpstreamError) as caught:
                await forge_client.get_pull(1)
        finally:
            await forge_client.aclose()

    assert_upstream(caught.value, "Upstream error", "forge_malformed")
    assert_leak_free(caught.value, served)


# --- settings and repr --------------------------------------------------------------------


async def test_repr_of_settings_and_client_never_shows_the_token_or_the_url(
    served: Served,
) -> None:
    settings = served.settings()
    forge_client = ForgeClient(settings)
    try:
        assert TOKEN not in repr(settings)
        assert TOKEN not in str(settings)
        assert repr(forge_client) == f"ForgeClient(repository={REPOSITORY!r})"
    finally:
        await forge_client.aclose()


@pytest.mark.parametrize(
    "changes",
    [
        {"base_url": "http://forge.example.com"},
        {"base_url": "ftp://127.0.0.1"},
        {"base_url": f"https://user:{TOKEN}@forge.example.com"},
        {"base_url": "https://forge.example.com/?q=1"},
        {"base_url": "https://"},
        {"repository": "octo"},
        {"repository": "octo/widgets/extra"},
        {"repository": "../widgets"},
        {"token": SecretStr("")},
        {"token": SecretStr(f"{TOKEN}\r\nX-Evil: 1")},
        {"token": TOKEN},
        {"timeout_seconds": 0},
        {"timeout_seconds": float("inf")},
        {"timeout_seconds": "5"},
        {"max_response_bytes": 0},
    ],
)
def test_invalid_settings_stop_start_up_without_echoing_values(
    served: Served, changes: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError) as caught:
        served.settings(**changes)

    assert TOKEN not in str(caught.value)


def test_https_and_loopback_http_are_accepted(served: Served) -> None:
    for base_url in ("https://api.github.com", "https://ghe.test/api/v3", "http://[::1]:8080"):
        assert served.settings(base_url=base_url).base_url == base_url


async def test_an_unreadable_ca_file_stops_start_up(served: Served, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        ForgeClient(served.settings(ca_file=tmp_path / "missing.pem"))
