"""What a publishing write would put on the forge: the range ``merge-base..head``, measured.

``apply_patch`` judges what nexus-mcp itself commits. But commits reach a branch by other
ways too: ``create_branch`` starts a branch at any commit (another branch, a tag, a sha,
a remote-tracking ref), and anyone editing the repository directly can move a branch
after nexus-mcp made it. So every write that publishes commits (``create_branch``, which
names a start point an approver never sees; ``open_pull_request``, which pushes; and
``merge_guarded``, which merges) judges what it publishes, with the same rules as a patch:

- **the whole change, tree to tree**: the tree of the merge-base of ``head`` and the
  target branch (no merge-base: the empty tree, so an unrelated history is judged
  whole) against the tree of ``head``, measured as ``analyze_patch`` measures a patch
  (``Repository._compare_trees``: every path added, changed or removed, both ends of a
  rename, modes, lines counted between the trees; ``_content_risks``: links, submodules,
  binary content). ``diff_bytes`` is the size of the diff git prints for it, read at
  most one byte past the policy's bound;
- **every commit of the range, one by one** (``rev-list head ^merge-base``, at most
  ``MAX_PUBLISHED_COMMITS``): the paths each commit changes against its parent (a root
  commit: everything it holds), and for a merge the paths it changes against every parent
  at once (``diff-tree -c``: content of its own, an "evil merge"). A commit that adds a
  workflow and a later one that removes it leave no trace in the tree-to-tree change, yet
  both are pushed: a disallowed path, a link or a submodule in any commit is refused.

Every object the measure reads is **checked against its id** (``_verify_objects``): git
does not hash what it reads from a pack, so whoever writes ``.git`` can forge a pack's
``.idx`` (or a multi-pack-index) to serve one object's content under another's id, hiding
a commit or a tree from this judge while the push, which sends real objects, publishes
them. ``rev-list --verify-objects`` is not enough: on this git (2.39) it hashes only the
tips and blobs, not the commits and trees the walk has already parsed. So the commits of
the range, their parents, the head and the merge-base are read with ``cat-file --batch``
and hashed here, as are their root trees, every tree either diff descends into (listed
by ``diff-tree -t``) and the blobs of the tree-to-tree change (whose content is
measured). Induction does the rest: a checked tree names only true ids. What git left
out of the range (its edge) it took for the target's history, read unchecked: each edge
commit is proven the target's own by a walk from the target whose commits are hashed
(``_prove_on_target``, at most ``MAX_TARGET_COMMITS``, past that ``too_large``). A
mismatch, a missing object or an unproven edge refuses the write as an unsafe
repository (``CONFLICT``, ``unsafe_repository``), naming nothing.

Nothing here writes to the repository: only ``merge-base``, ``rev-list``, ``diff-tree``
and ``cat-file`` run, in the repository's own object store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from nexus_mcp.errors import ConflictError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.repos import PatchFacts
from nexus_mcp.repos.git import GitOutputTooLargeError
from nexus_mcp.repos.patches import MODE_GITLINK, MODE_SYMLINK, decode_path
from nexus_mcp.repos.repository import REASON_UNSAFE_REPOSITORY, Repository

log = get_logger(__name__)

# Commits of one range judged one by one; a longer range is refused (``too_large``).
MAX_PUBLISHED_COMMITS = 1000
# Commits hashed to prove that the range's edge is the target's own (``_prove_on_target``).
MAX_TARGET_COMMITS = 10 * MAX_PUBLISHED_COMMITS
_DIFF_BYTES = ("diff-tree", "-p", "--text", "-M", "--no-ext-diff", "--no-textconv", "--no-color")
_HISTORY = (
    *("diff-tree", "--stdin", "-r", "-z", "--root", "--no-commit-id", "--raw", "-c"),
    "--no-renames",
)
# Every tree a per-commit diff reads, against each parent apart (``-m``), for the check.
_HISTORY_TREES = ("diff-tree", "--stdin", "-r", "-t", "-z", "--root", "--no-commit-id", "-m")
_MODE_TREE = "040000"


_NO_HISTORY = PatchFacts(diff_bytes=0, changed_paths=(), lines_added=0, lines_removed=0)


@dataclass(frozen=True)
class RangeAnalysis:
    """The measured range ``base..head`` (module docstring). ``too_large``: the range has
    more commits, or more change, than can be judged; it is refused whole."""

    head: str
    base: str | None  # the merge-base; None: no common history
    facts: PatchFacts  # the tree-to-tree change
    history: PatchFacts = _NO_HISTORY  # paths, links and submodules of each commit
    commits: int = 0
    too_large: bool = False

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path the range touches, in the whole change or in one of its commits."""
        return tuple(dict.fromkeys(self.facts.changed_paths + self.history.changed_paths))


