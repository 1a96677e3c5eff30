"""``RunSpec``: every option of a run, its default, its environment variable and its validation, once.

Every front-end (CLI, pandas, Dask, the notebook apps) turns what its user passed into one frozen
``RunSpec`` (``RunSpec.from_kwargs``; the CLI through ``RunSpec.from_args``); the layers below read
it and never re-validate. ``OPTIONS`` lists the options a user sets, with their defaults and help:
the CLI builds its flags from it, the Python front-ends append its text to their docstrings, and a
test checks that every front-end takes the same options with the same defaults (``EXCEPTIONS``
names the few that differ, and why). The environment is read here and only here (through one
mapping, ``environ=``, that tests can pass); the API key is held as a ``Secret``, so a spec can be
pickled to Dask workers, printed and logged without showing it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..service import contract
from ..service.errors import BudgetError, ConfigurationError, InvalidParameterError, redact_location
from ..service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT

__all__ = [
    "RunSpec",
    "ClientSettings",
    "Secret",
    "Option",
    "key_hash",
    "OPTIONS",
    "EXCEPTIONS",
    "ENV_API_KEY",
    "ENV_BASE_URL",
    "ENV_RPM",
    "ENV_BUDGET",
    "DEFAULT_RPM",
    "ENCODINGS",
    "LONG_TEXT_POLICIES",
    "check_key",
    "check_rpm",
    "check_rate",
    "check_share",
    "is_loopback",
    "client_settings",
    "document_options",
    "budget_spec",
]

ENV_API_KEY = "BATCHSUM_API_KEY"
ENV_BASE_URL = "BATCHSUM_BASE_URL"
ENV_RPM = "BATCHSUM_RPM"
ENV_BUDGET = "BATCHSUM_BUDGET"
DEFAULT_RPM = 60.0
DEFAULT_BUDGET = "machine"
DEFAULT_MAX_WAIT = 1800.0  # seconds a row may wait out 429s before it fails as rate_limited
ENCODINGS = ("json", "form", "multipart")
LONG_TEXT_POLICIES = ("skip", "split", "truncate")
DEFAULT_WINDOW = 1024  # rows held between reading and yielding ...
DEFAULT_WINDOW_BYTES = 16 << 20  # ... and their input's bytes (the rows behind a slow one wait, not the reading)
DEFAULT_DRAIN_SECONDS = 15.0  # how long a stop waits for answers on the wire


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
    key = (os.environ if environ is None else environ).get(ENV_API_KEY, "").strip()
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
            f"no API key: set {ENV_API_KEY} (the key is on the 'My Account' page of the service), "
            "or use the local service (local=True, --local)"
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
    """``url`` without a trailing slash, when it is http(s) with a host and the key may go there."""
    url = url.strip().rstrip("/")
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        host = None
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        raise ConfigurationError(f"invalid base URL {url!r}: use https://host[:port]")
    if parts.scheme == "http" and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to send the API key over plain http to {host}: "
            "use https, or http only to a loopback address (127.0.0.1, localhost)"
        )
    return url


AUTO = "auto"
AUTO_MAX_RPM = 1_000_000.0  # the cap of a plain "auto": what no plan is (the header parser's bound too)


def check_rate(rpm: object, name: str = "rpm", *, text: bool = False) -> tuple[float, bool]:
    """``rpm`` as (requests a minute, auto): a number >= 0, or ``"auto"`` / ``"auto:N"`` (find the
    limit, at most N a minute). ``text``: a number may come as text (the command line, the
    environment); from Python it must be a number. ``InvalidParameterError`` naming ``name`` for
    anything else."""
    if isinstance(rpm, str):
        spelled = rpm.strip().lower()
        if spelled == AUTO:
            return AUTO_MAX_RPM, True
        if spelled.startswith(AUTO + ":"):
            try:
                cap = float(spelled[len(AUTO) + 1 :])
            except ValueError:
                cap = math.nan
            if not 1 <= cap <= AUTO_MAX_RPM:
                raise InvalidParameterError(
                    f"invalid {name} {rpm!r}: use auto:N with N from 1 to {AUTO_MAX_RPM:,.0f} requests a minute"
                )
            return cap, True
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
        return check_rpm(number, name), False
    return check_rpm(rpm, name), False


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
    per_hour = rpm * value * 60
    if rpm and per_hour < MIN_SHARE_PER_HOUR:
        least = MIN_SHARE_PER_HOUR / (rpm * 60)
        raise InvalidParameterError(
            f"invalid share {value!r}: at rpm {rpm:g} it leaves {per_hour:.3g} requests an hour; "
            f"use a share of at least {least:.3g} (one request an hour)"
        )
    return float(value)


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


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InvalidParameterError(f"invalid {name} {value!r}: use one of {', '.join(map(repr, choices))}")
    return str(value)


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
    env = os.environ if environ is None else environ
    if encoding not in ENCODINGS:
        raise InvalidParameterError(f"invalid encoding {encoding!r}: use one of {', '.join(ENCODINGS)}")
    check_whole("max_retries", max_retries, minimum=0)
    seconds = check_seconds("timeout", timeout)
    if not isinstance(local, bool):
        raise InvalidParameterError(f"invalid local {local!r}: use True or False")
    if local:  # the run starts the service and fills in its address and key
        return ClientSettings(None, "", True, seconds, max_retries, encoding)
    source = "api_key" if api_key is not None else f"${ENV_API_KEY}"
    key = check_key(api_key if api_key is not None else env.get(ENV_API_KEY, ""), source)
    if base_url is not None and not isinstance(base_url, str):
        raise ConfigurationError(f"invalid base URL {base_url!r}: use https://host[:port]")
    url = check_base_url(base_url or env.get(ENV_BASE_URL) or contract.DEFAULT_BASE_URL)
    return ClientSettings(Secret(key), url, False, seconds, max_retries, encoding)


@dataclass(frozen=True)
class Option:
    """One option a user sets: its name (the Python keyword; ``--name-with-dashes`` on the CLI), the
    default of every front-end's signature, and its help."""

    name: str
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


