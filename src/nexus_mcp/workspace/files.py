"""The embedded workspace: confined path resolution and atomic file operations.

The guarantee, for every file tool:

1. **Decided on what is touched.** Every path is resolved to its real path below the
   root, all symbolic links followed (``confinement.ConfinedRoot``), and the hidden-state
   check and the write policy (``PathAdmission``) are decided on that real path. Where the
   operation acts on a link itself (delete, rmdir, rename) or writes through one (write,
   edit, mkdir), both the link and what it leads to are checked, so a link cannot
   carry a write into ``.git/``, out of ``allowed_paths`` or onto the server's state.
   A folder that is removed or moved is checked entry by entry.
2. **Decided when it is touched.** The checks run in the worker that performs the
   operation, on the directory descriptors that the operation then uses (``dir_fd``,
   every folder opened ``O_NOFOLLOW``, files opened ``O_NOFOLLOW``), right before it acts;
   the chain's earlier check (step 6) only refuses sooner. A link swapped in by another
   process between the check and the use can therefore not redirect the operation: the
   walk fails, starts again on the new tree (and is judged again), or ends in ``CONFLICT``.
   Nothing outside the root is read, created (temporary files included), changed or
   removed through a link.
3. **Atomic.** A write goes to a temporary file in the target's own folder (through the
   same descriptor), is fsynced, then renamed over the target: a failure or a timeout
   never leaves a half-written file or a temporary file behind.

Residual risk (stated, not hidden): a process that can *move* a folder of the workspace
to somewhere outside it, between the moment a call opened that folder and the moment
it commits, can make that one call act in the moved folder. Right before it commits,
the call checks that the folder is still at its real path (``ConfinedRoot.attached``),
which shrinks that window to a few system calls; closing it needs the kernel (Linux's
``openat2`` with ``RESOLVE_BENEATH`` on every step, which Python does not expose).

Names are validated and contained by ``paths``; the commit point is ``commits``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from nexus_mcp.errors import (
    ConflictError,
    InvalidPathError,
    NotFoundError,
    WritePolicyDeniedError,
)
from nexus_mcp.policy.write_policy import RULE_DISALLOWED_SUBTREE, entry_facts
from nexus_mcp.workspace.commits import guarded_commit
from nexus_mcp.workspace.confinement import (
    DIR_FLAGS,
    FILE_READ_FLAGS,
    MAX_WALKS,
    PARENT_REASONS,
    REASON_PARENT_MISSING,
    ConfinedRoot,
    Located,
    PathChangedError,
    identity,
    walk_tree,
)
from nexus_mcp.workspace.descriptors import empty_and_remove, fsync_fd, read_fd
from nexus_mcp.workspace.paths import (
    PathAdmission,
    ResolvedPath,
    TreeFile,
    is_below,
    is_within,
    normalize_relative,
)

# Entries of a folder that rmdir or rename checks one by one before acting on it.
MAX_SUBTREE_ENTRIES = 100_000
TEMP_PREFIX = ".nexus-"
TEMP_SUFFIX = ".tmp"
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE_MODE = 0o666  # less the umask, as any program creating a file would
NEW_DIR_MODE = 0o777
PERMISSION_BITS = 0o777  # what a replaced file keeps of its mode: no set-id or sticky bits
TRASH_PREFIX = ".nexus-trash-"

T = TypeVar("T")
# What a concurrent rename, removal or swap makes a system call answer.
_RACE_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.EINVAL})


class Workspace:
    """File operations confined to one root folder (see the module docstring)."""

    def __init__(
        self, root: Path, *, hidden: Iterable[Path] = (), gate: PathAdmission | None = None
    ) -> None:
        self._confined = ConfinedRoot(root)
        self.root = self._confined.path
        # The server's own state (audit log, grants, idempotency records) when it sits
        # inside the workspace, e.g. `serve --workspace .` with the default data dir:
        # never reachable through the file tools, or a caller could read the audit trail,
        # delete it, or rewrite its own grants.
        self.hidden = tuple(
            path for path in (h.resolve() for h in hidden) if is_within(self.root, path)
        )
        self._hidden_parts = tuple(path.relative_to(self.root).parts for path in self.hidden)
        # No gate, no writes: a workspace built without a write policy refuses them.
        self._gate = gate

    def holds_hidden(self, real: Path) -> bool:
        """True when removing or moving ``real`` would take server state with it."""
        return any(is_within(real, hidden) for hidden in self.hidden)

    def is_hidden_parts(self, parts: Sequence[str]) -> bool:
        return any(is_below(parts, hidden) for hidden in self._hidden_parts)

    def _holds_hidden_parts(self, parts: Sequence[str]) -> bool:
        return any(is_below(hidden, parts) for hidden in self._hidden_parts)

    # -- resolution (an early answer; operations resolve again when they act) -------------

    def resolve(self, raw: str, *, must_exist: bool = False) -> ResolvedPath:
        """Resolve a caller path to a contained real path (every symlink followed)."""
        relative = normalize_relative(raw)
        parts = tuple(relative.split("/")) if relative else ()
        if must_exist:
            with self._locate(parts, follow_final=True) as located:
                real, exists = located.parts, located.exists
        else:
            real, exists = self._confined.real_parts(parts), True
        # Hidden before missing: whether server state exists is not the caller's business.
        if self.is_hidden_parts(real):
            raise InvalidPathError(reason="server_state")
        if not exists:
            raise NotFoundError()
        return ResolvedPath(relative=relative, absolute=self.root.joinpath(*real))

    def named(self, raw: str) -> ResolvedPath:
        """A caller path, validated and normalized only: every operation resolves it
        itself, on descriptors, when it acts (so the tools do no file-system work on the
        event loop and no walk twice)."""
        relative = normalize_relative(raw)
        return ResolvedPath(relative=relative, absolute=self.root / relative)

    def resolve_parent(self, raw: str) -> ResolvedPath:
        """Resolve a path whose final component may not exist yet (a write target)."""
        target = self.resolve(raw)
        if target.absolute == self.root or not target.relative:
            raise InvalidPathError(reason="root")
        return target

    def touched_paths(self, targets: Sequence[str]) -> list[str]:
        """The real paths a write naming ``targets`` would touch, for the write policy.

        Each target counts as the entry it names (a link itself, for delete and rename)
        and as what it leads to, all links followed; a missing folder on the way counts
        by its name. Hidden server state and paths leaving the root are refused here.
        """
        touched: list[str] = []
        for raw in targets:
            relative = normalize_relative(raw)
            parts = tuple(relative.split("/")) if relative else ()
            for follow in (False, True):
                real = self._confined.real_parts(parts, follow_final=follow)
                if self.is_hidden_parts(real):
                    raise InvalidPathError(reason="server_state")
                path = "/".join(real)
                if path not in touched:
                    touched.append(path)
        return touched

    # -- admission at the moment of use ---------------------------------------------------

    @contextlib.contextmanager
    def _locate(self, parts: Sequence[str], *, follow_final: bool) -> Iterator[Located]:
        """``ConfinedRoot.locate``; a missing folder inside hidden state is INVALID_PATH."""
        try:
            with self._confined.locate(parts, follow_final=follow_final) as located:
                yield located
        except NotFoundError:
            if self._hidden_parts and self.is_hidden_parts(
                self._confined.real_parts(parts, follow_final=follow_final)
            ):
                raise InvalidPathError(reason="server_state") from None
            raise

    @contextlib.contextmanager
    def _touch(
        self, operation: str | None, target: ResolvedPath, *, follow_final: bool, new: bool = False
    ) -> Iterator[Located]:
        """Locate what an operation acts on and admit it (hidden state, write policy).

        ``operation`` None is a read. The located parent stays open for the operation.
        ``new``: the operation creates the entry, so its refusal for a missing parent
        folder names the operation (and then says how to create the folder).
        """
        located_it = False
        try:
            with self._locate(target.parts, follow_final=follow_final) as located:
                located_it = True
                touched = [located.parts]
                if located.is_link:  # acting on a link itself: what it leads to counts too
                    touched.append(self._confined.real_parts(target.parts, follow_final=True))
                elif located.through_link:  # written through a link: the link counts too
                    entry = self._confined.real_parts(target.parts, follow_final=False)
                    if entry != located.parts:
                        touched.append(entry)
                for parts in touched:
                    if self.is_hidden_parts(parts):
                        raise InvalidPathError(reason="server_state")
                if operation is not None:
                    if not located.parts:
                        raise InvalidPathError(reason="root")
                    self._admit(operation, ["/".join(parts) for parts in touched])
                yield located
        except NotFoundError as exc:
            if new and not located_it and exc.facts.get("reason") in PARENT_REASONS:
                raise NotFoundError(reason=exc.facts["reason"], operation=operation) from None
            raise

    def _admit(self, operation: str, paths: Sequence[str]) -> None:
        if self._gate is None:
            raise WritePolicyDeniedError(rule="no_policy")
        self._gate.check_paths(operation, paths)

    def _ensure_attached(self, located: Located) -> None:
        if not self._confined.attached(located):
            raise ConflictError(reason="path_changed")

    @staticmethod
    def _retrying(work: Callable[[], T]) -> T:
        """Run ``work`` again when the tree changed under it (another process renamed,
        removed or swapped something between our walk and our act): the next walk sees
        the new tree and is judged again. Errors such a change causes are typed."""
        for _ in range(MAX_WALKS):
            try:
                return work()
            except PathChangedError:
                continue
            except OSError as exc:
                if exc.errno in _RACE_ERRNOS:
                    continue
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise ConflictError(reason="changed_meanwhile") from None
                if exc.errno in (errno.EACCES, errno.EPERM):
                    raise ConflictError(reason="permission_denied") from None
                if exc.errno == errno.ENAMETOOLONG:
                    raise InvalidPathError(reason="name_too_long") from None
                raise
        raise ConflictError(reason="path_changed")

    # -- reads --------------------------------------------------------------------------

    def read_bytes(self, target: ResolvedPath, *, limit: int) -> bytes:
        """Read at most ``limit`` bytes; a larger file is refused, never truncated."""

        def read() -> bytes:
            with self._touch(None, target, follow_final=True) as located:
                return self._read_located(located, limit)

        return self._retrying(read)

    def _read_located(self, located: Located, limit: int) -> bytes:
        if not located.exists:
            raise NotFoundError()
        if not located.is_file:
            raise ConflictError(reason="not_a_file")
        fd = self._open_located(located)
        try:
            return read_fd(fd, limit)
        finally:
            os.close(fd)

    def _open_located(self, located: Located) -> int:
        """Open a located regular file for reading, only if it is what the walk saw."""
        fd = self._confined.open_entry(located, FILE_READ_FLAGS)
        if self._is_hidden_inode(os.fstat(fd)):
            os.close(fd)
            raise InvalidPathError(reason="server_state")
        if not self._confined.attached(located):
            os.close(fd)
            raise ConflictError(reason="path_changed")
        return fd

    def describe(
        self, target: ResolvedPath, *, hash_limit: int
    ) -> tuple[os.stat_result, bytes | None]:
        """``lstat`` of what ``target`` leads to, and its bytes when a file within the limit."""

        def describe() -> tuple[os.stat_result, bytes | None]:
            with self._touch(None, target, follow_final=True) as located:
                if located.info is None:
                    raise NotFoundError()
                if located.is_file and located.info.st_size <= hash_limit:
                    return located.info, self._read_located(located, hash_limit)
                return located.info, None

        return self._retrying(describe)

    @contextlib.contextmanager
    def open_dir(self, target: ResolvedPath) -> Iterator[tuple[int, tuple[str, ...]]]:
        """A descriptor of the folder ``target`` leads to, and its real parts."""
        opened = self._retrying(lambda: self._open_dir_once(target))
        try:
            yield opened
        finally:
            os.close(opened[0])

    def _open_dir_once(self, target: ResolvedPath) -> tuple[int, tuple[str, ...]]:
        with self._touch(None, target, follow_final=True) as located:
            if not located.exists:
                raise NotFoundError()
            if not located.is_dir:
                raise ConflictError(reason="not_a_directory")
            return self._open_dir_fd(located), located.parts

    def _open_dir_fd(self, located: Located) -> int:
        if located.name is None:  # the root: its own descriptor
            return os.dup(located.parent_fd)
        return self._confined.open_entry(located, DIR_FLAGS)

    def iter_tree(
        self,
        dir_fd: int,
        base: Sequence[str],
        *,
        recursive: bool,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[tuple[tuple[str, ...], int, list[str], list[str]]]:
        """``(folder_parts, folder_fd, dirnames, filenames)`` below an open folder, sorted.

        ``dirnames`` are real folders, ``filenames`` everything else (links included).
        Never follows a link, never enters or lists hidden state (``confinement.walk_tree``:
        no recursion, one descriptor held, a folder swapped for a link or a FIFO skipped,
        never opened through). ``stop`` is asked before each folder.
        """
        for folder in walk_tree(dir_fd, strict=False, stop=stop):
            parts = (*base, *folder.parts)
            folder.dirs[:] = [d for d in folder.dirs if not self.is_hidden_parts((*parts, d))]
            files = [f for f in folder.others if not self.is_hidden_parts((*parts, f))]
            yield parts, folder.fd, list(folder.dirs), files
            if not recursive:
                folder.dirs[:] = []

    def walk_files(
        self, dir_fd: int, base: Sequence[str], *, stop: Callable[[], bool] | None = None
    ) -> Iterator[TreeFile]:
        """The regular files below an open folder (links are never yielded nor followed)."""
        for folder, fd, _dirs, files in self.iter_tree(dir_fd, base, recursive=True, stop=stop):
            below = "/".join(folder[len(base) :])
            for name in files:
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(info.st_mode):
                    continue
                yield TreeFile(
                    relative="/".join((*folder, name)),
                    below=f"{below}/{name}" if below else name,
                    dir_fd=fd,
                    name=name,
                )

    def open_file(self, found: TreeFile) -> int | None:
        """Open a walked file for reading: None for a link, a FIFO or anything not regular,
        and for a hard link to the server's own state."""
        try:
            fd = os.open(found.name, FILE_READ_FLAGS, dir_fd=found.dir_fd)
        except OSError:
            return None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or self._is_hidden_inode(info):
            os.close(fd)
            return None
        return fd

    def _is_hidden_inode(self, info: os.stat_result) -> bool:
        """A file with other names may be the server's own state under another name (a
        hard link someone made): compare it with the hidden files, only then."""
        if info.st_nlink < 2 or not self.hidden:
            return False
        return identity(info) in self._hidden_inodes()

    def _hidden_inodes(self) -> set[tuple[int, int]]:
        # The hidden files, and the files directly inside hidden folders (the data dir:
        # audit log, databases); looked up when needed, as they come and go.
        found: set[tuple[int, int]] = set()
        for path in self.hidden:
            with contextlib.suppress(OSError):
                info = os.stat(path, follow_symlinks=False)
                found.add(identity(info))
                if stat.S_ISDIR(info.st_mode):
                    with os.scandir(path) as entries:
                        for entry in entries:
                            with contextlib.suppress(OSError):
                                found.add(identity(entry.stat(follow_symlinks=False)))
        return found

    # -- writes -------------------------------------------------------------------------

    def write_atomic(self, target: ResolvedPath, data: bytes, *, overwrite: bool) -> bool:
        """Write ``data`` to ``target`` atomically; returns True when a file was replaced."""

        def write() -> bool:
            with self._touch("write", target, follow_final=True, new=True) as located:
                if located.is_dir:
                    raise ConflictError(reason="is_directory")
                if located.exists and not overwrite:
                    raise ConflictError(reason="exists")
                if located.exists and not located.is_file:
                    raise ConflictError(reason="not_a_file")
                self._replace(located, data, located.info)
                return located.exists

        return self._retrying(write)

    def edit(self, target: ResolvedPath, change: Callable[[bytes], bytes], *, limit: int) -> bytes:
        """Read a file, ``change`` its bytes and write the result back atomically, all on
        one located folder (so the read and the write are the same file)."""

        def edit() -> bytes:
            with self._touch("edit", target, follow_final=True) as located:
                original = self._read_located(located, limit)
                data = change(original)
                self._replace(located, data, located.info)
                return data

        return self._retrying(edit)

    def _replace(self, located: Located, data: bytes, previous: os.stat_result | None) -> None:
        """Temporary file beside the target (same descriptor), fsync, rename over it.

        A replaced file keeps its permission bits and, when the server may, its owner;
        never set-user-ID, set-group-ID or sticky bits, which would otherwise pass to a
        file this server wrote.
        """
        assert located.name is not None
        parent = located.parent_fd
        self._ensure_attached(located)
        tmp = f"{TEMP_PREFIX}{secrets.token_hex(8)}{TEMP_SUFFIX}"
        mode = None if previous is None else previous.st_mode & PERMISSION_BITS
        fd = os.open(tmp, _TEMP_FLAGS, NEW_FILE_MODE if mode is None else 0o600, dir_fd=parent)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if previous is not None:
                    if os.geteuid() == 0 and (previous.st_uid, previous.st_gid) != (0, 0):
                        os.fchown(fd, previous.st_uid, previous.st_gid)
                    os.fchmod(fd, previous.st_mode & PERMISSION_BITS)
                os.fsync(fd)
            finally:
                os.close(fd)
            with guarded_commit():
                self._ensure_attached(located)
                os.replace(tmp, located.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            # Cancellation (a timeout) included: never leave the temporary file behind.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=parent)
            raise
        fsync_fd(parent)

    def delete_file(self, target: ResolvedPath) -> None:
        """Remove one file, or one link itself (never what it points to)."""

        def delete() -> None:
            with self._touch("delete", target, follow_final=False) as located:
                if not located.exists:
                    raise NotFoundError()
                if located.is_dir:
                    raise ConflictError(reason="is_directory")
                assert located.name is not None
                with guarded_commit():
                    self._ensure_attached(located)
                    os.unlink(located.name, dir_fd=located.parent_fd)
                fsync_fd(located.parent_fd)

        self._retrying(delete)

    def make_dir(self, target: ResolvedPath, *, parents: bool) -> bool:
        """Create a folder (and missing parents when asked); False when it already was one.

        Decided on the whole real path first, then walked once: each folder on the way is
        opened ``O_NOFOLLOW`` on its parent's descriptor, and each folder created is
        judged by the write policy itself and created on the descriptor just opened, so a
        link swapped in meanwhile cannot make one land elsewhere.
        """

        def make() -> bool:
            self._admit("mkdir", self.touched_paths([target.relative]))
            admitted = self._confined.real_parts(target.parts, follow_final=True)
            if not admitted:
                raise InvalidPathError(reason="root")
            if self.is_hidden_parts(admitted):
                raise InvalidPathError(reason="server_state")
            fd, existing = self._confined.open_prefix(admitted)
            try:
                if existing == len(admitted):
                    return False  # already a folder (walked O_NOFOLLOW, so a real one)
                if not parents and existing < len(admitted) - 1:
                    raise NotFoundError(reason=REASON_PARENT_MISSING, operation="mkdir")
                for depth in range(existing + 1, len(admitted) + 1):
                    name = admitted[depth - 1]
                    step = Located(admitted[:depth], fd, name, None)
                    self._admit("mkdir", ["/".join(step.parts)])
                    with guarded_commit():
                        self._ensure_attached(step)
                        try:
                            os.mkdir(name, NEW_DIR_MODE, dir_fd=fd)
                        except FileExistsError:
                            raise PathChangedError() from None
                    fsync_fd(fd)
                    fd = self._confined.enter(fd, name)
            finally:
                os.close(fd)
            return True

        return self._retrying(make)

    def remove_dir(self, target: ResolvedPath, *, recursive: bool) -> int:
        """Remove a folder (a link to one is refused); recursive only when asked.

        Every entry is judged first (``_check_subtree``). The commit is one rename of the
        folder to a ``.nexus-trash-*`` name beside it, so a timeout either happens before
        it (nothing removed) or after it (all of it gone from view); the emptying runs
        after the commit, on descriptors, never crossing a link or a mount point.
        Returns the entries removed, the folder included.
        """

        def remove() -> int:
            with self._touch("rmdir", target, follow_final=False) as located:
                if not located.exists:
                    raise NotFoundError()
                if not located.is_dir:
                    raise ConflictError(reason="not_a_directory")
                if self._holds_hidden_parts(located.parts):
                    raise InvalidPathError(reason="server_state")
                assert located.name is not None
                entries = self._check_subtree(located, "rmdir")
                if entries and not recursive:
                    raise ConflictError(reason="not_empty")
                trash = f"{TRASH_PREFIX}{secrets.token_hex(8)}"
                with guarded_commit():
                    self._ensure_attached(located)
                    if recursive:
                        os.rename(
                            located.name,
                            trash,
                            src_dir_fd=located.parent_fd,
                            dst_dir_fd=located.parent_fd,
                        )
                    else:
                        os.rmdir(located.name, dir_fd=located.parent_fd)
                if recursive:
                    empty_and_remove(located.parent_fd, trash)
                fsync_fd(located.parent_fd)
                return entries + 1

        return self._retrying(remove)

    def check_subtree(
        self, operation: str, target: ResolvedPath, moved_to: str | None = None
    ) -> None:
        """Refuse early when removing or moving folder ``target`` would carry an entry the
        write policy protects (checked again when the operation acts)."""

        def check() -> None:
            with self._confined.locate(target.parts, follow_final=False) as located:
                if located.is_dir and located.parts:
                    destination = None
                    if moved_to is not None:
                        destination = self._confined.real_parts(
                            normalize_relative(moved_to).split("/"), follow_final=False
                        )
                    self._check_subtree(located, operation, destination)

        self._retrying(check)

    def _check_subtree(
        self, located: Located, operation: str, moved_to: Sequence[str] | None = None
    ) -> int:
        """Judge every entry of a folder that is removed or moved, and count them.

        Each entry is judged by the write policy where it is and, for a move, where it
        will be; a link inside a moved folder whose relative target climbs out of it
        would point elsewhere after the move, so it is refused. Any folder that cannot be
        read, a mount point or a change during the walk refuses the whole operation:
        nothing is removed or moved unjudged.
        """
        if self._gate is None:
            raise WritePolicyDeniedError(rule="no_policy")
        gate = self._gate
        fd = self._open_dir_fd(located)
        count = 0
        try:
            for folder in walk_tree(fd, strict=True):
                here = (*located.parts, *folder.parts)
                for name in (*folder.dirs, *folder.others):
                    count += 1
                    if count > MAX_SUBTREE_ENTRIES:
                        raise WritePolicyDeniedError(rule=RULE_DISALLOWED_SUBTREE)
                    entry = (*here, name)
                    if self.is_hidden_parts(entry):
                        raise InvalidPathError(reason="server_state")
                    paths = ["/".join(entry)]
                    if moved_to is not None:
                        paths.append("/".join((*moved_to, *folder.parts, name)))
                        if name in folder.others:
                            self._check_moved_link(folder.fd, name, len(folder.parts))
                    try:
                        gate.check_paths(operation, paths)
                    except WritePolicyDeniedError as exc:
                        # Named for what was asked: the folder, carrying a denied entry.
                        facts = entry_facts(exc.facts)
                        raise WritePolicyDeniedError(
                            rule=RULE_DISALLOWED_SUBTREE, **facts
                        ) from None
        finally:
            os.close(fd)
        return count

    def _check_new_meaning(self, src: Located, dst: Located) -> None:
        """A link moved to another folder leads, if its target is relative, somewhere else:
        judge where it will lead (inside the workspace, not server state, allowed)."""
        assert src.name is not None
        target = os.readlink(src.name, dir_fd=src.parent_fd)
        if target.startswith("/"):
            return
        new = self._confined.real_parts((*dst.parts[:-1], *target.split("/")))
        if self.is_hidden_parts(new):
            raise InvalidPathError(reason="server_state")
        self._admit("rename", ["/".join(new)])

    @staticmethod
    def _check_moved_link(dir_fd: int, name: str, depth: int) -> None:
        """A relative link ``depth`` folders below a moved folder keeps its meaning only if
        its target stays inside that folder."""
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            return  # not a link
        if target.startswith("/"):
            return  # an absolute target means the same wherever the link is
        level = depth
        for part in target.split("/"):
            if part == "..":
                level -= 1
                if level < 0:
                    raise WritePolicyDeniedError(rule="link_retarget")
            elif part not in ("", "."):
                level += 1

    def rename(self, source: ResolvedPath, destination: ResolvedPath, *, overwrite: bool) -> None:
        """Rename a file, a folder or a link itself (never what it points to)."""

        def move() -> None:
            with (
                self._touch("rename", source, follow_final=False) as src,
                self._touch("rename", destination, follow_final=False, new=True) as dst,
            ):
                if not src.exists:
                    raise NotFoundError()
                if self._holds_hidden_parts(src.parts):
                    raise InvalidPathError(reason="server_state")
                if src.is_dir:
                    if is_below(dst.parts, src.parts):
                        raise ConflictError(reason="into_itself")
                    self._check_subtree(src, "rename", dst.parts)
                if src.is_link:
                    self._check_new_meaning(src, dst)
                if dst.exists and (not overwrite or dst.is_dir or src.is_dir):
                    raise ConflictError(reason="exists")
                assert src.name is not None and dst.name is not None
                with guarded_commit():
                    self._ensure_attached(src)
                    self._ensure_attached(dst)
                    os.replace(
                        src.name, dst.name, src_dir_fd=src.parent_fd, dst_dir_fd=dst.parent_fd
                    )
                fsync_fd(dst.parent_fd)
                if src.parts[:-1] != dst.parts[:-1]:
                    fsync_fd(src.parent_fd)

        self._retrying(move)


__all__ = ["MAX_SUBTREE_ENTRIES", "Workspace"]
