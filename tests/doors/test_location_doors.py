"""A bad budget or store is the same one line from every door: the command line (summarize, its dry
run, top, limits, store), a keyword of the Python front-ends (pandas, Polars, DuckDB, the notebook
app, ``summarize_texts``, ``top``'s ``Watcher``), and the environment, which names its variable instead
of the option; never a credential, nothing sent."""

from __future__ import annotations

import asyncio

import pandas as pd
import pytest

import batchsum
from batchsum.cli import main
from batchsum.errors import BatchsumError
from batchsum.options import RunSpec
from batchsum.run.budget_keys import Watcher
from tests.support import KEY, article

PASSWORD = "pw-in-a-bad-location-4242"
BAD = {
    "unknown": f"memcached://user:{PASSWORD}@cache:11211",
    "port": f"redis://:{PASSWORD}@127.0.0.1:port/0",
    "prefix": f"redis://:{PASSWORD}@127.0.0.1:6379/0?prefix=two%20words",
}


def _line(call) -> str:
    with pytest.raises(BatchsumError) as caught:
        call()
    return str(caught.value)


def _cli(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("batchsum: error: "), err
    return err.strip().removeprefix("batchsum: error: ")


@pytest.mark.parametrize("option", ["budget", "store"])
@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_location_is_the_same_line_from_the_cli_a_keyword_and_the_environment(
    env, tmp_path, capsys, monkeypatch, option, bad
):
    value = BAD[bad]
    frame = pd.DataFrame({"text": [article(20)]})
    source = tmp_path / "in.parquet"
    frame.to_parquet(source)
    given = {option: value, "api_key": KEY, "base_url": env.url, "progress": False}
    line = _line(lambda: RunSpec.from_kwargs(**given))
    assert f"{option} " in line and f"(--{option}, {option}=)" in line and PASSWORD not in line, line

    doors = {
        "pandas": lambda: frame.batchsum.summarize("text", **given),
        "summarize_texts": lambda: asyncio.run(batchsum.summarize_texts(["a text"], **given)),
        "app": lambda: batchsum.widget(frame, **given),
    }
    if option == "budget":
        doors["top's Watcher"] = lambda: Watcher(value)
    for door, call in doors.items():
        assert _line(call) == line, door
    summarize = ["summarize", str(source), "-o", str(tmp_path / "out.parquet"), "--column", "text"]
    assert _cli(capsys, *summarize, f"--{option}", value) == line
    assert _cli(capsys, *summarize, f"--{option}", value, "--dry-run") == line
    own = ["top", "--once", "--budget", value] if option == "budget" else ["store", "--store", value]
    assert _cli(capsys, *own) == line

    variable = f"BATCHSUM_{option.upper()}"
    from_environment = line.replace(f"(--{option}, {option}=)", f"(${variable})")
    assert _line(lambda: RunSpec.from_kwargs(api_key=KEY, environ={variable: value})) == from_environment
    monkeypatch.setenv(variable, value)
    assert _cli(capsys, *summarize) == from_environment
    assert _line(lambda: frame.batchsum.summarize("text", api_key=KEY, base_url=env.url)) == from_environment
    assert env.stats()["requests"] == 0 and not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("option", ["budget", "store"])
def test_polars_and_duckdb_say_the_same_line(svc, option):
    pl = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    import batchsum.duckdb
    import batchsum.polars  # noqa: F401  (registers lf.batchsum)

    given = {option: BAD["unknown"], "api_key": KEY, "base_url": svc.url, "progress": False}
    line = _line(lambda: RunSpec.from_kwargs(**given))
    assert _line(lambda: pl.DataFrame({"text": ["a text"]}).batchsum.summarize("text", **given)) == line
    assert _line(lambda: pl.LazyFrame({"text": ["a text"]}).batchsum.summarize("text", **given)) == line
    assert _line(lambda: batchsum.duckdb.register(duckdb.connect(), **given)) == line
    assert svc.stats()["requests"] == 0
