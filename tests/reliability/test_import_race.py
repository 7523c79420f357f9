"""litellm's background import and a client's first requests import the same packages at once
without `AttributeError: partially initialized module 'httpx' has no attribute 'URL'` (the error
`python -m bench.drift --quick` shows without the guard). CPython hands a thread another
thread's half-initialised module when their imports cross; router/routing/litellm_import.py
keeps them from crossing.

The probe is a fresh interpreter (litellm not yet imported) that starts slotgate with a slow
model and sends concurrent first requests at once, through the OpenAI SDK and httpx
(tests/reliability/import_race_probe.py). Every request must succeed, and no thread may reach a
module the warm-up thread is still initialising: without the guard the client threads meet it in
`openai` in every run (the crossing the failure needs), so one run shows it; the AttributeError
itself comes only when the crossing closes a cycle, which the guard rules out by construction."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.long
@pytest.mark.timeout(360)
def test_first_requests_meet_no_half_imported_module() -> None:
    done = subprocess.run([sys.executable, "-m", "tests.reliability.import_race_probe"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["errors"] == [], result
    assert result["statuses"] == [200] * 16, result
    assert result["contended"] == [], result["pairs"]
    assert "partially initialized module" not in done.stderr, done.stderr[-3000:]
