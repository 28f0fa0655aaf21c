"""CODEOWNERS parsing and matching against GitHub's documented examples, and approvals."""

from __future__ import annotations

import fnmatch
import itertools
import time
from collections.abc import Callable, Collection, Mapping

import pytest

from nexus_mcp.policy.codeowners import (
    CODEOWNERS_LOCATIONS,
    MAX_CODEOWNERS_BYTES,
    MAX_PATH_CHARS,
    MAX_PATTERN_CHARS,
    MAX_RULES,
    CodeOwners,
    Rule,
    find_codeowners,
    is_owner,
    unowned_paths,
)

GLOBAL = ("@global-owner1", "@global-owner2")

# The example file on GitHub's "About code owners" page, comments shortened.
GITHUB_EXAMPLE = """\
# This is a comment.
# Each line is a file pattern followed by one or more owners.

# These owners will be the default owners for everything in the repo.
*       @global-owner1 @global-owner2

# Order is important; the last matching pattern takes the most precedence.
*.js    @js-owner #This is an inline comment.

# You can also use email addresses if you prefer.
*.go docs@example.com

# Teams can be specified as code owners as well.
*.txt @octo-org/octocats

# @doctocat owns any files in the build/logs directory at the root of the
# repository and any of its subdirectories.
/build/logs/ @doctocat

# The `docs/*` pattern will match files like `docs/getting-started.md` but not
# further nested files like `docs/build-app/troubleshooting.md`.
docs/*  docs@example.com

# @octocat owns any file in an apps directory anywhere in your repository.
apps/ @octocat

# @doctocat owns any file in the `/docs` directory in the root of your
# repository and any of its subdirectories.
/docs/ @doctocat

# Any change inside the `/scripts` directory will require approval from
# @doctocat or @octocat.
/scripts/ @doctocat @octocat

# @octocat owns any file in a `/logs` directory such as `/build/logs`,
# `/scripts/logs`, and `/deeply/nested/logs`.
**/logs @octocat

# @octocat owns any file in the `/apps` directory in the root of your repository
# except for the `/apps/github` subdirectory, as its owners are left empty.
/apps/ @octocat
/apps/github
"""


def owners(text: str, path: str) -> tuple[str, ...]:
    return CodeOwners.parse(text).owners_of(path)


def matches(pattern: str, path: str) -> bool:
    return Rule(pattern, ("@someone",), 1).matches(path)


# --- GitHub's documented example ----------------------------------------------------------


