"""What the Redis client makes of a URL (``client_problem``): its port, and every query option read as
redis-py reads them, nothing connected; a problem said in words without the URL's credentials, so
that a location is refused in one line where it is read instead of a traceback at the first connection."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from .errors import location_secrets, redact

__all__ = ["client_problem"]

_UNKNOWN = re.compile(r"unexpected keyword argument '(\w+)'")


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
