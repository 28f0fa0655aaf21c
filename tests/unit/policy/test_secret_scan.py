"""The detector behind output scanning: what it finds, what it cuts, and what it leaves."""

from __future__ import annotations

import hashlib

import pytest

from nexus_mcp.policy.secret_scan import SecretScanner, cut, marker

# Planted values: well-formed for their detector, valid for nothing.
AWS_KEY = "AKIA" + "IOSFODNN7Q2WZX4M"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzQ8vK3mN2p"
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
SLACK_TOKEN = "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
STRIPE_KEY = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
    "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2G5Jr9hYq6Q2GkNd2nVc1pQ8Bn7s\n"
    "q8ZkT2vL9xR4mN7pW1sY6uB3cJ5hF0gDq8ZkT2vL9xR4mN7pW1sY6uB3cJ5hF0gD\n"
    "-----END RSA PRIVATE KEY-----"
)
HIGH_ENTROPY = "c2VjcmV0IGtleSB3aXRoIGVudHJvcHkgWjl4UTd2TjJwTDhr"
SHA256 = hashlib.sha256(b"hello").hexdigest()
GIT_SHA = hashlib.sha1(b"commit", usedforsecurity=False).hexdigest()

scanner = SecretScanner()


def redact(text: str) -> str:
    return cut(text, scanner.spans(text))


@pytest.mark.parametrize(
    ("text", "secret", "kind"),
    [
        (f"aws_access_key_id = {AWS_KEY}\n", AWS_KEY, "aws_access_key"),
        (f'aws_secret_access_key = "{AWS_SECRET}"', AWS_SECRET, "aws_access_key"),
        (f"token: {GITHUB_TOKEN} end", GITHUB_TOKEN, "github_token"),
        (f"SLACK={SLACK_TOKEN}", SLACK_TOKEN, "slack_token"),
        (f"key {STRIPE_KEY}.", STRIPE_KEY, "stripe_access_key"),
        (f"Authorization: Bearer {JWT}", JWT, "json_web_token"),
        ("db = https://admin:s3cr3t-Pa55@db.internal/x", "s3cr3t-Pa55", "basic_auth_credentials"),
        (f'secret = "{HIGH_ENTROPY}"', HIGH_ENTROPY, "base64_high_entropy_string"),
        (f'api_secret = "{SHA256}"', SHA256, "hex_high_entropy_string"),
    ],
)
def test_each_planted_secret_is_replaced_by_its_marker_and_only_it(
    text: str, secret: str, kind: str
) -> None:
    redacted = redact(text)
    assert secret not in redacted
    assert marker(kind) in redacted
    assert redacted == text.replace(secret, marker(kind))


def test_a_private_key_goes_whole_from_its_begin_line_to_its_end_line() -> None:
    text = f"before\n{PEM}\nafter"
    assert redact(text) == f"before\n{marker('private_key')}\nafter"


def test_a_private_key_without_its_end_line_goes_to_the_end_of_the_text() -> None:
    truncated = PEM.rsplit("\n", 1)[0]
    assert redact(f"key:\n{truncated}") == f"key:\n{marker('private_key')}"


def test_a_private_key_inside_json_text_goes_whole_with_its_escaped_newlines() -> None:
    escaped = PEM.replace("\n", "\\n")
    redacted = redact(f'{{"key": "{escaped}"}}')
    assert "MIIEpAIBAAKCAQEA" not in redacted
    assert redacted == f'{{"key": "{marker("private_key")}"}}'


def test_every_occurrence_of_a_found_value_is_cut() -> None:
    text = f"{GITHUB_TOKEN}\nagain: {GITHUB_TOKEN}"
    assert GITHUB_TOKEN not in redact(text)


@pytest.mark.parametrize(
    "text",
    [
        f'"sha256": "{SHA256}"',
        f'commit "{GIT_SHA}"',
        # A random v4 uuid, written out: parallel workers must collect the same test ids.
        '"id": "c8f3b927-8718-4ef7-a5f6-0561541f1041"',
        "commit 'a1b2c3d4e5f'",
        'print("hello world"); x = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"',
        '"integrity": "sha512-z4PhNX7vuL3xVChQ1m2AB9Yg5AULVxXcg/SpIdNs6c5H0NE8'
        'XYXysP+DGNKHfuwvY7kxvUdBeoGlODJ6+SfaPg=="',
        "# A note\n\nThe *quick* brown fox. See https://example.com/a/b and `code`.\n",
        "def f(password):\n    return hash(password)\n",
        f"an unquoted random word in prose: {HIGH_ENTROPY}",
        "postgresql://user:...@db.internal/app and redis://:<password>@cache:6379",
    ],
)
def test_ordinary_text_digests_and_ids_are_left_alone(text: str) -> None:
    assert scanner.spans(text) == []


def test_a_structured_value_is_judged_whole_with_its_key_as_context() -> None:
    random_value = "q8ZkT2vL9xR4mN7pW1sY6uB3cJ5hF0gD"
    assert scanner.spans(random_value, key="api_token", whole=True)
    # An id, as detect-secrets' is_likely_id_string reads a ``*_id`` key.
    assert scanner.spans(random_value, key="effect_id", whole=True) == []
    assert scanner.spans(SHA256, key="sha256", whole=True) == []
    assert scanner.spans(GIT_SHA, key="commit_sha", whole=True) == []
    # A digest's shape under a secret's name is a hex key: flagged.
    assert scanner.spans(SHA256, key="client_secret", whole=True)
    assert scanner.spans("src/nexus_mcp/policy/output_scanning", key="path", whole=True) == []


def test_a_marker_is_no_secret_so_scanning_twice_changes_nothing() -> None:
    once = redact(f"{AWS_KEY} {PEM} {GITHUB_TOKEN} '{HIGH_ENTROPY}'")
    assert scanner.spans(once) == []


def test_the_limits_are_the_settings() -> None:
    strict = SecretScanner(base64_limit=3.0)
    text = '"Zx9Qw8Er7Ty6Ui5Op4"'
    assert scanner.spans(text) == []
    assert strict.spans(text)


def test_in_a_long_text_every_secret_is_found_wherever_it_stands() -> None:
    filler = "ordinary line of code = call(value, 'short') # AC SK gl -us aws\n" * 2000
    planted = [AWS_KEY, GITHUB_TOKEN, SLACK_TOKEN, STRIPE_KEY, JWT, f'"{HIGH_ENTROPY}"', PEM]
    text = (
        planted[0]
        + "\n"
        + ("\n" + filler).join(planted[1:])
        + "\n"
        + filler
        + AWS_SECRET.join(['aws_secret_access_key = "', '"'])
    )
    assert len(text) > 100_000
    redacted = redact(text)
    for secret in (AWS_KEY, GITHUB_TOKEN, SLACK_TOKEN, STRIPE_KEY, JWT, HIGH_ENTROPY, AWS_SECRET):
        assert secret not in redacted
    assert "MIIEpAIBAAKCAQEA" not in redacted
    assert redacted.count("ordinary line of code") == 2000 * 6  # five joins, one after
