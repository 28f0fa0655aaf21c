"""``nexus-mcp init``: the starter nexus.yaml loads with the server's own loaders, starts a
server, validates against the shipped schema, and an existing file is never overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from nexus_mcp.cli import main
from nexus_mcp.commands.config_schema import schema_text, shipped_schema_path
from nexus_mcp.server import build_server
from nexus_mcp.server.startup import load_approvals, load_write_policies
from nexus_mcp.settings import config_sections, load_settings


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def no_approval_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NEXUS_MCP_APPROVAL_SECRET", "NEXUS_MCP_APPROVAL_KEYS", "NEXUS_MCP_CONFIG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def starter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    workspace = tmp_path / 'my "notes" ✓'
    workspace.mkdir()
    path = tmp_path / "nexus.yaml"
    code, out, err = run(capsys, ["init", str(path), "--workspace", str(workspace)])
    assert (code, err) == (0, "")
    assert out.startswith(f"wrote {path}\n")
    assert "next: nexus-mcp serve --config" in out
    return path


def test_the_first_line_names_the_shipped_schema(starter: Path) -> None:
    first = starter.read_text(encoding="utf-8").splitlines()[0]
    assert first == f"# yaml-language-server: $schema={shipped_schema_path().as_uri()}"
    assert shipped_schema_path().is_file()


def test_the_starter_file_loads_and_starts_a_server(starter: Path, tmp_path: Path) -> None:
    settings = load_settings(starter, {"data_dir": tmp_path / "state", "subject": "alice"})
    assert settings.mode == "prod"
    assert settings.workspace == tmp_path / 'my "notes" ✓'
    sections = config_sections(starter)
    policies = load_write_policies(sections, settings)
    assert policies.workspace is not None
    assert policies.workspace.allowed_paths == ("notes/**", "drafts/**")
    assert policies.workspace.allowed_operations == {"write", "edit", "mkdir"}
    assert policies.workspace.require_approval is False
    keys, _ = load_approvals(sections, {}, settings, policies)
    assert keys is None  # no approval is required, so none is configured
    server = build_server(settings, config_file=starter, audit_sinks=[], env={})
    assert server is not None


def test_the_starter_file_validates_against_the_schema(starter: Path) -> None:
    schema = json.loads(shipped_schema_path().read_text(encoding="utf-8"))
    document = yaml.safe_load(starter.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(document)


def test_an_existing_file_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nexus.yaml"
    path.write_text("mode: dev\n", encoding="utf-8")
    code, out, err = run(capsys, ["init", str(path), "--workspace", str(tmp_path)])
    assert code == 1 and out == ""
    assert err == f"nexus-mcp: {path} already exists; not overwriting it\n"
    assert path.read_text(encoding="utf-8") == "mode: dev\n"


def test_a_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, ["init", str(tmp_path), "--workspace", str(tmp_path)])
    assert code == 1 and "is a folder" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_dangling_link_is_not_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nexus.yaml"
    path.symlink_to(tmp_path / "elsewhere.yaml")
    code, _, err = run(capsys, ["init", str(path), "--workspace", str(tmp_path)])
    assert code == 1 and "already exists" in err
    assert not (tmp_path / "elsewhere.yaml").exists()


def test_the_default_is_nexus_yaml_here_serving_this_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, ["init"])
    assert code == 0 and "nexus-mcp serve --config nexus.yaml" in out
    settings = load_settings(Path("nexus.yaml"), {"data_dir": tmp_path / "state"})
    assert settings.workspace == tmp_path


def test_a_workspace_that_is_not_a_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        capsys, ["init", str(tmp_path / "n.yaml"), "--workspace", str(tmp_path / "none")]
    )
    assert code == 1 and "not a folder" in err
    assert not (tmp_path / "n.yaml").exists()


def test_print_schema_prints_the_shipped_schema_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, ["init", "--print-schema"])
    assert code == 0 and out == schema_text()
    assert list(tmp_path.iterdir()) == []
