"""Settings: ``NEXUS_MCP_*`` environment variables over an optional YAML file over defaults.

Precedence, highest first: command-line flags, environment, YAML (``--config``), defaults.
A bad value stops start-up with a ``ConfigError`` that names the setting, never a traceback.
Nested sections use ``__`` in environment names (``NEXUS_MCP_AUTH__AUDIENCE``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import platformdirs
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.auth_settings import (
    DEFAULT_TOKEN_LEEWAY_SECONDS,
    MAX_TOKEN_LEEWAY_SECONDS,
    AuthSettings,
)
from nexus_mcp.policy.config_errors import (
    describe_type,
    file_origin,
    format_problems,
    problems_from,
    unknown_key_words,
)
from nexus_mcp.policy.console import ConsoleSettings
from nexus_mcp.policy.output_scanning import OutputScanSettings
from nexus_mcp.policy.references import expand_references
from nexus_mcp.policy.serve_flags import SERVE_FLAGS, SERVE_OPTIONS  # re-exported
from nexus_mcp.policy.upstreams import SERVER_ID_RE, SecretRef, SecretValue

MIB = 1024 * 1024
ENV_PREFIX = "NEXUS_MCP_"
# Below the default tool timeout (30 s) so a slow canister ends as the spec's
# "Runtime failure", not as TOOL_TIMEOUT; the margin is vaults.CANISTER_DEADLINE_MARGIN_SECONDS.
DEFAULT_CANISTER_TOTAL_TIMEOUT_SECONDS = 25.0
MAX_CANISTER_TOTAL_TIMEOUT_SECONDS = 3600.0  # the longest tool timeout there can be

Mode = Literal["dev", "prod"]
Transport = Literal["stdio", "http"]
APP_NAME = "nexus-mcp"


def default_data_dir() -> Path:
    """The per-user data directory: ``$XDG_DATA_HOME/nexus-mcp``, else
    ``~/.local/share/nexus-mcp`` on Linux; platformdirs' user data dir elsewhere.

    Never the current folder: a desktop client starts the server from ``/`` or the home
    folder, and state written there is lost, unwritable or exposed. Without a home folder
    there is no safe default, so start-up stops and asks for the setting instead.
    """
    try:
        # platformdirs ignores a relative XDG_DATA_HOME (the XDG spec says so) and
        # raises when no absolute home folder can be found.
        found = platformdirs.user_data_dir(APP_NAME, appauthor=False)
    except RuntimeError:
        found = ""
    path = Path(found)
    if not found or not path.is_absolute():
        raise ConfigError(
            "no per-user data directory (no home folder): set 'data_dir' "
            f"({ENV_PREFIX}DATA_DIR / --data-dir)"
        )
    return path


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DevPrincipalSettings(_Section):
    """Who a dev-mode server treats a caller as when no identity is supplied.

    Launch settings given without a subject can only narrow it (policy/launch.py).
    """

    subject: str = "dev"
    role: str = "admin"
    profile: str = "full"
    vault_id: str | None = None
    user_id: str | None = None
    canister_user_id: str | None = None
    scopes: str = ""
    read_only: bool = False


class SearchSettings(_Section):
    """Workload caps for ``nexus_grep`` and ``nexus_glob`` (seed 003, section 4)."""

    max_files_scanned: int = Field(default=10_000, ge=1)
    max_matches_per_file: int = Field(default=10, ge=1)
    max_results: int = Field(default=100, ge=1)
    max_file_bytes: int = Field(default=2 * MIB, ge=1)
    binary_sniff_bytes: int = Field(default=8192, ge=64)
    max_seconds: float = Field(default=5.0, gt=0)
    max_pattern_length: int = Field(default=512, ge=1)
    allowed_extensions: tuple[str, ...] = (
        ".js", ".ts", ".tsx", ".jsx", ".py", ".css", ".html", ".json", ".md", ".markdown",
        ".yaml", ".yml", ".toml", ".txt", ".rst", ".cfg", ".ini", ".sh", ".go", ".rs",
    )  # fmt: skip


class RegistryPin(_Section):
    """A pinned registry: start-up refuses when the loaded file differs (registry parity)."""

    version: str | None = None
    digest: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")


class RegistrySettings(_Section):
    directory: Path | None = Field(
        default=None, description="registry files (*.json); default: shipped"
    )
    # Registries and pin files (``<server_id>.lock.json``) of upstream servers, when kept
    # apart from the native registry; default: ``directory``.
    upstream_directory: Path | None = Field(
        default=None, description="upstream registries and pins; default: directory"
    )
    # The same rule as an upstream's id: every call's tool_call record carries it (seed 000),
    # so an id the record schema refuses must stop start-up, not refuse every call.
    server_id: str = Field(default="nexus", pattern=SERVER_ID_RE.pattern)
    pins: dict[str, RegistryPin] = Field(default_factory=dict)
    idempotency_ttl_seconds: float = Field(default=86_400.0, gt=0)
    idempotency_wait_seconds: float = Field(default=30.0, gt=0)


class BudgetSettings(_Section):
    """Per-session call budget, per-subject sliding-window rate, per-tool timeouts."""

    max_calls_per_session: int = Field(default=10_000, ge=1)
    rate_limit_calls: int = Field(default=600, ge=1)
    rate_limit_window_seconds: float = Field(default=60.0, gt=0)
    tool_timeout_seconds: float = Field(default=30.0, gt=0)
    tool_timeouts: dict[str, float] = Field(default_factory=dict)


class ProfileSettings(_Section):
    """Tool profiles (YAML) and the grants database."""

    file: Path | None = Field(default=None, description="tool_profiles.yaml; default: shipped")
    grants_db: Path | None = Field(default=None, description="default: <data_dir>/grants.sqlite3")
    zone: str = "default"
    cache_ttl_seconds: float = Field(default=300.0, gt=0)


class NotesSettings(_Section):
    """Where the notes tools read: local vault folders (default) or a hosted canister."""

    backend: Literal["local", "canister"] = "local"
    vaults: dict[str, Path] = Field(default_factory=dict, description="vault_id -> folder")
    canister_url: str | None = Field(default=None, description="https://... of the canister")
    canister_token: SecretStr | None = Field(
        default=None, description="bearer token for the canister"
    )
    gateway_secret: SecretStr | None = Field(default=None, description="X-Gateway-Auth value")
    connect_timeout_seconds: float = Field(default=5.0, gt=0, le=60)
    read_timeout_seconds: float = Field(default=10.0, gt=0, le=120)
    # The whole canister read, however the reply trickles in; build_server also holds it
    # under the timeout of every notes tool (vaults.check_canister_deadline).
    total_timeout_seconds: float = Field(
        default=DEFAULT_CANISTER_TOTAL_TIMEOUT_SECONDS, gt=0, le=MAX_CANISTER_TOTAL_TIMEOUT_SECONDS
    )
    max_response_bytes: int = Field(default=8 * MIB, ge=1024)

    @field_validator("total_timeout_seconds")
    @classmethod
    def _total_covers_connect_and_read(cls, value: float, info: ValidationInfo) -> float:
        # Fields that failed their own validation are absent from info.data.
        for part in ("connect_timeout_seconds", "read_timeout_seconds"):
            other = info.data.get(part)
            if other is not None and other > value:
                raise ValueError(f"must not be shorter than notes.{part}")
        return value

    @model_validator(mode="after")
    def _canister_needs_url(self) -> NotesSettings:
        if self.backend == "canister" and not self.canister_url:
            raise ValueError("backend 'canister' needs canister_url")
        return self


class LimitSettings(_Section):
    max_read_bytes: int = Field(default=10 * MIB, ge=1)
    max_request_bytes: int = Field(default=64 * MIB, ge=1024)
    max_list_entries: int = Field(default=1000, ge=1)


class StateSettings(_Section):
    """Where the chain's state lives (docs/replicas.md).

    ``embedded`` (default): SQLite files in the data dir and process memory, for one server
    process. ``shared``: PostgreSQL (grants, assignments, idempotency records) and Redis
    (approval nonces, budgets, rate limits), so every replica enforces the same limits.
    The URLs are given by reference (``{env: NAME}`` or ``{file: path}``); an inline URL
    is accepted only when it holds no password.
    """

    backend: Literal["embedded", "shared"] = "embedded"
    postgres_url: SecretValue | None = None
    redis_url: SecretValue | None = None
    # Every Redis key and the PostgreSQL notification channel start with it, so several
    # deployments (or test runs) can share one server.
    key_prefix: str = Field(default="nexus", pattern=r"^[A-Za-z0-9_.-]{1,48}$")
    pool_size: int = Field(default=10, ge=1, le=200)
    connect_timeout_seconds: float = Field(default=2.0, gt=0, le=30)
    timeout_seconds: float = Field(default=2.0, gt=0, le=30)
    # Session affinity: the 2025-11-25 era's Mcp-Session-Id starts with "<instance_id>."
    # so a balancer can route a session back to the replica that holds it.
    instance_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,32}$")
    # Keys that seal the requestState handed to clients (first seals, every key opens);
    # replicas share them. Unset: a per-process key (refused with the shared backend).
    request_state_keys: tuple[SecretValue, ...] = ()

    @model_validator(mode="after")
    def _shared_needs_urls(self) -> StateSettings:
        if self.backend == "shared":
            missing = [n for n in ("postgres_url", "redis_url") if getattr(self, n) is None]
            if missing:
                raise ValueError(f"backend 'shared' needs {' and '.join(missing)}")
        return self


class MetricsSettings(_Section):
    """``/metrics`` (Prometheus text format) on the HTTP transport (docs/observability.md).

    It answers under the same Host/Origin rules as the MCP endpoint; with ``bearer_token``
    set (inline, ``{env: NAME}`` or ``{file: path}``) a scrape must send it as a bearer.
    """

    enabled: bool = True
    bearer_token: SecretStr | SecretRef | None = None


class HealthSettings(_Section):
    """``/readyz`` detail for the operator (docs/observability.md): without this bearer
    token the route says only ready or not and which component."""

    bearer_token: SecretStr | SecretRef | None = None


class Settings(BaseSettings):
    """Every setting of a nexus-mcp process: the table in docs/configuration.md."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    mode: Mode = "prod"
    transport: Transport = "stdio"
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    http_path: str = "/mcp"
    stateless_http: bool = False
    # serve --workers N: N processes behind one HTTP socket (transport/workers.py); needs the shared
    # state backend and stateless HTTP.
    workers: int = Field(default=1, ge=1, le=64)
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    workspace: Path | None = None
    data_dir: Path = Field(default_factory=default_data_dir)
    audit_file: Path | None = None
    # Rotate the audit file into numbered segments past this size; the hash chain runs on.
    audit_max_bytes: int | None = Field(default=None, ge=65536)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # auto: text lines when stderr is a terminal, JSON lines otherwise (observability/logs.py).
    log_format: Literal["auto", "text", "json"] = "auto"
    server_name: str = "nexus"

    # The launch principal (stdio and in-process); ignored on HTTP, where tokens decide.
    # Without a subject the others never go unused: dev narrows dev_principal with them,
    # prod refuses to start (policy/launch.py).
    subject: str | None = None
    role: str | None = None
    profile: str | None = None
    vault_id: str | None = None
    user_id: str | None = None
    canister_user_id: str | None = None
    scopes: str = ""
    read_only: bool = False

    dev_principal: DevPrincipalSettings = DevPrincipalSettings()
    auth: AuthSettings = AuthSettings()
    limits: LimitSettings = LimitSettings()
    # Secrets in results: redacted, refused or audited (policy/output_scanning.py).
    output_scanning: OutputScanSettings = OutputScanSettings()
    search: SearchSettings = SearchSettings()
    registry: RegistrySettings = RegistrySettings()
    budgets: BudgetSettings = BudgetSettings()
    profiles: ProfileSettings = ProfileSettings()
    notes: NotesSettings = NotesSettings()
    state: StateSettings = StateSettings()
    metrics: MetricsSettings = MetricsSettings()
    health: HealthSettings = HealthSettings()
    console: ConsoleSettings = ConsoleSettings()
    approver_roles: tuple[str, ...] = ("admin",)
    approvals_elicit_profiles: tuple[str, ...] = ()
    # Deterministic mode (seed 002): record every call that reaches a tool, or answer every
    # call from such a recording (providers/fixtures.py). At most one of the two.
    record: Path | None = None
    replay: Path | None = None
    # The key that seals each recorded line (HMAC-SHA256, fixtures/integrity.py): written
    # by record, required and verified by replay and `fixtures verify` when set. By
    # reference ({env: NAME} or {file: path}, never inside the fixture folder); inline in
    # dev only.
    fixture_key: SecretValue | None = None

    @field_validator("http_path")
    @classmethod
    def _path_starts_with_slash(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value

    @model_validator(mode="after")
    def _record_or_replay(self) -> Settings:
        if self.record is not None and self.replay is not None:
            raise ValueError("'record' and 'replay' cannot both be set")
        return self

    # The files this configuration came from or names by reference (``load_settings``):
    # the server trusts them, so the file tools must never reach them (``stores/locations.py``).
    _trusted_files: tuple[Path, ...] = PrivateAttr(default=())

    @property
    def trusted_files(self) -> tuple[Path, ...]:
        """The configuration file and every ``{file: path}`` it or the environment names
        (secrets of every section, ``write_policies``, ``approvals``, ``upstreams`` and
        ``repos`` included); empty for settings not made by ``load_settings``."""
        return self._trusted_files

    @property
    def audit_path(self) -> Path:
        return self.audit_file if self.audit_file is not None else self.data_dir / "audit.jsonl"

    @property
    def is_dev(self) -> bool:
        return self.mode == "dev"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlSource(settings_cls))


