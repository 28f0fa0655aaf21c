"""Document enforcement: pointers, strict decoding, exact limits, normative hashes, records."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexus_mcp.errors import Code, NexusError
from nexus_mcp.ids import is_uuid7
from nexus_mcp.policy.documents import (
    EMPTY_CHECK,
    MAX_EXPECTED_HASHES,
    DocumentCheck,
    DocumentHash,
    build_tool_call,
    build_tool_effect,
    check_read_documents,
    check_write_documents,
    parse_expected_hashes,
    resolve_pointer,
)
from nexus_mcp.policy.registry import (
    TOOL_CALL_SCHEMA,
    TOOL_EFFECT_SCHEMA,
    DocumentSpec,
    find_contract_errors,
)

HELLO_SHA = hashlib.sha256(b"Hello World").hexdigest()
UUID7 = "0190a5b2-7c3e-7d4f-8a1b-2c3d4e5f6a7b"


def spec(
    encoding: str = "utf8",
    *,
    write: tuple[str, ...] = ("/content",),
    read: tuple[str, ...] = (),
    max_read: int = 10 * 1024 * 1024,
    max_write: int = 5 * 1024 * 1024,
    max_batch: int = 50 * 1024 * 1024,
) -> DocumentSpec:
    return DocumentSpec(encoding, write, read, max_read, max_write, max_batch)  # type: ignore[arg-type]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def refusal(call: Any) -> NexusError:
    with pytest.raises(NexusError) as caught:
        call()
    return caught.value


# --- normative hashing ------------------------------------------------------------------


def test_utf8_content_hashes_its_exact_bytes() -> None:
    check = check_write_documents(spec(), {"content": "Hello World"})
    assert check == DocumentCheck((DocumentHash("/content", HELLO_SHA, 11),), 11)


def test_non_ascii_utf8_content_hashes_its_exact_utf8_bytes() -> None:
    text = "h\u00e9llo \u2713 \U0001d11e"
    expected = b"h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9d\x84\x9e"
    check = check_write_documents(spec(), {"content": text})
    assert check.hashes == (DocumentHash("/content", sha(expected), len(expected)),)


def test_crlf_and_lf_hash_differently_because_newlines_are_not_normalized() -> None:
    crlf = check_write_documents(spec(), {"content": "a\r\nb"}).hashes[0]
    lf = check_write_documents(spec(), {"content": "a\nb"}).hashes[0]
    assert (crlf.hash, crlf.size_bytes) == (sha(b"a\r\nb"), 4)
    assert (lf.hash, lf.size_bytes) == (sha(b"a\nb"), 3)


def test_unicode_is_not_normalized() -> None:
    composed = check_write_documents(spec(), {"content": "\u00e9"}).hashes[0]
    decomposed = check_write_documents(spec(), {"content": "e\u0301"}).hashes[0]
    assert composed.hash == sha(b"\xc3\xa9")
    assert decomposed.hash == sha(b"e\xcc\x81")


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        ({"b": [True, None], "a": 1}, b'{"a":1,"b":[true,null]}'),
        ({"\u00e9": "\u00fc"}, '{"\u00e9":"\u00fc"}'.encode()),
        ([1, "x", {"k": 2.5}], b'[1,"x",{"k":2.5}]'),
        (42, b"42"),
        (None, b"null"),
        (False, b"false"),
    ],
)
def test_a_non_string_value_hashes_as_canonical_json(value: Any, canonical: bytes) -> None:
    check = check_write_documents(spec(), {"content": value})
    assert check.hashes == (DocumentHash("/content", sha(canonical), len(canonical)),)


def test_base64_content_hashes_the_decoded_bytes() -> None:
    check = check_write_documents(spec("base64"), {"content": "SGVsbG8gV29ybGQ="})
    assert check == DocumentCheck((DocumentHash("/content", HELLO_SHA, 11),), 11)


def test_empty_content_hashes_the_empty_string() -> None:
    for encoding in ("utf8", "base64"):
        check = check_write_documents(spec(encoding), {"content": ""})
        assert check.hashes == (DocumentHash("/content", sha(b""), 0),)


@given(st.text())
def test_any_text_hashes_as_its_utf8_encoding(text: str) -> None:
    # st.text() draws no lone surrogates, so every draw has a UTF-8 encoding.
    item = check_write_documents(spec(), {"content": text}).hashes[0]
    assert (item.hash, item.size_bytes) == (sha(text.encode("utf-8")), len(text.encode("utf-8")))


@given(st.binary(max_size=512))
def test_any_bytes_hash_the_same_through_strict_base64(data: bytes) -> None:
    encoded = base64.b64encode(data).decode("ascii")
    item = check_write_documents(spec("base64"), {"content": encoded}).hashes[0]
    assert (item.hash, item.size_bytes) == (sha(data), len(data))


# --- strict decoding --------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "SGVsbG8gV29ybGQ",  # missing padding
        "SGVsbG8gV29ybG",  # missing padding, length 2 mod 4
        "SGVsbG8g\nV29ybGQ=",  # embedded newline
        "SGVsbG8gV29ybGQ=\n",  # trailing newline
        "SGVsbG8g V29ybGQ",  # embedded space
        " SGVsbG8gV29ybGQ=",  # leading whitespace
        "-__-",  # URL-safe alphabet
        "SGVsbG8gV29ybGQ=AAAA",  # data after padding
        "SG=sbG8g",  # padding in the middle
        "SGVsbG8gV29ybGQ*",  # not in the alphabet
        "SGVsbG8gV29ybG\u00e9",  # non-ASCII
        "====",
        12345,
        ["SGVsbG8="],
        None,
    ],
)
def test_strict_base64_refuses_anything_but_canonical_padded_base64(value: Any) -> None:
    error = refusal(lambda: check_write_documents(spec("base64"), {"content": value}))
    assert error.code == Code.DOC_ENCODING_INVALID
    assert error.facts == {"encoding": "base64", "pointer": "/content"}


def test_a_lone_surrogate_is_not_valid_utf8() -> None:
    for text in ("\ud800", "ok \udfff", "\ud800" * 10):
        error = refusal(lambda text=text: check_write_documents(spec(), {"content": text}))
        assert error.code == Code.DOC_ENCODING_INVALID
    oversized = refusal(
        lambda: check_write_documents(spec(max_write=3), {"content": "\ud800" * 10})
    )
    assert oversized.code == Code.DOC_ENCODING_INVALID


def test_a_non_finite_number_has_no_canonical_json() -> None:
    error = refusal(lambda: check_write_documents(spec(), {"content": float("nan")}))
    assert error.code == Code.DOC_ENCODING_INVALID


# --- pointers ---------------------------------------------------------------------------

DOCUMENT: dict[str, Any] = {
    "a~b": "tilde",
    "a/b": "slash",
    "": "empty key",
    "files": [{"content": "first"}, {"content": "second"}],
    "obj": {"z": 1, "y": [2]},
    "text": "plain",
}


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("", DOCUMENT),
        ("/", "empty key"),
        ("/a~0b", "tilde"),
        ("/a~1b", "slash"),
        ("/files/0/content", "first"),
        ("/files/1/content", "second"),
        ("/obj", {"z": 1, "y": [2]}),
        ("/obj/y/0", 2),
    ],
)
def test_pointers_resolve_per_rfc_6901(pointer: str, expected: Any) -> None:
    assert resolve_pointer(DOCUMENT, pointer) == expected


@pytest.mark.parametrize(
    "pointer",
    [
        "/missing",
        "/files/01/content",  # leading zero
        "/files/-/content",  # "-" names no element when reading
        "/files/2/content",  # out of range
        "/files/+1/content",
        "/files/ 1/content",
        "/files/content",  # key on an array
        "/text/0",  # into a string
        "/obj/y/0/deeper",  # into a number
        "/a~2b",  # bad escape
        "/a~",  # dangling escape
        "text",  # no leading slash
        "#/text",  # URI fragment form
    ],
)
def test_pointers_that_do_not_resolve_are_refused_with_the_pointer(pointer: str) -> None:
    error = refusal(lambda: resolve_pointer(DOCUMENT, pointer))
    assert error.code == Code.DOC_CONTENT_POINTER_INVALID
    assert error.facts == {"pointer": pointer}


def test_a_pointer_to_a_nested_object_hashes_its_canonical_json() -> None:
    check = check_write_documents(spec(write=("/obj",)), DOCUMENT)
    assert check.hashes[0].hash == sha(b'{"y":[2],"z":1}')


def test_the_seed_example_pointers_hash_every_item_in_spec_order() -> None:
    seed = spec(write=("/body", "/files/0/content"))
    check = check_write_documents(seed, {"body": "PR body", "files": [{"content": "x = 1\n"}]})
    assert check == DocumentCheck(
        (
            DocumentHash("/body", sha(b"PR body"), 7),
            DocumentHash("/files/0/content", sha(b"x = 1\n"), 6),
        ),
        13,
    )


def test_a_write_pointer_missing_from_the_arguments_is_refused() -> None:
    seed = spec(write=("/body", "/files/0/content"))
    error = refusal(lambda: check_write_documents(seed, {"body": "b", "files": []}))
    assert (error.code, error.facts) == (
        Code.DOC_CONTENT_POINTER_INVALID,
        {"pointer": "/files/0/content"},
    )


# --- size limits ------------------------------------------------------------------------


def size_refusal(check: Any) -> tuple[Code, dict[str, Any]]:
    error = refusal(check)
    return error.code, error.facts


@pytest.mark.parametrize(
    ("encoding", "make"),
    [
        ("utf8", lambda n: "x" * n),
        ("base64", lambda n: base64.b64encode(b"\x00" * n).decode()),
        ("utf8", lambda n: "\u00e9" * (n // 2) + "x" * (n % 2)),
        ("utf8", lambda n: ["x" * (n - 4)]),  # canonical JSON '["..."]' is n bytes
    ],
    ids=["ascii", "base64", "non-ascii", "canonical-json"],
)
@pytest.mark.parametrize("limit", [8, 9, 1000, 1001])
def test_an_item_exactly_at_the_write_limit_passes_and_one_byte_more_is_refused(
    encoding: str, make: Any, limit: int
) -> None:
    limited = spec(encoding, max_write=limit)
    at_limit = check_write_documents(limited, {"content": make(limit)})
    assert at_limit.batch_total_bytes == limit
    assert size_refusal(lambda: check_write_documents(limited, {"content": make(limit + 1)})) == (
        Code.DOC_SIZE_EXCEEDED,
        {
            "limit_name": "max_write_bytes",
            "limit_bytes": limit,
            "actual_bytes": limit + 1,
            "pointer": "/content",
        },
    )


def test_an_oversized_non_ascii_string_reports_its_exact_utf8_size() -> None:
    text = "\u20ac" * 3000 + "\U0001d11e"  # 9000 + 4 bytes, 3001 characters
    facts = size_refusal(lambda: check_write_documents(spec(max_write=100), {"content": text}))[1]
    assert facts["actual_bytes"] == len(text.encode("utf-8")) == 9004
    # Fewer characters than the limit, more bytes: refused with the exact size too.
    facts = size_refusal(lambda: check_write_documents(spec(max_write=4000), {"content": text}))[1]
    assert facts["actual_bytes"] == 9004


def test_the_batch_limit_counts_every_item_of_the_call() -> None:
    two = spec(write=("/a", "/b"), max_write=10, max_batch=15)
    assert check_write_documents(two, {"a": "x" * 10, "b": "y" * 5}).batch_total_bytes == 15
    assert size_refusal(lambda: check_write_documents(two, {"a": "x" * 10, "b": "y" * 6})) == (
        Code.DOC_SIZE_EXCEEDED,
        {"limit_name": "max_batch_bytes", "limit_bytes": 15, "actual_bytes": 16, "pointer": "/b"},
    )


def test_the_batch_limit_applies_to_base64_before_decoding() -> None:
    two = spec("base64", write=("/a", "/b"), max_write=10, max_batch=15)
    encode = base64.b64encode
    args = {"a": encode(b"\x01" * 10).decode(), "b": encode(b"\x02" * 6).decode()}
    assert size_refusal(lambda: check_write_documents(two, args))[1]["actual_bytes"] == 16


def test_read_content_is_limited_by_max_read_bytes_and_the_batch() -> None:
    reader = spec(write=(), read=("/content", "/more"), max_read=5, max_batch=8)
    check = check_read_documents(reader, {"content": "12345", "more": "678", "path": "a.md"})
    assert check == DocumentCheck(
        (DocumentHash("/content", sha(b"12345"), 5), DocumentHash("/more", sha(b"678"), 3)), 8
    )
    assert size_refusal(
        lambda: check_read_documents(reader, {"content": "123456", "more": ""})
    ) == (
        Code.DOC_SIZE_EXCEEDED,
        {
            "limit_name": "max_read_bytes",
            "limit_bytes": 5,
            "actual_bytes": 6,
            "pointer": "/content",
        },
    )
    assert (
        size_refusal(lambda: check_read_documents(reader, {"content": "12345", "more": "6789"}))[1][
            "limit_name"
        ]
        == "max_batch_bytes"
    )


def test_a_tool_without_a_spec_has_no_documents() -> None:
    assert check_read_documents(None, {"content": "x"}) == EMPTY_CHECK
    assert check_write_documents(None, {"content": "x"}) == EMPTY_CHECK


# --- expected hashes --------------------------------------------------------------------


def test_matching_expected_hashes_pass() -> None:
    check = check_write_documents(spec(), {"content": "Hello World"}, {"/content": HELLO_SHA})
    assert check.hashes[0].hash == HELLO_SHA


@pytest.mark.parametrize(
    ("the_spec", "expected", "facts"),
    [
        (spec(), {"/content": sha(b"Hello World\n")}, {"pointer": "/content"}),
        (spec(), {"/content": HELLO_SHA.upper()}, {"pointer": "/content"}),
        (spec(), {"/other": HELLO_SHA}, {"reason": "pointer_not_in_spec"}),
        (
            spec(write=(), read=("/content",)),
            {"/content": HELLO_SHA},
            {"reason": "pointer_not_in_spec"},
        ),
        (None, {"/content": HELLO_SHA}, {"reason": "no_document_spec"}),
    ],
    ids=["different-content", "uppercase-hex", "unknown-pointer", "read-spec", "no-spec"],
)
def test_expected_hashes_that_do_not_match_refuse_before_the_tool_runs(
    the_spec: DocumentSpec | None, expected: dict[str, str], facts: dict[str, str]
) -> None:
    error = refusal(lambda: check_write_documents(the_spec, {"content": "Hello World"}, expected))
    assert (error.code, error.facts) == (Code.DOC_HASH_MISMATCH, facts)


def test_only_the_pointers_with_an_expected_hash_are_compared() -> None:
    two = spec(write=("/a", "/b"))
    check = check_write_documents(two, {"a": "Hello World", "b": "other"}, {"/a": HELLO_SHA})
    assert [item.pointer for item in check.hashes] == ["/a", "/b"]


def test_expected_hashes_parse_from_the_wire_list() -> None:
    wire = [{"pointer": "/content", "hash": HELLO_SHA}, {"pointer": "/a~1b", "hash": "0" * 64}]
    assert parse_expected_hashes(wire) == {"/content": HELLO_SHA, "/a~1b": "0" * 64}
    assert parse_expected_hashes(None) == {}
    assert parse_expected_hashes([]) == {}


@pytest.mark.parametrize(
    "meta",
    [
        {"/content": HELLO_SHA},
        "not a list",
        [["/content", HELLO_SHA]],
        [{"pointer": "/content"}],
        [{"pointer": "/content", "hash": HELLO_SHA, "size_bytes": 11}],
        [{"pointer": "/content", "hash": HELLO_SHA.upper()}],
        [{"pointer": "/content", "hash": HELLO_SHA[:63]}],
        [{"pointer": "/content", "hash": HELLO_SHA + "\n"}],
        [{"pointer": "$.content", "hash": HELLO_SHA}],
        [{"pointer": "/a~2", "hash": HELLO_SHA}],
        [{"pointer": "/" + "x" * 1024, "hash": HELLO_SHA}],
        [{"pointer": 7, "hash": HELLO_SHA}],
        [{"pointer": "/c", "hash": HELLO_SHA}, {"pointer": "/c", "hash": HELLO_SHA}],
        [{"pointer": f"/{i}", "hash": HELLO_SHA} for i in range(MAX_EXPECTED_HASHES + 1)],
    ],
)
def test_malformed_expected_hashes_are_invalid_input_naming_the_meta_field(meta: Any) -> None:
    error = refusal(lambda: parse_expected_hashes(meta))
    assert (error.code, error.facts) == (
        Code.INVALID_INPUT,
        {"field": "nexus.mcp/expected_document_hashes"},
    )


# --- records ----------------------------------------------------------------------------


def test_a_tool_effect_carries_the_hashes_and_validates_against_its_contract() -> None:
    check = check_write_documents(spec(write=("/a", "/b")), {"a": "Hello World", "b": "xyz"})
    effect = build_tool_effect(
        check,
        tool_call_id=UUID7,
        server_id="nexus",
        tool_name="nexus_write_file",
        tool_class="write",
    )
    assert is_uuid7(effect["effect_id"])
    assert effect == {
        "effect_id": effect["effect_id"],
        "tool_call_id": UUID7,
        "server_id": "nexus",
        "tool_name": "nexus_write_file",
        "tool_class": "write",
        "document_hashes": [
            {"pointer": "/a", "hash": HELLO_SHA, "size_bytes": 11},
            {"pointer": "/b", "hash": sha(b"xyz"), "size_bytes": 3},
        ],
        "batch_total_bytes": 14,
        "content_hash_alg": "sha256",
    }
    assert find_contract_errors(TOOL_EFFECT_SCHEMA, effect) == []


def test_a_tool_effect_without_documents_validates_and_ids_are_unique() -> None:
    effects = [
        build_tool_effect(None, tool_call_id=UUID7, server_id="s", tool_name="t", tool_class="read")
        for _ in range(3)
    ]
    assert len({effect["effect_id"] for effect in effects}) == 3
    for effect in effects:
        assert (effect["document_hashes"], effect["batch_total_bytes"]) == ([], 0)
        assert find_contract_errors(TOOL_EFFECT_SCHEMA, effect) == []


def test_a_tool_call_record_validates_with_and_without_its_optional_fields() -> None:
    digest = sha(b'{"content":"Hello World"}')
    full = build_tool_call(
        server_id="nexus",
        tool_name="nexus_write_file",
        args_digest=digest,
        declared_class="write",
        idempotency_key="key-1",
        expected_hashes={"/content": HELLO_SHA},
    )
    minimal = build_tool_call(server_id="nexus", tool_name="nexus_glob", args_digest=digest)
    assert full["expected_document_hashes"] == [{"pointer": "/content", "hash": HELLO_SHA}]
    assert (full["tool_class"], full["idempotency_key"]) == ("write", "key-1")
    assert set(minimal) == {
        "tool_call_id",
        "server_id",
        "tool_name",
        "args_digest",
        "expected_document_hashes",
        "content_hash_alg",
    }
    assert is_uuid7(minimal["tool_call_id"])
    assert find_contract_errors(TOOL_CALL_SCHEMA, full) == []
    assert find_contract_errors(TOOL_CALL_SCHEMA, minimal) == []
