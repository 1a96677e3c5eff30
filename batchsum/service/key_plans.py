"""A run's API keys (``KeyPlan``: the key as a ``Secret``, where it came from, its own rate and quota)
and quotas (``Quota``: N an hour, a day or a month, in UTC calendar periods), read from ``api_key``,
a key file (``keys=``, ``--keys FILE``), ``$BATCHSUM_API_KEYS`` or ``$BATCHSUM_API_KEY``.

A key file holds one key a line, ``KEY [RPM|auto|auto:N] [quota=N/hour|day|month]``; blank lines and
lines starting with ``#`` are skipped. It is refused when group or others may read it (as ssh refuses
a private key), and a malformed line is reported by its number, never echoed: nothing of a key is
ever shown, only its short hash (``settings.key_hash``).
"""

from __future__ import annotations

import calendar
import datetime as _dt
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from .errors import ConfigurationError, InvalidParameterError
from .settings import ENV_API_KEY, Rate, Secret, check_key, check_rate, environment, key_hash

__all__ = [
    "KeyPlan",
    "Quota",
    "ENV_API_KEYS",
    "PERIODS",
    "parse_quota",
    "period_window",
    "read_key_file",
    "resolve_keys",
    "MAX_KEY_FILE_BYTES",
]

ENV_API_KEYS = "BATCHSUM_API_KEYS"
PERIODS = ("hour", "day", "month")
ADJECTIVES = {"hour": "hourly", "day": "daily", "month": "monthly"}
MAX_KEY_FILE_BYTES = 1 << 20  # a key file is a few lines; a larger file is not one
_QUOTA_HELP = "use N/hour, N/day or N/month (e.g. 10000/day)"


@dataclass(frozen=True)
class Quota:
    """``limit`` paid requests per UTC calendar ``period`` (hour, day or month) on a key's budget."""

    limit: int
    period: str

    def __str__(self) -> str:
        return f"{self.limit}/{self.period}"

    @property
    def name(self) -> str:
        """``daily quota of 10000``: how messages name it."""
        return f"{ADJECTIVES[self.period]} quota of {self.limit}"

    def window(self, wall: float) -> tuple[str, float, float]:
        """The quota's period holding the Unix time ``wall`` (``period_window``)."""
        return period_window(self.period, wall)


def period_window(period: str, wall: float) -> tuple[str, float, float]:
    """The UTC calendar ``period`` (hour, day or month) holding the Unix time ``wall``: its name
    (``day:2026-11-26``), start and end."""
    moment = _dt.datetime.fromtimestamp(wall, _dt.timezone.utc)
    if period == "hour":
        start = moment.replace(minute=0, second=0, microsecond=0)
        end, label = start + _dt.timedelta(hours=1), start.strftime("%Y-%m-%dT%H")
    elif period == "day":
        start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        end, label = start + _dt.timedelta(days=1), start.strftime("%Y-%m-%d")
    else:
        start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        days = calendar.monthrange(start.year, start.month)[1]
        end, label = start + _dt.timedelta(days=days), start.strftime("%Y-%m")
    return f"{period}:{label}", start.timestamp(), end.timestamp()


def parse_quota(value: object, name: str = "quota") -> Quota | None:
    """``"10000/day"`` (``/hour``, ``/month``) as a ``Quota``; None for None; else
    ``InvalidParameterError`` naming ``name``."""
    if value is None or isinstance(value, Quota):
        return value
    if not isinstance(value, str):
        raise InvalidParameterError(f"invalid {name} {value!r}: {_QUOTA_HELP}")
    count, _, period = value.strip().lower().partition("/")
    if period not in PERIODS or not count.isascii() or not count.isdigit() or not 0 < int(count) < 10**12:
        raise InvalidParameterError(f"invalid {name} {value!r}: {_QUOTA_HELP}")
    return Quota(int(count), period)


@dataclass(frozen=True)
class KeyPlan:
    """One key of a run: the key (a ``Secret``), where it came from (``source``: ``keys.txt line 2``,
    ``$BATCHSUM_API_KEYS (key 2)``, ``api_key[1]``), and its own ``rate`` (the text of a key file's
    rate: a number, ``auto`` or ``auto:N``; None: the run's ``rpm``), as checked when the line was read
    (``checked``), and ``quota`` (None: the run's). Its repr shows its hash, never the key."""

    key: Secret
    source: str
    rate: str | None = None
    quota: Quota | None = None
    checked: Rate | None = None

    @property
    def hash(self) -> str:
        """The key's short hash: how it is shown and stored."""
        return key_hash(self.key.reveal())

    def limit(self, rpm: float, auto: bool) -> tuple[float, bool]:
        """The key's (requests a minute, auto): its own rate, else the run's."""
        return (rpm, auto) if self.checked is None else self.checked

    def __repr__(self) -> str:
        return f"KeyPlan({self.hash}, {self.source!r}, rate={self.rate!r}, quota={self.quota})"


def _plan(key: object, source: str, rate: tuple[str, Rate] | None = None, quota: Quota | None = None) -> KeyPlan:
    text, checked = rate if rate is not None else (None, None)
    return KeyPlan(Secret(check_key(key, source)), source, text, quota, checked)


