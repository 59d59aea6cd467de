"""parse_retry_after() and the reset-header fallback, as tables."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import httpx
import pytest

from fluid_build.copilot.agents.error_classification import (
    parse_rate_limit_reset,
    parse_retry_after,
)

NOW = 1_700_000_000.0


def http_date(offset: float) -> str:
    return format_datetime(datetime.fromtimestamp(NOW + offset, tz=UTC), usegmt=True)


def rfc3339(offset: float) -> str:
    return datetime.fromtimestamp(NOW + offset, tz=UTC).isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "20"}, 20.0),
        ({"retry-after": "0"}, 0.0),
        ({"RETRY-AFTER": "1.5"}, 1.5),
        ({"Retry-After": " 7 "}, 7.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "1500.5"}, 1.5005),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # ms wins
        ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),  # bad ms falls through
        ({"retry-after-ms": "-5", "retry-after": "9"}, 9.0),
        ({"Retry-After": http_date(42)}, 42.0),
        ({"Retry-After": http_date(4000)}, 300.0),  # capped
        ({"Retry-After": "301"}, 300.0),
        ({"Retry-After": "99999999999999999999"}, 300.0),
        ({"retry-after-ms": "900000"}, 300.0),
        ({"Retry-After": http_date(-30)}, None),  # in the past: no usable wait
        ({"Retry-After": "-1"}, None),
        ({"Retry-After": "nan"}, None),
        ({"Retry-After": "inf"}, None),
        ({"Retry-After": "1e400"}, None),
        ({"Retry-After": "9" * 400}, 300.0),  # all digits: longer than the cap, so the cap
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": ""}, None),
        ({"Retry-After": "Wed, 99 Foo 2015 07:28:00 GMT"}, None),
        ({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, 300.0),
        ({"Retry-After": "Mon, 01 Jan 0001 00:00:00 GMT"}, None),
        ({"Retry-After": "\x00\x01"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str] | None, expected: float | None) -> None:
    got = parse_retry_after(headers, now=NOW)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_duplicate_headers_take_the_first_usable_value() -> None:
    headers = httpx.Headers([("retry-after", "garbage"), ("retry-after", "12")])
    assert parse_retry_after(headers, now=NOW) == 12.0


def test_http_date_is_relative_to_now_given_as_datetime() -> None:
    moment = datetime.fromtimestamp(NOW, tz=UTC)
    assert parse_retry_after({"Retry-After": http_date(5)}, now=moment) == pytest.approx(5.0)
    naive = moment.replace(tzinfo=None)
    assert parse_retry_after({"Retry-After": http_date(5)}, now=naive) == pytest.approx(5.0)


def test_garbage_header_containers_never_raise() -> None:
    assert parse_retry_after([("retry-after", "3")], now=NOW) == 3.0
    assert parse_retry_after({"retry-after": 3}, now=NOW) is None  # type: ignore[dict-item]
    assert parse_retry_after(42, now=NOW) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # OpenAI/Groq duration forms.
        ({"x-ratelimit-reset-requests": "6m0s"}, 300.0),
        ({"x-ratelimit-reset-requests": "1m30s"}, 90.0),
        ({"x-ratelimit-reset-tokens": "20ms"}, 0.02),
        ({"x-ratelimit-reset-tokens": "7.66s"}, 7.66),
        ({"x-ratelimit-reset-tokens": "2m59.56s"}, 179.56),
        ({"x-ratelimit-reset-tokens": "1h"}, 300.0),
        # The exhausted limit decides, not the shorter one.
        (
            {
                "x-ratelimit-remaining-requests": "499",
                "x-ratelimit-reset-requests": "120ms",
                "x-ratelimit-remaining-tokens": "0",
                "x-ratelimit-reset-tokens": "9.816s",
            },
            9.816,
        ),
        # Nothing exhausted: the longest reset (which limit refused is unknown).
        ({"x-ratelimit-reset-requests": "3s", "x-ratelimit-reset-tokens": "1s"}, 3.0),
        # Anthropic RFC 3339 timestamps.
        (
            {
                "anthropic-ratelimit-requests-remaining": "0",
                "anthropic-ratelimit-requests-reset": rfc3339(17),
                "anthropic-ratelimit-tokens-reset": rfc3339(2),
            },
            17.0,
        ),
        ({"anthropic-ratelimit-tokens-reset": rfc3339(-5)}, None),
        # Generic x-ratelimit-reset: seconds, epoch seconds, epoch milliseconds.
        ({"x-ratelimit-reset": "12"}, 12.0),
        ({"x-ratelimit-reset": str(int(NOW + 8))}, 8.0),
        ({"x-ratelimit-reset": str(int((NOW + 8) * 1000))}, 8.0),
        ({"x-ratelimit-reset-tokens": "bogus"}, None),
        ({"x-ratelimit-reset-tokens": ""}, None),
        ({}, None),
    ],
)
def test_parse_rate_limit_reset(headers: dict[str, str], expected: float | None) -> None:
    got = parse_rate_limit_reset(headers, now=NOW)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)
