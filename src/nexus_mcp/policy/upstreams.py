"""The ``upstreams:`` section: which MCP servers nexus-mcp fronts, and on what terms.

One entry per upstream server (seed 002's MCP tool provider: per-server allowlist, an
auth strategy, bounded timeouts and retries). Validated once at start-up; every problem is
listed at once, by location, never with the value that was given. Secrets are references
only (``{env: NAME}`` or ``{file: PATH}``); an inline secret is refused in production and
warned about in dev. Resolved secrets live in ``SecretStr`` and never reach a log line.

No FastMCP here: ``providers/upstream/server.py`` turns a ``UpstreamConfig`` into a connection.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictBool,
    StrictStr,
    ValidationError,
    model_validator,
)

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.auth_settings import is_loopback_url
from nexus_mcp.policy.config_errors import (
    ENV_REFERENCE_PATTERN,
    ENV_REFERENCE_RE,
    Loc,
    env_reference,
    problem_line,
    problems_from,
    refuse,
    render_key,
)
from nexus_mcp.policy.references import expand_references
from nexus_mcp.policy.sandbox import SandboxConfig, SandboxUpstream
from nexus_mcp.policy.write_policy import WriteDecision

CONFIG_LOCATION = "upstreams"
# The toolset an upstream's tools are entered under (the server id follows it).
UPSTREAM_TOOLSET_PREFIX = "upstream:"
# MCP's tool-name rule (DESIGN.md, Registry): the exposed name must satisfy it too.
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
SERVER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
# Headers an upstream credential may not set: they belong to the transport or to MCP.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "accept",
        "connection",
        "transfer-encoding",
        "mcp-session-id",
        "mcp-protocol-version",
        "cookie",
    }
)
RECHECK_SECONDS_DEFAULT = 60.0
META_KEY_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9.-]*/)?[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

RULE_UPSTREAM_NO_POLICY = "upstream_no_policy"
RULE_UPSTREAM_TOOL_NOT_ALLOWED = "upstream_tool_not_allowed"
RULE_ALLOWED = "allowed"

INLINE_CREDENTIAL_WARNING = "an inline secret in the configuration file (dev only; use an env ref)"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretRef(_Model):
    """A secret by reference: an environment variable or a file (first line, trimmed)."""

    env: StrictStr | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    file: Path | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of 'env' or 'file'")
        return self


SecretValue = SecretRef | StrictStr  # a plain string is an inline secret: dev only
# ``${NAME}`` where only a reference is taken: load_upstreams turns it into {env: NAME}
# before validation; the type is here so the JSON Schema (and an editor) accepts it.
EnvReferenceText = Annotated[StrictStr, Field(pattern=ENV_REFERENCE_PATTERN)]


# Credentials obtained per caller (issue 27): never the caller's own token, never shared.
PER_CALLER_TYPES = frozenset({"token_exchange", "per_principal"})
SCOPE_TOKEN_RE = re.compile(r"^[\x21\x23-\x5B\x5D-\x7E]{1,256}$")  # RFC 6749 scope-token


class TokenExchange(_Model):
    """RFC 8693 at the identity provider's token endpoint: the caller's verified access
    token is the subject token, the gateway authenticates as its own client, and the
    token asked for names this upstream (``audience`` and/or ``resource``, RFC 8707)."""

    token_url: StrictStr
    client_id: StrictStr = Field(min_length=1, max_length=256)
    client_secret: SecretValue
    client_auth_method: Literal["client_secret_basic", "client_secret_post"] = "client_secret_basic"
    audience: StrictStr | None = Field(default=None, min_length=1, max_length=512)
    resource: StrictStr | None = Field(default=None, min_length=1, max_length=512)
    scope: tuple[StrictStr, ...] = ()
    ca_file: Path | None = None  # the CA bundle that verifies the token endpoint
    timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    # An exchanged token is used until this long before it expires, then exchanged again.
    renew_before_seconds: float = Field(default=30.0, ge=0, le=3600)

    @model_validator(mode="after")
    def _sound(self) -> TokenExchange:
        if not is_token_endpoint(self.token_url):
            raise ValueError(
                "exchange.token_url must be an https:// URL (http:// only to a loopback host)"
            )
        if self.audience is None and self.resource is None:
            raise ValueError("exchange needs audience or resource (the upstream it is for)")
        if self.resource is not None and not re.fullmatch(
            r"[A-Za-z][A-Za-z0-9+.-]*:[^\s#]+", self.resource
        ):
            raise ValueError("exchange.resource must be an absolute URI without a fragment")
        if any(not SCOPE_TOKEN_RE.fullmatch(s) for s in self.scope):
            raise ValueError("exchange.scope holds a value that is not an OAuth scope token")
        return self


def is_token_endpoint(url: str) -> bool:
    """https://, or http:// to a loopback address (the client secret and the caller's
    token travel in the request); no user info, query or fragment."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None or parts.fragment or parts.query:
        return False
    if not parts.hostname or any(c.isspace() for c in url):
        return False
    if parts.scheme == "https":
        return True
    return parts.scheme == "http" and is_loopback_url(url)


