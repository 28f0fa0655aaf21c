"""JavaScript value semantics that Knowtation's outputs depend on, reproduced in Python.

Knowtation runs on Node, so byte equality needs JavaScript's whitespace set (``trim``,
``trimEnd``, ``\\s``), UTF-16 string lengths and slices, and ``String(value)`` for the
values YAML and JSON frontmatter can hold (numbers, arrays, objects, dates).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

# WhiteSpace and LineTerminator of ECMAScript: what trim() strips and \s matches.
# U+FEFF is in, U+0085 and U+001C-U+001F are not (Python's str.strip disagrees on both).
JS_WHITESPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_JS_WHITESPACE_RUN_RE = re.compile(f"[{re.escape(JS_WHITESPACE)}]+")

# Guards String() of alias-heavy YAML, which grows exponentially; Node would hang there.
MAX_JS_STRING_CHARS = 10_000_000

_MS_PER_DAY = 86_400_000
_MAX_TIME_MS = 8.64e15  # ECMAScript TimeClip bound
_WEEKDAYS = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class JsStringTooLongError(ValueError):
    """String(value) would exceed MAX_JS_STRING_CHARS."""


@dataclass(frozen=True)
class JsDate:
    """A JavaScript Date: milliseconds since the epoch, NaN for an invalid date.

    ``String(date)`` depends on the process time zone in Node; Knowtation's hosts run in
    UTC, so the UTC rendering is used.
    """

    epoch_ms: float

    @classmethod
    def from_utc(
        cls,
        year: int,
        month0: int,
        day: int,
        hour: int = 0,
        minute: int = 0,
        second: int = 0,
        millisecond: int = 0,
    ) -> JsDate:
        """``new Date(Date.UTC(...))``: out-of-range fields roll over, years 0-99 mean 19xx."""
        if 0 <= year <= 99:
            year += 1900
        year += month0 // 12
        month0 %= 12
        days = _days_from_civil(year, month0 + 1, 1) + day - 1
        ms = days * _MS_PER_DAY + ((hour * 60 + minute) * 60 + second) * 1000 + millisecond
        if abs(ms) > _MAX_TIME_MS:
            return cls(math.nan)
        return cls(float(ms))

    def shifted(self, delta_ms: int) -> JsDate:
        return JsDate(self.epoch_ms + delta_ms)

    def to_js_string(self) -> str:
        """``Date.prototype.toString`` in UTC."""
        if math.isnan(self.epoch_ms):
            return "Invalid Date"
        year, month, day, weekday, hh, mm, ss, _ = self._fields()
        return (
            f"{_WEEKDAYS[weekday]} {_MONTHS[month - 1]} {day:02d} {_pad_year(year)} "
            f"{hh:02d}:{mm:02d}:{ss:02d} GMT+0000 (Coordinated Universal Time)"
        )

    def to_iso_string(self) -> str:
        """``Date.prototype.toISOString``; raises ValueError for an invalid date, as JS does."""
        if math.isnan(self.epoch_ms):
            raise ValueError("invalid date")
        year, month, day, _, hh, mm, ss, ms = self._fields()
        if 0 <= year <= 9999:
            year_text = f"{year:04d}"
        else:
            year_text = f"{'+' if year > 0 else '-'}{abs(year):06d}"
        return f"{year_text}-{month:02d}-{day:02d}T{hh:02d}:{mm:02d}:{ss:02d}.{ms:03d}Z"

    def _fields(self) -> tuple[int, int, int, int, int, int, int, int]:
        total = int(self.epoch_ms)
        days, in_day = divmod(total, _MS_PER_DAY)
        year, month, day = _civil_from_days(days)
        weekday = (days + 4) % 7  # 1970-01-01 was a Thursday
        hh, rest = divmod(in_day, 3_600_000)
        mm, rest = divmod(rest, 60_000)
        ss, ms = divmod(rest, 1000)
        return year, month, day, weekday, hh, mm, ss, ms


def js_trim(value: str) -> str:
    return value.strip(JS_WHITESPACE)


def js_trim_end(value: str) -> str:
    return value.rstrip(JS_WHITESPACE)


def collapse_js_whitespace(value: str) -> str:
    """``value.replace(/\\s+/g, ' ')``."""
    return _JS_WHITESPACE_RUN_RE.sub(" ", value)


def is_js_blank(value: str) -> bool:
    """``value.trim() === ''``."""
    return not js_trim(value)


def utf16_length(value: str) -> int:
    """JavaScript ``value.length``: astral characters count 2."""
    return len(value.encode("utf-16-le", "surrogatepass")) // 2


def utf16_prefix(value: str, units: int) -> str:
    """JavaScript ``value.slice(0, units)``; may end in a lone high surrogate, as in JS."""
    encoded = value.encode("utf-16-le", "surrogatepass")
    return encoded[: units * 2].decode("utf-16-le", "surrogatepass")


def to_js_number_string(value: float) -> str:
    """``Number.prototype.toString()`` for a finite or special double."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    # repr() is the shortest round-tripping form, the same digits JS picks.
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(str(d) for d in digit_tuple).rstrip("0")
    assert isinstance(exponent, int)
    exponent += len(digit_tuple) - len(digits)
    k = len(digits)
    n = exponent + k  # value = 0.digits x 10^n
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        mantissa = digits[0] + ("." + digits[1:] if k > 1 else "")
        e = n - 1
        body = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + body


def to_js_number(value: int | float) -> float:
    """A JSON or YAML integer as the double JavaScript holds."""
    if isinstance(value, float):
        return value
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def to_js_string(value: object) -> str:
    """``String(value)`` for the values frontmatter can hold."""
    parts: list[str] = []
    _append_js_string(value, parts, [0], set())
    return "".join(parts)


def _append_js_string(value: object, parts: list[str], size: list[int], active: set[int]) -> None:
    text: str | None = None
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int | float):
        text = to_js_number_string(to_js_number(value))
    elif isinstance(value, str):
        text = value
    elif isinstance(value, JsDate):
        text = value.to_js_string()
    elif isinstance(value, bytes):
        text = ",".join(str(b) for b in value)  # a Uint8Array from !!binary
    elif isinstance(value, list | tuple):
        if id(value) in active:  # Array.prototype.join renders a cycle as ''
            return
        active.add(id(value))
        for index, item in enumerate(value):
            if index:
                _add_part(",", parts, size)
            if item is not None:  # join() renders null and undefined as ''
                _append_js_string(item, parts, size, active)
        active.discard(id(value))
        return
    else:
        text = "[object Object]"
    _add_part(text, parts, size)


def _add_part(text: str, parts: list[str], size: list[int]) -> None:
    size[0] += len(text)
    if size[0] > MAX_JS_STRING_CHARS:
        raise JsStringTooLongError("String() result too long")
    parts.append(text)


def to_js_property_key(value: object) -> str:
    """The property name js-yaml stores a mapping key under."""
    if isinstance(value, list | tuple):
        for item in value:
            if isinstance(item, list | tuple):
                raise ValueError("nested arrays are not supported inside keys")
        return to_js_string(["[object Object]" if isinstance(v, Mapping) else v for v in value])
    return to_js_string(value)


def _pad_year(year: int) -> str:
    return f"{year:04d}" if year >= 0 else f"-{abs(year):04d}"


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    days += 719_468
    era = days // 146_097
    doe = days - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (month <= 2), month, day
