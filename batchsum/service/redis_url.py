"""A Redis location checked once, for the budget and the store alike: its scheme, its port, its
``?prefix=NAME`` (the store's keys' prefix, which redis-py does not know and never sees), and every
other query option as the Redis client reads it, each refused in one line where the option is read
instead of a traceback at the first connection."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit

from .errors import InvalidParameterError, location_secrets, redact, redact_location

__all__ = ["redis_url", "split_prefix", "client_problem", "REDIS_FORM"]

REDIS_FORM = "redis://[:PASSWORD@]HOST:PORT/DB[?prefix=NAME]"
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_UNKNOWN = re.compile(r"unexpected keyword argument '(\w+)'")


def split_prefix(url: str, error: type[Exception] = InvalidParameterError) -> tuple[str, str]:
    """``url`` without its ``prefix`` query parameter, and the prefix of a store's keys (``NAME:``, or
    ``""``). ``error`` for a name that is not letters, digits, ``.``, ``_`` or ``-`` (at most 64)."""
    head, mark, query_text = url.partition("?")
    query = parse_qsl(query_text, keep_blank_values=True)
    names = [value for name, value in query if name == "prefix"]
    if not names:
        return url, ""
    if len(names) > 1 or not _NAME.fullmatch(names[0]):
        raise error(
            f"invalid prefix {names[-1]!r} in {redact_location(url)!r}: use one name of letters, digits, '.', '_' or '-'"
        )
    rest = urlencode([(name, value) for name, value in query if name != "prefix"])
    return head + (mark + rest if rest else ""), names[0] + ":"  # the rest as written (unix:///PATH stays whole)


def client_problem(url: str) -> str | None:
    """What is wrong with ``url`` (without its prefix: the client knows none) for the Redis client,
    or None when it reads it (or the client is not installed: said where a budget or store opens)."""
    try:
        urlsplit(url).port  # noqa: B018 - reading the port is the check
    except ValueError:  # a port that is not a number, or out of range (its words may hold a piece of a password)
        return "its port is not a number from 0 to 65535 (a password with '/', '?', '#' or '@' is percent-encoded)"
    try:
        import redis
    except ImportError:
        return None
    try:
        redis.ConnectionPool.from_url(url).make_connection()  # made, not connected: its options read
    except (TypeError, ValueError, redis.exceptions.RedisError) as exc:
        unknown = _UNKNOWN.search(str(exc))
        why = (
            f"the Redis client knows no option {unknown.group(1)!r}"
            if unknown
            else str(exc).splitlines()[0].rstrip(".")
        )
        return redact(why, location_secrets(url))
    return None


def redis_url(url: str, source: str, error: type[Exception] = InvalidParameterError) -> str:
    """A Redis URL as the redis client reads it: its scheme in lower case, its port a number, its prefix
    a name, its other query options ones the client knows; else ``error`` naming ``source`` in one line,
    without the URL's credentials. Nothing is connected."""
    scheme, sep, rest = url.strip().partition("://")
    url = scheme.lower() + sep + rest
    shown = redact_location(url)
    try:
        urlsplit(url).port  # noqa: B018 - reading the port is the check
    except ValueError:
        why = client_problem(url)
        raise error(f"invalid {source} {shown!r}: {why}; use {REDIS_FORM}") from None
    bare, _ = split_prefix(url, error)
    why = client_problem(bare)
    if why is not None:
        raise error(f"invalid {source} {shown!r}: {why}; use {REDIS_FORM}")
    return url