class Credentials(_Model):
    """The credential an HTTP upstream gets: the gateway's own (``bearer``, ``header``,
    ``mtls``), or one obtained for each caller (``token_exchange``, ``per_principal``);
    never the caller's own token."""

    type: Literal["none", "bearer", "header", "mtls", "token_exchange", "per_principal"] = "none"
    token: SecretValue | None = None  # bearer
    header: StrictStr | None = None  # header: its name
    value: SecretValue | None = None  # header: its value
    cert_file: Path | None = None  # mtls: client certificate (PEM)
    key_file: Path | None = None  # mtls: its private key (PEM)
    ca_file: Path | None = None  # any: the CA bundle that verifies the upstream
    exchange: TokenExchange | None = None  # token_exchange
    principals: dict[StrictStr, SecretValue] | None = None  # per_principal: subject -> secret
    # token_exchange, per_principal: the gateway's own bearer for its own session only
    # (listing, pinning, health), never for a caller's call. Unset: that session sends none.
    gateway_token: SecretValue | None = None

    @model_validator(mode="after")
    def _fields_for_type(self) -> Credentials:
        needed = {
            "none": (),
            "bearer": ("token",),
            "header": ("header", "value"),
            "mtls": ("cert_file", "key_file"),
            "token_exchange": ("exchange",),
            "per_principal": ("principals",),
        }[self.type]
        missing = [name for name in needed if getattr(self, name) is None]
        if missing:
            raise ValueError(f"type {self.type!r} needs {', '.join(missing)}")
        optional = ("gateway_token",) if self.type in PER_CALLER_TYPES else ()
        extra = [
            name
            for name in (*CREDENTIAL_FIELDS, "gateway_token")
            if name not in (*needed, *optional) and getattr(self, name) is not None
        ]
        if extra:
            raise ValueError(f"type {self.type!r} does not take {', '.join(extra)}")
        if self.header is not None:
            if not HEADER_NAME_RE.fullmatch(self.header):
                raise ValueError("header is not a valid HTTP header name")
            if self.header.lower() in RESERVED_HEADERS:
                raise ValueError("header names a header the transport owns")
        if self.principals is not None:
            if not self.principals:
                raise ValueError("principals needs at least one subject")
            if any(not s.strip() or len(s) > 512 for s in self.principals):
                raise ValueError("principals: a subject is empty or longer than 512 characters")
        return self

    @property
    def per_caller(self) -> bool:
        return self.type in PER_CALLER_TYPES

    def references(self) -> list[SecretValue]:
        """Every secret this section names (for resolution checks and redaction)."""
        found = [self.token, self.value, self.gateway_token]
        if self.exchange is not None:
            found.append(self.exchange.client_secret)
        found += list((self.principals or {}).values())
        return [f for f in found if f is not None]


CREDENTIAL_FIELDS = ("token", "header", "value", "cert_file", "key_file", "exchange", "principals")


class Timeouts(_Model):
    connect_seconds: float = Field(default=10.0, gt=0, le=300)
    call_seconds: float = Field(default=25.0, gt=0, le=3600)


class RetryPolicy(_Model):
    """Read-class calls only, transport failures only (the gateway never retries a write)."""

    attempts: int = Field(default=2, ge=1, le=10)  # total tries, the first included
    backoff_seconds: float = Field(default=0.2, ge=0, le=30)
    max_total_seconds: float = Field(default=10.0, gt=0, le=600)


class Reconnect(_Model):
    """Bounded exponential backoff with full jitter while an upstream is down."""

    initial_seconds: float = Field(default=0.5, gt=0, le=60)
    max_seconds: float = Field(default=30.0, gt=0, le=3600)


