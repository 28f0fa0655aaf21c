"""The note resource's pure parts: the URI's path decoded strictly, Markdown names, contents."""

from __future__ import annotations

import hashlib

import pytest

from nexus_mcp.errors import UpstreamError
from nexus_mcp.providers.note_resources import (
    MARKDOWN_MIME_TYPE,
    META_SHA256,
    NOTES_URI_TEMPLATE,
    NoteResourceTemplate,
    decode_note_path,
    is_markdown_name,
    to_note_content,
)


@pytest.mark.parametrize(
    ("raw", "decoded"),
    [
        ("notes/a.md", "notes/a.md"),
        ("caf%C3%A9%20x.md", "café x.md"),
        ("café.md", "café.md"),
        ("a%2Fb.md", "a/b.md"),  # an encoded separator separates, as the notes tools' '/'
        ("%252e%252e/x.md", "%2e%2e/x.md"),  # decoded once: a name, not a parent
        ("%2e%2e/x.md", "../x.md"),  # decoded, then the notes normalizer refuses it
    ],
)
def test_the_path_is_percent_decoded_exactly_once(raw: str, decoded: str) -> None:
    assert decode_note_path(raw) == decoded


@pytest.mark.parametrize("raw", ["%FF.md", "%C3.md", "%ED%A0%80.md", "a.md?x=1", "a.md#f", 3, None])
def test_what_names_no_note_is_refused_as_an_invalid_path(raw: object) -> None:
    with pytest.raises(UpstreamError) as caught:
        decode_note_path(raw)
    assert caught.value.message == "Invalid path"


@pytest.mark.parametrize(
    ("path", "markdown"),
    [
        ("a.md", True),
        ("dir/B.MD", True),
        ("x.Markdown", True),
        ("a.md.txt", False),
        ("a.mdx", False),
        ("notes.md/readme", False),
        ("README", False),
    ],
)
def test_only_md_and_markdown_files_are_notes(path: str, markdown: bool) -> None:
    assert is_markdown_name(path) is markdown


def test_utf8_is_text_and_anything_else_a_blob_both_hashed_over_their_bytes() -> None:
    text = to_note_content("# é\r\n".encode())
    blob = to_note_content(b"# \xe9\n")
    assert (text.content, text.mime_type) == ("# é\r\n", MARKDOWN_MIME_TYPE)
    assert text.meta == {META_SHA256: hashlib.sha256("# é\r\n".encode()).hexdigest()}
    assert (blob.content, blob.mime_type) == (b"# \xe9\n", MARKDOWN_MIME_TYPE)
    assert blob.meta == {META_SHA256: hashlib.sha256(b"# \xe9\n").hexdigest()}


def test_every_uri_under_the_prefix_is_the_templates_and_no_other() -> None:
    template = NoteResourceTemplate(
        uri_template=NOTES_URI_TEMPLATE, name="note", parameters={}, security=None
    )
    assert template.matches("nexus://notes/") == {"path": ""}
    assert template.matches("nexus://notes/../x") == {"path": "../x"}
    assert template.matches("nexus://notesx/a.md") is None
    assert template.matches("upstream://notes/a.md") is None
