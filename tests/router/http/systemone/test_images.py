"""Images on /v1/systemone (an ``images`` array of data URLs, or multipart image parts): read by
a System One fast tier (the stand-in over loopback HTTP), part of every cache key, sent to the
slow model as unscoped when the fast tier reads no images, and refused with a 400 naming the
slow model when it cannot take them."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.backends.systemone import SystemOneBackend
from standins.systemone_server import SystemOneStandin
from tests.router.http.systemone.test_e2e import confident
from tests.router.http.systemone.test_spans import serving
from tests.router.http.systemone.test_wire import multipart
from tests.router.routing.test_slow import ScriptedCompletion

PNG = "data:image/png;base64,iVBORw0KGgo="
GIF = "data:image/gif;base64,R0lGODlh"
BODY = {"state": "What does the card in the photo say?",
        "questions": {"urgent": {"type": "noul", "instructions": "Reply today?"}}}
VISION = {"vision": True}


@pytest.fixture
def upstream(systemone_standin: SystemOneStandin) -> SystemOneStandin:
    return systemone_standin


async def test_images_reach_a_system_one_tier_and_their_bytes_are_in_the_cache_key(
    upstream: SystemOneStandin,
) -> None:
    async with serving(SystemOneBackend(upstream.url), slow_settings=VISION,
                       unscoped="unverified") as client:
        before = upstream.stats.requests
        for images in ([PNG], [GIF], [PNG]):
            r = await client.post("/v1/systemone", json={**BODY, "images": images})
            assert r.status_code == 200, r.text
            assert r.json()["answers"]["urgent"]["route"] == "unverified"
    assert upstream.stats.requests == before + 2  # the third is the first's read, cached
    assert upstream.images_seen[-2:] == [[PNG], [GIF]]


async def test_multipart_image_parts_reach_a_system_one_tier(upstream: SystemOneStandin) -> None:
    raw, ctype = multipart(("request", None, json.dumps(BODY).encode()),
                           ("photo", "card.png", b"\x89PNG"))
    raw = raw.replace(b'filename="card.png"\r\n',
                      b'filename="card.png"\r\nContent-Type: image/png\r\n')
    async with serving(SystemOneBackend(upstream.url), slow_settings=VISION,
                       unscoped="unverified") as client:
        r = await client.post("/v1/systemone", content=raw, headers={"content-type": ctype})
    assert r.status_code == 200, r.text
    assert upstream.images_seen[-1] == ["data:image/png;base64,iVBORw=="]


async def test_a_fast_tier_that_reads_no_images_sends_them_to_the_slow_model() -> None:
    asked: list[DecisionRequest] = []

    def handler(request: DecisionRequest) -> Sequence[float]:
        asked.append(request)
        return confident(request)

    completion = ScriptedCompletion(json.dumps({"answer": "no"}))
    async with serving(MockBackend(handler), completion, slow_settings=VISION,
                       unscoped="unverified") as client:
        r = await client.post("/v1/systemone", json={**BODY, "images": [PNG]})
    assert r.status_code == 200, r.text
    assert r.json()["answers"]["urgent"]["route"] == "slow"
    note = r.json()["diagnostics"]["routes"]["urgent"]["note"]
    assert "the fast tier (mock) reads no images" in note and note.startswith("unscoped")
    assert asked == []
    [call] = completion.calls
    assert call["messages"][1]["content"] == [
        {"type": "image_url", "image_url": {"url": PNG}},
        {"type": "text", "text": BODY["state"]}]


async def test_a_slow_model_that_cannot_take_images_is_named_in_a_400(
    upstream: SystemOneStandin,
) -> None:
    async with serving(SystemOneBackend(upstream.url), slow_settings={"vision": False},
                       unscoped="unverified") as client:
        r = await client.post("/v1/systemone", json={**BODY, "images": [PNG]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"].startswith("images: the slow model openai/standin cannot take images")
    assert error["type"] == "invalid_request_error"