def commit_of(repository: Repository, sha: str) -> str | None:
    """The commit ``sha`` names in the object store (any object id, peeled), or None."""
    result = repository.runner.run(
        ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{sha}^{{commit}}"],
        check=False,
    )
    found = result.stdout.decode("ascii", "replace").strip()
    return found if result.returncode == 0 and found else None


def merge_base(repository: Repository, head: str, target: str | None) -> str | None:
    if target is None:
        return None
    result = repository.runner.run(["merge-base", "--end-of-options", head, target], check=False)
    found = result.stdout.decode("ascii", "replace").strip()
    return found if result.returncode == 0 and found else None


def analyze_range(
    repository: Repository, head: str, target: str | None, *, max_diff_bytes: int
) -> RangeAnalysis:
    """Measure what publishing ``head`` adds to ``target`` (a commit, or None for none)."""
    base = merge_base(repository, head, target)
    try:
        return _analyze(repository, head, base, target, max_diff_bytes)
    except (GitOutputTooLargeError, _TooLargeError):
        return RangeAnalysis(head, base, _NO_HISTORY, too_large=True)


class _TooLargeError(Exception):
    """The target's side holds more commits than ``MAX_TARGET_COMMITS`` to prove the edge."""


def _analyze(
    repository: Repository, head: str, base: str | None, target: str | None, max_diff_bytes: int
) -> RangeAnalysis:
    runner = repository.runner
    listed = runner.run(
        [
            "rev-list",
            f"--max-count={MAX_PUBLISHED_COMMITS + 1}",
            "--end-of-options",
            head,
            *([f"^{base}"] if base is not None else []),
        ]
    )
    commits = listed.stdout.split()
    if len(commits) > MAX_PUBLISHED_COMMITS:
        return RangeAnalysis(head, base, _NO_HISTORY, commits=len(commits), too_large=True)
    # The commits first: once their content hashes to their ids, the trees and parents
    # they name are true, and everything the diffs below read is named by them.
    ends = [head, *([base] if base is not None else [])]
    in_range = [commit.decode("ascii") for commit in commits]
    parents_of, trees = _verify_commits(repository, [*ends, *in_range])
    parents = {parent: None for oid in in_range for parent in parents_of[oid]}
    _, parent_trees = _verify_commits(repository, [p for p in parents if p not in trees])
    if target is not None and base is not None:
        # What git left out of the range (its edge: the range's parents outside it, the
        # merge-base, or the head itself for an empty range) it took for the target's
        # history; that walk read commits checked nowhere above. Prove each one is.
        edge = {p for p in parents if p not in parents_of} | {base}
        _prove_on_target(repository, target, edge if in_range else edge | {head})
    old_tree = trees[base] if base is not None else _empty_tree(repository)
    new_tree = trees[head]
    _verify_objects(repository, {old_tree, new_tree, *trees.values(), *parent_trees.values()})
    _verify_objects(repository, _changed_ids(repository, [old_tree, new_tree], trees_only=False))
    if commits:
        pairs = b"\n".join(commits) + b"\n"
        _verify_objects(repository, _changed_ids(repository, None, stdin=pairs, trees_only=True))
    changes, stats = repository._compare_trees(old_tree, new_tree, {})
    binary, symlinks, submodules = repository._content_risks(changes, {})
    printed = runner.run(
        [*_DIFF_BYTES, old_tree, new_tree],
        max_output_bytes=max_diff_bytes + 1,
        truncate=True,
    )
    facts = PatchFacts(
        diff_bytes=len(printed.stdout),  # cut at the bound plus one byte: over it
        changed_paths=tuple(dict.fromkeys(c.path for c in changes)),
        lines_added=sum(s.lines_added for s in stats),
        lines_removed=sum(s.lines_removed for s in stats),
        binary_paths=binary,
        symlink_paths=symlinks,
        submodule_paths=submodules,
    )
    paths: dict[str, None] = {}
    links: dict[str, None] = {}
    gitlinks: dict[str, None] = {}
    if commits:
        listing = runner.run(list(_HISTORY), stdin=b"\n".join(commits) + b"\n").stdout
        for path, modes in _parse_history(listing):
            paths[path] = None
            if MODE_SYMLINK in modes:
                links[path] = None
            if MODE_GITLINK in modes:
                gitlinks[path] = None
    history = PatchFacts(
        diff_bytes=0,
        changed_paths=tuple(paths),
        lines_added=0,
        lines_removed=0,
        symlink_paths=tuple(links),
        submodule_paths=tuple(gitlinks),
    )
    return RangeAnalysis(head, base, facts, history, commits=len(commits))


