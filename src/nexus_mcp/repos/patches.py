"""A patch applied to a scratch index of the entries it reaches, not of the whole tree.

``Repository.analyze_patch`` applies a patch to a scratch index of the branch tip. An
index of the whole tree costs in proportion to the repository (10,000 files are a 1 MB
index that ``apply --cached`` reads and writes back whole), yet git only ever looks at a
few of its entries:

- the entry at each path the patch names (both ends of a rename or a copy): it must
  exist with the content and mode the patch expects, or not exist for a new file;
- the entry at a parent path of each one, when that is not a folder: a new ``a/b`` is
  refused where ``a`` is a file or a submodule (git's directory/file check), or a
  symbolic link (its "beyond a symbolic link" check);
- the entries below each one that is a folder: a new file ``a`` is refused while
  anything is left below ``a/``.

``apply_partial`` puts exactly those entries of the commit's tree into a fresh index
(``ls-tree -t`` of the named paths, which also shows the folders on their way; a second
``ls-tree`` of the first parent it did not show as a folder, for a name in a new folder;
``update-index --index-info``, or the very bytes it would write, written here when every
entry is a plain file with a plain name: ``write_plain_index``), so git's own checks run
on them as they would on the whole tree, and the cost follows the patch, not the
repository. A named path that is a
folder in the tree is left to the whole-tree index (the answer is None): no ordinary
patch names one, and the entries below it are as many as the folder holds.

The paths are read from the patch here (``named_paths``), generously: every name any
header line could give (quoted or not, with its ``a/`` prefix taken off or with no
prefix, cut at a tab or a space or kept whole). A name too many costs a look-up; a name
too few would leave an entry out, so the names git itself reports (``apply --numstat``)
must all have been looked up, or the answer is None and the whole tree judges the
patch. The one name ``--numstat`` leaves out is the source of a rename or a copy: git
cannot apply it without its entry, so a partial index that applies it held it; a patch
with one that fails on the partial index is judged on the whole tree.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nexus_mcp.policy.repos import PatchFacts
from nexus_mcp.repos.git import GitResult, GitRunner

# A patch naming more paths than this, or longer names in all, is measured on the whole
# tree: the names are command-line arguments of ``ls-tree`` and ``diff-index``.
MAX_NAMED_PATHS = 2000
MAX_NAMED_BYTES = 256 * 1024
MODE_TREE = b"040000"
MODE_SYMLINK = "120000"
MODE_GITLINK = "160000"
MODE_NONE = "000000"
APPLY_TO_INDEX = ("apply", "--cached", "--whitespace=nowarn")
LITERAL_PATHS = {"GIT_LITERAL_PATHSPECS": "1"}

Entry = tuple[bytes, bytes, bytes]  # mode, type, object id


@dataclass(frozen=True)
class PartialApply:
    """What ``apply_partial`` found: whether git applied the patch; if so, the paths the
    comparison with the commit must cover; if not, git's own reading of the patch."""

    applies: bool
    paths: list[bytes] = field(default_factory=list)
    numstat: GitResult | None = None


@dataclass(frozen=True)
class TreeChange:
    """One path of a ``diff-tree --raw`` between two trees."""

    status: str  # A, M, D or T
    old_mode: str
    new_mode: str
    new_sha: str
    path: str
    raw_path: bytes = b""  # the path's bytes as git has them


@dataclass(frozen=True)
class FileStat:
    path: str
    lines_added: int
    lines_removed: int
    old_path: str | None = None


@dataclass(frozen=True)
class PatchAnalysis:
    """The measured effect of a patch on one commit (module docstring)."""

    base_commit: str
    applies: bool
    facts: PatchFacts
    changes: tuple[TreeChange, ...] = ()
    files: tuple[FileStat, ...] = field(default_factory=tuple)