def test_the_documented_example_parses_without_invalid_lines() -> None:
    codeowners = CodeOwners.parse(GITHUB_EXAMPLE)
    assert codeowners.invalid_lines == ()
    assert [rule.pattern for rule in codeowners.rules] == [
        "*",
        "*.js",
        "*.go",
        "*.txt",
        "/build/logs/",
        "docs/*",
        "apps/",
        "/docs/",
        "/scripts/",
        "**/logs",
        "/apps/",
        "/apps/github",
    ]
    assert codeowners.rules[1] == Rule("*.js", ("@js-owner",), 8)
    assert codeowners.rules[-1] == Rule("/apps/github", (), 42)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("README.md", GLOBAL),
        ("src/deep/RandomName.docx", GLOBAL),
        ("index.js", ("@js-owner",)),
        ("web/static/app.js", ("@js-owner",)),
        ("main.go", ("docs@example.com",)),
        ("cmd/tool/main.go", ("docs@example.com",)),
        ("notes/a.txt", ("@octo-org/octocats",)),
        # /build/logs/ matches, but the later **/logs wins.
        ("build/logs/app.log", ("@octocat",)),
        ("build/output.js", ("@js-owner",)),
        # docs/* matches, but the later /docs/ wins; /docs/ also owns nested files.
        ("docs/getting-started.md", ("@doctocat",)),
        ("docs/build-app/troubleshooting.md", ("@doctocat",)),
        # Neither docs/* nor /docs/ reaches a docs directory below the root.
        ("src/docs/guide.md", GLOBAL),
        ("src/apps/main.c", ("@octocat",)),
        ("src/apps/app.js", ("@octocat",)),
        ("apps/main.c", ("@octocat",)),
        ("apps/github", ()),
        ("apps/github/main.go", ()),
        ("apps/githubber/x", ("@octocat",)),
        ("scripts/deploy.sh", ("@doctocat", "@octocat")),
        ("scripts/logs/x.log", ("@octocat",)),
        ("deeply/nested/logs/x", ("@octocat",)),
        ("logs/today.txt", ("@octocat",)),
        ("catalogs/x", GLOBAL),
        ("a/apps", GLOBAL),
    ],
)
def test_the_documented_example_gives_each_path_its_last_matching_owners(
    path: str, expected: tuple[str, ...]
) -> None:
    assert owners(GITHUB_EXAMPLE, path) == expected


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        # "*.js": any .js file at any depth, case-sensitively.
        ("*.js", "app.js", True),
        ("*.js", "src/a/b/app.js", True),
        ("*.js", "app.jsx", False),
        ("*.js", "app.JS", False),
        # "/build/logs/": that directory at the root and everything below it.
        ("/build/logs/", "build/logs/a.log", True),
        ("/build/logs/", "build/logs/deep/er/a.log", True),
        ("/build/logs/", "x/build/logs/a.log", False),
        ("/build/logs/", "build/logs", False),
        ("/build/logs/", "build/logsx/a.log", False),
        # "docs/*": direct children of the root docs directory only.
        ("docs/*", "docs/getting-started.md", True),
        ("docs/*", "docs/build-app/troubleshooting.md", False),
        ("docs/*", "x/docs/getting-started.md", False),
        ("docs/*", "docs", False),
        # "apps/": any apps directory anywhere, not a file named apps.
        ("apps/", "apps/a.c", True),
        ("apps/", "x/y/apps/a.c", True),
        ("apps/", "apps/deep/a.c", True),
        ("apps/", "apps", False),
        ("apps/", "myapps/a.c", False),
        # "/docs/": the root docs directory and its subdirectories.
        ("/docs/", "docs/a.md", True),
        ("/docs/", "docs/a/b.md", True),
        ("/docs/", "x/docs/a.md", False),
        # "/scripts/": as /docs/.
        ("/scripts/", "scripts/deploy.sh", True),
        ("/scripts/", "tools/scripts/deploy.sh", False),
        # "**/logs": a logs directory at any depth, root included, and what is in it.
        ("**/logs", "build/logs", True),
        ("**/logs", "build/logs/a.log", True),
        ("**/logs", "scripts/logs/a.log", True),
        ("**/logs", "deeply/nested/logs/a.log", True),
        ("**/logs", "logs", True),
        ("**/logs", "logs/a.log", True),
        ("**/logs", "catalogs/a.log", False),
        ("**/logs", "logs2/a.log", False),
        # "/apps/github": a middle slash anchors it at the root.
        ("/apps/github", "apps/github/x.go", True),
        ("apps/github", "apps/github/x.go", True),
        ("apps/github", "src/apps/github/x.go", False),
    ],
)
def test_each_documented_pattern_matches_what_its_comment_says(
    pattern: str, path: str, expected: bool
) -> None:
    assert matches(pattern, path) is expected


def test_an_empty_owner_list_leaves_the_subpath_without_owners() -> None:
    text = "/apps/ @octocat\n/apps/github\n"
    assert owners(text, "apps/main.c") == ("@octocat",)
    assert owners(text, "apps/github/main.go") == ()


def test_a_later_subpath_rule_with_its_own_owner_overrides_the_directory_owner() -> None:
    text = "/apps/ @octocat\n/apps/github @doctocat\n"
    assert owners(text, "apps/main.c") == ("@octocat",)
    assert owners(text, "apps/github/main.go") == ("@doctocat",)


@pytest.mark.parametrize(
    ("approver", "teams", "owned"),
    [
        ("doctocat", {}, True),
        ("octocat", {}, False),
        ("mona", {"@example-org/content-team": ["mona"]}, True),
        ("hubot", {"@example-org/content-team": ["mona"]}, False),
    ],
)
def test_the_documented_branch_protection_examples_decide_who_may_approve(
    approver: str, teams: Mapping[str, Collection[str]], owned: bool
) -> None:
    single = CodeOwners.parse("/apps/ @doctocat\n")
    team = CodeOwners.parse("/apps/ @example-org/content-team\n")
    codeowners = team if teams else single
    assert (unowned_paths(approver, ["apps/a.py"], codeowners, teams=teams) == []) is owned


