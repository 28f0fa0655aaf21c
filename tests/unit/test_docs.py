"""The docs stay true to the code: the configuration and error-code tables (docs/), and the
README's first screen (the two commands, the quickstart that links nowhere it cannot)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from nexus_mcp.errors import Code
from nexus_mcp.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
ERRORS = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")


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
    rows = set(
        re.findall(r"^\| `[^`]+` \| `(NEXUS_MCP_[A-Z_]+)` \|", CONFIGURATION, flags=re.MULTILINE)
    )
    assert rows == setting_env_names()


def test_error_table_lists_every_stable_code() -> None:
    rows = set(re.findall(r"^\| `([A-Z_]+)` \| ", ERRORS, flags=re.MULTILINE))
    assert {str(code) for code in Code} <= rows


def test_readme_opens_with_the_two_commands() -> None:
    first_block = README.split("```")[1]
    assert "make run" in first_block and "make test" in first_block


def test_readme_is_a_first_screen_not_the_reference() -> None:
    """Pitch, install, a quickstart and links: the reference lives in docs/."""
    assert len(README.splitlines()) < 160
    sections = re.findall(r"^## (.+)$", README, flags=re.MULTILINE)
    assert sections == ["Install", "Quickstart (5 minutes)", "Read more"]


def test_every_docs_link_in_the_readme_names_a_page_that_exists() -> None:
    targets = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README)
    assert targets
    for target in targets:
        assert (ROOT / target).is_file(), target


def test_the_quickstart_links_nowhere_the_docs_site_cannot_follow() -> None:
    """docs/quickstart.md includes the README's quickstart section verbatim, so a relative
    link there would resolve against docs/ in the site and against the root on GitHub."""
    start = README.index("--8<-- [start:quickstart]")
    end = README.index("--8<-- [end:quickstart]")
    assert start < end
    assert not re.search(r"\]\((?!https?://)[^)]+\)", README[start:end])
