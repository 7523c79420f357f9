"""Find BANKING77 for `make serve`, or fetch it from its public source: standard library only, so
it runs before the project's environment exists.

BANKING77 (PolyAI; Casanueva et al. 2020, CC-BY-4.0) is published in the GitHub repository
PolyAI-LDN/task-specific-datasets, folder banking_data/. A folder given with ``--data-dir`` that
holds ``train.csv`` and ``test.csv`` (header ``text,category``) is used as it is. Otherwise the two
files are downloaded from ``--base-url`` into ``--fetch-to`` and kept only if their SHA-256 is the
pinned one. Prints the folder to read on stdout; exit 2 with the fix on stderr when neither works.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

# The upstream files at the commit the hashes were taken from (unchanged since 2020-02-18).
BASE_URL = ("https://raw.githubusercontent.com/PolyAI-LDN/task-specific-datasets/"
            "57ec275d8078af65b7731c2a98be812d844a6d6b/banking_data/")
SHA256 = {
    "train.csv": "b06e26ac675513959a63135f11b94ea7786ed02da65db93a5650d8838cbc664b",
    "test.csv": "d12d6e3bc4c3103966ae786dc435913c0c563dfa328f5a3646d0e62cfeeb474d",
}
COLUMNS = ["text", "category"]
TIMEOUT_S = 30.0


class DataError(Exception):
    """BANKING77 could be neither found nor fetched; the message says why."""


def missing_in(folder: Path) -> str | None:
    """None when ``folder`` holds both files with BANKING77's columns, else what is wrong."""
    for name in SHA256:
        path = folder / name
        if not path.is_file():
            return f"{path} does not exist"
        with path.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
        if header[:2] != COLUMNS:
            return f"{path} has columns {header}, not {COLUMNS}"
    return None


def fetch(base_url: str, target: Path) -> None:
    """Download both files into ``target``; a file whose SHA-256 is not the pinned one is
    refused and nothing of it is kept."""
    target.mkdir(parents=True, exist_ok=True)
    for name, expected in SHA256.items():
        url = base_url.rstrip("/") + "/" + name
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
                payload = response.read()
        except (urllib.error.URLError, OSError) as exc:
            raise DataError(f"fetching {url} failed: {getattr(exc, 'reason', exc)}") from exc
        digest = hashlib.sha256(payload).hexdigest()
        if digest != expected:
            raise DataError(f"{url} has SHA-256 {digest}, not the pinned {expected}: refused")
        with tempfile.NamedTemporaryFile(dir=target, delete=False) as partial:
            partial.write(payload)
        Path(partial.name).replace(target / name)


def locate(data_dir: Path, fetch_to: Path, base_url: str) -> Path:
    """The folder to read: ``data_dir`` if it holds the data, else ``fetch_to`` (fetched there
    unless an earlier run did)."""
    if missing_in(data_dir) is None:
        return data_dir
    if missing_in(fetch_to) is None:
        return fetch_to
    why = missing_in(data_dir)
    print(f"slotgate: BANKING77 not found ({why}); fetching it from {base_url} into {fetch_to}",
          file=sys.stderr)
    try:
        fetch(base_url, fetch_to)
    except DataError as exc:
        raise DataError(f"BANKING77 not found: {why}, and {exc}") from exc
    return fetch_to


FIX = """\
  Fix (one line), naming a folder that holds BANKING77's train.csv and test.csv (columns text,category):
    make serve SLOTGATE_DATA_DIR=/path/to/banking77
  or a shared folder that holds it as data/banking77/:
    make serve SHARED=/path/to/shared
  BANKING77 (PolyAI, CC-BY-4.0) is published at
  https://github.com/PolyAI-LDN/task-specific-datasets (folder banking_data/)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True,
                        help="the folder named by SLOTGATE_DATA_DIR")
    parser.add_argument("--fetch-to", type=Path, required=True,
                        help="where to download the files when --data-dir lacks them")
    parser.add_argument("--base-url", default=BASE_URL, help="where train.csv and test.csv are")
    args = parser.parse_args(argv)
    try:
        print(locate(args.data_dir, args.fetch_to, args.base_url).resolve())
    except DataError as exc:
        print(f"slotgate: {exc}\n{FIX}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