class Forwarding(_Model):
    """Upstream-to-client requests nexus may relay; all off (an upstream's sampling
    request is a prompt-injection channel into the caller's model). Progress is the
    exception: numbers only, to the caller that asked for it."""

    sampling: StrictBool = False
    elicitation: StrictBool = False
    roots: StrictBool = False
    progress: Literal["off", "numbers", "messages"] = Field(
        default="numbers",
        description="an upstream's progress on a call, relayed to the caller that asked for "
        "it: numbers (progress and total), messages (and the upstream's message, escaped "
        "and cut short), or off",
    )


class IdentityMeta(_Model):
    """``_meta`` keys under which the caller's identity is passed upstream (never as a
    credential). Unset fields are not sent."""

    subject: StrictStr | None = Field(default=None, pattern=META_KEY_RE.pattern)
    role: StrictStr | None = Field(default=None, pattern=META_KEY_RE.pattern)


class UpstreamWritePolicy(_Model):
    """Which write-class tools of this upstream may run, and whether they need approval."""

    allowed_tools: tuple[StrictStr, ...] = ()
    require_approval: StrictBool = True
    approval_mode: Literal["token", "elicit"] = "token"


class UpstreamConfig(_Model):
    server_id: Annotated[StrictStr, Field(pattern=SERVER_ID_RE.pattern)]
    transport: Literal["stdio", "http"]
    # stdio
    command: StrictStr | None = None
    args: tuple[StrictStr, ...] = ()
    env: dict[StrictStr, StrictStr] = Field(default_factory=dict)  # not for secrets
    secret_env: dict[StrictStr, SecretRef | EnvReferenceText] = Field(default_factory=dict)
    cwd: Path | None = None
    sandbox: SandboxConfig | None = None  # bubblewrap (policy/sandbox.py); None: unsandboxed
    # http
    url: StrictStr | None = None
    credentials: Credentials = Credentials()
    timeouts: Timeouts = Timeouts()
    retry: RetryPolicy = RetryPolicy()
    reconnect: Reconnect = Reconnect()
    tools: tuple[StrictStr, ...] | None = None  # allowlist; None: every classified tool
    # Allowlists of its prompts (by name) and resources (by uri or uriTemplate), each
    # still pinned (``policy/catalog.py``); None: every pinned one; (): none at all.
    prompts: tuple[StrictStr, ...] | None = None
    resources: tuple[StrictStr, ...] | None = None
    prefix: StrictStr | None = None  # default "<server_id>_"
    forward: Forwarding = Forwarding()
    identity_meta: IdentityMeta = IdentityMeta()
    shared: StrictBool = False  # one session for every principal: stateless servers only
    when_down: Literal["refuse", "hide"] = "refuse"
    idle_timeout_seconds: float = Field(default=300.0, gt=0, le=86_400)
    # How often an open upstream's definitions are listed again without a new session or
    # a list_changed (a silent change is found within it; issue 22, item 15).
    recheck_seconds: float = Field(default=RECHECK_SECONDS_DEFAULT, gt=0, le=86_400)
    max_sessions: int = Field(default=32, ge=1, le=10_000)
    write_policy: UpstreamWritePolicy | None = None

    @model_validator(mode="after")
    def _transport_fields(self) -> UpstreamConfig:
        if self.server_id.casefold() == "notes":
            # The resource source of the notes (``policy/resources.py``): an upstream of
            # that id could never be granted apart from them.
            raise ValueError("server_id 'notes' is reserved for the note resources")
        if self.transport == "stdio":
            if not self.command:
                raise ValueError("transport 'stdio' needs command")
            if self.url is not None:
                raise ValueError("transport 'stdio' does not take url")
            if self.credentials.type != "none":
                raise ValueError("transport 'stdio' takes no credentials (use secret_env)")
        else:
            if not self.url or not re.match(r"^https?://[^\s/]+", self.url):
                raise ValueError("transport 'http' needs an http:// or https:// url")
            if self.command is not None or self.args or self.env or self.secret_env:
                raise ValueError("transport 'http' does not take command, args or env")
            if self.cwd is not None or self.sandbox is not None:
                raise ValueError("transport 'http' does not take cwd or sandbox")
            if self.shared and self.credentials.per_caller:
                raise ValueError("a shared session cannot carry each caller's own credential")
        for name in (*self.env, *self.secret_env):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError("env names must be [A-Za-z_][A-Za-z0-9_]*")
        if self.prefix is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{0,64}", self.prefix):
            raise ValueError("prefix may hold only [A-Za-z0-9_.-], at most 64 characters")
        for tool in (*(self.tools or ()), *self._policy_tools()):
            if not TOOL_NAME_RE.fullmatch(tool):
                raise ValueError("a tool name does not follow MCP's tool-name rule")
        return self

    def _policy_tools(self) -> tuple[str, ...]:
        return self.write_policy.allowed_tools if self.write_policy is not None else ()

    @property
    def name_prefix(self) -> str:
        return self.prefix if self.prefix is not None else f"{self.server_id}_"

    def exposed_name(self, tool_name: str) -> str | None:
        """The name callers see, or None when it would break MCP's tool-name rule."""
        name = self.name_prefix + tool_name
        # fullmatch: ``$`` would let a name end in a newline through.
        return name if TOOL_NAME_RE.fullmatch(name) else None

    def allows_item(self, kind: str, key: str) -> bool:
        """The prompts/resources allowlists (``prompts``, ``resources``; templates are
        allowed by their ``uriTemplate`` in ``resources``)."""
        allowed = self.prompts if kind == "prompts" else self.resources
        return allowed is None or key in allowed

    def allows(self, tool_name: str) -> bool:
        """The per-server allowlist (seed 002): a tool not listed is never exposed."""
        return self.tools is None or tool_name in self.tools

    def endpoint(self) -> tuple[str, ...]:
        """What the upstream is, for target identities (never a secret)."""
        if self.transport == "http":
            return ("http", str(self.url))
        return ("stdio", str(self.command), *self.args, str(self.cwd or ""))

    def sandboxed(self) -> SandboxUpstream | None:
        """What the sandbox plan needs of a stdio upstream (None for an HTTP one)."""
        if self.transport != "stdio":
            return None
        return SandboxUpstream(self.server_id, str(self.command), self.cwd, self.sandbox)