def apply_partial(
    runner: GitRunner, commit: str, patch: bytes, env: Mapping[str, str]
) -> PartialApply | None:
    """Apply ``patch`` to a fresh index (``GIT_INDEX_FILE`` of ``env``) of the entries of
    ``commit`` it reaches; None when only the whole tree can tell (module docstring)."""
    names = named_paths(patch)
    if names is None:
        return None
    entries = _look_up(runner, commit, sorted(names), {**env, **LITERAL_PATHS}, folders=True)
    if entries is None or any(entries.get(n, (b"",))[0] == MODE_TREE for n in names):
        return None
    parents = _first_unseen_parents(names, entries)
    if parents:
        more = _look_up(runner, commit, sorted(parents), {**env, **LITERAL_PATHS}, folders=False)
        if more is None:
            return None
        entries.update(more)
    indexed = {path: entry for path, entry in entries.items() if entry[0] != MODE_TREE}
    if indexed and not write_plain_index(indexed, Path(env["GIT_INDEX_FILE"])):
        runner.run(["update-index", "-z", "--index-info"], stdin=index_info(indexed), env=env)
    applied = runner.run(
        [*APPLY_TO_INDEX, "--numstat", "-z", "--apply", "-"], stdin=patch, env=env, check=False
    )
    if applied.returncode == 0:
        if not _all_looked_up(applied.stdout, names):
            return None
        return PartialApply(True, sorted(names | indexed.keys()))
    numstat = runner.run(["apply", "--numstat", "-z", "-"], stdin=patch, check=False)
    if numstat.returncode == 0 and (
        moves_paths(patch) or not _all_looked_up(numstat.stdout, names)
    ):
        return None
    return PartialApply(False, numstat=numstat)


def _look_up(
    runner: GitRunner, commit: str, paths: Sequence[bytes], env: Mapping[str, str], *, folders: bool
) -> dict[bytes, Entry] | None:
    """The entries at exactly these paths (with ``folders``, also the folders on their
    way); None when git refuses one of them as a path (``..``)."""
    args = ["ls-tree", "-z", *(["-t"] if folders else []), "--full-tree", commit, "--"]
    listing = runner.run([*args, *to_args(paths)], env=env, check=False)
    return parse_tree_records(listing.stdout) if listing.returncode == 0 else None


def _first_unseen_parents(names: Iterable[bytes], entries: Mapping[bytes, Entry]) -> set[bytes]:
    """For each name not found, its first parent ``ls-tree -t`` did not show as a folder
    on its way: a file, a link or a submodule there is in the way of the name (no deeper
    parent can exist), or nothing is. A name found, or in a folder found, has none."""
    unseen: set[bytes] = set()
    for name in names:
        if name in entries:
            continue
        end = name.find(b"/")
        while end > 0:
            entry = entries.get(name[:end])
            if entry is None:
                unseen.add(name[:end])
            if entry is None or entry[0] != MODE_TREE:
                break
            end = name.find(b"/", end + 1)
    return unseen


def _all_looked_up(numstat: bytes, names: set[bytes]) -> bool:
    found = names_of_numstat(numstat)
    return bool(found) and found is not None and found <= names


def to_args(paths: Iterable[bytes]) -> list[str]:
    """Paths as arguments: the very bytes reach git (``os.fsencode`` undoes this)."""
    return [os.fsdecode(path) for path in paths]


# Every line that can give a name: the ``diff --git`` header, ``---``/``+++``, and the
# rename and copy lines (whose names are read whole, with no ``a/`` prefix).
_NAME_LINE_RE = re.compile(
    rb"^(diff --git |--- |\+\+\+ |(?:rename (?:from|to|old|new)|copy (?:from|to)) )(.*)$",
    re.MULTILINE,
)
# Lines that name the source of a rename or a copy: a name ``apply --numstat`` never
# reports, so a patch with one is not judged on a partial index when it fails there.
_MOVE_RE = re.compile(rb"^(?:rename (?:from|old)|copy from) ", re.MULTILINE)
_SLASHES_RE = re.compile(rb"/{2,}")
# Where git ends a name on a ``---``/``+++`` line (besides the line's end).
_NAME_END_RE = re.compile(rb"[\t\r\v\f]")
_ESCAPES = {
    ord("a"): 7, ord("b"): 8, ord("f"): 12, ord("n"): 10, ord("r"): 13, ord("t"): 9,
    ord("v"): 11, ord("\\"): 92, ord('"'): 34,
}  # fmt: skip


