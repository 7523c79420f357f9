"""How the slow path loads litellm: its shared dependencies first, on the thread that builds the
SlowPath, then litellm itself (seconds) on the warm-up thread router/routing/slow.py starts.

Why the dependencies first: CPython imports under one lock per module. When two threads import
modules that import each other's in-progress modules, waiting would deadlock, so CPython breaks
the cycle by handing one thread the other's PARTIALLY initialised module
(``importlib._bootstrap._lock_unlock_module``: "we'll accept a partially initialized module
object"); that thread then fails with ``AttributeError: partially initialized module 'httpx' has
no attribute 'URL' (most likely due to a circular import)``. The warm-up thread imports ~2,600
modules; a benchmark's OpenAI client, a test's httpx, a backend or a first request importing the
same packages meanwhile could meet them half way (``python -m bench.drift --quick`` failed so in 2
runs of 4). With ``SHARED_DEPENDENCIES`` complete before the thread starts, the thread loads only
litellm's own modules and the lazily loaded parts of these packages; escalations wait for the
warm-up (``SlowPath.warmed_up``) before touching litellm, so nothing else imports those meanwhile.
Cost: these packages' import time, once per process, paid before serving instead of in the thread
(1-3 s on a loaded 2-core machine, the OpenAI SDK most of it; litellm itself stays in the thread).
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

# The third-party packages litellm loads at import (measured: ``python -X importtime -c "import
# litellm"`` after slotgate's own start-up imports) that other code plausibly imports too.
SHARED_DEPENDENCIES = ("httpx", "openai", "aiohttp", "requests", "jinja2", "tiktoken",
                       "importlib_metadata")


def import_shared_dependencies() -> None:
    """``SHARED_DEPENDENCIES`` imported on the calling thread (no-ops once imported)."""
    for name in SHARED_DEPENDENCIES:
        try:
            importlib.import_module(name)
        except ImportError:  # not installed: litellm copes without it, and so do we
            logger.debug("litellm dependency %s not importable", name)


def litellm_module() -> Any:
    """Import litellm on first use, with its cost map read locally (no network at start-up)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True  # its "Give Feedback" banner would go to stdout per error
    return litellm


def warm_up() -> None:
    """Import litellm and run one offline mock call, which loads the modules litellm imports
    lazily on its first call (about a second more)."""
    try:
        litellm_module().completion(model="openai/slotgate-warm-up", mock_response="ok",
                                    messages=[{"role": "user", "content": "warm-up"}])
    except Exception as exc:  # noqa: BLE001 - best effort: the first real call reports real errors
        logger.debug("litellm warm-up failed: %s", type(exc).__name__)
