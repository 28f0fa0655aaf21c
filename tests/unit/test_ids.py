"""UUIDv7 ids: canonical form, RFC 9562 layout, creation order."""

from __future__ import annotations

import time
import uuid

from nexus_mcp.ids import is_uuid7, new_id


def test_new_id_is_the_canonical_string_of_a_version_7_rfc_uuid() -> None:
    for _ in range(1000):
        value = new_id()
        assert is_uuid7(value)
        parsed = uuid.UUID(value)
        assert str(parsed) == value
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122


def test_ids_carry_the_current_unix_millisecond() -> None:
    before = time.time_ns() // 1_000_000
    value = uuid.UUID(new_id())
    after = time.time_ns() // 1_000_000
    # The monotonic guard may move at most a few ms ahead when many ids share a millisecond.
    assert before <= value.int >> 80 <= after + 2


def test_ids_sort_in_creation_order_even_within_one_millisecond() -> None:
    ids = [new_id() for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
