"""The rate-limit header parser (``batchsum.service.rate_headers``): every form from the
specifications' own examples and the services' documentation, every kind of value it ignores,
hypothesis over any header mapping, and each form end to end through the client, the engine and the
pacer.

The end-to-end tests use an ``httpx.MockTransport`` on virtual time: the local service sends only
``RateLimit-*`` and ``X-RateLimit-*`` today (the other forms come with the local service's header
forms, on another branch), and the virtual clock lets a minute of pacing run in milliseconds."""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import string
import time

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import batchsum
from batchsum.engine import summarize_stream
from batchsum.local.state import SlidingWindow
from batchsum.pacing import Pacer
from batchsum.service import contract
from batchsum.service.client import prepare
from batchsum.service.contract import Messages
from batchsum.service.rate_headers import (
    FORMS,
    MAX_PER_MINUTE,
    MAX_RESET,
    MINUTE_BOUND,
    RateStatement,
    parse_rate_headers,
)
from tests import virtual_clock

NOW = 1_372_699_073.0  # Unix seconds: half an hour before GitHub's documented X-RateLimit-Reset


def parse(headers):
    return parse_rate_headers(headers, now=lambda: NOW)


def statement(limit=None, window=None, remaining=None, reset=None, form="", **quota):
    return RateStatement(limit=limit, window=window, remaining=remaining, reset=reset, form=form, **quota)


# -- every form, from the specifications and the services' documents -------------------------------------

