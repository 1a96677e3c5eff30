"""A location (where a budget or an answer store lives) is one value, parsed once where it enters:
its kind, its file or its Redis URL and prefix; a store's prefix never reaches redis-py and never the
budget; a Redis budget object keeps its URL whole for the store that follows it; no repr, str or
message holds a credential, and the value round-trips what each door ships to its workers."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from batchsum.errors import BudgetError, InvalidParameterError
from batchsum.options import RunSpec
from batchsum.pacing.budgets.budget import ProcessBudget, SQLiteBudget, default_budget_path, open_budget
from batchsum.pacing.budgets.redis_budget import RedisBudget
from batchsum.service.location import BUDGET, STORE, Location
from batchsum.service.settings import budget_spec, store_spec
from tests.support import KEY

PASSWORD = "pw-in-a-location-4242"


@pytest.mark.parametrize(
    ("text", "role", "kind", "shown"),
    [
        ("none", BUDGET, "process", "none"),
        ("NONE", BUDGET, "process", "none"),
        ("process", BUDGET, "process", "process"),
        (" Machine ", BUDGET, "machine", "machine"),
        ("none", STORE, "none", "none"),
        ("machine", STORE, "machine", "machine"),
        ("sqlite:///tmp/Team/b.sqlite", BUDGET, "file", "sqlite:///tmp/Team/b.sqlite"),
        ("SQLITE:///tmp/Team/a.sqlite", STORE, "file", "sqlite:///tmp/Team/a.sqlite"),
        ("REDIS://127.0.0.1:6379/0", STORE, "redis", "redis://127.0.0.1:6379/0"),
        ("rediss://127.0.0.1:6380/1", BUDGET, "redis", "rediss://127.0.0.1:6380/1"),
    ],
)
def test_each_kind_is_parsed_once_into_a_value(text, role, kind, shown):
    place = Location.parse(text, role)
    assert (place.role, place.kind, place.text, str(place)) == (role, kind, shown, shown)
    assert Location.of(place, role) is place and Location.of(text, role) == place  # a value: parsed or given
    assert pickle.loads(pickle.dumps(place)) == place


def test_the_machine_and_a_file_name_their_sqlite_file_and_nothing_else_does(tmp_path):
    assert Location.parse("machine", BUDGET).file == default_budget_path()
    assert Location.parse("machine", STORE).file == default_budget_path().parent / "answers.sqlite"
    assert Location.parse(f"sqlite://{tmp_path}/b.sqlite", BUDGET).file == tmp_path / "b.sqlite"
    assert Location.parse("none", BUDGET).file is None and Location.parse("none", STORE).file is None
    pinned = Location.parse("machine", STORE).pinned()  # what a worker opens, whatever its cache folder
    assert pinned.kind == "file" and pinned.text == f"sqlite://{default_budget_path().parent / 'answers.sqlite'}"
    assert isinstance(open_budget(Location.parse("machine", BUDGET), "id"), SQLiteBudget)
    assert isinstance(open_budget(Location.parse("none", BUDGET), "id"), ProcessBudget)


def test_a_store_refuses_process_and_a_budget_takes_an_object():
    with pytest.raises(InvalidParameterError, match=r"unknown store 'process' \(--store, store=\)"):
        Location.parse("process", STORE)
    budget = ProcessBudget()
    assert budget_spec(budget) is budget and open_budget(budget, "id") is budget
    with pytest.raises(BudgetError, match="or a Budget object"):
        budget_spec(42)
    with pytest.raises(InvalidParameterError, match=r"invalid store 42 \(--store, store=\)"):
        store_spec(42, None)


def test_a_redis_prefix_goes_to_the_store_and_never_to_the_client_or_the_budget():
    text = f"redis://:{PASSWORD}@127.0.0.1:6379/0?socket_timeout=5&prefix=team-a"
    budget = Location.parse(text, BUDGET)
    assert budget.url == f"redis://:{PASSWORD}@127.0.0.1:6379/0?socket_timeout=5" and budget.prefix == "team-a:"
    opened = RedisBudget(budget, "some-key-id")  # nothing connected
    assert opened._bare == budget.url and opened.location == budget
    follows = store_spec(None, budget)
    assert (follows.role, follows.url, follows.prefix) == (STORE, budget.url, "team-a:")
    assert store_spec(None, opened) == follows  # a budget object keeps its URL whole for the store
    assert store_spec(None, Location.parse("machine", BUDGET)).is_machine
    socket = Location.parse("unix:///tmp/redis.sock?db=2&prefix=team-b", STORE)
    assert (socket.url, socket.prefix) == ("unix:///tmp/redis.sock?db=2", "team-b:")
    plain = Location.parse("unix:///tmp/redis.sock", STORE)
    assert (plain.url, plain.prefix) == ("unix:///tmp/redis.sock", "")


@pytest.mark.parametrize(
    "text",
    [
        f"redis://:{PASSWORD}@127.0.0.1:x/0",
        f"redis://:{PASSWORD}@127.0.0.1:6379/0?prefix=a%20b",
        f"redis://:{PASSWORD}@127.0.0.1:6379/0?foo=1",
        f"memcached://user:{PASSWORD}@cache:11211",
        f"redis:/:{PASSWORD}@h/0",
    ],
)
def test_no_message_about_a_location_holds_its_password(text):
    for role in (BUDGET, STORE):
        with pytest.raises((BudgetError, InvalidParameterError)) as caught:
            Location.parse(text, role)
        line = str(caught.value)
        assert PASSWORD not in line and "\n" not in line and f"(--{role}, {role}=)" in line, line


def test_no_repr_or_str_of_a_location_or_its_spec_holds_its_password():
    text = f"redis://:{PASSWORD}@127.0.0.1:6379/0?prefix=team-c"
    spec = RunSpec.from_kwargs(api_key=KEY, budget=text)
    for place in (spec.budget, spec.store, pickle.loads(pickle.dumps(spec.budget))):
        shown = " ".join([repr(place), str(place), f"{place}", place.shown, place.place])
        assert PASSWORD not in shown and "***@127.0.0.1:6379" in shown
    assert PASSWORD not in repr(spec) and PASSWORD not in str(spec.describe())
    assert spec.budget.text == text  # the value itself keeps it: the worker it goes to needs it
    bare = spec.store.without_secrets()  # a lazy plan's copy: nothing to open it with
    assert bare.withheld and PASSWORD not in pickle.dumps(bare).decode("latin-1")
    assert spec.budget.without_secrets() is not spec.budget
    assert Location.parse("machine", STORE).without_secrets() == Location.parse("machine", STORE)


def test_the_location_round_trips_what_the_distributed_doors_ship_to_their_workers(svc, redis_url):
    """Dask, Spark and Ray pickle the spec ``prepare_shared`` made to every worker: the same places,
    the machine's pinned to its files, a Redis store with its prefix and its budget without."""
    from batchsum.data.scopes import open_store
    from batchsum.run.shared import prepare_shared

    for budget in (None, f"{redis_url}?prefix=team-d"):
        spec = prepare_shared(RunSpec.from_kwargs(api_key=KEY, base_url=svc.url, progress=False, budget=budget))
        shipped = pickle.loads(pickle.dumps(spec))
        assert (shipped.budget, shipped.store) == (spec.budget, spec.store)
        if budget is None:
            assert shipped.budget == Location.at(default_budget_path(), BUDGET)
            assert shipped.store.file == default_budget_path().parent / "answers.sqlite"
        else:
            assert shipped.budget.text == shipped.store.text == budget and shipped.store.prefix == "team-d:"
            assert open_budget(shipped.budget, "id")._bare == redis_url  # type: ignore[attr-defined]
        store = open_store(shipped.store, svc.url)
        try:
            assert store.where.endswith(", prefix team-d)") == (budget is not None)
        finally:
            store.close()
        assert asyncio.run(open_budget(shipped.budget, "id").check()) is None


