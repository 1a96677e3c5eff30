"""The run layer: one ``RunSpec`` for every front-end (same options, same defaults, one validation),
the key a secret wherever a spec goes, and the command line light. (The house's imports: test_architecture.py.)"""

from __future__ import annotations

import ast
import inspect
import logging
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import batchsum
import batchsum.dask  # noqa: F401  (registers ddf.batchsum)
import batchsum.duckdb
import batchsum.ray
import batchsum.spark
from batchsum import RunSpec
from batchsum.cli import build_parser
from batchsum.dask import DaskDataFrameAccessor, DaskSeriesAccessor
from batchsum.errors import ConfigurationError, InvalidParameterError
from batchsum.options import EXCEPTIONS, OPTIONS, Secret
from batchsum.pandas_ext import DataFrameAccessor, SeriesAccessor
from batchsum.polars import DataFrameNamespace, SeriesNamespace
from batchsum.widgets import FrameApp
from tests.support import KEY, article

PACKAGE = Path(batchsum.__file__).resolve().parent
SPEC_OPTIONS = {
    name: parameter.default
    for name, parameter in inspect.signature(RunSpec.from_kwargs).parameters.items()
    if name != "environ"
}

FRONT_ENDS = {
    "pandas": [
        DataFrameAccessor.summarize,
        DataFrameAccessor.asummarize,
        SeriesAccessor.summarize,
        SeriesAccessor.asummarize,
        batchsum.summarize_texts,
    ],
    "dask": [DaskDataFrameAccessor.summarize, DaskSeriesAccessor.summarize],
    "widgets": [FrameApp.__init__],
    "spark": [batchsum.spark.summarize, batchsum.spark.register],
    "ray": [batchsum.ray.summarize],
    "duckdb": [batchsum.duckdb.register],
    "polars": [
        DataFrameNamespace.summarize,
        DataFrameNamespace.asummarize,
        SeriesNamespace.summarize,
        SeriesNamespace.asummarize,
    ],
}


def test_the_options_table_and_the_spec_name_the_same_options_with_the_same_defaults():
    assert [option.name for option in OPTIONS] == list(SPEC_OPTIONS)
    assert {option.name: option.default for option in OPTIONS} == SPEC_OPTIONS


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_every_python_front_end_takes_the_spec_options_by_name_with_its_defaults(front_end):
    for function in FRONT_ENDS[front_end]:
        parameters = inspect.signature(function).parameters
        assert not any(p.kind is p.VAR_KEYWORD for p in parameters.values()), f"{function.__qualname__} takes **"
        for name, default in SPEC_OPTIONS.items():
            exception = EXCEPTIONS.get(name)
            if exception is not None and front_end in exception.front_ends and exception.how == "absent":
                assert name not in parameters, f"{function.__qualname__} takes {name}, declared absent"
                continue
            assert name in parameters, f"{function.__qualname__} lacks option {name}"
            if exception is None or front_end not in exception.front_ends:
                assert parameters[name].default == default, f"{function.__qualname__}: {name} default"
            if exception is not None and front_end in exception.front_ends and exception.how == "refused":
                assert parameters[name].default == default  # taken, with the default, and refused when set
        # Every option documented in the same words (one source: OPTIONS).
        for option in OPTIONS:
            if option.name in parameters:
                assert option.help in (function.__doc__ or ""), f"{function.__qualname__} lacks help of {option.name}"


def test_the_cli_flags_are_the_spec_options_with_its_defaults():
    parser = build_parser()
    summarize = next(
        action for action in parser._subparsers._group_actions[0].choices.values() if action.prog.endswith("summarize")
    )
    dests = {action.dest: action for action in summarize._actions}
    for name, default in SPEC_OPTIONS.items():
        exception = EXCEPTIONS.get(name)
        if exception is not None and "cli" in exception.front_ends and exception.how in ("absent", "refused"):
            assert name not in dests  # no flag for it
            continue
        if name == "progress":
            assert "quiet" in dests and dests["quiet"].default is False  # progress on unless --quiet
            continue
        assert name in dests, f"no --{name.replace('_', '-')}"
        assert dests[name].option_strings == ["--" + name.replace("_", "-")]
        assert summarize.get_default(name) == default, name