FORM_CASES = {
    # draft-ietf-httpapi-ratelimit-headers-01, section 4 and 3.1
    "draft-01 fields": (
        {"RateLimit-Limit": "10", "RateLimit-Remaining": "1", "RateLimit-Reset": "7"},
        statement(10, None, 1, 7.0, "draft-06"),
    ),
    "draft-01 301 with none left": (
        {"RateLimit-Remaining": "0", "RateLimit-Limit": "10", "RateLimit-Reset": "10"},
        statement(10, None, 0, 10.0, "draft-06"),
    ),
    "draft-01 list, window for the expiring limit": (
        {"RateLimit-Limit": "100, 100;w=10"},
        statement(100, 10, form="list"),
    ),
    "draft-01 list of quotas: the most restrictive": (
        {"RateLimit-Limit": "10, 10;w=1, 50;w=60, 1000;w=3600, 5000;w=86400"},
        statement(50, 60, form="list", quota=5000, quota_window=86400),
    ),
    "draft-01 list with comments": (
        {"RateLimit-Limit": "10, 10;w=1;burst=1000, 1000;w=3600"},
        statement(10, 1, form="list", quota=1000, quota_window=3600),
    ),
    "the issue's older-draft list: 10 a second": (
        {"RateLimit-Limit": "10, 10;w=1"},
        statement(10, 1, form="list"),
    ),
    "draft-06 fields with a policy": (
        {"RateLimit-Limit": "100", "RateLimit-Remaining": "50", "RateLimit-Reset": "5", "RateLimit-Policy": "100;w=10"},
        statement(100, 10, 50, 5.0, "draft-06"),
    ),
    "draft-06 policy with a comment": (
        {"RateLimit-Policy": '100;w=60;comment="fixed window"', "RateLimit-Remaining": "3", "RateLimit-Reset": "9"},
        statement(100, 60, 3, 9.0, "draft-06"),
    ),
    # draft-07, appendix B
    "draft-07 window by parameter (B.2.1)": (
        {"RateLimit": "limit=100, remaining=99, reset=50", "RateLimit-Policy": "100;w=60"},
        statement(100, 60, 99, 50.0, "draft-07"),
    ),
    "draft-07 dynamic limit (B.2.2): the stated window wins": (
        {"RateLimit": "limit=10, remaining=9, reset=50", "RateLimit-Policy": "100;w=60"},
        statement(100, 60, 9, 50.0, "draft-07"),
    ),
    "draft-07 pushing back (B.2.3): a limit of 0 is no rate": (
        {"RateLimit": "limit=0, remaining=0, reset=20", "RateLimit-Policy": "15;w=20"},
        statement(15, 20, 0, 20.0, "draft-07"),
    ),
    "draft-07 unparameterized (B.1.1)": (
        {"RateLimit": "limit=100, remaining=0, reset=50"},
        statement(100, None, 0, 50.0, "draft-07"),
    ),
    "draft-07 no remaining (B.3.1)": (
        {"RateLimit": "limit=10, reset=1"},
        statement(10, None, None, 1.0, "draft-07"),
    ),
    "draft-07 multiple windows (B.3.2)": (
        {"RateLimit": "limit=5000, remaining=100, reset=36000", "RateLimit-Policy": "1000;w=3600, 5000;w=86400"},
        statement(form="draft-07", quota=5000, quota_window=86400, quota_remaining=100, quota_reset=36000.0),
    ),
    "draft-07 FAQ policies with comments": (
        {
            "RateLimit": "limit=100, remaining=50, reset=44",
            "RateLimit-Policy": '100;w=60;burst=1000;comment="sliding window", 5000;w=3600;burst=0;comment="fixed window"',
        },
        statement(100, 60, 50, 44.0, "draft-07", quota=5000, quota_window=3600),
    ),
    # draft-10 and -11, sections 3.2, 4.2 and appendix B
    "structured policy and limit": (
        {"RateLimit-Policy": '"default";q=100;w=10', "RateLimit": '"default";r=50;t=30'},
        statement(100, 10, 50, 30.0, "structured"),
    ),
    "structured several policies": (
        {"RateLimit-Policy": '"permin";q=50;w=60,"perhr";q=1000;w=3600'},
        statement(50, 60, form="structured", quota=1000, quota_window=3600),
    ),
    "structured partition key": (
        {
            "RateLimit-Policy": '"peruser";q=100;w=60;pk=:cHsdsRa894==:',
            "RateLimit": '"peruser";r=999;pk=:dHJpYWwxMjEzMjM=:',
        },
        statement(100, 60, 999, None, "structured"),
    ),
    "structured content-bytes policy is not requests": (
        {
            "RateLimit-Policy": '"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:',
            "RateLimit": '"peruser";r=300000000;t=60;pk=:QXBwLTk5OQ==:',
        },
        None,
    ),
    "structured pushing back with Retry-After (B.3)": (
        {"Retry-After": "20", "RateLimit-Policy": '"dynamic";q=100;w=60', "RateLimit": '"dynamic";r=15;t=40'},
        statement(100, 60, 15, 40.0, "structured", retry_after=20.0),
    ),
    "structured multiple windows (B.3.1)": (
        {"RateLimit-Policy": '"hour";q=1000;w=3600, "day";q=5000;w=86400', "RateLimit": '"day";r=100;t=36000'},
        statement(form="structured", quota=5000, quota_window=86400, quota_remaining=100, quota_reset=36000.0),
    ),
    "structured policies in two fields, joined (FAQ)": (
        {
            "RateLimit-Policy": '"sliding";q=100;w=60;burst=1000, "fixed";q=5000;w=3600;burst=0',
            "RateLimit": '"sliding";r=50;t=44',
        },
        statement(100, 60, 50, 44.0, "structured", quota=5000, quota_window=3600),
    ),
    "structured simplest form, no space": (
        {"RateLimit": '"default";r=50;t=60'},
        statement(None, None, 50, 60.0, "structured"),
    ),
    "Cloudflare's API": (
        {"Ratelimit": '"default";r=50;t=30', "Ratelimit-Policy": '"burst";q=100;w=60'},
        statement(100, 60, 50, 30.0, "structured"),
    ),
    "Cloudflare's API on a 429: an RFC 1123 reset": (
        {
            "X-RateLimit-Limit": "1200",
            "X-RateLimit-Remaining": "0",
            "Retry-After": "30",
            "X-RateLimit-Reset": email.utils.formatdate(NOW + 30, usegmt=True),
        },
        statement(1200, None, 0, 30.0, "x-ratelimit", retry_after=30.0),
    ),
    # GitHub's REST API documentation (the reset in Unix seconds)
    "GitHub": (
        {
            "x-ratelimit-limit": "5000",
            "x-ratelimit-remaining": "4999",
            "x-ratelimit-used": "1",
            "x-ratelimit-reset": "1372700873",
            "x-ratelimit-resource": "core",
        },
        statement(form="x-ratelimit", quota=5000, quota_remaining=4999, quota_reset=1800.0),
    ),
    "X-RateLimit in seconds": (
        {"X-RateLimit-Limit": "600", "X-RateLimit-Remaining": "599", "X-RateLimit-Reset": "59"},
        statement(600, None, 599, 59.0, "x-ratelimit"),
    ),
    "X-RateLimit reset with a fraction (Discord)": (
        {"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "4", "X-RateLimit-Reset": f"{NOW + 1.5:.3f}"},
        statement(5, None, 4, 1.5, "x-ratelimit"),
    ),
    "X-RateLimit reset as an RFC 3339 date": (
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2013-07-01T17:47:53Z"},
        statement(form="x-ratelimit", quota_remaining=0, quota_reset=1800.0),
    ),
    "X-Rate-Limit spelling (Twitter, IBM)": (
        {"X-Rate-Limit-Limit": "900", "X-Rate-Limit-Remaining": "899", "X-Rate-Limit-Reset": "1372700873"},
        statement(form="x-ratelimit", quota=900, quota_remaining=899, quota_reset=1800.0),
    ),
    "Envoy's draft-03 headers": (
        {"x-ratelimit-limit": '10, 10;w=60;name="per-user"', "x-ratelimit-remaining": "9", "x-ratelimit-reset": "42"},
        statement(10, 60, 9, 42.0, "x-ratelimit"),
    ),
    # OpenAI's rate-limit documentation
    "OpenAI": (
        {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-limit-tokens": "150000",
            "x-ratelimit-remaining-requests": "59",
            "x-ratelimit-remaining-tokens": "149984",
            "x-ratelimit-reset-requests": "1s",
            "x-ratelimit-reset-tokens": "6m0s",
        },
        statement(60, None, 59, 1.0, "openai"),
    ),
    "OpenAI milliseconds": (
        {
            "x-ratelimit-limit-requests": "10000",
            "x-ratelimit-remaining-requests": "9999",
            "x-ratelimit-reset-requests": "20ms",
        },
        statement(10000, None, 9999, 0.02, "openai"),
    ),
    "OpenAI minutes and a fraction": (
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1m30.5s"},
        statement(form="openai", quota_remaining=0, quota_reset=90.5),
    ),
    "OpenAI hours": (
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1h2m3s"},
        statement(form="openai", quota_remaining=0, quota_reset=3723.0),
    ),
    # Kong's rate-limiting plugin: the window in the name, the reset in the draft's fields
    "Kong": (
        {
            "X-RateLimit-Limit-Minute": "10",
            "X-RateLimit-Remaining-Minute": "9",
            "RateLimit-Limit": "10",
            "RateLimit-Remaining": "9",
            "RateLimit-Reset": "47",
        },
        statement(10, 60, 9, 47.0, "kong+draft-06"),
    ),
    "Kong, several windows: the most restrictive": (
        {
            "X-RateLimit-Limit-Second": "5",
            "X-RateLimit-Remaining-Second": "4",
            "X-RateLimit-Limit-Hour": "1000",
            "X-RateLimit-Remaining-Hour": "990",
        },
        statement(5, 1, 4, None, "kong", quota=1000, quota_window=3600, quota_remaining=990),
    ),
    # A quota stated in the list form (draft-03's expiring limit first): the local service's daily quota
    "a daily quota in the list form, its room with its reset": (
        {"RateLimit-Limit": "300, 600;w=60, 300;w=86400", "RateLimit-Remaining": "45", "RateLimit-Reset": "50000"},
        statement(
            600, 60, form="list+draft-06", quota=300, quota_window=86400, quota_remaining=45, quota_reset=50000.0
        ),
    ),
    # A limit with no window beside windows stated in its fields is one of theirs (the one with its value):
    # never per minute when only longer windows are stated, and its room is that window's (issue 40)
    "the issue's list form: 30 a day, no minute": (
        {"RateLimit-Limit": "30, 30;w=86400"},
        statement(form="list", quota=30, quota_window=86400),
    ),
    "a limit named by a daily policy": (
        {"RateLimit-Limit": "100", "RateLimit-Policy": "100;w=86400"},
        statement(form="draft-06", quota=100, quota_window=86400),
    ),
    "a daily policy's room with no limit field": (
        {"RateLimit-Policy": "100;w=86400", "RateLimit-Remaining": "50", "RateLimit-Reset": "30"},
        statement(form="draft-06", quota=100, quota_window=86400, quota_remaining=50, quota_reset=30.0),
    ),
    "draft-07 limit of a daily policy: its room is the quota's in its last minute too": (
        {"RateLimit": "limit=100, remaining=50, reset=30", "RateLimit-Policy": "100;w=86400"},
        statement(form="draft-07", quota=100, quota_window=86400, quota_remaining=50, quota_reset=30.0),
    ),
    "the list form's daily quota in its last minute: the room is the quota's": (
        {"RateLimit-Limit": "300, 600;w=60, 300;w=86400", "RateLimit-Remaining": "250", "RateLimit-Reset": "40"},
        statement(600, 60, form="list+draft-06", quota=300, quota_window=86400, quota_remaining=250, quota_reset=40.0),
    ),
    "the list form's minute expiring: the room is the minute's": (
        {"RateLimit-Limit": "600, 600;w=60, 300;w=86400", "RateLimit-Remaining": "590", "RateLimit-Reset": "40"},
        statement(600, 60, 590, 40.0, form="list+draft-06", quota=300, quota_window=86400),
    ),
    "a day's room beside a second's limit is no burst licence": (
        {
            "RateLimit-Limit": "100",
            "RateLimit-Remaining": "99",
            "RateLimit-Reset": "30",
            "RateLimit-Policy": "100;w=86400, 10;w=1",
        },
        statement(10, 1, form="draft-06", quota=100, quota_window=86400, quota_remaining=99, quota_reset=30.0),
    ),
    "X-RateLimit's limit named by a daily policy in the draft's fields: the day's, with its room": (
        {
            "X-RateLimit-Limit": "100",
            "X-RateLimit-Remaining": "90",
            "X-RateLimit-Reset": "30",
            "RateLimit-Policy": "100;w=86400",
        },
        statement(form="draft-06+x-ratelimit", quota=100, quota_window=86400, quota_remaining=90, quota_reset=30.0),
    ),
    "a limit that may be a minute's or a day's: its room is not understood": (
        {"RateLimit-Limit": "100, 100;w=60, 100;w=86400", "RateLimit-Remaining": "0", "RateLimit-Reset": "30"},
        statement(100, 60, form="list", quota=100, quota_window=86400),
    ),
    # The room a structured limit states is the room of the policy it names: of that policy's window
    "structured: a daily policy's room resetting in 30 s is the quota's, no burst licence": (
        {"RateLimit-Policy": '"day";q=300;w=86400, "min";q=600;w=60', "RateLimit": '"day";r=200;t=30'},
        statement(600, 60, form="structured", quota=300, quota_window=86400, quota_remaining=200, quota_reset=30.0),
    ),
    "structured: a minute policy's room is never a quota's (resetting after its window: ignored)": (
        {"RateLimit-Policy": '"min";q=600;w=60', "RateLimit": '"min";r=5;t=90'},
        statement(600, 60, form="structured"),
    ),
    "structured: a minute policy's room": (
        {"RateLimit-Policy": '"min";q=600;w=60, "day";q=300;w=86400', "RateLimit": '"min";r=5;t=20'},
        statement(600, 60, 5, 20.0, form="structured", quota=300, quota_window=86400),
    ),
    "a monthly quota": (
        {"RateLimit-Policy": '"month";q=100000;w=2592000', "RateLimit": '"month";r=5;t=86400'},
        statement(form="structured", quota=100000, quota_window=2592000, quota_remaining=5, quota_reset=86400.0),
    ),
    "Retry-After alone, a day": ({"Retry-After": "86400"}, statement(form="retry-after", retry_after=86400.0)),
    "Retry-After as an HTTP date": (
        {"Retry-After": email.utils.formatdate(NOW + 3600, usegmt=True)},
        statement(form="retry-after", retry_after=3600.0),
    ),
}


@pytest.mark.parametrize("headers, expected", FORM_CASES.values(), ids=FORM_CASES.keys())
def test_each_form_reads_as_its_specification_says(headers, expected):
    read = parse(headers)
    if expected is None:
        assert read is None
        return
    assert read is not None
    assert (read.limit, read.window, read.remaining, read.form) == (
        expected.limit,
        expected.window,
        expected.remaining,
        expected.form,
    )
    assert read.reset == pytest.approx(expected.reset, abs=1e-6) if expected.reset is not None else read.reset is None
    assert (read.quota, read.quota_window, read.quota_remaining) == (
        expected.quota,
        expected.quota_window,
        expected.quota_remaining,
    )
    for name in ("quota_reset", "retry_after"):
        value, wanted = getattr(read, name), getattr(expected, name)
        assert value == pytest.approx(wanted, abs=1e-6) if wanted is not None else value is None, name


def test_the_statement_says_its_rate_per_minute_and_whether_it_states_room():
    assert parse({"RateLimit-Limit": "10, 10;w=1"}).per_minute == 600
    assert parse({"RateLimit-Policy": "600;w=60"}).per_minute == 600
    assert parse({"RateLimit-Policy": "6000;w=600"}).per_minute is None  # ten minutes: a quota
    assert parse({"RateLimit-Policy": "6000;w=600"}).quota == 6000
    assert parse({"X-RateLimit-Limit": "600"}).per_minute == 600  # no window stated: the plan's minute
    assert parse({"X-RateLimit-Remaining": "5"}).per_minute is None
    assert parse({"X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "3"}).room
    assert not parse({"X-RateLimit-Remaining": "5"}).room
    assert not parse({"X-RateLimit-Limit": "5", "X-RateLimit-Reset": "3"}).room
    assert {f for case in FORM_CASES.values() if case[1] for f in case[1].form.split("+")} == {*FORMS, "retry-after"}


def test_names_are_case_insensitive_and_a_field_sent_twice_reads_as_a_list():
    assert parse({"ratelimit-LIMIT": "100", "RATELIMIT-POLICY": "100;w=10"}).per_minute == 600
    twice = httpx.Headers(
        [
            ("X-RateLimit-Remaining", "7"),
            ("X-RateLimit-Remaining", "5"),
            ("X-RateLimit-Reset", "20"),
            ("X-RateLimit-Reset", "30"),
            ("X-RateLimit-Limit", "600"),
            ("X-RateLimit-Limit", "300"),
        ]
    )
    assert parse(twice) == statement(300, None, 5, 30.0, "x-ratelimit")  # the fewest left, the latest reset
    dates = f"{email.utils.formatdate(NOW + 5, usegmt=True)}, {email.utils.formatdate(NOW + 9, usegmt=True)}"
    assert parse({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": dates}).reset == 9.0
    policies = httpx.Headers([("RateLimit-Policy", '"a";q=600;w=60'), ("RateLimit-Policy", '"b";q=50;w=10')])
    assert parse(policies).per_minute == 300


def test_several_forms_merge_into_the_most_restrictive_quota_and_the_smallest_room():
    headers = {
        "X-RateLimit-Limit": "1000",  # no window: per minute, and only when no form states a window
        "RateLimit-Policy": "100;w=10",
        "X-RateLimit-Remaining": "40",
        "X-RateLimit-Reset": "20",
        "RateLimit-Remaining": "60",
        "RateLimit-Reset": "20",
        "x-ratelimit-remaining-requests": "30",  # no reset: a partial statement yields to whole ones
    }
    assert parse(headers) == statement(100, 10, 40, 20.0, "draft-06+x-ratelimit")


# -- what is ignored ------------------------------------------------------------------------------------

IGNORED = {
    "exponent in a policy (the issue's 6e2)": {"RateLimit-Policy": "6e2;w=60"},
    "exponent in X-RateLimit-Limit (the issue's 6.0e3)": {"X-RateLimit-Limit": "6.0e3"},
    "a decimal limit": {"X-RateLimit-Limit": "600.0"},
    "a negative limit": {"X-RateLimit-Limit": "-600"},
    "a signed limit": {"RateLimit-Limit": "+600"},
    "NaN": {"X-RateLimit-Limit": "NaN", "X-RateLimit-Remaining": "nan", "X-RateLimit-Reset": "NaN"},
    "infinity": {"X-RateLimit-Limit": "inf", "X-RateLimit-Reset": "Infinity"},
    "over a million a minute": {"X-RateLimit-Limit": "1000001"},
    "over a million a minute by its window": {"RateLimit-Policy": "20000;w=1"},
    "a window of 0": {"RateLimit-Policy": "100;w=0"},
    "a window over 31 days": {"RateLimit-Policy": "100000;w=2678401"},
    "a window with a fraction": {"RateLimit-Policy": "100;w=1.5"},
    "a window that is a word": {"RateLimit-Policy": "100;w=minute"},
    "a policy without its window": {"RateLimit-Policy": "100"},
    "a limit of 0": {"X-RateLimit-Limit": "0"},
    "thousands separators": {"X-RateLimit-Limit": "1,000"},
    "words": {"X-RateLimit-Limit": "600 requests", "RateLimit-Policy": "lots"},
    "16 digits": {"X-RateLimit-Limit": "1234567890123456"},
    "five thousand digits": {"X-RateLimit-Limit": "9" * 5000, "RateLimit-Remaining": "9" * 5000},
    "other digits than ASCII": {"X-RateLimit-Limit": "٦٠٠", "x-ratelimit-reset-requests": "٣s"},
    "a boolean": {"RateLimit": "limit=?1, remaining=?0, reset=?1"},
    "a negative remaining and reset": {"RateLimit-Remaining": "-1", "RateLimit-Reset": "-5"},
    "a decimal remaining": {"X-RateLimit-Remaining": "4.5"},
    "a reset of 0": {"RateLimit-Reset": "0"},
    "a reset over 31 days": {"RateLimit-Reset": "2678401"},
    "a Unix reset in the past": {"X-RateLimit-Reset": str(int(NOW - 10))},
    "a Unix reset over 31 days ahead": {"X-RateLimit-Reset": str(int(NOW + 2678500))},
    "a Unix reset in milliseconds": {"X-RateLimit-Reset": str(int(NOW * 1000) + 5000)},
    "a date in the past": {"X-RateLimit-Reset": email.utils.formatdate(NOW - 60, usegmt=True)},
    "an impossible date": {"X-RateLimit-Reset": "Tue, 31 Feb 2013 17:47:53 GMT"},
    "a date not in GMT": {"X-RateLimit-Reset": "Mon, 01 Jul 2013 17:47:53 +0200"},
    "a Unix time in RateLimit-Reset (a delay by the draft)": {"RateLimit-Reset": str(int(NOW + 30))},
    "a duration with a sign": {"x-ratelimit-reset-requests": "-1s"},
    "a duration with no unit": {"x-ratelimit-reset-requests": "5"},
    "a duration in days": {"x-ratelimit-reset-requests": "1d"},
    "a duration of 0": {"x-ratelimit-reset-requests": "0s"},
    "a trailing comma": {"RateLimit-Limit": "10, 10;w=1,"},
    "an unclosed string": {"RateLimit-Policy": '"p;q=100;w=60', "RateLimit": '"p";r=5;t=5"'},
    "an inner list": {"RateLimit-Policy": "(100 200);w=60"},
    "a key in capitals": {"RateLimit-Policy": "100;W=60", "RateLimit": "LIMIT=100, REMAINING=5, RESET=5"},
    "a structured limit without r": {"RateLimit": '"p";t=30'},
    "a structured policy without q": {"RateLimit-Policy": '"p";w=60'},
    "a structured limit for another unit": {
        "RateLimit-Policy": '"b";q=1;qu="concurrent-requests"',
        "RateLimit": '"b";r=0;t=9',
    },
    "Kong's month and year": {"X-RateLimit-Limit-Month": "1000", "X-RateLimit-Limit-Year": "10000"},
    "Kong's named limits count other units": {"X-RateLimit-Limit-Videos-Minute": "10"},
    "empty values": {"RateLimit-Limit": "", "X-RateLimit-Limit": " ", "RateLimit": "", "RateLimit-Policy": ""},
    "unrelated headers": {"Content-Type": "application/json", "X-Request-Id": "abc"},
    "a Retry-After over 31 days, or a word": {"Retry-After": "2678401", "Retry-After-Ms": "soon"},
}


@pytest.mark.parametrize("headers", IGNORED.values(), ids=IGNORED.keys())
def test_what_does_not_fully_parse_is_ignored(headers):
    assert parse(headers) is None


def test_an_ignored_field_leaves_the_others_readable():
    headers = {"X-RateLimit-Limit": "6e2", "X-RateLimit-Remaining": "7", "X-RateLimit-Reset": "NaN"}
    assert parse(headers) == statement(None, None, 7, None, "x-ratelimit")
    headers = {
        "RateLimit-Policy": "6e2;w=60, 100;w=60",  # a malformed field is ignored whole
        "RateLimit-Limit": "100, 100;w=10",
        "RateLimit-Remaining": "5, x",
        "RateLimit-Reset": "9",
    }
    assert parse(headers) == statement(100, 10, None, 9.0, "list+draft-06")


def test_a_unix_or_calendar_reset_is_read_against_the_clock_once():
    calls = []

    def clock():
        calls.append(1)
        return NOW

    read = parse_rate_headers({"X-RateLimit-Reset": "1372699103, 1372699113", "X-RateLimit-Remaining": "1"}, now=clock)
    assert read.reset == 40.0 and len(calls) == 1
    assert parse_rate_headers({"X-RateLimit-Reset": "30", "X-RateLimit-Remaining": "1"}, now=clock).reset == 30
    assert len(calls) == 1  # a delay needs no clock


def test_values_that_are_not_text_are_skipped():
    assert parse({"X-RateLimit-Limit": 600, b"x-ratelimit-remaining": b"5", "RateLimit-Policy": "100;w=60"}) == (
        statement(100, 60, form="draft-06")
    )


# -- hypothesis: any header mapping --------------------------------------------------------------------

KNOWN_NAMES = [
    "RateLimit",
    "RateLimit-Policy",
    "RateLimit-Limit",
    "RateLimit-Remaining",
    "RateLimit-Reset",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
    "X-Rate-Limit-Limit",
    "X-Rate-Limit-Remaining",
    "X-Rate-Limit-Reset",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "X-RateLimit-Limit-Second",
    "X-RateLimit-Limit-Minute",
    "X-RateLimit-Limit-Day",
    "X-RateLimit-Remaining-Minute",
    "Retry-After",
]

counts = st.integers(0, 2_000_000).map(str)
numbers = st.one_of(
    counts,
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(min_value=0, max_value=1e10).map(lambda x: f"{x:.3f}"),
    st.integers(0, 10**12).map(lambda n: f"{n}e{n % 7}"),
    st.sampled_from(["0", "-0", "00", "1e-3", "0x10", "1_000", "NaN", "inf", "-inf", "1.", ".5", "1.2345"]),
)
durations = st.one_of(
    st.floats(min_value=0, max_value=200_000).map(lambda x: f"{x:.3f}s"),
    st.integers(0, 2000).map(lambda n: f"{n // 60}m{n % 60}s"),
    st.integers(0, 10**6).map(lambda n: f"{n}ms"),
)
durations |= st.lists(
    st.tuples(st.integers(0, 10**13), st.sampled_from(["h", "m", "s", "ms", "us", "µs", "ns", "d", ""])),
    min_size=1,
    max_size=4,
).map(lambda parts: "".join(f"{n}{u}" for n, u in parts))
dates = st.one_of(
    st.floats(min_value=NOW - 1000, max_value=NOW + 100_000).map(lambda t: email.utils.formatdate(t, usegmt=True)),
    st.floats(min_value=NOW - 1000, max_value=NOW + 100_000).map(lambda t: f"{t:.3f}"),
    st.floats(min_value=-6e10, max_value=2.5e11).map(lambda t: email.utils.formatdate(t, usegmt=True)),
    st.datetimes().map(lambda d: d.isoformat() + "Z"),
    st.from_regex(r"(Mon|Sun|Xyz), [0-9]{1,3} (Jan|Feb|Foo) [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT", fullmatch=True),
    st.from_regex(
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,12})?([Zz]|[+-][0-9]{2}:[0-9]{2})",
        fullmatch=True,
    ),
)
params = st.lists(
    st.tuples(
        st.sampled_from(["w", "q", "r", "t", "qu", "pk", "burst", "W", "*x"]),
        st.one_of(numbers, st.just('"requests"'), st.just("")),
    ),
    max_size=4,
).map(lambda ps: "".join(f";{k}={v}" if v else f";{k}" for k, v in ps))
structured_items = st.tuples(
    st.one_of(numbers, st.sampled_from(['"p"', "p", '"default"', ":YWJj:", "?1", "(1 2)", '"un\\"closed'])), params
).map("".join)
plausible_items = st.one_of(
    st.builds(lambda q, w: f'"p";q={q};w={w}', counts, counts),
    st.builds(lambda r, t: f'"p";r={r};t={t}', counts, counts),
    st.builds(lambda q, w: f"{q};w={w}", counts, counts),
)
structured = st.lists(structured_items | plausible_items, min_size=1, max_size=5).map(", ".join)
dictionaries = st.lists(
    st.tuples(
        st.sampled_from(["limit", "remaining", "reset", "r", "t", "LIMIT", "x"]), st.one_of(numbers, structured_items)
    ),
    min_size=1,
    max_size=4,
).map(lambda members: ", ".join(f"{k}={v}" for k, v in members))
values = st.one_of(
    numbers,
    st.builds(lambda *n: f"limit={n[0]}, remaining={n[1]}, reset={n[2]}", counts, counts, counts),
    durations,
    dates,
    structured,
    dictionaries,
    st.lists(st.one_of(numbers, dates), min_size=2, max_size=4).map(", ".join),
    st.text(max_size=40),
    st.text(alphabet=string.printable, max_size=200),
)
names = st.one_of(st.sampled_from(KNOWN_NAMES), st.sampled_from(KNOWN_NAMES).map(str.upper), st.text(max_size=20))
delays = st.one_of(counts, st.floats(min_value=0, max_value=200_000).map(lambda x: f"{x:.3f}"), dates)
whole_forms = st.one_of(  # a whole statement in one form, plausible numbers, to meet the bounds often
    st.fixed_dictionaries({"RateLimit-Limit": counts, "RateLimit-Remaining": counts, "RateLimit-Reset": delays}),
    st.fixed_dictionaries(
        {"RateLimit": st.builds(lambda *n: f"limit={n[0]}, remaining={n[1]}, reset={n[2]}", counts, counts, counts)}
    ),
    st.fixed_dictionaries({"X-RateLimit-Limit": counts, "X-RateLimit-Remaining": counts, "X-RateLimit-Reset": delays}),
    st.fixed_dictionaries(
        {
            "x-ratelimit-limit-requests": counts,
            "x-ratelimit-remaining-requests": counts,
            "x-ratelimit-reset-requests": durations,
        }
    ),
    st.fixed_dictionaries({"RateLimit": st.builds(lambda r, t: f'"p";r={r};t={t}', counts, counts)}),
)
header_maps = st.dictionaries(names, values, max_size=8) | st.builds(
    lambda form, noise: {**noise, **form}, whole_forms, st.dictionaries(names, values, max_size=4)
)


def check(read: RateStatement | None) -> None:
    if read is None:
        return
    parts = (read.per_minute, read.remaining, read.reset, read.quota, read.quota_remaining, read.quota_reset)
    assert any(part is not None for part in parts) or read.retry_after is not None
    if read.per_minute is not None:  # never a quota: a window of a minute at most
        assert math.isfinite(read.per_minute) and 0 < read.per_minute <= MAX_PER_MINUTE
        assert read.window is None or 0 < read.window <= MINUTE_BOUND
    for count in (read.remaining, read.quota_remaining, read.quota):
        assert count is None or (isinstance(count, int) and count >= 0)
    if read.reset is not None:  # per-minute room resets within the minute
        assert math.isfinite(read.reset) and 0 < read.reset <= MINUTE_BOUND
    for seconds in (read.quota_reset, read.quota_window, read.retry_after):
        assert seconds is None or (math.isfinite(seconds) and 0 < seconds <= MAX_RESET)
    assert read.quota_window is None or read.quota_window > MINUTE_BOUND
    assert read.form and set(read.form.split("+")) <= {*FORMS, "retry-after"}


@pytest.mark.slow
@settings(max_examples=1500, deadline=None)
@given(header_maps, st.floats(min_value=0, max_value=4e9))
def test_any_headers_never_raise_and_never_state_an_impossible_pace(headers, now):
    check(parse_rate_headers(headers, now=lambda: now))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KNOWN_NAMES), values), max_size=8))
