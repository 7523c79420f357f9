"""One thread at a time in ``ast.parse``, for the test process (installed by tests/conftest.py).

Why: CPython 3.11 builds the Python AST objects (``ast.parse``) counting its recursion depth in
ONE per-interpreter counter (``state->recursion_depth`` in Python/Python-ast.c, python/cpython
gh-106905). A garbage collection inside that construction may run a finalizer (Python code), the
GIL may pass to another thread there, and if that thread parses too it resets the shared counter:
the first parse then fails with ``SystemError: AST constructor recursion depth mismatch``.

The test process parses on several threads at once: pytest's assertion rewriter parses every
module of its plugins' distributions (schemathesis, hypothesis, anyio) imported lazily during a
test, while the live servers' threads and litellm's logging workers left by earlier tests format
tracebacks (Python 3.11's ``traceback`` parses each source line for its carets). That is why
tests/reliability/test_fuzz.py failed in a full run (importing schemathesis) and passed alone:
the recursion limit had nothing to do with it. Reproduced deterministically in
tests/test_ast_guard.py.

The lock is re-entrant (a finalizer on the same thread may parse) and waits at most
``WAIT_S``: a finalizer that blocks on a lock held by a thread waiting here would otherwise
deadlock; past the wait it parses unguarded, as before.
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