class _UpstreamsDocument(_Model):
    upstreams: tuple[UpstreamConfig, ...]


@dataclass(frozen=True)
class UpstreamsConfig:
    """Every configured upstream, in configuration order; empty when none is."""

    servers: tuple[UpstreamConfig, ...] = ()
    warnings: tuple[str, ...] = ()

    def get(self, server_id: str) -> UpstreamConfig | None:
        return next((s for s in self.servers if s.server_id == server_id), None)


def load_upstreams(
    raw: Any, *, mode: str, native_server_id: str, source: Path | None = None
) -> UpstreamsConfig:
    """Validate the section; every problem is listed with its location, none with a value.

    ``source``: the file the section was read from, named (with the line) in each problem.
    ``${NAME}`` in a secret (and as a whole ``env`` value, which then moves to
    ``secret_env``) names an environment variable (``policy/references.py``)."""
    if raw is None:
        return UpstreamsConfig()
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        raise refuse([((CONFIG_LOCATION,), f"`{CONFIG_LOCATION}` should be a list")], source)
    items = [_env_references_as_secrets(item) for item in raw]
    label = _labeller(items)
    items, unresolved = expand_references(
        items, tuple[UpstreamConfig, ...], os.environ, (CONFIG_LOCATION,), label
    )
    try:
        document = _UpstreamsDocument.model_validate({"upstreams": items})
    except ValidationError as exc:
        known = {loc for loc, _ in unresolved}
        found = [
            p for p in problems_from(exc, _UpstreamsDocument, label=label) if p[0] not in known
        ]
        raise refuse([*unresolved, *found], source) from None
    problems: list[tuple[Loc, str]] = list(unresolved)
    warnings: list[str] = []
    seen_ids: dict[str, int] = {}
    seen_prefixes: dict[str, int] = {}
    for position, server in enumerate(document.upstreams):
        here: Loc = (CONFIG_LOCATION, position)
        where = render_key(here, label)

        def problem(field: str, words: str, here: Loc = here) -> tuple[Loc, str]:
            loc = (*here, *field.split("."))
            return (loc, problem_line("", render_key(loc, label), words))

        if server.server_id == native_server_id:
            problems.append(problem("server_id", ": the native server's id"))
        if server.server_id in seen_ids:
            other = render_key((CONFIG_LOCATION, seen_ids[server.server_id]))
            problems.append(problem("server_id", f": also used by `{other}`"))
        seen_ids.setdefault(server.server_id, position)
        prefix = name_key(server.name_prefix)
        for other_prefix, other_position in seen_prefixes.items():
            if prefix.startswith(other_prefix) or other_prefix.startswith(prefix):
                other = render_key((CONFIG_LOCATION, other_position), label)
                problems.append(
                    problem(
                        "prefix",
                        f": overlaps the prefix of `{other}` (exposed names could collide;"
                        " compared without case)",
                    )
                )
        seen_prefixes.setdefault(prefix, position)
        for location in _inline_secrets(server):
            if mode != "dev":
                problems.append(
                    problem(location, ": inline secrets are refused in prod (use ${NAME})")
                )
            else:
                warnings.append(f"{where}.{location}: {INLINE_CREDENTIAL_WARNING}")
    if problems:
        raise refuse(problems, source)
    return UpstreamsConfig(document.upstreams, tuple(warnings))


