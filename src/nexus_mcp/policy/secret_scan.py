"""Finding secrets in text, and cutting them out: the detector behind output scanning.

The detection is detect-secrets' (Yelp, pinned in pyproject): its plugins' own regular
expressions, entropy measure, limits and heuristic filters, run in process on strings
(never on files, never through its global settings, never verifying a finding over the
network: ``verify`` is never called). What this module adds is what a gateway needs and
a commit hook does not:

- the span of every finding, so the match is replaced and nothing else; every other
  occurrence of a found value is cut too;
- a private key's whole block (detect-secrets reports only the ``BEGIN ... PRIVATE KEY``
  line), to its ``END`` line or, without one, to the end of the text;
- a cheap literal gate per plugin (``_GATES``), so a plugin whose token prefix is not in
  the text costs one substring search, and one that could backtrack on a long line
  (NPM's ``//.+/:_authToken``) only runs where its keyword is;
- digests are not secrets: a hex string of exactly 32, 40, 64 or 128 characters (MD5,
  git's SHA-1, SHA-256, SHA-512) and ``sha256-...`` subresource integrity values are
  what this gateway, git and lock files deliver everywhere, unless a secret word
  (``key``, ``secret``, ``token``, ``password``, ...) stands before it on its line;
- a structured value is also judged whole, as detect-secrets judges a JSON file's value
  (quoted), with its key as the line's context (``is_likely_id_string``: ``*_id`` keys);
- entropy candidates longer than ``MAX_ENTROPY_CHARS`` are data (an embedded image, a
  bundle), not a key.

High-entropy plugins keep detect-secrets' rule that a candidate in text is a quoted string
(``'...'`` or ``"..."``): an unquoted random-looking word in prose is not flagged. The
keyword detector (``password = ...``) is left out of the default set: on notes and code it
flags every assignment to a variable named like a secret. Discord's detector is left out
too: its token has no literal to gate on, and its expression alone costs a quarter of a
scan's time on code.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

from detect_secrets.filters.heuristic import (
    is_likely_id_string,
    is_not_alphanumeric_string,
    is_potential_uuid,
    is_sequential_string,
    is_templated_secret,
)
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import BasePlugin
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.high_entropy_strings import (
    Base64HighEntropyString,
    HexHighEntropyString,
    HighEntropyStringsPlugin,
)
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

from nexus_mcp.policy.redaction import (
    DEFAULT_BASE64_LIMIT,
    DEFAULT_HEX_LIMIT,
    MIN_SCANNED_CHARS,
    REDACTED_PREFIX,
    Span,
    cut,
    marker,
    secret_slug,
)

MAX_ENTROPY_CHARS = 1024

# Substrings one of which must be in the text for the plugin to run (None: always runs);
# matched case-insensitively where the plugin's own expression is.
_GATES: dict[type[BasePlugin], tuple[tuple[str, ...] | None, bool]] = {
    PrivateKeyDetector: (("PRIVATE KEY", "PuTTY-User-Key-File"), False),
    # Its key id is upper case; "aws" (its second expression ignores case) as people write it.
    AWSKeyDetector: (("A3T", "ABIA", "ACCA", "AKIA", "ASIA", "aws", "AWS", "Aws"), False),
    AzureStorageKeyDetector: (("AccountKey=",), False),
    BasicAuthDetector: (("://",), False),
    GitHubTokenDetector: (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), False),
    GitLabTokenDetector: (("gl", "GR1348941"), False),
    JwtTokenDetector: (("eyJ",), False),
    MailchimpDetector: (("-us",), False),
    NpmDetector: (("_authToken",), False),
    OpenAIDetector: (("T3BlbkFJ",), False),
    PypiTokenDetector: (("pypi-",), False),
    SendGridDetector: (("SG.",), False),
    SlackDetector: (("xox", "hooks.slack.com"), True),
    SquareOAuthDetector: (("sq0csp-",), False),
    StripeDetector: (("k_live_",), False),
    TwilioKeyDetector: (("AC", "SK"), False),
}

# A private key's block: the header detect-secrets matched through to its END line.
_KEY_BLOCK = re.compile(
    r"-{4,5} ?BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)? ?-{4,5}.*?"
    r"(?:-{4,5} ?END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)? ?-{4,5}|\Z)"
    r"|PuTTY-User-Key-File-\d.*?(?:Private-MAC: *[0-9a-fA-F]+|\Z)",
    re.DOTALL,
)
_GROUPED = (AWSKeyDetector, BasicAuthDetector, NpmDetector)
_JWT_TAIL = re.compile(r"[A-Za-z0-9_=+/-]*")
# Shorter quoted hex is an abbreviated commit id or a colour far more often than a key
# (detect-secrets flags ``'a1b2c3d4e5f'``); hex keys are 32 characters and more.
MIN_HEX_CHARS = 20
_DIGEST_HEX_LENGTHS = frozenset({32, 40, 64, 128})
_SRI = re.compile(r"sha(?:256|384|512)-[A-Za-z0-9+/]+={0,2}")
_SECRET_WORD = re.compile(
    r"key|secret|token|passw|pwd|auth|credential|private|bearer", re.IGNORECASE
)
_WHOLE_VALUE_MIN_CHARS = 20
# Up to this length one pass over every gate word decides whether a string needs the
# plugins at all; over it, each plugin's gate is searched where the plugin is tried.
_QUICK_CHARS = 4096
# Over this length a plugin whose gate opens runs only where its gate words stand
# (``_windows``): a word such as "aws" once in a long file must not cost a whole scan.
_WINDOWED_CHARS = 16384
_WINDOW = 1100  # longer than any bounded token (GitLab's agent token: 1,024 and a prefix)
_MAX_WINDOWS = 256
# Their tokens may run as long as their line: a URL's user and password, NPM's registry
# line, a JWT.
_LINE_WIDE = (BasicAuthDetector, NpmDetector, JwtTokenDetector)
# detect-secrets' expressions that, tried at every start of theirs inside one run of their
# characters, scan that run again each time: quadratic on a long line ("eyJ" or "//" a
# hundred thousand times holds the event loop for minutes). A start inside the run an
# attempt failed on cannot match either (each expression's match from there is one from the
# earlier start too), so each run is tried once: the plugin's start word, and the run after
# it (NPM's ``.``: the rest of the line; JWT's and OpenAI's token characters).
_ONCE_PER_RUN: dict[type[BasePlugin], tuple[str, re.Pattern[str]]] = {
    NpmDetector: ("//", re.compile(r"[^\n]*")),
    JwtTokenDetector: ("eyJ", re.compile(r"[A-Za-z0-9_=-]*")),
    OpenAIDetector: ("sk-", re.compile(r"[A-Za-z0-9_-]*")),
}
# How far before an entropy candidate its "line" reaches for detect-secrets' heuristics: a
# line of a megabyte would be searched again for every candidate on it (quadratic).
_LINE_LOOKBACK = 512
# How many distinct found values of one detector are also searched for everywhere else in
# the text (``_elsewhere``); the others are cut where they were matched.
_MAX_SEARCHED_VALUES = 32


class SecretScanner:
    """detect-secrets' plugins with the limits and gates above; one per deployment."""

    def __init__(
        self, *, base64_limit: float = DEFAULT_BASE64_LIMIT, hex_limit: float = DEFAULT_HEX_LIMIT
    ) -> None:
        self._regex_plugins: tuple[tuple[BasePlugin, tuple[str, ...] | None, bool, str], ...] = (
            tuple(
                (
                    plugin_cls(),
                    None if gate is None else tuple(g.lower() if folded else g for g in gate),
                    folded,
                    secret_slug(str(plugin_cls.secret_type)),
                )
                for plugin_cls, (gate, folded) in _GATES.items()
            )
        )
        self._entropy: tuple[HighEntropyStringsPlugin, ...] = (
            Base64HighEntropyString(limit=base64_limit),
            HexHighEntropyString(limit=hex_limit),
        )
        self._whole = tuple(
            (plugin, re.compile(f"[{re.escape(plugin.charset)}]+")) for plugin in self._entropy
        )
        # n characters hold at most log2(n) bits each: shorter ones cannot pass the limit,
        # and most quoted words of code and prose are shorter (exact, and most of the cost).
        self._candidates = tuple(
            (
                plugin,
                charset,
                max(int(2**plugin.entropy_limit) + 1, MIN_HEX_CHARS if hexed else 0),
                secret_slug(str(plugin.secret_type)),
            )
            for (plugin, charset), hexed in zip(self._whole[::-1], (True, False), strict=True)
        )
        base64 = self._entropy[0]
        shortest = min(c[2] for c in self._candidates)
        self._quoted = re.compile(
            r"([\'\"])([" + re.escape(base64.charset) + "]{" + str(shortest) + r",})(\1)"
        )
        # Whether any plugin's gate is open, or the string holds a quote (entropy
        # candidates), for a short string: most strings of a structured result (names,
        # paths, dates) open none, and skip the per-plugin loop. Substring searches, as the
        # per-plugin gates below are: one alternation of these words in ``re`` tries every
        # word at every position (7x the cost on a 256-character text).
        self._quick_words = (
            "'",
            '"',
            *(w for _p, gate, folded, _k in self._regex_plugins if not folded for w in gate or ()),
        )
        self._quick_folded = tuple(
            w for _p, gate, folded, _k in self._regex_plugins if folded for w in gate or ()
        )

    def _any_gate(self, text: str) -> bool:
        # ``map`` over ``__contains__``: the loop over the words runs in C.
        if any(map(text.__contains__, self._quick_words)):
            return True
        return bool(self._quick_folded) and any(map(text.lower().__contains__, self._quick_folded))

    def spans(self, text: str, *, key: str | None = None, whole: bool = False) -> list[Span]:
        """The secrets in ``text``, merged and in order. ``whole``: ``text`` is one value of
        a structured result (under ``key``), also judged as a quoted value on its own."""
        if len(text) < MIN_SCANNED_CHARS:
            return []
        if len(text) <= _QUICK_CHARS and not self._any_gate(text):
            return list(self._whole_value(text, key)) if whole else []
        found: list[Span] = []
        folded_text: str | None = None
        everywhere = [(0, len(text))]
        for plugin, gate, folded, kind in self._regex_plugins:
            parts = everywhere
            if gate is not None:
                if folded and folded_text is None:
                    folded_text = text.lower()
                haystack = folded_text if folded and folded_text is not None else text
                if len(text) > _WINDOWED_CHARS:
                    # One search per word finds both whether and where the gate opens.
                    parts = _windows(text, haystack, gate, isinstance(plugin, _LINE_WIDE))
                    if not parts:
                        continue
                elif not any(word in haystack for word in gate):
                    continue
            if isinstance(plugin, PrivateKeyDetector):
                if any(True for _ in plugin.analyze_string(text)):
                    found.extend(Span(m.start(), m.end(), kind) for m in _KEY_BLOCK.finditer(text))
                continue
            found.extend(_regex_spans(plugin, parts, kind, text))
        found.extend(self._entropy_spans(text))
        if whole:
            found.extend(self._whole_value(text, key))
        return _merge(found)

    def _entropy_spans(self, text: str) -> Iterator[Span]:
        """Both entropy plugins in one pass: their quoted-string expressions differ only in
        the alphabet, and hex's is inside base64's, so one expression over base64's finds
        every candidate of both; each is judged by the plugins whose alphabet it is in."""
        if "'" not in text and '"' not in text:
            return
        found: dict[str, str] = {}
        judged: set[str] = set()
        for match in self._quoted.finditer(text):
            # Base64's alphabet takes a backslash: in JSON text (an upstream's text block)
            # ``\"<value>\"`` would take the escape with it and break the JSON.
            value = match.group(2).rstrip("\\")
            if value in judged:
                kind = found.get(value)
                if kind is not None:  # this quoted occurrence of a found value
                    yield Span(match.start(2), match.start(2) + len(value), kind)
                continue
            judged.add(value)
            for plugin, charset, shortest, kind in self._candidates:
                if (
                    len(value) >= shortest
                    and charset.fullmatch(value)
                    and self._is_entropy_secret(plugin, value, text, match)
                ):
                    found[value] = kind
                    yield Span(match.start(2), match.start(2) + len(value), kind)
                    break
        yield from _elsewhere(text, found)

    def _whole_value(self, value: str, key: str | None) -> Iterator[Span]:
        if not _WHOLE_VALUE_MIN_CHARS <= len(value) <= MAX_ENTROPY_CHARS:
            return
        line = f'"{key}": "{value}"' if key is not None else f'"{value}"'
        for plugin, charset in self._whole:
            if charset.fullmatch(value) and self._judge(plugin, value, line):
                yield Span(0, len(value), secret_slug(str(plugin.secret_type)))
                return

    def _is_entropy_secret(
        self, plugin: HighEntropyStringsPlugin, value: str, text: str, match: re.Match[str]
    ) -> bool:
        if len(value) > MAX_ENTROPY_CHARS:
            return False
        if isinstance(plugin, HexHighEntropyString) and len(value) < MIN_HEX_CHARS:
            return False
        # What detect-secrets' heuristics read as the match's line: only what stands before it
        # matters to them. JSON text is one line, so it also breaks at ``\\n`` escapes and
        # between members (``,`` and ``{``), or every value after any ``*_id`` key would
        # pass for an id.
        begin = match.start()
        low = max(0, begin - _LINE_LOOKBACK)
        escaped = text.rfind("\\n", low, begin)
        start = max(
            low,
            text.rfind("\n", low, begin) + 1,
            text.rfind(",", low, begin) + 1,
            text.rfind("{", low, begin) + 1,
            escaped + 2 if escaped >= 0 else 0,
        )
        line = text[start : match.end()]
        return self._judge(plugin, value, line)

    @staticmethod
    def _judge(plugin: HighEntropyStringsPlugin, value: str, line: str) -> bool:
        """detect-secrets' limit and heuristic filters, and the digest rule above."""
        if plugin.calculate_shannon_entropy(value) <= plugin.entropy_limit:
            return False
        if (
            is_sequential_string(value)
            or is_potential_uuid(value)
            or is_not_alphanumeric_string(value)
            or is_likely_id_string(value, line, plugin)
        ):
            return False
        return not _is_digest(value, line)


