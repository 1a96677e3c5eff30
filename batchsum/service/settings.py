"""The client's settings and every check of an option's value: ``ClientSettings``, the key as a
``Secret``, the ``BATCHSUM_*`` names and the defaults, and ``environment()``, the one reader of them.

The layers that send (the client, the pacer, the budget, the engine) check and default their values
here, below the run; ``run.spec`` builds a ``RunSpec`` from the same checks. The environment is read
in one function, ``environment(environ)``: pass a mapping (tests do) and ``os.environ`` is not read.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from . import contract
from .errors import ConfigurationError, InvalidParameterError, redact_location
from .location import BUDGET, STORE, Location
from .retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT

__all__ = [
    "ClientSettings",
    "Secret",
    "environment",
    "ENV_API_KEY",
    "ENV_BASE_URL",
    "ENV_RPM",
    "ENV_BUDGET",
    "ENV_STORE",
    "DEFAULT_RPM",
    "DEFAULT_MAX_WAIT",
    "DEFAULT_BUDGET_WAIT",
    "DEFAULT_WINDOW",
    "DEFAULT_WINDOW_BYTES",
    "DEFAULT_DRAIN_SECONDS",
    "ENCODINGS",
    "LONG_TEXT_POLICIES",
    "AUTO",
    "AUTO_MAX_RPM",
    "MIN_SHARE_PER_HOUR",
    "key_hash",
    "key_hash_from_environment",
    "is_loopback",
    "client_settings",
    "budget_spec",
    "store_spec",
    "Rate",
    "check_key",
    "check_base_url",
    "check_rate",
    "describe_rate",
    "check_rpm",
    "check_whole",
    "check_share",
    "share_at_rate",
    "check_seconds",
    "check_timeout",
    "check_retries",
    "check_encoding",
    "check_choice",
    "check_flag",
    "check_name",
    "check_limiter",
    "check_params",
    "check_path",
]

ENV_API_KEY = "BATCHSUM_API_KEY"
ENV_BASE_URL = "BATCHSUM_BASE_URL"
ENV_RPM = "BATCHSUM_RPM"
ENV_BUDGET = "BATCHSUM_BUDGET"
ENV_STORE = "BATCHSUM_STORE"
DEFAULT_RPM = 60.0
DEFAULT_MAX_WAIT = 1800.0  # seconds a row may wait out 429s before it fails as rate_limited
DEFAULT_BUDGET_WAIT = 300.0  # seconds a run waits for a rate budget it cannot reach mid-run before it stops
ENCODINGS = ("json", "form", "multipart")
LONG_TEXT_POLICIES = ("skip", "split", "truncate")
DEFAULT_WINDOW = 1024  # rows held between reading and yielding ...
DEFAULT_WINDOW_BYTES = 16 << 20  # ... and their input's bytes (the rows behind a slow one wait, not the reading)
DEFAULT_DRAIN_SECONDS = 15.0  # how long a stop waits for answers on the wire


def environment(environ: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """The variables settings are read from: ``environ`` when given, else ``os.environ`` (the one
    place batchsum reads it for a setting)."""
    return os.environ if environ is None else environ


def key_hash(key: str) -> str:
    """A key's short name where one must be shown or stored (12 hex digits of a salted SHA-256):
    never a piece of the key, and not reversible."""
    return hashlib.sha256(f"batchsum key hash\n{key}".encode()).hexdigest()[:12]


class Secret:
    """A value that is never shown: ``repr``/``str``/``format`` give ``'**********'``. It pickles (a
    Dask or Spark worker needs the key), but nothing that describes a spec, a client or a run holds it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The value itself, for the one place that needs it (the Authorization header)."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Secret, (self._value,))


