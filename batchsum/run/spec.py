"""``RunSpec``: every option of a run, its default, its environment variable and its validation, once.

Every front-end (CLI, pandas, Dask, the notebook apps) turns what its user passed into one frozen
``RunSpec`` (``RunSpec.from_kwargs``; the CLI through ``RunSpec.from_args``); the layers below read
it and never re-validate. ``OPTIONS`` lists the options a user sets, with their defaults and help:
the CLI builds its flags from it, the Python front-ends append its text to their docstrings, and a
test checks that every front-end takes the same options with the same defaults (``EXCEPTIONS``
names the few that differ, and why). The checks of each value, the client's settings and the one
reading of the environment (through one mapping, ``environ=``, that tests can pass) are
``service.settings``'s, re-exported here; the API key is held as a ``Secret``, so a spec can be
pickled to Dask workers, printed and logged without showing it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..service import contract
from ..service.key_plans import ENV_API_KEYS, KeyPlan, Quota, parse_quota, resolve_keys
from ..service.location import BUDGET, STORE, Location
from ..service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from ..service.settings import *  # noqa: F403  (every check and setting this module had, as the same objects)
from ..service.settings import (
    DEFAULT_BUDGET_WAIT,
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_MAX_WAIT,
    DEFAULT_RPM,
    DEFAULT_WINDOW,
    DEFAULT_WINDOW_BYTES,
    ENCODINGS,
    ENV_API_KEY,
    ENV_BASE_URL,
    ENV_BUDGET,
    ENV_RPM,
    ENV_STORE,
    LONG_TEXT_POLICIES,
    ClientSettings,
    Rate,
    Secret,
    budget_spec,
    check_choice,
    check_flag,
    check_key,
    check_limiter,
    check_name,
    check_params,
    check_path,
    check_rate,
    check_rpm,
    check_seconds,
    check_share,
    check_whole,
    client_settings,
    describe_rate,
    environment,
    is_loopback,
    key_hash,
    store_spec,
)

STORE_SCOPES = ("service", "key")  # whose answers a store serves: every key's of the service, or the payer's

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
    "ENV_STORE",
    "ENV_API_KEYS",
    "KeyPlan",
    "Quota",
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
    "Location",
]


@dataclass(frozen=True)
class Option:
    """One option a user sets: its name (the Python keyword; ``--name-with-dashes`` on the CLI), the
    default of every front-end's signature, its help, and its one check: ``check(value, source,
    text=False)`` gives the value checked (a checked one as it is), or ``InvalidParameterError``
    naming ``source``; ``text``: written as text (a flag, the environment). None: checked together
    with others, where ``RunSpec.from_kwargs`` says (the request's parameters, the client's settings
    and keys, the budget and the store's ``Location``)."""

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


def _wait(value: Any, name: str, *, text: bool = False) -> float:
    return check_seconds(name, _number(value, float, text), zero=True)


def _fraction(value: Any, name: str, *, text: bool = False) -> float:
    return check_share(_number(value, float, text))  # its least at the run's rate too in from_kwargs, which knows it


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


@dataclass(frozen=True)
class RunSpec:
    """One run, resolved and validated: what to ask (``params``), where (``client``), and how to run.
    Build it with ``RunSpec.from_kwargs(...)`` (or ``from_args`` from the CLI's namespace); it is
    plain data, picklable (``limiter`` and a ``Budget`` object excepted: they live in one process),
    and its repr shows no secret (``describe``: the key never, locations without credentials)."""

    params: contract.Params
    client: ClientSettings
    rpm: float = DEFAULT_RPM  # under ``auto``, the cap
    auto: bool = False  # rpm="auto" / "auto:N": the limit is found, stated or remembered (pacing.auto.limit)
    concurrency: int | None = None
    limiter: Any = None
    budget: Any = Location.machine(BUDGET)  # a Location, or a budget.Budget object (in-process only)
    journal: str | None = None
    store: Location = Location.machine(STORE)  # the answer store (store_spec)
    refresh: bool = False
    store_scope: str = "service"
    progress: bool = True
    output_column: str = "summary"
    max_wait: float = DEFAULT_MAX_WAIT
    budget_wait: float = DEFAULT_BUDGET_WAIT
    long_texts: str = "skip"
    window: int = DEFAULT_WINDOW
    window_bytes: int = DEFAULT_WINDOW_BYTES
    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    max_requests: int | None = None
    sample: int | None = None
    share: float = 1.0
    report: str | None = None
    keys: tuple[KeyPlan, ...] = ()  # every key (the first is ``client.api_key``); none with the local service
    quota: Quota | None = None  # each key's quota, unless its line in the key file says otherwise
    # Which run a share belongs to: None, a fresh one per Run; prepare_shared names one for all the
    # partitions of a Dask or Spark job, so that together they use at most their share.
    run_id: str | None = None
    # When the job started (``time.time()``): under refresh, answers written before it are asked again
    # and those written since are used. None: each run's own start; prepare_shared sets the job's.
    started: float | None = None
    door: str = "python"  # the front-end that made it (not an option: each door sets it; ``batchsum top`` shows it)

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
        store: str | None = None,
        refresh: bool = False,
        store_scope: str = "service",
        progress: bool = True,
        long_texts: str = "skip",
        max_wait: float = DEFAULT_MAX_WAIT,
        budget_wait: float = DEFAULT_BUDGET_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
        keys: str | os.PathLike[str] | None = None,
        quota: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> RunSpec:
        """Every option as the Python front-ends take it; ``environ`` replaces ``os.environ``.
        Raises ``InvalidParameterError``, ``ConfigurationError`` or ``BudgetError`` naming the option."""
        env = environment(environ)
        params = check_params(mode, percentage, type)
        plans = () if local is True else resolve_keys(api_key, None if keys is None else check_path("keys", keys), env)
        client = client_settings(
            plans[0].key if plans else api_key,
            base_url,
            local=local,
            timeout=timeout,
            max_retries=max_retries,
            encoding=encoding,
            environ=env,
        )
        rate = _rate(rpm, env, local)
        place = budget_spec(budget, env)
        check = check_option
        return cls(
            params=params,
            client=client,
            rpm=rate.rpm,
            auto=rate.auto,
            concurrency=check("concurrency", concurrency),
            limiter=check("limiter", limiter),
            budget=place,
            journal=check("journal", journal),
            store=store_spec(store, place, env),
            refresh=check("refresh", refresh),
            store_scope=check("store_scope", store_scope),
            progress=check("progress", progress),
            output_column=check("output_column", output_column),
            max_wait=check("max_wait", max_wait),
            budget_wait=check("budget_wait", budget_wait),
            long_texts=check("long_texts", long_texts),
            max_requests=check("max_requests", max_requests),
            sample=check("sample", sample),
            share=check_share(share, 0.0 if rate.auto else rate.rpm),  # the table's, and its least at the rate
            report=check("report", report),
            keys=plans,
            quota=check("quota", quota),
        )

    @classmethod
    def from_args(cls, args: Any, environ: Mapping[str, str] | None = None, *, key_required: bool = True) -> RunSpec:
        """From the CLI's argparse namespace (flags built from ``OPTIONS``; the key from the environment).
        ``key_required=False`` (``--dry-run``): without a key, a spec whose client cannot be opened."""
        values = {name: getattr(args, name) for name in OPTION_NAMES if hasattr(args, name)}
        values["progress"] = not getattr(args, "quiet", False)
        values.pop("api_key", None)
        env = environment(environ)
        if key_required or values.get("local") or values.get("keys") or _any_key(env):
            return cls.from_kwargs(**values, environ=env)
        spec = cls.from_kwargs(**values, api_key="-", environ=env)
        return spec.replace(client=dataclasses.replace(spec.client, api_key=None), keys=())

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
        return describe_spec(self)

    def __repr__(self) -> str:
        """The options as ``describe`` gives them: no secret (the key, a password in a redis://
        budget or store, credentials in the base URL) in a repr, a log line or a traceback."""
        return "RunSpec(" + ", ".join(f"{name}={value!r}" for name, value in self.describe().items()) + ")"


def describe_spec(spec: RunSpec) -> dict[str, Any]:
    """``RunSpec.describe``: the options as plain data, the key never (its hash and source), locations redacted."""
    return {
        "mode": int(spec.params.mode),
        "percentage": spec.params.percentage,
        "type": spec.params.type.value if spec.params.type is not None else None,
        "output_column": spec.output_column,
        **spec.client.describe(),  # base_url (redacted), local, timeout, max_retries, encoding
        "rpm": describe_rate(spec.rpm, spec.auto),
        "concurrency": spec.concurrency,
        "budget": spec.budget.shown if isinstance(spec.budget, Location) else repr(spec.budget),
        "journal": spec.journal,
        "store": spec.store.shown,
        "refresh": spec.refresh,
        "store_scope": spec.store_scope,
        "max_wait": spec.max_wait,
        "budget_wait": spec.budget_wait,
        "long_texts": spec.long_texts,
        "max_requests": spec.max_requests,
        "sample": spec.sample,
        "share": spec.share,
        "report": spec.report,
        "keys": [
            {"hash": plan.hash, "source": plan.source, "rpm": plan.rate, "quota": plan.quota and str(plan.quota)}
            for plan in spec.keys
        ],
        "quota": None if spec.quota is None else str(spec.quota),
    }


def _rate(rpm: Any, env: Mapping[str, str], local: bool) -> Rate:
    """The run's rate: ``rpm`` checked, or for None ``$BATCHSUM_RPM`` (checked as the option, named as
    itself), else ``DEFAULT_RPM``; with the local service, no pacing unless ``rpm`` is a number."""
    if rpm is None:
        raw = env.get(ENV_RPM, "").strip()
        if local or not raw:
            return Rate(0.0 if local else DEFAULT_RPM, False)
        rate: Rate = check_option("rpm", raw, f"${ENV_RPM}", text=True)
    else:
        rate = check_option("rpm", rpm)
    return Rate(0.0, False) if local and rate.auto else rate  # the local service has no limit to find


def _any_key(env: Mapping[str, str]) -> bool:
    return bool(env.get(ENV_API_KEY, "").strip() or env.get(ENV_API_KEYS, "").strip())
