import math

import pandas as pd
import pytest

from batchsum.service import contract
from batchsum.service.contract import Mode, SkipReason, SummaryType, count_words, parse_params, text_problem
from tests.support import article


def test_defaults_follow_the_interface():
    assert parse_params(1) == (Mode.STANDARD, 4, None)
    assert parse_params(2, 6, "best_line") == (Mode.ADVANCED, 6, SummaryType.BEST_LINE)
    assert parse_params("2", "3", "bullets").fields() == {"mode": 2, "percentage": 3, "type": "bullets"}
    assert "type" not in parse_params(1).fields()
    assert parse_params("advanced").mode is Mode.ADVANCED


@pytest.mark.parametrize("mode", [0, 3, -1, "x", True, None, 1.5, "three"])
def test_an_invalid_mode_is_named(mode):
    with pytest.raises(ValueError, match="invalid mode"):
        parse_params(mode)


@pytest.mark.parametrize("percentage", [0, 7, -4, "many", True, 4.5, float("nan")])
def test_an_invalid_percentage_is_named(percentage):
    with pytest.raises(ValueError, match="invalid percentage"):
        parse_params(1, percentage)


@pytest.mark.parametrize("kind", ["summary", "BULLET", 3, "best line"])
def test_an_invalid_type_is_named(kind):
    with pytest.raises(ValueError, match="invalid type"):
        parse_params(1, 4, kind)


def test_words_are_runs_of_non_white_space_in_any_script():
    assert count_words("  one\ttwo\nthree\u00a0four  ") == 4
    assert count_words("東京 は 大きい 都市 です") == 5
    assert count_words("") == 0


@pytest.mark.parametrize(
    "value, reason",
    [
        (None, SkipReason.EMPTY),
        (float("nan"), SkipReason.EMPTY),
        (pd.NA, SkipReason.EMPTY),
        (pd.NaT, SkipReason.EMPTY),
        (42, SkipReason.EMPTY),
        (b"bytes are not text at all but here are ten words", SkipReason.EMPTY),
        ("", SkipReason.EMPTY),
        ("   \n\t ", SkipReason.EMPTY),
        (article(9), SkipReason.TOO_SHORT),
        (article(5001), SkipReason.TOO_LONG),
    ],
)
def test_texts_the_service_would_refuse_are_classified(value, reason):
    problem = text_problem(value)
    assert problem is not None and problem[0] is reason
    assert problem[1]  # a sentence for the user


@pytest.mark.parametrize("words", [10, 11, 4999, 5000])
def test_texts_within_the_limits_are_sent_including_exactly_10_and_5000(words):
    assert text_problem(article(words)) is None


def test_unicode_text_is_counted_and_accepted():
    text = "Ça va très bien aujourd’hui, merci beaucoup — und wie geht es dir, mein Freund? 😀"
    assert text_problem(text) is None
    assert not math.isnan(count_words(text))


def test_the_service_error_texts_are_the_interfaces():
    assert contract.Messages.INVALID_KEY == "incorrect API key provided"
    assert contract.Messages.TOO_SHORT == "Text must be greater then 10 words"


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://www.summarizer.org", "https://www.summarizer.org"),
        ("https://WWW.Summarizer.org:443/", "https://www.summarizer.org"),
        ("https://user:secret@www.summarizer.org/?key=abc#frag", "https://www.summarizer.org"),
        ("https://api.example.com:8443/v2/", "https://api.example.com:8443/v2"),
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://[::1]:9000/x", "http://[::1]:9000/x"),
        # a path's parameter carrying a credential, masked as every message masks it; others kept
        ("https://api.example.com/v1;token=s3cr3t-path-token/", "https://api.example.com/v1;token=***"),
        (
            "https://api.example.com/v1;v=2;jsessionid=AB12CD34EF/x;key=k3y-k3y-k3y",
            "https://api.example.com/v1;v=2;jsessionid=***/x;key=***",
        ),
    ],
)
def test_a_service_has_one_name_without_credentials_query_or_default_port(url, name):
    assert contract.service_identity(url) == name


def test_the_local_service_is_named_as_itself_not_by_its_port():
    from batchsum.options import ClientSettings, Secret, key_hash

    local = ClientSettings(Secret("k" * 20), "http://127.0.0.1:43117", local=True)
    other = ClientSettings(Secret("k" * 20), "http://127.0.0.1:51002", local=True)
    assert local.service == other.service == contract.LOCAL_SERVICE
    live = ClientSettings(Secret("sk-live-1234567890"), "https://www.summarizer.org")
    assert live.service == "https://www.summarizer.org"
    assert live.key_hash == key_hash("sk-live-1234567890")
    assert len(live.key_hash) == 12 and int(live.key_hash, 16) >= 0
