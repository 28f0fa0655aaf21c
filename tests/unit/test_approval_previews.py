"""What an approver is shown fits the store whatever the text (policy/approval_requests.py).

The store bounds previews and targets in UTF-8 bytes; a preview cut by characters could
hold four bytes per character, and a file name's undecodable byte (a lone surrogate) has
no UTF-8 at all. Either made ``open`` raise, and the write's refusal an internal error.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mcp.ids import new_id
from nexus_mcp.policy.approval_requests import (
    MAX_PREVIEW_BYTES,
    REDACTED,
    arguments_preview,
    diff_preview,
    target_text,
)
from nexus_mcp.stores.approval_requests import (
    MAX_PREVIEW_BYTES as STORE_PREVIEW_BYTES,
)
from nexus_mcp.stores.approval_requests import (
    MAX_TARGET_BYTES as STORE_TARGET_BYTES,
)
from nexus_mcp.stores.approval_requests import (
    PENDING,
    ApprovalRequest,
    MemoryApprovalRequestStore,
)

WIDE = ["\U0001f600", "漢", "é", "a", "\ud800", "\udcff", "\n", "\x1b"]


def _stored(target: str | None, preview: str) -> ApprovalRequest:
    request = ApprovalRequest(
        id=new_id(),
        created_at=1.0,
        expires_at=2.0,
        tool="write_file",
        server_id=None,
        subject="alice",
        log_subject="alice",
        role="editor",
        args_digest="0" * 64,
        target=target,
        preview=preview,
        policy_rule=None,
        status=PENDING,
    )
    return MemoryApprovalRequestStore(clock=lambda: 1.5).open(request)


@pytest.mark.parametrize("char", WIDE)
def test_a_long_diff_of_wide_characters_fits_the_store(char: str) -> None:
    new = (char * 200 + "\n") * 2000
    preview = diff_preview("notes/a.md", None, new)
    size = len(preview.encode())
    assert size <= MAX_PREVIEW_BYTES + 100 < STORE_PREVIEW_BYTES
    assert "more bytes not shown" in preview
    _stored(None, preview)


@pytest.mark.parametrize("char", WIDE)
def test_a_long_target_of_wide_characters_fits_the_store(char: str) -> None:
    target = target_text([char * 5000, "b" * 10])
    assert target is not None
    assert len(target.encode()) <= STORE_TARGET_BYTES
    _stored(target, "x")


def test_a_lone_surrogate_is_shown_as_a_replacement_character() -> None:
    preview = diff_preview("bad\udcffname.md", None, "body\ud800\n")
    assert "\ufffd" in preview
    preview.encode()  # storable


def test_secrets_stay_redacted_and_long_values_are_cut_in_bytes() -> None:
    text = arguments_preview({"token": "s3cr3t", "content": "漢" * 5000}, {"token"})
    assert "s3cr3t" not in text
    assert REDACTED in text
    assert len(text.encode()) < 4000
    shown = json.loads(text)
    assert shown["token"] == REDACTED
    assert shown["content"].endswith("more bytes not shown)")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(WIDE), max_size=3000), st.integers(1, 40))
def test_any_text_fits_under_every_bound(text: str, repeat: int) -> None:
    preview = diff_preview("p", text, text[::-1] * repeat)
    target = target_text([text] * repeat)
    _stored(target, preview)
    assert "\ud800" not in preview and (target is None or "\udcff" not in target)
