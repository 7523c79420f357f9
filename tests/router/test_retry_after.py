"""The one Retry-After reading, shared by the fast backends' HTTP client and the slow path."""

from __future__ import annotations

import email.utils
import time

import httpx

from router.retry_after import retry_after_s


def test_delta_seconds_http_dates_and_milliseconds() -> None:
    assert retry_after_s({"Retry-After": "2.5"}) == 2.5
    assert retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5  # the finer wins
    in_three_s = email.utils.formatdate(time.time() + 3, usegmt=True)
    assert 1.0 <= (retry_after_s({"retry-after": in_three_s}) or 0.0) <= 3.0
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    assert retry_after_s({"retry-after": past}) == 0.0  # never negative
    assert retry_after_s({"retry-after": "-4"}) == 0.0


def test_absent_or_unreadable_is_none() -> None:
    assert retry_after_s(None) is None
    assert retry_after_s({}) is None
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({"retry-after-ms": "x"}) is None


def test_httpx_headers_are_read_case_insensitively() -> None:
    response = httpx.Response(503, headers={"RETRY-AFTER": "4"})
    assert retry_after_s(response.headers) == 4.0