_TYPES = ", ".join(t.value for t in contract.SummaryType)

OPTIONS: tuple[Option, ...] = (
    Option("mode", 1, "1 = standard (the smaller, faster model), 2 = advanced (the full model; premium plans)"),
    Option(
        "percentage",
        contract.PERCENTAGE_DEFAULT,
        f"summary length, {contract.PERCENTAGE_MIN} (shortest) to {contract.PERCENTAGE_MAX} (longest)",
    ),
    Option("type", None, f"output format: default (a plain summary), {_TYPES} (any case)"),
    Option(
        "output_column",
        "summary",
        "name of the summary column; the others are NAME_status, NAME_error, NAME_message, "
        "NAME_http_status, NAME_attempts",
    ),
    Option("api_key", None, f"the API key (default ${ENV_API_KEY})"),
    Option("base_url", None, f"the service's address (default ${ENV_BASE_URL}, else {contract.DEFAULT_BASE_URL})"),
    Option("local", False, "start the local reference service in this process and use it (no key needed)"),
    Option("timeout", DEFAULT_TIMEOUT, "seconds to wait for one answer"),
    Option(
        "max_retries",
        DEFAULT_MAX_RETRIES,
        "retries of a transient failure (5xx, timeout, dropped connection, garbled answer); "
        "429s under the shared pause are bounded by max_wait instead",
    ),
    Option("encoding", "json", "request body encoding: json, form or multipart"),
    Option(
        "rpm",
        None,
        f"requests per minute your plan allows; starts are evenly spaced under it "
        f"(default ${ENV_RPM} or {DEFAULT_RPM:g}; with the local service, no limit; 0 = no pacing); "
        f"auto finds the limit (stated by the service, remembered for the key, or searched for with a few "
        f"429s the first time), auto:N finds it up to N",
    ),
    Option(
        "concurrency",
        None,
        "a cap on requests in flight (default: sized from the pace and the measured latency, so the pace "
        "holds at any latency)",
    ),
    Option("limiter", None, "your own floor under the pace: anything with async acquire(), e.g. an AsyncLimiter"),
    Option(
        "budget",
        None,
        f"the key's rate budget, shared with every other run using the key: machine (every process on "
        f"this machine; the default, or ${ENV_BUDGET}), redis://HOST:PORT/DB (every machine), "
        "sqlite:///PATH, or none (this process only)",
    ),
    Option("journal", None, "a SQLite file that keeps finished answers across runs, so nothing is paid for twice"),
    Option("progress", True, "show a progress bar (tqdm: a widget in Jupyter, a line on a terminal)"),
    Option(
        "long_texts",
        "skip",
        f"what a text over the service's {contract.MAX_WORDS} words gets: skip (skipped as too_long, never "
        "sent), split (summarized in parts, whose summaries are summarized again into one answer of the "
        "row's type and length), or truncate (its first words up to the limit)",
    ),
    Option(
        "max_wait",
        DEFAULT_MAX_WAIT,
        "seconds a row may wait out the service's 429s (its 'later') before it fails as rate_limited; "
        "such 429s cost no attempt",
    ),
    Option(
        "max_requests",
        None,
        "a cap on paid requests (retries included; a 429 is not paid): once reached nothing new starts, "
        "every row still gets a record (the unsent ones failed as not_sent) and the run stops; the same "
        "run again continues where it stopped",
    ),
    Option(
        "sample",
        None,
        "summarize only this many rows, spread over the input (seeded: the same rows every time), to judge "
        "quality and price; the other rows are failed as not_sent, and the answers are kept, so the full "
        "run reuses them",
    ),
    Option(
        "share",
        1.0,
        "the share of the key's rate this run may use (0 < share <= 1), on every budget kind, so that "
        "other runs on the key get their starts without waiting behind this one",
    ),
    Option(
        "report",
        None,
        "write a JSON run report here when the run ends, however it ends (schema: docs/run-report.schema.json)",
    ),
)
OPTION_NAMES = tuple(option.name for option in OPTIONS)


