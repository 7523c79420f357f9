"""docs/backends.md's generated parts (bench/torch_docs.py): the speed options table and the GPU
figures are what the options class and the committed results say now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import torch_docs
from router.backends.torch.options import SPEED_OPTIONS


def test_the_doc_is_what_the_generator_writes() -> None:
    text = torch_docs.DOC.read_text()
    assert torch_docs.render(text) == text, "docs/backends.md is stale: python -m bench.torch_docs"


def test_the_options_table_has_a_row_for_each_speed_option_with_its_default() -> None:
    rows = torch_docs.options_table().splitlines()
    for name in SPEED_OPTIONS:
        row = next(line for line in rows if line.startswith(f"| `{name}` |"))
        assert row.count("|") == 4 and len(row) > 40, row
    assert "| `max_batch` | `32` |" in rows[4]


def test_one_table_a_gpu_stamped_with_its_command_and_commit(tmp_path: Path) -> None:
    run = {"device": "NVIDIA H100 80GB HBM3", "code_commit": "abc1234", "command": "python -m bench.gpu_read",
           "targets": {"single_p50_ms": 22, "concurrent32_reads_per_s": 300},
           "backend": {"single_p50_ms": 21.0, "single_p99_ms": 22.5, "concurrent32_reads_per_s": 250.0,
                       "curve": {"32": {"reads_per_s": 250.0, "p50_ms": 120.0, "p99_ms": 130.0,
                                        "mean_batch": 32.0, "reader_ms_per_batch": 110.0},
                                 "8": {"skipped": "time budget"}}}}
    (tmp_path / "gpu_read_h100.json").write_text(json.dumps(run))
    (tmp_path / "gpu_read.json").write_text(json.dumps({**run, "device": "NVIDIA H200"}))
    text = torch_docs.figures(torch_docs.load_results(tmp_path))
    assert text.count("#### ") == 2 and text.index("H100") < text.index("H200")
    assert "Code abc1234" in text and "`python -m bench.gpu_read`" in text
    assert "| 32 | 250.0 | 120.0 | 130.0 | 32.0 | 110.0 |" in text and "| 8 |" not in text


def test_markers_missing_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="torch-options:begin"):
        torch_docs.render("no markers here")
