"""Vault-relative note paths: the one normalizer every notes tool runs before any read.

The rules are Knowtation's hosted ones: a string, trimmed (JavaScript whitespace),
backslashes turned into ``/``, no leading ``/``, no Windows drive, no NUL, empty
segments dropped, no ``..`` segment; and no lone surrogate, which names no file (a
hosted read would fail to encode it, as JavaScript's ``encodeURIComponent`` does). A
refusal is ``UpstreamError.invalid_path()``, whose message never holds the input.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from nexus_mcp.errors import UpstreamError
from nexus_mcp.notes.javascript import js_trim
from nexus_mcp.workspace.confinement import is_unicode_text

PATH_SEPARATOR = "/"
PARENT_SEGMENT = ".."
CURRENT_SEGMENT = "."

# A drive-qualified first segment (``C:`` or ``C:/...``). Knowtation refuses ``C:/``; a
# bare ``C:name`` is drive-relative on Windows, so it is refused as well.
_DRIVE_RE = re.compile(r"[A-Za-z]:")

# encodeURIComponent leaves exactly these unescaped (besides ASCII letters and digits).
_URI_COMPONENT_SAFE = "-_.!~*'()"


def normalize_note_path(value: object) -> str:
    """Return the normalized vault-relative path, or raise ``UpstreamError.invalid_path()``."""
    if not isinstance(value, str):
        raise UpstreamError.invalid_path()
    forward = js_trim(value).replace("\\", PATH_SEPARATOR)
    if (
        not forward
        or "\x00" in forward
        or not is_unicode_text(forward)
        or forward.startswith(PATH_SEPARATOR)
        or _DRIVE_RE.match(forward)
    ):
        raise UpstreamError.invalid_path()
    segments = [segment for segment in forward.split(PATH_SEPARATOR) if segment]
    if not segments or PARENT_SEGMENT in segments:
        raise UpstreamError.invalid_path()
    return PATH_SEPARATOR.join(segments)


def check_normalized_path(path: object) -> str:
    """Return ``path`` unchanged if it is already a normalized, safe path; else refuse.

    Backends and builders call this instead of normalizing again: normalizing is not
    idempotent (a trailing space survives the first trim when a segment follows it), and
    a second pass must never turn one note's path into another's.
    """
    if (
        not isinstance(path, str)
        or not path
        or "\x00" in path
        or not is_unicode_text(path)
        or "\\" in path
        or path.startswith(PATH_SEPARATOR)
        or _DRIVE_RE.match(path)
    ):
        raise UpstreamError.invalid_path()
    segments = path.split(PATH_SEPARATOR)
    if "" in segments or PARENT_SEGMENT in segments:
        raise UpstreamError.invalid_path()
    return path


def to_facet_path(path: str) -> str:
    """Knowtation's facet path: ``path.posix.normalize`` of a normalized path.

    A normalized path has no empty or ``..`` segments, so this only drops ``.`` segments;
    a path of nothing but ``.`` segments is refused, as Knowtation refuses it.
    """
    segments = [
        s for s in check_normalized_path(path).split(PATH_SEPARATOR) if s != CURRENT_SEGMENT
    ]
    if not segments:
        raise UpstreamError.invalid_path()
    return PATH_SEPARATOR.join(segments)


def to_folder(path: str) -> str | None:
    """``path.posix.dirname`` of a facet path, ``None`` for a note at the vault root."""
    folder, separator, _ = path.rpartition(PATH_SEPARATOR)
    return folder if separator else None


def to_base_name(path: str) -> str:
    return path.rpartition(PATH_SEPARATOR)[2]


def encode_uri_component(path: str) -> str:
    """JavaScript ``encodeURIComponent``; ``/`` becomes ``%2F``.

    A lone surrogate raises ``UnicodeEncodeError``, as JavaScript raises ``URIError``.
    """
    return quote(path, safe=_URI_COMPONENT_SAFE, encoding="utf-8", errors="strict")
