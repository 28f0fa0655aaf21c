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

Nothing here writes to the repository: only ``merge-base``, ``rev-list``, ``diff-tree``
and ``cat-file`` run, in the repository's own object store.
"""

from __future__ import annotations

from dataclasses import dataclass

from nexus_mcp.policy.repos import PatchFacts
from nexus_mcp.repos.git import GitOutputTooLargeError
from nexus_mcp.repos.repository import MODE_GITLINK, MODE_SYMLINK, Repository, _decode_path

# Commits of one range judged one by one; a longer range is refused (``too_large``).
MAX_PUBLISHED_COMMITS = 1000
_DIFF_BYTES = ("diff-tree", "-p", "--text", "-M", "--no-ext-diff", "--no-textconv", "--no-color")
_HISTORY = (
    *("diff-tree", "--stdin", "-r", "-z", "--root", "--no-commit-id", "--raw", "-c"),
    "--no-renames",
)


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
        return _analyze(repository, head, base, max_diff_bytes)
    except GitOutputTooLargeError:
        return RangeAnalysis(head, base, _NO_HISTORY, too_large=True)


def _analyze(
    repository: Repository, head: str, base: str | None, max_diff_bytes: int
) -> RangeAnalysis:
    runner = repository.runner
    old_tree = f"{base}^{{tree}}" if base is not None else _empty_tree(repository)
    new_tree = f"{head}^{{tree}}"
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
        return RangeAnalysis(head, base, facts, commits=len(commits), too_large=True)
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
        records.append((_decode_path(tokens[index + 1]), modes))
        index += 2
    return records


__all__ = ["MAX_PUBLISHED_COMMITS", "RangeAnalysis", "analyze_range", "commit_of", "merge_base"]