def test_repeated_fields_joined_as_httpx_joins_them_never_raise(pairs):
    raw = [(name, value.encode("utf-8", "replace")) for name, value in pairs]  # as bytes off the wire
    check(parse_rate_headers(httpx.Headers(raw), now=lambda: NOW))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(header_maps)
def test_no_statement_makes_the_pace_faster_than_the_plan(headers):
    pacer = Pacer(600, clock=lambda: 0.0)
    pacer.after_attempt(0.0, headers=parse_rate_headers(headers, now=lambda: NOW))
    assert 0 < pacer.pace <= 600


# -- each form end to end: the client, the engine and the pacer, on virtual time ----------------------------

KEY = "test-key-rate-headers-0123456789"
PLAN = 600
STATED = 300  # a minute of the service's, stated in each form: half the plan


def stating(form: str, remaining: int, reset: float) -> dict[str, str]:
    """A service's statement of its limit (STATED a minute) and its room, in ``form``."""
    seconds = max(1, math.ceil(reset - 1e-6))
    room = {"remaining": str(remaining), "reset": str(seconds)}
    if form == "draft-06":
        return {"RateLimit-Limit": str(STATED), "RateLimit-Policy": f"{STATED};w=60"} | {
            f"RateLimit-{k.title()}": v for k, v in room.items()
        }
    if form == "list":
        return {
            "RateLimit-Limit": f"{STATED}, {STATED};w=60",
            "RateLimit-Remaining": room["remaining"],
            "RateLimit-Reset": room["reset"],
        }
    if form == "draft-07":
        return {
            "RateLimit": f"limit={STATED}, remaining={remaining}, reset={seconds}",
            "RateLimit-Policy": f"{STATED};w=60",
        }
    if form == "structured":
        return {"RateLimit-Policy": f'"minute";q={STATED};w=60', "RateLimit": f'"minute";r={remaining};t={seconds}'}
    if form == "x-ratelimit":  # GitHub's: the reset as a Unix time (this machine's clock, as a service's is)
        return {
            "X-RateLimit-Limit": str(STATED),
            "X-RateLimit-Remaining": room["remaining"],
            "X-RateLimit-Reset": str(math.ceil(time.time() + reset)),
        }
    if form == "openai":
        return {
            "x-ratelimit-limit-requests": str(STATED),
            "x-ratelimit-remaining-requests": room["remaining"],
            "x-ratelimit-reset-requests": f"{reset:.3f}s",
        }
    if form == "kong":
        return {"X-RateLimit-Limit-Minute": str(STATED), "X-RateLimit-Remaining-Minute": room["remaining"]}
    raise AssertionError(form)