# --- pattern semantics ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        # A pattern matching a directory owns everything below it.
        ("/build/logs", "build/logs/a/b.txt", True),
        ("/build/logs", "build/logs", True),
        ("build", "src/build/x.o", True),
        # * and ? stay inside one segment and match dotfiles.
        ("/src/*.py", "src/a.py", True),
        ("/src/*.py", "src/pkg/a.py", False),
        ("*.py", ".hidden.py", True),
        ("/*.md", "README.md", True),
        ("/*.md", "docs/README.md", False),
        ("/file?.txt", "file1.txt", True),
        ("/file?.txt", "file10.txt", False),
        ("/a?b", "a/b", False),
        # A last segment of exactly * matches direct children only, at the root too.
        ("/*", "README.md", True),
        ("/*", "src/a.py", False),
        ("*", "src/deep/a.py", True),
        ("/docs/*/", "docs/a/b.md", True),
        ("/docs/*/", "docs/a.md", False),
        ("/docs/*.md", "docs/x.md/inner.txt", True),
        # ** spans zero or more directories when leading or in the middle.
        ("/a/**/b", "a/b", True),
        ("/a/**/b", "a/x/b", True),
        ("/a/**/b", "a/x/y/b/c.txt", True),
        ("/a/**/b", "a/x/y/c", False),
        ("**/x/**/y", "x/y", True),
        ("**/x/**/y", "p/x/q/r/y/z", True),
        ("/**/**/**/z", "z", True),
        ("/**/**/**/z", "a/b/c/z", True),
        # A trailing ** is what is inside, not the directory itself.
        ("/a/**", "a/b", True),
        ("/a/**", "a/b/c", True),
        ("/a/**", "a", False),
        ("**", "anything/at/all", True),
        ("/**", "x", True),
        ("**/", "dir/file", True),
        ("**/", "file", False),
        # ** inside a segment is a plain *.
        ("/a**b", "axyzb", True),
        ("/a**b", "ax/yb", False),
        # Patterns are case-sensitive.
        ("/Docs/", "docs/a.md", False),
        ("/docs/", "Docs/a.md", False),
        ("README.md", "readme.md", False),
        # Escapes make characters literal.
        ("path\\ with\\ spaces/", "path with spaces/a.txt", True),
        ("/star\\*", "star*", True),
        ("/star\\*", "starry", False),
        ("/what\\?", "what?", True),
        ("/what\\?", "whats", False),
        ("/back\\\\slash", "back\\slash", True),
        ("/with#hash", "with#hash", True),
    ],
)
def test_glob_semantics(pattern: str, path: str, expected: bool) -> None:
    assert matches(pattern, path) is expected


@pytest.mark.parametrize(
    "path",
    ["", "/docs/a.md", "docs/a.md/", "docs//a.md", "./docs/a.md", "docs/../a.md", "."],
)
def test_a_path_that_is_not_repository_relative_matches_no_rule(path: str) -> None:
    codeowners = CodeOwners.parse("* @everyone\n**/a.md @docs\n")
    assert codeowners.owners_of(path) == ()
    assert codeowners.rule_for(path) is None


def test_a_path_longer_than_the_limit_matches_no_rule() -> None:
    codeowners = CodeOwners.parse("* @everyone\n")
    assert codeowners.owners_of("a" * MAX_PATH_CHARS) == ("@everyone",)
    assert codeowners.owners_of("a" * (MAX_PATH_CHARS + 1)) == ()


def test_the_segment_glob_agrees_with_fnmatch_on_every_small_pattern() -> None:
    names = [
        "".join(chars) for size in range(1, 5) for chars in itertools.product("ab", repeat=size)
    ]
    patterns = [
        "".join(chars) for size in range(1, 5) for chars in itertools.product("ab*?", repeat=size)
    ]
    disagreements = [
        (pattern, name)
        for pattern in patterns
        for name in names
        if Rule("/" + pattern, (), 1).matches(name) != fnmatch.fnmatchcase(name, pattern)
    ]
    assert disagreements == []