def key_hash_from_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """The short hash of the key in ``$BATCHSUM_API_KEY`` (``batchsum limits``' "this key"), or None."""
    key = environment(environ).get(ENV_API_KEY, "").strip()
    return key_hash(key) if key else None


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and literal addresses in 127.0.0.0/8 or ::1. Not ``*.localhost``:
    a resolver may send such a name anywhere, and the key would go with it over plain http."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_key(key: object, source: str) -> str:
    """The key, stripped, when it is printable ASCII with no space (what an Authorization header can
    carry); else a ``ConfigurationError`` that says what is wrong without echoing the key."""
    if isinstance(key, Secret):
        key = key.reveal()
    if not isinstance(key, str):
        raise ConfigurationError(f"the API key from {source} is a {type(key).__name__}, not a text")
    key = key.strip()
    if not key:
        raise ConfigurationError(
            f"no API key: set {ENV_API_KEY} (the key is on the 'My Account' page of the service), or several in "
            "$BATCHSUM_API_KEYS or a key file (--keys, keys=), or use the local service (--local, local=True)"
        )
    for position, char in enumerate(key, 1):
        if not "!" <= char <= "~":
            kind = (
                "a space"
                if char == " "
                else "a control character"
                if char < " " or char == "\x7f"
                else "a non-ASCII character"
            )
            raise ConfigurationError(
                f"the API key from {source} contains {kind} at position {position}; "
                "copy it again from the service's 'My Account' page"
            )
    return key


def check_base_url(url: str) -> str:
    """``url`` without a trailing slash, when it is http(s) with a host and the key may go there. A
    user or password in it is refused: the HTTP client would send them instead of the key."""
    url = url.strip().rstrip("/")
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        host = None
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        raise ConfigurationError(f"invalid base URL {redact_location(url)!r}: use https://host[:port]")
    if "@" in parts.netloc:
        raise ConfigurationError(
            f"invalid base URL {redact_location(url)!r}: a user or password in it would be sent instead of the "
            "API key; leave them out (the key goes in the Authorization header)"
        )
    if parts.scheme == "http" and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to send the API key over plain http to {host}: "
            "use https, or http only to a loopback address (127.0.0.1, localhost)"
        )
    return url


AUTO = "auto"
AUTO_MAX_RPM = 1_000_000.0  # the cap of a plain "auto": what no plan is (the header parser's bound too)


class Rate(NamedTuple):
    """A rate as checked (``check_rate``): requests a minute (under ``auto``, the cap), and whether the
    limit is found (``auto``: stated, remembered or searched)."""

    rpm: float
    auto: bool


def check_rate(rpm: object, name: str = "rpm", *, text: bool = False) -> Rate:
    """``rpm`` as a ``Rate``: a number >= 0, or ``"auto"`` / ``"auto:N"`` (find the limit, at most N a
    minute); a ``Rate`` as it is (checked already). ``text``: a number may come as text (the command
    line, the environment, a key file); from Python it must be a number. ``InvalidParameterError``
    naming ``name`` for anything else. The one check of a rate, wherever it enters."""
    if isinstance(rpm, Rate):
        return rpm
    if isinstance(rpm, str):
        spelled = rpm.strip().lower()
        if spelled == AUTO:
            return Rate(AUTO_MAX_RPM, True)
        if spelled.startswith(AUTO + ":"):
            try:
                cap = float(spelled[len(AUTO) + 1 :])
            except ValueError:
                cap = math.nan
            if not 1 <= cap <= AUTO_MAX_RPM:
                raise InvalidParameterError(
                    f"invalid {name} {rpm!r}: use auto:N with N from 1 to {AUTO_MAX_RPM:,.0f} requests a minute"
                )
            return Rate(cap, True)
        if not text:
            raise InvalidParameterError(
                f"invalid {name} {rpm!r}: use a number of requests per minute, 'auto' or 'auto:N'"
            )
        try:
            number = float(spelled)
        except ValueError:
            raise InvalidParameterError(
                f"invalid {name} {rpm!r}: use a finite number of requests per minute >= 0 (0 = no pacing), auto, "
                "or auto:N"
            ) from None
        return Rate(check_rpm(number, name), False)
    return Rate(check_rpm(rpm, name), False)


def describe_rate(rpm: float, auto: bool) -> str | float:
    """How a rate is written: the number, ``auto`` or ``auto:N``."""
    if not auto:
        return rpm
    return AUTO if rpm >= AUTO_MAX_RPM else f"{AUTO}:{rpm:g}"


