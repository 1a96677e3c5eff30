"""The options' one table (``OPTIONS``): each option a user sets, with its name (the Python keyword,
the CLI's flag), the default of every front-end's signature, its help and its one check
(``Option.check``, the checks themselves in ``service.settings``); ``EXCEPTIONS``, the few front-ends
that take an option otherwise, and why. ``run.spec`` builds a ``RunSpec`` from it; the CLI its flags."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..service import contract
from ..service.key_plans import ENV_API_KEYS, Quota, parse_quota
from ..service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from ..service.settings import (
    DEFAULT_BUDGET_WAIT,
    DEFAULT_MAX_WAIT,
    DEFAULT_RPM,
    ENV_API_KEY,
    ENV_BASE_URL,
    ENV_BUDGET,
    ENV_RPM,
    ENV_STORE,
    LONG_TEXT_POLICIES,
    check_choice,
    check_encoding,
    check_flag,
    check_limiter,
    check_name,
    check_path,
    check_rate,
    check_retries,
    check_seconds,
    check_share,
    check_timeout,
    check_whole,
)

__all__ = [
    "Option",
    "OPTIONS",
    "OPTION_NAMES",
    "EXCEPTIONS",
    "Difference",
    "STORE_SCOPES",
    "check_option",
    "document_options",
]

STORE_SCOPES = ("service", "key")  # whose answers a store serves: every key's of the service, or the payer's


@dataclass(frozen=True)
class Option:
    """One option a user sets: its name (the Python keyword; ``--name-with-dashes`` on the CLI), the
    default of every front-end's signature, its help, and its one check: ``check(value, source,
    text=False)`` gives the value checked (a checked one as it is), or ``InvalidParameterError``
    naming ``source``; ``text``: written as text (a flag, the environment). None: checked together
    with others, where ``RunSpec.from_kwargs`` says (the request's parameters, the key and the base
    URL, the budget and the store's ``Location``)."""

    name: str
    default: Any
    help: str
    check: Callable[..., Any] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _number(value: Any, kind: Callable[[str], Any], text: bool) -> Any:
    """A number written as text (a flag, the environment) as a number; anything else as it is (its
    check says why it is not one)."""
    if text and isinstance(value, str):
        with contextlib.suppress(ValueError):
            return kind(value.strip())
    return value


def _count(value: Any, name: str, *, text: bool = False) -> int | None:
    return check_whole(name, _number(value, int, text), allow_none=not text)  # a flag is never None


def _timeout(value: Any, name: str, *, text: bool = False) -> float:
    return check_timeout(_number(value, float, text), name)


def _retries(value: Any, name: str, *, text: bool = False) -> int:
    return check_retries(_number(value, int, text), name)


def _encoding(value: Any, name: str, *, text: bool = False) -> str:
    return check_encoding(value.strip().lower() if text and isinstance(value, str) else value, name)


def _wait(value: Any, name: str, *, text: bool = False) -> float:
    return check_seconds(name, _number(value, float, text), zero=True)


def _fraction(value: Any, name: str, *, text: bool = False) -> float:
    return check_share(_number(value, float, text))  # its least at the run's rate: from_kwargs, which knows it


def _flag(value: Any, name: str, *, text: bool = False) -> bool:
    return check_flag(name, value)


def _path(value: Any, name: str, *, text: bool = False) -> str | None:
    return None if value is None else check_path(name, value)


def _text(value: Any, name: str, *, text: bool = False) -> str:
    return check_name(name, value)


def _limiter(value: Any, name: str, *, text: bool = False) -> Any:
    return check_limiter(value)


def _quota(value: Any, name: str, *, text: bool = False) -> Quota | None:
    return parse_quota(value, name)


def _choice(choices: tuple[str, ...]) -> Callable[..., str]:
    def check(value: Any, name: str, *, text: bool = False) -> str:
        return check_choice(name, value.strip().lower() if text and isinstance(value, str) else value, choices)

    return check


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
        "NAME_http_status, NAME_attempts, NAME_requests",
        check=_text,
    ),
    Option("api_key", None, f"the API key (default ${ENV_API_KEY})"),
    Option("base_url", None, f"the service's address (default ${ENV_BASE_URL}, else {contract.DEFAULT_BASE_URL})"),
    Option("local", False, "start the local reference service in this process and use it (no key needed)", check=_flag),
    Option("timeout", DEFAULT_TIMEOUT, "seconds to wait for one answer", check=_timeout),
    Option(
        "max_retries",
        DEFAULT_MAX_RETRIES,
        "retries of a transient failure (5xx, timeout, dropped connection, garbled answer); "
        "429s under the shared pause are bounded by max_wait instead",
        check=_retries,
    ),
    Option("encoding", "json", "request body encoding: json, form or multipart", check=_encoding),
    Option(
        "rpm",
        None,
        f"requests per minute your plan allows; starts are evenly spaced under it "
        f"(default ${ENV_RPM} or {DEFAULT_RPM:g}; with the local service, no limit; 0 = no pacing); "
        f"auto finds the limit (stated by the service, remembered for the key, or searched for with a few "
        f"429s the first time), auto:N finds it up to N",
        check=check_rate,
    ),
    Option(
        "concurrency",
        None,
        "a cap on requests in flight (default: sized from the pace and the measured latency, so the pace "
        "holds at any latency)",
        check=_count,
    ),
    Option(
        "limiter",
        None,
        "your own floor under the pace: anything with async acquire(), e.g. an AsyncLimiter",
        check=_limiter,
    ),
    Option(
        "budget",
        None,
        f"the key's rate budget, shared with every other run using the key: machine (every process on "
        f"this machine; the default, or ${ENV_BUDGET}), redis://HOST:PORT/DB (every machine), "
        "sqlite:///PATH, or none (this process only)",
    ),
    Option(
        "journal",
        None,
        "a SQLite file that keeps finished answers across runs, so nothing is paid for twice",
        check=_path,
    ),
    Option(
        "store",
        None,
        f"where answers are shared beyond this run's output, so that no job pays twice for a text: machine "
        f"(every run of yours on this machine, in your cache folder; the default, or ${ENV_STORE}), "
        "redis://HOST:PORT/DB (every machine; the default with a redis:// budget; ?prefix=NAME keeps a team's "
        "keys apart in a shared database), sqlite:///PATH (a store of your own), or none (the output's journal alone)",
    ),
    Option(
        "refresh",
        False,
        "ask the service again for every request this run sends, even when the store or the journal holds its "
        "answer; the new answer replaces the stored one",
        check=_flag,
    ),
    Option(
        "store_scope",
        "service",
        "whose answers the store serves: service (an answer is the service's, reused for every key; the "
        "default) or key (kept to the key that paid for it, served to that key alone)",
        check=_choice(STORE_SCOPES),
    ),
    Option("progress", True, "show a progress bar (tqdm: a widget in Jupyter, a line on a terminal)", check=_flag),
    Option(
        "long_texts",
        "skip",
        f"what a text over the service's {contract.MAX_WORDS} words gets: skip (skipped as too_long, never "
        "sent), split (summarized in parts, whose summaries are summarized again into one answer of the "
        "row's type and length), or truncate (its first words up to the limit)",
        check=_choice(LONG_TEXT_POLICIES),
    ),
    Option(
        "max_wait",
        DEFAULT_MAX_WAIT,
        "seconds a row may wait out the service's 429s (its 'later') before it fails as rate_limited; "
        "such 429s cost no attempt",
        check=_wait,
    ),
    Option(
        "budget_wait",
        DEFAULT_BUDGET_WAIT,
        "seconds a run waits for its rate budget when it cannot be reached mid-run (a Redis restarting, "
        "a budget file locked or on a full disk): nothing starts meanwhile; past this, the run stops and "
        "keeps its answers",
        check=_wait,
    ),
    Option(
        "max_requests",
        None,
        "a cap on paid requests (retries included; a 429 is not paid): once reached nothing new starts, "
        "every row still gets a record (the unsent ones failed as not_sent) and the run stops; the same "
        "run again continues where it stopped",
        check=_count,
    ),
    Option(
        "sample",
        None,
        "summarize only this many rows, spread over the input (seeded: the same rows every time), to judge "
        "quality and price; the other rows are failed as not_sent, and the answers are kept, so the full "
        "run reuses them",
        check=_count,
    ),
    Option(
        "share",
        1.0,
        "the share of the key's rate this run may use (0 < share <= 1), on every budget kind, so that "
        "other runs on the key get their starts without waiting behind this one",
        check=_fraction,
    ),
    Option(
        "report",
        None,
        "write a JSON run report here when the run ends, however it ends (schema: docs/run-report.schema.json)",
        check=_path,
    ),
    Option(
        "keys",
        None,
        f"a file of API keys, one a line: KEY [RPM|auto] [quota=N/hour|day|month] (refused if group or others may "
        f"read it); default ${ENV_API_KEYS} (keys separated by commas or spaces), else ${ENV_API_KEY}. Each key "
        "paces on its own budget under its own limit (rpm unless the line says), and the run spreads its requests "
        "over them; a key refused (401) or out of quota leaves the run, which goes on with the others",
    ),
    Option(
        "quota",
        None,
        "each key's quota of paid requests in a UTC calendar hour, day or month (N/hour, N/day, N/month; a key "
        "file's quota= wins), counted on the key's budget by every run on it; spent, the key leaves the run "
        "until the period ends, and with every key spent the run stops (the same command then continues)",
        check=_quota,
    ),
)
OPTION_NAMES = tuple(option.name for option in OPTIONS)
_BY_NAME = {option.name: option for option in OPTIONS}


