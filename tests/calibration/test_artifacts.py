"""Versioned JSON artifacts: round trip, header checks, clear errors naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration import read_json_artifact, write_json_artifact


def test_round_trip_with_header(tmp_path: Path) -> None:
    path = write_json_artifact(tmp_path / "sub" / "cal.json", "calibrator", {"kind": "none", "x": 1.5})
    document = json.loads(path.read_text())
    assert document["format"] == "slotgate/calibrator" and document["version"] == 1
    assert read_json_artifact(path, "calibrator") == {"kind": "none", "x": 1.5}
    assert [p.name for p in path.parent.iterdir()] == ["cal.json"]  # no temporary left behind


def test_version_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"format": "slotgate/policy", "version": 2}))
    with pytest.raises(ValueError, match=r"version 2 is not supported .*reads version 1"):
        read_json_artifact(path, "policy")


def test_wrong_kind_and_bad_json_name_the_file(tmp_path: Path) -> None:
    path = write_json_artifact(tmp_path / "a.json", "policy", {})
    with pytest.raises(ValueError, match=r"a\.json: format is 'slotgate/policy'"):
        read_json_artifact(path, "calibrator")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match=r"broken\.json: not valid JSON"):
        read_json_artifact(broken, "policy")
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        read_json_artifact(listed, "policy")


def test_payload_cannot_shadow_the_header(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="header keys"):
        write_json_artifact(tmp_path / "a.json", "policy", {"version": 3})
    assert not (tmp_path / "a.json").exists()


def test_atomic_path_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    """The one atomic write behind every artifact (policy files, predictions, text models)."""
    from calibration.artifacts import atomic_path

    target = tmp_path / "nested" / "policy.json"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp != target
        tmp.write_text("first")
    assert target.read_text() == "first"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("the writer failed midway")
    assert target.read_text() == "first"  # the old file, untouched
    assert sorted(p.name for p in target.parent.iterdir()) == ["policy.json"]  # no temporary left


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_atomic_path_writes_with_the_mode_any_new_file_gets(tmp_path: Path, umask: int) -> None:
    """0666 less the umask, as ``open`` gives: under the usual 022 a server running as another
    user can read a tuned policy or model."""
    import os
    import stat

    from calibration.artifacts import atomic_path

    before = os.umask(umask)
    try:
        with atomic_path(tmp_path / "policy.json") as tmp:
            tmp.write_text("{}")
        (tmp_path / "plain.json").write_text("{}")
    finally:
        os.umask(before)
    mode = stat.S_IMODE((tmp_path / "policy.json").stat().st_mode)
    assert mode == 0o666 & ~umask == stat.S_IMODE((tmp_path / "plain.json").stat().st_mode)
