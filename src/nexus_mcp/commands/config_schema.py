"""The JSON Schema of ``nexus.yaml``, generated from the models that validate it.

``Settings`` gives the top level; the sections other loaders own (``EXTERNAL_SECTIONS``:
``write_policies``, ``upstreams``, ``repos``, ``approvals``) are added from their own
models, so an editor with the schema completes and checks the whole file. The package
ships the result (``data/schemas/nexus.schema.json``, named by the starter file's
``yaml-language-server`` comment); a test keeps it equal to a fresh generation.
Regenerate with ``nexus-mcp init --print-schema > src/nexus_mcp/data/schemas/nexus.schema.json``.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from pydantic.json_schema import models_json_schema

from nexus_mcp.policy.approvals import (
    DEFAULT_APPROVAL_TTL_SECONDS,
    DEFAULT_AUDIENCE,
    DEFAULT_ISSUER,
    DEFAULT_REQUEST_TTL_SECONDS,
    DEFAULT_WAIT_SECONDS,
    MAX_APPROVAL_TTL_SECONDS,
    MAX_REQUEST_TTL_SECONDS,
    MAX_WAIT_SECONDS,
    MIN_APPROVAL_TTL_SECONDS,
    MIN_REQUEST_TTL_SECONDS,
)
from nexus_mcp.policy.flow import FlowSection
from nexus_mcp.policy.repos import WritePolicy as RepoWritePolicy
from nexus_mcp.policy.repos import _ReposDocument
from nexus_mcp.policy.upstreams import _UpstreamsDocument
from nexus_mcp.policy.write_policy import WritePolicy as WorkspaceWritePolicy
from nexus_mcp.policy.write_policy import _WritePoliciesDocument
from nexus_mcp.settings import EXTERNAL_SECTIONS, Settings

SCHEMA_RESOURCE = ("data", "schemas", "nexus.schema.json")
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class ApprovalsSection(BaseModel):
    """The ``approvals`` section as ``policy/approvals.py`` reads it (that loader reads the
    mapping itself; this model only describes it for the schema). The environment
    (``NEXUS_MCP_APPROVAL_SECRET``, ``NEXUS_MCP_APPROVAL_KEYS``) wins over it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    secret: StrictStr | None = Field(
        default=None,
        min_length=1,
        description="one approval secret (32+ bytes); prefer NEXUS_MCP_APPROVAL_SECRET",
    )
    keys: dict[StrictStr, StrictStr] | None = Field(
        default=None, description="kid -> secret, for rotation (instead of secret)"
    )
    active_kid: StrictStr | None = Field(
        default=None, description="the kid new tokens are minted with"
    )
    audience: StrictStr = Field(default=DEFAULT_AUDIENCE, min_length=1, max_length=256)
    issuer: StrictStr = Field(default=DEFAULT_ISSUER, min_length=1, max_length=256)
    ttl_seconds: StrictInt = Field(
        default=DEFAULT_APPROVAL_TTL_SECONDS,
        ge=MIN_APPROVAL_TTL_SECONDS,
        le=MAX_APPROVAL_TTL_SECONDS,
        description="how long a minted approval token is valid",
    )
    request_ttl_seconds: StrictInt = Field(
        default=DEFAULT_REQUEST_TTL_SECONDS,
        ge=MIN_REQUEST_TTL_SECONDS,
        le=MAX_REQUEST_TTL_SECONDS,
        description="how long an approval request waits in the inbox (approved: for the retry)",
    )
    wait_seconds: StrictInt = Field(
        default=DEFAULT_WAIT_SECONDS,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description=(
            "how long a write may wait for an approver's decision when its client can answer "
            "elicitation and chooses to wait (0: never wait)"
        ),
    )
    allow_self_approval: StrictBool = Field(
        default=False, description="an approver may approve a request of their own subject"
    )


# Each external section's model, and the property of it that is the section's value.
_SECTIONS: dict[str, tuple[type[BaseModel], str | None]] = {
    "write_policies": (_WritePoliciesDocument, None),
    "approvals": (ApprovalsSection, None),
    "upstreams": (_UpstreamsDocument, "upstreams"),
    "repos": (_ReposDocument, None),
    "flow": (FlowSection, None),
}


# Readable names for the definitions whose class names are private or shared.
_DEF_NAMES: tuple[tuple[type[BaseModel], str], ...] = (
    (Settings, "Settings"),
    (_WritePoliciesDocument, "WritePoliciesSection"),
    (WorkspaceWritePolicy, "WritePolicy"),
    (_ReposDocument, "ReposSection"),
    (RepoWritePolicy, "RepoWritePolicy"),
    (_UpstreamsDocument, "UpstreamsSection"),
)


def _renamed(value: Any, names: dict[str, str]) -> Any:
    """``value`` with the definitions and references of ``names`` renamed."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str):
                prefix, _, name = item.rpartition("/")
                out[key] = f"{prefix}/{names.get(name, name)}"
            else:
                out[key] = _renamed(item, names)
        return out
    if isinstance(value, list):
        return [_renamed(item, names) for item in value]
    return value


def config_schema() -> dict[str, Any]:
    """The schema of a ``nexus.yaml`` file, as a JSON-ready mapping."""
    if set(_SECTIONS) != EXTERNAL_SECTIONS:  # pragma: no cover - caught by the tests
        raise RuntimeError("config_schema does not describe every external section")
    every: list[type[BaseModel]] = [Settings, *(model for model, _ in _SECTIONS.values())]
    every += [model for model, _ in _DEF_NAMES if model not in every]
    refs, document = models_json_schema(
        [(model, "validation") for model in every], ref_template="#/$defs/{model}"
    )
    generated = {
        model: str(refs[(model, "validation")]["$ref"]).rsplit("/", 1)[-1] for model in every
    }
    names = {generated[model]: name for model, name in _DEF_NAMES}
    defs = {names.get(key, key): _renamed(value, names) for key, value in document["$defs"].items()}

    def def_name(model: type[BaseModel]) -> str:
        return names.get(generated[model], generated[model])

    properties = dict(defs.pop(def_name(Settings))["properties"])
    for section, (model, inner) in _SECTIONS.items():
        if inner is None:
            value: dict[str, Any] = {"$ref": f"#/$defs/{def_name(model)}"}
        else:
            value = defs.pop(def_name(model))["properties"][inner]
        properties[section] = {"anyOf": [value, {"type": "null"}], "default": None}
    # ``name: /path`` is short for ``name: {path: /path}`` (``_ReposDocument``).
    repositories = defs["ReposSection"]["properties"]["repositories"]
    repositories["additionalProperties"] = {
        "anyOf": [repositories["additionalProperties"], {"type": "string"}]
    }
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "title": "nexus.yaml",
        "description": "The nexus-mcp configuration file (nexus-mcp serve --config FILE).",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "$defs": dict(sorted(defs.items())),
    }


def schema_text() -> str:
    """The schema as the shipped file holds it."""
    return json.dumps(config_schema(), indent=2, ensure_ascii=False) + "\n"


def shipped_schema_path() -> Path:
    """Where the installed package keeps ``nexus.schema.json``."""
    return Path(str(resources.files("nexus_mcp").joinpath(*SCHEMA_RESOURCE)))


__all__ = [
    "ApprovalsSection",
    "config_schema",
    "schema_text",
    "shipped_schema_path",
]