def check_option(name: str, value: Any, source: str | None = None, *, text: bool = False) -> Any:
    """``value`` checked by the option ``name``'s one check in ``OPTIONS`` (``source``: where it came
    from, for its message; ``text``: written as text): every door applies it where the value enters."""
    check = _BY_NAME[name].check
    assert check is not None, f"{name} is checked with others"
    return check(value, source or name, text=text)


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
        f"the CLI reads keys from --keys FILE, ${ENV_API_KEYS} or ${ENV_API_KEY} only: a key on the command line "
        "shows in ps and shell history",
    ),
    "limiter": Difference(
        ("cli", "dask", "spark", "ray"),
        "refused",
        "an object in this process's memory: it cannot be typed on a command line (no flag) or travel to a "
        "worker (Dask, Spark and Ray refuse one, naming the budget that paces every worker instead)",
    ),
    "max_requests": Difference(
        ("spark", "ray", "duckdb"),
        "refused",
        "Spark's SQL function, Ray and DuckDB's function see rows a batch at a time, handed out as workers "
        "free up, and cannot divide a job's cap beforehand (Spark's DataFrame function divides it among the "
        "partitions, as Dask does)",
    ),
    "sample": Difference(
        ("spark", "ray", "duckdb"),
        "refused",
        "Spark's SQL function, Ray and DuckDB's function see rows a batch at a time and cannot spread a sample "
        "over the job (Spark's DataFrame function divides the sample among the partitions, as Dask does)",
    ),
    "progress": Difference(
        ("cli", "widgets"),
        "other default",
        "the CLI turns it off with --quiet; the app draws its own progress (default False)",
    ),
    "journal": Difference(
        ("cli", "dask", "spark"),
        "other default",
        "None means: the CLI keeps one beside its output (OUTPUT.journal.sqlite); elsewhere there is none, and "
        "what the answer store does not keep (a refusal) stays in this process's memory",
    ),
}


def document_options(function: Any) -> Any:
    """Append the options' help (one source: ``OPTIONS``) to a front-end's docstring."""
    lines = [f"    ``{option.name}`` (default ``{option.default!r}``): {option.help}." for option in OPTIONS]
    function.__doc__ = (function.__doc__ or "").rstrip() + "\n\n    Options:\n\n" + "\n".join(lines) + "\n"
    return function