@dataclass(frozen=True)
class Difference:
    """A front-end that takes an option differently from the rest, and why."""

    front_ends: tuple[str, ...]
    how: str
    why: str


# The few true differences between front-ends, declared once (the parity test reads them here).
EXCEPTIONS: dict[str, Difference] = {
    "api_key": Difference(
        ("cli",),
        "absent",
        f"the CLI reads the key from ${ENV_API_KEY} only: a key on the command line shows in ps and shell history",
    ),
    "limiter": Difference(
        ("cli", "dask", "spark", "ray"),
        "refused",
        "an object in this process's memory: it cannot be typed on a command line (no flag) or travel to a "
        "worker (Dask, Spark and Ray refuse one, naming the budget that paces every worker instead)",
    ),
    "max_requests": Difference(
        ("spark", "ray"),
        "refused",
        "Spark's SQL function and Ray see rows a batch at a time, handed out as workers free up, and cannot "
        "divide a job's cap beforehand (Spark's DataFrame function divides it among the partitions, as Dask does)",
    ),
    "sample": Difference(
        ("spark", "ray"),
        "refused",
        "Spark's SQL function and Ray see rows a batch at a time and cannot spread a sample over the job "
        "(Spark's DataFrame function divides the sample among the partitions, as Dask does)",
    ),
    "progress": Difference(
        ("cli", "widgets"),
        "other default",
        "the CLI turns it off with --quiet; the app draws its own progress (default False)",
    ),
    "journal": Difference(
        ("cli", "dask", "spark"),
        "other default",
        "None means: the CLI keeps one beside its output (OUTPUT.journal.sqlite); Dask and Spark share "
        "answers through the budget's store; elsewhere answers are kept in this process unless a journal is named",
    ),
}


