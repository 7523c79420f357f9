"""Importing Triton kernels to run under Triton's interpreter on the CPU.

The interpreter is chosen when a kernel is decorated (triton.knobs reads TRITON_INTERPRET then),
so the variable must be set while a kernel module is first imported; it is restored afterwards
(test_triton_moe's autouse fixture ``_interpreter`` sets it again while the tests run)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def interpreted_imports() -> Iterator[None]:
    """TRITON_INTERPRET=1 for the imports in the block, then as it was."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved
