"""The summarization interface (``shared/api/interface.md``), stated once.

Path, field names, modes, types, limits, the service's error texts, word counting and parameter
validation. Both the client and the local service read these facts from here. Standard library only
(and ``redact``'s masking of a credential, which a service's name applies).
"""

from __future__ import annotations

import enum
import math
import numbers
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from .redact import redact_location

__all__ = [
    "SUMMARIZE_PATH",
    "DEFAULT_BASE_URL",
    "MIN_WORDS",
    "MAX_WORDS",
    "PERCENTAGE_MIN",
    "PERCENTAGE_MAX",
    "PERCENTAGE_DEFAULT",
    "Mode",
    "SummaryType",
    "Params",
    "Messages",
    "ERROR_TYPE_INVALID_REQUEST",
    "count_words",
    "parse_params",
    "text_problem",
    "SkipReason",
    "LOCAL_SERVICE",
    "service_identity",
]

SUMMARIZE_PATH = "/api/user/summarize"
DEFAULT_BASE_URL = "https://www.summarizer.org"

# Request fields.
FIELD_TEXT = "text"
FIELD_MODE = "mode"
FIELD_PERCENTAGE = "percentage"
FIELD_TYPE = "type"
FIELD_RESULT = "result"

MIN_WORDS = 10
MAX_WORDS = 5000
PERCENTAGE_MIN = 1
PERCENTAGE_MAX = 6
PERCENTAGE_DEFAULT = 4

ERROR_TYPE_INVALID_REQUEST = "invalid_request"

LOCAL_SERVICE = "batchsum-local"  # the embedded local reference service, whatever port it is given
_DEFAULT_PORTS = {"http": 80, "https": 443}


