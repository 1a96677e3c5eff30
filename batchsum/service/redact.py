"""Redaction, once: secrets (the API key) out of a text, whole or in part, in whatever shape it gives
them (``redact``); credentials (user, password, presigned parameters) out of a location (``redact_location``)."""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

__all__ = ["redact", "redact_value", "redact_location", "location_secrets", "REDACTED", "FRAGMENT"]

REDACTED = "[redacted]"
FRAGMENT = 8
"""Any run of this many characters of a secret is taken out (the promise is that no 10 are left:
two spare, so that an escape added later, such as a repr's backslash, cannot complete a piece)."""

# A secret may reach a text escaped: JSON (\u0041, \/), a repr (\x41), percent (%41) or HTML (&#65;)
# encoding, or split by white space (raw or escaped). Each such unit stands for one character.
_ESCAPE = (
    r"\\u[0-9a-fA-F]{4}|\\x[0-9a-fA-F]{2}|\\[\\/\"'bfnrt]|%[0-9a-fA-F]{2}"
    r"|&#[0-9]{1,7};|&#[xX][0-9a-fA-F]{1,6};|&[A-Za-z]{2,8};"
)
_UNIT = re.compile(_ESCAPE + r"|.", re.DOTALL)
_CHAR = re.compile(r".", re.DOTALL)
_ESCAPES = re.compile(_ESCAPE)
_SIMPLE_ESCAPES = {"\\": "\\", "/": "/", '"': '"', "'": "'", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _decode_unit(unit: str) -> str:
    """The character a unit stands for ("" for white space); the unit itself when it is none."""
    if len(unit) == 1:
        return "" if unit.isspace() else unit
    if unit[0] == "\\":
        if unit[1] in "ux":
            decoded = chr(int(unit[2:], 16))
        else:
            decoded = _SIMPLE_ESCAPES[unit[1]]
    elif unit[0] == "%":
        decoded = chr(int(unit[1:], 16))
    elif unit[0] == "&":
        try:
            decoded = html.unescape(unit)
        except (ValueError, OverflowError):  # pragma: no cover - html.unescape replaces bad references
            return unit
        if len(decoded) != 1:  # not a reference to one character: plain text
            return unit
    else:
        return "".join(unit.split())  # a run of white space
    return "" if decoded.isspace() or decoded in "\b\f" else decoded


@functools.lru_cache(maxsize=64)
def _windows(secrets: tuple[str, ...]) -> tuple[tuple[int, frozenset[str]], ...]:
    """For each secret, as texts are compared (escapes decoded, white space taken out) and as it
    is (a secret holding "%41" or "\\n" is looked for both ways): the length of the pieces looked
    for and the set of its pieces of that length."""
    prepared = []
    for secret in secrets:
        for form in {"".join(secret.split()), _flatten(secret)}:
            if form:
                width = min(FRAGMENT, len(form))
                prepared.append((width, frozenset(form[i : i + width] for i in range(len(form) - width + 1))))
    return tuple(prepared)


def _flatten(text: str) -> str:
    """``text`` with its escapes decoded and its white space taken out (the escapes first: none
    holds white space, and one that stands for white space becomes nothing)."""
    if "\\" in text or "%" in text or "&" in text:
        text = _ESCAPES.sub(lambda m: _decode_unit(m.group()), text)
    return "".join(text.split())


def _marker(secrets: tuple[str, ...]) -> str:
    """``[redacted]``, unless a secret could be completed by it. Next to a marker are at most 7
    characters of a secret (8 would have been redacted), so a piece of 10 across its edge needs
    "[re" or "ed]" in the secret; then a marker whose every 10 characters hold a space (a key has
    none)."""
    if any("[re" in secret or "ed]" in secret for secret in secrets):
        return " [redacted key] "
    return REDACTED


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every piece of ``FRAGMENT`` or more characters of any of ``secrets`` (the
    whole of a shorter one) replaced by ``[redacted]``, in whatever shape the text carries it: raw,
    escaped (JSON, repr, percent, HTML), split by white space or line breaks, or cut short.

    Run it on the raw text of an answer before anything parses, cuts or escapes it: a cut or an
    escape can leave a piece of a secret that the whole secret no longer matches.
    """
    secrets = tuple(secrets)
    windows = _windows(secrets)
    if not windows or not text:
        return text
    # The text is read two ways, as an escape can be ambiguous once cut or split ("%00\" + line
    # break + "'" is a piece of the secret "%00\'" only if the escapes are left alone): with only
    # its white space taken out, and with its escapes decoded too. Fast path, the common case:
    # neither holds a piece of a secret (C-speed substitution and substring tests).
    readings = ("".join(text.split()), _flatten(text))
    if not any(piece in flat for flat in readings for width, pieces in windows for piece in pieces):
        return text
    spans: list[tuple[int, int]] = []
    for units in (_CHAR, _UNIT):
        chars: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        for match in units.finditer(text):
            unit = match.group()
            decoded = _decode_unit(unit)
            if len(decoded) == 1:
                chars.append(decoded)
                starts.append(match.start())
                ends.append(match.end())
            elif decoded:  # an "&...;" that names no single character: its characters as they are
                for offset, char in enumerate(decoded):
                    chars.append(char)
                    starts.append(match.start() + offset)
                    ends.append(match.start() + offset + 1)
        flat = "".join(chars)
        for width, pieces in windows:
            for i in range(len(flat) - width + 1):
                if flat[i : i + width] in pieces:
                    spans.append((starts[i], ends[i + width - 1]))
    if not spans:
        return text
    spans.sort()
    merged = [spans[0]]
    for start, end in spans[1:]:
        if start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    marker = _marker(secrets)
    out = []
    position = 0
    for start, end in merged:
        out.append(text[position:start])
        out.append(marker)
        position = end
    out.append(text[position:])
    return "".join(out)


def redact_value(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (a parsed JSON body: dicts, lists, texts) with ``redact`` applied to every text in it."""
    secrets = tuple(secrets)
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, Mapping):
        return {redact_value(k, secrets): redact_value(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v, secrets) for v in value]
    return value