def named_paths(patch: bytes) -> set[bytes] | None:
    """Every path the patch's header lines could name, or None when they are too many
    (``MAX_NAMED_PATHS``, ``MAX_NAMED_BYTES``) or none at all."""
    names: set[bytes] = set()
    for match in _NAME_LINE_RE.finditer(patch):
        kind, rest = match.group(1), match.group(2)
        if kind == b"diff --git ":
            found: Iterable[bytes] = _header_names(rest)
        elif kind in (b"--- ", b"+++ "):
            found = _file_line_names(rest)
        else:
            found = _whole_names(rest)
        names.update(_SLASHES_RE.sub(b"/", name) for name in found)
        if len(names) > MAX_NAMED_PATHS:
            return None
    names = {n for n in names if n and b"\0" not in n and not n.startswith(b"/")}
    if not names or sum(len(n) + 1 for n in names) > MAX_NAMED_BYTES:
        return None
    return names


def moves_paths(patch: bytes) -> bool:
    """Whether the patch has a rename or copy line (its source is a name git reads that
    ``apply --numstat`` does not report)."""
    return _MOVE_RE.search(patch) is not None


def parse_tree_records(output: bytes) -> dict[bytes, Entry]:
    """``ls-tree -z`` output: path -> (mode, type, object id), the path's bytes as stored."""
    entries: dict[bytes, Entry] = {}
    for record in output.split(b"\0"):
        if record:
            meta, _, path = record.partition(b"\t")
            mode, kind, sha = meta.split(b" ", 2)
            entries[path] = (mode, kind, sha)
    return entries


def index_info(entries: Mapping[bytes, Entry]) -> bytes:
    """The ``update-index -z --index-info`` input that puts these entries in an index."""
    return b"".join(
        mode + b" " + sha + b"\t" + path + b"\0" for path, (mode, _kind, sha) in entries.items()
    )


# What ``write_plain_index`` writes itself: regular files whose every name part is plain
# ASCII, so that nothing is left for git's own path checks (``verify_path``: ``.`` and
# ``..``, ``.git`` in any case or with trailing dots, NTFS short names with ``~``, HFS's
# ignored code points, backslashes) to refuse; anything else goes through git.
_PLAIN_MODES = (b"100644", b"100755")
_PLAIN_PART_RE = re.compile(rb"[A-Za-z0-9_.-]+")
_OID_RE = re.compile(rb"[0-9a-f]{40}(?:[0-9a-f]{24})?")  # SHA-1 or SHA-256
_MAX_INDEX_NAME = 0xFFF  # a name this long or longer is flagged as such in its entry


def write_plain_index(entries: Mapping[bytes, Entry], index: Path) -> bool:
    """Write ``index``: the version 2 index ``update-index -z --index-info`` writes for
    these entries (stat data zero, sorted by name, the object format's checksum), a git
    process less. False, writing nothing, unless every entry is a plain file with a plain
    name (``_PLAIN_PART_RE``) and none is a folder of another: git judges those itself."""
    names = set(entries)
    if not names or len({len(sha) for _mode, _kind, sha in entries.values()}) != 1:
        return False
    parts = [b"DIRC", struct.pack(">II", 2, len(names))]
    for path in sorted(names):
        mode, kind, sha = entries[path]
        if (
            mode not in _PLAIN_MODES
            or kind != b"blob"
            or not _OID_RE.fullmatch(sha)
            or not _is_plain_name(path, names)
        ):
            return False
        record = struct.pack(">10I", 0, 0, 0, 0, 0, 0, int(mode, 8), 0, 0, 0)
        record += bytes.fromhex(sha.decode("ascii")) + struct.pack(">H", len(path)) + path
        parts.append(record + b"\0" * (8 - len(record) % 8))
    data = b"".join(parts)
    digest = hashlib.sha1 if len(next(iter(entries.values()))[2]) == 40 else hashlib.sha256
    index.write_bytes(data + digest(data).digest())
    return True


