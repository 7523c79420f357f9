"""Retry-After as upstreams send it (``Retry-After`` in delta-seconds or as an HTTP date, or
OpenAI-style ``retry-after-ms``): one reading for the fast backends' servers and the slow model."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the upstream asks to wait (never negative), or None when it names none we can read.
    ``retry-after-ms`` wins when both are present: it is the finer of the two."""
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    try:
        if "retry-after-ms" in lowered:
            return max(0.0, float(lowered["retry-after-ms"]) / 1e3)
        value = lowered.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None