def _unsafe() -> ConflictError:
    return ConflictError(
        "the repository's object store is not safe to read", reason=REASON_UNSAFE_REPOSITORY
    )


def _read_objects(repository: Repository, ids: Iterable[str]) -> dict[str, tuple[bytes, bytes]]:
    """``cat-file --batch`` of ``ids``: each id's type and content, every content checked
    to hash to its id (``_unsafe`` when one does not, or is missing). Bounded by the
    runner's output bound (``GitOutputTooLargeError``: the range is too large to judge)."""
    wanted = list(dict.fromkeys(ids))
    if not wanted:
        return {}
    raw = repository.runner.run(
        ["cat-file", "--batch"], stdin="".join(f"{oid}\n" for oid in wanted).encode("ascii")
    ).stdout
    algorithm = "sha256" if len(repository.zero_sha) == 64 else "sha1"
    found: dict[str, tuple[bytes, bytes]] = {}
    at = 0
    for oid in wanted:
        end = raw.find(b"\n", at)
        fields = raw[at:end].split(b" ") if end >= 0 else []
        if len(fields) != 3 or fields[0] != oid.encode("ascii") or not fields[2].isdigit():
            log.warning("repo_object_unreadable", repo=repository.name)
            raise _unsafe()
        kind, size = fields[1], int(fields[2])
        content = raw[end + 1 : end + 1 + size]
        at = end + 1 + size + 1
        digest = hashlib.new(algorithm, kind + b" " + str(size).encode() + b"\0" + content)
        if len(content) != size or digest.hexdigest() != oid:
            # The store serves another object's content under this id: a forged pack
            # index or multi-pack-index (or a corrupt store). Logged, never echoed.
            log.warning("repo_object_hash_mismatch", repo=repository.name)
            raise _unsafe()
        found[oid] = (kind, content)
    return found


def _verify_objects(repository: Repository, ids: Iterable[str]) -> None:
    _read_objects(repository, ids)