def _windows(
    text: str, haystack: str, gate: tuple[str, ...], line_wide: bool
) -> list[tuple[int, int]]:
    """The parts (start, end) of a long ``text`` where the plugin's gate words stand (no
    plugin's token spans a line): each occurrence's line, cut to ``_WINDOW`` characters
    either side unless the plugin's token may be as long as its line. A word in most of the
    text hands back the whole text."""
    bounds: list[tuple[int, int]] = []
    for word in gate:
        found = haystack.find(word)
        while found >= 0:
            if len(bounds) > _MAX_WINDOWS:
                return [(0, len(text))]
            start = text.rfind("\n", 0, found) + 1
            end = text.find("\n", found)
            end = len(text) if end < 0 else end
            if not line_wide:
                start, end = max(start, found - _WINDOW), min(end, found + len(word) + _WINDOW)
            bounds.append((start, end))
            found = haystack.find(word, end)
    bounds.sort()
    merged: list[tuple[int, int]] = []
    for start, end in bounds:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _regex_spans(
    plugin: BasePlugin, parts: list[tuple[int, int]], kind: str, text: str
) -> Iterator[Span]:
    """The spans of the plugin's own expressions (its ``denylist``), with its own checks.

    detect-secrets reports a match's groups when its expression has any; that is the secret
    where the expression also matches its context (AWS's ``aws ... key = "<secret>"``, a
    URL's password, NPM's token) and a mere prefix elsewhere (GitHub's ``(ghp|...)_``),
    so groups are used only for those three. Its JWT expression ends lazily and stops
    before the signature; the span runs on over it."""
    grouped = isinstance(plugin, _GROUPED)
    jwt = isinstance(plugin, JwtTokenDetector)
    values: dict[str, str] = {}
    for regex in plugin.denylist:  # type: ignore[attr-defined]
        for low, high in parts:
            for match in _finditer(plugin, regex, text, low, high):
                if grouped and match.re.groups:
                    # A placeholder (``user:...@host``, ``:<password>@``, ``${PASS}``) is none.
                    for index, group in enumerate(match.groups(), start=1):
                        if (
                            group
                            and not is_not_alphanumeric_string(group)
                            and not is_templated_secret(group)
                        ):
                            values[group] = kind
                            yield Span(match.start(index), match.end(index), kind)
                elif jwt:
                    tail = _JWT_TAIL.match(text, match.end(), high)
                    end = tail.end() if tail else match.end()
                    token = text[match.start() : end]
                    if JwtTokenDetector.is_formally_valid(token):
                        values[token] = kind
                        yield Span(match.start(), end, kind)
                else:
                    values[match.group(0)] = kind
                    yield Span(match.start(), match.end(), kind)
    # Every occurrence of a found value goes, wherever else it stands in the text.
    yield from _elsewhere(text, values)