def _is_plain_name(path: bytes, names: set[bytes]) -> bool:
    """Every part plain, none ``.``, ``..`` or a spelling of ``.git``, and no folder of
    the name itself an entry (a file and a folder of one name)."""
    if len(path) >= _MAX_INDEX_NAME:
        return False
    parts = path.split(b"/")
    if any(b"/".join(parts[:end]) in names for end in range(1, len(parts))):
        return False
    return all(
        _PLAIN_PART_RE.fullmatch(part)
        and part not in (b".", b"..")
        and part.lower().rstrip(b".") != b".git"
        for part in parts
    )


def names_of_numstat(output: bytes) -> set[bytes] | None:
    """The names of ``apply --numstat -z`` output (``added\\tremoved\\tname\\0``): the new
    name of each file, or the old one of a deleted file. None if it does not parse."""
    names: set[bytes] = set()
    for record in output.split(b"\0"):
        if record:
            parts = record.split(b"\t", 2)
            if len(parts) != 3:
                return None
            names.add(parts[2])
    return names


def parse_comparison(output: bytes, zero_sha: str) -> tuple[list[TreeChange], list[FileStat]]:
    """The output of a ``diff-tree``/``diff-index`` with ``-z --raw --numstat -M``: each
    path that differs (a rename's two ends as a removal and an addition, so each is
    judged), and the lines added and removed."""
    tokens = output.split(b"\0")
    changes: list[TreeChange] = []
    index = 0
    # The raw records come first, each starting with ':' (a path may too, but paths are
    # read by position); the numstat records are everything after them.
    while index < len(tokens) - 1 and tokens[index].startswith(b":"):
        old_mode, new_mode, _old_sha, new_sha, status = (
            part.decode("ascii") for part in tokens[index][1:].split(b" ")
        )
        if status[:1] in ("R", "C"):
            source, target = tokens[index + 1], tokens[index + 2]
            index += 3
            if status[:1] == "R":
                changes.append(
                    TreeChange("D", old_mode, MODE_NONE, zero_sha, decode_path(source), source)
                )
            changes.append(
                TreeChange("A", MODE_NONE, new_mode, new_sha, decode_path(target), target)
            )
            continue
        path = tokens[index + 1]
        changes.append(TreeChange(status[:1], old_mode, new_mode, new_sha, decode_path(path), path))
        index += 2
    stats = parse_numstat(b"\0".join(tokens[index:])) or []
    return changes, stats


def effect_of(output: bytes) -> set[tuple[bytes, str, str]]:
    """The output of a ``diff-tree -z --raw --no-renames``: each path that differs, with
    its new mode and object (a removal: none). Two changes with one effect on one base
    make one tree."""
    tokens = output.split(b"\0")
    effect = set()
    for meta, path in zip(tokens[0:-1:2], tokens[1::2], strict=True):
        _old_mode, new_mode, _old_sha, new_sha, _status = meta[1:].decode("ascii").split(" ")
        effect.add((path, new_mode, new_sha))
    return effect


def parse_numstat(output: bytes) -> list[FileStat] | None:
    """``apply --numstat -z``: ``added\tremoved\tpath\0``, or for a rename or copy
    ``added\tremoved\t\0old\0new\0``; ``-`` counts for binary content."""
    stats: list[FileStat] = []
    records = output.split(b"\0")
    index = 0
    while index < len(records) - 1:
        parts = records[index].split(b"\t")
        index += 1
        if len(parts) != 3:
            return None
        added, removed, path = parts
        old_path = None
        if path == b"":
            if index + 1 >= len(records):
                return None
            old_path, path = records[index], records[index + 1]
            index += 2
        stats.append(
            FileStat(
                decode_path(path),
                int(added) if added.isdigit() else 0,
                int(removed) if removed.isdigit() else 0,
                decode_path(old_path) if old_path is not None else None,
            )
        )
    return stats