def test_rule_for_names_the_deciding_line() -> None:
    codeowners = CodeOwners.parse("* @a\n\n# c\n/src/ @b\n")
    assert codeowners.rule_for("src/x.py") == Rule("/src/", ("@b",), 4)
    assert codeowners.rule_for("x.py") == Rule("*", ("@a",), 1)
    assert CodeOwners.parse("/src/ @b\n").rule_for("x.py") is None


# --- syntax ---------------------------------------------------------------------------------


def test_comments_blank_lines_and_inline_comments_are_ignored() -> None:
    text = (
        "# a comment\n"
        "\n"
        "   \t\n"
        "   # an indented comment\n"
        "*.js @js-owner # trailing comment with @not-an-owner\n"
        "*.md\t@a  @b\t# tabs separate too\n"
        "  /lib/ @lib\n"
        "*.rs @rust #\n"
    )
    codeowners = CodeOwners.parse(text)
    assert codeowners.invalid_lines == ()
    assert codeowners.rules == (
        Rule("*.js", ("@js-owner",), 5),
        Rule("*.md", ("@a", "@b"), 6),
        Rule("/lib/", ("@lib",), 7),
        Rule("*.rs", ("@rust",), 8),
    )


def test_crlf_line_endings_are_accepted() -> None:
    codeowners = CodeOwners.parse("# c\r\n*.js @js\r\n/a/ @a\r\n")
    assert codeowners.invalid_lines == ()
    assert codeowners.rules == (Rule("*.js", ("@js",), 2), Rule("/a/", ("@a",), 3))


@pytest.mark.parametrize(
    "line",
    [
        # GitHub: escaping a leading # "doesn't work", negation and ranges neither.
        "\\#file_with_pound.rb @owner",
        "!*.js @owner",
        "!/secret/",
        "*.[ch] @owner",
        "/src/[abc]/ @owner",
        "/src/x] @owner",
        "[Section]",
        "^[Optional section]",
        # A malformed owner invalidates the whole line.
        "/src/ @good bad-owner",
        "/src/ @good @",
        "/src/ @good @org/team/extra",
        "/src/ @good not@an@email",
        "/src/ @good @user.name",
        "/src/ @good@example.com",
        "/src/ @good @bad#hash",
        # Structurally broken patterns.
        "/ @owner",
        "// @owner",
        "/a//b @owner",
        "/a/./b @owner",
        "../x @owner",
        "/a/\\/b @owner",
        "/a/trailing\\",
        "/a @owner trailing\\",
        "/" + "a" * MAX_PATTERN_CHARS + " @owner",
    ],
)
def test_an_invalid_line_is_skipped_and_reported(line: str) -> None:
    codeowners = CodeOwners.parse(f"* @everyone\n{line}\n/ok/ @ok\n")
    assert codeowners.invalid_lines == (2,)
    assert codeowners.rules == (Rule("*", ("@everyone",), 1), Rule("/ok/", ("@ok",), 3))


def test_a_skipped_line_leaves_its_paths_to_the_earlier_rules_like_github() -> None:
    codeowners = CodeOwners.parse("* @everyone\n!/secret/ @security\n/vault/ @security typo\n")
    assert codeowners.invalid_lines == (2, 3)
    assert codeowners.owners_of("secret/a") == ("@everyone",)
    assert codeowners.owners_of("vault/a") == ("@everyone",)


def test_an_escaped_hash_is_not_a_pattern_for_the_hash_file() -> None:
    codeowners = CodeOwners.parse("\\#file_with_pound.rb @owner\n")
    assert codeowners.owners_of("#file_with_pound.rb") == ()
    assert codeowners.invalid_lines == (1,)


def test_a_trailing_backslash_inside_a_comment_is_harmless() -> None:
    codeowners = CodeOwners.parse("*.js @js # ends with \\\n")
    assert codeowners.invalid_lines == ()
    assert codeowners.rules == (Rule("*.js", ("@js",), 1),)


