"""Note path normalization: Knowtation's hosted rules, refused before any read."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mcp.errors import Code, UpstreamError
from nexus_mcp.notes.paths import (
    check_normalized_path,
    encode_uri_component,
    normalize_note_path,
    to_facet_path,
    to_folder,
)

_DRIVE_RE = re.compile(r"^[A-Za-z]:")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("notes/example.md", "notes/example.md"),
        ("  inbox/one.md \n", "inbox/one.md"),
        ("\ufeffinbox/one.md", "inbox/one.md"),  # U+FEFF is JavaScript whitespace
        ("inbox\\sub\\one.md", "inbox/sub/one.md"),
        ("inbox//sub///one.md", "inbox/sub/one.md"),
        ("inbox/one.md/", "inbox/one.md"),
        ("a/./b.md", "a/./b.md"),
        ("...md", "...md"),
        ("a/..b/c..", "a/..b/c.."),
        ("inbox/hello world.md", "inbox/hello world.md"),
    ],
)
def test_normalize_note_path_keeps_vault_relative_paths(raw: str, expected: str) -> None:
    assert normalize_note_path(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        None,
        42,
        b"inbox/one.md",
        ["inbox/one.md"],
        "",
        "   ",
        "\u0085",  # not whitespace in JavaScript, but a NUL-free one-char path... see below
        "/etc/passwd",
        "\\Users\\owner\\secret.md",
        "\\\\server\\share\\x.md",
        "//server/share/x.md",
        "C:/Users/name/private.md",
        "c:\\Users\\name\\private.md",
        "C:relative.md",
        "../secret.md",
        "inbox/../../secret.md",
        "inbox/..",
        "inbox\\..\\x.md",
        "inbox/one.md\x00.txt",
    ],
)
def test_normalize_note_path_refuses_unsafe_paths_with_invalid_path(raw: object) -> None:
    if raw == "\u0085":
        # U+0085 survives a JavaScript trim, so it is a (strange but) relative path.
        assert normalize_note_path(raw) == "\u0085"
        return
    with pytest.raises(UpstreamError) as caught:
        normalize_note_path(raw)
    assert caught.value.code is Code.UPSTREAM_ERROR
    assert caught.value.message == "Invalid path"


@settings(max_examples=400)
@given(st.text(alphabet=st.sampled_from(list("ab./\\:C \x00\t\ufeff\u0085..")), max_size=24))
def test_normalized_paths_never_leave_the_vault(raw: str) -> None:
    try:
        path = normalize_note_path(raw)
    except UpstreamError as refused:
        assert refused.message == "Invalid path"
        assert raw.strip() == "" or raw not in refused.message
        return
    segments = path.split("/")
    assert ".." not in segments
    assert "" not in segments
    assert not path.startswith("/")
    assert "\x00" not in path
    assert not _DRIVE_RE.match(path)
    assert check_normalized_path(path) == path


@settings(max_examples=300)
@given(st.text(min_size=3, max_size=40))
def test_refusals_never_echo_the_input(raw: str) -> None:
    candidate = "/" + raw
    with pytest.raises(UpstreamError) as caught:
        normalize_note_path(candidate)
    assert caught.value.message == "Invalid path"
    assert raw.strip() not in str(caught.value) or raw.strip() in "Invalid path"
    assert caught.value.facts == {"outcome": "invalid_path"}


@pytest.mark.parametrize(
    ("path", "encoded"),
    [
        ("inbox/hello world.md", "inbox%2Fhello%20world.md"),
        ("a-b_c.d!e~f*g'h(i)j.md", "a-b_c.d!e~f*g'h(i)j.md"),
        ("caf\u00e9/#?&=+.md", "caf%C3%A9%2F%23%3F%26%3D%2B.md"),
        ("\U0001f600.md", "%F0%9F%98%80.md"),
    ],
)
def test_encode_uri_component_matches_javascript(path: str, encoded: str) -> None:
    assert encode_uri_component(path) == encoded


def test_encode_uri_component_refuses_a_lone_surrogate_like_javascript() -> None:
    with pytest.raises(UnicodeEncodeError):
        encode_uri_component("a\ud800.md")


@pytest.mark.parametrize(
    ("path", "facet_path", "folder"),
    [
        ("notes/example.md", "notes/example.md", "notes"),
        ("a/./b.md", "a/b.md", "a"),
        ("./x.md", "x.md", None),
        ("projects/My Project/note.md", "projects/My Project/note.md", "projects/My Project"),
    ],
)
def test_facet_paths_drop_current_segments_like_posix_normalize(
    path: str, facet_path: str, folder: str | None
) -> None:
    assert to_facet_path(path) == facet_path
    assert to_folder(facet_path) == folder


def test_a_path_of_only_current_segments_has_no_facet_path() -> None:
    with pytest.raises(UpstreamError) as caught:
        to_facet_path("./.")
    assert caught.value.message == "Invalid path"


@pytest.mark.parametrize(
    "path", ["a/../b.md", "/a.md", "a//b.md", "a\\b.md", "C:/x.md", "", "a\x00b"]
)
def test_check_normalized_path_refuses_anything_not_already_safe(path: str) -> None:
    with pytest.raises(UpstreamError):
        check_normalized_path(path)


def test_check_normalized_path_never_rewrites_a_path() -> None:
    assert check_normalized_path(": ") == ": "
    assert check_normalized_path(" a/b ") == " a/b "


@pytest.mark.parametrize("raw", ["\ud800", "inbox/a\udfff.md", "\udcff.md", "a/\udc80/b.md"])
def test_a_lone_surrogate_names_no_note_and_is_an_invalid_path(raw: str) -> None:
    for check in (normalize_note_path, check_normalized_path):
        with pytest.raises(UpstreamError) as caught:
            check(raw)
        assert caught.value.to_payload() == {"error": "Invalid path", "code": Code.UPSTREAM_ERROR}