def decode_path(raw: bytes) -> str:
    """A path as text; bytes that are not UTF-8 become a form no policy pattern allows."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace")


# --- reading names as git might -----------------------------------------------------------


def _header_names(rest: bytes) -> Iterator[bytes]:
    """``diff --git a/X b/X``: git takes X when both halves agree (renames name their
    ends on their own lines)."""
    if rest.startswith(b'"'):
        first = _unquote(rest)
        if first is None:
            return
        yield _strip_prefix(first[0])
        second = first[1].lstrip(b" \t")
        quoted = _unquote(second) if second.startswith(b'"') else (second, b"")
        if quoted is not None:
            yield _strip_prefix(quoted[0])
        return
    quote = rest.find(b'"')
    if quote > 0:
        second_quoted = _unquote(rest[quote:])
        if second_quoted is not None:
            yield _strip_prefix(second_quoted[0])
    # The split between equal halves is in the middle (prefixes of one length, ``a/``
    # and ``b/``); other prefixes are left to the check against git's own names.
    middle = len(rest) // 2
    if len(rest) % 2 and rest[middle : middle + 1] in (b" ", b"\t"):
        first_name, second_name = _strip_prefix(rest[:middle]), _strip_prefix(rest[middle + 1 :])
        if first_name == second_name:
            yield first_name


def _file_line_names(rest: bytes) -> Iterator[bytes]:
    """``--- a/X`` or ``+++ b/X``, maybe with a tab and a date after the name; none for
    ``/dev/null`` (a new or a removed file's other side)."""
    if rest.startswith(b"/dev/null") and rest[9:10] in (b"", b" ", b"\t", b"\r"):
        return
    if rest.startswith(b'"'):
        quoted = _unquote(rest)
        if quoted is not None:
            yield _strip_prefix(quoted[0])
    name = _NAME_END_RE.split(rest, maxsplit=1)[0]
    for variant in {name, name.rstrip(b" "), name.split(b" ", 1)[0]}:
        yield _strip_prefix(variant)


def _whole_names(rest: bytes) -> Iterator[bytes]:
    """``rename from X`` and its kin: the name whole (no prefix), quoted or not."""
    if rest.startswith(b'"'):
        quoted = _unquote(rest)
        if quoted is not None:
            yield quoted[0]
    yield _NAME_END_RE.split(rest, maxsplit=1)[0]


def _strip_prefix(name: bytes) -> bytes:
    """The name after its first slash (``a/``, or a leading ``/``), as ``-p1`` reads it;
    a name with no slash stays whole (git's guess for a patch whose names have none)."""
    slash = name.find(b"/")
    return name[slash + 1 :] if slash >= 0 else name


def _unquote(text: bytes) -> tuple[bytes, bytes] | None:
    """A C-style quoted name at the start of ``text`` (git's ``unquote_c_style``), and
    what follows its closing quote; None if it is not one."""
    out = bytearray()
    position = 1
    while position < len(text):
        byte = text[position]
        position += 1
        if byte == ord('"'):
            return bytes(out), text[position:]
        if byte != ord("\\"):
            out.append(byte)
            continue
        if position >= len(text):
            return None
        escape = text[position]
        position += 1
        if escape in _ESCAPES:
            out.append(_ESCAPES[escape])
        elif ord("0") <= escape <= ord("3"):
            digits = text[position - 1 : position + 2]
            if len(digits) != 3 or any(not ord("0") <= d <= ord("7") for d in digits):
                return None
            out.append(int(digits, 8))
            position += 2
        else:
            return None
    return None


__all__ = [
    "APPLY_TO_INDEX",
    "LITERAL_PATHS",
    "MAX_NAMED_BYTES",
    "MAX_NAMED_PATHS",
    "MODE_GITLINK",
    "MODE_NONE",
    "MODE_SYMLINK",
    "FileStat",
    "PartialApply",
    "PatchAnalysis",
    "TreeChange",
    "apply_partial",
    "decode_path",
    "effect_of",
    "index_info",
    "moves_paths",
    "named_paths",
    "names_of_numstat",
    "parse_comparison",
    "parse_numstat",
    "parse_tree_records",
    "to_args",
    "write_plain_index",
]
