"""``RunSpec``: every option of a run, its default, its environment variable and its validation, once.

Every front-end (CLI, pandas, Dask, the notebook apps) turns what its user passed into one frozen
``RunSpec`` (``RunSpec.from_kwargs``; the CLI through ``RunSpec.from_args``); the layers below read
it and never re-validate. ``OPTIONS`` (``run.options_table``, re-exported here) lists the options a
user sets, with their defaults, help and checks: the CLI builds its flags from it, the Python
front-ends append its text to their docstrings, and a test checks that every front-end takes the
same options with the same defaults (``EXCEPTIONS`` names the few that differ, and why). The checks
of each value, the client's settings and the one
reading of the environment (through one mapping, ``environ=``, that tests can pass) are
``service.settings``'s, re-exported here; the API key is held as a ``Secret``, so a spec can be
pickled to Dask workers, printed and logged without showing it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..service import contract
from ..service.key_plans import ENV_API_KEYS, KeyPlan, Quota, resolve_keys
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
    check_key,
    check_params,
    check_path,
    check_rate,
    check_rpm,
    check_share,
    client_settings,
    describe_rate,
    environment,
    is_loopback,
    key_hash,
    share_at_rate,
    store_spec,
)
from .options_table import EXCEPTIONS, OPTION_NAMES, OPTIONS, Option, check_option, document_options

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
            share=share_at_rate(check("share", share), 0.0 if rate.auto else rate.rpm),  # the table's, then at the rate
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
