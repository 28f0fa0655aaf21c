"""Output scanning's policy: the mode for a result, structured walks, split secrets, decisions."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from mcp_types import (
    BlobResourceContents,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)

from nexus_mcp.calls import CallState
from nexus_mcp.connector import Outcome
from nexus_mcp.contracts import contract_of, nexus_tool
from nexus_mcp.errors import Code, OutputDeniedError
from nexus_mcp.json_text import to_result_json
from nexus_mcp.middleware.output_scan import OutputScan
from nexus_mcp.policy.output_scanning import (
    Findings,
    OutputScanSettings,
    decide,
    scan_structured,
    scan_texts,
)
from nexus_mcp.policy.secret_scan import marker

from .test_secret_scan import AWS_KEY, GITHUB_TOKEN, PEM, SHA256, SLACK_TOKEN

settings = OutputScanSettings()
scanner = settings.scanner()


def test_the_mode_is_the_tools_then_the_servers_then_the_default() -> None:
    chosen = OutputScanSettings(
        mode="audit", tools={"up_echo": "refuse"}, servers={"up": "off", "nexus": "redact"}
    )
    assert chosen.mode_for("up", "up_echo") == "refuse"
    assert chosen.mode_for("up", "up_other") == "off"
    assert chosen.mode_for(None, "nexus_read_file") == "redact"
    assert chosen.mode_for("elsewhere", "x") == "audit"
    assert OutputScanSettings().mode_for(None, "anything") == "redact"


def test_every_string_of_a_structured_value_is_scanned_keys_included() -> None:
    value = {
        "path": "notes/a.md",
        "sha256": SHA256,
        "nested": [{"deep": {"deeper": [f"key={AWS_KEY}"]}}],
        GITHUB_TOKEN: 1,
        "n": 3,
        "flag": True,
        "none": None,
    }
    findings = Findings()
    out = scan_structured(scanner, value, findings)
    dumped = json.dumps(out)
    assert AWS_KEY not in dumped and GITHUB_TOKEN not in dumped
    assert out["path"] == "notes/a.md" and out["sha256"] == SHA256 and out["n"] == 3
    assert out["nested"][0]["deep"]["deeper"] == [f"key={marker('aws_access_key')}"]
    assert marker("github_token") in out
    assert sorted(findings.kinds) == ["aws_access_key", "github_token"]


def test_a_secret_nested_past_the_walks_depth_is_still_cut() -> None:
    value: Any = {"k": f"x {AWS_KEY}"}
    for _ in range(200):
        value = {"d": [value]}
    findings = Findings()
    out = scan_structured(scanner, value, findings)
    assert AWS_KEY not in json.dumps(out)
    assert findings.kinds == ["aws_access_key"]


def test_a_clean_structured_value_is_returned_as_the_same_object() -> None:
    value = {"a": ["b", {"c": "d"}], "sha256": SHA256}
    assert scan_structured(scanner, value, Findings()) is value


def test_two_keys_redacted_to_one_marker_both_stay() -> None:
    other = GITHUB_TOKEN[:-1] + "Z"
    out = scan_structured(scanner, {GITHUB_TOKEN: 1, other: 2}, Findings())
    assert sorted(out.values()) == [1, 2]


def test_a_secret_split_across_two_text_parts_is_found_and_cut_in_each() -> None:
    findings = Findings()
    parts = ["config: AKIAIOSF", "ODNN7Q2WZX4M rest"]
    out = scan_texts(scanner, parts, findings)
    assert out[0] == f"config: {marker('aws_access_key')}"
    assert out[1] == f"{marker('aws_access_key')} rest"
    assert findings.kinds == ["aws_access_key"]


def test_the_audit_record_holds_kinds_counts_and_hashes_never_a_value() -> None:
    findings = Findings()
    scan_texts(scanner, [f"{AWS_KEY} {AWS_KEY} {SLACK_TOKEN}"], findings)
    records: list[dict[str, Any]] = []
    assert decide("redact", findings, records.append) is True
    (record,) = records
    assert record["action"] == "redacted" and record["count"] == 3
    assert record["kinds"] == {"aws_access_key": 2, "slack_token": 1}
    assert record["sha256"] == sorted(
        {hashlib.sha256(v.encode()).hexdigest() for v in (AWS_KEY, SLACK_TOKEN)}
    )
    assert AWS_KEY not in json.dumps(record) and SLACK_TOKEN not in json.dumps(record)


def test_refuse_raises_output_denied_naming_kinds_only() -> None:
    findings = Findings()
    scan_texts(scanner, [f"{PEM}\n{AWS_KEY}"], findings)
    records: list[dict[str, Any]] = []
    with pytest.raises(OutputDeniedError) as caught:
        decide("refuse", findings, records.append)
    payload = caught.value.to_payload()
    assert payload["code"] == Code.OUTPUT_DENIED
    assert payload["error"] == "result withheld: it holds a secret (aws_access_key, private_key)"
    assert records[0]["action"] == "refused"


def test_audit_mode_delivers_the_original_and_nothing_found_records_nothing() -> None:
    findings = Findings()
    scan_texts(scanner, [AWS_KEY], findings)
    records: list[dict[str, Any]] = []
    assert decide("audit", findings, records.append) is False
    assert records[0]["action"] == "audited"
    assert decide("refuse", Findings(), records.append) is False
    assert len(records) == 1


def test_a_hostile_kinds_fact_never_reaches_the_message() -> None:
    error = OutputDeniedError(kinds='x"; <script>', count=1)
    assert error.message == "result withheld: it holds a secret"


# -- the adapter: MCP content taken apart and put together again ------------------------


@nexus_tool(risk="read", toolset="files")
async def read_thing() -> dict[str, Any]:
    """A stand-in tool for its contract."""
    return {}


CONTRACT = contract_of(read_thing)


def state(server_id: str | None = None, tool: str = "read_thing") -> CallState:
    found = CallState(tool_name=tool, arguments={}, meta={}, transport=None)
    found.server_id = server_id
    return found


def test_a_native_result_is_redacted_in_structured_content_and_its_text_alike() -> None:
    structured, text = to_result_json({"content": f"token {GITHUB_TOKEN}", "sha256": SHA256})
    outcome = Outcome(
        content=[TextContent(type="text", text=text)], structured=structured, document=structured
    )
    call = state()
    out = OutputScan(settings).outcome(CONTRACT, call, outcome)
    assert out.structured == {"content": f"token {marker('github_token')}", "sha256": SHA256}
    assert out.document == out.structured
    (block,) = out.content
    assert isinstance(block, TextContent) and json.loads(block.text) == out.structured
    assert call.output_scan is not None and call.output_scan["kinds"] == {"github_token": 1}


def test_an_upstream_result_is_redacted_block_by_block_and_binary_passes() -> None:
    blocks = [
        TextContent(type="text", text=f"a {SLACK_TOKEN}"),
        EmbeddedResource(
            type="resource",
            resource=TextResourceContents(uri="file:///k.pem", text=PEM),
        ),
        EmbeddedResource(
            type="resource",
            resource=BlobResourceContents(uri="file:///b.bin", blob="AAAA"),
        ),
        ImageContent(type="image", data="iVBORw0KGgo=", mimeType="image/png"),
    ]
    structured = {"nested": {"list": [AWS_KEY]}}
    outcome = Outcome(
        content=list(blocks),
        structured=structured,
        document={"content": [], "structuredContent": structured},
    )
    out = OutputScan(settings).outcome(CONTRACT, state("up", "up_leak"), outcome)
    dumped = json.dumps(out.document)
    for secret in (SLACK_TOKEN, AWS_KEY, "MIIEpAIBAAKCAQEA"):
        assert secret not in dumped
        assert all(secret not in block.model_dump_json() for block in out.content)
    assert out.content[2] is blocks[2] and out.content[3] is blocks[3]
    assert out.document is not None
    assert out.document["structuredContent"] == {"nested": {"list": [marker("aws_access_key")]}}


def test_off_and_a_clean_result_hand_back_the_very_outcome() -> None:
    outcome = Outcome(
        content=[TextContent(type="text", text=AWS_KEY)], structured=None, document=None
    )
    off = OutputScan(OutputScanSettings(mode="off"))
    assert off.outcome(CONTRACT, state("up"), outcome) is outcome
    clean = Outcome(
        content=[TextContent(type="text", text="hello")], structured=None, document=None
    )
    assert OutputScan(settings).outcome(CONTRACT, state("up"), clean) is clean
