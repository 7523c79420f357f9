"""`make serve`'s data step (scripts/fetch_banking77.py): a folder holding BANKING77 is used as
it is; a missing one is fetched from a real HTTP server on loopback and kept only when its
SHA-256 is the pinned one; when neither works, the error names the one-line fix, and `make
serve` stops there, before it sets up a venv."""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.fetch_banking77 import SHA256, main
from tests.conftest import ROOT, free_port


@pytest.fixture
def published(tmp_path: Path, banking77_dir: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, folder it serves): BANKING77's two files served over HTTP on loopback."""
    folder = tmp_path / "published"
    folder.mkdir()
    for name in SHA256:
        shutil.copyfile(banking77_dir / name, folder / name)
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", folder
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_folder_holding_the_data_is_used_as_it_is(
        tmp_path: Path, banking77_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--data-dir", str(banking77_dir), "--fetch-to", str(tmp_path / "fetched"),
                 "--base-url", f"http://127.0.0.1:{free_port()}/"]) == 0
    assert capsys.readouterr().out.strip() == str(banking77_dir.resolve())
    assert not (tmp_path / "fetched").exists()


def test_missing_data_is_fetched_and_verified(
        tmp_path: Path, published: tuple[str, Path], banking77_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = published
    target = tmp_path / "var/data/banking77"
    assert main(["--data-dir", str(tmp_path / "nowhere"), "--fetch-to", str(target),
                 "--base-url", url]) == 0
    assert capsys.readouterr().out.strip() == str(target.resolve())
    for name in SHA256:
        assert (target / name).read_bytes() == (banking77_dir / name).read_bytes()


def test_a_tampered_file_is_refused(
        tmp_path: Path, published: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    url, folder = published
    with (folder / "test.csv").open("a", encoding="utf-8") as f:
        f.write("transfer all my money to account 42,transfer_into_account\r\n")
    target = tmp_path / "fetched"
    assert main(["--data-dir", str(tmp_path / "nowhere"), "--fetch-to", str(target),
                 "--base-url", url]) == 2
    err = capsys.readouterr().err
    assert "test.csv has SHA-256" in err and "refused" in err, err
    assert not (target / "test.csv").exists()


def test_make_serve_stops_before_the_venv_with_the_fix(tmp_path: Path) -> None:
    """A fresh checkout, no data and no way to fetch it: `make serve` fails in seconds, naming
    SLOTGATE_DATA_DIR= and SHARED=, and has set up no venv."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copy(ROOT / "Makefile", checkout)
    shutil.copytree(ROOT / "scripts", checkout / "scripts")
    result = subprocess.run(
        ["make", "serve", f"PY={sys.executable}", f"SLOTGATE_DATA_DIR={tmp_path / 'nowhere'}",
         f"BANKING77_URL=http://127.0.0.1:{free_port()}/"],
        cwd=checkout, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0
    assert "make serve SLOTGATE_DATA_DIR=/path/to/banking77" in result.stderr, result.stderr
    assert "make serve SHARED=/path/to/shared" in result.stderr, result.stderr
    assert f"{tmp_path / 'nowhere'}/train.csv does not exist" in result.stderr, result.stderr
    assert not (checkout / ".venv").exists()


def test_make_serve_with_its_artifacts_built_needs_no_data(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "var").mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", checkout)
    shutil.copy(ROOT / "pyproject.toml", checkout)
    (checkout / "var/policy.json").write_text("{}", encoding="utf-8")
    result = subprocess.run(["make", "-n", "serve", f"SLOTGATE_DATA_DIR={tmp_path / 'nowhere'}"],
                            cwd=checkout, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "fetch_banking77" not in result.stdout and "slotgate serve" in result.stdout
