"""Which list-changed notifications a caller is owed (policy/notifications.py)."""

from __future__ import annotations

from nexus_mcp.policy.notifications import (
    PROMPTS,
    RESOURCES,
    TOOLS,
    Existing,
    Granted,
    changed_kinds,
    fingerprint,
    visible_fingerprints,
)

EXISTING = Existing(
    tools=frozenset({"up_echo", "up_add", "nexus_read_file"}),
    prompts=frozenset({"up_greet", "up_review"}),
    resources=frozenset({"upstream://up/test://static/readme", "nexus://notes/a.md"}),
    templates=frozenset({"upstream://up/test://items/{id}"}),
)


def granted(
    tools: set[str] | None = None, prompts: set[str] | None = None, sources: set[str] | None = None
) -> Granted:
    return Granted(frozenset(tools or ()), frozenset(prompts or ()), frozenset(sources or ()))


def test_names_that_run_together_never_share_a_fingerprint() -> None:
    assert fingerprint(["ab", "c"]) != fingerprint(["a", "bc"])
    assert fingerprint(["a\nb"]) != fingerprint(["a", "b"])
    assert fingerprint(["b", "a", "a"]) == fingerprint(["a", "b"])
    assert fingerprint([]) != fingerprint([""])


def test_only_what_exists_and_is_granted_counts() -> None:
    alice = granted({"up_echo", "up_add", "up_ghost"}, {"up_greet"}, {"up"})
    before = visible_fingerprints(EXISTING, alice)
    # A grant of something that does not exist changes nothing she sees.
    more = granted({"up_echo", "up_add", "up_ghost", "up_other"}, {"up_greet", "x"}, {"up", "z"})
    assert changed_kinds(before, visible_fingerprints(EXISTING, more)) == ()
    # Her tool quarantined: only the tools changed.
    gone = Existing(
        tools=EXISTING.tools - {"up_echo"},
        prompts=EXISTING.prompts,
        resources=EXISTING.resources,
        templates=EXISTING.templates,
    )
    assert changed_kinds(before, visible_fingerprints(gone, alice)) == (TOOLS,)


def test_what_another_caller_sees_never_counts() -> None:
    bob = granted({"nexus_read_file"}, set(), {"notes"})
    before = visible_fingerprints(EXISTING, bob)
    gone = Existing(
        tools=EXISTING.tools - {"up_echo"},
        prompts=frozenset(),
        resources=EXISTING.resources - {"upstream://up/test://static/readme"},
        templates=frozenset(),
    )
    assert changed_kinds(before, visible_fingerprints(gone, bob)) == ()


def test_resources_and_templates_are_one_kind_by_their_source() -> None:
    reader = granted(sources={"up"})
    before = visible_fingerprints(EXISTING, reader)
    no_template = Existing(
        tools=EXISTING.tools, prompts=EXISTING.prompts, resources=EXISTING.resources
    )
    assert changed_kinds(before, visible_fingerprints(no_template, reader)) == (RESOURCES,)
    # A template whose text equals a resource's URI is still another item.
    swapped = Existing(
        resources=frozenset({"upstream://up/test://items/{id}"}),
        templates=frozenset({"upstream://up/test://static/readme"}),
    )
    plain = Existing(
        resources=frozenset({"upstream://up/test://static/readme"}),
        templates=frozenset({"upstream://up/test://items/{id}"}),
    )
    assert changed_kinds(
        visible_fingerprints(plain, reader), visible_fingerprints(swapped, reader)
    ) == (RESOURCES,)


def test_every_kind_in_order_and_nothing_without_a_before() -> None:
    before = visible_fingerprints(EXISTING, granted({"up_echo"}, {"up_greet"}, {"up"}))
    after = visible_fingerprints(Existing(), granted({"up_echo"}, {"up_greet"}, {"up"}))
    assert changed_kinds(before, after) == (TOOLS, PROMPTS, RESOURCES)
    assert changed_kinds(None, after) == ()