@pytest.mark.parametrize(
    "owner",
    [
        "@octocat",
        "@Octo-Cat",
        "@mona_acme",
        "@octo-org/octocats",
        "@octo-org/team.name_2",
        "docs@example.com",
        "first.last+tag@sub.example.co.uk",
    ],
)
def test_well_formed_owners_are_accepted(owner: str) -> None:
    codeowners = CodeOwners.parse(f"/src/ {owner}\n")
    assert codeowners.invalid_lines == ()
    assert codeowners.owners_of("src/a") == (owner,)


def test_a_pattern_at_the_length_limit_is_accepted() -> None:
    pattern = "/" + "a" * (MAX_PATTERN_CHARS - 1)
    codeowners = CodeOwners.parse(f"{pattern} @owner\n")
    assert codeowners.invalid_lines == ()
    assert codeowners.owners_of(pattern[1:]) == ("@owner",)


def test_rules_past_the_limit_are_reported_as_invalid() -> None:
    text = "# header\n" + "".join(f"/f{index} @o\n" for index in range(MAX_RULES + 2))
    codeowners = CodeOwners.parse(text)
    assert len(codeowners.rules) == MAX_RULES
    assert codeowners.invalid_lines == (MAX_RULES + 2, MAX_RULES + 3)
    assert codeowners.owners_of(f"f{MAX_RULES - 1}") == ("@o",)
    assert codeowners.owners_of(f"f{MAX_RULES}") == ()


@pytest.mark.parametrize(
    ("pattern", "owners_"),
    [("!x", ()), ("/a/[b]", ()), ("/ok", ("bad owner",)), ("/ok", ("@",))],
)
def test_a_rule_cannot_be_built_from_an_invalid_pattern_or_owner(
    pattern: str, owners_: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError):
        Rule(pattern, owners_, 1)


def test_a_rule_cannot_be_built_with_a_non_string_owner() -> None:
    with pytest.raises(ValueError):
        Rule("/ok", (None,), 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "\n\n", "# only comments\n", "\x00\x01 @x\n"])
def test_parse_never_raises_on_odd_content(text: str) -> None:
    codeowners = CodeOwners.parse(text)
    assert codeowners.owners_of("a") == ()


# --- find_codeowners ------------------------------------------------------------------------


def reader(
    files: dict[str, bytes], calls: list[str] | None = None
) -> Callable[[str], bytes | None]:
    def read(path: str) -> bytes | None:
        if calls is not None:
            calls.append(path)
        return files.get(path)

    return read


def test_github_searches_dot_github_then_root_then_docs() -> None:
    assert CODEOWNERS_LOCATIONS == (".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS")


@pytest.mark.parametrize(
    ("present", "winner"),
    [
        ((".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS"), ".github/CODEOWNERS"),
        (("CODEOWNERS", "docs/CODEOWNERS"), "CODEOWNERS"),
        (("docs/CODEOWNERS",), "docs/CODEOWNERS"),
        ((".github/CODEOWNERS", "docs/CODEOWNERS"), ".github/CODEOWNERS"),
    ],
)
def test_the_first_location_found_wins(present: tuple[str, ...], winner: str) -> None:
    files = {path: f"* @{path.replace('/', '-').replace('.', '')}\n".encode() for path in present}
    found = find_codeowners(reader(files))
    assert found is not None
    location, codeowners = found
    assert location == winner
    assert codeowners == CodeOwners.parse(files[winner].decode())


def test_the_search_stops_at_the_first_file_found() -> None:
    calls: list[str] = []
    find_codeowners(reader({"CODEOWNERS": b"* @a\n", "docs/CODEOWNERS": b"* @b\n"}, calls))
    assert calls == [".github/CODEOWNERS", "CODEOWNERS"]


def test_no_file_at_any_location_finds_nothing() -> None:
    calls: list[str] = []
    assert find_codeowners(reader({"src/CODEOWNERS": b"* @a\n"}, calls)) is None
    assert calls == list(CODEOWNERS_LOCATIONS)


def test_an_empty_file_is_found_and_owns_nothing() -> None:
    assert find_codeowners(reader({".github/CODEOWNERS": b"", "CODEOWNERS": b"* @a\n"})) == (
        ".github/CODEOWNERS",
        CodeOwners(),
    )