def _env_references_as_secrets(item: Any) -> Any:
    """An ``env`` entry written ``NAME: ${OTHER}`` is a secret by reference: it moves to
    ``secret_env`` (as ``{env: OTHER}``), so it is resolved and kept like one."""
    if not isinstance(item, Mapping) or not isinstance(item.get("env"), Mapping):
        return item
    secret_env = item.get("secret_env")
    if secret_env is None:
        secret_env = {}
    elif not isinstance(secret_env, Mapping):
        return item  # left as written: validation names the bad ``secret_env``
    plain, moved = {}, {}
    for name, value in item["env"].items():
        try:
            variable = env_reference(value)
        except ValueError:
            variable = None
        if variable is not None and name not in secret_env:
            moved[name] = {"env": variable}
        else:
            plain[name] = value
    if not moved:
        return item
    return {**item, "env": plain, "secret_env": {**secret_env, **moved}}


def _labeller(items: Sequence[Any]) -> Any:
    """``upstreams[0]`` is named ``upstreams.fs`` in problems when its ``server_id`` is a
    valid id no other entry has."""
    ids = [i.get("server_id") if isinstance(i, Mapping) else None for i in items]

    def label(loc: Loc) -> str | None:
        if len(loc) != 2 or loc[0] != CONFIG_LOCATION or not isinstance(loc[1], int):
            return None
        found = ids[loc[1]] if 0 <= loc[1] < len(ids) else None
        if isinstance(found, str) and SERVER_ID_RE.fullmatch(found) and ids.count(found) == 1:
            return found
        return None

    return label


def name_key(name: str) -> str:
    """The form under which two tool names are the same name: Unicode-compatibility
    normalized (NFKC) and case-folded. Exposed names are ASCII by MCP's rule, but a name
    one client, log or person could take for another's must never belong to two tools."""
    return unicodedata.normalize("NFKC", name).casefold()


def shadowed_names(prefix: str, names: Iterable[str]) -> list[str]:
    """The names (native tools) that ``prefix`` + some upstream tool name could equal,
    under ``name_key``: every name the prefix begins."""
    key = name_key(prefix)
    return sorted(name for name in names if name_key(name).startswith(key))


def _inline_secrets(server: UpstreamConfig) -> list[str]:
    creds = server.credentials
    found = [
        f"credentials.{name}"
        for name in ("token", "value", "gateway_token")
        if isinstance(getattr(creds, name), str)
    ]
    if creds.exchange is not None and isinstance(creds.exchange.client_secret, str):
        found.append("credentials.exchange.client_secret")
    if any(isinstance(v, str) for v in (creds.principals or {}).values()):
        found.append("credentials.principals")  # never which subject: the key is theirs
    return found


def resolve_secret(value: SecretValue, environ: Mapping[str, str]) -> SecretStr:
    """The secret behind a reference; a missing one stops start-up, naming the reference."""
    if isinstance(value, str):
        named = ENV_REFERENCE_RE.fullmatch(value.strip())
        if named is None:
            return SecretStr(value)
        # ``${NAME}`` that did not pass through a loader: still a reference, never the
        # secret itself.
        value = SecretRef(env=named.group(1))
    if value.env is not None:
        found = environ.get(value.env)
        if not found:
            raise ConfigError(f"secret reference env:{value.env} is not set")
        return SecretStr(found)
    assert value.file is not None
    try:
        text = value.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"secret reference file:{value.file} cannot be read ({type(exc).__name__})"
        ) from None
    secret = text.strip()
    if not secret:
        raise ConfigError(f"secret reference file:{value.file} is empty")
    return SecretStr(secret)