def service_identity(base_url: str) -> str:
    """The one name of the service at ``base_url``: scheme, host (lower case), port (the scheme's
    default left out) and path (no trailing slash). User info, query and fragment are dropped, and
    the value of a path's parameter that carries a credential (``/v1;token=...``) is masked as every
    message masks it (``redact.redact_location``), so a name (the budget's, the store's, ``top``'s)
    never holds a credential and two spellings of one service are one name."""
    parts = urlsplit(base_url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:  # an IPv6 address keeps its brackets
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    return f"{scheme}://{netloc}{redact_location(parts.path.rstrip('/'))}"


class Mode(enum.IntEnum):
    """The model tier: 1 = standard (smaller, faster, cheaper), 2 = advanced (full model)."""

    STANDARD = 1
    ADVANCED = 2


class SummaryType(str, enum.Enum):
    """The output format. ``None`` (the field left out) means the default summary."""

    SUMMARY_2 = "summary_2"  # headings and points
    BULLETS = "bullets"
    BEST_LINE = "best_line"

    def __str__(self) -> str:
        return self.value


class Messages:
    """The service's error texts, as the interface lists them."""

    INVALID_KEY = "incorrect API key provided"
    NOT_PREMIUM = "you are not premium for this request"
    VALIDATION = "Validation Error"
    TOO_LONG = "Text exceeds word limit"
    TOO_SHORT = "Text must be greater then 10 words"  # sic: the interface's spelling
    RATE_LIMITED = "Too Many Requests"
    SERVER = "An unexpected error occurred"


class SkipReason(str, enum.Enum):
    """Why a text is never sent: the contract says the service would refuse it."""

    EMPTY = "empty"
    INVALID = "invalid_text"  # not valid Unicode (a lone surrogate): it cannot be encoded to send
    TOO_SHORT = "too_short"
    TOO_LONG = "too_long"

    def __str__(self) -> str:
        return self.value


class Params(NamedTuple):
    """Validated request parameters (everything but the text)."""

    mode: Mode
    percentage: int
    type: SummaryType | None

    def fields(self) -> dict[str, Any]:
        """The request fields besides ``text``; ``type`` is left out when it is the default."""
        out: dict[str, Any] = {FIELD_MODE: int(self.mode), FIELD_PERCENTAGE: self.percentage}
        if self.type is not None:
            out[FIELD_TYPE] = self.type.value
        return out


_MODE_NAMES = {"standard": Mode.STANDARD, "advanced": Mode.ADVANCED}


def count_words(text: str) -> int:
    """Words as the service is assumed to count them: runs of non-white-space."""
    return len(text.split())


def as_int(value: Any) -> int | None:
    """An integer from an int, an integral float or a decimal string; None otherwise. Never bool."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value.strip())
    return None


def parse_mode(value: Any) -> Mode:
    """``1``, ``2``, ``Mode``, ``"1"``, ``"standard"`` or ``"advanced"`` -> ``Mode``; ValueError otherwise."""
    if isinstance(value, str) and value.strip().lower() in _MODE_NAMES:
        return _MODE_NAMES[value.strip().lower()]
    number = as_int(value)
    if number in (1, 2):
        return Mode(number)
    raise ValueError(f"invalid mode {value!r}: use 1 (standard) or 2 (advanced)")


def parse_percentage(value: Any) -> int:
    """An integer 1..6 (``None`` means the default, 4); ValueError otherwise."""
    if value is None:
        return PERCENTAGE_DEFAULT
    number = as_int(value)
    if number is None or not PERCENTAGE_MIN <= number <= PERCENTAGE_MAX:
        raise ValueError(f"invalid percentage {value!r}: use a whole number from {PERCENTAGE_MIN} to {PERCENTAGE_MAX}")
    return number


def parse_type(value: Any) -> SummaryType | None:
    """``None``/``"default"`` or one of summary_2, bullets, best_line; ValueError otherwise."""
    if value is None or isinstance(value, SummaryType):
        return value
    if isinstance(value, str):
        name = value.strip().lower()
        if name in ("", "default"):
            return None
        for member in SummaryType:
            if member.value == name:
                return member
    allowed = ", ".join(m.value for m in SummaryType)
    raise ValueError(f"invalid type {value!r}: use one of {allowed}, or None for the default summary")


def parse_params(mode: Any = Mode.STANDARD, percentage: Any = PERCENTAGE_DEFAULT, type: Any = None) -> Params:
    """Validate and normalize the request parameters; raises ValueError naming the bad one."""
    return Params(parse_mode(mode), parse_percentage(percentage), parse_type(type))


def is_missing(value: Any) -> bool:
    """None, NaN, pandas' NA/NaT: a value that is not there."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    try:
        # pandas.NA and friends raise on bool(); NaT compares unequal to itself.
        return bool(value != value)
    except Exception:  # any object may define comparison as it likes: not a text either way
        return True


def text_problem(text: Any) -> tuple[SkipReason, str] | None:
    """Why the service would refuse ``text`` (reason and a sentence), or None when it may be sent.

    Exactly 10 and exactly 5000 words are sent: the interface says "at least 10" and "at most 5000".
    """
    if type(text) is not str:
        if is_missing(text):
            return SkipReason.EMPTY, "no text (missing value)"
        if not isinstance(text, str):
            return SkipReason.EMPTY, f"not a text ({type(text).__name__})"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return SkipReason.INVALID, (
                f"not valid Unicode: a lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start + 1}"
            )
    # n characters hold at most (n + 1) // 2 words: most texts cannot be too long, and need their
    # words counted only up to the minimum (exactly, when there are fewer).
    words = count_words(text) if (len(text) + 1) // 2 > MAX_WORDS else len(text.split(None, MIN_WORDS - 1))
    if words == 0:
        return SkipReason.EMPTY, "the text is empty or only white space"
    if words < MIN_WORDS:
        return SkipReason.TOO_SHORT, f"{words} word{'s' if words != 1 else ''}; the service needs at least {MIN_WORDS}"
    if words > MAX_WORDS:
        return SkipReason.TOO_LONG, f"{words} words; the service takes at most {MAX_WORDS}"
    return None
