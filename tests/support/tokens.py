"""Bearer tokens as an attacker writes them: HS256-signed over exact payload bytes.

JWT libraries refuse to emit ``NaN``, ``Infinity`` or a claim typed as the RFC forbids;
a hostile issuer (or anyone holding a shared secret) is not so polite. ``claims_json``
writes the payload by hand so such values reach the server exactly as sent.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OMIT: Any = ...  # a claim value meaning "leave this claim out"


class RawJson(str):
    """A claim value spliced into the payload verbatim: ``RawJson("NaN")`` -> ``"exp":NaN``."""


@dataclass(frozen=True)
class FromNow:
    """A NumericDate ``seconds`` from when the token is made, not from test collection."""

    seconds: float

    def resolve(self) -> float:
        return int(time.time()) + self.seconds


def resolve_times(claims: Mapping[str, Any]) -> dict[str, Any]:
    """``claims`` with every ``FromNow`` turned into the date it means now."""
    return {k: v.resolve() if isinstance(v, FromNow) else v for k, v in claims.items()}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def claims_json(claims: Mapping[str, Any]) -> str:
    """The payload text: JSON values, ``RawJson`` as-is, ``FromNow`` resolved, ``OMIT`` out."""
    parts = []
    for name, value in resolve_times(claims).items():
        if value is OMIT:
            continue
        raw = value if isinstance(value, RawJson) else json.dumps(value)
        parts.append(f"{json.dumps(name)}:{raw}")
    return "{" + ",".join(parts) + "}"


def hs256(payload_json: str, secret: str) -> str:
    """An HS256 JWT whose payload is exactly ``payload_json``."""
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64url(payload_json.encode())
    mac = hmac.new(secret.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64url(mac)}"