def check_rpm(rpm: object, name: str = "rpm") -> float:
    """``rpm`` as a float when it is a finite number >= 0; else ``InvalidParameterError`` (a ValueError)."""
    if isinstance(rpm, bool) or not isinstance(rpm, (int, float)) or not 0 <= rpm < math.inf:
        raise InvalidParameterError(
            f"invalid {name} {rpm!r}: use a finite number of requests per minute >= 0 (0 = no pacing)"
        )
    return float(rpm)


def check_whole(name: str, value: Any, *, minimum: int = 1, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        more = ", or None for automatic" if allow_none else ""
        raise InvalidParameterError(f"invalid {name} {value!r}: use a whole number >= {minimum}{more}")
    return value


MIN_SHARE_PER_HOUR = 1.0  # a share slower than one start an hour is refused: it would look like a stall


def check_share(value: object, rpm: float = 0.0) -> float:
    """A share of the key's rate: a number in (0, 1]; at ``rpm`` (0: no pacing), at least one start
    an hour."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise InvalidParameterError(f"invalid share {value!r}: use a number above 0 and at most 1 (e.g. 0.8)")
    return share_at_rate(float(value), rpm)


def share_at_rate(share: float, rpm: float) -> float:
    """A share already checked (``check_share``), at the run's rate ``rpm`` (0: no pacing): at least
    one start an hour, which only the run knows (the option's check cannot)."""
    per_hour = rpm * share * 60
    if rpm and per_hour < MIN_SHARE_PER_HOUR:
        least = MIN_SHARE_PER_HOUR / (rpm * 60)
        raise InvalidParameterError(
            f"invalid share {share!r}: at rpm {rpm:g} it leaves {per_hour:.3g} requests an hour; "
            f"use a share of at least {least:.3g} (one request an hour)"
        )
    return share


def check_seconds(name: str, value: object, *, zero: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (value >= 0 if zero else value > 0)
        or not value < math.inf
    ):
        bound = ">= 0" if zero else "> 0"
        raise InvalidParameterError(f"invalid {name} {value!r}: use a finite number of seconds {bound}")
    return float(value)


def check_timeout(value: object, name: str = "timeout") -> float:
    """Seconds to wait for one answer: a finite number above 0."""
    return check_seconds(name, value)


def check_retries(value: object, name: str = "max_retries") -> int:
    """Retries of a transient failure: a whole number, 0 or more."""
    retries = check_whole(name, value, minimum=0)
    assert retries is not None
    return retries


def check_encoding(value: object, name: str = "encoding") -> str:
    """A request body's encoding: one of ``ENCODINGS``."""
    return check_choice(name, value, ENCODINGS)


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InvalidParameterError(f"invalid {name} {value!r}: use one of {', '.join(map(repr, choices))}")
    return str(value)


def check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidParameterError(f"invalid {name} {value!r}: use True or False")
    return value


def check_name(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidParameterError(f"invalid {name} {value!r}: use a non-empty name")
    return value


def check_limiter(limiter: Any) -> Any:
    """``limiter`` when it is None or has an ``acquire()`` to await."""
    if limiter is not None and not callable(getattr(limiter, "acquire", None)):
        raise InvalidParameterError("invalid limiter: it needs an async acquire() method, as AsyncLimiter has")
    return limiter


def check_params(mode: Any, percentage: Any, type: Any) -> contract.Params:
    """The request parameters, normalized; ``InvalidParameterError`` naming a bad one."""
    try:
        return contract.parse_params(mode, percentage, type)
    except ValueError as exc:
        raise InvalidParameterError(str(exc)) from None


@dataclass(frozen=True)
class ClientSettings:
    """Where requests go and how each is sent. ``api_key`` is a ``Secret``; with ``local`` it and
    ``base_url`` are filled in when the run starts the local service."""

    api_key: Secret | None
    base_url: str
    local: bool = False
    timeout: float = DEFAULT_TIMEOUT
    max_retries: int = DEFAULT_MAX_RETRIES
    encoding: str = "json"

    @property
    def service(self) -> str:
        """The service's one name (``contract.service_identity``; the local reference service as
        ``contract.LOCAL_SERVICE``, not its port): what answers and remembered limits are kept by."""
        return contract.LOCAL_SERVICE if self.local else contract.service_identity(self.base_url)

    @property
    def key_hash(self) -> str | None:
        """The key's short hash (``key_hash``), None before the local service fills it in."""
        return None if self.api_key is None else key_hash(self.api_key.reveal())

    def __repr__(self) -> str:
        """The key as its ``Secret``, the address without credentials (``describe``)."""
        fields = ", ".join(f"{name}={value!r}" for name, value in self.describe().items())
        return f"ClientSettings(api_key={self.api_key!r}, {fields})"

    def describe(self) -> dict[str, Any]:
        """Where and how requests go, as plain data for a report: the key never, the address redacted."""
        return {
            "base_url": redact_location(self.base_url),
            "local": self.local,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
            "encoding": self.encoding,
        }

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``Client`` / ``AsyncClient``."""
        if self.api_key is None:
            if self.local:
                raise ConfigurationError("the local service has not been started for this run")
            raise ConfigurationError(f"no API key: ${ENV_API_KEY} is not set")
        return {
            "api_key": self.api_key.reveal(),
            "base_url": self.base_url,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
            "encoding": self.encoding,
        }


def client_settings(
    api_key: str | Secret | None = None,
    base_url: str | None = None,
    *,
    local: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    max_retries: int = DEFAULT_MAX_RETRIES,
    encoding: str = "json",
    environ: Mapping[str, str] | None = None,
) -> ClientSettings:
    """The client's settings, from the arguments or else the environment, validated."""
    env = environment(environ)
    encoding, max_retries, seconds = check_encoding(encoding), check_retries(max_retries), check_timeout(timeout)
    check_flag("local", local)
    if local:  # the run starts the service and fills in its address and key
        return ClientSettings(None, "", True, seconds, max_retries, encoding)
    source = "api_key" if api_key is not None else f"${ENV_API_KEY}"
    key = check_key(api_key if api_key is not None else env.get(ENV_API_KEY, ""), source)
    if base_url is not None and not isinstance(base_url, str):
        raise ConfigurationError(f"invalid base URL {base_url!r}: use https://host[:port]")
    url = check_base_url(base_url or env.get(ENV_BASE_URL) or contract.DEFAULT_BASE_URL)
    return ClientSettings(Secret(key), url, False, seconds, max_retries, encoding)


def budget_spec(budget: Any, environ: Mapping[str, str] | None = None) -> Any:
    """``budget`` as a ``Location`` (``Location.parse``: the option's text; one as it is), a ``Budget``
    object as it is; for None ``$BATCHSUM_BUDGET``, else the machine's."""
    if budget is None:
        text = environment(environ).get(ENV_BUDGET, "").strip()
        return Location.parse(text, BUDGET, f"${ENV_BUDGET}") if text else Location.machine(BUDGET)
    if isinstance(budget, (str, Location)) or not callable(getattr(budget, "reserve", None)):
        return Location.of(budget, BUDGET)
    return budget


def store_spec(store: object, budget: object, environ: Mapping[str, str] | None = None) -> Location:
    """Where a run's answers are shared beyond its output, as a ``Location``: ``store`` (a text parsed
    as the option's), or for None ``$BATCHSUM_STORE``, else the budget's Redis (with its prefix; a
    ``RedisBudget`` object's ``location``) for a cluster's budget, the machine's otherwise."""
    if store is not None:
        return Location.of(store, STORE)
    text = environment(environ).get(ENV_STORE, "").strip()
    if text:
        return Location.parse(text, STORE, f"${ENV_STORE}")
    followed = budget if isinstance(budget, Location) else getattr(budget, "location", None)
    return followed.as_store() if isinstance(followed, Location) and followed.redis else Location.machine(STORE)


def check_path(name: str, value: Any) -> str:
    """``value`` as a path's text (``os.fspath``); ``InvalidParameterError`` naming ``name`` if it is not a path."""
    try:
        path: str = os.fspath(value)
        return path
    except TypeError:
        raise InvalidParameterError(f"invalid {name} {value!r}: use a file path") from None