def read_key_file(path: str | os.PathLike[str]) -> tuple[KeyPlan, ...]:
    """The keys of a key file, in order. ``ConfigurationError`` when it cannot be read, is readable
    by group or others, holds no key or repeats one; a malformed line is named by its number, and
    nothing of it is echoed."""
    shown = os.fspath(path)
    try:
        with open(path, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise ConfigurationError(f"the key file {shown} is not a regular file")
            if mode & 0o077:
                raise ConfigurationError(
                    f"the key file {shown} may be read by others (permissions {stat.S_IMODE(mode):04o}): "
                    f"make it yours alone with chmod 600 {shown}, as ssh asks of a private key; nothing was sent"
                )
            raw = file.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigurationError(f"cannot read the key file {shown}: {exc.strerror or exc}") from None
    if len(raw) > MAX_KEY_FILE_BYTES:
        raise ConfigurationError(f"the key file {shown} is over {MAX_KEY_FILE_BYTES // 1024} KiB: not a key file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigurationError(f"the key file {shown} is not UTF-8 text") from None
    plans: list[KeyPlan] = []
    seen: dict[str, int] = {}
    name = os.path.basename(shown)
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        comment = next((i for i, field in enumerate(fields) if field.startswith("#")), len(fields))
        fields = fields[:comment]  # a field that begins with # begins a comment, to the line's end
        where = f"{name} line {number}"
        rate, quota = _extras(fields[1:], shown, number)
        plan = _plan(fields[0], where, rate, quota)
        if plan.key.reveal() in seen:
            raise ConfigurationError(f"{shown} line {number}: the same key as line {seen[plan.key.reveal()]}")
        seen[plan.key.reveal()] = number
        plans.append(plan)
    if not plans:
        raise ConfigurationError(f"the key file {shown} holds no key (one a line: KEY [RPM|auto] [quota=N/day])")
    return tuple(plans)


def _extras(fields: list[str], shown: str, number: int) -> tuple[tuple[str, Rate] | None, Quota | None]:
    """A key file line's rate (as written, and checked: once, here) and quota, after its key, in either
    order; a message naming the line and the field, never its text."""
    rate: tuple[str, Rate] | None = None
    quota: Quota | None = None
    for position, field in enumerate(fields, 2):
        is_quota = field.lower().startswith("quota=")
        if (quota if is_quota else rate) is not None:
            what = "quota" if is_quota else "rate"
            _refuse(shown, number, f"field {position} is one too many: the line has its {what} already")
        malformed = False
        try:
            if is_quota:
                quota = parse_quota(field[len("quota=") :])
            else:
                rate = field, check_rate(field, "rate", text=True)
        except InvalidParameterError:
            malformed = True  # refused below, outside the handler: no message of the field rides along
        if malformed:
            _refuse(shown, number, f"field {position} is not a {'quota' if is_quota else 'rate'}")
    return rate, quota


def _refuse(shown: str, number: int, why: str) -> NoReturn:
    raise ConfigurationError(
        f"{shown} line {number}: {why} (expected KEY [RPM|auto|auto:N] [quota=N/hour|day|month]; the line is "
        "not shown, since it holds a key)"
    )


def _from_environment(text: str) -> tuple[KeyPlan, ...]:
    parts = text.replace(",", " ").split()
    return tuple(_plan(key, f"${ENV_API_KEYS} (key {n})") for n, key in enumerate(parts, 1))


def resolve_keys(
    api_key: object, keys_file: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None
) -> tuple[KeyPlan, ...]:
    """A run's keys: ``api_key`` (one, or a list), else the key file, else ``$BATCHSUM_API_KEYS``
    (separated by commas or white space), else ``$BATCHSUM_API_KEY``; none: an empty tuple. Both
    ``api_key`` and a key file: ``InvalidParameterError``."""
    if api_key is not None and keys_file is not None:
        raise InvalidParameterError("pass api_key or keys (a key file), not both")
    if isinstance(api_key, (list, tuple)):
        plans = tuple(_plan(key, f"api_key[{n}]") for n, key in enumerate(api_key))
        if not plans:
            raise ConfigurationError("api_key is an empty list: give at least one key")
        return _distinct(plans)
    if api_key is not None:
        return (_plan(api_key, "api_key"),)
    if keys_file is not None:
        return read_key_file(keys_file)
    env = environment(environ)
    if env.get(ENV_API_KEYS, "").strip():
        return _distinct(_from_environment(env[ENV_API_KEYS]))
    if env.get(ENV_API_KEY, "").strip():
        return (_plan(env[ENV_API_KEY], f"${ENV_API_KEY}"),)
    return ()


def _distinct(plans: Sequence[KeyPlan]) -> tuple[KeyPlan, ...]:
    seen: dict[str, str] = {}
    for plan in plans:
        if plan.key.reveal() in seen:
            raise ConfigurationError(f"{plan.source} is the same key as {seen[plan.key.reveal()]}")
        seen[plan.key.reveal()] = plan.source
    return tuple(plans)