@dataclass(frozen=True)
class ResolvedSecrets:
    """An upstream's secrets, resolved once at start-up; ``repr`` shows none of them.

    ``headers``: what the gateway's own session sends (and, for the gateway's own
    credential types, every session). ``principals``: per_principal's bearer per subject;
    ``client_secret``: token_exchange's client secret at the identity provider."""

    headers: Mapping[str, SecretStr] = field(default_factory=dict)
    env: Mapping[str, SecretStr] = field(default_factory=dict)
    principals: Mapping[str, SecretStr] = field(default_factory=dict)
    client_secret: SecretStr | None = None

    def values(self) -> list[str]:
        """Every secret value, for redaction checks (tests, fixtures verify)."""
        found = [*self.headers.values(), *self.env.values(), *self.principals.values()]
        if self.client_secret is not None:
            found.append(self.client_secret)
        return [s.get_secret_value() for s in found]


def resolve_secrets(server: UpstreamConfig, environ: Mapping[str, str]) -> ResolvedSecrets:
    headers: dict[str, SecretStr] = {}
    creds = server.credentials
    if creds.type == "bearer" and creds.token is not None:
        token = resolve_secret(creds.token, environ).get_secret_value()
        headers["Authorization"] = SecretStr(f"Bearer {token}")
    elif creds.type == "header" and creds.header is not None and creds.value is not None:
        headers[creds.header] = resolve_secret(creds.value, environ)
    elif creds.gateway_token is not None:
        token = resolve_secret(creds.gateway_token, environ).get_secret_value()
        headers["Authorization"] = SecretStr(f"Bearer {token}")
    if creds.type == "mtls":
        for name in ("cert_file", "key_file"):
            path = getattr(creds, name)
            if not path.is_file():
                raise ConfigError(f"upstream {server.server_id}: credentials.{name} is not a file")
    for name, path in (
        ("ca_file", creds.ca_file),
        ("exchange.ca_file", creds.exchange.ca_file if creds.exchange is not None else None),
    ):
        if path is not None and not path.is_file():
            raise ConfigError(f"upstream {server.server_id}: credentials.{name} is not a file")
    env = {name: resolve_secret(ref, environ) for name, ref in server.secret_env.items()}
    principals = {
        subject: resolve_secret(ref, environ) for subject, ref in (creds.principals or {}).items()
    }
    client_secret = (
        resolve_secret(creds.exchange.client_secret, environ)
        if creds.exchange is not None
        else None
    )
    return ResolvedSecrets(headers, env, principals, client_secret)


def decide_upstream_write(server: UpstreamConfig, tool_name: str, *, mode: str) -> WriteDecision:
    """Deny by default: a write-class upstream tool runs only when the upstream's policy
    names it. Dev without a policy section allows it without approval (as the workspace's
    dev fallback does), and start-up says so."""
    policy = server.write_policy
    if policy is None:
        if mode == "dev":
            return WriteDecision(True, RULE_ALLOWED, False, "token")
        return WriteDecision(False, RULE_UPSTREAM_NO_POLICY)
    if tool_name not in policy.allowed_tools:
        return WriteDecision(False, RULE_UPSTREAM_TOOL_NOT_ALLOWED)
    return WriteDecision(True, RULE_ALLOWED, policy.require_approval, policy.approval_mode)


class UpstreamWrites:
    """Which write-class upstream tools may run: each configured upstream's own policy
    (``decide_upstream_write``); an upstream that is not configured has none."""

    def __init__(self, config: UpstreamsConfig, *, mode: str) -> None:
        self._servers = {server.server_id: server for server in config.servers}
        self._mode = mode

    def decide(self, server_id: str, tool_name: str) -> WriteDecision:
        server = self._servers.get(server_id)
        if server is None:
            return WriteDecision(False, "upstream_no_policy")
        return decide_upstream_write(server, tool_name, mode=self._mode)


__all__ = [
    "CONFIG_LOCATION",
    "PER_CALLER_TYPES",
    "RECHECK_SECONDS_DEFAULT",
    "RULE_UPSTREAM_NO_POLICY",
    "RULE_UPSTREAM_TOOL_NOT_ALLOWED",
    "TOOL_NAME_RE",
    "UPSTREAM_TOOLSET_PREFIX",
    "Credentials",
    "Forwarding",
    "IdentityMeta",
    "Reconnect",
    "ResolvedSecrets",
    "RetryPolicy",
    "SecretRef",
    "Timeouts",
    "TokenExchange",
    "UpstreamConfig",
    "UpstreamWritePolicy",
    "UpstreamWrites",
    "UpstreamsConfig",
    "decide_upstream_write",
    "is_token_endpoint",
    "load_upstreams",
    "name_key",
    "resolve_secret",
    "resolve_secrets",
    "shadowed_names",
]