def test_summarize_stream_takes_every_run_option_that_paces_or_pays_or_says_where_it_is_set():
    """The engine's entry (a client and a store given made) takes each option of ``OPTIONS`` as a
    keyword (the request's, ``RunOptions``' fields, ``share``, ``quota``, the ``store`` object), or
    names where it is set instead (``SET_ELSEWHERE``), never both, never neither."""
    import dataclasses

    from batchsum.engine.options import SET_ELSEWHERE, RunOptions

    taken = {field.name for field in dataclasses.fields(RunOptions)} | {"mode", "percentage", "type"}
    taken |= {"share", "quota", "store"}
    for option in OPTIONS:
        assert (option.name in taken) != (option.name in SET_ELSEWHERE), option.name
    assert set(SET_ELSEWHERE) <= {option.name for option in OPTIONS}
    paced_or_paid = ("rpm", "concurrency", "limiter", "budget", "budget_wait", "max_wait", "long_texts")
    assert set(paced_or_paid + ("max_requests", "share", "quota")) <= taken


def test_dask_refuses_a_limiter_with_what_paces_its_workers_instead(svc):
    import dask.dataframe as dd
    import pandas as pd
    from aiolimiter import AsyncLimiter

    frame = dd.from_pandas(pd.DataFrame({"text": [article(20)]}), npartitions=1)
    with pytest.raises(InvalidParameterError, match="cannot travel to the workers"):
        frame.batchsum.summarize("text", api_key=KEY, base_url=svc.url, limiter=AsyncLimiter(1, 1))
    assert svc.stats()["requests"] == 0


def test_exceptions_say_why_and_name_known_front_ends():
    for name, exception in EXCEPTIONS.items():
        assert name in SPEC_OPTIONS and exception.why and exception.how in ("absent", "refused", "other default")
        assert set(exception.front_ends) <= set(FRONT_ENDS) | {"cli"}


@pytest.mark.parametrize(
    "options, words",
    [
        ({"rpm": -1}, "invalid rpm -1"),
        ({"rpm": float("nan")}, "invalid rpm"),
        ({"concurrency": 0}, "invalid concurrency 0"),
        ({"timeout": 0}, "invalid timeout 0"),
        ({"max_retries": -1}, "invalid max_retries -1"),
        ({"encoding": "xml"}, "invalid encoding 'xml'"),
        ({"max_wait": -5}, "invalid max_wait -5"),
        ({"percentage": 9}, "invalid percentage 9"),
        ({"mode": 3}, "invalid mode 3"),
        ({"progress": "yes"}, "invalid progress 'yes'"),
    ],
)
def test_a_bad_option_is_one_error_naming_it_whichever_front_end_it_came_from(frame_and_env, options, words):
    frame, env = frame_and_env
    with pytest.raises(InvalidParameterError, match=words.replace("(", r"\(")):
        RunSpec.from_kwargs(**options, api_key=KEY, environ=env)
    with pytest.raises(InvalidParameterError, match=words.replace("(", r"\(")):
        frame.batchsum.summarize("text", **options, api_key=KEY, base_url="http://127.0.0.1:9")


@pytest.fixture
def frame_and_env():
    import pandas as pd

    return pd.DataFrame({"text": [article(20)]}), {}


def test_the_environment_is_read_through_one_mapping():
    env = {"BATCHSUM_API_KEY": KEY, "BATCHSUM_RPM": "120", "BATCHSUM_BUDGET": "none"}
    spec = RunSpec.from_kwargs(environ=env)
    assert spec.rpm == 120 and spec.budget.text == "none" and spec.client.api_key == Secret(KEY)
    assert RunSpec.from_kwargs(local=True, environ=env).rpm == 0  # the local service has no plan
    with pytest.raises(InvalidParameterError, match=r"invalid \$BATCHSUM_RPM 'fast'"):
        RunSpec.from_kwargs(environ={**env, "BATCHSUM_RPM": "fast"})
    with pytest.raises(ConfigurationError, match="no API key"):
        RunSpec.from_kwargs(environ={})


