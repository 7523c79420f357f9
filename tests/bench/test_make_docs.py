"""docs/benchmarks.md is what `python -m bench.make_docs` renders from bench/results/: a result
committed without re-rendering, or a table edited by hand, fails here."""

from __future__ import annotations

from bench.make_docs import render
from tests.conftest import ROOT


def test_benchmarks_md_is_rendered_from_the_committed_results() -> None:
    rendered = render(ROOT / "bench" / "results")
    assert "## " in rendered and "Command: `python -m bench." in rendered
    assert (ROOT / "docs" / "benchmarks.md").read_text() == rendered, \
        "docs/benchmarks.md is stale: run `python -m bench.make_docs`"
