"""What a service's rate-limit headers state (``RateStatement``: its per-minute limit and the room left
in it, a quota longer than a minute and the room left in that, the raw ``Retry-After``), read by the
specifications and by what services send; what is not fully understood is ignored, never guessed.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .structured import Item, read_dictionary, read_list

__all__ = ["RateStatement", "parse_rate_headers", "FORMS", "MAX_PER_MINUTE", "MAX_RESET", "MINUTE_BOUND"]

MAX_PER_MINUTE = 1_000_000  # a stated rate above this is garbage, not a plan
MAX_RESET = 31 * 86_400.0  # seconds; a reset, a quota's window or a Retry-After beyond a month is not read
MINUTE_BOUND = 60.0  # a window (or, with none, a reset) at most this long states a per-minute limit; longer, a quota
UNIX_AFTER = 1e9  # an X-RateLimit-Reset this large is a Unix time (2001 on), not a delay
KONG_WINDOWS = {"second": 1, "minute": 60, "hour": 3600, "day": 86_400}

#: The forms read, by the name ``RateStatement.form`` gives them.
FORMS = ("draft-06", "list", "draft-07", "structured", "x-ratelimit", "openai", "kong")


@dataclass(frozen=True)
class RateStatement:
    """What one answer's rate-limit headers state.

    The per-minute part (what pacing reads as a limit and as room; never a quota): ``limit``
    requests per ``window`` seconds (at most ``MINUTE_BOUND``; ``window`` None: not stated, read per
    minute), and ``remaining`` requests left before ``reset`` seconds (at most ``MINUTE_BOUND``).
    A quota longer than a minute (a window over ``MINUTE_BOUND``, or no window and a reset over it):
    ``quota`` requests per ``quota_window`` seconds (None: not stated), ``quota_remaining`` of them
    left until ``quota_reset`` seconds from the answer. ``retry_after``: the ``Retry-After`` as the
    service said it, in seconds (up to ``MAX_RESET``; the client's retry policy clamps its own copy).
    ``form``: the forms read (each of ``FORMS``), joined by ``+`` when several contributed
    (Kong's windows with its ``RateLimit-Reset``: ``kong+draft-06``).
    """

    limit: float | None = None
    window: float | None = None
    remaining: int | None = None
    reset: float | None = None
    form: str = ""
    quota: int | None = None
    quota_window: float | None = None
    quota_remaining: int | None = None
    quota_reset: float | None = None
    retry_after: float | None = None

    @property
    def per_minute(self) -> float | None:
        """The per-minute limit in requests a minute (never a quota's); no stated window is per minute."""
        if self.limit is None:
            return None
        return self.limit * 60.0 / self.window if self.window else float(self.limit)

    @property
    def room(self) -> bool:
        """True when the answer states the room left in the per-minute limit: ``remaining`` before ``reset``."""
        return self.remaining is not None and self.reset is not None

    @property
    def quota_room(self) -> bool:
        """True when the answer states the room left in a quota: ``quota_remaining`` before ``quota_reset``."""
        return self.quota_remaining is not None and self.quota_reset is not None


def parse_rate_headers(headers: Mapping[str, str], now: Callable[[], float] = time.time) -> RateStatement | None:
    """The statement of an answer's rate-limit ``headers``, or None when they state nothing readable.
    Never raises. ``now`` (Unix seconds) dates a reset given as a Unix time or a date.

    Each form by its own text; names are case-insensitive, and a field sent twice arrives joined
    with ", " (as httpx joins repeated fields) and reads as a list:

    - ``draft-06``: ``RateLimit-Limit: 100``, ``RateLimit-Remaining: 50``, ``RateLimit-Reset: 30``
      (seconds), with ``RateLimit-Policy: 100;w=60`` (quotas of L per W seconds): IETF drafts 00-06.
    - ``list``: ``RateLimit-Limit: 10, 10;w=1, 1000;w=3600``: the expiring limit, then quotas (drafts 00-03).
    - ``draft-07``: ``RateLimit: limit=100, remaining=50, reset=30`` (a dictionary) with
      ``RateLimit-Policy: 100;w=60``.
    - ``structured``: ``RateLimit-Policy: "p";q=100;w=60`` and ``RateLimit: "p";r=50;t=30`` (drafts
      08-11; Cloudflare's API). A policy counting other units than requests (``qu``) is skipped, and
      so is the room stated for it; the room stated for a policy is its window's (a day's remainder
      is a quota's room whenever it resets).
    - ``x-ratelimit``: ``X-RateLimit-Limit/-Remaining/-Reset`` (GitHub, Cloudflare, Envoy's
      ``10, 10;w=60``) and the ``X-Rate-Limit-*`` spelling; the reset in seconds, as a Unix time
      (10^9 and over), or as an HTTP date (RFC 1123) or an RFC 3339 date-time.
    - ``openai``: ``x-ratelimit-limit-requests``, ``-remaining-requests``, ``-reset-requests`` (a Go
      duration: ``1s``, ``6m0s``, ``20ms``, ``1m30.5s``); the tokens fields count no requests.
    - ``kong``: ``X-RateLimit-Limit-Second``/``-Minute``/``-Hour``/``-Day`` and
      ``X-RateLimit-Remaining-*``: the window is in the name; the reset comes in Kong's ``RateLimit-*``.

    Numbers are structured-field Integers (at most 15 digits; no sign, exponent or separator) and,
    for a reset, Decimals; ``6e2``, ``-5``, ``NaN``, ``inf``, ``1,000`` and words are ignored. A
    limit is dropped when its rate is not positive or over ``MAX_PER_MINUTE`` or its window is over
    31 days; a reset when it is not positive or over 31 days (``MAX_RESET``), or a Unix time or date
    in the past; so is a ``Retry-After`` (seconds or an HTTP date).

    Per minute or a quota: a limit whose window is at most ``MINUTE_BOUND`` (60 s) is per minute;
    anything else is a quota. A limit with no window beside windows stated in the same fields (the
    list form's ``30, 30;w=86400``, ``RateLimit-Limit: 100`` with ``RateLimit-Policy: 100;w=86400``,
    Envoy's ``10, 10;w=60``) is the limit of one of them, the one with its value (else any); with
    none in its own fields, a window with its value stated in another form's (``X-RateLimit-Limit:
    100`` beside ``RateLimit-Policy: 100;w=86400``). It adds nothing of its own, and its room is
    that window's; when those windows are a minute and longer at once, its room is not understood
    and ignored. A limit with no window and none beside it is per
    minute unless the room its form states resets more than 60 s away, and then it is a quota.
    Room stated for a window over a minute (Kong's ``-Day``, a limit's as above) is a quota's, never
    per-minute room, whenever it resets; room with no window known is a quota's when it resets more
    than 60 s away; a minute's room that resets after its window would have ended is ignored.
    Several per-minute limits (a list, several policies, several forms): the most restrictive rate
    among those with a stated window; a limit with no window only when none states one. Several
    quotas: the one whose window holds the room stated for quotas (the smallest such), else the most
    restrictive rate. Several statements of room: the fewest requests left (the latest reset among
    equals), a whole statement (remaining and reset) before a partial one.
    """
    fields: dict[str, str] = {}
    for name, value in headers.items():
        if isinstance(name, str) and isinstance(value, str):
            key = name.lower()
            fields[key] = f"{fields[key]}, {value}" if key in fields else value
    reading = _Reading(now)
    _read_ietf(fields, reading)
    _read_x_ratelimit(fields, reading)
    _read_openai(fields, reading)
    _read_kong(fields, reading)
    _read_retry_after(fields, reading)
    return reading.statement()


# -- the forms -----------------------------------------------------------------------------------------


def _read_ietf(fields: dict[str, str], reading: _Reading) -> None:
    """``RateLimit-Limit/-Remaining/-Reset`` (drafts 00-06), ``RateLimit`` as a dictionary (draft-07)
    or as a list of service limits (08 on), and ``RateLimit-Policy`` in either shape."""
    dictionary = read_dictionary(fields.get("ratelimit"))
    if dictionary is not None and not {"limit", "remaining", "reset"} & dictionary.keys():
        dictionary = None  # a list of service limits named by tokens also parses as a dictionary
    units: dict[str, object] = {}  # the structured policies by name: the unit each counts
    windows: dict[str, int | None] = {}  # and the window each states (its room is that window's)
    for value, params in read_list(fields.get("ratelimit-policy")) or []:
        if isinstance(value, str):  # drafts 08 on: "name";q=100;w=60
            units[value] = params.get("qu", "requests")
            window = _count(params["w"]) if "w" in params else None
            windows[value] = window if window is not None and 0 < window <= MAX_RESET else None
            if units[value] == "requests":
                reading.quota("structured", params.get("q"), params)
        elif "w" in params:  # drafts 04-07: 100;w=60 (the window is required)
            reading.quota("draft-06" if dictionary is None else "draft-07", value, params)
    for value, params in read_list(fields.get("ratelimit-limit")) or []:
        reading.quota("list" if "w" in params else "draft-06", value, params)
    remaining, reset = read_list(fields.get("ratelimit-remaining")), read_list(fields.get("ratelimit-reset"))
    if remaining is not None or reset is not None:
        reading.room("draft-06", _fewest(remaining), _latest(reset))
    if dictionary is not None:
        reading.quota("draft-07", _member(dictionary, "limit"), {})
        reading.room("draft-07", _count(_member(dictionary, "remaining")), _delay(_member(dictionary, "reset")))
        return
    for value, params in read_list(fields.get("ratelimit")) or []:
        if isinstance(value, str) and units.get(value, "requests") == "requests" and "r" in params:
            until = _delay(params["t"]) if "t" in params else None
            reading.room("structured", _count(params["r"]), until, windows.get(value))


def _read_x_ratelimit(fields: dict[str, str], reading: _Reading) -> None:
    """``X-RateLimit-Limit/-Remaining/-Reset`` and the ``X-Rate-Limit-*`` spelling."""
    for prefix in ("x-ratelimit-", "x-rate-limit-"):
        for value, params in read_list(fields.get(prefix + "limit")) or []:
            reading.quota("x-ratelimit", value, params)
        remaining, reset = read_list(fields.get(prefix + "remaining")), fields.get(prefix + "reset")
        if remaining is not None or reset is not None:
            reading.room("x-ratelimit", _fewest(remaining), None if reset is None else reading.until(reset))


def _read_openai(fields: dict[str, str], reading: _Reading) -> None:
    """``x-ratelimit-limit-requests`` / ``-remaining-requests`` / ``-reset-requests`` (a Go duration)."""
    for value, _ in read_list(fields.get("x-ratelimit-limit-requests")) or []:
        reading.quota("openai", value, {})
    remaining, reset = read_list(fields.get("x-ratelimit-remaining-requests")), fields.get("x-ratelimit-reset-requests")
    if remaining is not None or reset is not None:
        durations = [_go_duration(part) for part in (reset or "").split(",")]
        longest = None if None in durations else max(d for d in durations if d is not None)
        reading.room("openai", _fewest(remaining), longest)


def _read_kong(fields: dict[str, str], reading: _Reading) -> None:
    """Kong's ``X-RateLimit-Limit-<Window>`` and ``X-RateLimit-Remaining-<Window>``."""
    for name, window in KONG_WINDOWS.items():
        for value, _ in read_list(fields.get(f"x-ratelimit-limit-{name}")) or []:
            reading.quota("kong", value, {"w": window})
        if (remaining := read_list(fields.get(f"x-ratelimit-remaining-{name}"))) is not None:
            reading.room("kong", _fewest(remaining), None, window)


_DELAY_SECONDS = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,3})?")  # to the millisecond, as retry-after-ms


def _read_retry_after(fields: dict[str, str], reading: _Reading) -> None:
    """``Retry-After`` (seconds, or an HTTP date) and ``retry-after-ms``, as the service said them."""
    if (text := fields.get("retry-after-ms")) is not None:
        number = read_list(text)
        if number is not None and len(number) == 1 and (value := _delay(number[0][0])) is not None and value > 0:
            reading.retry_after = value / 1000.0
            return
    if (text := fields.get("retry-after")) is not None:
        text = text.strip(" \t")
        date = _unix_date(text)
        if date is not None:
            reading.retry_after = date - reading.now()
        elif _DELAY_SECONDS.fullmatch(text):  # delay-seconds; a decimal fraction is read too, as servers send it
            reading.retry_after = float(text)


# -- what was read, checked as it comes; the most restrictive of it ---------------------------------------


@dataclass(frozen=True)
class _Quota:
    form: str
    limit: int
    window: int | None

    @property
    def per_minute(self) -> float:
        return self.limit * 60.0 / self.window if self.window else float(self.limit)


@dataclass(frozen=True)
class _Room:
    form: str
    remaining: int | None
    reset: float | None
    window: int | None = None  # the window it is stated for, when known (Kong's name, a named policy, a limit's)

    @property
    def long(self) -> bool:
        """The room of a quota: stated for a window over a minute; with no window known, it resets
        more than a minute away."""
        if self.window is not None:
            return self.window > MINUTE_BOUND
        return (self.reset or 0.0) > MINUTE_BOUND

    @property
    def understood(self) -> bool:
        """Not a minute's room that resets after its window would have ended."""
        return self.long or self.reset is None or self.reset <= MINUTE_BOUND


# The forms read in the same fields, whose limit with no window, and its room, go with a window
# stated beside them (a policy, the list form); every other form is a family of its own (Envoy's
# ``10, 10;w=60`` in X-RateLimit-Limit).
_FAMILY = {"draft-06": "ietf", "list": "ietf", "draft-07": "ietf", "structured": "ietf"}
_BARE_ROOM = ("draft-06", "draft-07", "x-ratelimit", "openai")  # the room of a form's limit with no window


class _Reading:
    """Quotas and statements of room gathered from every form present, each checked as it comes."""

    __slots__ = ("quotas", "rooms", "retry_after", "_clock", "_now")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.quotas: list[_Quota] = []
        self.rooms: list[_Room] = []
        self.retry_after: float | None = None
        self._clock = clock
        self._now: float | None = None

    def quota(self, form: str, limit: object, params: Mapping[str, object]) -> None:
        """``limit`` per ``params["w"]`` seconds (absent: not stated); dropped unless both are
        counts, the window at most 31 days and the rate positive and at most ``MAX_PER_MINUTE``."""
        count, window = _count(limit), _count(params["w"]) if "w" in params else None
        if count is None or count == 0 or ("w" in params and (window is None or not 0 < window <= MAX_RESET)):
            return
        quota = _Quota(form, count, window)
        if quota.per_minute <= MAX_PER_MINUTE:
            self.quotas.append(quota)

    def room(self, form: str, remaining: int | None, reset: float | None, window: int | None = None) -> None:
        if reset is not None and not (math.isfinite(reset) and 0 < reset <= MAX_RESET):
            reset = None
        if remaining is not None or reset is not None:
            self.rooms.append(_Room(form, remaining, reset, window))

    def until(self, text: str) -> float | None:
        """Seconds to an ``X-RateLimit-Reset``: a delay, a Unix time, or a date (the latest of several)."""
        dates = [_unix_date(part) for part in _DATES.split(text.strip(" \t"))]
        if None not in dates:
            return max(d for d in dates if d is not None) - self.now()
        values = [_delay(value) for value, _ in read_list(text) or [(None, {})]]
        if None in values:
            return None
        return max(v - self.now() if v >= UNIX_AFTER else v for v in values if v is not None)

    def now(self) -> float:
        """Unix seconds, read once: every date in one answer is measured from the same instant."""
        if self._now is None:
            self._now = float(self._clock())
        return self._now

    def attributed(self) -> tuple[list[_Quota], list[_Room]]:
        """The limits and rooms read, each with its window where the fields say it: a limit with no
        window beside windows stated in its family is the limit of one of them (the one with its
        value; else any), so it adds no limit of its own, and its room is that window's (dropped
        when those windows are a minute and longer at once: not understood). With no window in its
        family, one with its value in another form's fields (Kong's ``-Minute`` beside its
        ``RateLimit-Limit``) is its window the same way. A limit with no window and no window for it
        is kept as it is: per minute, or a quota by its room's reset."""
        windowed: dict[str, list[_Quota]] = {}
        for each in self.quotas:
            if each.window is not None:
                windowed.setdefault(_FAMILY.get(each.form, each.form), []).append(each)
        everywhere = [q for stated in windowed.values() for q in stated]
        named: dict[str, set[int]] = {}  # the windows a family's limit with no window may be
        quotas = []
        for each in self.quotas:
            family = _FAMILY.get(each.form, each.form)
            own = windowed.get(family, [])
            same = [q.window for q in own or everywhere if q.limit == each.limit and q.window is not None]
            if each.window is None and (own or same):
                named.setdefault(family, set()).update(same or [q.window for q in own if q.window is not None])
            else:
                quotas.append(each)
        rooms = []
        for room in self.rooms:
            family = _FAMILY.get(room.form, room.form)
            candidates = named.get(family) or {q.window for q in windowed.get(family, []) if q.window is not None}
            if room.form in _BARE_ROOM and candidates:
                if len({window > MINUTE_BOUND for window in candidates}) != 1:
                    continue
                room = _Room(room.form, room.remaining, room.reset, max(candidates))
            if room.understood:
                rooms.append(room)
        return quotas, rooms

    def statement(self) -> RateStatement | None:
        retry_after = self.retry_after if self.retry_after is not None and 0 < self.retry_after <= MAX_RESET else None
        quotas, rooms = self.attributed()
        quota_forms = {room.form for room in rooms if room.long}  # forms whose bare limit is a quota
        minute: list[_Quota] = []
        longer: list[_Quota] = []
        for each in quotas:
            long = each.window > MINUTE_BOUND if each.window is not None else each.form in quota_forms
            (longer if long else minute).append(each)
        stated = [q for q in minute if q.window is not None]
        limit = min(stated or minute, key=lambda q: q.per_minute, default=None)
        room = _fewest_room([r for r in rooms if not r.long])
        quota_room = _fewest_room([r for r in rooms if r.long])
        holding = [q for q in longer if q.window is not None and quota_room and q.window == quota_room.window]
        if not holding:
            holding = [
                q for q in longer if q.window is not None and quota_room and q.window >= (quota_room.reset or 0.0)
            ]
        quota: _Quota | None = min(holding, key=lambda q: q.window or 0) if holding else None
        if quota is None:
            windowed = [q for q in longer if q.window is not None]
            quota = min(windowed or longer, key=lambda q: q.per_minute, default=None)
        parts = (limit, room, quota, quota_room)
        if all(part is None for part in parts) and retry_after is None:
            return None
        return RateStatement(
            limit=None if limit is None else limit.limit,
            window=None if limit is None else limit.window,
            remaining=None if room is None else room.remaining,
            reset=None if room is None else room.reset,
            form="+".join(dict.fromkeys(x.form for x in parts if x is not None)) or "retry-after",
            quota=None if quota is None else quota.limit,
            quota_window=None if quota is None else quota.window,
            quota_remaining=None if quota_room is None else quota_room.remaining,
            quota_reset=None if quota_room is None else quota_room.reset,
            retry_after=retry_after,
        )


def _fewest_room(rooms: list[_Room]) -> _Room | None:
    """The statement of room with the fewest left (the latest reset among equals), a whole one first."""
    whole = [r for r in rooms if r.remaining is not None and r.reset is not None]
    return min(
        whole or rooms,
        key=lambda r: (math.inf if r.remaining is None else r.remaining, -(r.reset or 0.0)),
        default=None,
    )


def _count(value: object) -> int | None:
    """A non-negative Integer (never a Boolean, whose Python type is a subclass of int)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _delay(value: object) -> float | None:
    """A non-negative Integer or Decimal, as seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None


def _member(dictionary: dict[str, Item], key: str) -> object:
    return dictionary[key][0] if key in dictionary else None


def _fewest(items: list[Item] | None) -> int | None:
    """The fewest of a count's values (a field sent twice); None if any value is not a count."""
    counts = [_count(value) for value, _ in items or []]
    return None if not counts or None in counts else min(c for c in counts if c is not None)


def _latest(items: list[Item] | None) -> float | None:
    """The longest of a delay's values; None if any value is not a delay."""
    delays = [_delay(value) for value, _ in items or []]
    return None if not delays or None in delays else max(d for d in delays if d is not None)


_GO_DURATION = re.compile(r"(?:[0-9]{1,12}(?:\.[0-9]{1,9})?(?:h|m|s|ms|us|µs|μs|ns))+|0")
_GO_PART = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,9})?)(h|ms|m|s|us|µs|μs|ns)")
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9}