# scheme://user:password@host: the user information up to the last "@" before the path, or, for a
# secret with an unencoded "/" in it (AWS secrets have them), "user:secret...@" up to the first "@"
# (a port followed by a path is not taken for one).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#\s]*@|[^/?#\s@:]*:(?!\d*(?:[/?#\s]|$))[^\s@]*@)")
# A parameter: of a query or a fragment (``?name=value``, ``&``, ``#``), its value up to the next one
# (``;`` too, the old separator); or of a path's segment (``/v1;token=value/``), up to the segment's end.
_PARAMETER = re.compile(r"([?&#]([^=&#?;\s]*)=)([^&#;\s]*)|(;([^=&#?;/\s]*)=)([^&#?;/\s]*)")
# Query parameters that carry a credential: presigned URLs (X-Amz-Signature, X-Amz-Credential,
# X-Amz-Security-Token, X-Goog-Signature, Azure SAS sig), tokens and keys of every kind.
_SENSITIVE = re.compile(r"(?i)sig|token|credential|secret|passw|pwd|key|auth|session|private")
_LOCATION_SECRET_MIN = 6  # a shorter user or password would take ordinary words out of messages


def redact_location(location: str) -> str:
    """``location`` (an input or output path or URI, or a message holding some) without its
    credentials: ``s3://KEY:SECRET@bucket/x`` -> ``s3://***@bucket/x``, and the values of query
    parameters that carry one (``X-Amz-Signature=***``, ``sig=***``, ``token=***``, ...)."""
    text = _USERINFO.sub(lambda m: m.group(1) + "***@", location)
    return _PARAMETER.sub(lambda m: _masked(m) or m.group(0), text)


def _parameter(match: re.Match[str]) -> tuple[str, str, str]:
    """A ``_PARAMETER`` match as (what precedes its value, its name, its value)."""
    if match.group(1) is not None:
        return match.group(1), match.group(2), match.group(3)
    return match.group(4), match.group(5), match.group(6)


def _masked(match: re.Match[str]) -> str | None:
    """The parameter with its value masked when its name says it carries a credential; else None."""
    start, name, value = _parameter(match)
    return start + "***" if value and _SENSITIVE.search(unquote(name)) else None


def location_secrets(location: str) -> tuple[str, ...]:
    """The credentials ``location`` holds (user, password, sensitive query values; raw and
    percent-decoded), for ``redact`` on a message a library built from it in its own words."""
    found: list[str] = []
    for match in _USERINFO.finditer(location):
        userinfo = match.group(2)[:-1]
        found.extend(userinfo.split(":", 1))
    for match in _PARAMETER.finditer(location):
        if _masked(match) is not None:
            found.append(_parameter(match)[2])
    secrets = {s for raw in found for s in (raw, unquote(raw)) if len(s) >= _LOCATION_SECRET_MIN}
    return tuple(sorted(secrets))