class Service:
    """A sliding window of ``limit`` a minute on virtual time, answering in 0.4-0.6 s with ``headers``
    (``headers(remaining, reset)``), and 429 with Retry-After when over its limit."""

    def __init__(self, limit: int, headers):
        self.window = SlidingWindow(limit)
        self.headers = headers
        self.arrivals: list[float] = []
        self.refused = 0
        self.rng = random.Random(7)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        now = asyncio.get_running_loop().time()
        self.arrivals.append(now)
        wait = self.window.admit(now)
        headers = self.headers(*self.window.room(now))
        await asyncio.sleep(self.rng.uniform(0.4, 0.6))
        if wait is not None:
            self.refused += 1
            return httpx.Response(
                429, json={"error": Messages.RATE_LIMITED}, headers={"Retry-After": str(math.ceil(wait)), **headers}
            )
        return httpx.Response(200, json={contract.FIELD_RESULT: "A summary."}, headers=headers)


def texts(n: int) -> list[str]:
    return [f"Text number {i} has enough words in it to be worth a summary of its own." for i in range(n)]


def run(service: Service, n: int):
    async def main():
        pacer = Pacer(PLAN)
        async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=httpx.MockTransport(service)) as client:
            rows = [row async for row in summarize_stream(texts(n), client, rpm=PLAN, pacer=pacer)]
        return rows, pacer

    return virtual_clock.run(main())