def _go_duration(text: str) -> float | None:
    """Seconds in a Go duration as OpenAI sends it (``1s``, ``6m0s``, ``20ms``, ``1m30.5s``); no sign."""
    text = text.strip(" \t")
    if not _GO_DURATION.fullmatch(text):
        return None
    return sum(float(number) * _GO_UNITS[unit] for number, unit in _GO_PART.findall(text))


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_WEEKDAY = "(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_HTTP_DATE = re.compile(_WEEKDAY + r", ([0-9]{1,2}) ([A-Z][a-z]{2}) ([0-9]{4}) ([0-9]{2}):([0-9]{2}):([0-9]{2}) GMT")
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_DATES = re.compile(r",[ \t]*(?=" + _WEEKDAY + r",|[0-9]{4}-)")  # between dates a field sent twice joins


def _unix_date(text: str) -> float | None:
    """Unix seconds of an HTTP date (IMF-fixdate, the RFC 1123 form) or an RFC 3339 date-time; else None."""
    try:
        if (match := _HTTP_DATE.fullmatch(text)) and match.group(2) in _MONTHS:
            day, month, year, hour, minute, second = match.groups()
            utc = _dt.timezone.utc
            moment = _dt.datetime(
                int(year), _MONTHS.index(month) + 1, int(day), int(hour), int(minute), int(second), 0, utc
            )
            return moment.timestamp()
        if match := _RFC3339.fullmatch(text):
            year, month, day, hour, minute, second, fraction, zone = match.groups()
            offset = _dt.timedelta(0)
            if zone not in ("Z", "z"):
                offset = _dt.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])) * (-1 if zone[0] == "-" else 1)
            zone_info = _dt.timezone(offset)
            moment = _dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), 0, zone_info)
            return moment.timestamp() + (float(fraction) if fraction else 0.0)
    except (ValueError, OverflowError):  # a 31st of February, an hour 25, an offset of a day
        return None
    return None
