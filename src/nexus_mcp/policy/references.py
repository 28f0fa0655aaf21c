"""``${NAME}``: a secret in ``nexus.yaml`` named by its environment variable.

The form people copy from other tools' configuration. It is read only where a setting is
a secret (a field typed ``SecretStr``, ``SecretRef`` or ``SecretValue``), only in the
file (a value that came from the environment is never read again), and only once: a
variable whose value itself holds ``${OTHER}`` is taken as it is.

Where the setting takes a reference (``{env: NAME}`` / ``{file: PATH}``), ``${NAME}``
becomes ``{env: NAME}``, so it is resolved where references are and stays a reference
(accepted in prod, never written into a recording). Where it takes only text
(``auth.jwt_secret``), the variable is read here. Either way an unset variable is a
problem naming the key and the variable, never a value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, get_args, get_origin

from pydantic import BaseModel, SecretStr

from nexus_mcp.policy.config_errors import (
    ENV_REFERENCE_HINT,
    REFERENCE_CLASS,
    Loc,
    branches_of,
    env_reference,
    problem_line,
    render_key,
    safe_text,
)


def expand_references(
    data: Any,
    annotation: Any,
    environ: Mapping[str, str],
    loc: Loc = (),
    label: Callable[[Loc], str | None] | None = None,
) -> tuple[Any, list[tuple[Loc, str]]]:
    """``data`` (YAML, read against ``annotation``) with every ``${NAME}`` secret replaced,
    and the problems found (``(location, words)``, as ``problems_from`` gives them, with
    the same ``label``)."""
    problems: list[tuple[Loc, str]] = []
    found = _expand(data, annotation, environ, loc, problems)
    return found, [(at, problem_line("", render_key(at, label), words)) for at, words in problems]


def is_secret_type(annotation: Any) -> bool:
    return any(_is_secret(branch) for branch in branches_of(annotation))


def _is_secret(kind: Any) -> bool:
    return isinstance(kind, type) and (
        issubclass(kind, SecretStr) or kind.__name__ == REFERENCE_CLASS
    )


def _takes_reference(annotation: Any) -> bool:
    return any(getattr(b, "__name__", "") == REFERENCE_CLASS for b in branches_of(annotation))


def _expand(
    data: Any, annotation: Any, environ: Mapping[str, str], loc: Loc, problems: list[Any]
) -> Any:
    branches = branches_of(annotation)
    if isinstance(data, str):
        if not is_secret_type(annotation) or "${" not in data:
            return data
        try:
            name = env_reference(data)
        except ValueError:
            problems.append((loc, f": {ENV_REFERENCE_HINT}"))
            return data
        assert name is not None
        if name not in environ or not environ[name]:
            words = f"names the environment variable {safe_text(name)}, which is not set"
            problems.append((loc, words))
            return data
        if _takes_reference(annotation):
            return {"env": name}
        return environ[name]  # read once: its own text is never searched for ${...}
    if isinstance(data, Mapping):
        model = next(
            (b for b in branches if isinstance(b, type) and issubclass(b, BaseModel)), None
        )
        mapping = next((b for b in branches if get_origin(b) in (dict, Mapping)), None)
        if model is not None and not _is_secret(model):
            out = {}
            for key, value in data.items():
                field = model.model_fields.get(key) if isinstance(key, str) else None
                out[key] = (
                    _expand(value, field.annotation, environ, (*loc, key), problems)
                    if field is not None
                    else value
                )
            return out
        if mapping is not None:
            item = get_args(mapping)[1] if get_args(mapping) else None
            return {k: _expand(v, item, environ, (*loc, k), problems) for k, v in data.items()}
        return data
    if isinstance(data, list):
        sequence = next((b for b in branches if get_origin(b) in (list, tuple, set)), None)
        if sequence is None or not get_args(sequence):
            return data
        item = get_args(sequence)[0]
        return [_expand(v, item, environ, (*loc, i), problems) for i, v in enumerate(data)]
    return data


__all__ = ["expand_references", "is_secret_type"]
