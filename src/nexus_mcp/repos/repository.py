"""One configured git repository: its refs, its trees and blobs, and its two writes.

Reads never look at the working tree: every read is of git objects at a commit (a ref
the caller names, ``HEAD`` by default), through ``ls-tree`` and ``cat-file``. A link in
a tree is reported as a link and never followed; a submodule as a submodule. So no path
a caller sends can reach outside the repository, whatever the working tree holds.

Writes never touch the working tree or the user's index either:

- ``create_branch`` is one ``update-ref refs/heads/<name> <commit> <zero>``: it creates
  the branch or fails if it exists, atomically.
- ``apply_patch`` applies the patch to a private index read from the branch tip
  (``read-tree``, ``apply --cached``, ``write-tree``), checks that the tree makes the
  very changes that were measured, commits it with ``commit-tree`` and moves the branch
  with ``update-ref <branch> <new> <tip>``, a compare-and-swap: the commit lands only if
  the branch still points at the tip the patch was checked against. A branch checked out
  in a working tree is refused (moving it under its checkout would leave the user's
  files reversed against it).

What a patch does is measured by git itself: ``analyze_patch`` applies it to a throwaway
index and a throwaway object directory (the repository's objects are only read, through
``GIT_ALTERNATE_OBJECT_DIRECTORIES``), then compares the tip with the result
(``diff-index --raw`` on the paths the index holds, or ``diff-tree --raw`` of the whole
trees). The index holds the tip's entries that git reads to apply that patch, or the
whole tree when only that can tell (``repos/patches.py``). Every policy rule is judged on
that comparison (every path really added, changed or removed, both ends of a rename,
modes, content), never on a second parse of the patch text that could disagree with
git's: the patch's own names only choose which entries the index holds, and git's names
are checked against them.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nexus_mcp.errors import (
    ConfigError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
)
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.repos import MAX_BRANCH_CHARS, PatchFacts, RepositoryConfig, WritePolicy
from nexus_mcp.repos.git import GitError, GitOutputTooLargeError, GitResult, GitRunner
from nexus_mcp.repos.patches import (
    APPLY_TO_INDEX,
    LITERAL_PATHS,
    MODE_GITLINK,
    MODE_SYMLINK,
    FileStat,
    PatchAnalysis,
    TreeChange,
    apply_partial,
    decode_path,
    effect_of,
    parse_comparison,
    parse_numstat,
    to_args,
)
from nexus_mcp.repos.scratch import ScratchFolders, read_loose_blobs
from nexus_mcp.repos.store import StoreGuard, UnsafeStoreError
from nexus_mcp.workspace.commits import CommitGuard
from nexus_mcp.workspace.paths import normalize_relative
from nexus_mcp.workspace.search import is_binary

MODE_TREE = "040000"
MODE_FILE = "100644"
MODE_EXECUTABLE = "100755"
_COMPARE_TREES = ("diff-tree", "-r", "-z", "--raw", "--numstat", "--text", "-M", "--no-ext-diff")
_COMPARE_INDEX = ("diff-index", "--cached", *_COMPARE_TREES[1:])
MAX_REF_CHARS = 256
# A ref a caller may name: a branch or tag name, or a hex object id, with ~N / ^N steps.
# No ':' (tree:path syntax), no '@{' (reflog), no '^{/' (message search), no leading '-'.
_REF_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/-]*(?:[~^][0-9]{0,4})*$")
_BRANCH_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$")
_HEX_RE = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
# New content read back to decide it is text, at most: more is refused as binary.
MAX_SNIFF_OUTPUT_BYTES = 16 * 1024 * 1024
# Indexes of branch tips kept in memory per repository (read-tree runs once per tip).
INDEX_CACHE_BYTES = 64 * 1024 * 1024
BLOB_BATCH_COUNT = 200
REASON_BRANCH_EXISTS = "branch_exists"
REASON_BRANCH_MOVED = "branch_moved"
REASON_BRANCH_CHECKED_OUT = "branch_checked_out"
REASON_NOT_A_FILE = "not_a_file"
REASON_UNSAFE_REPOSITORY = "unsafe_repository"

log = get_logger(__name__)


@dataclass(frozen=True)
class TreeEntry:
    path: str
    mode: str
    kind: str  # "blob", "tree" or "commit" (a submodule)
    sha: str
    size: int | None

    @property
    def type(self) -> str:
        if self.kind == "tree":
            return "directory"
        if self.kind == "commit":
            return "submodule"
        return "symlink" if self.mode == MODE_SYMLINK else "file"


def check_ref(ref: object, *, field_name: str = "ref") -> str:
    """A ref in the form callers may name it (``_REF_RE``), or ``INVALID_INPUT``."""
    if (
        not isinstance(ref, str)
        or not 0 < len(ref) <= MAX_REF_CHARS
        or not _REF_RE.fullmatch(ref)
        or ".." in ref
        or "//" in ref
        or ref.endswith("/")
        or any(part.endswith((".lock", ".")) for part in ref.split("/"))
    ):
        raise InvalidInputError(field=field_name)
    return ref


def check_branch_name(branch: object, *, field_name: str = "branch") -> str:
    """A branch name git accepts and a caller may use (no leading '-', no '..', …)."""
    if (
        not isinstance(branch, str)
        or not 0 < len(branch) <= MAX_BRANCH_CHARS
        or not _BRANCH_RE.fullmatch(branch)
        or ".." in branch
        or "//" in branch
        or "/." in branch
        or branch.endswith(("/", "."))
        or any(part.endswith(".lock") for part in branch.split("/"))
        or branch == "HEAD"
    ):
        raise InvalidInputError(field=field_name)
    return branch


def check_sha(value: object, *, field_name: str) -> str:
    if not isinstance(value, str) or not _HEX_RE.fullmatch(value):
        raise InvalidInputError(field=field_name)
    return value


def check_repo_path(path: object, *, field_name: str = "path") -> str:
    """A repository-relative path ('' for the root), or ``INVALID_PATH``."""
    if not isinstance(path, str):
        raise InvalidInputError(field=field_name)
    return normalize_relative(path)


class Repository:
    """One repository of the ``repos:`` section, opened and checked at start-up."""

    def __init__(
        self,
        name: str,
        config: RepositoryConfig,
        *,
        runner: GitRunner,
        work_tree: Path | None,
        common_dir: Path,
        default_branch: str,
        zero_sha: str,
        store: StoreGuard | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.runner = runner
        self.work_tree = work_tree
        self.common_dir = common_dir
        self.store = store or StoreGuard(runner.git_dir, common_dir)
        # Before every git command of this repository (writes, pushes and scratch runs
        # included), and after every read (``_read``): repos/store.py.
        runner.guard = self.check_store
        self.default_branch = default_branch
        self.zero_sha = zero_sha
        self._index_cache: OrderedDict[str, bytes] = OrderedDict()
        self._index_lock = threading.Lock()
        self._scratch = ScratchFolders()

    @property
    def policy(self) -> WritePolicy | None:
        return self.config.write_policy

    @property
    def objects_dir(self) -> Path:
        return self.common_dir / "objects"

    def check_store(self) -> None:
        """``CONFLICT`` unless every object and ref git can read is the repository's own
        (``repos/store.py``); the refusal names no path and no sha."""
        try:
            self.store.check()
        except UnsafeStoreError as exc:
            log.warning("repo_store_unsafe", repo=self.name, problem=str(exc))
            raise ConflictError(
                "the repository's object store is not safe to read",
                reason=REASON_UNSAFE_REPOSITORY,
            ) from None

    def _read(self, args: Sequence[str], **kwargs: Any) -> GitResult:
        """A read: checked before (the runner's guard) and after the command, so that a
        store changed while git ran is refused rather than its output used."""
        result = self.runner.run(args, **kwargs)
        self.check_store()
        return result

    # --- refs -------------------------------------------------------------------------

    def resolve_commit(self, ref: str, *, field_name: str = "ref") -> str:
        """The commit a ref names; ``NOT_FOUND`` when it names none."""
        check_ref(ref, field_name=field_name)
        result = self._read(
            ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"],
            check=False,
        )
        sha = result.stdout.decode("ascii", "replace").strip()
        if result.returncode != 0 or not _HEX_RE.fullmatch(sha):
            raise NotFoundError(reason="ref_not_found")
        return sha

    def branch_tip(self, branch: str) -> str | None:
        check_branch_name(branch)
        result = self._read(
            ["rev-parse", "--verify", "--quiet", "--end-of-options", f"refs/heads/{branch}"],
            check=False,
        )
        sha = result.stdout.decode("ascii", "replace").strip()
        return sha if result.returncode == 0 and _HEX_RE.fullmatch(sha) else None

    def branch_and_default_tips(self, branch: str) -> tuple[str, str] | None:
        """``branch_tip(branch)`` and ``resolve_commit(default_branch)`` in one ``rev-parse``
        (a git process less), or None when either does not plainly resolve: the caller then
        asks each on its own, which reports the failure as it always does.

        Not ``--verify``, which takes one name. Each name is checked first (neither starts
        with ``-`` or ``^`` nor holds ``..``, so each is one revision printed on one line, in
        order); ``--`` makes a name that names nothing an error, not a path."""
        check_branch_name(branch)
        try:
            default = check_ref(self.default_branch)
        except InvalidInputError:
            return None
        result = self._read(
            ["rev-parse", "--revs-only", f"refs/heads/{branch}", f"{default}^{{commit}}", "--"],
            check=False,
        )
        shas = result.stdout.decode("ascii", "replace").split()
        if result.returncode != 0 or len(shas) != 2 or not all(map(_HEX_RE.fullmatch, shas)):
            return None
        return shas[0], shas[1]

    def is_symbolic(self, branch: str) -> bool:
        """Whether ``refs/heads/<branch>`` is a symbolic ref (an alias of another ref, maybe
        a protected one, maybe one that does not exist yet): writes refuse such a name."""
        check_branch_name(branch)
        result = self.runner.run(["symbolic-ref", "--quiet", f"refs/heads/{branch}"], check=False)
        return result.returncode == 0

    def checked_out_branches(self) -> set[str]:
        """Branches some working tree of the repository has checked out, or is rebasing or
        bisecting (git lists those worktrees as detached, yet moving the branch under them
        breaks the operation; git itself refuses to)."""
        result = self.runner.run(["worktree", "list", "--porcelain", "-z"], check=False)
        branches = set()
        for record in result.stdout.split(b"\0"):
            if record.startswith(b"branch refs/heads/"):
                branches.add(record[len(b"branch refs/heads/") :].decode("utf-8", "replace"))
        git_dirs = [self.common_dir, self.runner.git_dir]
        with contextlib.suppress(OSError):
            git_dirs += sorted((self.common_dir / "worktrees").iterdir())
        for git_dir in git_dirs:
            for name in ("rebase-merge/head-name", "rebase-apply/head-name", "BISECT_START"):
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    text = (git_dir / name).read_text(encoding="utf-8").strip()
                    branches.add(text.removeprefix("refs/heads/"))
        return branches

    # --- trees and blobs --------------------------------------------------------------

    def entry(self, commit: str, path: str) -> TreeEntry | None:
        """The tree entry at ``path`` (``''``: the root tree), or None."""
        if not path:
            tree = self._read(["rev-parse", "--verify", f"{commit}^{{tree}}"])
            return TreeEntry("", MODE_TREE, "tree", tree.stdout.decode().strip(), None)
        found = list(self._ls_tree(commit, path, recursive=False, children=False))
        return found[0] if found and found[0].path == path else None

    def entries(self, commit: str, paths: Sequence[str]) -> dict[str, TreeEntry]:
        """The entries at several exact paths, in one ``ls-tree`` (missing ones absent)."""
        args = ["ls-tree", "-z", "--long", "--full-tree", commit, "--", *paths]
        result = self._read(args, env={"GIT_LITERAL_PATHSPECS": "1"}, check=False)
        found = (_parse_ls_tree(r) for r in result.stdout.split(b"\0") if r)
        return {entry.path: entry for entry in found if entry.path in paths}

    def list_tree(self, commit: str, path: str, *, recursive: bool) -> Iterator[TreeEntry]:
        """Entries below the folder ``path`` (its children, or everything with recursive)."""
        return self._ls_tree(commit, path, recursive=recursive, children=True)

    def _ls_tree(
        self, commit: str, path: str, *, recursive: bool, children: bool
    ) -> Iterator[TreeEntry]:
        args = ["ls-tree", "-z", "--long", "--full-tree"]
        if recursive:
            args.append("-r")
        args.append(commit)
        if path:
            args += ["--", f"{path}/" if children else path]
        # A listing past the output bound is cut at its last whole entry: every caller
        # stops far sooner (max_list_entries, max_files_scanned) and says it was cut.
        result = self._read(args, env={"GIT_LITERAL_PATHSPECS": "1"}, check=False, truncate=True)
        if result.returncode != 0 and not result.truncated:
            raise NotFoundError(reason="tree_not_found")
        records = result.stdout.split(b"\0")
        if result.truncated:
            records = records[:-1]  # the last one may be cut short
        for record in records:
            if record:
                yield _parse_ls_tree(record)

    def read_entries(self, entries: Sequence[TreeEntry]) -> Iterator[dict[str, bytes]]:
        """The contents of blob entries, by id, one ``cat-file --batch`` per batch: at most
        ``BLOB_BATCH_COUNT`` blobs and half the output bound in bytes (their listed sizes),
        so no batch can run past the bound. A blob larger than that alone is left out."""
        budget = self.runner.max_output_bytes // 2
        batch: list[str] = []
        size = 0
        for entry in {e.sha: e for e in entries}.values():
            length = entry.size or 0
            if length > budget:
                continue
            if batch and (len(batch) >= BLOB_BATCH_COUNT or size + length > budget):
                yield self._cat(batch)
                batch, size = [], 0
            batch.append(entry.sha)
            size += length
        if batch:
            yield self._cat(batch)

    def read_blob(self, sha: str) -> bytes:
        return self._cat([sha]).get(sha, b"")

    def _cat(self, shas: Sequence[str]) -> dict[str, bytes]:
        stdin = "".join(f"{sha}\n" for sha in shas).encode("ascii")
        return _parse_batch(self._read(["cat-file", "--batch"], stdin=stdin).stdout)

    # --- patches ----------------------------------------------------------------------

    def analyze_patch(self, base_commit: str, patch: bytes) -> PatchAnalysis:
        """Apply ``patch`` to ``base_commit`` in a throwaway index and object directory:
        an index of the entries the patch reaches (``repos/patches.py``), or of the whole
        tree when only that can tell."""
        with self._scratch.folder() as scratch:
            env = self._scratch_env(scratch, objects=scratch / "objects")
            partial = apply_partial(self.runner, base_commit, patch, env)
            if partial is None:
                return self._analyze(base_commit, patch, env)
            if not partial.applies:
                assert partial.numstat is not None
                return self._refused(base_commit, patch, partial.numstat)
            # Between the commit and the index, on the paths the index holds (not their
            # folders, which would take in all they hold): the rest of the tree is the
            # same on both sides.
            changes, stats = self._compare(
                [*_COMPARE_INDEX, base_commit, "--", *to_args(partial.paths)],
                {**env, **LITERAL_PATHS},
            )
            return self._applied(base_commit, patch, changes, stats, env)

    def _analyze(self, base_commit: str, patch: bytes, env: dict[str, str]) -> PatchAnalysis:
        self._load_index(base_commit, env)
        applied = self.runner.run([*APPLY_TO_INDEX, "-"], stdin=patch, env=env, check=False)
        if applied.returncode != 0:
            numstat = self.runner.run(["apply", "--numstat", "-z", "-"], stdin=patch, check=False)
            return self._refused(base_commit, patch, numstat)
        tree = self.runner.run(["write-tree"], env=env).stdout.decode("ascii").strip()
        changes, stats = self._compare_trees(f"{base_commit}^{{tree}}", tree, env)
        return self._applied(base_commit, patch, changes, stats, env)

    def _refused(self, base_commit: str, patch: bytes, numstat: GitResult) -> PatchAnalysis:
        """A patch that does not apply: what it says it does, for the caller's summary
        (git's own reading of it), landing nowhere."""
        stats = parse_numstat(numstat.stdout) if numstat.returncode == 0 else None
        facts = PatchFacts(
            diff_bytes=len(patch),
            changed_paths=tuple(dict.fromkeys(p for s in stats or () for p in _ends(s))),
            lines_added=sum(s.lines_added for s in stats or ()),
            lines_removed=sum(s.lines_removed for s in stats or ()),
        )
        return PatchAnalysis(base_commit, False, facts, files=tuple(stats or ()))

    def _applied(
        self,
        base_commit: str,
        patch: bytes,
        changes: list[TreeChange],
        stats: list[FileStat],
        env: dict[str, str],
    ) -> PatchAnalysis:
        # Lines are counted between the trees, not read from the patch text: a copy, a
        # binary literal or a mode line changes content the patch's own count never shows.
        binary, symlinks, submodules = self._content_risks(changes, env)
        facts = PatchFacts(
            diff_bytes=len(patch),
            changed_paths=tuple(c.path for c in changes),
            lines_added=sum(s.lines_added for s in stats),
            lines_removed=sum(s.lines_removed for s in stats),
            binary_paths=binary,
            symlink_paths=symlinks,
            submodule_paths=submodules,
        )
        return PatchAnalysis(base_commit, True, facts, tuple(changes), tuple(stats))

    def _load_index(self, commit: str, env: Mapping[str, str]) -> None:
        """The scratch index of ``commit``'s tree: ``read-tree`` once per commit, then a copy
        of the bytes it wrote (an index of a tree holds nothing but that tree)."""
        index = Path(env["GIT_INDEX_FILE"])
        with self._index_lock:
            cached = self._index_cache.get(commit)
            if cached is not None:
                self._index_cache.move_to_end(commit)
        if cached is not None:
            index.write_bytes(cached)
            return
        self.runner.run(["read-tree", commit], env=env)
        data = index.read_bytes()
        if len(data) > INDEX_CACHE_BYTES // 4:
            return
        with self._index_lock:
            self._index_cache[commit] = data
            while sum(len(v) for v in self._index_cache.values()) > INDEX_CACHE_BYTES:
                self._index_cache.popitem(last=False)

    def _compare_trees(
        self, old: str, new: str, env: dict[str, str]
    ) -> tuple[list[TreeChange], list[FileStat]]:
        """Every path that differs between two trees, and the lines added and removed.

        One ``diff-tree`` prints both: the raw records (a rename's two ends become a
        removal and an addition, so each path is judged) and the numstat, every file read
        as text (``--text``: attributes cannot hide a file's lines), renames paired
        (``-M``) so a move is not counted twice, while a copy counts every line it adds.
        """
        return self._compare([*_COMPARE_TREES, old, new], env)

    def _compare(
        self, args: Sequence[str], env: dict[str, str]
    ) -> tuple[list[TreeChange], list[FileStat]]:
        """The changes and line counts of a ``diff-tree`` or ``diff-index`` with the
        options of ``_COMPARE_TREES``."""
        return parse_comparison(self.runner.run(args, env=env).stdout, self.zero_sha)

    def _content_risks(
        self, changes: Sequence[TreeChange], env: dict[str, str]
    ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        symlinks = tuple(c.path for c in changes if MODE_SYMLINK in (c.old_mode, c.new_mode))
        submodules = tuple(c.path for c in changes if MODE_GITLINK in (c.old_mode, c.new_mode))
        texts = [c for c in changes if c.new_mode in (MODE_FILE, MODE_EXECUTABLE)]
        if not texts:
            return (), symlinks, submodules
        ids = list(dict.fromkeys(c.new_sha for c in texts))
        # What this call's git wrote to its scratch objects is read back there.
        scratch = env.get("GIT_OBJECT_DIRECTORY")
        blobs = read_loose_blobs(Path(scratch), ids, MAX_SNIFF_OUTPUT_BYTES) if scratch else {}
        left = [i for i in ids if i not in (blobs or {})]
        if blobs is not None and left:
            try:
                batch = self.runner.run(
                    ["cat-file", "--batch"],
                    stdin="".join(f"{i}\n" for i in left).encode("ascii"),
                    env=env,
                    max_output_bytes=max(1, MAX_SNIFF_OUTPUT_BYTES - sum(map(len, blobs.values()))),
                )
                blobs.update(_parse_batch(batch.stdout))
            except GitOutputTooLargeError:
                blobs = None
        if blobs is None:
            # New content this large is not a reviewable text change: refused.
            return tuple(c.path for c in texts), symlinks, submodules
        binary = tuple(c.path for c in texts if _is_binary_blob(blobs.get(c.new_sha, b"")))
        return binary, symlinks, submodules

    # --- writes -----------------------------------------------------------------------

    def create_branch(self, branch: str, commit: str, guard: CommitGuard | None) -> None:
        """Create ``refs/heads/<branch>`` at ``commit``; ``CONFLICT`` if it exists."""
        check_branch_name(branch)
        if self.branch_tip(branch) is not None:
            raise ConflictError("branch already exists", reason=REASON_BRANCH_EXISTS)
        with committing(guard):
            result = self.runner.run(
                [
                    "update-ref",
                    "--no-deref",
                    "-m",
                    "nexus-mcp: create_branch",
                    f"refs/heads/{branch}",
                    commit,
                    self.zero_sha,
                ],
                check=False,
            )
        if result.returncode != 0:
            raise ConflictError("branch already exists", reason=REASON_BRANCH_EXISTS)

    def commit_patch(
        self,
        branch: str,
        analysis: PatchAnalysis,
        patch: bytes,
        *,
        message: str,
        author: tuple[str, str],
        committer: tuple[str, str],
        guard: CommitGuard | None,
    ) -> str:
        """Commit what ``analysis`` measured onto ``branch``; returns the new commit.

        The patch is applied again, now into the repository's object store, to an index of
        the whole base tree, and must make the very changes that were measured (on the same
        base, the same tree); the branch moves only from the measured base.
        """
        if branch in self.checked_out_branches():
            raise ConflictError("branch is checked out", reason=REASON_BRANCH_CHECKED_OUT)
        with self._scratch.folder() as scratch:
            env = self._scratch_env(scratch, objects=None)
            self._load_index(analysis.base_commit, env)
            applied = self.runner.run([*APPLY_TO_INDEX, "-"], stdin=patch, env=env, check=False)
            if applied.returncode != 0 or not analysis.applies:
                raise ConflictError("patch no longer applies", reason=REASON_BRANCH_MOVED)
            tree = self.runner.run(["write-tree"], env=env).stdout.decode("ascii").strip()
            measured = {(c.raw_path, c.new_mode, c.new_sha) for c in analysis.changes}
            if self._effect_of(analysis.base_commit, tree) != measured:
                raise ConflictError("patch no longer applies", reason=REASON_BRANCH_MOVED)
        identity = {
            "GIT_AUTHOR_NAME": author[0],
            "GIT_AUTHOR_EMAIL": author[1],
            "GIT_COMMITTER_NAME": committer[0],
            "GIT_COMMITTER_EMAIL": committer[1],
        }
        commit = (
            self.runner.run(
                ["commit-tree", tree, "-p", analysis.base_commit, "-F", "-"],
                stdin=message.encode("utf-8"),
                env=identity,
            )
            .stdout.decode("ascii")
            .strip()
        )
        with committing(guard):
            moved = self.runner.run(
                [
                    "update-ref",
                    "--no-deref",
                    "-m",
                    "nexus-mcp: apply_patch",
                    f"refs/heads/{branch}",
                    commit,
                    analysis.base_commit,
                ],
                check=False,
            )
        if moved.returncode != 0:
            raise ConflictError("branch moved", reason=REASON_BRANCH_MOVED)
        return commit

    def _effect_of(self, base_commit: str, tree: str) -> set[tuple[bytes, str, str]]:
        """What ``tree`` changes from the commit's tree (``effect_of``)."""
        args = ["diff-tree", "-r", "-z", "--raw", "--no-renames", f"{base_commit}^{{tree}}", tree]
        return effect_of(self.runner.run(args).stdout)

    def _scratch_env(self, scratch: Path, *, objects: Path | None) -> dict[str, str]:
        env = {"GIT_INDEX_FILE": str(scratch / "index")}
        if objects is not None:
            env["GIT_OBJECT_DIRECTORY"] = str(objects)
            env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str(self.objects_dir)
        return env

    def close(self) -> None:
        self._scratch.close()
        self.runner.close()


# --- opening -----------------------------------------------------------------------------


def open_repository(name: str, config: RepositoryConfig, runner_for: RunnerFactory) -> Repository:
    """Open a configured repository: what it is, where its git directories really are."""
    path = config.path
    if not path.is_dir():
        raise ConfigError(f"repos.repositories.{name}.path: not a folder")
    probe = runner_for(path, discover=True)
    try:
        found = probe.run(
            [
                "rev-parse",
                "--path-format=absolute",
                "--absolute-git-dir",
                "--git-common-dir",
                "--is-bare-repository",
            ],
            check=False,
        )
        lines = found.stdout.decode("utf-8", "surrogateescape").splitlines()
        if found.returncode != 0 or len(lines) != 3:
            raise ConfigError(
                f"repos.repositories.{name}.path: not a git repository git can open "
                "(or one owned by another user)"
            )
        if lines[2] != "true":
            top = probe.run(["rev-parse", "--show-toplevel"], check=False)
            lines.append(top.stdout.decode("utf-8", "surrogateescape").strip())
    finally:
        probe.close()
    # Resolved once, here: git is given these very folders from now on (the common one
    # through GIT_COMMON_DIR), and the store guard refuses any of them turning into a link.
    git_dir = Path(lines[0]).resolve()
    common_dir = Path(lines[1]).resolve()
    bare = lines[2] == "true"
    work_tree = None if bare else path.resolve()
    if not bare and (len(lines) != 4 or Path(lines[3]).resolve() != work_tree):
        raise ConfigError(f"repos.repositories.{name}.path: not the top of a repository")
    store = StoreGuard(git_dir, common_dir)
    try:
        store.check()
    except UnsafeStoreError as exc:
        raise ConfigError(
            f"repos.repositories.{name}: its object store or refs reach outside the "
            f"repository ({exc}); alternates and links there are refused"
        ) from None
    runner = runner_for(git_dir, discover=False, common_dir=common_dir)
    try:
        object_format = runner.run(["rev-parse", "--show-object-format"], check=False)
        zero = "0" * (64 if object_format.stdout.strip() == b"sha256" else 40)
        default = config.default_branch or _detect_default_branch(runner)
        repository = Repository(
            name,
            config,
            runner=runner,
            work_tree=work_tree,
            common_dir=common_dir,
            default_branch=default,
            zero_sha=zero,
            store=store,
        )
    except (ConfigError, GitError):
        runner.close()
        raise
    return repository


class RunnerFactory:
    """Builds ``GitRunner``s with the section's limits (``discover``: find the git dir)."""

    def __init__(self, *, git: str, timeout_seconds: float, max_output_bytes: int) -> None:
        self.git = git
        self.timeout_seconds = timeout_seconds
        self.max_output_bytes = max_output_bytes

    def __call__(self, path: Path, *, discover: bool, common_dir: Path | None = None) -> GitRunner:
        runner = _DiscoveringRunner if discover else GitRunner
        return runner(
            path,
            git=self.git,
            timeout_seconds=self.timeout_seconds,
            max_output_bytes=self.max_output_bytes,
            common_dir=common_dir,
        )


class _DiscoveringRunner(GitRunner):
    """Finds the git directory of the folder itself, never of a folder above it."""

    def base_env(self) -> dict[str, str]:
        env = super().base_env()
        del env["GIT_DIR"]
        env["GIT_CEILING_DIRECTORIES"] = str(self.git_dir.parent)
        return env

    def run(self, args, **kwargs):  # type: ignore[no-untyped-def]
        return super().run(["-C", str(self.git_dir), *args], **kwargs)


def _detect_default_branch(runner: GitRunner) -> str:
    """``origin``'s HEAD when known, else ``main`` or ``master`` if one exists, else ``main``."""
    origin = (
        runner.run(["symbolic-ref", "--quiet", "refs/remotes/origin/HEAD"], check=False)
        .stdout.decode("utf-8", "replace")
        .strip()
    )
    if origin.startswith("refs/remotes/origin/"):
        return origin[len("refs/remotes/origin/") :]
    for candidate in ("main", "master"):
        found = runner.run(
            ["rev-parse", "--verify", "--quiet", f"refs/heads/{candidate}"], check=False
        )
        if found.returncode == 0:
            return candidate
    return "main"


# --- parsing -----------------------------------------------------------------------------


def _parse_ls_tree(record: bytes) -> TreeEntry:
    meta, _, path = record.partition(b"\t")
    mode, kind, sha, size = meta.split(maxsplit=3)
    size_text = size.strip()
    return TreeEntry(
        decode_path(path),
        mode.decode("ascii"),
        kind.decode("ascii"),
        sha.decode("ascii"),
        int(size_text) if size_text.isdigit() else None,
    )


def _parse_batch(output: bytes) -> dict[str, bytes]:
    """``cat-file --batch`` output: ``<sha> <type> <size>\\n<content>\\n`` per object."""
    contents: dict[str, bytes] = {}
    position = 0
    while position < len(output):
        end = output.index(b"\n", position)
        header = output[position:end].split(b" ")
        position = end + 1
        if len(header) != 3:  # "<sha> missing"
            continue
        size = int(header[2])
        contents[header[0].decode("ascii")] = output[position : position + size]
        position += size + 1
    return contents


def _ends(stat: FileStat) -> tuple[str, ...]:
    return (stat.old_path, stat.path) if stat.old_path else (stat.path,)


def _is_binary_blob(data: bytes) -> bool:
    if b"\x00" in data:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return is_binary(data[:8192])


@contextlib.contextmanager
def committing(guard: CommitGuard | None) -> Iterator[None]:
    """The commit point of a write: refused once its call was cancelled (``CommitGuard``)."""
    if guard is None:
        yield
        return
    with guard.commit():
        yield


__all__ = [
    "MODE_GITLINK",
    "MODE_SYMLINK",
    "REASON_BRANCH_CHECKED_OUT",
    "REASON_BRANCH_EXISTS",
    "REASON_BRANCH_MOVED",
    "REASON_NOT_A_FILE",
    "FileStat",
    "PatchAnalysis",
    "Repository",
    "RunnerFactory",
    "TreeChange",
    "TreeEntry",
    "check_branch_name",
    "check_ref",
    "check_repo_path",
    "check_sha",
    "committing",
    "open_repository",
]
