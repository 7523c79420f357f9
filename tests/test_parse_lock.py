"""router/parse_lock.py: two threads parsing at once, the second one let in by a finalizer that a
garbage collection runs in the middle of the first one's AST construction (forced here: a
collection on every allocation, one cyclic object with a finalizer waiting to be collected).
Unguarded, CPython 3.11 fails the first parse with "AST constructor recursion depth mismatch"
every time; through the lock tests/conftest.py installs, both parses succeed."""

from __future__ import annotations

import ast
import gc
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from router import parse_lock
from router.errors import ConfigError
from router.http import server

Parse = Callable[..., Any]


def parse_while_another_thread_parses(parse: Parse) -> list[BaseException]:
    go, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def other() -> None:
        go.wait(10)
        try:
            parse("b = [c(d) for d in e]")
        except SystemError as exc:
            errors.append(exc)
        done.set()

    class Finalised:
        def __init__(self) -> None:
            self.cycle = self  # only the collector frees it, so its finalizer runs inside a parse

        def __del__(self) -> None:  # hands the GIL to the other thread mid-construction
            go.set()
            done.wait(2.0)

    thread = threading.Thread(target=other)
    thread.start()
    Finalised()
    threshold = gc.get_threshold()
    gc.set_threshold(1)
    try:
        parse("def f(x):\n    return [g(y, z[x]) for y in x if y]\n")
    except SystemError as exc:
        errors.append(exc)
    finally:
        gc.set_threshold(*threshold)
        go.set()
        thread.join()
    return errors


def test_the_guard_is_installed_for_the_whole_session() -> None:
    assert ast.parse is parse_lock.guarded_parse


def test_the_proxy_installs_the_guard_before_anything_else(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    """``slotgate serve``'s process parses on several threads too (tracebacks logged at once,
    Triton compiling in the torch worker's warm-up): it installs the guard first, before its
    settings are read, so even a start-up that fails is guarded."""
    monkeypatch.setattr(ast, "parse", parse_lock._unguarded)  # as in a fresh process
    with pytest.raises(ConfigError, match="file not found"):
        server.serve(config=tmp_path / "missing.yaml")
    assert ast.parse is parse_lock.guarded_parse


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_parses_through_the_guard_succeed(round_: int) -> None:
    assert parse_while_another_thread_parses(ast.parse) == []


def test_unguarded_concurrent_parses_fail_on_this_python() -> None:
    """The defect the guard exists for (gone on a Python whose AST construction is safe)."""
    errors = parse_while_another_thread_parses(parse_lock._unguarded)
    if not errors:
        pytest.skip("this Python builds ASTs safely across threads")
    assert "AST constructor recursion depth mismatch" in str(errors[0])
