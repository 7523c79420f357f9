"""Admin keys and sessions: a key opens a session only if its sha256 is configured; a session
ends at its time-to-live, when signed out, or as the oldest beyond the capacity; a form's CSRF
token must be its own session's; a bad admin_key_hashes value is refused naming the field."""

from __future__ import annotations

import hashlib

import pytest
from pydantic import ValidationError

from router.http.operator.sessions import Sessions
from router.settings import Settings

KEY = "an-admin-key-5d1e"
HASH = hashlib.sha256(KEY.encode()).hexdigest()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_only_a_configured_key_is_an_admin_and_no_keys_turn_the_page_off() -> None:
    sessions = Sessions([HASH])
    assert sessions.enabled and sessions.admin_of(KEY) == HASH[:12]
    assert sessions.admin_of("another-key") is None and sessions.admin_of("") is None
    assert not Sessions([]).enabled


def test_a_session_ends_at_its_ttl_when_closed_and_as_the_oldest_past_capacity() -> None:
    clock = Clock()
    sessions = Sessions([HASH], ttl_s=60, capacity=2, clock=clock)
    first, _ = sessions.open("a")
    assert sessions.get(first) is not None and sessions.get("forged") is None
    clock.now += 61
    assert sessions.get(first) is None  # expired
    second, _ = sessions.open("a")
    sessions.close(second)
    assert sessions.get(second) is None  # signed out
    tokens = [sessions.open("a")[0] for _ in range(3)]
    assert sessions.get(tokens[0]) is None and all(sessions.get(t) for t in tokens[1:])


def test_a_csrf_token_is_its_own_sessions_only() -> None:
    sessions = Sessions([HASH])
    _, one = sessions.open("a")
    _, other = sessions.open("a")
    assert one.carries(one.csrf)
    assert not one.carries(other.csrf) and not one.carries(None) and not one.carries("")


@pytest.mark.parametrize("value", [["not-hex"], ["ab" * 31]])
def test_admin_key_hashes_must_be_sha256_hex_and_the_error_names_the_field(
        value: list[str]) -> None:
    with pytest.raises(ValidationError, match="admin_key_hashes must be sha256 hex digests"):
        Settings(admin_key_hashes=value)
    assert Settings(admin_key_hashes=[HASH.upper()]).admin_key_hashes == [HASH]
