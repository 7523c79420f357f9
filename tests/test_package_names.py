"""slotgate's three top-level packages have generic names (PyPI has other `router` and `policies`
distributions): in slotgate's environment each must resolve to this checkout's folder, and no
other installed distribution may claim it."""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path

import pytest

from tests.conftest import ROOT

NAMES = ("router", "policies", "calibration")


@pytest.mark.parametrize("name", NAMES)
def test_the_name_resolves_to_slotgates_folder(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__file__ is not None
    assert Path(module.__file__).resolve() == (ROOT / name / "__init__.py").resolve()


def test_no_other_distribution_provides_these_names() -> None:
    owners = importlib.metadata.packages_distributions()
    for name in NAMES:
        others = set(owners.get(name, [])) - {"slotgate"}
        assert not others, f"{name!r} is also provided by {sorted(others)}"