def _reads_environment(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                return True
    return False


@pytest.mark.slow
def test_the_environment_is_read_in_at_most_two_modules():
    readers = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py") if _reads_environment(path)}
    # _imports.py names pyarrow's memory pool for the CLI's own process (no batchsum setting).
    assert readers <= {"service/settings.py", "data/locations.py", "_imports.py"}, readers


def test_the_app_takes_its_rate_from_the_environment(monkeypatch):
    import pandas as pd

    monkeypatch.setenv("BATCHSUM_RPM", "240")
    app = FrameApp(pd.DataFrame({"text": [article(20)]}), api_key=KEY, base_url="http://127.0.0.1:9")
    assert app.rpm.value == "240"  # a text field: a number, auto or auto:N


def test_a_spec_with_a_key_never_shows_it():
    spec = RunSpec.from_kwargs(api_key=KEY, base_url="http://127.0.0.1:9", budget="none")
    shown = [repr(spec), str(spec), f"{spec}", repr(spec.client), str(spec.describe()), repr(spec.client.api_key)]
    assert not any(KEY in text or KEY[:10] in text for text in shown)
    assert spec.client.client_kwargs()["api_key"] == KEY


def test_a_spec_shows_no_password_of_its_budget_store_or_base_url():
    budget = "redis://:s3cret-budget-pw@127.0.0.1:6379/0"
    specs = [
        RunSpec.from_kwargs(api_key=KEY, base_url="https://api.example.com/v1;token=base-url-pw", budget=budget),
        RunSpec.from_kwargs(api_key=KEY, store="redis://reader:s3cret-store-pw@10.0.0.5:6379/1"),
    ]
    for spec in specs:
        shown = " ".join([repr(spec), str(spec), f"{spec}", repr(spec.client), str(spec.describe())])
        assert not any(secret in shown for secret in ("s3cret-budget-pw", "s3cret-store-pw", "base-url-pw", KEY[:10]))
        assert "***@" in repr(spec) and "rpm=" in repr(spec)  # still says what it is
    assert specs[0].budget.text == specs[0].store.text == budget  # the spec itself keeps them whole


@pytest.mark.slow
def test_a_pickled_spec_works_in_another_process_and_no_log_line_holds_the_key(svc, caplog):
    spec = RunSpec.from_kwargs(type="bullets", api_key=KEY, base_url=svc.url, rpm=0, budget="none", progress=False)
    code = (
        "import asyncio, pickle, sys\n"
        "from batchsum.run import run_texts\n"
        "spec = pickle.loads(sys.stdin.buffer.read())\n"
        "results = asyncio.run(run_texts(spec, [sys.argv[1], sys.argv[1]]))\n"
        "print(repr(spec)); print([r.status for r in results])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, article(30)], input=pickle.dumps(spec), capture_output=True, timeout=60
    )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "['ok', 'ok']" in out and KEY not in out and KEY not in done.stderr.decode()
    assert svc.stats()["requests"] == 1  # the second row is the same request: sent once

    # In this process too: the run's and the client's reprs and every log record at DEBUG.
    caplog.set_level(logging.DEBUG)
    import asyncio

    from batchsum.run import Run

    async def go() -> list[str]:
        async with Run(spec) as run:
            results = [r async for r in run.stream([article(40)])]
            return [repr(run), repr(run.client), repr(run.spec), str(run.stats.record()), results[0].status]

    shown = asyncio.run(go())
    assert shown[-1] == "ok"
    assert not any(KEY in text for text in shown)
    assert not any(KEY in record.getMessage() for record in caplog.records)


@pytest.mark.slow
def test_the_command_line_starts_without_pandas_and_the_accessor_registers_either_way():
    light = "import sys, batchsum, batchsum.cli; assert 'pandas' not in sys.modules, 'pandas imported'"
    for code in (
        light,
        "import batchsum, pandas as pd; assert hasattr(pd.DataFrame({'a': [1]}), 'batchsum')",
        "import pandas as pd, batchsum; assert hasattr(pd.Series([1]), 'batchsum')",
    ):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
