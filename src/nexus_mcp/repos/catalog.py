"""The served repositories by name: opened and checked once, at start-up.

A tool names a repository by its configured name and nothing else; ``RepoCatalog.get``
is the one place that turns a ``repo`` argument into a ``Repository``: a name that is not
of the safe form is ``INVALID_INPUT``, one that is not configured ``NOT_FOUND``, and in
both cases the name sent is not repeated.

Production also checks where each repository really lives: its working tree, its git
directory and its common git directory (a ``.git`` file or a worktree can point
anywhere) must all resolve below an entry of ``repos.allowed_roots``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nexus_mcp.errors import ConfigError, InvalidInputError, NotFoundError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.repos import ReposConfig, RepositoryConfig, is_safe_repo_name
from nexus_mcp.policy.targets import identify_folder, to_target_id
from nexus_mcp.principal import Principal
from nexus_mcp.repos.git import GitError, find_git
from nexus_mcp.repos.repository import Repository, RunnerFactory, open_repository
from nexus_mcp.workspace.paths import is_within

log = get_logger(__name__)

KIND_REPOSITORY = "repository"
ARG_REPO = "repo"


class RepoCatalog:
    def __init__(self, repositories: Mapping[str, Repository]) -> None:
        self._repositories = dict(repositories)

    @classmethod
    def open(cls, config: ReposConfig, *, mode: str) -> RepoCatalog:
        """Open every configured repository, or stop start-up naming the first problem."""
        factory = RunnerFactory(
            git=find_git(),
            timeout_seconds=config.git.timeout_seconds,
            max_output_bytes=config.git.max_output_bytes,
        )
        entries = dict(config.repositories)
        if config.dev_allow_all_repos and mode == "dev":
            for name, folder in _discover(config.allowed_roots):
                entries.setdefault(name, RepositoryConfig(path=folder))
        opened: dict[str, Repository] = {}
        try:
            for name, entry in entries.items():
                try:
                    repository = open_repository(name, entry, factory)
                except GitError:
                    raise ConfigError(
                        f"repos.repositories.{name}.path: git could not open it"
                    ) from None
                opened[name] = repository
                _check_roots(name, repository, config.allowed_roots, mode=mode)
        except ConfigError:
            for repository in opened.values():
                repository.close()
            raise
        for warning in config.warnings:
            log.warning("repos_config", message=warning)
        log.info("repos_opened", repositories=sorted(opened))
        return cls(opened)

    @property
    def names(self) -> list[str]:
        return sorted(self._repositories)

    def get(self, name: object) -> Repository:
        if not is_safe_repo_name(name):
            raise InvalidInputError(field=ARG_REPO)
        assert isinstance(name, str)
        repository = self._repositories.get(name)
        if repository is None:
            raise NotFoundError(reason="repository_not_found")
        return repository

    def target_of(self, principal: Principal, arguments: Mapping[str, Any]) -> str:
        """A repository write's idempotency target: the repository's object store and the
        forge repository it opens pull requests on, so a record made against one never
        replays for another."""
        repository = self.get(arguments.get(ARG_REPO))
        forge = repository.config.forge
        return to_target_id(
            KIND_REPOSITORY,
            repository.name,
            identify_folder(repository.common_dir),
            forge.base_url if forge is not None else "",
            forge.repository if forge is not None else "",
        )

    def close(self) -> None:
        for repository in self._repositories.values():
            repository.close()


def _check_roots(name: str, repository: Repository, roots: tuple[Path, ...], *, mode: str) -> None:
    if not roots and mode == "dev":
        return
    places = [repository.config.path.resolve(), repository.runner.git_dir.resolve()]
    places.append(repository.common_dir)
    if repository.work_tree is not None:
        places.append(repository.work_tree)
    for place in places:
        if not any(is_within(root, place) for root in roots):
            raise ConfigError(
                f"repos.repositories.{name}: the repository (or its git directory) is not "
                "below repos.allowed_roots"
            )


def _discover(roots: tuple[Path, ...]) -> list[tuple[str, Path]]:
    """Dev only: every folder directly below an allowed root that holds a ``.git``."""
    found: list[tuple[str, Path]] = []
    for root in roots:
        try:
            children = sorted(root.iterdir())
        except OSError:
            continue
        for child in children:
            if child.is_dir() and (child / ".git").exists() and is_safe_repo_name(child.name):
                found.append((child.name, child))
    return found


__all__ = ["ARG_REPO", "RepoCatalog"]