def document_options(function: Any) -> Any:
    """Append the options' help (one source: ``OPTIONS``) to a front-end's docstring."""
    lines = [f"    ``{option.name}`` (default ``{option.default!r}``): {option.help}." for option in OPTIONS]
    function.__doc__ = (function.__doc__ or "").rstrip() + "\n\n    Options:\n\n" + "\n".join(lines) + "\n"
    return function


@dataclass(frozen=True)
class RunSpec:
    """One run, resolved and validated: what to ask (``params``), where (``client``), and how to run.

    Build it with ``RunSpec.from_kwargs(...)`` (or ``from_args`` from the CLI's namespace); it is
    plain data, picklable (``limiter`` and a ``Budget`` object excepted: they live in one process),
    and its repr never shows the key.
    """

    params: contract.Params
    client: ClientSettings
    rpm: float = DEFAULT_RPM  # under ``auto``, the cap
    auto: bool = False  # rpm="auto" / "auto:N": the limit is found, stated or remembered (pacing.limit)
    concurrency: int | None = None
    limiter: Any = None
    budget: Any = DEFAULT_BUDGET  # a spec string, or a budget.Budget object (in-process only)
    journal: str | None = None
    progress: bool = True
    output_column: str = "summary"
    max_wait: float = DEFAULT_MAX_WAIT
    long_texts: str = "skip"
    window: int = DEFAULT_WINDOW
    window_bytes: int = DEFAULT_WINDOW_BYTES
    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    max_requests: int | None = None
    sample: int | None = None
    share: float = 1.0
    report: str | None = None
    # Which run a share belongs to: None, a fresh one per Run; prepare_shared names one for all the
    # partitions of a Dask or Spark job, so that together they use at most their share.
    run_id: str | None = None

    @classmethod
    def from_kwargs(
        cls,
        mode: Any = 1,
        percentage: Any = contract.PERCENTAGE_DEFAULT,
        type: Any = None,
        *,
        output_column: str = "summary",
        api_key: str | Secret | None = None,
        base_url: str | None = None,
        local: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        encoding: str = "json",
        rpm: float | str | None = None,
        concurrency: int | None = None,
        limiter: Any = None,
        budget: Any = None,
        journal: str | os.PathLike[str] | None = None,
        progress: bool = True,
        long_texts: str = "skip",
        max_wait: float = DEFAULT_MAX_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> RunSpec:
        """Every option as the Python front-ends take it; ``environ`` replaces ``os.environ``.
        Raises ``InvalidParameterError``, ``ConfigurationError`` or ``BudgetError`` naming the option."""
        env = os.environ if environ is None else environ
        params = check_params(mode, percentage, type)
        client = client_settings(
            api_key,
            base_url,
            local=local,
            timeout=timeout,
            max_retries=max_retries,
            encoding=encoding,
            environ=env,
        )
        if rpm is None:
            rpm = 0.0 if local else _rpm_from(env)
        rate, auto = check_rate(rpm)
        if local and auto:  # the local service has no limit to find: no pacing, as with no rpm
            rate, auto = 0.0, False
        if limiter is not None and not callable(getattr(limiter, "acquire", None)):
            raise InvalidParameterError("invalid limiter: it needs an async acquire() method, as AsyncLimiter has")
        if not isinstance(output_column, str) or not output_column:
            raise InvalidParameterError(f"invalid output_column {output_column!r}: use a non-empty name")
        if not isinstance(progress, bool):
            raise InvalidParameterError(f"invalid progress {progress!r}: use True or False")
        return cls(
            params=params,
            client=client,
            rpm=rate,
            auto=auto,
            concurrency=check_whole("concurrency", concurrency, allow_none=True),
            limiter=limiter,
            budget=budget_spec(budget, env),
            journal=None if journal is None else _path("journal", journal),
            progress=progress,
            output_column=output_column,
            max_wait=check_seconds("max_wait", max_wait, zero=True),
            long_texts=check_choice("long_texts", long_texts, LONG_TEXT_POLICIES),
            max_requests=check_whole("max_requests", max_requests, allow_none=True),
            sample=check_whole("sample", sample, allow_none=True),
            share=check_share(share, 0.0 if auto else rate),
            report=None if report is None else _path("report", report),
        )

    @classmethod
    def from_args(cls, args: Any, environ: Mapping[str, str] | None = None, *, key_required: bool = True) -> RunSpec:
        """From the CLI's argparse namespace (flags built from ``OPTIONS``; the key from the environment).
        ``key_required=False`` (``--dry-run``): without a key, a spec whose client cannot be opened."""
        values = {name: getattr(args, name) for name in OPTION_NAMES if hasattr(args, name)}
        values["progress"] = not getattr(args, "quiet", False)
        values.pop("api_key", None)
        env = os.environ if environ is None else environ
        if key_required or values.get("local") or env.get(ENV_API_KEY, "").strip():
            return cls.from_kwargs(**values, environ=env)
        spec = cls.from_kwargs(**values, api_key="-", environ=env)
        return spec.replace(client=dataclasses.replace(spec.client, api_key=None))

    @classmethod
    def from_options(cls, values: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> RunSpec:
        """From a front-end's keyword arguments (``locals()`` of its signature): the option names only."""
        return cls.from_kwargs(**{name: values[name] for name in OPTION_NAMES if name in values}, environ=environ)

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)

    def portion(self, parts: int, number: int) -> RunSpec:
        """Part ``number`` of ``parts`` of a job (a Dask partition, a Spark task): its share of the
        request cap and the sample, so that the parts add up to the job's and never go past it."""

        def share(total: int | None) -> int | None:
            return None if total is None else total // parts + (1 if number < total % parts else 0)

        return self.replace(max_requests=share(self.max_requests), sample=share(self.sample))

    def describe(self) -> dict[str, Any]:
        """The options as plain data, for a report or a log line: the key never, locations redacted."""
        return {
            "mode": int(self.params.mode),
            "percentage": self.params.percentage,
            "type": self.params.type.value if self.params.type is not None else None,
            "output_column": self.output_column,
            "base_url": redact_location(self.client.base_url),
            "local": self.client.local,
            "timeout": self.client.timeout,
            "max_retries": self.client.max_retries,
            "encoding": self.client.encoding,
            "rpm": describe_rate(self.rpm, self.auto),
            "concurrency": self.concurrency,
            "budget": redact_location(self.budget) if isinstance(self.budget, str) else repr(self.budget),
            "journal": self.journal,
            "max_wait": self.max_wait,
            "long_texts": self.long_texts,
            "max_requests": self.max_requests,
            "sample": self.sample,
            "share": self.share,
            "report": self.report,
        }


def _rpm_from(env: Mapping[str, str]) -> float | str:
    raw = env.get(ENV_RPM, "").strip()
    if not raw:
        return DEFAULT_RPM
    rate, auto = check_rate(raw, f"${ENV_RPM}", text=True)
    return raw if auto else rate


def budget_spec(budget: Any, environ: Mapping[str, str] | None = None) -> Any:
    """``budget`` as given, or for None ``$BATCHSUM_BUDGET``, else ``"machine"``."""
    if budget is None:
        env = os.environ if environ is None else environ
        return env.get(ENV_BUDGET, "").strip() or DEFAULT_BUDGET
    if isinstance(budget, str) or callable(getattr(budget, "reserve", None)):
        return budget
    raise BudgetError(f"invalid budget {budget!r}: use 'machine', 'none', 'redis://HOST:PORT/DB' or a Budget")


def _path(name: str, value: Any) -> str:
    try:
        path: str = os.fspath(value)
        return path
    except TypeError:
        raise InvalidParameterError(f"invalid {name} {value!r}: use a file path") from None