def _finditer(
    plugin: BasePlugin, regex: re.Pattern[str], text: str, low: int, high: int
) -> Iterator[re.Match[str]]:
    """``regex.finditer(text, low, high)``, each run tried once where the plugin is
    ``_ONCE_PER_RUN``."""
    once = _ONCE_PER_RUN.get(type(plugin))
    if once is None:
        yield from regex.finditer(text, low, high)
        return
    word, run = once
    position = low
    while (start := text.find(word, position, high)) >= 0:
        match = regex.match(text, start, high)
        if match is not None:
            yield match
            position = max(match.end(), start + 1)
        else:
            after = run.match(text, start + len(word), high)
            position = after.end() if after is not None else start + 1


def _is_digest(value: str, line: str) -> bool:
    shaped = (
        len(value) in _DIGEST_HEX_LENGTHS and all(c in "0123456789abcdefABCDEF" for c in value)
    ) or bool(_SRI.fullmatch(value))
    if not shaped:
        return False
    before = line[: max(line.find(value), 0)]
    return _SECRET_WORD.search(before) is None


def _elsewhere(text: str, found: dict[str, str]) -> Iterator[Span]:
    """Every other occurrence of the first ``_MAX_SEARCHED_VALUES`` found values (value ->
    kind), wherever it stands: one search of the whole text per value, so a text holding
    thousands of tokens (each already cut where it was matched) is not searched thousands
    of times (quadratic)."""
    for value, kind in itertools.islice(found.items(), _MAX_SEARCHED_VALUES):
        if not value:
            continue
        start = text.find(value)
        while start >= 0:
            yield Span(start, start + len(value), kind)
            start = text.find(value, start + len(value))


def _merge(spans: list[Span]) -> list[Span]:
    """Overlapping spans as one, named by the kind of the first (a key block wins over an
    entropy match inside it: both start there, and the block is found first)."""
    if not spans:
        return spans
    spans.sort(key=lambda s: (s.start, -s.end))
    merged = [spans[0]]
    for span in spans[1:]:
        last = merged[-1]
        if span.start < last.end:
            if span.end > last.end:
                merged[-1] = Span(last.start, span.end, last.kind)
        else:
            merged.append(span)
    return merged


__all__ = [
    "DEFAULT_BASE64_LIMIT",
    "DEFAULT_HEX_LIMIT",
    "MAX_ENTROPY_CHARS",
    "MIN_SCANNED_CHARS",
    "REDACTED_PREFIX",
    "SecretScanner",
    "Span",
    "cut",
    "marker",
    "secret_slug",
]