def _verify_commits(
    repository: Repository, commits: Iterable[str]
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Check ``commits`` against their ids: the parents each names, and each one's tree."""
    parents: dict[str, list[str]] = {}
    trees: dict[str, str] = {}
    for oid, (kind, content) in _read_objects(repository, commits).items():
        if kind != b"commit":
            raise _unsafe()
        parents[oid] = []
        for line in content.split(b"\n\n", 1)[0].split(b"\n"):
            if line.startswith(b"tree "):
                trees[oid] = line[5:].decode("ascii", "replace")
            elif line.startswith(b"parent "):
                parents[oid].append(line[7:].decode("ascii", "replace"))
        if oid not in trees:
            raise _unsafe()
    return parents, trees


def _prove_on_target(repository: Repository, target: str, claims: set[str]) -> None:
    """``_unsafe`` unless every commit of ``claims`` is truly ``target`` or one of its
    ancestors. ``rev-list`` walks from what is proven (first the target) down to what is
    not; every commit it lists is hashed, so its parents are true, and a claim that is a
    parent of one is proven. Each round proves at least one claim or the walk lied; at
    most ``MAX_TARGET_COMMITS`` commits in all (past that ``_TooLargeError``)."""
    proven = {target}
    sources = [target]
    pending = claims - proven
    walked = 0
    while pending:
        listed = repository.runner.run(
            [
                "rev-list",
                f"--max-count={MAX_TARGET_COMMITS + 1 - walked}",
                "--end-of-options",
                *sources,
                *(f"^{claim}" for claim in sorted(pending)),
            ]
        ).stdout.split()
        walked += len(listed)
        if walked > MAX_TARGET_COMMITS:
            raise _TooLargeError
        parents_of, _ = _verify_commits(repository, [oid.decode("ascii") for oid in listed])
        for oid, parents in parents_of.items():
            proven.add(oid)
            proven.update(parents)
        found = pending & proven
        if not found:
            log.warning("repo_range_edge_unproven", repo=repository.name)
            raise _unsafe()
        sources = sorted(found)
        pending -= found


def _changed_ids(
    repository: Repository,
    pair: list[str] | None,
    *,
    stdin: bytes | None = None,
    trees_only: bool,
) -> set[str]:
    """The ids on both sides of every entry a raw diff lists, trees included (``-t``):
    every object the diff read. Submodule commits (not in this store) and the null id
    are left out; ``trees_only`` keeps the trees alone."""
    if pair is not None:
        args = ["diff-tree", "-r", "-t", "-z", "--no-renames", *pair]
    else:
        args = [*_HISTORY_TREES, "--no-renames"]
    raw = repository.runner.run(args, stdin=stdin).stdout
    ids: set[str] = set()
    tokens = raw.split(b"\0")
    index = 0
    while index < len(tokens) - 1:
        meta = tokens[index]
        index += 1
        if not meta.startswith(b":"):
            continue
        index += 1  # the path that follows the record: never parsed as one
        parts = meta.lstrip(b":").split(b" ")
        sides = (len(parts) - 1) // 2  # modes, then as many ids
        for mode, oid in zip(parts[:sides], parts[sides : 2 * sides], strict=True):
            text = mode.decode("ascii", "replace")
            if text == MODE_GITLINK or oid.strip(b"0") == b"":
                continue
            if trees_only and text != _MODE_TREE:
                continue
            ids.add(oid.decode("ascii", "replace"))
    return ids


def _empty_tree(repository: Repository) -> str:
    """The empty tree's id (git knows that object without storing it: nothing is written)."""
    result = repository.runner.run(["hash-object", "-t", "tree", "--stdin"], stdin=b"")
    return result.stdout.decode("ascii").strip()


def _parse_history(raw: bytes) -> list[tuple[str, tuple[str, ...]]]:
    """``diff-tree -z --raw`` records, plain (``:m1 m2 s1 s2 S``) or combined
    (``::m1 m2 m3 s1 s2 s3 SS``): each path with every mode it had on either side."""
    tokens = raw.split(b"\0")
    records: list[tuple[str, tuple[str, ...]]] = []
    index = 0
    while index < len(tokens) - 1:
        meta = tokens[index]
        if not meta.startswith(b":"):
            index += 1
            continue
        parents = len(meta) - len(meta.lstrip(b":"))
        parts = meta.lstrip(b":").split(b" ")
        modes = tuple(part.decode("ascii", "replace") for part in parts[: parents + 1])
        records.append((decode_path(tokens[index + 1]), modes))
        index += 2
    return records


__all__ = ["MAX_PUBLISHED_COMMITS", "RangeAnalysis", "analyze_range", "commit_of", "merge_base"]
