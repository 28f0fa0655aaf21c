"""A GitHub-shaped forge for tests: the endpoints ``ForgeClient`` calls, over real HTTP.

``FakeForge(remote)`` serves one repository from memory, backed by a real bare git
repository on disk: a new pull request resolves its branches there, and a merge moves
the base branch there. Serve ``.app`` with ``serve_in_thread(forge.app,
on_stop=forge.release)``. Every request is recorded in ``.requests``; every request must
carry ``Authorization: Bearer <token>`` (401 otherwise).

The merge is fast-forward style: ``git update-ref refs/heads/<base> <head sha>``, no merge
commit, so the merged sha is the head sha. Files are listed once, when the pull request
is opened (``git diff --name-status -z -M base...head``, so renames name both paths);
``set_head`` moves the head sha only, as a push that changes no paths would.

Knobs: ``page_size`` (lists paginate at most this many items a page), ``link_base``
(the origin ``Link: rel="next"`` URLs point at), and the one-shot behaviours below,
consumed in order by the next requests: ``fail_next``, ``redirect_next``,
``oversize_next``, ``malformed_next``, ``delay_next``, ``drip_next``. Forge text that must
never reach a caller carries ``CANARY``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.loopback import drip_fed_response

CANARY = "FORGE-CANARY-5c1e9b"
SUBMITTED_AT = "2024-01-01T00:00:00Z"
GIT = shutil.which("git") or "git"

Handler = Callable[[Request], Awaitable[Response]]
Behaviour = Callable[[Request], Awaitable[Response | None]]  # None: answer normally


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakePull:
    number: int
    title: str
    draft: bool
    head_ref: str
    base_ref: str
    head_sha: str
    files: list[dict[str, str]]
    state: str = "open"
    merged: bool = False
    mergeable: bool | None = True


@dataclass
class FakeForge:
    remote: Path
    repository: str = "octo/widgets"
    token: str = "forge-token"
    author: str = "agent-bot"
    page_size: int = 100
    link_base: str | None = None
    requests: list[RecordedRequest] = field(default_factory=list)
    pulls: dict[int, FakePull] = field(default_factory=dict)
    statuses: dict[str, dict[str, str]] = field(default_factory=dict)
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    reviews: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    _next_id: int = 100
    _behaviours: deque[Behaviour] = field(default_factory=deque)
    _released: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        prefix = "/repos/{owner}/{name}"
        self.app = Starlette(
            routes=[
                Route(f"{prefix}/pulls", self._guard(self._create_pull), methods=["POST"]),
                Route(f"{prefix}/pulls/{{number:int}}", self._guard(self._get_pull)),
                Route(f"{prefix}/pulls/{{number:int}}/files", self._guard(self._files)),
                Route(f"{prefix}/pulls/{{number:int}}/reviews", self._guard(self._reviews)),
                Route(
                    f"{prefix}/pulls/{{number:int}}/merge",
                    self._guard(self._merge),
                    methods=["PUT"],
                ),
                Route(f"{prefix}/commits/{{sha}}/status", self._guard(self._status)),
                Route(f"{prefix}/commits/{{sha}}/check-runs", self._guard(self._check_runs)),
            ]
        )

    # --- knobs ----------------------------------------------------------------------

    def set_status(self, sha: str, context: str, state: str) -> None:
        self.statuses.setdefault(sha, {})[context] = state

    def add_check_run(self, sha: str, name: str, status: str, conclusion: str | None) -> int:
        run_id = self._new_id()
        run = {"id": run_id, "name": name, "status": status, "conclusion": conclusion}
        self.runs.setdefault(sha, []).append(run)
        return run_id

    def add_review(self, number: int, login: str, state: str, commit_id: str | None) -> int:
        review_id = self._new_id()
        self.reviews.setdefault(number, []).append(
            {
                "id": review_id,
                "user": {"login": login},
                "state": state,
                "commit_id": commit_id,
                "submitted_at": None if state == "PENDING" else SUBMITTED_AT,
                "body": f"review text {CANARY}",
            }
        )
        return review_id

    def set_mergeable(self, number: int, value: bool | None) -> None:
        self.pulls[number].mergeable = value

    def set_head(self, number: int, sha: str) -> None:
        self.pulls[number].head_sha = sha

    def fail_next(self, status: int, times: int = 1) -> None:
        body = {"message": f"forge says {CANARY}", "documentation_url": f"https://{CANARY}"}
        for _ in range(times):
            self._then(lambda _r: JSONResponse(body, status_code=status))

    def redirect_next(self, location: str) -> None:
        self._then(lambda _r: Response(status_code=302, headers={"location": location}))

    def oversize_next(self, n_bytes: int) -> None:
        """A 200 whose body is ``n_bytes`` long, streamed with no ``Content-Length``."""

        async def chunks() -> AsyncIterator[bytes]:
            sent = 0
            while sent < n_bytes:
                chunk = b" " * min(64 * 1024, n_bytes - sent)
                sent += len(chunk)
                yield chunk

        self._then(lambda _r: StreamingResponse(chunks(), media_type="application/json"))

    def malformed_next(
        self, body: bytes = b'{"message": "' + CANARY.encode() + b'"', **headers: str
    ) -> None:
        self._then(lambda _r: Response(body, media_type="application/json", headers=headers))

    def delay_next(self, seconds: float) -> None:
        """Hold the next answer ``seconds`` (or until ``release``), then answer normally."""

        async def delay(_request: Request) -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not self._released.is_set():
                await asyncio.sleep(0.01)

        self._behaviours.append(delay)

    def drip_next(self) -> None:
        """A 200 that starts at once and then drips one byte at a time, never finishing."""
        self._then(lambda _r: drip_fed_response(b'{"number": '))

    def release(self) -> None:
        """End every delay now (``serve_in_thread``'s ``on_stop``)."""
        self._released.set()

    # --- plumbing -------------------------------------------------------------------

    def _then(self, respond: Callable[[Request], Response]) -> None:
        async def behaviour(request: Request) -> Response:
            return respond(request)

        self._behaviours.append(behaviour)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _git(self, *args: str) -> str:
        command = [GIT, "--git-dir", str(self.remote), *args]
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout

    def _ref_sha(self, branch: str) -> str | None:
        try:
            return self._git("rev-parse", "--verify", f"refs/heads/{branch}^{{commit}}").strip()
        except subprocess.CalledProcessError:
            return None

    def _guard(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            body = await request.body()
            self.requests.append(
                RecordedRequest(
                    method=request.method,
                    path=request.url.path,
                    query=request.url.query,
                    headers={k.lower(): v for k, v in request.headers.items()},
                    body=body,
                )
            )
            if request.headers.get("authorization") != f"Bearer {self.token}":
                return _message(401, "Bad credentials")
            if self._behaviours:
                answer = await self._behaviours.popleft()(request)
                if answer is not None:
                    return answer
            params = request.path_params
            if f"{params['owner']}/{params['name']}" != self.repository:
                return _message(404, "Not Found")
            if "number" in params and params["number"] not in self.pulls:
                return _message(404, "Not Found")
            return await handler(request)

        return guarded

    def _paged(self, request: Request, items: list[Any], key: str | None = None) -> Response:
        per_page = min(int(request.query_params.get("per_page", "30")), 100, self.page_size)
        page = int(request.query_params.get("page", "1"))
        chunk = items[(page - 1) * per_page : page * per_page]
        headers = {}
        if page * per_page < len(items):
            base = self.link_base or str(request.base_url).rstrip("/")
            url = f"{base}{request.url.path}?per_page={per_page}&page={page + 1}"
            headers["link"] = f'<{url}>; rel="next", <{url}>; rel="last"'
        payload: Any = chunk if key is None else {"total_count": len(items), key: chunk}
        return JSONResponse(payload, headers=headers)

    def _pull_json(self, pull: FakePull) -> dict[str, Any]:
        owner, name = self.repository.split("/")
        return {
            "number": pull.number,
            "state": pull.state,
            "merged": pull.merged,
            "mergeable": pull.mergeable,
            "draft": pull.draft,
            "title": pull.title,
            "html_url": f"https://forge.test/{owner}/{name}/pull/{pull.number}",
            "user": {"login": self.author},
            "head": {"ref": pull.head_ref, "sha": pull.head_sha},
            "base": {"ref": pull.base_ref, "sha": self._ref_sha(pull.base_ref)},
        }

    # --- endpoints ------------------------------------------------------------------

    async def _create_pull(self, request: Request) -> Response:
        data = json.loads(await request.body())
        head, base = data.get("head"), data.get("base")
        head_sha, base_sha = self._ref_sha(str(head)), self._ref_sha(str(base))
        taken = any(
            p.head_ref == head and p.base_ref == base and p.state == "open"
            for p in self.pulls.values()
        )
        if head_sha is None or base_sha is None or taken:
            return _message(422, "Validation Failed")
        raw = self._git("diff", "--name-status", "-z", "-M", f"{base_sha}...{head_sha}")
        number = len(self.pulls) + 1
        self.pulls[number] = FakePull(
            number=number,
            title=data["title"],
            draft=bool(data.get("draft", False)),
            head_ref=head,
            base_ref=base,
            head_sha=head_sha,
            files=_parse_name_status(raw),
        )
        return JSONResponse(self._pull_json(self.pulls[number]), status_code=201)

    async def _get_pull(self, request: Request) -> Response:
        return JSONResponse(self._pull_json(self.pulls[request.path_params["number"]]))

    async def _files(self, request: Request) -> Response:
        return self._paged(request, self.pulls[request.path_params["number"]].files)

    async def _reviews(self, request: Request) -> Response:
        return self._paged(request, self.reviews.get(request.path_params["number"], []))

    async def _status(self, request: Request) -> Response:
        contexts = self.statuses.get(request.path_params["sha"], {})
        items = [{"context": c, "state": s, "description": CANARY} for c, s in contexts.items()]
        return self._paged(request, items, key="statuses")

    async def _check_runs(self, request: Request) -> Response:
        runs = self.runs.get(request.path_params["sha"], [])
        return self._paged(request, runs, key="check_runs")

    async def _merge(self, request: Request) -> Response:
        pull = self.pulls[request.path_params["number"]]
        data = json.loads(await request.body())
        if pull.state != "open" or pull.merged or pull.mergeable is False:
            return _message(405, "Pull Request is not mergeable")
        if data.get("sha") != pull.head_sha:
            return _message(409, "Head branch was modified")
        self._git("update-ref", f"refs/heads/{pull.base_ref}", pull.head_sha)
        pull.merged, pull.state = True, "closed"
        return JSONResponse({"merged": True, "sha": pull.head_sha, "message": CANARY})


def _message(status: int, text: str) -> Response:
    return JSONResponse({"message": f"{text} {CANARY}"}, status_code=status)


def _parse_name_status(raw: str) -> list[dict[str, str]]:
    """``git diff --name-status -z`` as GitHub's file entries (renames name both paths)."""
    fields = raw.split("\0")
    files: list[dict[str, str]] = []
    index = 0
    while index < len(fields) and fields[index]:
        status = fields[index]
        if status[0] in "RC":
            old, new = fields[index + 1], fields[index + 2]
            files.append({"filename": new, "previous_filename": old, "status": "renamed"})
            index += 3
        else:
            files.append({"filename": fields[index + 1], "status": status})
            index += 2
    return files
