"""README's configuration and error-code tables stay true to the code."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from nexus_mcp.errors import Code
from nexus_mcp.settings import ENV_PREFIX, Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def setting_env_names(model: type[BaseModel] = Settings, prefix: str = ENV_PREFIX) -> set[str]:
    names: set[str] = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= setting_env_names(annotation, f"{prefix}{name.upper()}__")
        else:
            names.add(f"{prefix}{name.upper()}")
    return names


def test_configuration_table_lists_exactly_the_settings() -> None:
    rows = set(re.findall(r"^\| `[^`]+` \| `(NEXUS_MCP_[A-Z_]+)` \|", README, flags=re.MULTILINE))
    assert rows == setting_env_names()


def test_error_table_lists_every_stable_code() -> None:
    rows = set(re.findall(r"^\| `([A-Z_]+)` \| ", README, flags=re.MULTILINE))
    assert {str(code) for code in Code} <= rows


def test_readme_opens_with_the_two_commands() -> None:
    first_block = README.split("```")[1]
    assert "make run" in first_block and "make test" in first_block
