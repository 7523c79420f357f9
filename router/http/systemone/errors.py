"""The System One wire's errors, in the example server's dialect."""

from __future__ import annotations

from router.errors import InvalidRequest


class SystemOneError(InvalidRequest):
    """A schema error in a System One body: 422 ``validation_error``, as the example server says it."""

    status_code = 422
    error_type = "validation_error"


class InvalidBody(SystemOneError):
    """A body that is not a JSON object (or a form without a ``request`` part): 400."""

    status_code = 400
    error_type = "invalid_request_error"


class ImagesRefused(SystemOneError):
    """Images in a body whose escalations would go to a slow model that cannot take them: 400."""

    status_code = 400
    error_type = "invalid_request_error"
