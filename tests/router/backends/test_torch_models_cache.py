"""The converted-model cache of tests/router/backends/torch_models.py: one conversion per source
content however many runs ask at once, never a half-written folder, a new folder for new bytes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.router.backends import torch_models


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLOTGATE_TEST_CACHE", str(tmp_path / "cache"))
    torch_models.file_sha256.cache_clear()
    return tmp_path / "cache"


def test_concurrent_callers_convert_once_and_see_a_whole_folder(cache: Path, tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(b"weights v1")
    builds: list[str] = []

    def build(out: Path) -> None:
        builds.append(threading.current_thread().name)
        (out / "config.json").write_text("{}")
        time.sleep(0.5)  # a slow conversion: the others must wait, not start their own
        (out / "model.safetensors").write_text("w")

    seen: list[Path] = []
    threads = [threading.Thread(target=lambda: seen.append(
        torch_models.cached_conversion("m", source, build))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert len(set(seen)) == 1 and len(seen) == 4
    assert sorted(p.name for p in seen[0].iterdir()) == ["config.json", "model.safetensors"]
    # later calls (later runs) find it without building
    assert torch_models.cached_conversion("m", source, build) == seen[0] and len(builds) == 1


def test_a_failed_conversion_leaves_nothing_behind(cache: Path, tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(b"weights")

    def broken(out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise RuntimeError("conversion died half way")

    with pytest.raises(RuntimeError):
        torch_models.cached_conversion("m", source, broken)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
    done = torch_models.cached_conversion("m", source, lambda out: (out / "ok").write_text("1"))
    assert (done / "ok").exists()


def test_new_source_bytes_get_a_new_folder(cache: Path, tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(b"v1")
    first = torch_models.cached_conversion("m", source, lambda out: (out / "v").write_text("1"))
    source.write_bytes(b"v2")
    torch_models.file_sha256.cache_clear()
    second = torch_models.cached_conversion("m", source, lambda out: (out / "v").write_text("2"))
    assert first != second and (second / "v").read_text() == "2"
