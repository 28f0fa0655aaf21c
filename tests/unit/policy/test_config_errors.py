"""Configuration problems in plain words: the wording for each kind of value, unknown keys
with a guess, and that no value given ever appears, whatever it holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from nexus_mcp.policy.config_errors import (
    env_reference,
    format_problems,
    problems_from,
    safe_text,
    yaml_line,
)
from nexus_mcp.policy.upstreams import SecretValue

CANARY = "sk-canary-51d0"


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")

    depth: int = 1


class Shapes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    names: list[str] = []
    hosts: tuple[str, ...] = ()
    tags: set[str] = set()
    enabled: bool = False
    count: int = 0
    ratio: float = 0.5
    mode: Literal["dev", "prod"] = "prod"
    label: str = ""
    table: dict[str, int] = {}
    inner: Inner = Inner()
    folder: Path = Path()
    secret: SecretStr | None = None
    reference: SecretValue | None = None
    positive: float = Field(default=1.0, gt=0)
    at_least: int = Field(default=1, ge=1)
    below: float = Field(default=0.0, lt=10)
    at_most: int = Field(default=0, le=65535)
    filled: str = Field(default="x", min_length=1)
    short: str = Field(default="", max_length=8)
    hexed: str = Field(default="ab", pattern=r"^[0-9a-f]+$")
    slash: str = "/"

    @field_validator("slash")
    @classmethod
    def _slash(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value


class Required(BaseModel):
    name: str


def words(model: type[BaseModel], data: Any) -> list[str]:
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return [text for _, text in problems_from(exc, model)]
    raise AssertionError("accepted")


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("names", CANARY, "`names` should be a list"),
        ("hosts", CANARY, "`hosts` should be a list"),
        ("tags", CANARY, "`tags` should be a list"),
        ("enabled", CANARY, "`enabled` should be true or false"),
        ("count", CANARY, "`count` should be a whole number"),
        ("count", 1.5, "`count` should be a whole number"),
        ("ratio", CANARY, "`ratio` should be a number"),
        ("mode", CANARY, "`mode` should be one of: dev, prod"),
        ("label", 5, "`label` should be text"),
        ("table", CANARY, "`table` should be a mapping (key: value)"),
        ("inner", CANARY, "`inner` should be a mapping (key: value)"),
        ("folder", 5, "`folder` should be a path"),
        ("secret", 5, "`secret` should be text"),
        (
            "reference",
            5,
            "`reference` should be a secret reference: ${NAME}, {env: NAME} or {file: PATH}",
        ),
        ("positive", 0, "`positive` should be greater than 0"),
        ("at_least", 0, "`at_least` should be at least 1"),
        ("below", 10, "`below` should be less than 10"),
        ("at_most", 70000, "`at_most` should be at most 65535"),
        ("filled", "", "`filled` should not be empty"),
        ("short", CANARY, "`short` should have at most 8 characters"),
        ("hexed", CANARY, "`hexed` should match the pattern ^[0-9a-f]+$"),
        ("slash", CANARY, "`slash`: must start with '/'"),
    ],
)
def test_each_kind_of_value_has_its_plain_words_and_the_value_never_appears(
    field: str, value: Any, expected: str
) -> None:
    assert words(Shapes, {field: value}) == [expected]


def test_a_nested_key_is_dotted_and_list_items_are_indexed() -> None:
    assert words(Shapes, {"inner": {"depth": CANARY}, "names": ["a", 5]}) == [
        "`names[1]` should be text",
        "`inner.depth` should be a whole number",
    ]


def test_a_missing_key_is_required() -> None:
    assert words(Required, {}) == ["`name` is required"]


def test_a_reference_with_a_problem_inside_is_named_there_not_as_the_wrong_type() -> None:
    assert words(Shapes, {"reference": {"env": "not a name"}}) == [
        "`reference.env` should match the pattern ^[A-Za-z_][A-Za-z0-9_]*$"
    ]
    assert words(Shapes, {"reference": {"env": "A", "file": "b"}}) == [
        "`reference`: give exactly one of 'env' or 'file'"
    ]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("cuont", "unknown key `cuont`; did you mean `count`?"),
        ("Mode", "unknown key `Mode`; did you mean `mode`?"),
        ("zzz", "unknown key `zzz`"),
    ],
)
def test_an_unknown_key_gets_the_closest_name_as_a_guess(key: str, expected: str) -> None:
    assert words(Shapes, {key: CANARY}) == [expected]


def test_an_unknown_nested_key_is_named_with_its_place() -> None:
    assert words(Shapes, {"inner": {"dpeth": 2}}) == [
        "unknown key `inner.dpeth`; did you mean `inner.depth`?"
    ]


def test_a_key_that_is_not_text_is_named_as_text() -> None:
    assert words(Shapes, {5: 1}) == ["unknown key `5`"]


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[31mred", "\\x1b[31mred"),
        ("a\nb\rc\td", "a\\x0ab\\x0dc\\x09d"),
        ("\u202eevil", "\\u202eevil"),  # a right-to-left override
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("`tick`", "'tick'"),  # cannot close the quoting early
        ("caf\u00e9", "caf\u00e9"),  # printable text stays as it is
    ],
)
def test_a_key_is_printed_with_every_unprintable_character_escaped(raw: str, shown: str) -> None:
    assert safe_text(raw) == shown


def test_a_long_key_is_capped() -> None:
    assert safe_text("k" * 10_000) == "k" * 64 + "..."
    [line] = words(Shapes, {"\x1b" * 10_000: 1})
    assert "\x1b" not in line and len(line) < 400


def test_one_problem_is_one_line_and_several_get_a_count() -> None:
    assert format_problems(["a"]) == "a"
    assert format_problems(["a", "b", "a"]) == "invalid configuration (2 problems):\n  a\n  b"


def test_the_line_of_a_key_is_found_in_the_yaml() -> None:
    text = "mode: dev\nupstreams:\n  - server_id: fs\n    command: x\n  - server_id: web\n"
    assert yaml_line(text, ("mode",)) == 1
    assert yaml_line(text, ("upstreams", 0, "command")) == 4
    assert yaml_line(text, ("upstreams", 1)) == 5
    assert yaml_line(text, ("upstreams", 1, "absent")) == 5  # the closest place there is
    assert yaml_line("not: [valid", ("not",)) is None


@pytest.mark.parametrize(
    ("value", "name"),
    [("${GH_TOKEN}", "GH_TOKEN"), (" ${A} ", "A"), ("plain", None), (5, None), ("$GH", None)],
)
def test_a_secret_names_a_variable_only_as_the_whole_value(value: Any, name: str | None) -> None:
    assert env_reference(value) == name


@pytest.mark.parametrize("value", ["Bearer ${T}", "${A:-x}", "${A}${B}", "${1A}", "${}"])
def test_any_other_use_of_the_form_is_refused_rather_than_taken_as_the_secret(value: str) -> None:
    with pytest.raises(ValueError, match="whole value"):
        env_reference(value)