def test_the_location_round_trips_a_polars_plan_without_its_secrets(monkeypatch):
    """A lazy plan holds the spec without its credentials; in the process that made it, they come
    back whole; anywhere else, a place that had some is refused rather than opened with ``***``."""
    pytest.importorskip("polars")
    import batchsum.polars as door
    from batchsum.errors import ConfigurationError

    text = f"redis://:{PASSWORD}@127.0.0.1:6379/0?prefix=team-e"
    spec = RunSpec.from_kwargs(api_key=KEY, budget=text)
    bare, token = door._keep(spec)
    planned = pickle.loads(pickle.dumps(bare))
    assert PASSWORD not in pickle.dumps(bare).decode("latin-1") and planned.store.withheld
    back = door._kept_spec(planned, token)
    assert (back.budget, back.store) == (spec.budget, spec.store)
    with pytest.raises(ConfigurationError, match="budget's credentials"):
        door._kept_spec(planned, "a token of another process")
    plain = RunSpec.from_kwargs(api_key=KEY, store="machine", budget="none")
    monkeypatch.setenv("BATCHSUM_API_KEY", KEY)  # another process reads its own key
    elsewhere = door._kept_spec(pickle.loads(pickle.dumps(door._keep(plain)[0])), "a token of another process")
    assert (elsewhere.budget, elsewhere.store) == (plain.budget, plain.store)
