"""One stand-in of the System One example server for the tests of its newer features (spans,
thoughts, images, the differences table's rows): its reader is fit once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from standins.reader import Banking77Reader
from standins.systemone_server import SystemOneStandin


@pytest.fixture(scope="session")
def systemone_standin(banking77_dir: Path) -> Iterator[SystemOneStandin]:
    reader = Banking77Reader(data_dir=banking77_dir, max_per_class=3)
    with SystemOneStandin(reader=reader) as server:
        yield server
