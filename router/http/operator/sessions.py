"""Who may use the operator page: the holder of an admin key (``admin_key_hashes``: sha256 hex,
compared in constant time, as client API keys are), who gives it once at login and then carries a
session cookie naming a session this process holds. Each session has its own CSRF token, which
every form that changes something must carry back."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PREFIX = "/operator"  # the page's path; its cookie is sent under it only
COOKIE = "slotgate_operator"
SESSION_TTL_S = 8 * 3600.0  # a session ends this long after login (sign in again)
MAX_SESSIONS = 1000  # beyond it the oldest session ends


@dataclass(frozen=True, slots=True)
class Session:
    """One login: ``admin`` names the key (the first 12 hex digits of its sha256, for log lines),
    ``csrf`` is the token its forms carry, ``expires_at`` on the sessions' clock."""

    admin: str
    csrf: str
    expires_at: float

    def carries(self, token: str | None) -> bool:
        """Whether a form's CSRF token is this session's (constant-time)."""
        return token is not None and hmac.compare_digest(token.encode(), self.csrf.encode())


class Sessions:
    """The admin keys and the sessions opened with them, in this process: a replica's sessions
    are its own (reach one replica's page at a time, docs/operator.md)."""

    def __init__(self, admin_key_hashes: Sequence[str], *, ttl_s: float = SESSION_TTL_S,
                 capacity: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._hashes = [bytes.fromhex(h) for h in admin_key_hashes]
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._clock = clock
        self._open: OrderedDict[str, Session] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """The page is on: at least one admin key is configured."""
        return bool(self._hashes)

    def admin_of(self, key: str) -> str | None:
        """The name of the admin key ``key`` is, None when it is none of them."""
        digest = hashlib.sha256(key.encode()).digest()
        # Compare against every hash, so the time taken does not say which one (or none) matched.
        matched = [hmac.compare_digest(digest, h) for h in self._hashes]
        return digest.hex()[:12] if any(matched) else None

    def open(self, admin: str) -> tuple[str, Session]:
        """A new session for ``admin``: (the cookie's value, the session)."""
        token = secrets.token_urlsafe(32)
        session = Session(admin=admin, csrf=secrets.token_urlsafe(32),
                          expires_at=self._clock() + self._ttl_s)
        self._open[token] = session
        while len(self._open) > self._capacity:
            self._open.popitem(last=False)
        return token, session

    def get(self, token: str | None) -> Session | None:
        """The live session a cookie names; None for none, an unknown or an expired one."""
        session = self._open.get(token) if token else None
        if session is None:
            return None
        if session.expires_at <= self._clock():
            del self._open[token]  # type: ignore[arg-type]
            return None
        return session

    def close(self, token: str | None) -> None:
        if token:
            self._open.pop(token, None)