@pytest.mark.parametrize(
    "content",
    [
        b"* @a\n" + b"#" * (MAX_CODEOWNERS_BYTES - 5),  # exactly 3 MiB: not "under 3 MB"
        b"* @a\n" + b"#" * MAX_CODEOWNERS_BYTES,
        b"* @a\n/caf\xe9/ @b\n",  # Latin-1, not UTF-8
        b"\xff\xfe*\x00 \x00@\x00a\x00",  # UTF-16
    ],
)
def test_a_file_github_would_not_load_is_found_with_no_rules(content: bytes) -> None:
    files = {".github/CODEOWNERS": content, "CODEOWNERS": b"* @fallback\n"}
    assert find_codeowners(reader(files)) == (".github/CODEOWNERS", CodeOwners())


def test_a_file_just_under_the_size_limit_is_loaded() -> None:
    content = b"* @a\n" + b"#" * (MAX_CODEOWNERS_BYTES - 6)
    found = find_codeowners(reader({"CODEOWNERS": content}))
    assert found is not None
    assert found[1].owners_of("x") == ("@a",)


def test_a_utf8_file_with_a_byte_order_mark_is_loaded() -> None:
    found = find_codeowners(reader({"CODEOWNERS": "\ufeff/caf\u00e9/ @a\n".encode()}))
    assert found is not None
    assert found[1].owners_of("caf\u00e9/menu.txt") == ("@a",)


# --- is_owner -------------------------------------------------------------------------------

TEAMS: Mapping[str, Collection[str]] = {
    "@octo-org/octocats": ["mona", "@Hubot", "lead@example.com"],
    "OCTO-ORG/Reviewers": ("octocat",),
    "@octo-org/broken": "mona",  # a bare string is not a member list
}


@pytest.mark.parametrize(
    ("approver", "owners_", "expected"),
    [
        # Users: case-insensitive, the leading @ optional on either side of the call.
        ("octocat", ["@octocat"], True),
        ("@octocat", ["@octocat"], True),
        ("OctoCat", ["@octocat"], True),
        ("@OCTOCAT", ["@OctoCat"], True),
        ("octocat", ["@doctocat", "@octocat"], True),
        ("octocat", ["@doctocat"], False),
        ("octocat", ["@octocat2"], False),
        ("octo", ["@octocat"], False),
        # Emails: case-insensitive; a login never matches an email owner or vice versa.
        ("docs@example.com", ["docs@example.com"], True),
        ("Docs@Example.COM", ["docs@example.com"], True),
        ("docs", ["docs@example.com"], False),
        ("docs@example.com", ["@docs"], False),
        ("@docs@example.com", ["docs@example.com"], False),
        # Teams: members listed in the mapping; keys match case-insensitively, @ optional.
        ("mona", ["@octo-org/octocats"], True),
        ("MONA", ["@octo-org/octocats"], True),
        ("hubot", ["@octo-org/octocats"], True),
        ("lead@example.com", ["@octo-org/octocats"], True),
        ("octocat", ["@octo-org/reviewers"], True),
        ("octocat", ["@octo-org/octocats"], False),
        ("mona", ["@octo-org/unknown"], False),
        ("mona", ["@octo-org/broken"], False),
        ("m", ["@octo-org/broken"], False),
        # A team identity is not a person.
        ("@octo-org/octocats", ["@octo-org/octocats"], False),
        ("octo-org/octocats", ["@octo-org/octocats"], False),
        # Empty and malformed approvers never own anything.
        ("", ["@octocat"], False),
        ("@", ["@octocat"], False),
        (" octocat", ["@octocat"], False),
        ("octocat ", ["@octocat"], False),
        ("\u212aim", ["@kim"], False),  # the Kelvin sign does not fold to k
        ("octocat", [], False),
        # Malformed owners match nothing.
        ("octocat", ["octocat"], False),
        ("octocat", ["@octo cat"], False),
        # A lone owner string is one owner, not its characters.
        ("octocat", "@octocat", True),
        ("o", "@octocat", False),
    ],
)
def test_is_owner(approver: str, owners_: list[str], expected: bool) -> None:
    assert is_owner(approver, owners_, teams=TEAMS) is expected