@pytest.mark.parametrize("form", FORMS)
def test_a_limit_stated_in_each_form_sets_the_pace_before_any_429(form):
    service = Service(STATED, lambda remaining, reset: stating(form, remaining, reset))
    rows, pacer = run(service, 150)
    assert [r.status for r in rows] == ["ok"] * 150
    assert service.refused == 0
    assert pacer.pace <= STATED and "headers" in pacer.changes[0].reason
    assert service.arrivals[1] >= 0.4  # the first answer's statement was known before the second start


@pytest.mark.parametrize(
    "garbage",
    [
        {"RateLimit-Policy": "6e2;w=60", "X-RateLimit-Limit": "6.0e3"},
        {"X-RateLimit-Limit": "-1", "X-RateLimit-Remaining": "-1", "X-RateLimit-Reset": "-1"},
        {"RateLimit": "limit=NaN, remaining=NaN, reset=NaN", "x-ratelimit-reset-requests": "inf"},
        {"X-RateLimit-Limit": "60000000", "RateLimit-Policy": "1000000;w=1"},
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "99999999999"},
        {"RateLimit-Limit": "\x7f\x00garbage;;,", "RateLimit": '"', "x-ratelimit-limit-requests": "lots"},
    ],
    ids=["exponents", "negatives", "NaN", "over a million a minute", "a reset centuries ahead", "garbage"],
)
def test_headers_that_do_not_parse_change_nothing(garbage):
    """The same run with and without them: the same starts, to the virtual nanosecond (the even pace,
    never a stall)."""
    quiet = Service(PLAN, lambda remaining, reset: {})
    noisy = Service(PLAN, lambda remaining, reset: garbage)
    run(quiet, 120)
    noisy_rows, noisy_pacer = run(noisy, 120)
    assert [r.status for r in noisy_rows] == ["ok"] * 120
    assert noisy.arrivals == quiet.arrivals
    assert noisy_pacer.pace == PLAN and not noisy_pacer.changes


