"""A run's keys: from ``api_key`` (one or a list), a key file, ``$BATCHSUM_API_KEYS`` or
``$BATCHSUM_API_KEY`` in that precedence; a key file refused when others may read it and a malformed
line named by its number, never echoed; a key never in a repr, a description or a pickle's text."""

from __future__ import annotations

import os
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsum.errors import ConfigurationError, InvalidParameterError
from batchsum.options import RunSpec
from batchsum.service.key_plans import Quota, parse_quota, read_key_file, resolve_keys
from batchsum.service.settings import key_hash

A, B, C = "team-key-aaaaaaaaaaaaaaaa", "team-key-bbbbbbbbbbbbbbbb", "team-key-cccccccccccccccc"


def key_file(tmp_path, text: str, mode: int = 0o600):
    path = tmp_path / "keys.txt"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def pieces(secret: str, width: int = 10) -> set[str]:
    return {secret[i : i + width] for i in range(len(secret) - width + 1)}


def test_a_key_file_gives_each_key_its_line_its_rate_and_its_quota(tmp_path):
    path = key_file(
        tmp_path, f"# the team's keys\n{A} 120 # seat 1\n\n{B} quota=10000/day auto\n{C}  quota=500/hour  \n"
    )
    plans = read_key_file(path)  # a rate and a quota in either order
    assert [p.source for p in plans] == ["keys.txt line 2", "keys.txt line 4", "keys.txt line 5"]
    assert [p.rate for p in plans] == ["120", "auto", None]
    assert [p.quota for p in plans] == [None, Quota(10000, "day"), Quota(500, "hour")]
    assert [p.hash for p in plans] == [key_hash(A), key_hash(B), key_hash(C)]
    assert plans[0].limit(60.0, False) == (120.0, False) and plans[2].limit(60.0, False) == (60.0, False)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o610])
def test_a_key_file_others_may_read_is_refused_as_ssh_refuses_a_private_key(tmp_path, mode):
    path = key_file(tmp_path, f"{A}\n", mode)
    with pytest.raises(ConfigurationError, match="chmod 600") as caught:
        read_key_file(path)
    assert not pieces(A) & {p for p in pieces(A) if p in str(caught.value)}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (f"{A} fast", "field 2 is not a rate"),
        (f"{A} 120 quota=10/week", "field 3 is not a quota"),
        (f"{A} 120 130", "field 3 is one too many: the line has its rate already"),
        (f"{A} 600 junk", "field 3 is one too many: the line has its rate already"),
        (f"{A} quota=5/day quota=6/day", "field 3 is one too many: the line has its quota already"),
        (f"{A} quota=5/day fast", "field 3 is not a rate"),
        ("team-key-with-a-ctrl-\x07-char", "control character"),
    ],
)
def test_a_malformed_line_is_named_by_its_number_and_never_echoed(tmp_path, line, problem):
    path = key_file(tmp_path, f"{B}\n# a comment\n{line}\n")
    with pytest.raises(ConfigurationError) as caught:
        read_key_file(path)
    message = str(caught.value)
    assert "line 3" in message and problem in message
    assert not any(piece in message for piece in pieces(line.split()[0]))


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=12, max_size=40), st.text(max_size=20)
)
def test_no_line_of_a_key_file_ever_reaches_a_message(secret, rest):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "keys.txt"
        path.write_text(f"{secret} {rest}\n{secret}\n", encoding="utf-8", errors="replace")
        os.chmod(path, 0o600)
        try:
            read_key_file(path)
        except ConfigurationError as exc:
            assert not any(piece in str(exc) for piece in pieces(secret) if piece.strip())


def test_a_key_given_twice_and_a_file_with_no_key_are_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="line 3: the same key as line 1"):
        read_key_file(key_file(tmp_path, f"{A}\n{B}\n{A} 60\n"))
    with pytest.raises(ConfigurationError, match="holds no key"):
        read_key_file(key_file(tmp_path, "# nothing yet\n\n"))
    with pytest.raises(ConfigurationError, match=r"api_key\[1\] is the same key as api_key\[0\]"):
        resolve_keys([A, A], None)


def test_keys_come_from_the_file_then_batchsum_api_keys_then_batchsum_api_key(tmp_path):
    path = key_file(tmp_path, f"{C} 300\n")
    env = {"BATCHSUM_API_KEYS": f"{A}, {B}\n", "BATCHSUM_API_KEY": C}
    assert [p.hash for p in resolve_keys(None, path, env)] == [key_hash(C)]
    from_env = resolve_keys(None, None, env)
    assert [p.hash for p in from_env] == [key_hash(A), key_hash(B)]
    assert [p.source for p in from_env] == ["$BATCHSUM_API_KEYS (key 1)", "$BATCHSUM_API_KEYS (key 2)"]
    assert [p.source for p in resolve_keys(None, None, {"BATCHSUM_API_KEY": C})] == ["$BATCHSUM_API_KEY"]
    assert [p.source for p in resolve_keys([A, B], None, env)] == ["api_key[0]", "api_key[1]"]
    with pytest.raises(InvalidParameterError, match="not both"):
        resolve_keys(A, path, env)


def test_every_front_end_takes_a_list_of_keys_and_no_key_shows_anywhere(tmp_path):
    spec = RunSpec.from_kwargs(api_key=[A, B, C], rpm=120, quota="1000/day", base_url="https://example.com")
    assert spec.client.api_key is not None and spec.client.api_key.reveal() == A  # the first key's client settings
    assert [p.hash for p in spec.keys] == [key_hash(k) for k in (A, B, C)] and spec.quota == Quota(1000, "day")
    shown = repr(spec) + str(spec.describe()) + repr(spec.keys)
    assert not any(piece in shown for key in (A, B, C) for piece in pieces(key))
    assert pickle.loads(pickle.dumps(spec)).keys == spec.keys  # the keys travel to workers as Secrets
    via_file = RunSpec.from_kwargs(keys=key_file(tmp_path, f"{A} 300 quota=5/hour\n"), base_url="https://example.com")
    assert via_file.describe()["keys"] == [
        {"hash": key_hash(A), "source": "keys.txt line 1", "rpm": "300", "quota": "5/hour"}
    ]


@pytest.mark.parametrize("text", ["10000", "10/week", "-5/day", "0/day", "ten/day", "1e3/day", "5 /day"])
def test_a_bad_quota_is_one_error_naming_it(text):
    with pytest.raises(InvalidParameterError, match=f"invalid quota '{text}'"):
        parse_quota(text)


def test_a_quota_reads_in_any_case_and_names_itself():
    assert parse_quota(" 10000/Day ") == Quota(10000, "day")
    assert Quota(300, "day").name == "daily quota of 300" and str(Quota(5, "month")) == "5/month"


def test_a_malformed_field_carries_no_earlier_message(tmp_path):
    path = key_file(tmp_path, f"{A} quota=12/fortnight\n")
    with pytest.raises(ConfigurationError) as caught:
        read_key_file(path)
    assert caught.value.__context__ is None and caught.value.__cause__ is None
