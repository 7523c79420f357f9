"""One thread at a time in ``ast.parse``, for a whole process: the proxy's (``slotgate serve``
installs it first thing) and the test process (tests/conftest.py).

Why: CPython 3.11 builds the Python AST objects (``ast.parse``) counting its recursion depth in
ONE per-interpreter counter (``state->recursion_depth`` in Python/Python-ast.c, python/cpython
gh-106905). A garbage collection inside that construction may run a finalizer (Python code), the
GIL may pass to another thread there, and if that thread parses too it resets the shared counter:
the first parse then fails with ``SystemError: AST constructor recursion depth mismatch``.

Who parses on several threads at once:
- the proxy: Python 3.11's ``traceback`` parses each source line it shows for its carets, so two
  threads logging an exception at once (the event loop and the torch read's worker, litellm's
  logging workers, the executor's threads: a Redis restart makes several at the same moment)
  can meet there; the loser's record is lost, ``logging`` printing "--- Logging error ---" in
  its place. Triton parses each kernel's source when it compiles it, in the torch worker's
  warm-up, while the event loop already serves: a failed parse there turns a kernel off.
- the test process: pytest's assertion rewriter parses every module of its plugins'
  distributions imported lazily during a test, while live servers' threads format tracebacks.
  That is why tests/reliability/test_fuzz.py once failed in a full run (importing
  schemathesis) and passed alone. Reproduced deterministically in tests/test_parse_lock.py.

Not covered: ``compile(..., ast.PyCF_ONLY_AST)`` called directly builds ASTs without
``ast.parse``; nothing in the proxy's own code does.

The lock is re-entrant (a finalizer on the same thread may parse) and waits at most
``WAIT_S``: a finalizer that blocks on a lock held by a thread waiting here would otherwise
deadlock; past the wait it parses unguarded, as without the lock. Uncontended, it costs one lock
acquisition per parse.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

WAIT_S = 10.0
_lock = threading.RLock()
_unguarded = ast.parse


def guarded_parse(*args: Any, **kwargs: Any) -> Any:
    """``ast.parse`` holding the process-wide AST lock."""
    got = _lock.acquire(timeout=WAIT_S)
    try:
        return _unguarded(*args, **kwargs)
    finally:
        if got:
            _lock.release()


def install() -> None:
    """Route every ``ast.parse`` caller (pytest, traceback, inspect) through the lock."""
    ast.parse = guarded_parse
