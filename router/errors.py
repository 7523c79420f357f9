"""The one error tree of slotgate. Adapters translate foreign exceptions (httpx, redis, litellm,
torch) into it once, with ``raise ... from exc``; the app maps its roots to HTTP in one place.

    SlotgateError
    ├── RequestError                 4xx, the caller's fault; ``field`` names what is wrong
    │   ├── InvalidRequest           400 (422 on System One schema errors)
    │   ├── UnprocessableRequest     422: the fast backend (or its server) cannot read this request as
    │   │                            given (answer template past the canvas): no escalation, no cache
    │   ├── PayloadTooLarge          413
    │   ├── Unauthorized             401
    │   ├── Forbidden                403 (model or URL outside the allow-list)
    │   └── TooManyRequests          429 + Retry-After (our own queue or rate limit is full)
    │       └── BudgetSpent          429: the API key's escalation budget is spent until its window resets
    ├── BackendError                 the fast backend failed: the service escalates, never a 5xx by itself
    │   ├── BackendUnavailable       connection refused, 5xx, 503/529 after retries
    │   ├── BackendTimeout           past the fast-path timeout
    │   ├── BackendRejected          the backend refused our request (400/422: a bug or a limit)
    │   └── BackendMalformed         an answer we cannot read (bad JSON, wrong options)
    ├── SlowPathError                502
    │   ├── SlowPathUnavailable      503
    │   │   └── NoSlowModel          503: no slow model is configured
    │   ├── SlowPathTimeout          504
    │   ├── SlowPathRateLimited      429 passed through, with Retry-After
    │   └── SlowPathInvalidAnswer    502: no valid option after one corrective retry
    ├── PassthroughError             502: the System One server a request was relayed to failed
    │   ├── PassthroughUnavailable   503: it could not be reached (or its model list cannot)
    │   └── PassthroughTimeout       504
    ├── LogUnavailable               503: the decision log cannot store a label now (a full disk)
    └── ConfigError                  bad settings, policy or artifact, found at start-up or load
"""

from __future__ import annotations


class SlotgateError(Exception):
    """Root of every error slotgate raises on purpose."""

    status_code: int = 500
    error_type: str = "server_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class RequestError(SlotgateError):
    status_code = 400
    error_type = "invalid_request_error"


class InvalidRequest(RequestError):
    pass


class UnprocessableRequest(RequestError):
    """A request the fast backend's server refuses for what the caller sent (its 422), or one the
    backend finds unreadable as given: the caller's error, answered 422 with the reason. Raised by
    backends; the service lets it through (a slow model would only hide it, at a price)."""

    status_code = 422
    error_type = "validation_error"  # the example server's word for its 422s


class PayloadTooLarge(RequestError):
    status_code = 413


class Unauthorized(RequestError):
    status_code = 401
    error_type = "authentication_error"


class Forbidden(RequestError):
    status_code = 403
    error_type = "permission_error"


class TooManyRequests(RequestError):
    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: float = 1.0, field: str | None = None):
        super().__init__(message, field=field)
        self.retry_after_s = retry_after_s


class BudgetSpent(TooManyRequests):
    """The caller's escalation budget is spent (``budget.on_spent: refuse``); Retry-After is
    the window's reset."""


class BackendError(SlotgateError):
    status_code = 502


class BackendUnavailable(BackendError):
    pass


class BackendTimeout(BackendError):
    status_code = 504


class BackendRejected(BackendError):
    pass


class BackendMalformed(BackendError):
    pass


class SlowPathError(SlotgateError):
    status_code = 502
    error_type = "upstream_error"


class SlowPathUnavailable(SlowPathError):
    status_code = 503


NO_SLOW_MODEL = "no slow model is configured (set SLOTGATE_SLOW_MODEL)"


class NoSlowModel(SlowPathUnavailable):
    """The one "no slow model" error: ``what`` (escalation, passthrough) cannot be done."""

    def __init__(self, what: str = "escalation") -> None:
        super().__init__(f"{what} unavailable: {NO_SLOW_MODEL}")


class SlowPathTimeout(SlowPathError):
    status_code = 504


class SlowPathRateLimited(SlowPathError):
    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: float | None = None, field: str | None = None):
        super().__init__(message, field=field)
        self.retry_after_s = retry_after_s


class SlowPathInvalidAnswer(SlowPathError):
    pass


class PassthroughError(SlotgateError):
    """A request relayed as sent to a ``systemone`` tier's server (router/http/upstream.py)
    could not be answered by it; what the server itself answers is relayed, never this."""

    status_code = 502
    error_type = "upstream_error"


class PassthroughUnavailable(PassthroughError):
    status_code = 503


class PassthroughTimeout(PassthroughError):
    status_code = 504


class LogUnavailable(SlotgateError):
    status_code = 503
    error_type = "server_error"


class ConfigError(SlotgateError):
    pass
