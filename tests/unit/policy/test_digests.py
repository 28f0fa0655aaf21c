"""Piecewise document digests: the same sizes, hashes and refusals as the one-shot forms.

``policy/digests.py`` encodes (or decodes) a large value in pieces and, with two cores,
hashes each piece on a worker thread. These tests shrink the pieces and thresholds to a
few characters so that small drawn values cross many piece boundaries on both the
single-threaded and the threaded path, and compare every outcome with the one-shot form:
``sha256(text.encode("utf-8"))``, ``sha256(pybase64.b64decode(text, validate=True))``,
and, for whole calls, the document pipeline as it was before pieces (``one_shot_check``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pybase64
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexus_mcp.errors import Code, NexusError
from nexus_mcp.policy import digests
from nexus_mcp.policy.digests import digest_base64, digest_utf8
from nexus_mcp.policy.documents import DocumentCheck, DocumentHash, check_write_documents
from nexus_mcp.policy.hashing import to_canonical_json
from nexus_mcp.policy.registry import DocumentSpec

# Every UTF-8 length (1 to 4 bytes), non-BMP characters included; no lone surrogates.
CHARACTERS = st.one_of(
    st.characters(max_codepoint=0x7F),
    st.characters(min_codepoint=0x80, max_codepoint=0x7FF),
    st.characters(min_codepoint=0x800, max_codepoint=0xFFFF, exclude_categories=("Cs",)),
    st.characters(min_codepoint=0x10000),
)
TEXT = st.text(CHARACTERS, max_size=40)
SURROGATE = st.characters(categories=("Cs",))
# (characters per piece, cores): one core hashes on the calling thread, two on the worker.
PIECES = st.tuples(st.integers(min_value=1, max_value=9), st.sampled_from([1, 2]))
# Base64 is cut at whole quanta: pieces of 4 to 36 characters.
QUANTA_PIECES = st.tuples(
    st.integers(min_value=4, max_value=36).map(lambda n: n - n % 4), st.just(1)
)


@contextmanager
def pieces_of(chars: int, cores: int) -> Iterator[None]:
    """Every value piecewise, in pieces of ``chars`` characters (for base64, a multiple of 4)."""
    with mock.patch.multiple(
        digests,
        PIECE_CHARS=chars,
        ASCII_PIECEWISE_MIN_CHARS=0,
        BASE64_PIECEWISE_MIN_CHARS=0,
        THREADED_MIN_CHARS=0,
        _CORES=cores,
    ):
        yield


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- UTF-8 ------------------------------------------------------------------------------


@given(TEXT, PIECES)
def test_any_text_digests_as_its_one_shot_utf8_encoding_across_piece_boundaries(
    text: str, pieces: tuple[int, int]
) -> None:
    encoded = text.encode("utf-8")
    with pieces_of(*pieces):
        assert digest_utf8(text, limit=1 << 30) == (len(encoded), sha(encoded))


@given(TEXT, st.integers(min_value=0, max_value=170), PIECES)
def test_the_size_is_exact_whatever_the_limit_and_the_hash_is_given_only_within_it(
    text: str, limit: int, pieces: tuple[int, int]
) -> None:
    encoded = text.encode("utf-8")
    with pieces_of(*pieces):
        size, digest = digest_utf8(text, limit)
    assert size == len(encoded)
    assert digest == (sha(encoded) if size <= limit else None)


@given(TEXT, SURROGATE, TEXT, st.integers(min_value=0, max_value=170), PIECES)
def test_a_lone_surrogate_anywhere_is_refused_whatever_the_limit(
    before: str, surrogate: str, after: str, limit: int, pieces: tuple[int, int]
) -> None:
    with pieces_of(*pieces), pytest.raises(UnicodeEncodeError):
        digest_utf8(before + surrogate + after, limit)


def test_a_surrogate_pair_written_as_two_code_points_is_two_lone_surrogates() -> None:
    # JSON's "\ud83d\ude00" reads as two code points; whole or in pieces cut between
    # them, neither has a UTF-8 encoding.
    for chars in (1, 2, 3):
        with pieces_of(chars, 2), pytest.raises(UnicodeEncodeError):
            digest_utf8("ab\ud83d\ude00cd", 1 << 30)


def test_the_default_pieces_give_the_one_shot_digest_of_a_large_text() -> None:
    text = ("caf\u00e9 \u2713 \U0001d11e " * 200_000)[: digests.THREADED_MIN_CHARS * 2 + 5]
    encoded = text.encode("utf-8")
    assert len(text) >= digests.THREADED_MIN_CHARS
    assert digest_utf8(text, 1 << 30) == (len(encoded), sha(encoded))
    assert digest_utf8(text, len(encoded) - 1) == (len(encoded), None)
    assert digest_utf8(text, len(text) - 1) == (len(encoded), None)


def test_the_default_pieces_give_the_one_shot_digest_of_large_ascii_and_base64() -> None:
    text = ("# notes\n- [x] item\n" * 200_000)[: digests.ASCII_PIECEWISE_MIN_CHARS + 7]
    assert digest_utf8(text, 1 << 30) == (len(text), sha(text.encode()))
    data = (bytes(range(256)) * 20_000)[: digests.BASE64_PIECEWISE_MIN_CHARS // 4 * 3 + 1]
    encoded = base64.b64encode(data).decode("ascii")
    assert len(encoded) >= digests.BASE64_PIECEWISE_MIN_CHARS
    assert digest_base64(encoded) == (len(data), sha(data))


# --- base64 -----------------------------------------------------------------------------


@given(st.binary(max_size=64), QUANTA_PIECES)
def test_any_bytes_digest_as_their_one_shot_strict_decoding_across_piece_boundaries(
    data: bytes, pieces: tuple[int, int]
) -> None:
    with pieces_of(*pieces):
        assert digest_base64(base64.b64encode(data).decode("ascii")) == (len(data), sha(data))


def one_shot_base64(text: str) -> tuple[int, str] | None:
    try:
        data = pybase64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return len(data), sha(data)


def piecewise_base64(text: str) -> tuple[int, str] | None:
    try:
        return digest_base64(text)
    except (binascii.Error, ValueError):
        return None


# Valid base64 with one character replaced or inserted: padding in the middle, the URL
# alphabet, whitespace, non-ASCII, data after the padding, a length off by one.
@given(
    st.binary(max_size=48),
    st.integers(min_value=0, max_value=70),
    st.sampled_from(["=", "==", "-", "_", " ", "\n", "*", "\u00e9", "A", "AAAA", ""]),
    st.booleans(),
    QUANTA_PIECES,
)
def test_strict_base64_refuses_in_pieces_exactly_what_it_refuses_whole(
    data: bytes, at: int, junk: str, replace: bool, pieces: tuple[int, int]
) -> None:
    valid = base64.b64encode(data).decode("ascii")
    at = min(at, len(valid))
    text = valid[:at] + junk + valid[at + (1 if replace else 0) :]
    with pieces_of(*pieces):
        assert piecewise_base64(text) == one_shot_base64(text)


# --- whole calls: the pipeline as it was ------------------------------------------------


def one_shot_check(spec: DocumentSpec, arguments: dict[str, Any]) -> DocumentCheck | tuple:
    """check_write_documents before pieces: one encode (or decode), one hash, per item."""
    hashes, total = [], 0
    for pointer in spec.write_content_pointers:
        value = arguments[pointer[1:]]

        def over(size: int, total: int = total, pointer: str = pointer) -> tuple | None:
            if size > spec.max_write_bytes:
                return (Code.DOC_SIZE_EXCEEDED, "max_write_bytes", size, pointer)
            if total + size > spec.max_batch_bytes:
                return (Code.DOC_SIZE_EXCEEDED, "max_batch_bytes", total + size, pointer)
            return None

        if spec.content_encoding == "base64":
            if len(value) % 4 or not value.isascii():
                return (Code.DOC_ENCODING_INVALID, pointer)
            padding = 2 if value.endswith("==") else 1 if value.endswith("=") else 0
            refused = over(len(value) // 4 * 3 - padding)
            if refused:
                return refused
            try:
                data = pybase64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                return (Code.DOC_ENCODING_INVALID, pointer)
        else:
            if value.isascii() and over(len(value)):
                return over(len(value))  # type: ignore[return-value]
            try:
                data = value.encode("utf-8")
            except UnicodeEncodeError:
                return (Code.DOC_ENCODING_INVALID, pointer)
        refused = over(len(data))
        if refused:
            return refused
        total += len(data)
        hashes.append(DocumentHash(pointer, sha(data), len(data)))
    return DocumentCheck(tuple(hashes), total)


def outcome(spec: DocumentSpec, arguments: dict[str, Any]) -> DocumentCheck | tuple:
    try:
        return check_write_documents(spec, arguments)
    except NexusError as error:
        facts = error.facts
        if error.code == Code.DOC_SIZE_EXCEEDED:
            return (error.code, facts["limit_name"], facts["actual_bytes"], facts["pointer"])
        return (error.code, facts["pointer"])


TEXT_OR_SURROGATES = st.text(st.one_of(CHARACTERS, SURROGATE), max_size=30)
BASE64_TEXT = st.one_of(
    st.binary(max_size=30).map(lambda data: base64.b64encode(data).decode("ascii")),
    st.text(st.sampled_from("AQgw+/=-*\u00e9"), max_size=24),
)


@given(
    st.sampled_from(["utf8", "base64"]),
    st.data(),
    st.integers(min_value=0, max_value=60),
    st.integers(min_value=0, max_value=90),
    PIECES,
)
def test_a_call_is_measured_and_refused_exactly_as_by_the_one_shot_pipeline(
    encoding: str, data: st.DataObject, item_limit: int, batch_limit: int, pieces: Any
) -> None:
    strategy = TEXT_OR_SURROGATES if encoding == "utf8" else BASE64_TEXT
    values = data.draw(st.lists(strategy, min_size=1, max_size=3))
    pointers = tuple(f"/v{index}" for index in range(len(values)))
    arguments = {pointer[1:]: value for pointer, value in zip(pointers, values, strict=True)}
    spec = DocumentSpec(encoding, pointers, (), 1 << 30, item_limit, batch_limit)  # type: ignore[arg-type]
    chars, cores = pieces
    with pieces_of(chars if encoding == "utf8" else 4 * chars, cores):
        assert outcome(spec, arguments) == one_shot_check(spec, arguments)


# --- reading no further than needed ------------------------------------------------------


class Watched(str):
    """A str that records how far the code sliced it, and whether it encoded it whole."""

    reached: int = 0
    encoded_whole: bool = False

    def __getitem__(self, key: Any) -> str:
        if isinstance(key, slice):
            self.reached = max(self.reached, min(key.stop, len(self)))
        return str.__getitem__(self, key)

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        self.encoded_whole = True
        return str.encode(self, *args, **kwargs)


def spec(encoding: str = "utf8", max_write: int = 1 << 20) -> DocumentSpec:
    return DocumentSpec(encoding, ("/content",), (), 1 << 30, max_write, 1 << 30)  # type: ignore[arg-type]


def refused_code(spec: DocumentSpec, value: str) -> Code:
    with pytest.raises(NexusError) as caught:
        check_write_documents(spec, {"content": value})
    return caught.value.code


@pytest.mark.parametrize("encoding", ["utf8", "base64"])
def test_an_oversized_ascii_or_base64_value_is_refused_before_any_piece_is_made(
    encoding: str,
) -> None:
    value = Watched("QUJD" * 100)
    with pieces_of(8, 2):
        assert refused_code(spec(encoding, max_write=10), value) == Code.DOC_SIZE_EXCEEDED
    assert (value.reached, value.encoded_whole) == (0, False)


@pytest.mark.parametrize("bad", ["*", "=", "==", "QQ=="])
def test_invalid_base64_in_the_first_piece_stops_the_decoding_there(bad: str) -> None:
    value = Watched(bad + "A" * (400 - len(bad)))
    with pieces_of(8, 2):
        assert refused_code(spec("base64"), value) == Code.DOC_ENCODING_INVALID
    assert value.reached == 8


def test_a_lone_surrogate_in_the_first_piece_stops_the_encoding_there() -> None:
    value = Watched("\ud800" + "\u00e9" * 400)
    with pieces_of(8, 2):
        assert refused_code(spec(), value) == Code.DOC_ENCODING_INVALID
    assert value.reached == 8


def test_an_oversized_non_ascii_text_is_counted_to_its_end_to_name_its_exact_size() -> None:
    # The refusal names the exact UTF-8 size and a later lone surrogate still wins, as
    # before pieces: so the count reads on, but hashes nothing past the limit.
    value = Watched("\u00e9" * 400)
    with pieces_of(8, 2), pytest.raises(NexusError) as caught:
        check_write_documents(spec(max_write=100), {"content": value})
    assert caught.value.facts["actual_bytes"] == 800
    assert value.reached == 400
    late = Watched("\u00e9" * 400 + "\udfff")
    with pieces_of(8, 2):
        assert refused_code(spec(max_write=100), late) == Code.DOC_ENCODING_INVALID


# --- the worker thread ------------------------------------------------------------------


def test_an_error_on_the_worker_is_raised_in_the_caller_and_the_worker_lives_on() -> None:
    pieces = iter([b"x" * 5000, "not bytes", b"y" * 5000])
    with mock.patch.object(digests, "_CORES", 2), pytest.raises(TypeError):
        digests._digest_pieces(pieces, 1 << 30, threaded=True)  # type: ignore[arg-type]
    with pieces_of(3, 2):
        assert digest_utf8("still hashing \u2713", 100) == (
            17,
            sha("still hashing \u2713".encode()),
        )


def test_when_handing_over_stops_paying_the_rest_is_hashed_on_the_calling_thread() -> None:
    # As when other processes keep the second core busy: the caller waited longer than
    # the worker hashed. The one piece handed over is hashed before the rest, in order.
    text = "caf\u00e9 \U0001d11e " * 40
    feed = digests._Stream.feed
    with (
        pieces_of(7, 2),
        mock.patch.object(digests, "HAND_OFF_ALLOWANCE", -1.0),
        mock.patch.object(digests._Stream, "feed", autospec=True, side_effect=feed) as fed,
    ):
        assert digest_utf8(text, 1 << 30) == (len(text.encode()), sha(text.encode()))
    assert fed.call_count == 1


def test_callers_on_several_threads_share_the_worker_and_each_gets_its_own_digest() -> None:
    texts = [f"{index} caf\u00e9 \U0001d11e " * (50 + index) for index in range(16)]
    with pieces_of(7, 2), ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda text: digest_utf8(text, 1 << 30), texts))
    assert results == [(len(t.encode()), sha(t.encode())) for t in texts]


def test_a_worker_thread_that_stopped_is_replaced() -> None:
    with pieces_of(3, 2):
        digest_utf8("start the worker \u2713", 100)
        worker = digests._worker()
        with mock.patch.object(worker.thread, "is_alive", return_value=False):
            replacement = digests._worker()
        assert replacement is not worker
        text = "hashed by the new one \u2713"
        assert digest_utf8(text, 100)[1] == sha(text.encode())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_starts_its_own_worker_instead_of_waiting_on_the_parents() -> None:
    with pieces_of(3, 2):
        digest_utf8("the parent's worker runs \u2713", 100)
        with warnings.catch_warnings():
            # Python 3.12+ warns on fork with threads running: that case is this test's.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports by exit status only
            ok = digest_utf8("the child \u2713", 100) == (13, sha("the child \u2713".encode()))
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung on its parent's worker")


def test_one_core_hashes_on_the_calling_thread() -> None:
    before = threading.active_count()
    with mock.patch.multiple(digests, _WORKER=None, _CORES=1):
        with pieces_of(3, 1):
            assert digest_utf8("no worker \u2713", 100) == (13, sha("no worker \u2713".encode()))
        assert digests._WORKER is None
    assert threading.active_count() == before


def test_canonical_json_of_a_non_string_is_not_cut_into_pieces() -> None:
    with pieces_of(2, 2):
        check = check_write_documents(spec(), {"content": {"b": [1, 2], "a": "\u00e9"}})
    canonical = to_canonical_json({"b": [1, 2], "a": "\u00e9"})
    assert check.hashes == (DocumentHash("/content", sha(canonical), len(canonical)),)


def test_on_two_cores_ascii_and_base64_are_hashed_on_the_worker_too() -> None:
    # The overlap repays the hand-offs for an ASCII copy and a base64 decode as well
    # (module docstring); the results stay the one-shot forms'.
    text = "# notes\n- [x] item\n" * 30
    data = bytes(range(256)) * 3
    encoded = base64.b64encode(data).decode()
    feed = digests._Stream.feed
    with (
        mock.patch.multiple(digests, PIECE_CHARS=16, THREADED_MIN_CHARS=64, _CORES=2),
        mock.patch.object(digests._Stream, "feed", autospec=True, side_effect=feed) as fed,
    ):
        assert digest_utf8(text, 1 << 30) == (len(text), sha(text.encode()))
        handed_text = fed.call_count
        assert digest_base64(encoded) == (len(data), sha(data))
    assert handed_text > 1
    assert fed.call_count > handed_text


def test_on_one_core_ascii_and_base64_below_their_own_thresholds_are_made_whole() -> None:
    text = "# notes\n- [x] item\n" * 30
    data = bytes(range(256)) * 3
    encoded = base64.b64encode(data).decode()
    with (
        mock.patch.multiple(
            digests,
            PIECE_CHARS=16,
            THREADED_MIN_CHARS=64,
            ASCII_PIECEWISE_MIN_CHARS=len(text) + 1,
            BASE64_PIECEWISE_MIN_CHARS=len(encoded) + 1,
            _CORES=1,
        ),
        mock.patch.object(digests, "_digest_pieces", side_effect=AssertionError) as pieced,
    ):
        assert digest_utf8(text, 1 << 30) == (len(text), sha(text.encode()))
        assert digest_base64(encoded) == (len(data), sha(data))
    assert pieced.call_count == 0
