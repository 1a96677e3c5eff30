"""A location (where a budget or an answer store lives) is one value, parsed once where it enters:
its kind, its file or its Redis URL and prefix; a store's prefix never reaches redis-py and never the
budget; a Redis budget object keeps its URL whole for the store that follows it; no repr, str or
message holds a credential, and the value round-trips what each door ships to its workers."""

from __future__ import annotations

import pickle

import pytest

from batchsum.errors import BudgetError, InvalidParameterError
from batchsum.service.location import BUDGET, STORE, Location

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