_yaml_data: ContextVar[dict[str, Any] | None] = ContextVar("nexus_yaml_settings", default=None)


class _YamlSource(PydanticBaseSettingsSource):
    """Lowest-priority source: the mapping read from ``--config`` by ``load_settings``."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        data = _yaml_data.get() or {}
        return data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_yaml_data.get() or {})


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML configuration file, or stop with a message naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"configuration file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"configuration file {path} cannot be read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"configuration file {path} is not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"configuration file {path} must hold a mapping at the top level")
    return data


def load_settings(
    config_file: Path | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    flags: Mapping[str, str] | None = None,
) -> Settings:
    """Build validated settings; ``overrides`` are command-line flags (highest priority).

    ``flags`` maps a setting to the flag that sets it (``{"port": "--port"}``): a bad value
    given by that flag is reported under the flag's name, not the environment variable's.
    Sections of the YAML file that other loaders own (``write_policies``, ``approvals``,
    whose secrets never enter ``Settings``) are kept out of
    ``Settings`` validation and read by their own loaders through ``config_sections``.
    """
    data = read_config_file(config_file) if config_file is not None else {}
    # A key that is not text (``5: x``) can name no setting; pydantic-settings would fail
    # on it with a TypeError, so it is reported here as the unknown key it is.
    odd = [((k,), unknown_key_words(k, ())) for k in data if not isinstance(k, str)]
    own = {k: v for k, v in data.items() if isinstance(k, str) and k not in EXTERNAL_SECTIONS}
    own, unresolved = expand_references(own, Settings, os.environ)
    unresolved = [*odd, *unresolved]
    clean_overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    given = {k: v for k, v in (flags or {}).items() if k in clean_overrides}
    token = _yaml_data.set(own)
    try:
        settings = Settings(**clean_overrides)
    except ValidationError as exc:
        message = describe_validation_error(exc, source=config_file, flags=given, found=unresolved)
        raise ConfigError(message) from None
    except SettingsError as exc:
        raise ConfigError(_describe_settings_error(exc)) from None
    else:
        if unresolved:
            text = _config_text(config_file)
            lines = [_origin(loc, config_file, text, own, {}) + w for loc, w in unresolved]
            raise ConfigError(format_problems(lines))
    finally:
        _yaml_data.reset(token)
    return trust_files(settings, config_file, data)


def trust_files(settings: Settings, config_file: Path | None, data: Any) -> Settings:
    """Add ``config_file`` and the files ``data`` (its YAML) and ``settings`` name by
    reference to ``settings.trusted_files``; ``settings``, for chaining."""
    named = [*settings.trusted_files, *referenced_files(data), *referenced_files(settings)]
    if config_file is not None:
        named.append(config_file)
    settings._trusted_files = tuple(dict.fromkeys(path.absolute() for path in named))
    return settings


def referenced_files(value: Any) -> Iterator[Path]:
    """Every file a settings value, or raw YAML data, names by ``{file: path}``: secrets by
    reference (``SecretRef``) anywhere, and sections given as a file (``profiles.file``)."""
    if isinstance(value, SecretRef):
        if value.file is not None:
            yield value.file
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from referenced_files(getattr(value, name))
    elif isinstance(value, Mapping):
        file = value.get("file")
        if isinstance(file, str | Path) and str(file):
            yield Path(file)
        for key, item in value.items():
            if key != "file":
                yield from referenced_files(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from referenced_files(item)


EXTERNAL_SECTIONS = frozenset({"write_policies", "approvals", "upstreams", "repos", "flow"})


def describe_validation_error(
    exc: ValidationError,
    *,
    source: Path | None,
    flags: Mapping[str, str] | None = None,
    found: Sequence[tuple[tuple[str | int, ...], str]] = (),
) -> str:
    """One line per bad setting, in plain words, naming the key and where its value came
    from: the command-line flag (``flags``: setting -> flag given), else the environment
    variable that set it, else the file and line. Never the value itself. ``found``:
    problems already found at some locations (``${NAME}`` references); they win there."""
    text = _config_text(source)
    data = _yaml_data.get() or {}
    known = {loc for loc, _ in found}
    problems = [*found]
    for loc, words in problems_from(exc, Settings, known_extra=EXTERNAL_SECTIONS):
        if loc not in known:
            problems.append((loc, words))
    return format_problems(
        [_origin(loc, source, text, data, flags or {}) + w for loc, w in problems]
    )


def _origin(
    loc: tuple[str | int, ...],
    source: Path | None,
    text: str | None,
    data: Mapping[str, Any],
    flags: Mapping[str, str],
) -> str:
    """Where the value at ``loc`` came from, as the start of a problem line."""
    if loc and isinstance(loc[0], str) and loc[0] in flags:
        return f"{flags[loc[0]]}: "
    names = [str(part).upper() for part in loc if isinstance(part, str)]
    environ = {key.upper() for key in os.environ}
    for end in range(len(names), 0, -1):
        name = ENV_PREFIX + "__".join(names[:end])
        if name in environ:
            return f"{name}: "
    if source is not None and _holds(data, loc):
        return f"{file_origin(source, text, loc)}: "
    if names:
        return f"{ENV_PREFIX}{'__'.join(names)}: "
    return ""


def _holds(data: Mapping[str, Any], loc: tuple[str | int, ...]) -> bool:
    """Whether the YAML ``data`` sets the top-level key of ``loc`` (a key that is not
    text can only come from the file)."""
    return bool(loc) and (not isinstance(loc[0], str) or loc[0] in data)


def _config_text(source: Path | None) -> str | None:
    if source is None:
        return None
    try:
        return source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


_SETTINGS_ERROR_FIELD = re.compile(
    r'field "([A-Za-z_][A-Za-z0-9_]*)" from source "EnvSettingsSource"'
)


def _describe_settings_error(exc: SettingsError) -> str:
    """pydantic-settings could not read an environment variable as JSON (a list or a
    section given whole): name the variable and the form, never the value."""
    found = _SETTINGS_ERROR_FIELD.search(str(exc))
    if found is None:
        return format_problems(["an environment variable could not be read"])
    name = found.group(1)
    field = Settings.model_fields.get(name)
    words = describe_type(field.annotation if field is not None else None) or "JSON"
    example = ' (JSON, e.g. ["a", "b"])' if words == "a list" else " (as JSON)"
    env = ENV_PREFIX + name.upper()
    return format_problems([f"{env}: `{name}` should be {words}{example}"])


def config_sections(config_file: Path | None) -> dict[str, Any]:
    """The sections of the YAML file that other loaders own (see ``EXTERNAL_SECTIONS``)."""
    if config_file is None:
        return {}
    data = read_config_file(config_file)
    return {k: v for k, v in data.items() if k in EXTERNAL_SECTIONS}


__all__ = [
    "APP_NAME",
    "DEFAULT_CANISTER_TOTAL_TIMEOUT_SECONDS",
    "DEFAULT_TOKEN_LEEWAY_SECONDS",
    "EXTERNAL_SECTIONS",
    "MAX_CANISTER_TOTAL_TIMEOUT_SECONDS",
    "MAX_TOKEN_LEEWAY_SECONDS",
    "SERVE_FLAGS",
    "SERVE_OPTIONS",
    "AuthSettings",
    "BudgetSettings",
    "DevPrincipalSettings",
    "LimitSettings",
    "NotesSettings",
    "ProfileSettings",
    "RegistryPin",
    "RegistrySettings",
    "SearchSettings",
    "Settings",
    "config_sections",
    "default_data_dir",
    "describe_validation_error",
    "load_settings",
    "read_config_file",
    "referenced_files",
    "trust_files",
]