@pytest.mark.parametrize("form", FORMS)
def test_the_client_hands_each_statement_to_the_pacer_with_every_answer(form):
    """What ``AsyncClient.send`` tells its hooks after a 200 and a 429, and what a 429 carries when
    the synchronous client gives up: the parser's statement of the answer's headers."""
    headers = stating(form, 7, 30.0)
    answers = iter(
        [
            httpx.Response(429, json={"error": Messages.RATE_LIMITED}, headers={"Retry-After": "1", **headers}),
            httpx.Response(200, json={contract.FIELD_RESULT: "A summary."}, headers=headers),
        ]
    )
    heard = []

    class Hooks:
        max_wait = 60.0
        first_429 = None

        async def before_attempt(self):
            return None

        def after_attempt(self, ticket, error, limits):
            heard.append((type(error).__name__, limits))

    async def main():
        transport = httpx.MockTransport(lambda request: next(answers))
        async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=transport) as client:
            return await client.send(prepare(texts(1)[0]), Hooks())

    virtual_clock.run(main())
    expected = parse_rate_headers(headers)
    assert expected is not None and expected.form.split("+")[0] == form
    assert [name for name, _ in heard] == ["RateLimitError", "NoneType"]
    assert [limits.retry_after for _, limits in heard] == [1.0, None]  # the 429's own Retry-After, as said
    assert all(same(limits, expected) for _, limits in heard)

    refusing = httpx.MockTransport(
        lambda request: httpx.Response(429, json={"error": "Too Many Requests"}, headers=headers)
    )
    with batchsum.Client(KEY, "http://127.0.0.1:9", transport=refusing, max_retries=0) as client:
        with pytest.raises(batchsum.RateLimitError) as refused:
            client.summarize(texts(1)[0])
    assert same(refused.value.rate_limit, expected)


def same(read: RateStatement | None, expected: RateStatement) -> bool:
    """Equal but for a reset a Unix time measures against the real clock (read a moment apart)."""
    if read is None or (read.reset is None) != (expected.reset is None):
        return False
    return read == RateStatement(**{**expected.__dict__, "reset": read.reset, "retry_after": read.retry_after}) and (
        read.reset is None or abs(read.reset - expected.reset) < 1
    )