def test_without_a_team_mapping_no_one_is_a_team_member() -> None:
    assert not is_owner("mona", ["@octo-org/octocats"])


@pytest.mark.parametrize("approver", [None, 42, b"octocat"])
def test_is_owner_never_raises_on_a_non_string_approver(approver: object) -> None:
    assert is_owner(approver, ["@octocat"]) is False  # type: ignore[arg-type]


def test_is_owner_never_raises_on_malformed_owners_or_teams() -> None:
    assert is_owner("octocat", [None, 3, "@octocat"]) is True  # type: ignore[list-item]
    assert is_owner("octocat", None) is False  # type: ignore[arg-type]
    assert is_owner("mona", ["@o/t"], teams=None) is False  # type: ignore[arg-type]
    assert is_owner("mona", ["@o/t"], teams={"@o/t": None, 3: ["mona"]}) is False  # type: ignore[dict-item]
    assert is_owner("mona", ["@o/t"], teams={"@o/t": [None, "mona"]}) is True  # type: ignore[list-item]


# --- unowned_paths --------------------------------------------------------------------------

REPO = CodeOwners.parse(
    "*.md @writers\n/src/ @octocat @octo-org/core\n/src/generated/\n/vendor/ docs@example.com\n"
)
CORE: Mapping[str, Collection[str]] = {"@octo-org/core": ["mona"]}


@pytest.mark.parametrize(
    ("approver", "paths", "expected"),
    [
        ("octocat", ["src/a.py", "src/b/c.py"], []),
        ("mona", ["src/a.py"], []),
        ("writers", ["README.md", "docs/x.md"], []),
        ("octocat", ["src/a.py", "README.md"], ["README.md"]),
        # A path nobody owns cannot be approved by an owner.
        ("octocat", ["setup.py"], ["setup.py"]),
        ("octocat", ["src/generated/x.py"], ["src/generated/x.py"]),
        # Input order is kept and repeats are dropped.
        ("writers", ["b.py", "a.md", "a.py", "b.py", "a.py"], ["b.py", "a.py"]),
        ("docs@example.com", ["vendor/lib.c", "src/a.py"], ["src/a.py"]),
        # A path that is not repository-relative is owned by nobody.
        ("octocat", ["/src/a.py", "src/../x"], ["/src/a.py", "src/../x"]),
        ("", ["src/a.py"], ["src/a.py"]),
        ("octocat", [], []),
    ],
)
def test_unowned_paths(approver: str, paths: list[str], expected: list[str]) -> None:
    assert unowned_paths(approver, paths, REPO, teams=CORE) == expected


def test_every_path_is_unowned_without_any_rules() -> None:
    assert unowned_paths("octocat", ["a", "b/c"], CodeOwners()) == ["a", "b/c"]


def test_a_lone_path_string_is_one_path() -> None:
    assert unowned_paths("octocat", "setup.py", REPO) == ["setup.py"]


# --- work bound -----------------------------------------------------------------------------

ADVERSARIAL = [
    # Each would take a backtracking regex matcher longer than any test run.
    ("*a" * 12 + "*b", "x/" + "a" * 3000, False),
    ("?*" * 40 + "b", "a" * 3000, False),
    ("/" + "**/" * 1000 + "x", "a/" * 2000 + "y", False),
    ("/" + "**/a/" * 300 + "b", "a/" * 2000 + "c", False),
    ("/" + "*/" * 200 + "*a*a*a*a*b", "x/" * 200 + "a" * 3000, False),
]


def test_pathological_patterns_are_matched_within_a_bounded_budget() -> None:
    rules = [(Rule(pattern, (), 1), path, expected) for pattern, path, expected in ADVERSARIAL]
    runs = 200
    started = time.perf_counter()
    results = [
        rules[index % len(rules)][0].matches(rules[index % len(rules)][1]) for index in range(runs)
    ]
    elapsed = time.perf_counter() - started
    assert results == [rules[index % len(rules)][2] for index in range(runs)]
    # Generous: a backtracking matcher needs years for one of these, this one milliseconds.
    assert elapsed < 5.0
