"""/readyz tells what is known: escalation is "not known yet" (null, with the
reason) while litellm is still loading, not an optimistic true; the loaded policies are listed
by id; the reload counter is exported from the start."""

from __future__ import annotations

from pathlib import Path

import httpx

from router.backends.mock import MockBackend
from router.http.app import create_app
from router.routing.slow import LOADING, SlowPath
from router.settings import Settings
from tests.reliability.conftest import metric_value
from tests.router.http.test_app_config import policy_file


async def test_escalation_is_not_known_while_litellm_loads(tmp_path: Path) -> None:
    """``escalation_available`` is null while litellm (and the credentials check it runs) is
    still loading: a slow model without credentials is known only once it is loaded."""
    settings = Settings(slow={"model": "openai/standin", "api_base": "http://127.0.0.1:9/v1",
                              "api_key": "sk-readyz-0123456789"},
                        log={"decision_log_path": tmp_path / "log.jsonl"})
    slow = SlowPath(settings.slow)
    # Where litellm is already imported (this test process) the path is warm at once; a server
    # starts with the event unset until its background import is done: put it in that state.
    loaded = slow.warmed_up.is_set()
    slow.warmed_up.clear()
    app = create_app(settings, backend=MockBackend(lambda r: [0.5, 0.5]), slow=slow)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            loading = (await client.get("/readyz")).json()
            if loaded:
                slow.warmed_up.set()
            else:
                slow.warmed_up.wait(timeout=120)
            known = (await client.get("/readyz")).json()
    await slow.aclose()
    assert loading["escalation_available"] is None and loading["escalation"] == LOADING
    assert loading["status"] == "ready"  # the fast tier answers meanwhile
    assert known["escalation_available"] is True and known["escalation"] == "available"


async def test_readyz_lists_the_loaded_policies_and_metrics_count_reloads(tmp_path: Path) -> None:
    path = policy_file(tmp_path, "intents")
    settings = Settings(policy={"files": [path], "allow_fingerprint_mismatch": True},
                        log={"decision_log_path": tmp_path / "l.jsonl"})
    app = create_app(settings, backend=MockBackend(lambda r: [0.5, 0.5]))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            ready = (await client.get("/readyz")).json()
            metrics = (await client.get("/metrics")).text
    [policy] = ready["policies"]
    assert policy["name"] == "intents" and policy["policy_id"].startswith("intents@")
    assert policy["shadow"] is False and policy["path"] == str(path)
    assert metric_value(metrics, "slotgate_policy_reloads_total", result="refused") == 0
    assert 'slotgate_policy_reloads_total{result="loaded"}' in metrics
